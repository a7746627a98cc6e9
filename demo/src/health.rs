//! The GPU health part of the demo: with the example claims still in
//! place, a GPU falls off the bus (XID 79, then NVML loses it), written to
//! the fake NVML's control file as an operator would see it happen. The
//! plugin's health monitor taints every device on that GPU in the
//! published slices (shown as `gpu-dra health` shows them) and tells
//! kubelet the devices are Unhealthy; a claim pinned to that GPU can no
//! longer be placed. Then the GPU comes back (`restore`, recovery action
//! NONE): after the quiet period (`--health-quiet-period`, short in the
//! demo) the taints are gone, kubelet hears Healthy, and the same claim
//! is placed on it again.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use gpu_dra::taints::{self, SliceInput};
use gpu_dra_sim::apiserver::{Resource, TestApiServer};
use gpu_dra_sim::kubelet::{DeviceHealth, Plugin as KubeletPlugin};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::print::Printer;
use super::scheduler::{self, Placement};

/// What the health part needs of the running system.
pub struct Setup<'a> {
    /// The API server stand-in (its store is read for the slices).
    pub server: &'a TestApiServer,
    /// A client of it (the scheduler's reads).
    pub client: kube::Client,
    /// The simulated kubelet's connection to the plugin.
    pub kubelet: &'a KubeletPlugin,
    /// The fake NVML's control file.
    pub control: &'a Path,
    /// The node.
    pub node: &'a str,
    /// The driver.
    pub driver: &'a str,
    /// The GPU to fail: minor and UUID.
    pub gpu: (u32, String),
    /// The plugin's quiet period before a GPU counts as recovered.
    pub quiet: Duration,
    /// The plugin's health poll interval: the quiet period runs from the
    /// last poll that still saw the fault, up to one poll before the
    /// restore the demo times its recovery from.
    pub poll: Duration,
}

/// How long the taint, the recovery and kubelet's news may take.
const WAIT: Duration = Duration::from_secs(30);

/// The GPU the demo fails: the first GPU no claim of the walk holds (so no
/// prepared claim loses its device), else the first GPU.
pub fn pick_gpu(gpus: &[(u32, String)], allocated: &[String]) -> Option<(u32, String)> {
    gpus.iter()
        .find(|(minor, _)| !allocated.iter().any(|d| on_gpu(d, *minor)))
        .or_else(|| gpus.first())
        .cloned()
}

/// Whether `device` (`gpu-<minor>[-...]`) sits on GPU `minor`.
fn on_gpu(device: &str, minor: u32) -> bool {
    taints::name_minor(device) == Some(minor)
}

/// Appends command lines to the fake NVML's control file.
fn inject(control: &Path, lines: &[String]) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(control)
        .with_context(|| format!("open the control file {}", control.display()))?;
    for line in lines {
        writeln!(file, "{line}").context("write to the control file")?;
    }
    Ok(())
}

/// The taints of every device on GPU `minor` in the node's slices:
/// `(device, taints)` for devices that have any.
fn taints_on(slices: &[Value], driver: &str, node: &str, minor: u32) -> Vec<(String, Vec<Value>)> {
    devices_on(slices, driver, node, minor)
        .filter_map(|d| {
            let taints = d["taints"].as_array()?;
            (!taints.is_empty())
                .then(|| (d["name"].as_str().unwrap_or("").to_owned(), taints.clone()))
        })
        .collect()
}

/// NVIDIA's key for a lost GPU.
const GPU_LOST: &str = "gpu.nvidia.com/gpu-lost";
/// NVIDIA's key for a GPU whose events are not watched.
const UNMONITORED: &str = "gpu.nvidia.com/unmonitored";

/// The devices of GPU `minor` in the node's slices.
fn devices_on<'a>(
    slices: &'a [Value],
    driver: &'a str,
    node: &'a str,
    minor: u32,
) -> impl Iterator<Item = &'a Value> + 'a {
    slices
        .iter()
        .filter(move |s| s["spec"]["driver"] == driver && s["spec"]["nodeName"] == node)
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .filter(move |d| d["name"].as_str().is_some_and(|n| on_gpu(n, minor)))
}

/// Whether `device` has a taint with `key`.
fn tainted_with(device: &Value, key: &str) -> bool {
    device["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == key))
}

/// Whether every device on GPU `minor` has the `gpu-lost` taint (and
/// there are devices).
fn lost_everywhere(slices: &[Value], driver: &str, node: &str, minor: u32) -> bool {
    let mut devices = devices_on(slices, driver, node, minor).peekable();
    devices.peek().is_some() && devices.all(|d| tainted_with(d, GPU_LOST))
}

/// Whether some device on GPU `minor` has a taint with `key`.
fn has_key(slices: &[Value], driver: &str, node: &str, minor: u32, key: &str) -> bool {
    devices_on(slices, driver, node, minor).any(|d| tainted_with(d, key))
}

/// `text`, each line after `prefix`, each ending in a line break.
fn indent(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(prefix);
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The `gpu-dra health` view of GPU `minor` in `slices`.
fn view(slices: &[Value], node: &str, minor: u32) -> (String, Value) {
    let inputs: Vec<SliceInput<'_>> = slices
        .iter()
        .map(|value| SliceInput {
            value,
            place: Box::new(|path: &str| path.to_owned()),
        })
        .collect();
    let report = taints::build(&inputs, Some(node));
    let gpu = report
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .find(|g| g.minor == Some(minor));
    match gpu {
        Some(g) => (
            indent(&taints::render::gpu_text(g), "  "),
            serde_json::to_value(g).unwrap_or_default(),
        ),
        None => (String::new(), Value::Null),
    }
}

/// A claim for exactly the GPU with `uuid`.
fn pinned_claim(uuid: &str) -> anyhow::Result<ResourceClaim> {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "on-the-failed-gpu", "namespace": "default", "uid": "demo-health"},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression":
                    format!("device.attributes['gpu.nvidia.com'].uuid == '{uuid}'")}}],
            },
        }]}},
    }))
    .context("the pinned claim does not decode")
}

/// Where the scheduler puts the pinned claim now: `(placed, devices or
/// explanation lines)`.
async fn place_pinned(
    setup: &Setup<'_>,
    claim: &ResourceClaim,
) -> anyhow::Result<(bool, Vec<String>)> {
    let (slices, classes, allocated) =
        super::walk::cluster_state(&setup.client, "demo-health").await?;
    Ok(
        match scheduler::place(&slices, &classes, &allocated, claim, setup.node)? {
            Placement::Allocated { devices, .. } => (
                true,
                devices.results.iter().map(|r| r.device.clone()).collect(),
            ),
            Placement::Unsatisfiable(explanation) => {
                let mut lines = vec![explanation.summary.clone()];
                lines.extend(scheduler::funnels(&explanation));
                (false, lines)
            }
        },
    )
}

/// Follows the health stream: the latest complete device list.
async fn follow_health(
    kubelet: &KubeletPlugin,
) -> anyhow::Result<watch::Receiver<Vec<DeviceHealth>>> {
    let mut stream = kubelet
        .watch_health()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("open the health stream")?;
    let (tx, rx) = watch::channel(Vec::new());
    tokio::spawn(async move {
        while let Some(Ok(list)) = stream.next().await {
            if tx.send(list).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Waits until kubelet's latest list says `health` for `device`; its
/// message.
async fn wait_health(
    rx: &mut watch::Receiver<Vec<DeviceHealth>>,
    device: &str,
    health: &str,
) -> anyhow::Result<String> {
    let found = tokio::time::timeout(
        WAIT,
        rx.wait_for(|list| {
            list.iter()
                .any(|d| d.device_name == device && d.health == health)
        }),
    )
    .await
    .with_context(|| format!("kubelet did not hear {device} {health} within {WAIT:?}"))?
    .context("the health stream ended")?;
    Ok(found
        .iter()
        .find(|d| d.device_name == device)
        .map(|d| d.message.clone())
        .unwrap_or_default())
}

/// Runs the health part; its JSON report.
pub async fn run(out: &Printer, setup: &Setup<'_>) -> anyhow::Result<Value> {
    let (minor, uuid) = (setup.gpu.0, setup.gpu.1.clone());
    let device = format!("gpu-{minor}");
    let store = setup.server.store();
    let mut health = follow_health(setup.kubelet).await?;
    let claim = pinned_claim(&uuid)?;

    // The fault: XID 79 first, then NVML loses the GPU (in that order, so
    // the XID's event is read before waits start failing).
    let injected = vec![format!("xid {minor} 79"), format!("lose {minor}")];
    let step = out.step(
        &format!("GPU {minor} falls off the bus"),
        &format!(
            "`{}` into the fake NVML's control file",
            injected.join("`, then `")
        ),
    );
    let started = Instant::now();
    inject(setup.control, &injected[..1])?;
    store
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            lost_everywhere(items, setup.driver, setup.node, minor)
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!("GPU {minor}'s devices were not all tainted gpu-lost within {WAIT:?}")
        })?;
    let taint_ms = started.elapsed().as_secs_f64() * 1000.0;
    let unhealthy = wait_health(&mut health, &device, "Unhealthy").await?;
    let unhealthy_ms = started.elapsed().as_secs_f64() * 1000.0;
    inject(setup.control, &injected[1..])?;
    // Once lost, the GPU's event waits fail: it is also unmonitored.
    let slices = store
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            has_key(items, setup.driver, setup.node, minor, UNMONITORED)
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!("GPU {minor} lost was not marked unmonitored within {WAIT:?}")
        })?;
    step.done_with(&format!(
        "every device on it tainted after {taint_ms:.0} ms, Unhealthy to kubelet after {unhealthy_ms:.0} ms"
    ));
    let tainted = taints_on(&slices, setup.driver, setup.node, minor);
    let (text, gpu_view) = view(&slices, setup.node, minor);
    out.lines("  what `gpu-dra health` shows for it:", &text);
    out.lines(
        "  what kubelet hears on the health stream:",
        &format!("    {device}: Unhealthy: {unhealthy}\n"),
    );

    let step = out.step(
        "a claim for that GPU",
        &format!("selector uuid == {uuid}, placed by the allocator"),
    );
    let (placed_while_tainted, while_tainted) = place_pinned(setup, &claim).await?;
    if placed_while_tainted {
        bail!(
            "the allocator placed a claim on the tainted GPU {minor}: {}",
            while_tainted.join(", ")
        );
    }
    step.done_with("no allocation: the GPU is tainted");
    out.lines(
        "  the allocator's explanation:",
        &indent(&while_tainted.join("\n"), "    "),
    );

    // The recovery.
    let recovered_lines = vec![format!("restore {minor}"), format!("recovery {minor} none")];
    let step = out.step(
        &format!("GPU {minor} is back"),
        &format!(
            "`{}`; quiet period {} s",
            recovered_lines.join("`, `"),
            setup.quiet.as_secs_f64()
        ),
    );
    let started = Instant::now();
    inject(setup.control, &recovered_lines)?;
    let wait = WAIT + setup.quiet;
    let slices = store
        .wait_for(Resource::ResourceSlices, wait, |items| {
            taints_on(items, setup.driver, setup.node, minor).is_empty()
        })
        .await
        .map_err(|_| anyhow::anyhow!("GPU {minor} was still tainted after {wait:?}"))?;
    let untaint_ms = started.elapsed().as_secs_f64() * 1000.0;
    let healthy = wait_health(&mut health, &device, "Healthy").await?;
    step.done_with(&format!("taints removed after {untaint_ms:.0} ms"));
    let (text_after, gpu_after) = view(&slices, setup.node, minor);
    out.lines("  what `gpu-dra health` shows for it now:", &text_after);

    let (placed_after, after) = place_pinned(setup, &claim).await?;
    if !placed_after {
        bail!(
            "the claim for the recovered GPU {minor} is still not placed: {}",
            after.join("; ")
        );
    }
    out.lines(
        "  the same claim now:",
        &format!("    placed on {}\n", after.join(", ")),
    );

    Ok(json!({
        "gpu": {"minor": minor, "uuid": uuid, "device": device},
        "injected": injected,
        "taintMs": taint_ms,
        "unhealthyMs": unhealthy_ms,
        "taints": tainted.iter().map(|(d, t)| json!({"device": d, "taints": t})).collect::<Vec<_>>(),
        "view": gpu_view,
        "healthMessage": unhealthy,
        "whileTainted": {"placed": placed_while_tainted, "explanation": while_tainted},
        "recovery": recovered_lines,
        "quietPeriodS": setup.quiet.as_secs_f64(),
        "pollIntervalS": setup.poll.as_secs_f64(),
        "untaintMs": untaint_ms,
        "viewAfter": gpu_after,
        "healthAfter": healthy,
        "afterRecovery": {"placed": placed_after, "devices": after},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_gpu_is_one_no_claim_holds() {
        let gpus: Vec<(u32, String)> = (0..4).map(|m| (m, format!("GPU-{m}"))).collect();
        let allocated = vec!["gpu-0".to_owned(), "gpu-1-mig-1g10gb-19-0".to_owned()];
        assert_eq!(pick_gpu(&gpus, &allocated), Some((2, "GPU-2".to_owned())));
        let all: Vec<String> = (0..4).map(|m| format!("gpu-{m}")).collect();
        assert_eq!(pick_gpu(&gpus, &all), Some((0, "GPU-0".to_owned())));
        assert_eq!(pick_gpu(&[], &all), None);
    }

    #[test]
    fn devices_on_a_gpu_are_found_by_minor() {
        assert!(on_gpu("gpu-3", 3));
        assert!(on_gpu("gpu-3-mig-1g10gb-19-0", 3));
        assert!(!on_gpu("gpu-31", 3));
        assert!(!on_gpu("gpu-13-mig-1g10gb-19-0", 3));
        let slices = vec![json!({"spec": {"driver": "d", "nodeName": "n", "devices": [
            {"name": "gpu-3", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            {"name": "gpu-3-mig-x-1-0", "taints": []},
            {"name": "gpu-4", "taints": [{"key": "k", "effect": "NoSchedule"}]},
        ]}})];
        let found = taints_on(&slices, "d", "n", 3);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "gpu-3");
        assert!(taints_on(&slices, "d", "other", 3).is_empty());
        assert!(has_key(&slices, "d", "n", 3, "k"));
        assert!(
            !lost_everywhere(&slices, "d", "n", 3),
            "gpu-3-mig-x-1-0 is not"
        );
        let lost = vec![json!({"spec": {"driver": "d", "nodeName": "n", "devices": [
            {"name": "gpu-3", "taints": [{"key": GPU_LOST, "effect": "NoSchedule"}]},
            {"name": "gpu-3-mig-x-1-0", "taints": [{"key": GPU_LOST, "effect": "NoSchedule"}]},
        ]}})];
        assert!(lost_everywhere(&lost, "d", "n", 3));
        assert!(!lost_everywhere(&lost, "d", "n", 4), "no devices: not lost");
    }
}
