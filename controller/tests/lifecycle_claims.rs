//! The claim lifecycle against the test API server with the real kube
//! client: which claims get a "why pending" Event, how many, when, and the
//! metrics that count it.

mod lifecycle_support;

use std::time::{Duration, Instant};

use gpu_dra_controller::lifecycle::metrics::Outcome;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use lifecycle_support::*;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(20);

/// One node with two 40Gi GPUs and our DeviceClass.
async fn cluster(client: &kube::Client) {
    our_class(client).await;
    node(client, "node-a").await;
    slice(
        client,
        slice_json("node-a-gpu", DRIVER, "node-a", 2, "40Gi"),
    )
    .await;
}

#[tokio::test]
async fn an_unsatisfiable_claim_gets_exactly_one_event_naming_request_and_closest_device() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let claim = claim(&client, "big", DRIVER, Some("80Gi")).await;

    let events = eventually(LIMIT, "an event on the claim", || async {
        let events = events_of(&client, &claim).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let event = &events[0];
    let note = event.note.clone().unwrap_or_default();
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("Unallocatable"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("gpu.nvidia.com/controller")
    );
    assert_eq!(event.reporting_instance.as_deref(), Some("controller-0"));
    assert!(note.contains("`gpu`"), "the note names the request: {note}");
    assert!(
        note.contains("gpu-0"),
        "the note names the closest device: {note}"
    );
    assert!(note.contains("40Gi"), "the note shows its memory: {note}");
    assert!(note.len() <= 1024);

    // Several more simulations (the recheck interval is 200ms) say the same:
    // still one event.
    let metrics = running.metrics.clone();
    let seen = metrics.reconcile_count(Outcome::Unallocatable);
    eventually(LIMIT, "three more simulations", || async {
        (metrics.reconcile_count(Outcome::Unallocatable) >= seen + 3).then_some(())
    })
    .await;
    assert_eq!(events_of(&client, &claim).await.len(), 1);
    assert_eq!(metrics.event_count("Unallocatable"), 1);
    assert_eq!(metrics.unallocatable_claims.get(), 1);
    assert!(metrics.snapshot_builds.get() >= 1);
    running.stop().await;
}

#[tokio::test]
async fn a_new_explanation_gets_a_new_event_and_allocation_clears_the_gauge() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let claim = claim(&client, "big", DRIVER, Some("80Gi")).await;
    eventually(LIMIT, "the first event", || async {
        (events_of(&client, &claim).await.len() == 1).then_some(())
    })
    .await;

    // The node's GPUs change: still too small, but the explanation differs.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices
        .patch(
            "node-a-gpu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devices": [gpu(0, "48Gi")]}})),
        )
        .await
        .unwrap();
    let events = eventually(LIMIT, "a second event", || async {
        let events = events_of(&client, &claim).await;
        (events.len() == 2).then_some(events)
    })
    .await;
    assert!(
        events
            .iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains("48Gi"))),
        "{events:?}"
    );
    let metrics = running.metrics.clone();
    assert_eq!(metrics.event_count("Unallocatable"), 2);
    assert_eq!(metrics.unallocatable_claims.get(), 1);

    // The claim gets allocated (say an admin forced it): no more events, and
    // it no longer counts as unallocatable.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    claims
        .patch_status(
            "big",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"
            }]}}}})),
        )
        .await
        .unwrap();
    eventually(LIMIT, "the allocated claim to leave the gauge", || async {
        (metrics.reconcile_count(Outcome::Allocated) >= 1
            && metrics.unallocatable_claims.get() == 0)
            .then_some(())
    })
    .await;
    let simulated = metrics.reconcile_count(Outcome::Unallocatable);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(metrics.reconcile_count(Outcome::Unallocatable), simulated);
    assert_eq!(events_of(&client, &claim).await.len(), 2);
    running.stop().await;
}

#[tokio::test]
async fn satisfiable_pending_claims_and_other_drivers_claims_get_no_event() {
    let (_server, client) = server().await;
    cluster(&client).await;
    other_class(&client).await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let metrics = running.metrics.clone();

    let pending = claim(&client, "fits", DRIVER, Some("10Gi")).await;
    let foreign = claim(&client, "nic", "nic.example.com", None).await;
    // A claim that does get an event, as a witness that the controller ran.
    let witness = claim(&client, "witness", DRIVER, Some("500Gi")).await;
    eventually(LIMIT, "the witness event", || async {
        (!events_of(&client, &witness).await.is_empty()).then_some(())
    })
    .await;
    eventually(LIMIT, "the pending claim to be simulated twice", || async {
        (metrics.reconcile_count(Outcome::Satisfiable) >= 2).then_some(())
    })
    .await;
    eventually(LIMIT, "the foreign claim to be judged", || async {
        (metrics.reconcile_count(Outcome::NotOurs) >= 1).then_some(())
    })
    .await;
    assert!(events_of(&client, &pending).await.is_empty());
    assert!(events_of(&client, &foreign).await.is_empty());
    assert_eq!(events_in_namespace(&client).await, 1);
    assert_eq!(metrics.event_count("Unallocatable"), 1);
    assert_eq!(metrics.unallocatable_claims.get(), 1);
    assert_eq!(metrics.reconcile_count(Outcome::Error), 0);
    running.stop().await;
}

async fn events_in_namespace(client: &kube::Client) -> usize {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NAMESPACE)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .len()
}

#[tokio::test]
async fn an_allocated_claim_is_ignored_even_when_it_would_not_fit() {
    let (_server, client) = server().await;
    cluster(&client).await;
    // Allocated before the controller starts.
    let allocated = claim(&client, "done", DRIVER, Some("80Gi")).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    claims
        .patch_status(
            "done",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"
            }]}}}})),
        )
        .await
        .unwrap();
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let metrics = running.metrics.clone();
    let witness = claim(&client, "witness", DRIVER, Some("500Gi")).await;
    eventually(LIMIT, "the witness event", || async {
        (!events_of(&client, &witness).await.is_empty()).then_some(())
    })
    .await;
    eventually(LIMIT, "the allocated claim to be seen", || async {
        (metrics.reconcile_count(Outcome::Allocated) >= 1).then_some(())
    })
    .await;
    assert!(events_of(&client, &allocated).await.is_empty());
    assert_eq!(metrics.unallocatable_claims.get(), 1);
    running.stop().await;
}

#[tokio::test]
async fn the_grace_period_is_honoured() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let grace = Duration::from_millis(1500);
    let running = Running::start(&client, settings("controller-0", grace));
    let metrics = running.metrics.clone();
    let created = Instant::now();
    let claim = claim(&client, "big", DRIVER, Some("80Gi")).await;
    eventually(LIMIT, "the claim to be seen", || async {
        (metrics.reconcile_count(Outcome::Waiting) >= 1).then_some(())
    })
    .await;
    assert!(
        events_of(&client, &claim).await.is_empty() || created.elapsed() >= grace,
        "an event came before the grace period ended"
    );
    eventually(LIMIT, "the event after the grace period", || async {
        (!events_of(&client, &claim).await.is_empty()).then_some(())
    })
    .await;
    assert!(
        created.elapsed() >= grace,
        "the event came {:?} after creation, before the {grace:?} grace period",
        created.elapsed()
    );
    running.stop().await;
}

#[tokio::test]
async fn a_restarted_controller_does_not_repeat_an_event() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let first = Running::start(&client, settings("controller-0", Duration::ZERO));
    let claim = claim(&client, "big", DRIVER, Some("80Gi")).await;
    eventually(LIMIT, "the first event", || async {
        (events_of(&client, &claim).await.len() == 1).then_some(())
    })
    .await;
    first.stop().await;

    let second = Running::start(&client, settings("controller-0", Duration::ZERO));
    let metrics = second.metrics.clone();
    eventually(LIMIT, "two simulations by the new controller", || async {
        (metrics.reconcile_count(Outcome::Unallocatable) >= 2).then_some(())
    })
    .await;
    assert_eq!(events_of(&client, &claim).await.len(), 1);
    assert_eq!(metrics.event_count("Unallocatable"), 0);
    assert_eq!(metrics.unallocatable_claims.get(), 1);

    // Deleting the claim takes it off the gauge.
    Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .delete("big", &DeleteParams::default())
        .await
        .unwrap();
    let _witness = self::claim(&client, "other", DRIVER, Some("10Gi")).await;
    eventually(LIMIT, "the gauge to drop", || async {
        (metrics.unallocatable_claims.get() == 0).then_some(())
    })
    .await;
    second.stop().await;
}

#[tokio::test]
async fn a_claim_naming_a_missing_class_waits_for_it() {
    let (_server, client) = server().await;
    node(&client, "node-a").await;
    slice(
        &client,
        slice_json("node-a-gpu", DRIVER, "node-a", 1, "40Gi"),
    )
    .await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let metrics = running.metrics.clone();
    let claim = claim(&client, "early", DRIVER, Some("80Gi")).await;
    eventually(LIMIT, "the claim to wait", || async {
        (metrics.reconcile_count(Outcome::Waiting) >= 1).then_some(())
    })
    .await;
    assert!(events_of(&client, &claim).await.is_empty());
    our_class(&client).await;
    eventually(LIMIT, "the event once the class exists", || async {
        (!events_of(&client, &claim).await.is_empty()).then_some(())
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn a_selector_that_cannot_compile_gets_an_allocation_error_event() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    let broken: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "broken", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == "}}]
        }}]}}
    }))
    .unwrap();
    let broken = Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .create(&kube::api::PostParams::default(), &broken)
        .await
        .unwrap();
    let events = eventually(LIMIT, "an event", || async {
        let events = events_of(&client, &broken).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events[0].reason.as_deref(), Some("AllocationError"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains("request gpu: selector #0"), "{note}");
    assert!(note.contains("CEL compile error"), "{note}");
    assert_eq!(running.metrics.event_count("AllocationError"), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_long_explanation_is_cut_to_the_event_limit() {
    let (_server, client) = server().await;
    cluster(&client).await;
    let running = Running::start(&client, settings("controller-0", Duration::ZERO));
    // A 6 KiB selector, quoted in the explanation.
    let padding = "x".repeat(6000);
    let expression = format!(
        "'{padding}' != '' && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"
    );
    let long: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "long", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression": expression}}]
        }}]}}
    }))
    .unwrap();
    let long = Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .create(&kube::api::PostParams::default(), &long)
        .await
        .unwrap();
    let events = eventually(LIMIT, "an event", || async {
        let events = events_of(&client, &long).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.len() <= 1024, "{}", note.len());
    assert!(note.ends_with("..."), "{note}");
    assert!(note.contains("`gpu`"), "{note}");
    assert_eq!(running.metrics.reconcile_count(Outcome::Error), 0);
    running.stop().await;
}
