//! `gpu-dra`: the admin CLI. Today it has one subcommand, `demo`, which runs
//! the node side of the driver on a simulated GPU machine; `lint` and
//! `simulate` come with the controller work.

mod demo;

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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
