//! `gpu-dra`: the admin CLI. `lint` checks DeviceClass and claim manifests
//! offline with the webhook's validation engine, `simulate` tells whether a
//! claim would be allocated (and why not), and `health` shows the GPU health
//! taints the kubelet plugin published. The demo (the node
//! side of the driver on a simulated GPU machine) is a program of its own,
//! `gpu-dra-demo`.

mod cluster;
mod health;
mod lint;
mod simulate;

use gpu_dra::{manifest, shipped};

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra", version, about = "Admin CLI of the GPU DRA driver")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate DeviceClass, ResourceClaim and ResourceClaimTemplate YAML offline, with the
    /// same engine as the admission webhook. Exit status 1 on errors.
    Lint(lint::Args),
    /// Tell which devices on which node a claim would get, or why it cannot be allocated.
    /// Exit status 1 when it cannot.
    Simulate(simulate::Args),
    /// Show the GPU health taints published in the driver's ResourceSlices, per node and GPU,
    /// with what each means. Exit status 1 when a device is unschedulable.
    Health(health::Args),
}

/// Output format of `lint`, `simulate` and `health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// For people.
    Text,
    /// For programs.
    Json,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Exit status 2 when the command itself failed (usage, I/O), so that
    // 1 keeps meaning "the manifests have errors" / "does not fit".
    match cli.command {
        Command::Lint(args) => report(lint::run(&args)),
        Command::Simulate(args) => report(simulate::run(&args)),
        Command::Health(args) => report(health::run(&args)),
    }
}

/// The exit status of a subcommand: theirs, or 2 with the error.
fn report(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        std::process::ExitCode::from(2)
    })
}
