//! `test-apiserver`: runs the stand-in API server (`gpu_dra_sim::apiserver`) until SIGINT/SIGTERM.
//!
//! Prints the server URL on stdout (one line) once it accepts connections, after writing the
//! kubeconfig if `--kubeconfig-out` is given.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer, ValidationRules};

/// A small Kubernetes API server for end-to-end tests and the demo.
#[derive(Debug, Parser)]
#[command(name = "test-apiserver", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "TEST_APISERVER_ADDR", default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Write a kubeconfig for this server to FILE.
    #[arg(long, env = "TEST_APISERVER_KUBECONFIG_OUT", value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// ResourceSlice validation rules: 1.34 or 1.35 (1.35 and later).
    #[arg(long, env = "TEST_APISERVER_RULES", default_value = "1.35", value_parser = parse_rules)]
    rules: ValidationRules,
    /// Interval of watch bookmarks, in milliseconds.
    #[arg(
        long,
        env = "TEST_APISERVER_BOOKMARK_INTERVAL_MS",
        default_value_t = 5000
    )]
    bookmark_interval_ms: u64,
}

fn parse_rules(s: &str) -> Result<ValidationRules, String> {
    s.parse()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = TestApiServer::start(ServerOptions {
        addr: args.addr,
        rules: args.rules,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms.max(10)),
        ..ServerOptions::default()
    })
    .await
    .context("starting the test API server")?;
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing the kubeconfig to {}", path.display()))?;
    }
    println!("{}", server.url());
    tracing::info!(url = %server.url(), rules = %args.rules, "ready");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await.context("shutting down")?;
    Ok(())
}
