//! Shared fixtures of the lifecycle tests: a test API server, the real kube
//! client, our DeviceClass and another driver's, nodes, slices and claims,
//! and a controller task that stops when dropped.

#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use gpu_dra_controller::lifecycle::{self, Metrics, Settings};
use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Config};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const DRIVER: &str = "gpu.nvidia.com";
pub const NAMESPACE: &str = "team-a";

pub async fn server() -> (TestApiServer, Client) {
    let server = TestApiServer::start(ServerOptions {
        bookmark_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    })
    .await
    .expect("server starts");
    let config = Config::new(server.url().parse().expect("url parses"));
    let client = Client::try_from(config).expect("client builds");
    (server, client)
}

/// Settings with short timings for tests.
pub fn settings(identity: &str, grace: Duration) -> Settings {
    let mut s = Settings::new(DRIVER, identity);
    s.claims.grace_period = grace;
    s.claims.recheck_interval = Duration::from_millis(200);
    s.claims.unallocatable_recheck_interval = Duration::from_millis(200);
    s.claims.error_backoff = Duration::from_millis(200);
    s
}

/// A running `lifecycle::run`; stops (cleanly) when dropped or stopped.
pub struct Running {
    pub metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<Result<(), lifecycle::Error>>>,
}

impl Running {
    pub fn start(client: &Client, settings: Settings) -> Running {
        let metrics = Metrics::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(lifecycle::run(
            client.clone(),
            settings,
            metrics.clone(),
            shutdown,
        ));
        Running {
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops cleanly and waits (a leader releases its lease).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("task joins").expect("run ends cleanly");
        }
    }

    /// Kills the task without a clean stop (a crash: no release).
    pub async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Polls `check` every 25 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub async fn create<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("valid object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("object is created")
}

pub async fn our_class(client: &Client) -> DeviceClass {
    create(
        &Api::all(client.clone()),
        json!({
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}
        }),
    )
    .await
}

pub async fn other_class(client: &Client) -> DeviceClass {
    create(
        &Api::all(client.clone()),
        json!({
            "metadata": {"name": "nic.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}
        }),
    )
    .await
}

pub async fn node(client: &Client, name: &str) -> Node {
    create(
        &Api::all(client.clone()),
        json!({"metadata": {"name": name}}),
    )
    .await
}

pub fn gpu(i: usize, memory: &str) -> Value {
    json!({
        "name": format!("gpu-{i}"),
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"}
        },
        "capacity": {"memory": {"value": memory}}
    })
}

/// A slice of `driver` on `node` with `gpus` GPUs of `memory` each.
pub fn slice_json(name: &str, driver: &str, node: &str, gpus: usize, memory: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": (0..gpus).map(|i| gpu(i, memory)).collect::<Vec<_>>()
        }
    })
}

pub async fn slice(client: &Client, value: Value) -> ResourceSlice {
    create(&Api::all(client.clone()), value).await
}

/// A claim of one device of `class`, with a memory selector when given.
pub async fn claim(
    client: &Client,
    name: &str,
    class: &str,
    min_memory: Option<&str>,
) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": class});
    if let Some(memory) = min_memory {
        exactly["selectors"] = json!([{"cel": {"expression": format!(
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{memory}')) >= 0"
        )}}]);
    }
    create(
        &Api::namespaced(client.clone(), NAMESPACE),
        json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
        }),
    )
    .await
}

/// The Events regarding `claim`.
pub async fn events_of(client: &Client, claim: &ResourceClaim) -> Vec<Event> {
    let uid = claim.metadata.uid.as_deref().expect("claim has a uid");
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().fields(&format!("regarding.uid={uid}")))
        .await
        .expect("events list")
        .items
}
