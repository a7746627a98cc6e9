//! `gpu-dra simulate`: would this claim be allocated, on which node, with
//! which devices, and if not, why not. Runs the allocator simulation of
//! [`gpu_dra_analysis::allocator`] against ResourceSlices read from files (e.g.
//! `kubectl get resourceslices -o yaml`) or listed from a live cluster.
//!
//! The cluster state: from files, every ResourceSlice (also inside a
//! `List`), plus DeviceClasses and allocated ResourceClaims found next to
//! them; from a cluster (`--kubeconfig`), all ResourceSlices, DeviceClasses
//! and ResourceClaims (the simulated claim itself, if it exists, is left
//! out so that it does not compete with itself). Classes resolve, later
//! winning: shipped `deviceclasses/` (offline only: a cluster without a
//! class cannot allocate from it), the cluster's, those in the slices
//! files, `--classes` files, and those in the claim file. `resource.k8s.io`
//! v1beta1 objects are converted to v1; v1beta2 has v1's shape.
//!
//! Exit status: 0 satisfiable, 1 unsatisfiable, 2 when no verdict could be
//! reached (bad input, unreachable cluster, a selector error).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use gpu_dra_analysis::allocator::{
    AllocError, Allocator, Explanation, FailureReason, Needed, NodeAllocation, NodeFilter, Outcome,
    SimulateOptions, Snapshot, VariantReport,
};
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::manifest::{self, Document};
use crate::{OutputFormat, shipped};

/// `gpu-dra simulate` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ResourceClaim or ResourceClaimTemplate to simulate (YAML; DeviceClasses in the same
    /// file are used too).
    #[arg(long, value_name = "FILE")]
    claim: PathBuf,
    /// Files with the cluster state: ResourceSlices (objects or a List, e.g. `kubectl get
    /// resourceslices -o yaml`), and optionally DeviceClasses and allocated ResourceClaims.
    #[arg(
        long,
        value_name = "FILE",
        num_args = 1..,
        required_unless_present = "kubeconfig",
        conflicts_with = "kubeconfig"
    )]
    slices: Vec<PathBuf>,
    /// Read ResourceSlices, DeviceClasses and allocated ResourceClaims from the cluster of this
    /// kubeconfig instead.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    context: Option<String>,
    /// More DeviceClass files (they replace classes of the same name).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    classes: Vec<PathBuf>,
    /// Simulate only this node.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Report every node that fits, not just the first.
    #[arg(long)]
    all_nodes: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

/// The claim to simulate and where it came from.
struct ClaimInput {
    claim: ResourceClaim,
    /// `ResourceClaim` or `ResourceClaimTemplate`.
    kind: String,
    /// `namespace/name`.
    id: String,
    /// Whether `metadata.namespace` was given.
    namespaced: bool,
}

/// What the simulation runs against.
#[derive(Default)]
struct State {
    slices: Vec<ResourceSlice>,
    /// By name; later sources replace earlier ones.
    classes: BTreeMap<String, DeviceClass>,
    allocated: Vec<ResourceClaim>,
    /// Remarks about the input (skipped objects and the like).
    notes: Vec<String>,
}

/// Runs `simulate`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let claim_docs = load(std::slice::from_ref(&args.claim))?;
    let mut claim = read_claim(&claim_docs, &args.claim)?;
    let mut state = State::default();
    if let Some(kubeconfig) = &args.kubeconfig {
        read_cluster(kubeconfig, args.context.as_deref(), &mut claim, &mut state)?;
    } else {
        for class in shipped::classes()? {
            let class: DeviceClass =
                serde_json::from_value(class).context("a built-in DeviceClass does not decode")?;
            insert_class(&mut state, class);
        }
        let docs = load(&args.slices)?;
        read_state(&docs, &mut state)?;
        if state.slices.is_empty() {
            anyhow::bail!(
                "no ResourceSlice objects in {}: expected ResourceSlices or a List of them (kubectl get resourceslices -o yaml)",
                list_paths(&args.slices)
            );
        }
    }
    for doc in load(&args.classes)? {
        match doc.kind() {
            "DeviceClass" => {
                let class = decode::<DeviceClass>(&doc)?;
                insert_class(&mut state, class);
            }
            other => state.notes.push(format!(
                "{}: {other} in a --classes file: skipped",
                doc.position()
            )),
        }
    }
    for doc in claim_docs.iter().filter(|d| d.kind() == "DeviceClass") {
        insert_class(&mut state, decode::<DeviceClass>(doc)?);
    }

    let snapshot = Snapshot::new(&state.slices, state.classes.values(), &state.allocated);
    let options = SimulateOptions {
        nodes: args
            .node
            .as_ref()
            .map_or(NodeFilter::All, |n| NodeFilter::Node(n.clone())),
        all_fitting_nodes: args.all_nodes,
        ..SimulateOptions::default()
    };
    let mut warnings: Vec<String> = snapshot
        .pool_issues()
        .iter()
        .map(ToString::to_string)
        .collect();
    warnings.extend(snapshot.allocation_issues().iter().cloned());
    let outcome = Allocator::new()
        .simulate(&snapshot, &claim.claim, &options)
        .map_err(|e| explain_error(e, &state))?;
    let devices = DeviceIndex::new(&state.slices);
    match args.output {
        OutputFormat::Text => {
            for note in &state.notes {
                eprintln!("note: {note}");
            }
            for warning in &warnings {
                eprintln!("warning: {warning}");
            }
            print!("{}", render_text(&claim, &outcome, &devices));
        }
        OutputFormat::Json => {
            let report = render_json(&claim, &outcome, &devices, &warnings, &state.notes);
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
    }
    Ok(if outcome.is_satisfiable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn list_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads and parses files; any YAML error is fatal here (a simulation on
/// half a file would mislead).
fn load(paths: &[PathBuf]) -> anyhow::Result<Vec<Document>> {
    let mut docs = Vec::new();
    for path in paths {
        let text = manifest::read_file(path)?;
        let parsed = manifest::parse(&path.display().to_string(), &text);
        if let Some(e) = parsed.errors.first() {
            anyhow::bail!("{e}");
        }
        docs.extend(parsed.documents);
    }
    Ok(docs)
}

/// Decodes a document into a Kubernetes type, naming the file line and
/// field of the first problem.
fn decode<T: DeserializeOwned>(doc: &Document) -> anyhow::Result<T> {
    let value = to_v1(doc);
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let line = if path == "." {
            doc.line
        } else {
            doc.locate(&path)
        };
        let item = doc
            .item
            .map(|i| format!(", items[{i}]"))
            .unwrap_or_default();
        anyhow::anyhow!(
            "{}:{line} (document {}{item}): {} `{}`: {}{}",
            doc.file,
            doc.index,
            doc.kind(),
            doc.name(),
            if path == "." {
                String::new()
            } else {
                format!("{path}: ")
            },
            e.inner()
        )
    })
}

/// The document in `resource.k8s.io/v1` form: v1beta1 requests move under
/// `exactly`, v1beta1 devices lose their `basic` wrapper; v1beta2 is v1.
fn to_v1(doc: &Document) -> Value {
    let mut value = doc.value.clone();
    let version = doc.api_version();
    if version == "resource.k8s.io/v1beta1" {
        match doc.kind() {
            "ResourceClaim" => {
                if let Some(requests) = value.pointer_mut("/spec/devices/requests") {
                    beta1_requests(requests);
                }
            }
            "ResourceClaimTemplate" => {
                if let Some(requests) = value.pointer_mut("/spec/spec/devices/requests") {
                    beta1_requests(requests);
                }
            }
            "ResourceSlice" => {
                for device in value
                    .pointer_mut("/spec/devices")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if let Some(obj) = device.as_object_mut()
                        && let Some(Value::Object(basic)) = obj.remove("basic")
                    {
                        obj.extend(basic);
                    }
                }
            }
            _ => {}
        }
    }
    if version.starts_with("resource.k8s.io/")
        && let Some(obj) = value.as_object_mut()
    {
        obj.insert("apiVersion".into(), "resource.k8s.io/v1".into());
    }
    value
}

fn beta1_requests(requests: &mut Value) {
    for request in requests.as_array_mut().into_iter().flatten() {
        let Some(obj) = request.as_object_mut() else {
            continue;
        };
        if obj.contains_key("firstAvailable") || obj.contains_key("exactly") {
            continue;
        }
        let mut exactly = serde_json::Map::new();
        let keys: Vec<String> = obj.keys().filter(|k| *k != "name").cloned().collect();
        for key in keys {
            if let Some(v) = obj.remove(&key) {
                exactly.insert(key, v);
            }
        }
        obj.insert("exactly".into(), Value::Object(exactly));
    }
}

fn read_claim(docs: &[Document], path: &Path) -> anyhow::Result<ClaimInput> {
    let claims: Vec<&Document> = docs
        .iter()
        .filter(|d| matches!(d.kind(), "ResourceClaim" | "ResourceClaimTemplate"))
        .collect();
    let doc = match claims.as_slice() {
        [one] => *one,
        [] => anyhow::bail!(
            "{}: no ResourceClaim or ResourceClaimTemplate in this file",
            path.display()
        ),
        many => anyhow::bail!(
            "{}: {} claims in this file ({}); simulate one at a time",
            path.display(),
            many.len(),
            many.iter()
                .map(|d| format!("{}/{} at line {}", d.kind(), d.name(), d.line))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if !doc.api_version().starts_with("resource.k8s.io/") {
        anyhow::bail!(
            "{}: {} has apiVersion `{}`, expected resource.k8s.io/v1 (or v1beta1, v1beta2)",
            doc.position(),
            doc.kind(),
            doc.api_version()
        );
    }
    let kind = doc.kind().to_owned();
    let claim = if kind == "ResourceClaimTemplate" {
        let template: k8s_openapi::api::resource::v1::ResourceClaimTemplate = decode(doc)?;
        let mut meta = template.spec.metadata.unwrap_or_default();
        meta.name = meta.name.or(template.metadata.name);
        meta.namespace = template.metadata.namespace;
        ResourceClaim {
            metadata: meta,
            spec: template.spec.spec,
            status: None,
        }
    } else {
        decode::<ResourceClaim>(doc)?
    };
    let namespaced = claim.metadata.namespace.is_some();
    let mut input = ClaimInput {
        claim,
        kind,
        id: String::new(),
        namespaced,
    };
    set_id(&mut input, "default");
    Ok(input)
}

fn set_id(input: &mut ClaimInput, default_namespace: &str) {
    let meta = &mut input.claim.metadata;
    let namespace = meta
        .namespace
        .get_or_insert_with(|| default_namespace.to_owned());
    input.id = format!(
        "{namespace}/{}",
        meta.name.as_deref().unwrap_or("(unnamed)")
    );
}

fn insert_class(state: &mut State, class: DeviceClass) {
    let name = class.metadata.name.clone().unwrap_or_default();
    state.classes.insert(name, class);
}

/// Takes the cluster state out of files.
fn read_state(docs: &[Document], state: &mut State) -> anyhow::Result<()> {
    for doc in docs {
        match doc.kind() {
            "ResourceSlice" => state.slices.push(decode(doc)?),
            "DeviceClass" => insert_class(state, decode(doc)?),
            "ResourceClaim" => {
                let claim: ResourceClaim = decode(doc)?;
                if claim
                    .status
                    .as_ref()
                    .is_some_and(|s| s.allocation.is_some())
                {
                    state.allocated.push(claim);
                } else {
                    state.notes.push(format!(
                        "{}: ResourceClaim `{}` is not allocated: it uses no devices",
                        doc.position(),
                        doc.name()
                    ));
                }
            }
            other => state.notes.push(format!(
                "{}: {} is not cluster state for simulate: skipped",
                doc.position(),
                if other.is_empty() {
                    "an object without kind"
                } else {
                    other
                }
            )),
        }
    }
    Ok(())
}

/// Lists the cluster state through the kubeconfig.
fn read_cluster(
    kubeconfig: &Path,
    context: Option<&str>,
    claim: &mut ClaimInput,
    state: &mut State,
) -> anyhow::Result<()> {
    let runtime = crate::cluster::runtime()?;
    runtime.block_on(async {
        let crate::cluster::Cluster {
            client,
            server,
            default_namespace,
        } = crate::cluster::connect(kubeconfig, context).await?;
        if !claim.namespaced {
            set_id_from(claim, &default_namespace);
        }
        let slices: Vec<ResourceSlice> = list_all(&client, &server, "resourceslices").await?;
        let classes: Vec<DeviceClass> = list_all(&client, &server, "deviceclasses").await?;
        let claims: Vec<ResourceClaim> = list_all(&client, &server, "resourceclaims").await?;
        state.slices = slices;
        for class in classes {
            insert_class(state, class);
        }
        let (ns, name) = (
            claim.claim.metadata.namespace.clone(),
            claim.claim.metadata.name.clone(),
        );
        for c in claims {
            if c.status.as_ref().is_none_or(|s| s.allocation.is_none()) {
                continue;
            }
            if c.metadata.namespace == ns && c.metadata.name == name && name.is_some() {
                state.notes.push(format!(
                    "ResourceClaim {} is allocated in the cluster; simulating it as if it were not",
                    claim.id
                ));
                continue;
            }
            state.allocated.push(c);
        }
        Ok(())
    })
}

fn set_id_from(claim: &mut ClaimInput, namespace: &str) {
    claim.claim.metadata.namespace = None;
    set_id(claim, namespace);
}

/// Lists every object of a cluster-scoped (or all-namespace) resource,
/// page by page.
async fn list_all<K>(client: &kube::Client, server: &str, plural: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = kube::api::ListParams::default().limit(500);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let list = api.list(&params).await.map_err(|e| match &e {
            kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(
                "{server} does not serve resource.k8s.io/v1 {plural} (Kubernetes 1.34 or newer is needed): {e}"
            ),
            _ => anyhow::anyhow!("listing {plural} from {server}: {e}"),
        })?;
        items.extend(list.items);
        match list.metadata.continue_ {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
        }
    }
    Ok(items)
}

/// Adds what the user can do about an error that prevents a verdict.
fn explain_error(e: AllocError, state: &State) -> anyhow::Error {
    match &e {
        AllocError::UnknownDeviceClass { .. } => {
            let known: Vec<&str> = state.classes.keys().map(String::as_str).collect();
            anyhow::anyhow!(
                "{e}; known classes: {} (add one with --classes FILE)",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )
        }
        _ => anyhow::anyhow!("cannot simulate: {e}"),
    }
}

/// The devices of the slices, by `(driver, pool, device)`, at each pool's
/// highest generation.
struct DeviceIndex<'a> {
    devices: HashMap<(&'a str, &'a str, &'a str), (i64, &'a Device)>,
}

impl<'a> DeviceIndex<'a> {
    fn new(slices: &'a [ResourceSlice]) -> Self {
        let mut devices: HashMap<(&str, &str, &str), (i64, &Device)> = HashMap::new();
        for slice in slices {
            let spec = &slice.spec;
            let generation = spec.pool.generation;
            for device in spec.devices.iter().flatten() {
                let key = (
                    spec.driver.as_str(),
                    spec.pool.name.as_str(),
                    device.name.as_str(),
                );
                if devices.get(&key).is_none_or(|(g, _)| *g <= generation) {
                    devices.insert(key, (generation, device));
                }
            }
        }
        DeviceIndex { devices }
    }

    fn get(&self, driver: &str, pool: &str, device: &str) -> Option<&'a Device> {
        self.devices.get(&(driver, pool, device)).map(|(_, d)| *d)
    }
}

/// Attributes shown in the text table, in this order (names in the
/// driver's domain, unqualified).
const KEY_ATTRIBUTES: &[&str] = &[
    "type",
    "productName",
    "profile",
    "nvlinkDomain",
    "parentUUID",
];

/// An attribute's value as text.
fn attribute_text(a: &k8s_openapi::api::resource::v1::DeviceAttribute) -> String {
    if let Some(s) = &a.string {
        s.clone()
    } else if let Some(i) = a.int {
        i.to_string()
    } else if let Some(b) = a.bool {
        b.to_string()
    } else if let Some(v) = &a.version {
        v.clone()
    } else {
        String::new()
    }
}

/// A byte quantity in binary units when exact (`40Gi`), else as written.
fn memory_text(q: &str) -> String {
    let Ok(bytes) = q.parse::<u64>() else {
        return q.to_owned();
    };
    for (unit, size) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    if bytes >= 1 << 30 {
        return format!("{:.1}Gi", bytes as f64 / f64::from(1u32 << 30));
    }
    q.to_owned()
}

/// `key=value` pairs describing a device.
fn describe(device: &Device, driver: &str) -> String {
    let prefix = format!("{driver}/");
    let attrs: BTreeMap<&str, String> = device
        .attributes
        .iter()
        .flatten()
        .map(|(k, v)| (k.strip_prefix(&prefix).unwrap_or(k), attribute_text(v)))
        .collect();
    let mut parts: Vec<String> = Vec::new();
    for key in KEY_ATTRIBUTES {
        if let Some(v) = attrs.get(key) {
            parts.push(format!("{key}={v}"));
        }
        if *key == "productName"
            && let Some(memory) = device
                .capacity
                .iter()
                .flatten()
                .find(|(k, _)| k.strip_prefix(&prefix).unwrap_or(k) == "memory")
        {
            parts.push(format!("memory={}", memory_text(&memory.1.value.0)));
        }
    }
    parts.join(" ")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn render_text(claim: &ClaimInput, outcome: &Outcome, devices: &DeviceIndex<'_>) -> String {
    let mut out = String::new();
    match outcome {
        Outcome::Satisfiable(nodes) => {
            let _ = writeln!(
                out,
                "{} {}: can be allocated{}",
                claim.kind,
                claim.id,
                if nodes.len() > 1 {
                    format!(" on {}", plural(nodes.len(), "node", "nodes"))
                } else {
                    String::new()
                }
            );
            for node in nodes {
                render_allocation(&mut out, node, devices);
            }
        }
        Outcome::Unsatisfiable(explanation) => {
            let _ = writeln!(out, "{} {}: cannot be allocated", claim.kind, claim.id);
            let _ = writeln!(out, "  why: {}", explanation.summary);
            render_explanation(&mut out, explanation);
        }
    }
    out
}

fn render_allocation(out: &mut String, node: &NodeAllocation, devices: &DeviceIndex<'_>) {
    let _ = writeln!(
        out,
        "node {}:",
        node.node.as_deref().unwrap_or("(any node)")
    );
    let rows: Vec<[String; 4]> = node
        .results
        .iter()
        .map(|r| {
            let mut details = devices
                .get(&r.driver, &r.pool, &r.device)
                .map(|d| describe(d, &r.driver))
                .unwrap_or_default();
            if r.admin_access {
                details.push_str(" (admin access)");
            }
            if let Some(share) = &r.share_id {
                let _ = write!(details, " share={share}");
            }
            [r.request.clone(), r.device.clone(), r.pool.clone(), details]
        })
        .collect();
    let header = ["REQUEST", "DEVICE", "POOL", "DETAILS"].map(str::to_owned);
    let widths: Vec<usize> = (0..3)
        .map(|c| {
            rows.iter()
                .chain(std::iter::once(&header))
                .map(|r| r[c].len())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            out,
            "  {:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
}

fn needed_text(needed: Needed) -> String {
    match needed {
        Needed::Count(n) => format!("needs {}", plural(n, "device", "devices")),
        Needed::All => "needs all matching devices".to_owned(),
    }
}

fn render_explanation(out: &mut String, explanation: &Explanation) {
    let single = explanation.nodes.len() == 1;
    for node in &explanation.nodes {
        // With one node, the summary above is this node's already.
        let _ = writeln!(
            out,
            "node {} ({}){}",
            node.node.as_deref().unwrap_or("(any node)"),
            plural(node.devices, "device", "devices"),
            if single {
                ":".to_owned()
            } else {
                format!(": {}", node.summary)
            }
        );
        if matches!(node.reason, FailureReason::NoDevices) {
            continue;
        }
        for request in &node.requests {
            for v in &request.variants {
                render_variant(out, v);
            }
        }
    }
}

fn render_variant(out: &mut String, v: &VariantReport) {
    let _ = writeln!(
        out,
        "  request `{}` (class {}, {}{}): {}",
        v.name,
        v.device_class,
        needed_text(v.needed),
        if v.admin_access { ", admin access" } else { "" },
        if v.fits_alone {
            "fits on its own"
        } else {
            "does not fit"
        }
    );
    for stage in &v.stages {
        let _ = writeln!(
            out,
            "    {:>4} of {} pass {}: {}",
            stage.passed, v.considered, stage.source, stage.expression
        );
    }
    if let Some(c) = &v.closest {
        let values: Vec<String> = c
            .values
            .iter()
            .map(|(k, v)| match v {
                Some(v) if k == "memory" || k.ends_with("/memory") => {
                    let shown = memory_text(v);
                    if shown == *v {
                        format!("{k} = {v}")
                    } else {
                        format!("{k} = {shown} ({v})")
                    }
                }
                Some(v) => format!("{k} = {v}"),
                None => format!("{k} missing"),
            })
            .collect();
        let _ = writeln!(
            out,
            "    closest device: {} (pool {}) fails selector {}{}",
            c.device,
            c.pool,
            c.failed_stage + 1,
            if values.is_empty() {
                String::new()
            } else {
                format!(" with {}", values.join(", "))
            }
        );
    }
    if let Some(e) = &v.first_error {
        let _ = writeln!(
            out,
            "    {} failed with an error, first: {e}",
            plural(v.selector_errors, "device", "devices")
        );
    }
    let mut counts = vec![format!("{} match", v.matching)];
    for (n, what) in [
        (v.in_use, "in use"),
        (v.capacity_unsuitable, "without the requested capacity"),
        (v.capacity_exhausted, "with capacity used up"),
        (v.counters_exhausted, "short of shared counters"),
        (v.tainted, "tainted"),
        (v.malformed, "unreadable"),
    ] {
        if n > 0 {
            counts.push(format!("{n} {what}"));
        }
    }
    counts.push(format!("{} available", v.available));
    let mut line = counts.join(", ");
    if let Some(c) = &v.counter_shortage {
        let _ = write!(line, " (short: {c})");
    }
    let _ = writeln!(out, "    {line}");
}

fn render_json(
    claim: &ClaimInput,
    outcome: &Outcome,
    devices: &DeviceIndex<'_>,
    warnings: &[String],
    notes: &[String],
) -> Value {
    let allocations: Vec<Value> = outcome
        .allocations()
        .unwrap_or_default()
        .iter()
        .map(|node| {
            let results: Vec<Value> = node
                .results
                .iter()
                .map(|r| {
                    let device = devices.get(&r.driver, &r.pool, &r.device);
                    let attributes: BTreeMap<&String, String> = device
                        .and_then(|d| d.attributes.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k, attribute_text(v)))
                        .collect();
                    let capacity: BTreeMap<&String, &String> = device
                        .and_then(|d| d.capacity.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k, &v.value.0))
                        .collect();
                    let mut result = serde_json::to_value(r.to_k8s()).unwrap_or_default();
                    if let Some(obj) = result.as_object_mut() {
                        obj.insert("attributes".into(), json!(attributes));
                        obj.insert("capacity".into(), json!(capacity));
                    }
                    result
                })
                .collect();
            json!({"node": node.node, "results": results})
        })
        .collect();
    let explanation = outcome.explanation().map(|e| {
        json!({
            "summary": e.summary,
            "nodesChecked": e.nodes_checked,
            "nodes": e.nodes.iter().map(|n| json!({
                "node": n.node,
                "devices": n.devices,
                "reason": reason_json(&n.reason),
                "summary": n.summary,
                "requests": n.requests.iter().map(|r| json!({
                    "request": r.request,
                    "variants": r.variants.iter().map(variant_json).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "claim": {
            "kind": claim.kind,
            "namespace": claim.claim.metadata.namespace,
            "name": claim.claim.metadata.name,
        },
        "satisfiable": outcome.is_satisfiable(),
        "allocations": allocations,
        "explanation": explanation,
        "warnings": warnings,
        "notes": notes,
    })
}

fn reason_json(reason: &FailureReason) -> Value {
    match reason {
        FailureReason::NoDevices => json!({"type": "NoDevices"}),
        FailureReason::Request { request } => json!({"type": "Request", "request": request}),
        FailureReason::Constraints {
            constraints,
            descriptions,
        } => {
            json!({"type": "Constraints", "constraints": constraints, "descriptions": descriptions})
        }
        FailureReason::Combination => json!({"type": "Combination"}),
        FailureReason::Undetermined { reason } => json!({"type": "Undetermined", "reason": reason}),
    }
}

fn variant_json(v: &VariantReport) -> Value {
    json!({
        "name": v.name,
        "deviceClass": v.device_class,
        "needed": match v.needed { Needed::Count(n) => json!(n), Needed::All => json!("All") },
        "adminAccess": v.admin_access,
        "considered": v.considered,
        "stages": v.stages.iter().map(|s| json!({
            "source": s.source.to_string(),
            "expression": s.expression,
            "passed": s.passed,
        })).collect::<Vec<_>>(),
        "selectorErrors": v.selector_errors,
        "firstError": v.first_error,
        "malformed": v.malformed,
        "matching": v.matching,
        "inUse": v.in_use,
        "capacityUnsuitable": v.capacity_unsuitable,
        "capacityExhausted": v.capacity_exhausted,
        "countersExhausted": v.counters_exhausted,
        "counterShortage": v.counter_shortage,
        "tainted": v.tainted,
        "available": v.available,
        "fitsAlone": v.fits_alone,
        "closest": v.closest.as_ref().map(|c| json!({
            "pool": c.pool,
            "device": c.device,
            "node": c.node,
            "failedStage": c.failed_stage,
            "values": c.values.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_shown_in_binary_units() {
        assert_eq!(memory_text("42949672960"), "40Gi");
        assert_eq!(memory_text("85520809984"), "81559Mi");
        assert_eq!(memory_text("85520809985"), "79.6Gi");
        assert_eq!(memory_text("10"), "10");
        assert_eq!(memory_text("40Gi"), "40Gi");
    }

    #[test]
    fn v1beta1_requests_move_under_exactly() {
        let text = "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      deviceClassName: gpu.nvidia.com\n      count: 2\n    - name: alt\n      firstAvailable:\n      - {name: a, deviceClassName: gpu.nvidia.com}\n";
        let parsed = manifest::parse("c.yaml", text);
        let v1 = to_v1(&parsed.documents[0]);
        assert_eq!(v1["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(
            v1["spec"]["devices"]["requests"][0],
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}})
        );
        assert_eq!(
            v1["spec"]["devices"]["requests"][1]["firstAvailable"][0]["name"],
            "a"
        );
    }

    #[test]
    fn v1beta1_slices_lose_the_basic_wrapper() {
        let text = "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n  driver: d\n  pool: {name: p, generation: 0, resourceSliceCount: 1}\n  nodeName: n\n  devices:\n  - name: x\n    basic:\n      attributes: {type: {string: gpu}}\n";
        let parsed = manifest::parse("s.yaml", text);
        let slice: ResourceSlice = decode(&parsed.documents[0]).unwrap();
        let device = &slice.spec.devices.unwrap()[0];
        assert_eq!(device.name, "x");
        assert_eq!(
            device.attributes.as_ref().unwrap()["type"]
                .string
                .as_deref(),
            Some("gpu")
        );
    }

    #[test]
    fn decode_errors_name_file_line_and_field() {
        let text = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n  driver: d\n  pool:\n    name: p\n    generation: lots\n    resourceSliceCount: 1\n";
        let parsed = manifest::parse("s.yaml", text);
        let err = decode::<ResourceSlice>(&parsed.documents[0])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("s.yaml:8 (document 1): ResourceSlice `s`: spec.pool.generation: "),
            "{err}"
        );
    }
}
