//! Every claim shape in a real pod: the real scheduler allocates, the real
//! kubelet calls the plugin, containerd injects the CDI devices, and the
//! container prints what it sees. The test compares that with the claim's
//! CDI spec on the node (every device node, env entry and mount of the spec
//! is in the container), checks the shape's own facts (how many GPUs, which
//! GPU, MIG capability nodes, the MPS daemon), then deletes the pods and
//! checks that the claims are deallocated and nothing is left on the node.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use libtest_mimic::Failed;
use serde_json::Value;

use crate::harness::{BUSYBOX, CDI_DIR, Cluster, DRIVER_NS, node};

pub const TESTS: [(&str, crate::Test); 6] = [
    (
        "claims::every_claim_of_demo_and_docs_examples_in_a_pod",
        every_example_claim,
    ),
    ("claims::static_and_dynamic_mig", static_and_dynamic_mig),
    (
        "claims::time_slicing_and_mps_limits_reach_the_driver",
        time_slicing_and_mps,
    ),
    (
        "claims::one_claim_shared_by_two_pods_and_a_template_per_pod",
        shared_and_template,
    ),
    ("claims::admin_access_sees_an_allocated_gpu", admin_access),
    ("claims::a_prioritized_list_falls_back", prioritized_list),
];

const POD_START: Duration = Duration::from_secs(120);
const GONE: Duration = Duration::from_secs(120);

/// What a container saw: its device nodes, env and mount points.
#[derive(Debug, Default)]
pub struct Seen {
    /// Paths under /dev (and /dev/nvidia-caps) of NVIDIA nodes.
    pub dev: BTreeSet<String>,
    /// `NAME=value` lines.
    pub env: BTreeSet<String>,
    /// Mount points.
    pub mounts: BTreeSet<String>,
}

impl Seen {
    /// The GPU nodes (`/dev/nvidia<N>`).
    pub fn gpus(&self) -> Vec<&str> {
        self.dev
            .iter()
            .map(String::as_str)
            .filter(|d| {
                d.strip_prefix("/dev/nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect()
    }
}

/// The command of a check container: prints its NVIDIA nodes, env and
/// mounts between markers, then waits (so the claim stays prepared) until
/// it is stopped.
pub const CHECK_SCRIPT: &str = "echo ==DEV; for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -e \"$f\" ] && echo \"$f\"; done; \
     echo ==ENV; env; echo ==MOUNTS; cut -d' ' -f2 /proc/mounts; echo ==END; \
     trap 'exit 0' TERM; sleep 3600 & wait";

/// The end of a pod script that keeps the pod (and so its claim) until it
/// is stopped, then exits at once.
pub const WAIT_UNTIL_STOPPED: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// The plugin's DaemonSet, as `kubectl` names it.
pub const PLUGIN_DAEMONSET: &str = "ds/gpu-dra-driver-kubelet-plugin";

/// A pod `name` that sleeps on claim `claim` until it is stopped.
pub fn sleeping_pod(name: &str, claim: &str) -> String {
    script_pod(name, WAIT_UNTIL_STOPPED, &claim_rest(claim))
}

/// Parses a check container's log.
pub fn parse_seen(log: &str) -> Result<Seen, String> {
    if !log.contains("==END") {
        return Err(format!("the container's output is incomplete:\n{log}"));
    }
    let mut seen = Seen::default();
    let mut section = "";
    for line in log.lines() {
        match line {
            "==DEV" | "==ENV" | "==MOUNTS" | "==END" => section = line,
            _ => {
                let set = match section {
                    "==DEV" => &mut seen.dev,
                    "==ENV" => &mut seen.env,
                    "==MOUNTS" => &mut seen.mounts,
                    _ => continue,
                };
                set.insert(line.to_owned());
            }
        }
    }
    Ok(seen)
}

/// A pod whose one container uses `claims` (`(name, source)` where source is
/// `resourceClaimName: x` or `resourceClaimTemplateName: y`).
pub fn check_pod(name: &str, claims: &[(&str, &str)]) -> String {
    script_pod(name, CHECK_SCRIPT, &claims_rest(claims))
}

/// The `rest` of a [`script_pod`] whose container uses `claims` (`(name,
/// source)` as for [`check_pod`]): the container's `resources` and the
/// pod's `resourceClaims`.
pub fn claims_rest(claims: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let (mut refs, mut sources) = (String::new(), String::new());
    for (n, src) in claims {
        let _ = write!(refs, "{{name: {n}}}, ");
        let _ = writeln!(sources, "    - {{name: {n}, {src}}}");
    }
    format!(
        "    resources: {{claims: [{refs}]}}\n  resourceClaims:\n{sources}",
        refs = refs.trim_end_matches(", "),
    )
}

/// The `rest` of a [`script_pod`] using claim `claim` as `gpu`.
pub fn claim_rest(claim: &str) -> String {
    claims_rest(&[("gpu", &format!("resourceClaimName: {claim}"))])
}

/// A never-restarted pod `name` whose one busybox container `check` runs
/// `script` with `sh -c`; `rest` (the container's `resources` and the rest
/// of the pod's spec, YAML lines indented as in the pod) follows the
/// command line.
pub fn script_pod(name: &str, script: &str, rest: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: check
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: [\"sh\", \"-c\", {script}]
{rest}",
        script = serde_json::to_string(script).expect("a string"),
    )
}

/// Starts `pod_yaml` in `ns` and returns what its container saw.
pub fn run_check_pod(c: &Cluster, ns: &str, name: &str, pod_yaml: &str) -> Result<Seen, Failed> {
    c.apply(ns, pod_yaml)?;
    c.wait_pod_phase(ns, name, "Running", POD_START)?;
    let log = log_to_end(c, ns, name)?;
    Ok(parse_seen(&log)?)
}

/// The log of running pod `name`, once it shows the script's `==END` mark
/// (or as it is after 100 tries, 100 ms apart).
pub fn log_to_end(c: &Cluster, ns: &str, name: &str) -> Result<String, Failed> {
    let mut log = String::new();
    for _ in 0..100 {
        log = c.kubectl(&["logs", "-n", ns, name])?;
        if log.contains("==END") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(log)
}

/// The JSON of `kubectl get -o json`.
pub fn get_json(c: &Cluster, ns: &str, what: &[&str]) -> Result<Value, Failed> {
    let mut args = vec!["get", "-n", ns];
    args.extend_from_slice(what);
    args.extend(["-o", "json"]);
    Ok(serde_json::from_str(&c.kubectl(&args)?)
        .map_err(|e| format!("kubectl get {what:?}: {e}"))?)
}

/// The names of the ResourceClaims a pod uses (its status says which were
/// made from templates).
pub fn pod_claims(c: &Cluster, ns: &str, pod: &str) -> Result<Vec<String>, Failed> {
    let p = get_json(c, ns, &["pod", pod])?;
    let mut out = Vec::new();
    for rc in p["spec"]["resourceClaims"].as_array().into_iter().flatten() {
        if let Some(n) = rc["resourceClaimName"].as_str() {
            out.push(n.to_owned());
        } else {
            let name = rc["name"].as_str().unwrap_or_default();
            let generated = p["status"]["resourceClaimStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["name"].as_str() == Some(name))
                .and_then(|s| s["resourceClaimName"].as_str())
                .ok_or_else(|| format!("pod {pod}: no claim made from the template of {name}"))?;
            out.push(generated.to_owned());
        }
    }
    Ok(out)
}

/// A claim's allocated devices: `(request, device)` pairs.
pub fn allocated(claim: &Value) -> Vec<(String, String)> {
    claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["request"].as_str().unwrap_or_default().to_owned(),
                r["device"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The claim's CDI spec on the node, by claim UID.
pub fn cdi_spec(uid: &str) -> Result<Value, String> {
    let path = Path::new(CDI_DIR).join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("CDI spec {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks that the container saw everything the claim's CDI spec gives:
/// each device node, env entry and mount.
pub fn check_against_spec(
    c: &Cluster,
    ns: &str,
    claim: &str,
    seen: &Seen,
) -> Result<Value, Failed> {
    let uid = uid_of(c, ns, claim)?;
    let spec = cdi_spec(&uid).map_err(|e| format!("claim {claim}: {e}"))?;
    let mut edits = vec![&spec["containerEdits"]];
    for d in spec["devices"].as_array().into_iter().flatten() {
        edits.push(&d["containerEdits"]);
    }
    let mut missing = Vec::new();
    for e in edits {
        for n in e["deviceNodes"].as_array().into_iter().flatten() {
            let p = n["path"].as_str().unwrap_or_default();
            if !seen.dev.contains(p) {
                missing.push(format!("device node {p}"));
            }
        }
        for v in e["env"].as_array().into_iter().flatten() {
            let v = v.as_str().unwrap_or_default();
            if !seen.env.contains(v) {
                missing.push(format!("env {v}"));
            }
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            let p = m["containerPath"].as_str().unwrap_or_default();
            if !seen.mounts.contains(p) {
                missing.push(format!("mount {p}"));
            }
        }
    }
    if !missing.is_empty() {
        return Err(format!("claim {claim}: the container lacks what its CDI spec gives: {missing:?}\nseen: {seen:#?}").into());
    }
    Ok(spec)
}

/// Deletes the pods, then checks that `claims` (those that still exist)
/// are deallocated, and that the node has no CDI spec, checkpoint entry or
/// MPS daemon left for them.
pub fn delete_and_check_clean(
    c: &Cluster,
    ns: &str,
    pods: &[&str],
    claim_uids: &[String],
) -> Result<(), Failed> {
    for pod in pods {
        c.kubectl(&[
            "delete",
            "pod",
            "-n",
            ns,
            pod,
            "--wait=true",
            "--timeout=120s",
        ])?;
    }
    let start = std::time::Instant::now();
    loop {
        let mut left = Vec::new();
        let claims = get_json(c, ns, &["resourceclaims"])?;
        for claim in claims["items"].as_array().into_iter().flatten() {
            let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
            if claim_uids.iter().any(|u| u == uid) && !claim["status"]["allocation"].is_null() {
                left.push(format!(
                    "claim {} still allocated",
                    claim["metadata"]["name"]
                ));
            }
        }
        let specs = node::claim_cdi_specs();
        let checkpoint = node::checkpoint();
        let daemons = node::mps_daemons();
        for uid in claim_uids {
            if specs.iter().any(|s| s.contains(uid.as_str())) {
                left.push(format!("CDI spec of claim {uid}"));
            }
            if checkpoint.contains(uid.as_str()) {
                left.push(format!("checkpoint entry of claim {uid}"));
            }
            if let Some(d) = daemons.iter().find(|d| d.contains(uid.as_str())) {
                left.push(format!("MPS daemon folder {d} of claim {uid}"));
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if start.elapsed() > GONE {
            return Err(format!("after the pods were deleted: {left:?}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn uid_of(c: &Cluster, ns: &str, claim: &str) -> Result<String, Failed> {
    Ok(c.kubectl(&[
        "get",
        "-n",
        ns,
        "resourceclaim",
        claim,
        "-o",
        "jsonpath={.metadata.uid}",
    ])?
    .trim()
    .to_owned())
}

/// The claims and templates of a manifest file, without its pods (the
/// examples' own pods run CUDA images).
fn claims_of_file(path: &Path) -> Result<Vec<(String, String, String)>, Failed> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for doc in text.split("\n---") {
        let v: Value = match yaml_serde::from_str(doc) {
            Ok(v) => v,
            Err(e) => return Err(format!("{}: {e}", path.display()).into()),
        };
        let kind = v["kind"].as_str().unwrap_or_default();
        if kind == "ResourceClaim" || kind == "ResourceClaimTemplate" {
            out.push((
                kind.to_owned(),
                v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                doc.to_owned(),
            ));
        }
    }
    Ok(out)
}

/// Expected GPU count of an example claim, where the shape fixes it.
fn expected_gpus(name: &str) -> Option<usize> {
    match name {
        "whole-gpu" | "gpu" | "large-memory" | "mps-gpu" | "memory-share-a" | "memory-share-b" => {
            Some(1)
        }
        "nvlink-pair" | "shared-gpus" => Some(2),
        _ => None,
    }
}

fn every_example_claim(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-examples";
    c.fresh_namespace(ns)?;
    // Claims made for the errors they give (the webhook and scheduler tests use
    // them), and claims for devices the cluster's install does not publish:
    // consumable shares need `--consumable-shares`, which refuses the
    // install's `memorySharing`; passthrough needs `--passthrough` and a
    // stand-in sysfs, and its pods get no NVIDIA nodes (vfio.rs runs it).
    let skip = [
        "invalid-selector.yaml",
        "too-much-memory.yaml",
        "consumable-shares.yaml",
        "vfio-passthrough.yaml",
    ];
    let mut files = Vec::new();
    for dir in ["demo", "docs/examples"] {
        for e in std::fs::read_dir(c.repo.join(dir)).map_err(|e| format!("{dir}: {e}"))? {
            let p = e.map_err(|e| e.to_string())?.path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if p.extension().is_some_and(|x| x == "yaml") && !skip.contains(&name.as_str()) {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut ran = Vec::new();
    for file in &files {
        for (kind, name, doc) in claims_of_file(file)? {
            // Two files may share a name (nvlink-pair): one namespace each run.
            let _ = c.kubectl(&[
                "delete",
                "-n",
                ns,
                if kind == "ResourceClaim" {
                    "resourceclaim"
                } else {
                    "resourceclaimtemplate"
                },
                &name,
                "--ignore-not-found",
                "--wait=true",
            ]);
            c.apply(ns, &doc)?;
            let pod = format!("check-{name}");
            let source = if kind == "ResourceClaim" {
                format!("resourceClaimName: {name}")
            } else {
                format!("resourceClaimTemplateName: {name}")
            };
            let seen = run_check_pod(c, ns, &pod, &check_pod(&pod, &[("gpus", &source)])).map_err(
                |e| {
                    format!(
                        "{} ({kind} {name}): {}",
                        file.display(),
                        e.message().unwrap_or_default()
                    )
                },
            )?;
            let claim = pod_claims(c, ns, &pod)?.remove(0);
            check_against_spec(c, ns, &claim, &seen)?;
            if !seen.env.contains("NVIDIA_VISIBLE_DEVICES=void") {
                return Err(format!("{name}: no NVIDIA_VISIBLE_DEVICES=void").into());
            }
            if !seen.dev.contains("/dev/nvidiactl") {
                return Err(format!("{name}: no /dev/nvidiactl").into());
            }
            if let Some(n) = expected_gpus(&name)
                && seen.gpus().len() != n
            {
                return Err(format!(
                    "{name}: {} GPU nodes, want {n}: {:?}",
                    seen.gpus().len(),
                    seen.gpus()
                )
                .into());
            }
            let uid = uid_of(c, ns, &claim)?;
            delete_and_check_clean(c, ns, &[&pod], &[uid])?;
            ran.push(format!(
                "{}:{name}",
                file.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
    }
    if ran.len() < 8 {
        return Err(format!("only {} example claims ran: {ran:?}", ran.len()).into());
    }
    eprintln!("ran {} example claims: {ran:?}", ran.len());
    Ok(())
}

/// A ResourceClaim named `name` with one request `gpu` of `class`, the CEL
/// `selectors`, and `extra` YAML lines appended to the request (indented
/// for it) and to the claim's devices.
pub fn claim_yaml(
    name: &str,
    class: &str,
    selectors: &[&str],
    request_extra: &str,
    devices_extra: &str,
) -> String {
    use std::fmt::Write as _;
    let mut sel = String::new();
    for e in selectors {
        let _ = writeln!(
            sel,
            "        - cel: {{expression: {}}}",
            serde_json::to_string(e).expect("a string")
        );
    }
    let selectors = if sel.is_empty() {
        String::new()
    } else {
        format!("        selectors:\n{sel}")
    };
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {class}
{selectors}{request_extra}{devices_extra}"
    )
}

/// A ResourceClaimTemplate `name` of one whole GPU (not one shared by memory).
pub fn whole_gpu_template(name: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {{expression: \"{NOT_SHARED}\"}}
"
    )
}

/// Runs one pod on claim `claim` (already applied); returns what it saw,
/// the claim's JSON and its UID.
pub fn pod_on_claim(c: &Cluster, ns: &str, claim: &str) -> Result<(Seen, Value, String), Failed> {
    let pod = format!("check-{claim}");
    let seen = run_check_pod(
        c,
        ns,
        &pod,
        &check_pod(&pod, &[("gpus", &format!("resourceClaimName: {claim}"))]),
    )?;
    check_against_spec(c, ns, claim, &seen)?;
    let json = get_json(c, ns, &["resourceclaim", claim])?;
    let uid = json["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((seen, json, uid))
}

pub const NOT_SHARED: &str = "!device.allowMultipleAllocations";

/// The MIG instances of each GPU in the fake NVML's saved hardware state
/// (`(GPU UUID, its GPU instances)`), without the counters that only grow.
fn mig_instances() -> Vec<(String, Value)> {
    let state: Value = serde_json::from_str(&node::nvml_state()).unwrap_or(Value::Null);
    state["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            (
                g["uuid"].as_str().unwrap_or_default().to_owned(),
                g["gpuInstances"].clone(),
            )
        })
        .collect()
}

/// `helm upgrade` of the installed release with `--reuse-values` and the
/// given value flags (`--set k=v`, `--set-string k=v`), waiting for its
/// resources (`--wait=legacy`, at most 5 minutes).
pub fn helm_upgrade(c: &Cluster, flags: &[&str]) -> Result<(), Failed> {
    let chart = c.repo.join("deployments/helm/gpu-dra-driver");
    let out = c
        .command("helm")
        .args(["upgrade", "gpu-dra-driver"])
        .arg(&chart)
        .args(["-n", DRIVER_NS, "--reuse-values"])
        .args(flags)
        .args(["--wait=legacy", "--timeout", "5m"])
        .output()
        .map_err(|e| format!("helm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "helm upgrade: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    Ok(())
}

/// Waits (at most 180 s) until the plugin DaemonSet's rollout is complete.
pub fn wait_plugin_rollout(c: &Cluster) -> Result<(), Failed> {
    c.kubectl(&[
        "rollout",
        "status",
        "-n",
        DRIVER_NS,
        PLUGIN_DAEMONSET,
        "--timeout=180s",
    ])?;
    Ok(())
}

/// Switches the installed chart's `kubeletPlugin.dynamicMig` (a rolling
/// update of the plugin) and waits until the node's pool shows the mode:
/// dynamic placements (MIG devices without a UUID) or none.
pub fn set_dynamic_mig(c: &Cluster, on: bool) -> Result<(), Failed> {
    helm_upgrade(c, &["--set", &format!("kubeletPlugin.dynamicMig={on}")])?;
    wait_plugin_rollout(c)?;
    let start = std::time::Instant::now();
    loop {
        let dynamic = slice_devices(c, &[])?.iter().any(|d| {
            d["attributes"]["type"]["string"].as_str() == Some("mig")
                && d["attributes"]["uuid"].is_null()
        });
        if dynamic == on {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("the pool did not switch to dynamicMig={on}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn static_and_dynamic_mig(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-mig";
    c.fresh_namespace(ns)?;
    // Static MIG (the cluster starts in that mode): a MIG device the
    // profile has already, published with its UUID.
    set_dynamic_mig(c, false)?;
    c.apply(
        ns,
        &claim_yaml(
            "static-mig",
            "1g.10gb.mig.nvidia.com",
            &["'uuid' in device.attributes['gpu.nvidia.com']"],
            "",
            "",
        ),
    )?;
    let (seen_s, json_s, uid_s) = pod_on_claim(c, ns, "static-mig")?;
    let static_before = mig_instances();
    delete_and_check_clean(c, ns, &["check-static-mig"], &[uid_s])?;
    if mig_instances() != static_before {
        return Err(format!(
            "unpreparing static MIG device {:?} changed the hardware state",
            allocated(&json_s)
        )
        .into());
    }

    // Dynamic MIG: a placement the plugin creates at prepare, destroys at unprepare.
    set_dynamic_mig(c, true)?;
    c.apply(
        ns,
        &claim_yaml(
            "dynamic-mig",
            "1g.10gb.mig.nvidia.com",
            &["!('uuid' in device.attributes['gpu.nvidia.com'])"],
            "",
            "",
        ),
    )?;
    let before = mig_instances();
    let (seen_d, json_d, uid_d) = pod_on_claim(c, ns, "dynamic-mig")?;
    for (name, seen) in [("static-mig", &seen_s), ("dynamic-mig", &seen_d)] {
        if seen.gpus().len() != 1 {
            return Err(format!(
                "{name}: want the parent GPU's node only, saw {:?}",
                seen.gpus()
            )
            .into());
        }
        if !seen
            .dev
            .iter()
            .any(|d| d.starts_with("/dev/nvidia-caps/nvidia-cap"))
        {
            return Err(format!("{name}: no MIG capability node: {:?}", seen.dev).into());
        }
    }
    let during = mig_instances();
    if during == before {
        return Err(format!(
            "the dynamic MIG device {:?} changed nothing in the NVML state",
            allocated(&json_d)
        )
        .into());
    }
    delete_and_check_clean(c, ns, &["check-dynamic-mig"], &[uid_d])?;
    let after = mig_instances();
    if after != before {
        return Err(format!(
            "the dynamic MIG device was not destroyed:\nbefore: {before:?}\nafter: {after:?}"
        )
        .into());
    }
    Ok(())
}

/// The plugin's log lines since the test started (all its containers).
fn plugin_log(c: &Cluster) -> Result<String, Failed> {
    Ok(c.kubectl(&[
        "logs",
        "-n",
        "gpu-dra-driver",
        "-l",
        "app.kubernetes.io/component=kubelet-plugin",
        "--tail=2000",
        "--since=10m",
    ])?)
}

/// The host path of the folder the CDI spec mounts at `container_path`.
fn host_path_of(spec: &Value, container_path: &str) -> Option<String> {
    let mut edits = vec![&spec["containerEdits"]];
    edits.extend(
        spec["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| &d["containerEdits"]),
    );
    edits
        .into_iter()
        .flat_map(|e| e["mounts"].as_array().into_iter().flatten())
        .find(|m| m["containerPath"].as_str() == Some(container_path))
        .and_then(|m| m["hostPath"].as_str())
        .map(str::to_owned)
}

fn time_slicing_and_mps(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-sharing";
    c.fresh_namespace(ns)?;
    let config = |strategy: &str, body: &str| {
        format!(
            "    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: {strategy}
{body}"
        )
    };
    c.apply(
        ns,
        &claim_yaml(
            "ts",
            "gpu.nvidia.com",
            &[NOT_SHARED],
            "",
            &config(
                "TimeSlicing",
                "            timeSlicingConfig: {interval: Long}\n",
            ),
        ),
    )?;
    c.apply(
        ns,
        &claim_yaml(
            "mps",
            "gpu.nvidia.com",
            &[NOT_SHARED],
            "",
            &config("MPS", "            mpsConfig: {defaultActiveThreadPercentage: 30, defaultPinnedDeviceMemoryLimit: 7Gi}\n"),
        ),
    )?;
    let (_, ts_json, ts_uid) = pod_on_claim(c, ns, "ts")?;
    let (mps_seen, _, mps_uid) = pod_on_claim(c, ns, "mps")?;
    // The time slice: the plugin ran the driver's nvidia-smi for the GPU.
    let log = plugin_log(c)?;
    let ts_gpu = allocated(&ts_json)
        .first()
        .map(|r| r.1.clone())
        .unwrap_or_default();
    if !log
        .lines()
        .any(|l| l.contains("time-slice set") && l.contains("interval=Long"))
    {
        return Err(format!("no time slice set for {ts_gpu} in the plugin's log").into());
    }
    // MPS: the client's pipe folder is the daemon's, and the daemon holds the limits.
    let pipe = mps_seen
        .env
        .iter()
        .find_map(|e| e.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .ok_or_else(|| {
            format!(
                "the MPS client has no CUDA_MPS_PIPE_DIRECTORY: {:?}",
                mps_seen.env
            )
        })?
        .to_owned();
    let spec = cdi_spec(&mps_uid)?;
    let host_pipe =
        host_path_of(&spec, &pipe).ok_or_else(|| format!("the CDI spec does not mount {pipe}"))?;
    let state = fake_driver_root::FakeDriverRoot::mps_state(Path::new(&host_pipe))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no MPS daemon state in {host_pipe}"))?;
    if state.active_thread_percentage.as_deref() != Some("30") {
        return Err(format!(
            "the daemon's thread percentage is {:?}, want 30",
            state.active_thread_percentage
        )
        .into());
    }
    if !state
        .pinned_mem_limits
        .values()
        .any(|v| v == "7G" || v == "7168M")
    {
        return Err(format!(
            "the daemon's pinned memory limits are {:?}, want 7Gi",
            state.pinned_mem_limits
        )
        .into());
    }
    let pid = state.daemon_pid.ok_or("the daemon wrote no pid")?;
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(format!("the MPS daemon (pid {pid}) does not run").into());
    }
    delete_and_check_clean(c, ns, &["check-ts", "check-mps"], &[ts_uid, mps_uid])?;
    // Unprepare stopped the daemon and put the GPU's time slice back.
    for _ in 0..40 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if Path::new(&format!("/proc/{pid}")).exists() {
        return Err(format!("the MPS daemon (pid {pid}) still runs after the unprepare").into());
    }
    let log = plugin_log(c)?;
    let restored = log
        .lines()
        .rev()
        .find(|l| l.contains("time-slice set"))
        .unwrap_or_default();
    if !restored.contains("interval=Default") {
        return Err(
            format!("the time slice was not restored after the unprepare: {restored}").into(),
        );
    }
    Ok(())
}

fn shared_and_template(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-shared";
    c.fresh_namespace(ns)?;
    c.apply(
        ns,
        &claim_yaml("shared", "gpu.nvidia.com", &[NOT_SHARED], "", ""),
    )?;
    let src = "resourceClaimName: shared";
    let a = run_check_pod(c, ns, "shared-a", &check_pod("shared-a", &[("gpus", src)]))?;
    let b = run_check_pod(c, ns, "shared-b", &check_pod("shared-b", &[("gpus", src)]))?;
    check_against_spec(c, ns, "shared", &a)?;
    if a.gpus() != b.gpus() || a.gpus().len() != 1 {
        return Err(format!(
            "two pods of one claim saw {:?} and {:?}",
            a.gpus(),
            b.gpus()
        )
        .into());
    }
    let reserved = c.kubectl(&[
        "get",
        "-n",
        ns,
        "resourceclaim",
        "shared",
        "-o",
        "jsonpath={.status.reservedFor[*].name}",
    ])?;
    if !(reserved.contains("shared-a") && reserved.contains("shared-b")) {
        return Err(format!("the claim is reserved for {reserved:?}, want both pods").into());
    }
    let uid = uid_of(c, ns, "shared")?;
    // One pod gone: the claim stays prepared for the other.
    c.kubectl(&["delete", "pod", "-n", ns, "shared-a", "--wait=true"])?;
    if !node::claim_cdi_specs()
        .iter()
        .any(|s| s.contains(uid.as_str()))
    {
        return Err("the CDI spec went with the first of two pods".into());
    }
    delete_and_check_clean(c, ns, &["shared-b"], std::slice::from_ref(&uid))?;

    let template = whole_gpu_template("per-pod");
    c.apply(ns, &template)?;
    let src = "resourceClaimTemplateName: per-pod";
    let a = run_check_pod(c, ns, "tpl-a", &check_pod("tpl-a", &[("gpus", src)]))?;
    let b = run_check_pod(c, ns, "tpl-b", &check_pod("tpl-b", &[("gpus", src)]))?;
    let (ca, cb) = (
        pod_claims(c, ns, "tpl-a")?.remove(0),
        pod_claims(c, ns, "tpl-b")?.remove(0),
    );
    if ca == cb || a.gpus() == b.gpus() {
        return Err(format!(
            "template pods share {ca}/{cb}: {:?} {:?}",
            a.gpus(),
            b.gpus()
        )
        .into());
    }
    check_against_spec(c, ns, &ca, &a)?;
    check_against_spec(c, ns, &cb, &b)?;
    let uids = vec![uid_of(c, ns, &ca)?, uid_of(c, ns, &cb)?];
    delete_and_check_clean(c, ns, &["tpl-a", "tpl-b"], &uids)?;
    // The claims made from the template go with their pods.
    c.wait_jsonpath(
        ns,
        "resourceclaims",
        "{.items[*].metadata.name}",
        "shared",
        Duration::from_secs(60),
    )?;
    Ok(())
}

/// The devices of the ResourceSlices listed by `kubectl get resourceslices`
/// with `args` (a field selector, say).
pub fn slice_devices(c: &Cluster, args: &[&str]) -> Result<Vec<Value>, Failed> {
    let mut all = vec!["get", "resourceslices"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let slices: Value =
        serde_json::from_str(&c.kubectl(&all)?).map_err(|e| format!("resourceslices: {e}"))?;
    Ok(slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect())
}

/// A string attribute of the node's device `name`, from its ResourceSlices.
pub fn device_attribute(c: &Cluster, name: &str, attribute: &str) -> Result<String, Failed> {
    slice_devices(c, &[])?
        .iter()
        .find(|d| d["name"].as_str() == Some(name))
        .and_then(|d| {
            let a = &d["attributes"];
            a[attribute]["string"]
                .as_str()
                .or(a[format!("gpu.nvidia.com/{attribute}")]["string"].as_str())
        })
        .map(str::to_owned)
        .ok_or_else(|| format!("device {name} has no string attribute {attribute}").into())
}

fn admin_access(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-admin";
    c.fresh_namespace(ns)?;
    // A GPU taken by one claim...
    c.apply(
        ns,
        &claim_yaml("taken", "gpu.nvidia.com", &[NOT_SHARED], "", ""),
    )?;
    let (taken_seen, taken_json, taken_uid) = pod_on_claim(c, ns, "taken")?;
    let device = allocated(&taken_json)
        .first()
        .map(|r| r.1.clone())
        .ok_or("nothing allocated")?;
    // ...is still given to a monitoring claim with admin access, by name.
    let uuid = device_attribute(c, &device, "uuid")?;
    let by_uuid = format!("device.attributes['gpu.nvidia.com'].uuid == '{uuid}'");
    c.apply(
        ns,
        &claim_yaml(
            "monitor",
            "gpu.nvidia.com",
            &[NOT_SHARED, &by_uuid],
            "        adminAccess: true\n",
            "",
        ),
    )?;
    let (mon_seen, mon_json, mon_uid) = pod_on_claim(c, ns, "monitor")?;
    let result = &mon_json["status"]["allocation"]["devices"]["results"][0];
    if result["adminAccess"].as_bool() != Some(true)
        || result["device"].as_str() != Some(device.as_str())
    {
        return Err(format!(
            "want {device} with adminAccess, the allocation is {}",
            mon_json["status"]["allocation"]
        )
        .into());
    }
    if mon_seen.gpus() != taken_seen.gpus() {
        return Err(format!(
            "admin access saw {:?}, the claim holding {device} sees {:?}",
            mon_seen.gpus(),
            taken_seen.gpus()
        )
        .into());
    }
    delete_and_check_clean(
        c,
        ns,
        &["check-monitor", "check-taken"],
        &[mon_uid, taken_uid],
    )?;
    Ok(())
}

fn prioritized_list(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-prioritized";
    c.fresh_namespace(ns)?;
    let claim = "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: fallback}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable:
      - name: huge
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Ti')) >= 0\"}
      - name: mig
        deviceClassName: mig.nvidia.com
";
    c.apply(ns, claim)?;
    let (seen, json, uid) = pod_on_claim(c, ns, "fallback")?;
    let results = allocated(&json);
    if results.len() != 1 || results[0].0 != "gpu/mig" {
        return Err(format!("want the second alternative (gpu/mig), got {results:?}").into());
    }
    if !seen.dev.iter().any(|d| d.starts_with("/dev/nvidia-caps/")) {
        return Err(format!(
            "the MIG alternative brought no capability node: {:?}",
            seen.dev
        )
        .into());
    }
    delete_and_check_clean(c, ns, &["check-fallback"], &[uid])?;
    Ok(())
}

/// Tests of this file's parsing that need no cluster.
pub const OFFLINE: [(&str, crate::Offline); 1] = [(
    "claims::a_check_log_is_parsed_and_an_incomplete_one_refused",
    check_log_parsing,
)];

fn check_log_parsing() -> Result<(), Failed> {
    let seen =
        parse_seen("==DEV\n/dev/nvidia0\n/dev/nvidiactl\n==ENV\nA=b\n==MOUNTS\n/proc\n==END\n")?;
    if seen.gpus() != vec!["/dev/nvidia0"]
        || !seen.env.contains("A=b")
        || !seen.mounts.contains("/proc")
    {
        return Err(format!("parsed {seen:?}").into());
    }
    if parse_seen("==DEV\n/dev/nvidia0\n").is_ok() {
        return Err("an incomplete log was accepted".into());
    }
    Ok(())
}
