//! `bench`: every benchmark of the project in one run and one table
//! (measurements, not timed tests). The plugin benchmarks run the shipped
//! build of `gpu-kubelet-plugin` against the in-process test API server, the fake
//! NVML and a fake driver root, driven by the kubelet simulator over the
//! plugin's real sockets; the webhook, CEL and allocator benchmarks are run
//! by their own commands through cargo. Every result lands in one Markdown
//! table on stdout, with the goal it is judged against and a verdict.
//!
//! ```text
//! cargo run --release -p gpu-dra-e2e --bin bench [-- OPTIONS]
//! target/release/bench [--runs N] [--iterations N] [--cycles N] [--only SUBSTRING]
//!                      [--no-build] [--env KEY=VALUE] [--smaps DIR] [--keep]
//! ```
//!
//! Before measuring, the bench builds the plugin as it ships and the fake
//! NVML ([`BUILDS`]: `cargo build --profile plugin -p gpu-kubelet-plugin`,
//! `cargo build --release -p mock-nvml`, no-ops when they are fresh) unless
//! `--no-build`; the plugin is looked up in `target/plugin/`, or where
//! `BENCH_PLUGIN_BIN` says (A/B runs of two builds). Add a
//! benchmark by appending to [`BENCHMARKS`].
//!
//! Killed with SIGINT, SIGTERM or SIGHUP, the bench stops the plugins it
//! started and their stand-in MPS daemons, then exits with 128 + the
//! signal ([`signals`]).

// The modules live in `bench/` (a binary's root file looks for them next
// to itself otherwise).
#[path = "bench/children.rs"]
mod children;
#[path = "bench/cpu.rs"]
mod cpu;
#[path = "bench/external.rs"]
mod external;
#[path = "bench/handover.rs"]
mod handover;
#[path = "bench/health.rs"]
mod health;
#[path = "bench/node.rs"]
mod node;
#[path = "bench/prepare.rs"]
mod prepare;
#[path = "bench/signals.rs"]
mod signals;
#[path = "bench/start.rs"]
mod start;
#[path = "bench/table.rs"]
mod table;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use clap::Parser as _;

use table::{Row, Values};

#[derive(Debug, clap::Parser)]
#[command(name = "bench", about = "Benchmarks of the GPU DRA driver")]
struct Args {
    /// Runs of the plugin start benchmarks, of the concurrent-claims
    /// benchmarks and of the rolling update's hand-over.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Timed prepare/unprepare cycles per kind of claim.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    iterations: u32,
    /// Prepare/unprepare cycles of the resident-memory benchmark.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    cycles: u32,
    /// Run only the benchmarks whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Do not build the plugin and the fake NVML first.
    #[arg(long)]
    no_build: bool,
    /// Extra environment of the measured plugins (`KEY=VALUE`, repeatable),
    /// for experiments such as `MALLOC_ARENA_MAX=1`.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    envs: Vec<(String, String)>,
    /// Keep the scratch directories (each benchmark's `NN/`, named in its
    /// `benchmark` file, with the plugin's JSON log `plugin.log`) instead of
    /// removing them at the end; their paths go to stderr.
    #[arg(long)]
    keep: bool,
    /// Copy each started plugin's `/proc/<pid>/smaps` (read with its
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

/// How much each benchmark does.
pub struct Settings {
    /// Plugin starts; runs of the concurrent claims; hand-overs.
    pub runs: u32,
    /// Timed prepares per kind of claim.
    pub iterations: usize,
    /// Cycles of the memory benchmark.
    pub cycles: usize,
}

/// A named benchmark: returns its rows.
struct Benchmark {
    name: &'static str,
    run: fn(&Ctx, &'static str, &Settings) -> anyhow::Result<Vec<Row>>,
}

/// Every benchmark, in table order.
const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        name: "prepare, whole GPU",
        run: |ctx, name, s| prepare::latency(ctx, name, s, prepare::Kind::WholeGpu),
    },
    Benchmark {
        name: "prepare, MPS",
        run: |ctx, name, s| prepare::latency(ctx, name, s, prepare::Kind::Mps),
    },
    Benchmark {
        name: "prepare, MPS through the MPS daemon host",
        run: |ctx, name, s| prepare::latency(ctx, name, s, prepare::Kind::MpsHost),
    },
    Benchmark {
        name: "prepare, dynamic MIG 1g.10gb",
        run: |ctx, name, s| prepare::latency(ctx, name, s, prepare::Kind::DynamicMig),
    },
    Benchmark {
        name: "64 concurrent claims, 8 GPUs, memory-shared",
        run: |ctx, name, s| prepare::concurrent(ctx, name, s, prepare::Crowd::MemoryShared),
    },
    Benchmark {
        name: "56 concurrent claims, 8 GPUs, MIG 1g.10gb",
        run: |ctx, name, s| prepare::concurrent(ctx, name, s, prepare::Crowd::Mig),
    },
    Benchmark {
        name: "prepare/unprepare cycles, memory",
        run: prepare::memory,
    },
    Benchmark {
        name: "plugin start, dgx-h100",
        run: |ctx, name, s| start::plugin_start(ctx, name, s.runs, &[]),
    },
    Benchmark {
        name: "plugin start, dgx-h100, dynamic MIG",
        run: |ctx, name, s| start::plugin_start(ctx, name, s.runs, &["--dynamic-mig"]),
    },
    Benchmark {
        name: "rolling update hand-over, whole GPU",
        run: |ctx, name, s| handover::rolling_update(ctx, name, s, false),
    },
    Benchmark {
        name: "rolling update hand-over, whole GPU, per-instance sockets",
        run: |ctx, name, s| handover::rolling_update(ctx, name, s, true),
    },
    Benchmark {
        name: "GPU health, event faults, dgx-h100",
        run: |ctx, name, _| health::events(ctx, name),
    },
    Benchmark {
        name: "GPU health, polled faults, dgx-h100",
        run: |ctx, name, _| health::polled(ctx, name),
    },
    Benchmark {
        name: "GPU health monitor idle, dgx-h100",
        run: |ctx, name, _| health::idle(ctx, name),
    },
    Benchmark {
        name: "admission webhook",
        run: |ctx, name, _| Ok(external::webhook(ctx, name)),
    },
    Benchmark {
        name: "CEL selectors",
        run: |ctx, name, _| Ok(external::cel(ctx, name)),
    },
    Benchmark {
        name: "allocator, 1,000 nodes x 8 GPUs, dynamic MIG",
        run: |ctx, name, _| Ok(external::allocator(ctx, name)),
    },
    Benchmark {
        name: "checkpoint commit",
        run: |ctx, name, _| Ok(external::checkpoint(ctx, name)),
    },
];

/// The plugin's environment as the image and the chart set it
/// (`Dockerfile`, the DaemonSet template); `--env` adds to it and wins.
pub const DEPLOYED_ENV: &[(&str, &str)] = &[("MALLOC_ARENA_MAX", "1")];

/// The builds the bench runs first (cargo arguments): the plugin as it
/// ships, in the size-optimized `plugin` profile (`Cargo.toml`), then the
/// fake NVML. The bench itself is a release build, so the plugin is in the
/// `plugin` directory beside its own (see [`plugin_next_to`]).
const BUILDS: [&[&str]; 2] = [
    &["build", "--profile", "plugin", "-p", "gpu-kubelet-plugin"],
    &["build", "--release", "-p", "mock-nvml"],
];

/// The environment variable naming another plugin binary to measure than
/// the one [`BUILDS`] makes (A/B runs of two builds).
const PLUGIN_BIN_ENV: &str = "BENCH_PLUGIN_BIN";

/// The plugin binary of the `plugin` profile for the bench binary `exe`:
/// `<target>/plugin/gpu-kubelet-plugin` for `<target>/<profile>/bench`.
fn plugin_next_to(exe: &Path) -> anyhow::Result<PathBuf> {
    let target = exe
        .parent()
        .and_then(Path::parent)
        .with_context(|| format!("{} is not in a cargo target directory", exe.display()))?;
    Ok(target.join("plugin").join("gpu-kubelet-plugin"))
}

/// What benchmarks share: the runtime, the binaries, scratch directories.
pub struct Ctx {
    /// The runtime the benchmarks' async parts run on.
    pub runtime: tokio::runtime::Runtime,
    /// The plugin as the image ships it (`target/plugin/`).
    pub plugin_bin: PathBuf,
    /// Under /tmp: the plugins' state (on disk, as
    /// `/var/lib/kubelet/plugins` is on a node).
    pub scratch: PathBuf,
    /// What a node keeps in memory (CDI specs in `/var/run/cdi`, the GPUs'
    /// state, `/proc`, `/dev`): a tmpfs when there is one (`/dev/shm`),
    /// else under [`Self::scratch`].
    pub volatile: PathBuf,
    /// The plugins' environment: the deployed one, then `--env`.
    pub envs: Vec<(String, String)>,
    /// Where each started plugin's smaps go (`--smaps`).
    pub smaps: Option<PathBuf>,
    /// The cargo that runs the other crates' benchmarks.
    pub cargo: PathBuf,
    /// The workspace root (cargo's working directory).
    pub workspace: PathBuf,
    /// How many benchmark directories [`Self::dir_for`] has handed out.
    pub dirs_made: std::sync::atomic::AtomicUsize,
}

impl Ctx {
    /// A fresh directory for benchmark `name` in the scratch directory:
    /// `<scratch>/<n>`, short, so that the plugin's state directory there
    /// (`<n>/plugins/gpu.nvidia.com`, 42 bytes under `/tmp/bench-<pid>`)
    /// is about as long as a node's (`/var/lib/kubelet/plugins/gpu.nvidia.com`,
    /// 39): an MPS daemon's socket path then fits a UNIX socket and the
    /// plugin talks to it directly, as on a node with the default
    /// directories. The benchmark's name is written into `<n>/benchmark`.
    pub fn dir_for(&self, name: &str) -> PathBuf {
        let n = self
            .dirs_made
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.scratch.join(format!("{n:02}"));
        if std::fs::create_dir_all(&dir).is_ok() {
            let _ = std::fs::write(dir.join("benchmark"), format!("{name}\n"));
        }
        dir
    }

    /// The volatile directory that goes with `dir` (under
    /// [`Self::scratch`]): CDI specs, the GPUs' state, `/proc`, `/dev`.
    pub fn volatile_for(&self, dir: &std::path::Path) -> PathBuf {
        let relative = dir.strip_prefix(&self.scratch).unwrap_or(dir);
        self.volatile.join(relative)
    }
}

/// The machine, for the report: CPUs, CPU model, kernel, load, date.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "{date}; {cpus} CPUs ({model}), kernel {}, load average {}",
        kernel.trim(),
        load()
    )
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Killed from outside, the bench stops the plugins it started first.
    signals::watch()?;
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the e2e crate has no parent directory")?
        .to_path_buf();
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    if !args.no_build {
        for build in BUILDS {
            eprintln!("bench: cargo {}", build.join(" "));
            let status = Command::new(&cargo)
                .args(build)
                .current_dir(&workspace)
                .status()
                .context("running cargo build")?;
            if !status.success() {
                bail!("cargo {} failed ({status})", build.join(" "));
            }
        }
    }
    let exe = std::env::current_exe().context("locating the bench binary")?;
    // Another build of the plugin, for A/B runs (an older one copied aside).
    let plugin_bin = match std::env::var_os(PLUGIN_BIN_ENV) {
        Some(path) => PathBuf::from(path),
        None => plugin_next_to(&exe)?,
    };
    if !plugin_bin.is_file() {
        bail!(
            "{} not found: build it with `cargo {}`",
            plugin_bin.display(),
            BUILDS[0].join(" ")
        );
    }
    let scratch = Scratch::create(args.keep)?;
    let ctx = Ctx {
        runtime: tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?,
        plugin_bin,
        scratch: scratch.disk.clone(),
        volatile: scratch.volatile.clone(),
        envs: DEPLOYED_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .chain(args.envs.iter().cloned())
            .collect(),
        smaps: args.smaps.clone(),
        cargo,
        workspace,
        dirs_made: std::sync::atomic::AtomicUsize::new(0),
    };
    if let Some(dir) = &ctx.smaps {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let settings = Settings {
        runs: args.runs,
        iterations: args.iterations as usize,
        cycles: args.cycles as usize,
    };
    let before = machine();
    eprintln!(
        "bench: {before}; plugin {}, {} runs, {} iterations, {} cycles, extra environment {:?}",
        ctx.plugin_bin.display(),
        settings.runs,
        settings.iterations,
        settings.cycles,
        ctx.envs
    );
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for b in BENCHMARKS {
        if args.only.as_deref().is_some_and(|o| !b.name.contains(o)) {
            continue;
        }
        eprintln!("bench: {} (load average {})", b.name, load());
        let started = std::time::Instant::now();
        let result = (b.run)(&ctx, b.name, &settings);
        if children::stopping() {
            // A signal stopped the plugins under the benchmark: its failure
            // is no result; the signal watcher ends the process.
            loop {
                std::thread::park();
            }
        }
        match result {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("bench: {} failed: {e:?}", b.name);
                rows.push(Row::with(
                    b.name,
                    "benchmark",
                    "",
                    Values::Missing(summary(&e)),
                ));
                failed.push(b.name);
            }
        }
        eprintln!(
            "bench: {} took {:.1} s",
            b.name,
            started.elapsed().as_secs_f64()
        );
    }
    println!("Started {before}; ended with load average {}.\n", load());
    print!("{}", table::render(&rows));
    if !failed.is_empty() {
        bail!("benchmarks failed: {}", failed.join(", "));
    }
    Ok(())
}

/// An error in one line for the table: its first line and, when it goes
/// on (a plugin log), its last non-empty line.
fn summary(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default();
    match lines.next_back() {
        Some(last) => format!("{first} … {last}").replace('|', "/"),
        None => first.replace('|', "/"),
    }
}

/// The scratch directories, removed on drop: `/tmp/bench-<pid>` (short,
/// for socket paths) and, where `/dev/shm` is a tmpfs,
/// `/dev/shm/bench-<pid>` for what a node keeps in memory.
struct Scratch {
    disk: PathBuf,
    volatile: PathBuf,
    /// `--keep`: left in place at the end.
    keep: bool,
}

impl Scratch {
    fn create(keep: bool) -> anyhow::Result<Self> {
        let base = std::env::var_os("BENCH_DISK_DIR").unwrap_or_else(|| "/tmp".into());
        let disk = PathBuf::from(base).join(format!("bench-{}", std::process::id()));
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let volatile = if shm_is_tmpfs(&mounts) {
            PathBuf::from(format!("/dev/shm/bench-{}", std::process::id()))
        } else {
            disk.join("volatile")
        };
        for dir in [&disk, &volatile] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // The volatile one first: it may be inside the disk one.
        children::register_scratch(&[&volatile, &disk]);
        Ok(Self {
            disk,
            volatile,
            keep,
        })
    }
}

/// Whether `/proc/mounts` shows `/dev/shm` as a tmpfs.
fn shm_is_tmpfs(mounts: &str) -> bool {
    mounts.lines().any(|l| {
        let mut f = l.split_whitespace().skip(1);
        f.next() == Some("/dev/shm") && f.next() == Some("tmpfs")
    })
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "bench: kept {} and {}",
                self.disk.display(),
                self.volatile.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.volatile);
        let _ = std::fs::remove_dir_all(&self.disk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench runs the plugin with the environment it is deployed with.
    #[test]
    fn deployed_env_matches_the_image_and_the_chart() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
        let daemonset = std::fs::read_to_string(
            root.join("deployments/helm/gpu-dra-driver/templates/kubelet-plugin-daemonset.yaml"),
        )
        .unwrap();
        for (key, value) in DEPLOYED_ENV {
            let image = format!("ENV {key}={value}");
            assert_eq!(
                dockerfile.matches(&image).count(),
                2,
                "both plugin images set {image}"
            );
            let chart = format!("- name: {key}\n              value: \"{value}\"");
            assert!(daemonset.contains(&chart), "the DaemonSet sets {chart}");
        }
    }

    /// The bench measures the plugin as the image ships it: the same
    /// profile, from the same place in the target directory.
    #[test]
    fn the_plugin_is_built_as_the_image_builds_it() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
        let build = format!("cargo {} --locked", BUILDS[0].join(" "));
        assert!(dockerfile.contains(&build), "the image runs `{build}`");
        assert!(dockerfile.contains("cp target/plugin/gpu-kubelet-plugin "));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[profile.plugin]\ninherits = \"release\"\n"));
    }

    #[test]
    fn the_plugin_is_looked_up_in_the_plugin_profile_directory() {
        assert_eq!(
            plugin_next_to(Path::new("/w/target/release/bench")).unwrap(),
            Path::new("/w/target/plugin/gpu-kubelet-plugin")
        );
        let err = plugin_next_to(Path::new("bench")).unwrap_err().to_string();
        assert!(err.contains("not in a cargo target directory"), "{err}");
    }

    #[test]
    fn env_pairs_parse() {
        assert_eq!(
            parse_env("MALLOC_ARENA_MAX=1").unwrap(),
            ("MALLOC_ARENA_MAX".to_owned(), "1".to_owned())
        );
        assert_eq!(parse_env("A=").unwrap(), ("A".to_owned(), String::new()));
        for bad in ["", "=1", "NOEQUALS"] {
            assert!(parse_env(bad).unwrap_err().contains("KEY=VALUE"), "{bad:?}");
        }
    }

    #[test]
    fn errors_fit_one_table_cell() {
        let e = anyhow::anyhow!("the plugin exited with 1:\nlog line\n\nerror: no | config\n");
        assert_eq!(
            summary(&e),
            "the plugin exited with 1: … error: no / config"
        );
        assert_eq!(summary(&anyhow::anyhow!("short")), "short");
    }

    #[test]
    fn shm_is_found_only_as_a_tmpfs() {
        let tmpfs = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw,nosuid 0 0\n";
        assert!(shm_is_tmpfs(tmpfs));
        assert!(!shm_is_tmpfs(
            "/dev/vda / ext4 rw 0 0\n/dev/vda /dev/shm ext4 rw 0 0\n"
        ));
        assert!(!shm_is_tmpfs(""));
    }

    #[test]
    fn benchmark_names_are_unique() {
        let mut names: Vec<&str> = BENCHMARKS.iter().map(|b| b.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BENCHMARKS.len());
    }
}
