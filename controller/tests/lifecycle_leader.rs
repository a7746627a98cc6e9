//! Leader election against the test API server: two controllers, one
//! leader; failover when the leader dies (after the lease expires) or stops
//! (at once, it releases the lease); racing candidates.

mod lifecycle_support;

use std::time::{Duration, Instant};

use gpu_dra_controller::lifecycle::leader::{LeaderElector, LeaseSettings};
use gpu_dra_controller::lifecycle::{Metrics, Settings};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use lifecycle_support::*;

const LIMIT: Duration = Duration::from_secs(20);
const LEASE_NAMESPACE: &str = "gpu-system";

fn lease_settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: LEASE_NAMESPACE.into(),
        name: "gpu-dra-controller".into(),
        identity: identity.into(),
        // Long enough that a stalled test runtime on a loaded machine
        // does not cost the leader its lease.
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    }
}

fn elected(identity: &str) -> Settings {
    let mut s = settings(identity, Duration::ZERO);
    s.leader_election = Some(lease_settings(identity));
    s
}

async fn lease(client: &kube::Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .get_opt("gpu-dra-controller")
        .await
        .unwrap()
}

async fn holder(client: &kube::Client) -> Option<String> {
    lease(client)
        .await
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_leads_and_the_other_takes_over_when_it_dies() {
    let (_server, client) = server().await;
    our_class(&client).await;
    node(&client, "node-a").await;
    slice(
        &client,
        slice_json("node-a-gpu", DRIVER, "node-a", 1, "40Gi"),
    )
    .await;
    let a = Running::start(&client, elected("a"));
    let b = Running::start(&client, elected("b"));

    let leader = eventually(LIMIT, "a leader", || async {
        let leaders = a.metrics.leader.get() + b.metrics.leader.get();
        let holder = holder(&client).await?;
        (leaders == 1).then_some(holder)
    })
    .await;
    // Over two lease durations, leadership stays put and single.
    let until = Instant::now() + Duration::from_millis(6500);
    while Instant::now() < until {
        assert_eq!(a.metrics.leader.get() + b.metrics.leader.get(), 1);
        assert_eq!(holder(&client).await.as_deref(), Some(leader.as_str()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only the leader works: an unallocatable claim gets one event, from it.
    let claim = claim(&client, "big", DRIVER, Some("80Gi")).await;
    let events = eventually(LIMIT, "an event", || async {
        let events = events_of(&client, &claim).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(
        events[0].reporting_instance.as_deref(),
        Some(leader.as_str())
    );
    let (leading, standby) = if leader == "a" { (a, b) } else { (b, a) };
    assert_eq!(leading.metrics.event_count("Unallocatable"), 1);
    assert_eq!(
        standby
            .metrics
            .reconcile_count(gpu_dra_controller::lifecycle::metrics::Outcome::Unallocatable),
        0
    );
    let transitions = lease(&client)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;

    // The leader crashes: no release. The standby waits out the lease.
    let died = Instant::now();
    leading.kill().await;
    let new_leader = eventually(LIMIT, "the standby to take over", || async {
        let holder = holder(&client).await?;
        (holder != leader && standby.metrics.leader.get() == 1).then_some(holder)
    })
    .await;
    // The last renewal came at most a retry period (and a stall) before
    // the crash; the standby counts the 3 s lease from when it saw it.
    assert!(
        died.elapsed() >= Duration::from_secs(2),
        "took over {:?} after the crash, before the 3s lease could expire",
        died.elapsed()
    );
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(transitions.unwrap_or(0) + 1));
    assert_eq!(standby.metrics.leader_acquisitions.get(), 1);

    // The new leader works, and does not repeat the dead leader's event.
    let second = self::claim(&client, "bigger", DRIVER, Some("90Gi")).await;
    let events = eventually(LIMIT, "an event from the new leader", || async {
        let events = events_of(&client, &second).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(
        events[0].reporting_instance.as_deref(),
        Some(new_leader.as_str())
    );
    assert_eq!(events_of(&client, &claim).await.len(), 1);
    standby.stop().await;
}

#[tokio::test]
async fn a_leader_that_stops_releases_the_lease() {
    let (_server, client) = server().await;
    let a = Running::start(&client, elected("a"));
    eventually(LIMIT, "a to lead", || async {
        (holder(&client).await.as_deref() == Some("a") && a.metrics.leader.get() == 1).then_some(())
    })
    .await;
    let b = Running::start(&client, elected("b"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.metrics.leader.get(), 0);
    a.stop().await;
    eventually(LIMIT, "b to lead", || async {
        (holder(&client).await.as_deref() == Some("b") && b.metrics.leader.get() == 1).then_some(())
    })
    .await;
    b.stop().await;
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity, None, "released on a clean stop");
}

#[tokio::test]
async fn racing_candidates_get_one_lease() {
    let (_server, client) = server().await;
    let mut electors: Vec<LeaderElector> = ["x", "y", "z"]
        .into_iter()
        .map(|id| LeaderElector::new(client.clone(), lease_settings(id), Metrics::new()))
        .collect();
    for round in 0..3 {
        let results =
            futures::future::join_all(electors.iter_mut().map(LeaderElector::try_acquire_or_renew))
                .await;
        let won: Vec<bool> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {won:?}"
        );
    }
    let holder = holder(&client).await.unwrap();
    assert!(["x", "y", "z"].contains(&holder.as_str()));
    // The holder renews; the others keep losing while the lease is fresh.
    let lease = lease(&client).await.unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(0));
}

#[tokio::test]
async fn an_abandoned_lease_with_odd_fields_is_taken_over_after_its_duration() {
    let (_server, client) = server().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let ghost: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-dra-controller", "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 1}
    }))
    .unwrap();
    leases
        .create(&kube::api::PostParams::default(), &ghost)
        .await
        .unwrap();
    let mut elector = LeaderElector::new(client.clone(), lease_settings("x"), Metrics::new());
    let first_try = Instant::now();
    assert!(!elector.try_acquire_or_renew().await.unwrap());
    let took_over = loop {
        if elector.try_acquire_or_renew().await.unwrap() {
            break Instant::now();
        }
        assert!(first_try.elapsed() < LIMIT, "no takeover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(took_over.duration_since(first_try) >= Duration::from_secs(1));
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("x"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
}
