//! `gpu-dra-controller` entry point: flags, logging, the Kubernetes client,
//! the DeviceClass cache, the admission webhook and (started at the marked
//! spot) the claim lifecycle; SIGTERM/SIGINT stop everything gracefully.
//! Startup errors are one `error: ...` line with a non-zero exit (2 for bad
//! flags, 1 otherwise).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use gpu_dra_analysis::validate::{ClassLookup, StaticClasses, Validator};
use gpu_dra_controller::classes::ClusterClasses;
use gpu_dra_controller::flags::Flags;
use gpu_dra_controller::metrics::SharedRegistry;
use gpu_dra_controller::webhook::{Reviewer, WebhookServer};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let flags: Flags = match gpu_dra_cmdline::parse_flags() {
        Ok(f) => f,
        Err(code) => return code,
    };
    gpu_dra_cmdline::init_logging(flags.log_format);
    gpu_dra_cmdline::run(tokio::runtime::Builder::new_multi_thread(), run(flags))
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    // Install the handlers first, so a signal during startup is acted on
    // once everything runs instead of killing the process mid-way.
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;

    // Every part registers its metrics here; the webhook serves them.
    let registry = SharedRegistry::new();

    let client = gpu_dra_controller::client::connect(flags.kubeconfig.as_deref()).await?;
    if client.is_none() {
        tracing::warn!(
            "no kubeconfig and not running in a cluster: no DeviceClass cache, claims are \
             checked without class information"
        );
    }

    let webhook = if let Some(config) = flags.webhook.config() {
        let (classes, class_watch): (Arc<dyn ClassLookup + Send + Sync>, _) =
            if let Some(client) = &client {
                let (classes, watch) = ClusterClasses::start(client.clone());
                (Arc::new(classes), Some(watch))
            } else {
                (Arc::new(StaticClasses::default()), None)
            };
        let reviewer = Reviewer::new(Validator::new(&flags.driver_name), classes);
        let server = WebhookServer::start(config, reviewer, &registry).await?;
        Some((server, class_watch))
    } else {
        tracing::info!("admission webhook disabled (--no-webhook)");
        None
    };

    // ---- claim lifecycle + slice GC: start here ----
    // Inputs: `client` (Option<kube::Client>), `flags.lifecycle`,
    // `flags.driver_name`, `registry` (SharedRegistry::register for metrics).
    // Stop it after the signal below, before the webhook shuts down.
    let lifecycle = if let Some(client) = &client {
        Some(gpu_dra_controller::lifecycle::start(
            client.clone(),
            &flags.lifecycle,
            &flags.driver_name,
            &registry,
        )?)
    } else {
        tracing::warn!("no Kubernetes client: claim lifecycle and slice GC are off");
        None
    };
    // ---- end of claim lifecycle ----

    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM received, stopping"),
        _ = sigint.recv() => tracing::info!("SIGINT received, stopping"),
    }

    if let Some(lifecycle) = lifecycle
        && let Err(err) = lifecycle.stop().await
    {
        tracing::warn!(error = %err, "claim lifecycle");
    }
    if let Some((server, class_watch)) = webhook {
        server.shutdown().await;
        drop(class_watch);
    }
    Ok(())
}
