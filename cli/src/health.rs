//! `gpu-dra health`: a read-only view of the GPU health the kubelet plugin
//! published, per node and per GPU: every device taint of driver
//! `gpu.nvidia.com` (key, value, effect, time added) with what it means,
//! from ResourceSlice files (`-f`, e.g. `kubectl get resourceslices -o
//! yaml`) or a live cluster (`--kubeconfig`). Taints added by
//! DeviceTaintRules are not part of the slices and are not shown.
//!
//! Exit status: 0 when every shown device is schedulable, 1 when a device
//! has a `NoSchedule` or `NoExecute` taint, 2 when no view could be made
//! (bad input, unreachable cluster, no slices of the driver).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use crate::OutputFormat;
use crate::manifest::{self, Document};
use gpu_dra::taints::{self as report, DRIVER, SliceInput, render};

/// `gpu-dra health` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Files with ResourceSlices (objects or a List, e.g. `kubectl get resourceslices -o
    /// yaml`); other objects in them are skipped.
    #[arg(
        short = 'f',
        long,
        value_name = "FILE",
        num_args = 1..,
        required_unless_present = "kubeconfig",
        conflicts_with = "kubeconfig"
    )]
    slices: Vec<PathBuf>,
    /// Read the ResourceSlices from the cluster of this kubeconfig instead.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    context: Option<String>,
    /// Show only this node.
    #[arg(long, value_name = "NAME", value_parser = node_name)]
    node: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

/// A `--node` value: a node name is a DNS subdomain, which also keeps it
/// from adding terms to the field selector it goes into.
fn node_name(text: &str) -> Result<String, String> {
    if gpu_dra_api::schema::is_dns_subdomain(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "`{}` is not a node name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters)",
            render::clean(&report::cut(text))
        ))
    }
}

/// Runs `health`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut notes = Vec::new();
    let (docs, listed);
    let inputs: Vec<SliceInput<'_>> = if let Some(kubeconfig) = &args.kubeconfig {
        listed = list_cluster(kubeconfig, args.context.as_deref(), args.node.as_deref())?;
        listed
            .iter()
            .map(|(name, value)| SliceInput {
                value,
                place: Box::new(move |path: &str| format!("ResourceSlice {name}: {path}")),
            })
            .collect()
    } else {
        docs = load(&args.slices)?;
        let mut inputs = Vec::new();
        for doc in &docs {
            if doc.kind() == "ResourceSlice" && doc.api_version().starts_with("resource.k8s.io/") {
                inputs.push(SliceInput {
                    value: &doc.value,
                    place: Box::new(move |path: &str| file_place(doc, path)),
                });
            } else {
                notes.push(format!(
                    "{}: {} is not a ResourceSlice: skipped",
                    doc.position(),
                    match doc.kind() {
                        "" => "an object without kind",
                        kind => kind,
                    }
                ));
            }
        }
        inputs
    };
    let mut report = report::build(&inputs, args.node.as_deref());
    notes.append(&mut report.notes);
    report.notes = notes;
    if report.nodes.is_empty() {
        for note in &report.notes {
            eprintln!("note: {}", render::clean(note));
        }
        anyhow::bail!(
            "no ResourceSlice of driver {DRIVER}{} in {}{}",
            args.node
                .as_deref()
                .map(|n| format!(" for node {}", render::clean(n)))
                .unwrap_or_default(),
            source(args),
            if report.problems.is_empty() {
                String::new()
            } else {
                format!(
                    " (first problem: {}: {})",
                    render::clean(&report.problems[0].at),
                    render::clean(&report.problems[0].message)
                )
            }
        );
    }
    match args.output {
        OutputFormat::Text => {
            for note in &report.notes {
                eprintln!("note: {}", render::clean(note));
            }
            for p in &report.problems {
                eprintln!(
                    "warning: {}: {}",
                    render::clean(&p.at),
                    render::clean(&p.message)
                );
            }
            print!("{}", render::text(&report));
        }
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.summary.unschedulable_devices == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Where the slices came from, for messages.
fn source(args: &Args) -> String {
    match &args.kubeconfig {
        Some(k) => format!("the cluster of {}", k.display()),
        None => args
            .slices
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// `file:line: ResourceSlice name: field`.
fn file_place(doc: &Document, path: &str) -> String {
    format!(
        "{}:{}: ResourceSlice {}: {path}",
        doc.file,
        doc.locate(path),
        report::cut(doc.name())
    )
}

/// Reads and parses files; a YAML error is fatal (a view of half a file
/// would hide taints).
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

/// The driver's ResourceSlices in the cluster (of `node` only when given),
/// as `(name, object)`, listed page by page with field selectors.
fn list_cluster(
    kubeconfig: &std::path::Path,
    context: Option<&str>,
    node: Option<&str>,
) -> anyhow::Result<Vec<(String, Value)>> {
    let runtime = crate::cluster::runtime()?;
    runtime.block_on(async {
        let cluster = crate::cluster::connect(kubeconfig, context).await?;
        let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "resourceslices");
        let api: kube::Api<DynamicObject> = kube::Api::all_with(cluster.client, &resource);
        let mut fields = format!("spec.driver={DRIVER}");
        if let Some(n) = node {
            fields.push_str(",spec.nodeName=");
            fields.push_str(n);
        }
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = kube::api::ListParams::default()
                .fields(&fields)
                .limit(500);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let list = api.list(&params).await.map_err(|e| match &e {
                kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(
                    "{} does not serve resource.k8s.io/v1 resourceslices (Kubernetes 1.34 or newer is needed): {e}",
                    cluster.server
                ),
                _ => anyhow::anyhow!("listing resourceslices from {}: {e}", cluster.server),
            })?;
            for item in list.items {
                let name = item.metadata.name.clone().unwrap_or_default();
                let value = serde_json::to_value(&item)
                    .with_context(|| format!("ResourceSlice {name} does not encode"))?;
                items.push((report::cut(&name), value));
            }
            match list.metadata.continue_ {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        Ok(items)
    })
}
