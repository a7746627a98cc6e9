//! `kubelet-sim`: play kubelet against a DRA plugin from the shell.
//!
//! ```text
//! kubelet-sim --registrar-dir DIR [--driver NAME] register
//! kubelet-sim --registrar-dir DIR prepare --claim ns/name/uid [--claim ...]
//! kubelet-sim --registrar-dir DIR unprepare --claim ns/name/uid [--claim ...]
//! kubelet-sim --registrar-dir DIR health [--count N]
//! kubelet-sim --registrar-dir DIR watch
//! ```
//!
//! Every command first registers the plugin (GetInfo, checks, version
//! choice, NotifyRegistrationStatus), then prints JSON on stdout (one
//! document, or one line per event for `health` and `watch`). Errors are one
//! `error: ...` line on stderr and exit code 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use gpu_dra_sim::kubelet::{Claim, DraVersion, KubeletSim, Plugin};

#[derive(Debug, clap::Parser)]
#[command(name = "kubelet-sim", about = "Simulate kubelet against a DRA plugin")]
struct Args {
    /// Directory the plugin creates its registration socket in.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registrar_dir: PathBuf,

    /// Driver name: the socket used is `<registrar-dir>/<driver>-reg.sock`.
    #[arg(long, default_value = "gpu.nvidia.com")]
    driver: String,

    /// Registration socket to use instead of the one derived from the above.
    #[arg(long)]
    socket: Option<PathBuf>,

    /// DRAPlugin versions this kubelet knows (comma-separated).
    #[arg(long, value_delimiter = ',', default_values = ["v1.DRAPlugin", "v1beta1.DRAPlugin"], value_parser = parse_version)]
    dra_versions: Vec<DraVersion>,

    /// Seconds to wait for the registration socket to appear.
    #[arg(long, default_value_t = 10)]
    wait: u64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Register the plugin and print what was registered.
    Register,
    /// Register, then NodePrepareResources.
    Prepare {
        /// A claim as namespace/name/uid.
        #[arg(long = "claim", required = true)]
        claims: Vec<Claim>,
    },
    /// Register, then NodeUnprepareResources.
    Unprepare {
        /// A claim as namespace/name/uid.
        #[arg(long = "claim", required = true)]
        claims: Vec<Claim>,
    },
    /// Register, then print health stream messages.
    Health {
        /// Stop after this many messages (default: run until interrupted).
        #[arg(long)]
        count: Option<usize>,
    },
    /// Watch the registrar directory and print registration events.
    Watch,
}

fn parse_version(s: &str) -> Result<DraVersion, String> {
    DraVersion::parse(s).ok_or_else(|| format!("unknown DRAPlugin version {s:?}"))
}

fn main() -> ExitCode {
    let args: Args = match gpu_dra_cmdline::parse_flags() {
        Ok(a) => a,
        Err(code) => return code,
    };
    gpu_dra_cmdline::run(tokio::runtime::Builder::new_multi_thread(), run(args))
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string(v).context("cannot encode output")?
    );
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let sim = KubeletSim::new().with_dra_versions(args.dra_versions.clone());
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| args.registrar_dir.join(format!("{}-reg.sock", args.driver)));
    match args.command {
        Command::Watch => watch(&sim, args.registrar_dir).await,
        Command::Register => print_json(&register(&sim, &socket, args.wait).await?),
        Command::Prepare { claims } => {
            let plugin = register(&sim, &socket, args.wait).await?;
            print_json(&plugin.prepare(&claims).await?)
        }
        Command::Unprepare { claims } => {
            let plugin = register(&sim, &socket, args.wait).await?;
            print_json(&plugin.unprepare(&claims).await?)
        }
        Command::Health { count } => {
            let plugin = register(&sim, &socket, args.wait).await?;
            let mut stream = plugin.watch_health().await?;
            let mut seen = 0;
            while count.is_none_or(|c| seen < c) {
                match stream.next().await {
                    Some(devices) => print_json(&devices?)?,
                    None => break,
                }
                seen += 1;
            }
            Ok(())
        }
    }
}

/// Prints registrar events until interrupted.
async fn watch(sim: &KubeletSim, dir: PathBuf) -> anyhow::Result<()> {
    let mut registrar = sim.watch_registrar(dir);
    loop {
        match registrar.next_event(Duration::from_secs(3600)).await {
            Ok(event) => print_json(&event)?,
            Err(gpu_dra_sim::kubelet::Error::Wait(..)) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits for the registration socket, then registers the plugin.
async fn register(sim: &KubeletSim, socket: &Path, wait: u64) -> anyhow::Result<Plugin> {
    let deadline = Instant::now() + Duration::from_secs(wait);
    while !socket.exists() {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "registration socket {} did not appear within {wait} s",
                socket.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(sim.register(socket).await?)
}
