//! `gpu-kubelet-plugin` entry point: flags, logging, the metrics endpoint
//! and signal handling around [`Plugin`] (NVML discovery, the kube client,
//! the kubelet-facing gRPC servers, the ResourceSlice publisher). Startup
//! errors are printed as one `error: ...` line with a non-zero exit (2 for
//! bad flags, 1 otherwise); SIGTERM/SIGINT deregister, drain and exit 0.
//! With `--supervise` this process only starts the plugin (or the MPS
//! daemon host) as its child and keeps it running ([`supervise`]).
//! `mps-launch ...` runs the MPS daemon launcher ([`launch`]) and
//! `mps-host --socket <path>` the MPS daemon host ([`host`]) instead of the
//! plugin.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::grpc::{self, metrics::GrpcMetrics};
use gpu_kubelet_plugin::health::metrics::HealthMetrics;
use gpu_kubelet_plugin::phase::{self, Phase};
use gpu_kubelet_plugin::plugin::{self, Plugin};
use gpu_kubelet_plugin::prepare::mps::{host, launch};
use gpu_kubelet_plugin::supervise;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

fn main() -> ExitCode {
    // Started as the MPS daemon launcher: nothing else may run first.
    if let Some(code) = launch::run_if_asked() {
        return code;
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(host_args) = host::asked(&args) {
        return mps_host(host_args);
    }
    let mut flags: Flags = match gpu_dra_cmdline::parse_flags() {
        Ok(f) => f,
        Err(code) => return code,
    };
    // This very program, even after its file was replaced on disk.
    flags.mps_launcher = Some(launch::SELF_EXE.into());
    gpu_dra_cmdline::init_logging(flags.log_format);
    if flags.supervise {
        return supervise("plugin", &supervise::Policy::default());
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

/// `mps-host`: the MPS daemon host ([`host`]) until SIGTERM or SIGINT.
fn mps_host(args: Vec<std::ffi::OsString>) -> ExitCode {
    let flags: host::HostFlags = match gpu_dra_cmdline::parse_flags_from(args) {
        Ok(f) => f,
        Err(code) => return code,
    };
    gpu_dra_cmdline::init_logging(flags.log_format);
    if flags.supervise {
        // A stray SIGTERM to the host process alone must not end the
        // container, and its daemons with it.
        let policy = supervise::Policy {
            restart_clean_exits: true,
            ..supervise::Policy::default()
        };
        return supervise("MPS daemon host", &policy);
    }
    gpu_dra_cmdline::run(tokio::runtime::Builder::new_current_thread(), async move {
        // Its own program as the launcher: `run_if_asked` runs first above.
        host::serve(
            &flags.socket,
            std::path::Path::new(launch::SELF_EXE),
            &flags.driver_root,
        )
        .await
        .context("MPS daemon host")
    })
}

/// `--supervise` (of the plugin or of `mps-host`): the same program with the
/// same arguments, minus that flag, as a child that is restarted when it
/// dies; `what` names it in the log.
fn supervise(what: &str, policy: &supervise::Policy) -> ExitCode {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot find this program to start it supervised: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = supervise::child_args(std::env::args_os().skip(1));
    match supervise::run(what, &program, &args, policy) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut flags: Flags) -> anyhow::Result<()> {
    // One client for the Node's kubelet version and the plugin itself.
    let client = plugin::kube_client(flags.kubeconfig.as_deref()).await?;
    tracing::info!("Kubernetes client ready");
    flags.instance = plugin::choose_instance(&flags, &client).await;
    let config = plugin::grpc_config(&flags);
    // Ours under `gpu_kubelet_plugin_`, NVIDIA's `nvidia_dra_*` beside them.
    let mut registry = Registry::default();
    let metrics = GrpcMetrics::register_with_nvidia(
        &mut registry,
        "gpu_kubelet_plugin",
        &flags.driver_name,
        &flags.node_name,
    );
    // The health monitor's under the names of issue #43, unprefixed.
    let health_metrics = HealthMetrics::register(&mut registry);
    let services = plugin::Services {
        grpc: grpc::Services {
            metrics,
            ..grpc::Services::default()
        },
        health_metrics,
    };
    let (stop_metrics, metrics_stopped) = watch::channel(false);
    let (phase_tx, mut phase) = phase::channel();
    let metrics_task = match flags.metrics_addr {
        Some(addr) => {
            let probes = Probes {
                registration: config.registration_socket(),
                registered: flags
                    .instance
                    .is_some()
                    .then(|| services.grpc.registration.subscribe()),
                phase: phase.clone(),
            };
            Some(start_metrics(addr, registry, probes, metrics_stopped).await?)
        }
        None => None,
    };

    // Install the handlers before starting, so a signal during startup is
    // not lost to the default action: it is acted on once the plugin runs.
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;

    // NVML and discovery, the kubelet sockets, then the
    // ResourceSlice publisher in the background.
    let start = Plugin::start(&flags, client, services, phase_tx);
    tokio::pin!(start);
    let mut signalled = None;
    let mut plugin = loop {
        tokio::select! {
            plugin = &mut start => break plugin?,
            name = next_signal(&mut sigterm, &mut sigint), if signalled.is_none() => {
                signalled = Some(name);
            }
            // A rolling update's new instance waits for the old one to
            // exit; a signal then (the rollout undone, the pod deleted)
            // ends it at once: it holds nothing of the node's yet, only
            // its own sockets when it has names of its own (kubelet
            // deregisters it, and calls the old one again). Exiting the
            // process is the only way out, since the wait blocks a thread
            // the runtime would wait for.
            _ = phase.wait_for(|p| matches!(p, Phase::WaitingFor(_))), if signalled.is_some() => {
                tracing::info!(signal = signalled.unwrap_or_default(), "signal received while waiting for the other plugin instance; exiting");
                config.remove_instance_files();
                std::process::exit(0);
            }
        }
    };
    let result = if let Some(name) = signalled {
        tracing::info!("{name} received during startup; shutting down");
        Ok(())
    } else {
        tokio::select! {
            name = next_signal(&mut sigterm, &mut sigint) => { tracing::info!("{name} received; shutting down"); Ok(()) }
            e = plugin.stopped() => Err(e),
        }
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

/// The name of the next SIGTERM or SIGINT.
async fn next_signal(
    sigterm: &mut tokio::signal::unix::Signal,
    sigint: &mut tokio::signal::unix::Signal,
) -> &'static str {
    tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    }
}

/// What the probes look at: the registration socket kubelet dials, how
/// far the start has got, and with per-instance sockets kubelet's
/// registration verdict.
#[derive(Clone)]
struct Probes {
    registration: std::path::PathBuf,
    /// With per-instance sockets: what kubelet said of this instance.
    registered: Option<watch::Receiver<grpc::RegistrationStatus>>,
    phase: watch::Receiver<Phase>,
}

impl Probes {
    /// `/healthz` (liveness): 200 while a connection to the registration
    /// socket is accepted (the gRPC server kubelet talks to is alive), and
    /// while waiting for another instance to exit (alive, and not to be
    /// restarted for it); 503 otherwise.
    async fn live(&self) -> (axum::http::StatusCode, String) {
        match self.phase() {
            Phase::WaitingFor(lock) => waiting(&lock),
            Phase::Starting | Phase::Serving => self.socket().await,
        }
    }

    /// `/readyz` (readiness): 503 while starting; 200 while waiting for
    /// another instance to exit (ready to take over: NVML, discovery and
    /// the kube client all worked, so the DaemonSet may delete the old
    /// pod), with per-instance sockets only once kubelet has registered
    /// this instance (else the old pod could go before kubelet knows the
    /// new one); once serving, as `/healthz`.
    async fn ready(&self) -> (axum::http::StatusCode, String) {
        match self.phase() {
            Phase::WaitingFor(lock) => match &self.registered {
                None => waiting(&lock),
                Some(status) => match &*status.borrow() {
                    grpc::RegistrationStatus::Registered => waiting(&lock),
                    grpc::RegistrationStatus::Pending => (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "waiting for kubelet to register this instance".to_owned(),
                    ),
                    grpc::RegistrationStatus::Rejected(reason) => (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        format!("kubelet rejected this instance: {reason}"),
                    ),
                },
            },
            Phase::Starting => (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "starting".to_owned(),
            ),
            Phase::Serving => self.socket().await,
        }
    }

    fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    async fn socket(&self) -> (axum::http::StatusCode, String) {
        use axum::http::StatusCode;
        let socket = &self.registration;
        let probe = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            tokio::net::UnixStream::connect(socket),
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
}

/// A probe's answer while waiting for the instance that holds `lock`.
fn waiting(lock: &std::path::Path) -> (axum::http::StatusCode, String) {
    (
        axum::http::StatusCode::OK,
        format!(
            "waiting for the plugin instance that holds {} to exit",
            lock.display()
        ),
    )
}

/// Binds the metrics endpoint (failing startup if the address is taken)
/// and serves `/metrics` (OpenMetrics text), `/healthz` and `/readyz` (see
/// [`Probes`]) until stopped. The probes dial the registration socket
/// themselves because Kubernetes' gRPC probes reach TCP only.
async fn start_metrics(
    addr: SocketAddr,
    registry: Registry,
    probes: Probes,
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
            get({
                let probes = probes.clone();
                move || async move { probes.live().await }
            }),
        )
        .route("/readyz", get(move || async move { probes.ready().await }));
    Ok(tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    }))
}
