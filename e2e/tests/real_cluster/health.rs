//! GPU health on the real cluster (issue #43): faults written to the fake
//! NVML's control file in the plugin's pod (`MOCK_NVML_CONTROL`, a file in
//! the plugin's state directory on the node, set by `hack/cluster`) become
//! device taints that the real scheduler, kube-controller-manager and
//! kubelet act on:
//! - a GPU that needs a reset after an XID (`recovery reset`, `xid 48`) is
//!   tainted NoSchedule: a running pod on it stays, its
//!   `allocatedResourcesStatus` turns Unhealthy, and a new pod pinned to
//!   that GPU stays Pending;
//! - a GPU that falls off the bus (`xid 79`) with `--health-evict=gpu-lost`
//!   is tainted NoExecute, and Kubernetes evicts the pod using it;
//! - once both GPUs are back, the taints go after the quiet period and the
//!   pending pod runs on its GPU.
//!
//! The chart's health values are set for the test (poll 1 s, quiet period
//! 2 s, `evict: gpu-lost`) and put back after it, whatever happened.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;

use crate::claims::{
    claim_yaml, device_attribute, get_json, helm_upgrade, sleeping_pod, slice_devices,
    wait_plugin_rollout,
};
use crate::harness::{Cluster, DRIVER, NODE, PLUGIN_DIR};

pub const TESTS: [(&str, crate::Test); 1] = [(
    "health::faults_taint_refuse_evict_and_recover_on_the_real_scheduler",
    faults_on_the_real_cluster,
)];

/// The fake NVML's control file as the plugin's pod reads it (the same
/// path on the node: the plugin's state directory is a host path).
const CONTROL: &str = "mock-nvml-control";
/// The GPU that needs a reset, and the one that falls off the bus: whole
/// GPUs of the test profile (`dgx-a100`), not the memory-shared one.
const RESET_GPU: u32 = 4;
const LOST_GPU: u32 = 5;
/// How long Kubernetes may take for each step.
const LIMIT: Duration = Duration::from_secs(120);

/// The chart's health values: `(pollInterval, quietPeriod, evict)`.
fn set_health(c: &Cluster, poll: &str, quiet: &str, evict: &str) -> Result<(), Failed> {
    helm_upgrade(
        c,
        &[
            "--set",
            &format!("kubeletPlugin.health.pollInterval={poll}"),
            "--set",
            &format!("kubeletPlugin.health.quietPeriod={quiet}"),
            "--set-string",
            &format!("kubeletPlugin.health.evict={evict}"),
        ],
    )?;
    wait_plugin_rollout(c)
}

/// Appends command lines to the control file.
fn inject(lines: &[String]) -> Result<(), Failed> {
    let path = Path::new(PLUGIN_DIR).join(CONTROL);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for line in lines {
        writeln!(file, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!("health: injected {lines:?}");
    Ok(())
}

/// The taints of device `name` in the node's slices, as `key=value:effect`.
fn taints_of(c: &Cluster, name: &str) -> Result<Vec<String>, Failed> {
    let selector = format!("spec.driver={DRIVER},spec.nodeName={NODE}");
    Ok(slice_devices(c, &["--field-selector", &selector])?
        .iter()
        .filter(|d| d["name"].as_str() == Some(name))
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            format!(
                "{}={}:{}",
                t["key"].as_str().unwrap_or_default(),
                t["value"].as_str().unwrap_or_default(),
                t["effect"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

/// Waits until `check` holds for device `name`'s taints; the taints then.
fn wait_taints(
    c: &Cluster,
    name: &str,
    what: &str,
    check: impl Fn(&[String]) -> bool,
) -> Result<Vec<String>, Failed> {
    let start = Instant::now();
    loop {
        let taints = taints_of(c, name)?;
        if check(&taints) {
            eprintln!(
                "health: {name} {what} after {:.1} s: {taints:?}",
                start.elapsed().as_secs_f64()
            );
            return Ok(taints);
        }
        if start.elapsed() > LIMIT {
            return Err(format!("{name}: not {what} within {LIMIT:?}; taints {taints:?}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A claim for exactly the GPU with minor `minor` (by its UUID).
fn pinned_claim(c: &Cluster, name: &str, minor: u32) -> Result<String, Failed> {
    let uuid = device_attribute(c, &format!("gpu-{minor}"), "uuid")?;
    Ok(claim_yaml(
        name,
        "gpu.nvidia.com",
        &[&format!(
            "device.attributes['gpu.nvidia.com'].uuid == '{uuid}'"
        )],
        "",
        "",
    ))
}

/// The health kubelet reports for the pod's claims:
/// every `resources[].health`.
fn resource_health(c: &Cluster, ns: &str, pod: &str) -> Result<Vec<String>, Failed> {
    let p = get_json(c, ns, &["pod", pod])?;
    Ok(p["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| {
            s["allocatedResourcesStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|r| r["name"].as_str().is_some_and(|n| n.starts_with("claim:")))
        .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            format!(
                "{}:{}{}",
                r["resourceID"].as_str().unwrap_or_default(),
                r["health"].as_str().unwrap_or_default(),
                r["message"]
                    .as_str()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            )
        })
        .collect())
}

/// Waits until every resource of the pod reports `health`.
fn wait_resource_health(c: &Cluster, ns: &str, pod: &str, health: &str) -> Result<(), Failed> {
    let start = Instant::now();
    loop {
        let seen = resource_health(c, ns, pod)?;
        if !seen.is_empty()
            && seen.iter().all(|r| {
                r.split_once(':')
                    .is_some_and(|(_, h)| h.starts_with(health))
            })
        {
            eprintln!(
                "health: pod {pod} reports {seen:?} after {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if start.elapsed() > LIMIT {
            return Err(format!(
                "pod {pod}: allocatedResourcesStatus not {health} within {LIMIT:?}: {seen:?}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until pod `name` is gone or terminating (evicted).
fn wait_evicted(c: &Cluster, ns: &str, pod: &str) -> Result<(), Failed> {
    let start = Instant::now();
    loop {
        let out = c.kubectl(&[
            "get",
            "pod",
            "-n",
            ns,
            pod,
            "--ignore-not-found",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}|{.status.phase}|{.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
        ])?;
        let out = out.trim();
        if out.is_empty() || !out.starts_with('|') {
            eprintln!(
                "health: pod {pod} evicted after {:.1} s ({})",
                start.elapsed().as_secs_f64(),
                if out.is_empty() { "gone" } else { out }
            );
            return Ok(());
        }
        if start.elapsed() > LIMIT {
            return Err(format!("pod {pod} was not evicted within {LIMIT:?}: {out}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The pod stays Pending (unschedulable) for `how_long`.
fn stays_pending(c: &Cluster, ns: &str, pod: &str, how_long: Duration) -> Result<(), Failed> {
    let start = Instant::now();
    while start.elapsed() < how_long {
        let p = get_json(c, ns, &["pod", pod])?;
        if p["status"]["phase"] != "Pending" || !p["spec"]["nodeName"].is_null() {
            return Err(format!(
                "pod {pod} pinned to a tainted GPU was scheduled: {}",
                p["status"]
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let p = get_json(c, ns, &["pod", pod])?;
    eprintln!(
        "health: pod {pod} still Pending after {how_long:?}: {}",
        p["status"]["conditions"]
    );
    Ok(())
}

fn faults_on_the_real_cluster(c: &Cluster) -> Result<(), Failed> {
    // A control file of this test only (the plugin follows it from its start).
    let control = Path::new(PLUGIN_DIR).join(CONTROL);
    std::fs::write(&control, "").map_err(|e| format!("{}: {e}", control.display()))?;
    set_health(c, "1s", "2s", "gpu-lost")?;
    let outcome = faults(c);
    // Whatever happened: the GPUs back, then the chart's defaults.
    let back = inject(&[
        format!("restore {LOST_GPU}"),
        format!("recovery {RESET_GPU} none"),
    ]);
    let quiet = wait_taints(
        c,
        &format!("gpu-{RESET_GPU}"),
        "untainted",
        <[String]>::is_empty,
    )
    .and_then(|_| {
        wait_taints(
            c,
            &format!("gpu-{LOST_GPU}"),
            "untainted",
            <[String]>::is_empty,
        )
    });
    let reset = set_health(c, "10s", "60s", "");
    outcome?;
    back?;
    quiet?;
    reset
}

fn faults(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-health";
    c.fresh_namespace(ns)?;
    let (reset_dev, lost_dev) = (format!("gpu-{RESET_GPU}"), format!("gpu-{LOST_GPU}"));
    for dev in [&reset_dev, &lost_dev] {
        let taints = taints_of(c, dev)?;
        if !taints.is_empty() {
            return Err(format!("{dev} is tainted before the test: {taints:?}").into());
        }
    }

    // Two running pods, one on each GPU, Healthy to kubelet.
    c.apply(ns, &pinned_claim(c, "on-reset-gpu", RESET_GPU)?)?;
    c.apply(ns, &pinned_claim(c, "on-lost-gpu", LOST_GPU)?)?;
    c.apply(ns, &sleeping_pod("stays", "on-reset-gpu"))?;
    c.apply(ns, &sleeping_pod("evicted", "on-lost-gpu"))?;
    for pod in ["stays", "evicted"] {
        c.wait_pod_phase(ns, pod, "Running", LIMIT)?;
        wait_resource_health(c, ns, pod, "Healthy")?;
    }

    // An XID with the driver asking for a reset: NoSchedule taints; the
    // running pod stays and is told its device is Unhealthy.
    inject(&[
        format!("recovery {RESET_GPU} reset"),
        format!("xid {RESET_GPU} 48"),
    ])?;
    let taints = wait_taints(c, &reset_dev, "tainted", |t| {
        t.iter().any(|t| t == "gpu.nvidia.com/xid=48:NoSchedule")
            && t.iter()
                .any(|t| t == "gpu.nvidia.com/reset-required=GPU_RESET:NoSchedule")
    })?;
    if taints.iter().any(|t| t.ends_with(":NoExecute")) {
        return Err(
            format!("{reset_dev}: NoExecute without --health-evict for it: {taints:?}").into(),
        );
    }
    wait_resource_health(c, ns, "stays", "Unhealthy")?;

    // The real scheduler does not give the tainted GPU to a new pod.
    c.apply(ns, &pinned_claim(c, "again-on-reset-gpu", RESET_GPU)?)?;
    c.apply(ns, &sleeping_pod("waits", "again-on-reset-gpu"))?;
    stays_pending(c, ns, "waits", Duration::from_secs(15))?;

    // XID 79 with gpu-lost opted into NoExecute: Kubernetes evicts the pod.
    inject(&[format!("xid {LOST_GPU} 79")])?;
    wait_taints(c, &lost_dev, "tainted NoExecute", |t| {
        t.iter().any(|t| t == "gpu.nvidia.com/gpu-lost=:NoExecute")
    })?;
    wait_evicted(c, ns, "evicted")?;
    let phase = c.kubectl(&[
        "get",
        "pod",
        "-n",
        ns,
        "stays",
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    if phase.trim() != "Running" {
        return Err(format!("pod stays on the NoSchedule GPU is {phase}, not Running").into());
    }

    // Recovery: the reset GPU is back (recovery action NONE); after the
    // quiet period its taints go and the waiting pod runs on it.
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        ns,
        "stays",
        "--wait=true",
        "--timeout=120s",
    ])?;
    inject(&[format!("recovery {RESET_GPU} none")])?;
    wait_taints(c, &reset_dev, "untainted", <[String]>::is_empty)?;
    c.wait_pod_phase(ns, "waits", "Running", LIMIT)?;
    wait_resource_health(c, ns, "waits", "Healthy")?;
    Ok(())
}
