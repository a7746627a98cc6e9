//! The controller's background work: the claim lifecycle (explain, in a
//! Warning Event, why a claim of ours stays unallocated: [`claims`]), the
//! ResourceSlice garbage collection ([`gc`]), their metrics ([`metrics`])
//! and the leader election that lets only one replica do them
//! ([`leader`]).
//!
//! [`start`] is what the binary calls (and [`Handle::stop`]); [`run`] is the same without the
//! flags and the shared registry (tests and embedding). While leading,
//! [`run`] keeps reflector caches of the ResourceSlices, DeviceClasses and
//! (metadata only) Nodes, a kube-runtime `Controller` over all
//! ResourceClaims (also triggered by changes of the DeviceClasses a claim
//! names), the allocation simulator thread and the GC loop. Losing the
//! lease stops all of them at once; they start afresh when it is won back.

pub mod claims;
mod error;
pub mod events;
mod flags;
pub mod gc;
pub mod leader;
pub mod metrics;
pub mod ours;
pub mod simulate;

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use gpu_dra_analysis::allocator::Allocator;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use tokio::sync::Notify;

pub use error::Error;
pub use flags::{Flags, Settings, parse_positive_duration};
pub use metrics::Metrics;

use self::claims::{Context, error_policy, reconcile};
use self::events::EventRecorder;
use self::gc::SliceGc;
use self::leader::LeaderElector;
use self::simulate::{Simulator, SimulatorStores};

/// The running lifecycle started by [`start`].
#[derive(Debug)]
pub struct Handle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Handle {
    /// Stops the lifecycle (a leader releases its lease) and waits for it.
    /// Returns the error it stopped with earlier, if any.
    pub async fn stop(self) -> Result<(), Error> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(result) => result,
            Err(err) if err.is_cancelled() => Ok(()),
            Err(err) => Err(Error::Stopped(err.to_string())),
        }
    }
}

/// Resolves `flags`, registers the metrics in `registry` and spawns
/// [`run`]; [`Handle::stop`] ends it. Call it from within the Tokio
/// runtime.
pub fn start(
    client: Client,
    flags: &Flags,
    driver: &str,
    registry: &crate::metrics::SharedRegistry,
) -> Result<Handle, Error> {
    let settings = flags.settings(driver)?;
    let metrics = Metrics::new();
    registry.register(|r| metrics.register(r));
    tracing::info!(
        identity = %settings.identity,
        leader_election = settings.leader_election.is_some(),
        slice_gc = settings.slice_gc.is_some(),
        "starting the claim lifecycle"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(async move {
        let result = run(client, settings, metrics, shutdown).await;
        if let Err(err) = &result {
            tracing::error!(error = %err, "the claim lifecycle and slice GC stopped");
        }
        result
    });
    Ok(Handle { stop, task })
}

/// Runs the claim lifecycle and slice GC (under leader election when
/// configured) until `shutdown` completes; a leader then releases its
/// lease. Returns early only on an error that retrying cannot fix.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let mut shutdown = std::pin::pin!(shutdown);
    let Some(lease) = settings.leader_election.clone() else {
        metrics.leader.set(1);
        return tokio::select! {
            result = Box::pin(lead(client, &settings, &metrics)) => result,
            () = &mut shutdown => Ok(()),
        };
    };
    lease.validate()?;
    let mut elector = LeaderElector::new(client.clone(), lease, metrics.clone());

    /// How a term of leadership ended.
    enum End {
        Failed(Error),
        Lost,
        Shutdown,
    }
    loop {
        let acquired = tokio::select! {
            () = elector.acquire() => true,
            () = &mut shutdown => false,
        };
        if !acquired {
            return Ok(());
        }
        let end = tokio::select! {
            result = Box::pin(lead(client.clone(), &settings, &metrics)) => match result {
                Ok(()) => End::Shutdown,
                Err(err) => End::Failed(err),
            },
            _ = elector.hold() => End::Lost,
            () = &mut shutdown => End::Shutdown,
        };
        match end {
            End::Lost => {
                tracing::warn!("stopped the claim lifecycle and slice GC: leadership lost");
            }
            End::Shutdown => {
                elector.release().await;
                return Ok(());
            }
            End::Failed(err) => {
                elector.release().await;
                return Err(err);
            }
        }
    }
}

/// The work of the leader; never returns `Ok` unless every stream ends.
async fn lead(client: Client, settings: &Settings, metrics: &Metrics) -> Result<(), Error> {
    let (slices, slice_writer) = reflector::store::<ResourceSlice>();
    let slice_cache = watcher(
        Api::<ResourceSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(slice_writer)
    .for_each(|event| {
        if let Err(err) = event {
            tracing::warn!(error = %err, "watching ResourceSlices");
        }
        std::future::ready(())
    });
    let (classes, class_writer) = reflector::store::<DeviceClass>();
    let class_cache = watcher(
        Api::<DeviceClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .for_each(|event| {
        if let Err(err) = event {
            tracing::warn!(error = %err, "watching DeviceClasses");
        }
        std::future::ready(())
    });

    let controller = Controller::new(
        Api::<ResourceClaim>::all(client.clone()),
        watcher::Config::default(),
    );
    let claims = controller.store();
    let by_class = claims.clone();
    let controller = controller.watches(
        Api::<DeviceClass>::all(client.clone()),
        watcher::Config::default(),
        move |class: DeviceClass| {
            let name = class.metadata.name.unwrap_or_default();
            by_class
                .state()
                .into_iter()
                .filter(|claim| ours::claim_class_names(claim).contains(&name.as_str()))
                .map(|claim| ObjectRef::from_obj(&*claim))
                .collect::<Vec<_>>()
        },
    );
    let simulator = Simulator::start(
        SimulatorStores {
            slices: slices.clone(),
            classes: classes.clone(),
            claims: claims.clone(),
        },
        Allocator::new(),
        metrics.clone(),
    )?;
    let recorder = EventRecorder::new(
        client.clone(),
        &settings.reporting_controller,
        &settings.identity,
    );
    let context = Arc::new(Context::new(
        settings.claims.clone(),
        claims,
        classes,
        slices.clone(),
        simulator,
        recorder,
        metrics.clone(),
    ));
    let claim_loop = controller
        .run(reconcile, error_policy, context)
        .for_each(|result| {
            match result {
                // error_policy has logged failed reconciles; deleted
                // claims are nothing to report.
                Ok(_)
                | Err(
                    kube::runtime::controller::Error::ObjectNotFound(_)
                    | kube::runtime::controller::Error::ReconcilerFailed(..),
                ) => {}
                Err(err) => tracing::warn!(error = %err, "claim controller"),
            }
            std::future::ready(())
        });

    let gc = async {
        let Some(gc_settings) = settings.slice_gc else {
            return std::future::pending::<()>().await;
        };
        let (nodes, node_writer) = reflector::store();
        let node_deleted = Arc::new(Notify::new());
        let notify = Arc::clone(&node_deleted);
        let node_cache = watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default(),
        )
            .default_backoff()
            .reflect(node_writer)
            .for_each(move |event| {
                match event {
                    Ok(watcher::Event::Delete(node)) => {
                        tracing::info!(node = ?node.metadata.name, "Node deleted: collecting its ResourceSlices");
                        notify.notify_one();
                    }
                    Ok(_) => {}
                    Err(err) => tracing::warn!(error = %err, "watching Nodes"),
                }
                std::future::ready(())
            });
        let collector = SliceGc::new(
            client.clone(),
            &settings.claims.driver,
            gc_settings,
            slices.clone(),
            nodes,
            metrics.clone(),
        );
        tokio::join!(node_cache, collector.run(node_deleted));
    };

    tokio::join!(slice_cache, class_cache, claim_loop, gc);
    Ok(())
}
