//! The GPU health monitor (issue #43), measured on the shipped plugin on a
//! fake 8-GPU machine (`dgx-h100`):
//!
//! - **Event faults**: from the write of `xid <minor> 79` into the fake
//!   NVML's control FIFO to the `gpu.nvidia.com/gpu-lost` taint on that
//!   GPU's device in the API server stand-in's store, and to the first
//!   health-stream message where the simulated kubelet sees the device
//!   Unhealthy. Goal: p95 under 1 s. A FIFO, not a file: the fake reads a
//!   FIFO at once (a regular control file is checked every 50 ms, which
//!   would add up to 50 ms that no real GPU has).
//! - **Polled faults**: from `slowdown <minor> thermal` (seen only by the
//!   poll) to the `gpu.nvidia.com/degraded=thermal` taint, at the default
//!   `--health-poll-interval` ([`POLL`], 10 s). Goal: p95 under one poll
//!   period. Each fault is written after a wait that spreads the writes
//!   evenly over the poll's phase (sample `k` waits `((5k) mod n)/n` of a
//!   period after the previous taint): written right after a taint, every
//!   fault would land just after a poll and wait a whole period.
//! - **Idle**: the plugin idle for [`IDLE`] after it serves, with the
//!   monitor on (its default 10 s poll) and with `--health=off`: CPU time
//!   (`/proc/<pid>/stat`) as a share of one core, and VmRSS at the end.
//!   Goals: the monitor's share (on minus off) under 0.1 % of a core, its
//!   resident memory (on minus off) at most 1 MiB.
//!
//! Every GPU takes one fault per plugin run (a fault stays until its
//! quiet period or TTL), so the latency samples come from [`RUNS`] runs of
//! 8 GPUs each.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use gpu_dra_sim::apiserver::Resource;
use serde_json::Value;

use crate::Ctx;
use crate::cpu::Reading;
use crate::node::{DRIVER, Node};
use crate::start::NODE;
use crate::table::{Goal, Row, Stat, Values, ms};

/// Plugin runs of the latency benchmarks (8 GPUs, so 8 samples each).
const RUNS: usize = 3;
/// GPUs of the machine.
const GPUS: u32 = 8;
/// The poll interval of the polled-fault benchmark: the plugin's default.
const POLL: Duration = Duration::from_secs(10);
/// How long each idle window lasts.
const IDLE: Duration = Duration::from_secs(60);
/// How long after serving the idle window starts (the first poll, the
/// pool published, the first heartbeat: the start is not idle).
const SETTLE: Duration = Duration::from_secs(5);
/// How long one fault may take to show.
const WAIT: Duration = Duration::from_secs(30);

/// A control FIFO in `dir`.
fn fifo(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("nvml-control");
    let status = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .context("running mkfifo")?;
    anyhow::ensure!(status.success(), "mkfifo {} failed", path.display());
    Ok(path)
}

/// Writes one command into the control FIFO (blocks until the fake's
/// reader has it open).
fn inject(control: &Path, line: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(control)
        .with_context(|| format!("opening {}", control.display()))?;
    writeln!(f, "{line}").context("writing a control command")?;
    Ok(())
}

/// Whether the node's device `device` has a taint `key` (with `value`
/// when given) in `slices`.
fn has_taint(slices: &[Value], device: &str, key: &str, value: Option<&str>) -> bool {
    slices
        .iter()
        .filter(|s| s["spec"]["driver"] == DRIVER && s["spec"]["nodeName"] == NODE)
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .filter(|d| d["name"] == device)
        .flat_map(|d| d["taints"].as_array().into_iter().flatten())
        .any(|t| t["key"] == key && value.is_none_or(|v| t["value"] == v))
}

/// When the kubelet simulator first heard each device Unhealthy.
type Heard = Arc<Mutex<HashMap<String, Instant>>>;

/// Follows the plugin's health stream into a [`Heard`] map.
async fn follow_health(node: &Node) -> anyhow::Result<Heard> {
    let mut stream = node
        .kubelet()
        .watch_health()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("opening the health stream")?;
    let heard: Heard = Arc::default();
    let map = Arc::clone(&heard);
    tokio::spawn(async move {
        while let Some(Ok(list)) = stream.next().await {
            let now = Instant::now();
            let mut map = map
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for d in list {
                if d.health == "Unhealthy" {
                    map.entry(d.device_name).or_insert(now);
                }
            }
        }
    });
    Ok(heard)
}

/// Waits until `device` was heard Unhealthy; when.
async fn heard_unhealthy(heard: &Heard, device: &str) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(at) = heard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(device)
        {
            return Ok(*at);
        }
        if Instant::now() > deadline {
            bail!("kubelet did not hear {device} Unhealthy within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Injects `line` and waits for taint `key`(=`value`) on `device`; the
/// time from the write to the store holding it.
async fn fault_to_taint(
    node: &Node,
    control: &Path,
    line: &str,
    device: &str,
    key: &str,
    value: Option<&str>,
) -> anyhow::Result<Instant> {
    let store = node.server().store();
    inject(control, line)?;
    store
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            has_taint(items, device, key, value)
        })
        .await
        .map_err(|_| anyhow::anyhow!("no {key} taint on {device} within {WAIT:?} of `{line}`"))?;
    Ok(Instant::now())
}

/// Event faults: XID 79 on each GPU in turn.
pub fn events(ctx: &Ctx, name: &str) -> anyhow::Result<Vec<Row>> {
    let (mut taint, mut unhealthy) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let dir = ctx.dir_for(name);
        let control = fifo(&ctx.volatile_for(&dir))?;
        ctx.runtime.block_on(async {
            let node = Node::start_with(ctx, &dir, &[], Some(control.clone())).await?;
            let heard = follow_health(&node).await?;
            for minor in 0..GPUS {
                let device = format!("gpu-{minor}");
                let started = Instant::now();
                let tainted = fault_to_taint(
                    &node,
                    &control,
                    &format!("xid {minor} 79"),
                    &device,
                    "gpu.nvidia.com/gpu-lost",
                    None,
                )
                .await
                .with_context(|| node.log_text())?;
                let heard_at = heard_unhealthy(&heard, &device).await?;
                taint.push(ms(tainted - started));
                unhealthy.push(ms(heard_at.saturating_duration_since(started)));
            }
            node.stop()
        })?;
    }
    Ok(vec![
        Row::new(
            name,
            "XID 79 to gpu-lost taint in the API server",
            "ms",
            taint,
        )
        .goal(Goal::below(Stat::P95, 1000.0)),
        Row::new(
            name,
            "XID 79 to Unhealthy on the health stream",
            "ms",
            unhealthy,
        )
        .goal(Goal::below(Stat::P95, 1000.0)),
    ])
}

/// Polled faults: a thermal slowdown on each GPU in turn.
pub fn polled(ctx: &Ctx, name: &str) -> anyhow::Result<Vec<Row>> {
    let mut taint = Vec::new();
    let poll = format!("--health-poll-interval={}ms", POLL.as_millis());
    let samples = RUNS * GPUS as usize;
    let mut k = 0;
    for _ in 0..RUNS {
        let dir = ctx.dir_for(name);
        let control = fifo(&ctx.volatile_for(&dir))?;
        ctx.runtime.block_on(async {
            let node = Node::start_with(ctx, &dir, &[&poll], Some(control.clone())).await?;
            for minor in 0..GPUS {
                let device = format!("gpu-{minor}");
                tokio::time::sleep(phase(k, samples)).await;
                k += 1;
                let started = Instant::now();
                let tainted = fault_to_taint(
                    &node,
                    &control,
                    &format!("slowdown {minor} thermal"),
                    &device,
                    "gpu.nvidia.com/degraded",
                    Some("thermal"),
                )
                .await
                .with_context(|| node.log_text())?;
                taint.push(ms(tainted - started));
            }
            node.stop()
        })?;
    }
    let period = ms(POLL);
    Ok(vec![
        Row::new(
            name,
            &format!("thermal slowdown to degraded taint (poll every {period:.0} ms)"),
            "ms",
            taint,
        )
        .goal(Goal::below(Stat::P95, period)),
    ])
}

/// The wait before polled fault `k` of `n`: `((5k) mod n)/n` of a poll
/// period (5 and `n` = 24 share no factor, so every phase comes once).
fn phase(k: usize, n: usize) -> Duration {
    let step = u32::try_from((5 * k) % n).unwrap_or(0);
    let n = u32::try_from(n).unwrap_or(1).max(1);
    POLL * step / n
}

/// One idle window: `(CPU as % of one core, VmRSS MiB)`.
fn idle_window(ctx: &Ctx, name: &str, flags: &[&str]) -> anyhow::Result<(f64, f64)> {
    let dir = ctx.dir_for(name);
    ctx.runtime.block_on(async {
        let node = Node::start(ctx, &dir, flags).await?;
        tokio::time::sleep(SETTLE).await;
        let before = Reading::take(node.pid())?;
        let started = Instant::now();
        tokio::time::sleep(IDLE).await;
        let after = Reading::take(node.pid())?;
        let window = ms(started.elapsed());
        let rss = node.memory_mib("VmRSS")?;
        node.stop()?;
        Ok((100.0 * (after.plugin - before.plugin) / window, rss))
    })
}

/// The plugin idle with the monitor on and off.
pub fn idle(ctx: &Ctx, name: &str) -> anyhow::Result<Vec<Row>> {
    let (cpu_on, rss_on) = idle_window(ctx, name, &[])?;
    let (cpu_off, rss_off) = idle_window(ctx, name, &["--health=off"])?;
    let secs = IDLE.as_secs();
    Ok(vec![
        Row::with(
            name,
            &format!("idle CPU over {secs} s, monitor on"),
            "% core",
            Values::One(cpu_on),
        ),
        Row::with(
            name,
            &format!("idle CPU over {secs} s, --health=off"),
            "% core",
            Values::One(cpu_off),
        ),
        Row::with(
            name,
            "  the monitor's share (on - off)",
            "% core",
            Values::One(cpu_on - cpu_off),
        )
        .goal(Goal::below(Stat::P50, 0.1)),
        Row::with(name, "VmRSS idle, monitor on", "MiB", Values::One(rss_on)),
        Row::with(
            name,
            "VmRSS idle, --health=off",
            "MiB",
            Values::One(rss_off),
        ),
        Row::with(
            name,
            "  the monitor's resident memory (on - off)",
            "MiB",
            Values::One(rss_on - rss_off),
        )
        .goal(Goal::below(Stat::P50, 1.0001)),
    ])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn polled_faults_cover_every_phase_once() {
        let n = RUNS * GPUS as usize;
        let mut waits: Vec<Duration> = (0..n).map(|k| phase(k, n)).collect();
        waits.sort();
        waits.dedup();
        assert_eq!(waits.len(), n);
        assert_eq!(waits[0], Duration::ZERO);
        assert!(*waits.last().unwrap() < POLL);
    }

    #[test]
    fn taints_are_found_on_the_nodes_device_only() {
        let slices = vec![
            json!({"spec": {"driver": DRIVER, "nodeName": NODE, "devices": [
                {"name": "gpu-1", "taints": [{"key": "gpu.nvidia.com/degraded", "value": "thermal", "effect": "None"}]},
                {"name": "gpu-2"},
            ]}}),
            json!({"spec": {"driver": DRIVER, "nodeName": "other", "devices": [
                {"name": "gpu-2", "taints": [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}]},
            ]}}),
        ];
        assert!(has_taint(
            &slices,
            "gpu-1",
            "gpu.nvidia.com/degraded",
            Some("thermal")
        ));
        assert!(has_taint(&slices, "gpu-1", "gpu.nvidia.com/degraded", None));
        assert!(!has_taint(
            &slices,
            "gpu-1",
            "gpu.nvidia.com/degraded",
            Some("pcie")
        ));
        assert!(!has_taint(
            &slices,
            "gpu-2",
            "gpu.nvidia.com/gpu-lost",
            None
        ));
        assert!(!has_taint(
            &slices,
            "gpu-3",
            "gpu.nvidia.com/gpu-lost",
            None
        ));
    }
}
