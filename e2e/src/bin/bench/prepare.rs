//! Claim preparation as kubelet sees it (issue 4): prepare latency per kind
//! of claim next to the one unavoidable durable write (and above the floor
//! any driver pays here: an empty call, the claim read), 64 concurrent claims
//! on 8 GPUs against one alone, and the plugin's resident memory over
//! 10,000 prepare/unprepare cycles. Every call goes from the kubelet
//! simulator over the plugin's real Unix socket; every claim is a fresh
//! ResourceClaim (new UID) the plugin reads from the API server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use gpu_dra_sim::kubelet::Claim;
use serde_json::{Value, json};

use crate::cpu::{Reading, Spent};
use crate::node::{DRIVER, Node, durable_write, result, swapped_write};
use crate::start::{span_ms, time_of_day, wall_of_day};
use crate::table::{Goal, Row, Stat, Values, ms};
use crate::{Ctx, Settings};

/// GPUs of the machine ([`crate::node::PROFILE`]).
const GPUS: usize = 8;

/// The kinds of claim whose prepare is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A whole GPU, no configuration.
    WholeGpu,
    /// A whole GPU with an MPS configuration: a control daemon per claim.
    Mps,
    /// [`Kind::Mps`] with the daemon started by the MPS daemon host, as
    /// the chart deploys it (`gpu-kubelet-plugin mps-host`, the plugin's
    /// `--mps-host-socket`).
    MpsHost,
    /// A 1g.10gb MIG device created at prepare (`--dynamic-mig`).
    DynamicMig,
}

impl Kind {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::WholeGpu | Self::Mps | Self::MpsHost => &[],
            Self::DynamicMig => &["--dynamic-mig"],
        }
    }

    /// The device claim `i` gets (one GPU after the other).
    fn device(self, node: &Node, i: usize) -> anyhow::Result<String> {
        let gpu = i % GPUS;
        match self {
            Self::WholeGpu | Self::Mps | Self::MpsHost => Ok(format!("gpu-{gpu}")),
            Self::DynamicMig => node.device(&format!("gpu-{gpu}-mig-1g10gb")),
        }
    }

    fn config(self) -> Value {
        match self {
            Self::WholeGpu | Self::DynamicMig => json!([]),
            Self::Mps | Self::MpsHost => {
                json!([gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}))])
            }
        }
    }
}

/// A benchmark's MPS daemon host, stopped when dropped, on an error too (a
/// registered child is only forgotten when dropped).
struct HostGuard(crate::children::Plugin);

impl Drop for HostGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An opaque `GpuConfig` from the claim.
fn gpu_config(sharing: Value) -> Value {
    json!({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}})
}

fn p50(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    crate::table::percentile(&s, 50.0)
}

/// Prepare latency of `kind`: `iterations` fresh claims, one after the
/// other, each prepared, unprepared and deleted, with one durable write
/// timed right after each (same directory as the checkpoint), so both see
/// the same disk at the same moment.
pub fn latency(ctx: &Ctx, name: &str, settings: &Settings, kind: Kind) -> anyhow::Result<Vec<Row>> {
    let dir = ctx.dir_for(name);
    ctx.runtime.block_on(async {
        let mut flags: Vec<String> = kind.flags().iter().map(|f| (*f).to_owned()).collect();
        if kind == Kind::MpsHost {
            let socket = crate::node::mps_host_socket(&dir);
            flags.extend(["--mps-host-socket".to_owned(), socket.display().to_string()]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let node = Node::start(ctx, &dir, &flags).await?;
        // Needed from the first MPS prepare on, not at the plugin's start.
        let _host = if kind == Kind::MpsHost {
            Some(HostGuard(crate::node::start_mps_host(ctx, &dir, &node).await?))
        } else {
            None
        };
        let config = kind.config();
        let cycle = |i: usize| {
            let node = &node;
            let config = &config;
            async move {
                let device = kind.device(node, i)?;
                let claim = node.claim(&json!([result("gpu", &device)]), config)?;
                let sent = SystemTime::now();
                let t = Instant::now();
                node.prepare(std::slice::from_ref(&claim)).await?;
                let prepare = t.elapsed();
                let unsent = SystemTime::now();
                let t = Instant::now();
                node.unprepare(std::slice::from_ref(&claim)).await?;
                let unprepare = t.elapsed();
                node.delete(&claim)?;
                anyhow::Ok((claim, (sent, prepare), (unsent, unprepare)))
            }
        };
        // The first prepare after start also finds the driver's files for
        // every spec and opens the API connection: reported on its own.
        let (_, (_, first), _) = cycle(0).await.context("the first cycle")?;
        let (mut sent, mut unsent) = (Vec::new(), Vec::new());
        let (mut prepare, mut unprepare, mut write) = (Vec::new(), Vec::new(), Vec::new());
        let (mut swapped, mut nothing) = (Vec::new(), Vec::new());
        for i in 1..=settings.iterations {
            let (claim, (at, p), (un_at, u)) =
                cycle(i).await.with_context(|| format!("cycle {i}"))?;
            write.push(ms(durable_write(&node.state_dir, i)?));
            swapped.push(ms(swapped_write(&node.state_dir, i)?));
            let t = Instant::now();
            node.prepare_nothing().await.context("a call with no claims")?;
            nothing.push(ms(t.elapsed()));
            unsent.push((claim.uid.clone(), un_at, u));
            sent.push((claim.uid, at, p));
            prepare.push(ms(p));
            unprepare.push(ms(u));
        }
        let log = node.log_text();
        let (work, answer) = split_at_log(&log, "claim prepared", &sent)?;
        let (unwork, unanswer) = split_at_log(&log, "claim unprepared", &unsent)?;
        // The time a step outside the driver took inside the prepare: the
        // MPS daemon's start, or NVML's creation of the MIG device.
        let outside = match kind {
            Kind::WholeGpu => None,
            Kind::Mps | Kind::MpsHost => Some((
                "    of which starting the MPS control daemon (launch, readiness, settings; the fake root's compiled stand-in daemon)",
                "  prepare less the daemon start, claim by claim",
                log_micros_as_ms(&log, "started MPS control daemon", "elapsed_us"),
            )),
            Kind::DynamicMig => Some((
                "    of which NVML creating the GPU and compute instance (here the fake NVML, which also writes the capability files, device nodes and its state file as the kernel driver would)",
                "  prepare less the NVML create, claim by claim",
                log_micros_as_ms(&log, "MIG device created", "create_us"),
            )),
        };
        node.stop()?;
        let ratio = p50(&prepare) / p50(&write);
        let unprepare_ratio = p50(&unprepare) / p50(&write);
        let ratio_swapped = p50(&prepare) / p50(&swapped);
        // The claim read is the plugin's own GET (its log's `read_us`).
        let read = log_micros_as_ms(&log, "claim prepared", "read_us");
        let outside = outside
            .map(|(what, less_name, samples)| {
                let less = less_outside(&prepare, &samples)
                    .with_context(|| format!("{name}: {what:?}"))?;
                let less_ratio = p50(&less) / p50(&write);
                anyhow::Ok((what, less_name, samples, less, less_ratio))
            })
            .transpose()?;
        // From the prepare less its outside step, where the kind has one.
        let own = outside.as_ref().map_or(&prepare, |o| &o.3);
        let above = above_floor(own, &read, p50(&nothing))
            .with_context(|| format!("{name}: above the floor"))?;
        let above_ratio = p50(&above) / p50(&write);
        let mut rows = vec![
            against_nvidia(
                Row::new(name, "prepare, as kubelet sees it", "ms", prepare),
                kind,
                NVIDIA_PREPARE_P50_MS,
            ),
            Row::new(
                name,
                "  to the plugin's \"claim prepared\" (read claim, plan, hardware, CDI spec, checkpoint commit; status.devices is written after the answer)",
                "ms",
                work,
            ),
            Row::new(
                name,
                "  then the answer back",
                "ms",
                answer,
            ),
            against_nvidia(
                Row::new(name, "unprepare", "ms", unprepare),
                kind,
                NVIDIA_UNPREPARE_P50_MS,
            ),
            Row::new(
                name,
                "  to the plugin's \"claim unprepared\" (entry, undo, CDI spec removed, checkpoint commit; status.devices is cleared after the answer)",
                "ms",
                unwork,
            ),
            Row::new(name, "  then the answer back", "ms", unanswer),
            Row::with(
                name,
                "  unprepare p50 / durable write p50",
                "x",
                Values::One(unprepare_ratio),
            ),
            Row::with(
                name,
                "first prepare after start (not in the samples)",
                "ms",
                Values::One(ms(first)),
            ),
            Row::new(
                name,
                "durable write: write + fsync + rename + dir fsync, same dir",
                "ms",
                write,
            ),
            ratio_row(name, kind, ratio),
            Row::new(
                name,
                "  the checkpoint's own kind of durable write: in place into a spare file, fdatasync, rename exchange, dir fsync, same dir",
                "ms",
                swapped,
            ),
            Row::with(
                name,
                "  prepare p50 / that write p50",
                "x",
                Values::One(ratio_swapped),
            ),
        ];
        rows.insert(
            2,
            Row::new(
                name,
                "    of which reading the claim (the plugin's GET from the API server, parsed)",
                "ms",
                read[1..].to_vec(),
            ),
        );
        if let Some((what, less_name, samples, less, less_ratio)) = outside {
            rows.insert(3, Row::new(name, what, "ms", samples));
            rows.push(Row::new(name, less_name, "ms", less));
            rows.push(Row::with(
                name,
                "  that p50 / durable write p50",
                "x",
                Values::One(less_ratio),
            ));
        }
        rows.extend([
            Row::new(
                name,
                "  a call with no claims (the gRPC round trip through the kubelet simulator; the plugin answers at once)",
                "ms",
                nothing,
            ),
            Row::new(
                name,
                above_floor_label(kind),
                "ms",
                above,
            ),
            Row::with(name, "  that p50 / durable write p50", "x", Values::One(above_ratio)),
        ]);
        Ok(rows)
    })
}

/// NVIDIA's plugin's p50s on the same doubles (whole GPU, 2-core VM),
/// as issue #44 reports them (measured 2026-11-28; not measured by this
/// runner): ours must be at least twice as fast.
const NVIDIA_PREPARE_P50_MS: f64 = 3.0;
/// See [`NVIDIA_PREPARE_P50_MS`].
const NVIDIA_UNPREPARE_P50_MS: f64 = 1.5;

/// A whole-GPU row judged against half of NVIDIA's p50 (issue #44); the
/// other kinds have no NVIDIA number to compare with.
fn against_nvidia(row: Row, kind: Kind, nvidia_p50_ms: f64) -> Row {
    if kind == Kind::WholeGpu {
        row.goal(Goal::below(Stat::P50, nvidia_p50_ms / 2.0))
    } else {
        row
    }
}

/// The ratio to the durable write, judged against issue 4's line (under
/// 2x) for the kinds it names; the MPS host's variant is read against the
/// plain MPS row instead.
fn ratio_row(name: &str, kind: Kind, ratio: f64) -> Row {
    let row = Row::with(
        name,
        "prepare p50 / durable write p50",
        "x",
        Values::One(ratio),
    );
    if kind == Kind::MpsHost {
        row
    } else {
        row.goal(Goal::below(Stat::P50, 2.0))
    }
}

/// The row of a prepare of `kind` above the floor: less the round trip
/// and the claim read that any driver pays here, and the step outside it.
fn above_floor_label(kind: Kind) -> &'static str {
    match kind {
        Kind::WholeGpu => {
            "  above the floor: prepare less its claim read, claim by claim, and an empty call's p50"
        }
        Kind::Mps | Kind::MpsHost => {
            "  above the floor: prepare less its claim read and daemon start, claim by claim, and an empty call's p50"
        }
        Kind::DynamicMig => {
            "  above the floor: prepare less its claim read and NVML create, claim by claim, and an empty call's p50"
        }
    }
}

/// Each timed prepare above the floor, in ms: `prepare` (already less
/// its step outside the driver, if the kind has one) less its own claim
/// read (`read`, from the log), claim by claim, and less `round_trip`, an
/// empty call's p50. The floor is what any driver pays here whatever it
/// does: kubelet's call and its answer, and the claim's read.
fn above_floor(prepare: &[f64], read: &[f64], round_trip: f64) -> anyhow::Result<Vec<f64>> {
    let above = less_outside(prepare, read).context("claim reads")?;
    Ok(above.iter().map(|v| v - round_trip).collect())
}

/// Each timed prepare less the time of one of its steps, in ms: a step
/// the plugin logs once per prepare (the claim read, or a step outside the
/// driver). The cycles run one after the other, so the log's timings are
/// the first, unsampled cycle's, then one per timed prepare in order.
fn less_outside(prepare: &[f64], outside: &[f64]) -> anyhow::Result<Vec<f64>> {
    anyhow::ensure!(
        outside.len() == prepare.len() + 1,
        "the plugin's log has {} timings of the step outside the driver, expected one per cycle ({})",
        outside.len(),
        prepare.len() + 1
    );
    Ok(prepare
        .iter()
        .zip(&outside[1..])
        .map(|(p, o)| p - o)
        .collect())
}

/// Field `field` (microseconds) of every log line with message `message`
/// that has it, in ms.
fn log_micros_as_ms(log: &str, message: &str, field: &str) -> Vec<f64> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["message"] == message)
        // A field wider than u64 would be logged as a string.
        .filter_map(|v| {
            let e = &v[field];
            e.as_f64()
                .or_else(|| e.as_str().and_then(|s| s.parse().ok()))
        })
        .map(|micros| micros * 0.001)
        .collect()
}

/// Splits each timed call at the plugin's log line `message` for its
/// claim ("claim prepared", "claim unprepared"): `(request to that line,
/// that line to the answer)`, in ms.
fn split_at_log(
    log: &str,
    message: &str,
    sent: &[(String, SystemTime, Duration)],
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut prepared: HashMap<String, f64> = HashMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["message"] == message
            && let (Some(uid), Some(ts)) = (v["claim"].as_str(), v["timestamp"].as_str())
            && let Some(at) = time_of_day(ts)
        {
            prepared.insert(uid.to_owned(), at);
        }
    }
    let mut work = Vec::with_capacity(sent.len());
    let mut answer = Vec::with_capacity(sent.len());
    for (uid, at, took) in sent {
        let logged = prepared
            .get(uid.as_str())
            .with_context(|| format!("no {message:?} line for {uid}"))?;
        let to_log = span_ms(wall_of_day(*at)?, *logged).clamp(0.0, ms(*took));
        work.push(to_log);
        answer.push(ms(*took) - to_log);
    }
    Ok((work, answer))
}

/// A memory-shared claim of `memory` on GPU `gpu` (`--memory-sharing`):
/// the result names a share of the device.
fn share(node_gpu: usize, share_id: &str, memory: &str) -> Value {
    let mut r = result("share", &format!("gpu-{node_gpu}"));
    r["shareID"] = json!(share_id);
    r["consumedCapacity"] = json!({"memory": memory});
    json!([r])
}

/// What many claims at once are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crowd {
    /// 64 memory-shared claims of 8 GiB, 8 per GPU (`--memory-sharing=all`):
    /// each GPU's first claim starts its MPS daemon, the other seven join it.
    MemoryShared,
    /// 56 MIG 1g.10gb claims, 7 per GPU (`--dynamic-mig`): every placement
    /// of every GPU created at once, no daemon.
    Mig,
}

impl Crowd {
    fn claims(self) -> usize {
        match self {
            Self::MemoryShared => 64,
            Self::Mig => 56,
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::MemoryShared => &["--memory-sharing=all"],
            Self::Mig => &["--dynamic-mig"],
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::MemoryShared => "memory-shared claim",
            Self::Mig => "MIG 1g.10gb claim",
        }
    }
}

/// Many claims at once on 8 GPUs against one alone. Each run prepares one
/// claim alone, then sends one NodePrepareResources call per claim (as
/// that many pods) all at once and times until the last answer; everything
/// is unprepared between runs. The goal (under 3x) is the issue's, for 64
/// claims; 1g.10gb MIG devices fit only 7 to an H100, so the MIG crowd is
/// 56 and is shown for comparison, without a goal.
pub fn concurrent(
    ctx: &Ctx,
    name: &str,
    settings: &Settings,
    crowd: Crowd,
) -> anyhow::Result<Vec<Row>> {
    let dir = ctx.dir_for(name);
    let count = crowd.claims();
    ctx.runtime.block_on(async {
        let node = Node::start(ctx, &dir, crowd.flags()).await?;
        let mut placements = Vec::new();
        for gpu in 0..GPUS {
            let prefix = format!("gpu-{gpu}-mig-1g10gb");
            let mine: Vec<String> = node
                .devices
                .iter()
                .filter(|d| d.starts_with(&prefix))
                .cloned()
                .collect();
            placements.push(mine);
        }
        let mut id = 0u64;
        // Claim `i` of a crowd: GPU `i % 8`, its `i / 8`-th share or
        // placement.
        let mut results = |i: usize| -> anyhow::Result<Value> {
            let gpu = i % GPUS;
            match crowd {
                Crowd::MemoryShared => {
                    id += 1;
                    let share_id = format!("{:08x}-0000-4000-8000-{id:012x}", std::process::id());
                    Ok(share(gpu, &share_id, "8Gi"))
                }
                Crowd::Mig => {
                    let device = placements[gpu].get(i / GPUS).with_context(|| {
                        format!("GPU {gpu} has no 1g.10gb placement {}", i / GPUS)
                    })?;
                    Ok(json!([result("mig", device)]))
                }
            }
        };
        let none = json!([]);
        let (mut alone, mut wall, mut each) = (Vec::new(), Vec::new(), Vec::new());
        let mut cpu = Vec::new();
        // One unmeasured cycle: the first prepare also finds the driver's
        // files and opens the API connection.
        for run in 0..=settings.runs as usize {
            let c = node.claim(&results(run % GPUS)?, &none)?;
            let t = Instant::now();
            node.prepare(std::slice::from_ref(&c)).await?;
            let one = t.elapsed();
            node.unprepare(std::slice::from_ref(&c)).await?;
            node.delete(&c)?;
            if run == 0 {
                continue;
            }
            alone.push(ms(one));

            let claims: Vec<Claim> = (0..count)
                .map(|i| node.claim(&results(i)?, &none))
                .collect::<anyhow::Result<_>>()?;
            let cpu_before = Reading::take(node.pid())?;
            let t = Instant::now();
            let calls = claims.iter().map(|c| {
                let node = &node;
                async move {
                    node.prepare(std::slice::from_ref(c)).await?;
                    anyhow::Ok(t.elapsed())
                }
            });
            let done = futures::future::try_join_all(calls)
                .await
                .with_context(|| format!("run {run}: {count} concurrent prepares"))?;
            wall.push(ms(t.elapsed()));
            cpu.push(Reading::take(node.pid())?.since(&cpu_before));
            each.extend(done.into_iter().map(ms));
            let undo = claims
                .iter()
                .map(|c| node.unprepare(std::slice::from_ref(c)));
            futures::future::try_join_all(undo).await?;
            for c in &claims {
                node.delete(c)?;
            }
        }
        node.stop()?;
        let ratio = Row::with(
            name,
            &format!("{count} at once p50 / one alone p50"),
            "x",
            Values::One(p50(&wall) / p50(&alone)),
        );
        let cpu = cpu_rows(name, count, &wall, &cpu);
        let mut rows = vec![
            Row::new(
                name,
                &format!("one {} alone: prepare", crowd.what()),
                "ms",
                alone,
            ),
            Row::new(
                name,
                &format!(
                    "{count} claims at once ({count} calls, {} per GPU): until the last answer",
                    count / GPUS
                ),
                "ms",
                wall,
            ),
            Row::new(
                name,
                &format!("  each of the {count}: until its answer"),
                "ms",
                each,
            ),
            match crowd {
                Crowd::MemoryShared => ratio.goal(Goal::below(Stat::P50, 3.0)),
                Crowd::Mig => ratio,
            },
        ];
        rows.extend(cpu);
        Ok(rows)
    })
}

/// Where the CPU time of the crowd's windows (first call to last answer)
/// went, as means per run (see [`crate::cpu`]): on a small machine the
/// crowd is bound by CPU, and these rows say whose.
fn cpu_rows(name: &str, count: usize, wall: &[f64], windows: &[Spent]) -> Vec<Row> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mean_wall = wall.iter().sum::<f64>() / wall.len().max(1) as f64;
    let spent = Spent::mean(windows);
    let one =
        |metric: &str, unit: &'static str, v: f64| Row::with(name, metric, unit, Values::One(v));
    vec![
        one(
            &format!("  CPU time the {count} had: {cores} cores x wall, mean of the runs"),
            "ms",
            cores as f64 * mean_wall,
        ),
        one(
            "  CPU time used meanwhile, whole machine (sampled by tick), mean of the runs",
            "ms",
            spent.machine,
        ),
        one("    of which the plugin", "ms", spent.plugin),
        one(
            "    of which this bench process (test API server, kubelet simulator)",
            "ms",
            spent.bench,
        ),
        one(
            "    of which the rest (other processes: the fake root's MPS programs; kernel threads)",
            "ms",
            spent.rest(),
        ),
        one(
            &format!("  plugin CPU per claim (plugin CPU / {count})"),
            "ms",
            spent.plugin / count as f64,
        ),
    ]
}

/// Resident memory over prepare/unprepare cycles on a `--dynamic-mig`
/// plugin: cycle 1 alone, then 8 workers (one per GPU, as 8 pods at a
/// time) each alternating a whole-GPU claim and a 1g.10gb MIG claim on its
/// GPU (every MIG claim creates and destroys an instance), until
/// `settings.cycles` cycles. `VmRSS` is read once the plugin idles after
/// cycle 1, after 1,000 cycles, halfway and at the end.
pub fn memory(ctx: &Ctx, name: &str, settings: &Settings) -> anyhow::Result<Vec<Row>> {
    let dir = ctx.dir_for(name);
    let cycles = settings.cycles.max(2);
    ctx.runtime.block_on(async {
        let node = Node::start(ctx, &dir, &["--dynamic-mig"]).await?;
        let none = json!([]);
        let mut targets = Vec::new();
        for gpu in 0..GPUS {
            let mig = node.device(&format!("gpu-{gpu}-mig-1g10gb"))?;
            targets.push([format!("gpu-{gpu}"), mig]);
        }
        let one = |device: String| {
            let node = &node;
            let none = &none;
            async move {
                let c = node.claim(&json!([result("gpu", &device)]), none)?;
                node.prepare(std::slice::from_ref(&c)).await?;
                node.unprepare(std::slice::from_ref(&c)).await?;
                node.delete(&c)
            }
        };
        let settle = || tokio::time::sleep(Duration::from_millis(300));
        let start_rss = node.memory_mib("VmRSS")?;
        one(targets[0][0].clone()).await.context("cycle 1")?;
        settle().await;
        let first = node.memory_mib("VmRSS")?;
        let first_anon = node.memory_mib("RssAnon")?;

        let done = AtomicUsize::new(1);
        let mut checkpoints = Vec::new();
        let started = Instant::now();
        for target in checkpoints_of(cycles) {
            let workers = (0..GPUS).map(|gpu| {
                let done = &done;
                let targets = &targets;
                let one = &one;
                async move {
                    let mut turn = 0usize;
                    loop {
                        let k = done.fetch_add(1, Ordering::Relaxed);
                        if k >= target {
                            done.fetch_sub(1, Ordering::Relaxed);
                            return anyhow::Ok(());
                        }
                        // Whole GPU and MIG device in turn on this GPU.
                        let device = targets[gpu][turn % 2].clone();
                        turn += 1;
                        one(device)
                            .await
                            .with_context(|| format!("cycle {}", k + 1))?;
                    }
                }
            });
            futures::future::try_join_all(workers).await?;
            let elapsed = started.elapsed();
            settle().await;
            checkpoints.push((
                done.load(Ordering::Relaxed),
                node.memory_mib("VmRSS")?,
                elapsed,
            ));
        }
        let end_anon = node.memory_mib("RssAnon")?;
        let hwm = node.memory_mib("VmHWM")?;
        node.stop()?;
        let mut rows = vec![
            Row::with(
                name,
                "VmRSS once serving, before any claim",
                "MiB",
                Values::One(start_rss),
            ),
            Row::with(
                name,
                "VmRSS after the first cycle",
                "MiB",
                Values::One(first),
            ),
        ];
        for (n, rss, _) in &checkpoints {
            rows.push(Row::with(
                name,
                &format!("VmRSS after {n} cycles"),
                "MiB",
                Values::One(*rss),
            ));
        }
        let (n_end, end, elapsed) = checkpoints[checkpoints.len() - 1];
        rows.push(
            Row::with(
                name,
                &format!("growth of VmRSS, first cycle to {n_end}"),
                "MiB",
                Values::One(end - first),
            )
            .goal(Goal::below(Stat::P50, 1.0)),
        );
        if checkpoints.len() >= 2 {
            // The trend once warm: a leak keeps its slope, warm-up does not.
            let (n_mid, mid, _) = checkpoints[checkpoints.len() - 2];
            rows.push(Row::with(
                name,
                &format!("  growth per 1,000 cycles from {n_mid} to {n_end}"),
                "MiB",
                Values::One((end - mid) * 1000.0 / (n_end - n_mid) as f64),
            ));
        }
        rows.extend([
            Row::with(
                name,
                &format!("  growth of RssAnon (heap, stacks), first cycle to {n_end}"),
                "MiB",
                Values::One(end_anon - first_anon),
            ),
            Row::with(name, "VmHWM (peak resident)", "MiB", Values::One(hwm)),
            Row::with(
                name,
                "cycles per second (8 at a time)",
                "1/s",
                Values::One((n_end - 1) as f64 / elapsed.as_secs_f64()),
            ),
        ]);
        Ok(rows)
    })
}

/// Where memory is read during `cycles` cycles: after 1,000, halfway and
/// at the end (only those past cycle 1, each once, in order).
fn checkpoints_of(cycles: usize) -> Vec<usize> {
    let mut at: Vec<usize> = [1000, cycles / 2, cycles]
        .into_iter()
        .filter(|&n| n > 1 && n <= cycles)
        .collect();
    at.sort_unstable();
    at.dedup();
    at
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn a_prepare_splits_at_its_log_line() {
        // Sent at 10:00:00.000 UTC, logged 12 ms later, answered at 20 ms.
        let at = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 36_000);
        let sent = vec![("u1".to_owned(), at, Duration::from_millis(20))];
        let log = "not json\n{\"message\":\"claim prepared\",\"claim\":\"other\",\"timestamp\":\"2024-10-04T10:00:00.001Z\"}\n{\"message\":\"claim prepared\",\"claim\":\"u1\",\"timestamp\":\"2024-10-04T10:00:00.012Z\"}\n";
        let (work, answer) = split_at_log(log, "claim prepared", &sent).unwrap();
        assert!((work[0] - 12.0).abs() < 1e-6, "{work:?}");
        assert!((answer[0] - 8.0).abs() < 1e-6, "{answer:?}");
        let missing = split_at_log("", "claim prepared", &sent)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("u1"), "{missing}");
        // An unprepare splits at its own line, never at the prepare's.
        let none = split_at_log(log, "claim unprepared", &sent).unwrap_err();
        assert!(none.to_string().contains("claim unprepared"), "{none}");
    }

    #[test]
    fn the_outside_step_is_taken_off_claim_by_claim() {
        // The first timing is the unsampled cycle's.
        let less = less_outside(&[12.0, 11.0], &[30.0, 10.0, 9.5]).unwrap();
        assert_eq!(less, vec![2.0, 1.5]);
        let short = less_outside(&[12.0, 11.0], &[10.0, 9.5]).unwrap_err();
        assert!(short.to_string().contains("has 2 timings"), "{short}");
        assert!(less_outside(&[12.0], &[1.0, 2.0, 3.0]).is_err());
    }

    #[test]
    fn above_the_floor_takes_off_each_claims_steps_and_the_round_trip() {
        // Prepares of 5 and 4 ms; their reads 0.5 and 0.25 ms (after the
        // unsampled first cycle's), an empty call's p50 of 1 ms.
        let above = above_floor(&[5.0, 4.0], &[9.0, 0.5, 0.25], 1.0).unwrap();
        assert_eq!(above, [3.5, 2.75]);
        // With a step outside the driver (2 and 1 ms), taken off first.
        let less = less_outside(&[5.0, 4.0], &[7.0, 2.0, 1.0]).unwrap();
        let above = above_floor(&less, &[9.0, 0.5, 0.25], 1.0);
        assert_eq!(above.unwrap(), [1.5, 1.75]);
        // A log short of one read per cycle is an error, not a guess.
        let err = above_floor(&[5.0, 4.0], &[0.5, 0.25], 1.0).unwrap_err();
        assert!(format!("{err:#}").contains("claim reads"), "{err:#}");
    }

    #[test]
    fn step_timings_are_read_from_the_log() {
        let log = "x\n{\"message\":\"started MPS control daemon\",\"elapsed_us\":41000}\n{\"message\":\"claim prepared\",\"elapsed_us\":7}\n{\"message\":\"started MPS control daemon\",\"elapsed_us\":\"10500\"}\n";
        let daemon = |log| log_micros_as_ms(log, "started MPS control daemon", "elapsed_us");
        assert_eq!(daemon(log), vec![41.0, 10.5]);
        assert!(daemon("").is_empty());
        // The backend's line of the same message has no create_us: skipped.
        let log = "{\"message\":\"MIG device created\",\"target\":\"gpu_nvml::backend::mig\"}\n{\"message\":\"MIG device created\",\"create_us\":250}\n";
        let create = log_micros_as_ms(log, "MIG device created", "create_us");
        assert_eq!(create.len(), 1);
        assert!((create[0] - 0.25).abs() < 1e-9, "{create:?}");
    }

    #[test]
    fn claims_name_their_shares_and_devices() {
        let r = share(3, "id-1", "8Gi");
        assert_eq!(r[0]["device"], "gpu-3");
        assert_eq!(r[0]["shareID"], "id-1");
        assert_eq!(r[0]["consumedCapacity"]["memory"], "8Gi");
        assert_eq!(Kind::Mps.config()[0]["opaque"]["driver"], DRIVER);
        assert_eq!(Kind::WholeGpu.config(), json!([]));
    }

    #[test]
    fn memory_is_read_at_1000_halfway_and_the_end() {
        assert_eq!(checkpoints_of(10_000), [1000, 5000, 10_000]);
        assert_eq!(checkpoints_of(1500), [750, 1000, 1500]);
        assert_eq!(checkpoints_of(40), [20, 40]);
        assert_eq!(checkpoints_of(2), [2]);
    }
}
