//! `bench`: the project's benchmarks (measurements, not timed tests). Each
//! benchmark runs the real release binaries against the in-process test API
//! server and the fake NVML, and every result lands in one table (Markdown,
//! on stdout) with the goal it is judged against.
//!
//! ```text
//! cargo build --release -p gpu-kubelet-plugin -p gpu-dra-e2e -p mock-nvml
//! target/release/bench [--runs N] [--only SUBSTRING] [--env KEY=VALUE] [--smaps DIR]
//! ```
//!
//! The plugin binary is looked up next to this one (`target/release/`), the
//! fake `libnvidia_ml.so` there too (`cargo build --release -p mock-nvml`).
//! Add a benchmark by appending to [`BENCHMARKS`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Parser as _;
use gpu_dra_e2e::apiserver::{
    DeleteOptions, Resource, ServerOptions, Store, TestApiServer, ValidationRules, WriteOptions,
};
use serde_json::{Value, json};

#[derive(Debug, clap::Parser)]
#[command(name = "bench", about = "Benchmarks of the GPU DRA driver's programs")]
struct Args {
    /// Runs per benchmark.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Run only the benchmarks whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Extra environment of the measured programs (`KEY=VALUE`, repeatable),
    /// for experiments such as `MALLOC_ARENA_MAX=1`.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    envs: Vec<(String, String)>,
    /// Copy each measured plugin's `/proc/<pid>/smaps` (read with its
    /// status) into this directory, to see where its resident memory is.
    #[arg(long, value_name = "DIR")]
    smaps: Option<PathBuf>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// A named benchmark: runs `runs` times and returns its rows.
struct Benchmark {
    name: &'static str,
    run: fn(&Ctx, &'static str, u32) -> anyhow::Result<Vec<Row>>,
}

/// Every benchmark, in table order.
const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        name: "plugin start, dgx-h100",
        run: |ctx, name, runs| plugin_start(ctx, name, runs, &[]),
    },
    Benchmark {
        name: "plugin start, dgx-h100, dynamic MIG",
        run: |ctx, name, runs| plugin_start(ctx, name, runs, &["--dynamic-mig"]),
    },
];

/// What benchmarks share: the runtime, the binaries, a scratch directory.
struct Ctx {
    runtime: tokio::runtime::Runtime,
    plugin_bin: PathBuf,
    scratch: PathBuf,
    envs: Vec<(String, String)>,
    smaps: Option<PathBuf>,
}

/// How a row's samples are judged.
#[derive(Clone, Copy)]
enum Goal {
    /// The 95th percentile is below this.
    P95Below(f64),
    /// The maximum is below this.
    MaxBelow(f64),
}

/// One line of the table.
struct Row {
    benchmark: String,
    metric: String,
    unit: &'static str,
    samples: Vec<f64>,
    goal: Option<Goal>,
}

impl Row {
    fn new(benchmark: &str, metric: &str, unit: &'static str, samples: Vec<f64>) -> Self {
        Self {
            benchmark: benchmark.to_owned(),
            metric: metric.to_owned(),
            unit,
            samples,
            goal: None,
        }
    }

    fn goal(mut self, goal: Goal) -> Self {
        self.goal = Some(goal);
        self
    }
}

/// The `p`-th percentile (nearest rank) of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| benchmark | metric | n | p50 | p95 | max | goal | met |\n|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let mut s = row.samples.clone();
        s.sort_by(f64::total_cmp);
        let (p50, p95, max) = (percentile(&s, 50.0), percentile(&s, 95.0), s[s.len() - 1]);
        let (goal, met) = match row.goal {
            Some(Goal::P95Below(g)) => (format!("p95 < {g} {}", row.unit), yes_no(p95 < g)),
            Some(Goal::MaxBelow(g)) => (format!("max < {g} {}", row.unit), yes_no(max < g)),
            None => (String::new(), ""),
        };
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
            row.benchmark,
            row.metric,
            row.unit,
            s.len(),
            p50,
            p95,
            max,
            goal,
            met
        );
    }
    out
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let dir = exe.parent().context("the bench binary has no directory")?;
    let plugin_bin = dir.join("gpu-kubelet-plugin");
    if !plugin_bin.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p gpu-kubelet-plugin`",
            plugin_bin.display()
        );
    }
    let scratch = Scratch::create()?;
    let ctx = Ctx {
        runtime: tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?,
        plugin_bin,
        scratch: scratch.0.clone(),
        envs: args.envs.clone(),
        smaps: args.smaps.clone(),
    };
    if let Some(dir) = &ctx.smaps {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    eprintln!(
        "bench: plugin {}, {} runs per benchmark, extra environment {:?}",
        ctx.plugin_bin.display(),
        args.runs,
        ctx.envs
    );
    let mut rows = Vec::new();
    for b in BENCHMARKS {
        if args.only.as_deref().is_some_and(|o| !b.name.contains(o)) {
            continue;
        }
        eprintln!("bench: {}", b.name);
        rows.extend((b.run)(&ctx, b.name, args.runs).with_context(|| b.name)?);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// A scratch directory under /tmp (short, for socket paths), removed on
/// drop.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("/tmp/bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// Plugin start: spawn to complete pool, phases, resident memory.

/// The node the plugin runs as.
const NODE: &str = "bench-node";

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
    "NVML loaded",
    "Kubernetes client ready",
    "GPU inventory ready",
    "serving kubelet plugin sockets",
    "publishing ResourceSlices",
    "ResourceSlice pool in sync",
];

fn plugin_start(ctx: &Ctx, name: &str, runs: u32, flags: &[&str]) -> anyhow::Result<Vec<Row>> {
    let machine = ctx.scratch.join(name.replace([' ', ','], "_"));
    let profile = nvidia_ml::fixture::bundled_profile("dgx-h100");
    let library = nvidia_ml::fixture::install(&machine.join("nvml"), &profile, None)
        .context("installing the fake NVML (build it with `cargo build --release -p mock-nvml`)")?;
    let sysfs = machine.join("sys");
    nvidia_ml::Profile::load(&profile)?.write_sysfs(&sysfs)?;

    let mut measured = Vec::new();
    for i in 0..runs {
        let dir = machine.join(format!("run{i}"));
        std::fs::create_dir_all(&dir)?;
        let run = ctx
            .runtime
            .block_on(start_once(ctx, &dir, &library, &sysfs, flags))
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
        .goal(Goal::P95Below(100.0)),
        Row::new(name, "  spawn to NVML loaded", "ms", phase(None, 0)),
        Row::new(
            name,
            "  NVML loaded to kube client ready",
            "ms",
            phase(Some(0), 1),
        ),
        Row::new(
            name,
            "  kube client to GPU inventory",
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
            .goal(Goal::MaxBelow(16.0)),
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
        .goal(Goal::P95Below(2000.0)),
    ])
}

/// One plugin start against a fresh API server.
async fn start_once(
    ctx: &Ctx,
    dir: &Path,
    library: &Path,
    sysfs: &Path,
    flags: &[&str],
) -> anyhow::Result<StartRun> {
    let server = TestApiServer::start(ServerOptions {
        rules: ValidationRules::V1_35,
        ..ServerOptions::default()
    })
    .await?;
    server
        .store()
        .create(
            Resource::Nodes,
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
            &WriteOptions::default(),
        )
        .map_err(|e| anyhow::anyhow!("creating the Node: {e:?}"))?;
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let log = dir.join("plugin.log");

    let mut cmd = Command::new(&ctx.plugin_bin);
    cmd.env_clear()
        .env("RUST_LOG", "info")
        .envs(ctx.envs.iter().map(|(k, v)| (k, v)))
        .args(["--node-name", NODE, "--log-format", "json"])
        .arg("--kubelet-registrar-dir")
        .arg(dir.join("reg"))
        .arg("--kubelet-plugins-dir")
        .arg(dir.join("plugins"))
        .arg("--nvml-lib")
        .arg(library)
        .arg("--sysfs-root")
        .arg(sysfs)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);

    let wall0 = SystemTime::now();
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("spawning the plugin")?;
    let waited = server
        .store()
        .wait_for(Resource::ResourceSlices, Duration::from_secs(30), |items| {
            complete_pool(items).is_some()
        })
        .await;
    let total_ms = t0.elapsed().as_secs_f64() * 1000.0;
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
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
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
    Ok(start.elapsed().as_secs_f64() * 1000.0)
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
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// `(slices, devices)` when the stored ResourceSlices of [`NODE`] form a
/// complete pool: all at the highest generation, as many as their
/// `resourceSliceCount`.
fn complete_pool(items: &[Value]) -> Option<(usize, usize)> {
    gpu_dra_e2e::pool::complete(items.iter().filter(|s| s["spec"]["nodeName"] == NODE))
        .filter(|p| p.stale == 0)
        .map(|p| (p.slices, p.devices))
}

/// Milliseconds from `wall0` to each of [`MILESTONES`] in a JSON log.
fn milestones(log: &str, wall0: SystemTime) -> anyhow::Result<Vec<f64>> {
    let since = wall0.duration_since(UNIX_EPOCH)?;
    let start = (since.as_secs() % 86_400) as f64 + f64::from(since.subsec_nanos()) / 1e9;
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    MILESTONES
        .iter()
        .map(|m| {
            let line = lines
                .iter()
                .find(|l| l["message"] == *m)
                .with_context(|| format!("{m:?} not logged:\n{log}"))?;
            let ts = line["timestamp"].as_str().context("no timestamp")?;
            let mut at = time_of_day(ts).with_context(|| format!("bad timestamp {ts}"))? - start;
            if at < -43_200.0 {
                at += 86_400.0; // across midnight
            }
            Ok(at * 1000.0)
        })
        .collect()
}

/// Seconds since midnight (UTC) of an RFC 3339 timestamp
/// (`2026-11-21T19:06:45.538841Z`).
fn time_of_day(ts: &str) -> Option<f64> {
    let time = ts.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.splitn(3, ':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// A `kB` field of `/proc/<pid>/status`.
fn proc_kib(status: &str, field: &str) -> anyhow::Result<f64> {
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

    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), 10.0);
        assert_eq!(percentile(&s, 95.0), 19.0);
        assert_eq!(percentile(&s, 100.0), 20.0);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
    }

    #[test]
    fn timestamps_and_proc_fields_parse() {
        assert_eq!(time_of_day("2026-11-21T01:02:03.5Z"), Some(3723.5));
        assert_eq!(time_of_day("garbage"), None);
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

    #[test]
    fn the_table_judges_goals() {
        let rows = [
            Row::new("b", "t", "ms", vec![1.0, 2.0, 300.0]).goal(Goal::P95Below(100.0)),
            Row::new("b", "m", "MiB", vec![5.0]).goal(Goal::MaxBelow(16.0)),
        ];
        let t = table(&rows);
        assert!(
            t.contains("| b | t (ms) | 3 | 2.0 | 300.0 | 300.0 | p95 < 100 ms | NO |"),
            "{t}"
        );
        assert!(
            t.contains("| b | m (MiB) | 1 | 5.0 | 5.0 | 5.0 | max < 16 MiB | yes |"),
            "{t}"
        );
    }
}
