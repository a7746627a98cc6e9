//! Kubernetes Events on the plugin's Node at each health transition:
//! `events.k8s.io/v1` Events in namespace `default` (where Node events live),
//! `regarding` the Node, with the tracker's reason ([`REASON_UNHEALTHY`],
//! `GpuDegraded`, `GpuUnmonitored`: Warning; [`REASON_RECOVERED`] and
//! [`REASON_NOT_PROBED`], a GPU handed to a VM: Normal),
//! reported as `<driver>/kubelet-plugin`.
//!
//! Recording runs on a task of its own and never holds up the monitor: an
//! API server that is down costs a logged warning, not a stalled heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// The reasons, as the tracker's transitions carry them.
pub use super::tracker::{REASON_NOT_PROBED, REASON_RECOVERED, REASON_UNHEALTHY};
/// The Event's `action`.
pub const ACTION: &str = "HealthCheck";
/// Longest `note` the API accepts.
pub const NOTE_MAX_BYTES: usize = 1024;
/// Longest `reportingInstance` the API accepts.
const INSTANCE_MAX: usize = 128;
/// Keeps the names of Events made in the same nanosecond apart.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Records Events on one Node.
#[derive(Clone)]
pub struct NodeEvents {
    client: kube::Client,
    node: String,
    controller: String,
    instance: String,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEvents")
            .field("node", &self.node)
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

impl NodeEvents {
    /// A recorder of Events on Node `node`, reported by `driver`'s plugin.
    pub fn new(client: kube::Client, node: &str, driver: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
            controller: format!("{driver}/kubelet-plugin"),
            instance: cut(&format!("gpu-kubelet-plugin-{node}"), INSTANCE_MAX),
        }
    }

    /// Records one Event with `reason` in the background; a failure is
    /// logged.
    pub fn record(&self, reason: &str, note: &str) {
        let event = self.event(reason, note, Timestamp::now());
        let client = self.client.clone();
        tokio::spawn(async move {
            let api: Api<Event> = Api::namespaced(client, "default");
            if let Err(e) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(
                    error = %e,
                    reason = event.reason.as_deref().unwrap_or_default(),
                    "cannot record the health Event on the Node"
                );
            }
        });
    }

    /// The Event object for `reason` and `note` at `now`: `Normal` for
    /// [`REASON_RECOVERED`] and [`REASON_NOT_PROBED`], `Warning` otherwise.
    pub fn event(&self, reason: &str, note: &str, now: Timestamp) -> Event {
        let type_ = if reason == REASON_RECOVERED || reason == REASON_NOT_PROBED {
            "Normal"
        } else {
            "Warning"
        };
        Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}{:x}",
                    name_prefix(&self.node),
                    now.as_nanosecond().max(0),
                    SEQUENCE.fetch_add(1, Ordering::Relaxed) % 0x1_0000
                )),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_.to_owned()),
            reason: Some(reason.to_owned()),
            action: Some(ACTION.to_owned()),
            note: Some(super::tracker::cut(note, NOTE_MAX_BYTES)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.node.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// The node name as the first part of an Event name: at most 200 bytes,
/// so that the suffix fits in the 253 of a DNS subdomain, and never ending
/// in `.` or `-` where it was cut (the name would not be a subdomain).
fn name_prefix(node: &str) -> String {
    let mut prefix = cut(node, 200);
    while prefix.ends_with(['.', '-']) {
        prefix.pop();
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_fit_the_api_and_are_accepted_by_the_stand_in() {
        use gpu_dra_sim::apiserver::{Resource, Selectors, ServerOptions, TestApiServer};
        let server = TestApiServer::start(ServerOptions::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        // kube's own loader: this module sits below the plugin's wiring.
        let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let events = NodeEvents::new(client, "node-a", "gpu.nvidia.com");
        let long = "é".repeat(2000);
        let event = events.event(REASON_UNHEALTHY, &long, Timestamp::now());
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let recovered = events.event(REASON_RECOVERED, "ok", Timestamp::now());
        assert_eq!(recovered.type_.as_deref(), Some("Normal"));
        let handed_over = events.event(REASON_NOT_PROBED, "vfio-pci", Timestamp::now());
        assert_eq!(handed_over.type_.as_deref(), Some("Normal"));
        assert!(event.note.as_ref().unwrap().len() <= NOTE_MAX_BYTES);
        assert!(event.note.as_ref().unwrap().ends_with("..."));
        events.record(
            REASON_UNHEALTHY,
            "gpu-0: XID 79; recovery action NODE_REBOOT",
        );
        events.record(REASON_RECOVERED, "gpu-0: healthy again");
        events.record(REASON_RECOVERED, &long);
        let found = server
            .store()
            .wait_for(
                Resource::Events,
                std::time::Duration::from_secs(10),
                |items| items.len() == 3,
            )
            .await
            .unwrap_or_else(|last| panic!("{last:?}"));
        let reasons: Vec<&str> = found
            .iter()
            .map(|e| e["reason"].as_str().unwrap())
            .collect();
        assert!(reasons.contains(&REASON_UNHEALTHY), "{reasons:?}");
        assert!(reasons.contains(&REASON_RECOVERED), "{reasons:?}");
        for e in &found {
            assert_eq!(e["regarding"]["kind"], "Node");
            assert_eq!(e["regarding"]["name"], "node-a");
            assert_eq!(e["reportingController"], "gpu.nvidia.com/kubelet-plugin");
        }
        let (items, _) =
            server
                .store()
                .list(Resource::Events, Some("default"), &Selectors::default());
        assert_eq!(items.len(), 3);
        server.shutdown().await.unwrap();
    }

    #[test]
    fn a_long_node_name_is_cut_to_a_valid_event_name() {
        // Cut at 200 bytes, this node name ends in "-" and then ".".
        let node = format!("{}.-b", "a".repeat(198));
        assert_eq!(name_prefix(&node), "a".repeat(198));
        assert_eq!(name_prefix("node-a"), "node-a");
        let name = format!("{}.{:x}{:x}", name_prefix(&node), u64::MAX, 0xffff);
        assert!(gpu_dra_api::schema::is_dns_subdomain(&name), "{name}");
    }
}
