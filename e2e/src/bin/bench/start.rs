//! Plugin start: spawn to a complete pool in the API server, the phases of
//! the start from the plugin's own log, resident memory once it idles, and
//! the repair of a slice deleted behind its back.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use gpu_dra_sim::apiserver::{DeleteOptions, Resource, Store, TestApiServer, ValidationRules};
use serde_json::Value;

use crate::Ctx;
use crate::node::Machine;
use crate::table::{Goal, Row, Stat, ms};

/// The node the plugin runs as.
pub const NODE: &str = "bench-node";

/// What one start measured (milliseconds, MiB).
struct StartRun {
    /// Spawn to the complete pool in the API server's store.
    total_ms: f64,
    /// Spawn to each logged milestone, in order of [`MILESTONES`].
    milestones_ms: Vec<f64>,
    /// `VmRSS`, `VmHWM`, `RssAnon`, `RssFile` after the pool is published
    /// and the plugin idles.
    rss_mib: f64,
    hwm_mib: f64,
    anon_mib: f64,
    file_mib: f64,
    /// The test API server's own work for the pool: applying the same
    /// slices to a fresh store in-process (validation, server-side apply).
    store_ms: f64,
    /// From deleting one slice in the store to the complete pool again.
    repair_ms: f64,
    slices: usize,
    devices: usize,
    /// `/proc/<pid>/smaps` at the time of the status, when asked for.
    smaps: Option<String>,
}

/// Log messages of the plugin that mark startup phases.
const MILESTONES: [&str; 6] = [
    "Kubernetes client ready",
    "NVML loaded",
    "GPU inventory ready",
    "serving kubelet plugin sockets",
    "publishing ResourceSlices",
    "ResourceSlice pool in sync",
];

pub fn plugin_start(ctx: &Ctx, name: &str, runs: u32, flags: &[&str]) -> anyhow::Result<Vec<Row>> {
    let root = ctx.dir_for(name);
    let machine = Machine::create(&root, &ctx.volatile_for(&root))?;

    let mut measured = Vec::new();
    for i in 0..runs {
        let dir = root.join(format!("run{i}"));
        std::fs::create_dir_all(&dir)?;
        let run = ctx
            .runtime
            .block_on(start_once(ctx, &dir, &machine, flags))
            .with_context(|| format!("run {i}"))?;
        if let (Some(out), Some(smaps)) = (&ctx.smaps, &run.smaps) {
            let file = out.join(format!("{}-run{i}.smaps", name.replace([' ', ','], "_")));
            std::fs::write(&file, smaps).with_context(|| format!("writing {}", file.display()))?;
        }
        measured.push(run);
    }
    let col = |f: fn(&StartRun) -> f64| measured.iter().map(f).collect::<Vec<f64>>();
    let phase = |from: Option<usize>, to: usize| {
        measured
            .iter()
            .map(|r| r.milestones_ms[to] - from.map_or(0.0, |f| r.milestones_ms[f]))
            .collect::<Vec<f64>>()
    };
    let first = &measured[0];
    eprintln!(
        "bench: {name}: pool of {} slices, {} devices",
        first.slices, first.devices
    );
    Ok(vec![
        Row::new(
            name,
            "spawn to complete pool in the API server",
            "ms",
            col(|r| r.total_ms),
        )
        .goal(Goal::below(Stat::P95, 100.0)),
        Row::new(name, "  spawn to kube client ready", "ms", phase(None, 0)),
        Row::new(
            name,
            "  kube client ready to NVML loaded",
            "ms",
            phase(Some(0), 1),
        ),
        Row::new(
            name,
            "  NVML loaded to GPU inventory",
            "ms",
            phase(Some(1), 2),
        ),
        Row::new(
            name,
            "  inventory to sockets serving",
            "ms",
            phase(Some(2), 3),
        ),
        Row::new(
            name,
            "  sockets to first write (rules, Node, build, list)",
            "ms",
            phase(Some(3), 4),
        ),
        Row::new(
            name,
            "  writes until pool in sync (plugin's view)",
            "ms",
            phase(Some(4), 5),
        ),
        Row::new(
            name,
            "    API server's share: the same applies in-process",
            "ms",
            col(|r| r.store_ms),
        ),
        Row::new(name, "VmRSS after publishing", "MiB", col(|r| r.rss_mib))
            .goal(Goal::below(Stat::Max, 16.0)),
        Row::new(name, "  RssAnon (heap, stacks)", "MiB", col(|r| r.anon_mib)),
        Row::new(
            name,
            "  RssFile (binary, libraries)",
            "MiB",
            col(|r| r.file_mib),
        ),
        Row::new(name, "VmHWM (peak resident)", "MiB", col(|r| r.hwm_mib)),
        Row::new(
            name,
            "repair: one slice deleted to complete pool again",
            "ms",
            col(|r| r.repair_ms),
        )
        .goal(Goal::below(Stat::P95, 2000.0)),
    ])
}

/// One plugin start against a fresh API server.
async fn start_once(
    ctx: &Ctx,
    dir: &Path,
    machine: &Machine,
    flags: &[&str],
) -> anyhow::Result<StartRun> {
    let (server, kubeconfig) = crate::node::api_server_with_node(dir).await?;
    let log = dir.join("plugin.log");

    let mut cmd = crate::node::plugin_command(ctx, dir, machine, &kubeconfig, flags, &log)?;

    let wall0 = SystemTime::now();
    let t0 = Instant::now();
    let mut child = crate::children::spawn_plugin(&mut cmd).context("spawning the plugin")?;
    let waited = server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(30), |items| {
            complete_pool(items).is_some()
        })
        .await;
    let total_ms = ms(t0.elapsed());
    let Ok(items) = waited else {
        let _ = child.kill();
        bail!(
            "no complete pool within 30 s; plugin log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let (slices, devices) = complete_pool(&items).unwrap_or_default();

    // Let the plugin settle (the publisher reports in sync after its last
    // write), then read its memory.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
        .context("reading the plugin's /proc status")?;
    let smaps = match &ctx.smaps {
        Some(_) => Some(
            std::fs::read_to_string(format!("/proc/{}/smaps", child.id()))
                .context("reading the plugin's /proc smaps")?,
        ),
        None => None,
    };
    let repair_ms = repair(&server, &items).await?;
    fake_driver_root::terminate(child.id());
    let exit = child.wait()?;
    let text = std::fs::read_to_string(&log)?;
    if !exit.success() {
        bail!("the plugin exited with {exit}:\n{text}");
    }
    Ok(StartRun {
        total_ms,
        milestones_ms: milestones(&text, wall0)?,
        rss_mib: proc_kib(&status, "VmRSS")? / 1024.0,
        hwm_mib: proc_kib(&status, "VmHWM")? / 1024.0,
        anon_mib: proc_kib(&status, "RssAnon")? / 1024.0,
        file_mib: proc_kib(&status, "RssFile")? / 1024.0,
        store_ms: store_work(&items)?,
        repair_ms,
        slices,
        devices,
        smaps,
    })
}

/// Deletes the first slice of the pool behind the plugin's back and returns
/// the milliseconds until the pool is complete again.
async fn repair(server: &TestApiServer, pool: &[Value]) -> anyhow::Result<f64> {
    let name = pool
        .iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .find_map(|s| s["metadata"]["name"].as_str())
        .context("no slice to delete")?;
    let start = Instant::now();
    server
        .store()
        .delete(
            Resource::ResourceSlices,
            None,
            name,
            &DeleteOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("deleting {name}: {e:?}"))?;
    server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(30), |items| {
            complete_pool(items).is_some()
        })
        .await
        .map_err(|_| anyhow::anyhow!("{name} was not repaired within 30 s"))?;
    Ok(ms(start.elapsed()))
}

/// Milliseconds a fresh store takes to apply `slices` (as the plugin sent
/// them: without the server-set fields), in-process, no HTTP.
fn store_work(slices: &[Value]) -> anyhow::Result<f64> {
    let store = Store::new(ValidationRules::V1_35, 1024, 1024);
    let bodies: Vec<Value> = slices
        .iter()
        .map(|s| {
            let mut body = s.clone();
            if let Some(meta) = body["metadata"].as_object_mut() {
                for key in [
                    "uid",
                    "resourceVersion",
                    "creationTimestamp",
                    "managedFields",
                    "generation",
                ] {
                    meta.remove(key);
                }
            }
            body
        })
        .collect();
    let start = Instant::now();
    for body in &bodies {
        store
            .apply(Resource::ResourceSlices, body, "gpu-kubelet-plugin", true)
            .map_err(|e| anyhow::anyhow!("applying a slice in-process: {e:?}"))?;
    }
    Ok(ms(start.elapsed()))
}

/// `(slices, devices)` when the stored ResourceSlices of [`NODE`] form a
/// complete pool: all at the highest generation, as many as their
/// `resourceSliceCount`.
pub fn complete_pool(items: &[Value]) -> Option<(usize, usize)> {
    gpu_dra_sim::pool::complete(items.iter().filter(|s| s["spec"]["nodeName"] == NODE))
        .filter(|p| p.stale == 0)
        .map(|p| (p.slices, p.devices))
}

/// Milliseconds from `wall0` to each of [`MILESTONES`] in a JSON log.
fn milestones(log: &str, wall0: SystemTime) -> anyhow::Result<Vec<f64>> {
    let start = wall_of_day(wall0)?;
    let log = crate::node::JsonLog::parse(log);
    MILESTONES
        .iter()
        .map(|m| Ok(span_ms(start, log.at(m)?)))
        .collect()
}

/// Seconds since midnight (UTC) of an RFC 3339 timestamp
/// (`2026-11-21T19:06:45.538841Z`).
pub fn time_of_day(ts: &str) -> Option<f64> {
    let time = ts.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.splitn(3, ':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Seconds since midnight (UTC) of `t`, as [`time_of_day`] reads a log
/// line's.
pub fn wall_of_day(t: SystemTime) -> anyhow::Result<f64> {
    let since = t.duration_since(UNIX_EPOCH)?;
    Ok((since.as_secs() % 86_400) as f64 + f64::from(since.subsec_nanos()) / 1e9)
}

/// Milliseconds from `from` to `to`, both seconds since midnight; a span
/// that crosses midnight counts from one day into the next.
pub fn span_ms(from: f64, to: f64) -> f64 {
    let mut span = to - from;
    if span < -43_200.0 {
        span += 86_400.0;
    }
    span * 1000.0
}

/// A `kB` field of `/proc/<pid>/status`.
pub fn proc_kib(status: &str, field: &str) -> anyhow::Result<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("{field} not in /proc status"))
}

#[cfg(test)]
mod tests {
    // The values compared are exact (small integers, parsed decimals).
    #![allow(clippy::float_cmp)]

    use serde_json::json;

    use super::*;

    #[test]
    fn timestamps_and_proc_fields_parse() {
        assert_eq!(time_of_day("2026-11-21T01:02:03.5Z"), Some(3723.5));
        assert_eq!(time_of_day("garbage"), None);
        assert_eq!(span_ms(10.0, 10.5), 500.0);
        assert_eq!(span_ms(86_399.5, 0.25), 750.0);
        assert_eq!(span_ms(10.5, 10.0), -500.0);
        let noon = UNIX_EPOCH + Duration::from_secs(19_000 * 86_400 + 43_200);
        assert_eq!(wall_of_day(noon).unwrap(), 43_200.0);
        let status = "Name:\tx\nVmHWM:\t   12345 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(proc_kib(status, "VmRSS").unwrap(), 2048.0);
        assert_eq!(proc_kib(status, "VmHWM").unwrap(), 12345.0);
        assert!(proc_kib(status, "VmSwap").is_err());
    }

    #[test]
    fn a_pool_is_complete_only_at_one_generation_with_all_slices() {
        let slice = |generation: i64, count: u64| json!({"spec": {"nodeName": NODE, "pool": {"generation": generation, "resourceSliceCount": count}, "devices": [{"name": "a"}]}});
        assert_eq!(complete_pool(&[slice(0, 2), slice(0, 2)]), Some((2, 2)));
        assert_eq!(complete_pool(&[slice(0, 2)]), None);
        assert_eq!(complete_pool(&[slice(0, 2), slice(1, 2)]), None);
        assert_eq!(complete_pool(&[]), None);
    }
}
