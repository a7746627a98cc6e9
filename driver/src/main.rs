//! `gpu-kubelet-plugin` entry point: flags, logging, the metrics endpoint
//! and signal handling around [`Plugin`] (NVML discovery, the kube client,
//! the kubelet-facing gRPC servers, the ResourceSlice publisher). Startup
//! errors are printed as one `error: ...` line with a non-zero exit (2 for
//! bad flags, 1 otherwise); SIGTERM/SIGINT deregister, drain and exit 0.
//! With `--supervise` this process only starts the plugin as its child and
//! keeps it running ([`supervise`]).

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::grpc::{self, metrics::GrpcMetrics};
use gpu_kubelet_plugin::plugin::Plugin;
use gpu_kubelet_plugin::prepare::mps::launch;
use gpu_kubelet_plugin::supervise;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

fn main() -> ExitCode {
    // Started as the MPS daemon launcher: nothing else may run first.
    if let Some(code) = launch::run_if_asked() {
        return code;
    }
    let mut flags: Flags = match gpu_dra_cmdline::parse_flags() {
        Ok(f) => f,
        Err(code) => return code,
    };
    // This very program, even after its file was replaced on disk.
    flags.mps_launcher = Some(launch::SELF_EXE.into());
    gpu_dra_cmdline::init_logging(flags.log_format);
    if flags.supervise {
        return supervise();
    }
    // The async work (kubelet gRPC, claim reads and status writes,
    // publishing) on `--runtime-threads` threads, one by default; NVML
    // calls and file writes run on the blocking pool either way. One
    // thread and one malloc arena (MALLOC_ARENA_MAX=1 in the images and the
    // DaemonSet) keep the plugin's memory flat; with 64 claims at once on
    // 16 cores, more of both made the crowd 30% faster for 1 MiB more
    // (BENCHMARKS.md, "Claims at once on 16 cores").
    let builder = match flags.runtime_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
    };
    gpu_dra_cmdline::run(builder, run(flags))
}

/// `--supervise`: the same program with the same flags, minus that one, as
/// a child that is restarted when it dies.
fn supervise() -> ExitCode {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot find this program to start it supervised: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = supervise::child_args(std::env::args_os().skip(1));
    match supervise::run(&program, &args, &supervise::Policy::default()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let mut registry = Registry::with_prefix("gpu_kubelet_plugin");
    let metrics = GrpcMetrics::register(&mut registry);
    let (stop_metrics, metrics_stopped) = watch::channel(false);
    let metrics_task = match flags.metrics_addr {
        Some(addr) => {
            let registration = flags
                .kubelet_registrar_dir
                .join(format!("{}-reg.sock", flags.driver_name));
            Some(start_metrics(addr, registry, registration, metrics_stopped).await?)
        }
        None => None,
    };

    // Install the handlers before starting, so a signal during startup is
    // not lost to the default action: it is acted on once the plugin runs.
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;

    let services = grpc::Services {
        metrics,
        ..grpc::Services::default()
    };
    // NVML and discovery, the kube client, the kubelet sockets, then the
    // ResourceSlice publisher in the background.
    let mut plugin = Plugin::start(&flags, services).await?;
    let result = tokio::select! {
        _ = sigterm.recv() => { tracing::info!("SIGTERM received; shutting down"); Ok(()) }
        _ = sigint.recv() => { tracing::info!("SIGINT received; shutting down"); Ok(()) }
        e = plugin.stopped() => Err(e),
    };
    // Registration socket first, then the drain, then the publisher.
    let shutdown = plugin.shutdown().await;
    stop_metrics.send_replace(true);
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    result?;
    shutdown?;
    Ok(())
}

/// Binds the metrics endpoint (failing startup if the address is taken)
/// and serves `/metrics` (OpenMetrics text) and `/healthz` until stopped.
/// `/healthz` is the liveness probe through the registration socket: 200
/// when a connection to it is accepted (the gRPC server kubelet talks to
/// is alive), 503 otherwise (Kubernetes' gRPC probes reach TCP only).
async fn start_metrics(
    addr: SocketAddr,
    registry: Registry,
    registration: std::path::PathBuf,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use axum::http::StatusCode;
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;
    use std::sync::Arc;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on metrics address {addr}"))?;
    let bound = listener
        .local_addr()
        .context("metrics listener has no address")?;
    tracing::info!(addr = %bound, "metrics endpoint listening");
    let registry = Arc::new(registry);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) => (
                            StatusCode::OK,
                            [(
                                CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        ),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
                            e.to_string(),
                        ),
                    }
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let socket = registration.clone();
                async move {
                    let probe = tokio::time::timeout(
                        std::time::Duration::from_secs(1),
                        tokio::net::UnixStream::connect(&socket),
                    )
                    .await;
                    match probe {
                        Ok(Ok(_)) => (StatusCode::OK, "ok".to_owned()),
                        Ok(Err(e)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("registration socket {}: {e}", socket.display()),
                        ),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("registration socket {}: no answer in 1 s", socket.display()),
                        ),
                    }
                }
            }),
        );
    Ok(tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    }))
}
