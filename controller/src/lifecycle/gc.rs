//! ResourceSlice garbage collection: deletes the slices of our driver whose
//! Node no longer exists (`spec.nodeName` names no Node, or an owner
//! reference names a Node that is gone or was recreated under a new UID).
//!
//! Deleting a live node's slices would take its GPUs out of scheduling, so
//! the collector is careful:
//! - it does nothing until the Node and slice caches have synced;
//! - a slice must look orphaned in two passes at least the grace period
//!   apart (a Node that shows up late saves it);
//! - before deleting, it asks the API server for the Node directly rather
//!   than trusting the cache;
//! - the delete carries the slice's UID as a precondition, so a slice
//!   recreated under the same name in the meantime is never hit.
//!
//! Passes run every interval, and right away when a Node is deleted (the
//! deletion itself then follows one grace period later).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;

use super::Error;
use super::metrics::{ErrorLabels, Metrics};

/// Timing of the slice GC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcSettings {
    /// Time between passes.
    pub interval: Duration,
    /// How long a slice must stay orphaned (over at least two passes)
    /// before it is deleted.
    pub grace_period: Duration,
}

/// Why a slice is orphaned, judged against `nodes` (name → UID); `None`
/// when its Node exists.
pub fn orphan_reason<S: std::hash::BuildHasher>(
    slice: &ResourceSlice,
    nodes: &HashMap<String, String, S>,
) -> Option<String> {
    if let Some(node) = slice.spec.node_name.as_deref().filter(|n| !n.is_empty())
        && !nodes.contains_key(node)
    {
        return Some(format!("node {node} does not exist"));
    }
    for owner in node_owners(slice) {
        match nodes.get(&owner.name) {
            None => return Some(format!("owner node {} does not exist", owner.name)),
            Some(uid) if *uid != owner.uid => {
                return Some(format!(
                    "owner node {} was recreated (uid {} is now {uid})",
                    owner.name, owner.uid
                ));
            }
            Some(_) => {}
        }
    }
    None
}

fn node_owners(
    slice: &ResourceSlice,
) -> impl Iterator<Item = &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "Node" && o.api_version == "v1")
}

/// The Node names a slice depends on (its `nodeName` and Node owners).
pub fn referenced_nodes(slice: &ResourceSlice) -> Vec<&str> {
    let mut names: Vec<&str> = slice
        .spec
        .node_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .into_iter()
        .chain(node_owners(slice).map(|o| o.name.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Slices of our driver that look orphaned now.
    pub orphans: usize,
    /// Names of the slices deleted.
    pub deleted: Vec<String>,
}

/// The collector.
pub struct SliceGc {
    driver: String,
    settings: GcSettings,
    slices: Store<ResourceSlice>,
    nodes: Store<PartialObjectMeta<Node>>,
    slice_api: Api<ResourceSlice>,
    node_api: Api<Node>,
    metrics: Metrics,
    /// Orphaned slices by UID: when first seen orphaned.
    candidates: HashMap<String, Instant>,
}

impl std::fmt::Debug for SliceGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceGc")
            .field("driver", &self.driver)
            .field("settings", &self.settings)
            .field("candidates", &self.candidates.len())
            .finish_non_exhaustive()
    }
}

impl SliceGc {
    /// A collector for `driver` over these caches.
    pub fn new(
        client: Client,
        driver: &str,
        settings: GcSettings,
        slices: Store<ResourceSlice>,
        nodes: Store<PartialObjectMeta<Node>>,
        metrics: Metrics,
    ) -> Self {
        SliceGc {
            driver: driver.to_owned(),
            settings,
            slices,
            nodes,
            slice_api: Api::all(client.clone()),
            node_api: Api::all(client),
            metrics,
            candidates: HashMap::new(),
        }
    }

    /// Runs passes forever: every interval, after `node_deleted` is
    /// notified, and when a candidate's grace period ends.
    pub async fn run(mut self, node_deleted: Arc<Notify>) {
        loop {
            match self.pass().await {
                Ok(report) if !report.deleted.is_empty() || report.orphans > 0 => {
                    tracing::debug!(orphans = report.orphans, deleted = ?report.deleted, "slice GC pass");
                }
                Ok(_) => {}
                Err(err) => {
                    self.count_error(&err);
                    tracing::warn!(error = %err, "slice GC pass failed");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.next_pass_in()) => {}
                () = node_deleted.notified() => {}
            }
        }
    }

    fn count_error(&self, err: &Error) {
        self.metrics
            .gc_errors
            .get_or_create(&ErrorLabels { kind: err.kind() })
            .inc();
    }

    /// Time until the next pass: the interval, or sooner when a candidate
    /// becomes due.
    fn next_pass_in(&self) -> Duration {
        let grace = self.settings.grace_period;
        self.candidates
            .values()
            .map(|first| grace.saturating_sub(first.elapsed()))
            .fold(self.settings.interval, Duration::min)
            .max(Duration::from_millis(50))
    }

    /// One pass: marks orphans, deletes those that have been orphans long
    /// enough (after checking with the API server).
    pub async fn pass(&mut self) -> Result<PassReport, Error> {
        self.nodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("Node"))?;
        self.slices
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("ResourceSlice"))?;
        self.metrics.gc_passes.inc();
        let nodes: HashMap<String, String> = self
            .nodes
            .state()
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    n.metadata.uid.clone().unwrap_or_default(),
                )
            })
            .collect();
        let now = Instant::now();
        let mut report = PassReport::default();
        let mut orphaned = HashSet::new();
        let mut due = Vec::new();
        for slice in self.slices.state() {
            if slice.spec.driver != self.driver {
                continue;
            }
            let Some(uid) = slice.metadata.uid.clone() else {
                continue;
            };
            let Some(reason) = orphan_reason(&slice, &nodes) else {
                continue;
            };
            report.orphans += 1;
            orphaned.insert(uid.clone());
            match self.candidates.get(&uid) {
                None => {
                    tracing::info!(slice = ?slice.metadata.name, %reason, "ResourceSlice looks orphaned");
                    self.candidates.insert(uid, now);
                }
                Some(first) if now.duration_since(*first) >= self.settings.grace_period => {
                    due.push((slice, reason));
                }
                Some(_) => {}
            }
        }
        self.candidates.retain(|uid, _| orphaned.contains(uid));
        for (slice, reason) in due {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let uid = slice.metadata.uid.clone().unwrap_or_default();
            match self.confirm(&slice).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(slice = %name, "the Node of the ResourceSlice exists after all");
                    self.candidates.remove(&uid);
                    continue;
                }
                Err(err) => {
                    self.count_error(&err);
                    tracing::warn!(slice = %name, error = %err, "cannot check the Node of a ResourceSlice");
                    continue;
                }
            }
            match self.delete(&name, &uid).await {
                Ok(true) => {
                    self.metrics.gc_slices_deleted.inc();
                    tracing::info!(slice = %name, %reason, "deleted orphaned ResourceSlice");
                    report.deleted.push(name);
                }
                Ok(false) => {}
                Err(err) => {
                    self.count_error(&err);
                    tracing::warn!(slice = %name, error = %err, "cannot delete orphaned ResourceSlice");
                    continue;
                }
            }
            self.candidates.remove(&uid);
        }
        Ok(report)
    }

    /// Whether the slice is still orphaned according to the API server.
    async fn confirm(&self, slice: &ResourceSlice) -> Result<bool, Error> {
        let mut live = HashMap::new();
        for name in referenced_nodes(slice) {
            let node = self
                .node_api
                .get_metadata_opt(name)
                .await
                .map_err(|e| Error::kube(format!("reading Node {name}"), e))?;
            if let Some(node) = node {
                live.insert(name.to_owned(), node.metadata.uid.unwrap_or_default());
            }
        }
        Ok(orphan_reason(slice, &live).is_some())
    }

    /// Deletes the slice if it still has this UID; `false` when it is gone
    /// or was replaced.
    async fn delete(&self, name: &str, uid: &str) -> Result<bool, Error> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.slice_api.delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("deleting ResourceSlice {name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(node: Option<&str>, owner: Option<(&str, &str)>) -> ResourceSlice {
        let mut value = json!({
            "metadata": {"name": "s", "uid": "slice-uid"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}}
        });
        if let Some(node) = node {
            value["spec"]["nodeName"] = json!(node);
        } else {
            value["spec"]["allNodes"] = json!(true);
        }
        if let Some((name, uid)) = owner {
            value["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]);
        }
        serde_json::from_value(value).unwrap()
    }

    fn nodes(list: &[(&str, &str)]) -> HashMap<String, String> {
        list.iter()
            .map(|(n, u)| ((*n).to_owned(), (*u).to_owned()))
            .collect()
    }

    #[test]
    fn slices_of_live_nodes_are_kept() {
        let live = nodes(&[("node-a", "uid-a")]);
        assert_eq!(orphan_reason(&slice(Some("node-a"), None), &live), None);
        assert_eq!(
            orphan_reason(&slice(Some("node-a"), Some(("node-a", "uid-a"))), &live),
            None
        );
        assert_eq!(orphan_reason(&slice(None, None), &live), None);
    }

    #[test]
    fn slices_of_missing_or_recreated_nodes_are_orphans() {
        let live = nodes(&[("node-a", "uid-new")]);
        assert_eq!(
            orphan_reason(&slice(Some("node-b"), None), &live).as_deref(),
            Some("node node-b does not exist")
        );
        assert_eq!(
            orphan_reason(&slice(Some("node-a"), Some(("node-a", "uid-old"))), &live).as_deref(),
            Some("owner node node-a was recreated (uid uid-old is now uid-new)")
        );
        assert_eq!(
            orphan_reason(&slice(None, Some(("node-c", "uid-c"))), &live).as_deref(),
            Some("owner node node-c does not exist")
        );
    }

    #[test]
    fn owners_other_than_nodes_are_ignored() {
        let mut s = slice(None, None);
        s.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "plugin", "uid": "u"
            }))
            .unwrap(),
        ]);
        assert_eq!(orphan_reason(&s, &HashMap::new()), None);
        assert!(referenced_nodes(&s).is_empty());
        assert_eq!(
            referenced_nodes(&slice(Some("node-a"), Some(("node-a", "u")))),
            ["node-a"]
        );
    }
}
