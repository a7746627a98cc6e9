//! The cluster's DeviceClasses, kept current by a kube-runtime reflector,
//! for the webhook's claim checks ([`ClassLookup`]). While the API server is
//! unreachable the cache is simply empty or stale: claims then get no
//! class-based checks, and the webhook keeps serving.

use std::sync::Arc;

use futures::StreamExt as _;
use gpu_dra_analysis::validate::ClassLookup;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

/// A [`ClassLookup`] over the reflector's store of `resource.k8s.io/v1`
/// DeviceClasses. Cheap to clone.
#[derive(Clone)]
pub struct ClusterClasses {
    store: Store<DeviceClass>,
}

impl std::fmt::Debug for ClusterClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClasses")
            .field("classes", &self.store.len())
            .finish()
    }
}

/// The background task feeding a [`ClusterClasses`]; aborted when dropped.
#[derive(Debug)]
pub struct ClassWatch(JoinHandle<()>);

impl Drop for ClassWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ClusterClasses {
    /// Starts watching DeviceClasses through `client` (list, then watch,
    /// with kube-runtime's default backoff on errors) and returns the
    /// lookup and the task, which runs until the returned [`ClassWatch`] is
    /// dropped.
    pub fn start(client: Client) -> (ClusterClasses, ClassWatch) {
        let (store, writer) = reflector::store();
        let api: Api<DeviceClass> = Api::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut failing = false;
            while let Some(item) = stream.next().await {
                match item {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!("DeviceClass watch recovered");
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "DeviceClass watch failed; claims are checked without class information until it recovers");
                    }
                    Err(e) => tracing::debug!(error = %e, "DeviceClass watch still failing"),
                }
            }
        });
        (ClusterClasses { store }, ClassWatch(task))
    }

    /// Whether the first full list has arrived.
    pub fn is_synced(&self) -> bool {
        matches!(
            futures::FutureExt::now_or_never(self.store.wait_until_ready()),
            Some(Ok(()))
        )
    }

    /// Waits for the first full list.
    pub async fn wait_synced(&self) {
        // Errs only when the writer is gone (the watch stopped).
        let _ = self.store.wait_until_ready().await;
    }

    /// How many classes are known.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no class is known.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}

impl ClassLookup for ClusterClasses {
    fn device_class(&self, name: &str) -> Option<serde_json::Value> {
        let class: Arc<DeviceClass> = self.store.get(&ObjectRef::new(name))?;
        serde_json::to_value(&*class).ok()
    }
}
