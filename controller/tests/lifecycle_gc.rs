//! ResourceSlice garbage collection against the test API server: slices of
//! deleted or recreated Nodes go, slices of live Nodes, of Nodes that show
//! up late and of other drivers stay.

mod lifecycle_support;

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_dra_controller::lifecycle::Metrics;
use gpu_dra_controller::lifecycle::gc::{GcSettings, SliceGc};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use lifecycle_support::*;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

fn gc_settings(interval_ms: u64, grace_ms: u64) -> GcSettings {
    GcSettings {
        interval: Duration::from_millis(interval_ms),
        grace_period: Duration::from_millis(grace_ms),
    }
}

async fn slice_names(client: &kube::Client) -> BTreeSet<String> {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect()
}

fn owned_by(mut slice: serde_json::Value, node: &str, uid: &str) -> serde_json::Value {
    slice["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": true}]);
    slice
}

#[tokio::test]
async fn slices_of_missing_and_recreated_nodes_are_deleted_others_kept() {
    let (_server, client) = server().await;
    let live = node(&client, "node-a").await;
    let live_uid = live.metadata.uid.clone().unwrap();
    slice(
        &client,
        owned_by(
            slice_json("live", DRIVER, "node-a", 1, "40Gi"),
            "node-a",
            &live_uid,
        ),
    )
    .await;
    slice(&client, slice_json("gone", DRIVER, "node-gone", 1, "40Gi")).await;
    // An owner reference to an earlier Node of the same name.
    slice(
        &client,
        owned_by(
            slice_json("stale-owner", DRIVER, "node-a", 1, "40Gi"),
            "node-a",
            "0b5e1e7e-0000-4000-8000-000000000000",
        ),
    )
    .await;
    slice(
        &client,
        slice_json("other-driver", "nic.example.com", "node-gone", 1, "40Gi"),
    )
    .await;
    let mut s = settings("controller-0", Duration::ZERO);
    s.slice_gc = Some(gc_settings(100, 300));
    let running = Running::start(&client, s);
    let metrics = running.metrics.clone();

    eventually(LIMIT, "the orphans to be deleted", || async {
        let names = slice_names(&client).await;
        (!names.contains("gone") && !names.contains("stale-owner")).then_some(())
    })
    .await;
    let names = slice_names(&client).await;
    assert!(names.contains("live"), "{names:?}");
    assert!(names.contains("other-driver"), "{names:?}");
    assert_eq!(metrics.gc_slices_deleted.get(), 2);
    // More passes change nothing.
    let passes = metrics.gc_passes.get();
    eventually(LIMIT, "three more passes", || async {
        (metrics.gc_passes.get() >= passes + 3).then_some(())
    })
    .await;
    assert_eq!(slice_names(&client).await, names);
    running.stop().await;
}

#[tokio::test]
async fn deleting_a_node_collects_its_slices() {
    let (_server, client) = server().await;
    node(&client, "node-a").await;
    node(&client, "node-b").await;
    slice(&client, slice_json("a", DRIVER, "node-a", 1, "40Gi")).await;
    slice(&client, slice_json("b", DRIVER, "node-b", 1, "40Gi")).await;
    let mut s = settings("controller-0", Duration::ZERO);
    // A long interval: the Node deletion itself must start the collection.
    s.slice_gc = Some(gc_settings(3_600_000, 200));
    let running = Running::start(&client, s);
    let metrics = running.metrics.clone();
    eventually(LIMIT, "the first pass", || async {
        (metrics.gc_passes.get() >= 1).then_some(())
    })
    .await;
    // Orphan the slices, so that the API server's own garbage collector
    // (which follows owner references) is not the one deleting them.
    Api::<Node>::all(client.clone())
        .delete("node-b", &DeleteParams::orphan())
        .await
        .unwrap();
    eventually(LIMIT, "node-b's slice to go", || async {
        (!slice_names(&client).await.contains("b")).then_some(())
    })
    .await;
    assert!(slice_names(&client).await.contains("a"));
    assert_eq!(metrics.gc_slices_deleted.get(), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_node_that_appears_late_keeps_its_slices() {
    let (_server, client) = server().await;
    slice(&client, slice_json("late", DRIVER, "node-late", 1, "40Gi")).await;
    let mut s = settings("controller-0", Duration::ZERO);
    // A grace period that a loaded machine's pause between the first pass
    // and the Node's creation below cannot use up.
    s.slice_gc = Some(gc_settings(100, 3000));
    let running = Running::start(&client, s);
    let metrics = running.metrics.clone();
    // The slice has been seen orphaned ...
    eventually(LIMIT, "a pass", || async {
        (metrics.gc_passes.get() >= 1).then_some(())
    })
    .await;
    // ... and then its Node registers.
    node(&client, "node-late").await;
    let passes = metrics.gc_passes.get();
    eventually(LIMIT, "passes well past the grace period", || async {
        (metrics.gc_passes.get() >= passes + 40).then_some(())
    })
    .await;
    assert!(slice_names(&client).await.contains("late"));
    assert_eq!(metrics.gc_slices_deleted.get(), 0);
    running.stop().await;
}

/// A GC whose Node cache lags behind the API server: it must ask the API
/// server before deleting.
#[tokio::test]
async fn a_node_missing_only_from_the_cache_keeps_its_slices() {
    let (_server, client) = server().await;
    node(&client, "node-a").await;
    let created = slice(&client, slice_json("a", DRIVER, "node-a", 1, "40Gi")).await;

    let (nodes, mut node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    node_writer.apply_watcher_event(&Event::Init);
    node_writer.apply_watcher_event(&Event::InitDone);
    let (slices, mut slice_writer) = reflector::store::<ResourceSlice>();
    slice_writer.apply_watcher_event(&Event::Init);
    slice_writer.apply_watcher_event(&Event::InitApply(created.clone()));
    slice_writer.apply_watcher_event(&Event::InitDone);
    let metrics = Metrics::new();
    let mut gc = SliceGc::new(
        client.clone(),
        DRIVER,
        gc_settings(100, 0),
        slices,
        nodes,
        metrics.clone(),
    );
    let first = gc.pass().await.unwrap();
    assert_eq!(first.orphans, 1);
    assert!(first.deleted.is_empty(), "never on the first sighting");
    let second = gc.pass().await.unwrap();
    assert_eq!(second.orphans, 1);
    assert!(second.deleted.is_empty(), "the API server knows node-a");
    assert!(slice_names(&client).await.contains("a"));

    // Now the Node is really gone (orphaning, so only our GC acts).
    Api::<Node>::all(client.clone())
        .delete("node-a", &DeleteParams::orphan())
        .await
        .unwrap();
    assert!(gc.pass().await.unwrap().deleted.is_empty(), "seen anew");
    assert_eq!(gc.pass().await.unwrap().deleted, ["a"]);
    assert!(!slice_names(&client).await.contains("a"));
    assert_eq!(metrics.gc_slices_deleted.get(), 1);
    assert_eq!(metrics.gc_passes.get(), 4);
}

/// A slice recreated under the same name between the sighting and the
/// deletion is not deleted (the delete carries the old UID).
#[tokio::test]
async fn a_recreated_slice_is_not_deleted_by_a_stale_decision() {
    let (_server, client) = server().await;
    let old = slice(&client, slice_json("s", DRIVER, "node-x", 1, "40Gi")).await;
    let (nodes, mut node_writer) = reflector::store::<PartialObjectMeta<Node>>();
    node_writer.apply_watcher_event(&Event::Init);
    node_writer.apply_watcher_event(&Event::InitDone);
    let (slices, mut slice_writer) = reflector::store::<ResourceSlice>();
    slice_writer.apply_watcher_event(&Event::Init);
    slice_writer.apply_watcher_event(&Event::InitApply(old.clone()));
    slice_writer.apply_watcher_event(&Event::InitDone);
    let mut gc = SliceGc::new(
        client.clone(),
        DRIVER,
        gc_settings(100, 0),
        slices,
        nodes,
        Metrics::new(),
    );
    assert!(gc.pass().await.unwrap().deleted.is_empty());
    // Replaced behind the (stale) cache's back.
    let api: Api<ResourceSlice> = Api::all(client.clone());
    api.delete("s", &DeleteParams::default()).await.unwrap();
    let new = slice(&client, slice_json("s", DRIVER, "node-x", 1, "40Gi")).await;
    assert_ne!(new.metadata.uid, old.metadata.uid);
    assert!(gc.pass().await.unwrap().deleted.is_empty());
    let still = api.get("s").await.unwrap();
    assert_eq!(still.metadata.uid, new.metadata.uid);
}
