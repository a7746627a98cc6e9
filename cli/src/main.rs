//! `gpu-dra`: the admin CLI. `lint` checks DeviceClass and claim manifests
//! offline with the webhook's validation engine, `simulate` tells whether a
//! claim would be allocated (and why not), and `demo` runs the node side of
//! the driver on a simulated GPU machine.

mod demo;
mod lint;
mod manifest;
mod shipped;
mod simulate;

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
    /// Run the kubelet plugin on a simulated GPU node (fake NVML, API server
    /// stand-in, simulated kubelet) and show what it publishes.
    Demo(demo::Args),
    /// Validate DeviceClass, ResourceClaim and ResourceClaimTemplate YAML offline, with the
    /// same engine as the admission webhook. Exit status 1 on errors.
    Lint(lint::Args),
    /// Tell which devices on which node a claim would get, or why it cannot be allocated.
    /// Exit status 1 when it cannot.
    Simulate(simulate::Args),
}

/// Output format of `lint` and `simulate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// For people.
    Text,
    /// For programs.
    Json,
}

fn main() -> std::process::ExitCode {
    // The demo's plugin starts MPS daemons through this program (see
    // `launch`): nothing else may run first.
    if let Some(code) = gpu_kubelet_plugin::prepare::mps::launch::run_if_asked() {
        return code;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        // Exit status 2 when the command itself failed (usage, I/O), so that
        // 1 keeps meaning "the manifests have errors" / "does not fit".
        Command::Lint(args) => return report(lint::run(&args)),
        Command::Simulate(args) => return report(simulate::run(&args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The exit status of `lint` and `simulate`: theirs, or 2 with the error.
fn report(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        std::process::ExitCode::from(2)
    })
}
