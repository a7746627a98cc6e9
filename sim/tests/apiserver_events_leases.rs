//! The real kube client against the test API server's `events.k8s.io/v1` Events (as
//! kube-runtime's event recorder writes them) and `coordination.k8s.io/v1` Leases (optimistic
//! concurrency for leader election).

use std::time::Duration;

use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube::{Client, Config, Error, Resource as _};
use serde_json::json;

async fn start() -> (TestApiServer, Client) {
    let server = TestApiServer::start(ServerOptions {
        bookmark_interval: Duration::from_millis(100),
        ..ServerOptions::default()
    })
    .await
    .expect("server starts");
    let config = Config::new(server.url().parse().expect("url parses"));
    let client = Client::try_from(config).expect("client builds");
    (server, client)
}

fn api_error(result: Result<impl std::fmt::Debug, Error>) -> kube::core::Status {
    match result {
        Err(Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn claim(client: &Client, name: &str) -> ResourceClaim {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
        ]}}
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), "team-a")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
}

fn warning(note: &str) -> RecordedEvent {
    RecordedEvent {
        type_: EventType::Warning,
        reason: "Unallocatable".into(),
        note: Some(note.into()),
        action: "Allocate".into(),
        secondary: None,
    }
}

#[tokio::test]
async fn the_kube_event_recorder_creates_then_patches_a_series() {
    let (_server, client) = start().await;
    let claim = claim(&client, "c1").await;
    let other = self::claim(&client, "c2").await;
    let reporter = Reporter {
        controller: "gpu.nvidia.com/controller".into(),
        instance: Some("controller-0".into()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let reference = claim.object_ref(&());
    recorder
        .publish(&warning("no node fits"), &reference)
        .await
        .unwrap();
    recorder
        .publish(&warning("no node fits"), &reference)
        .await
        .unwrap();
    recorder
        .publish(&warning("other claim"), &other.object_ref(&()))
        .await
        .unwrap();

    let events: Api<Event> = Api::namespaced(client.clone(), "team-a");
    let uid = claim.metadata.uid.clone().unwrap();
    let mine = events
        .list(&ListParams::default().fields(&format!("regarding.uid={uid}")))
        .await
        .unwrap();
    assert_eq!(mine.items.len(), 1, "{:?}", mine.items);
    let event = &mine.items[0];
    assert_eq!(event.note.as_deref(), Some("no node fits"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reporting_instance.as_deref(), Some("controller-0"));
    assert_eq!(event.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("c1")
    );
    let by_reason = events
        .list(
            &ListParams::default()
                .fields("reason=Unallocatable,reportingController=gpu.nvidia.com/controller"),
        )
        .await
        .unwrap();
    assert_eq!(by_reason.items.len(), 2);
    let all = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(all.items.len(), 2);
    let bad = api_error(
        events
            .list(&ListParams::default().fields("involvedObject.uid=x"))
            .await,
    );
    assert_eq!(bad.code, 400);
    assert!(bad.message.contains("field label not supported"), "{bad:?}");
}

#[tokio::test]
async fn invalid_events_are_rejected_and_notes_are_immutable() {
    let (_server, client) = start().await;
    let events: Api<Event> = Api::namespaced(client, "team-a");
    let event = |note: String| -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": "c1.abc", "namespace": "team-a"},
            "eventTime": "2026-01-02T03:04:05.000000Z",
            "type": "Warning",
            "reason": "Unallocatable",
            "action": "Allocate",
            "note": note,
            "reportingController": "gpu.nvidia.com/controller",
            "reportingInstance": "controller-0",
            "regarding": {"kind": "ResourceClaim", "namespace": "team-a", "name": "c1"}
        }))
        .unwrap()
    };
    let too_long = api_error(
        events
            .create(&PostParams::default(), &event("x".repeat(1025)))
            .await,
    );
    assert_eq!(too_long.code, 422);
    // Validated as the core Event it converts to, as the real server does:
    // `note` is `message`, and the error names no group.
    assert!(
        too_long
            .message
            .starts_with("Event \"c1.abc\" is invalid: message: Invalid value"),
        "{too_long:?}"
    );
    let details = too_long.details.as_ref().expect("details");
    assert_eq!(
        (details.group.as_str(), details.kind.as_str()),
        ("", "Event")
    );
    let mut created = events
        .create(&PostParams::default(), &event("x".repeat(1024)))
        .await
        .unwrap();
    created.note = Some("changed".into());
    let immutable = api_error(
        events
            .replace("c1.abc", &PostParams::default(), &created)
            .await,
    );
    assert_eq!(immutable.code, 422);
    assert!(immutable.message.contains("field is immutable"));
    let mut missing = event("n".into());
    missing.reporting_controller = None;
    missing.metadata.name = Some("c1.def".into());
    let status = api_error(events.create(&PostParams::default(), &missing).await);
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .contains("reportingController: Required value")
    );
}

fn lease(holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": "gpu-dra-controller", "namespace": "kube-system"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-02T03:04:05.000000Z",
            "renewTime": "2026-01-02T03:04:05.000000Z",
            "leaseTransitions": 0
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn leases_support_optimistic_concurrency() {
    let (_server, client) = start().await;
    let leases: Api<Lease> = Api::namespaced(client, "kube-system");
    let created = leases
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();
    let duplicate = api_error(leases.create(&PostParams::default(), &lease("b")).await);
    assert_eq!(duplicate.code, 409);
    assert_eq!(duplicate.reason, "AlreadyExists");

    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().renew_time =
        Some(serde_json::from_value(json!("2026-01-02T03:04:10.000000Z")).unwrap());
    let renewed = leases
        .replace("gpu-dra-controller", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_ne!(
        renewed.metadata.resource_version,
        created.metadata.resource_version
    );

    // A second candidate that read the lease before the renewal loses the race.
    let mut stale = created;
    let spec = stale.spec.as_mut().unwrap();
    spec.holder_identity = Some("b".into());
    spec.lease_transitions = Some(1);
    let conflict = api_error(
        leases
            .replace("gpu-dra-controller", &PostParams::default(), &stale)
            .await,
    );
    assert_eq!(conflict.code, 409);
    assert_eq!(conflict.reason, "Conflict");
    let current = leases.get("gpu-dra-controller").await.unwrap();
    assert_eq!(current.spec.unwrap().holder_identity.as_deref(), Some("a"));

    let mut invalid = lease("c");
    invalid.metadata.name = Some("other".into());
    invalid.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
    let status = api_error(leases.create(&PostParams::default(), &invalid).await);
    assert_eq!(status.code, 422);
    assert!(status.message.contains("must be greater than 0"));

    leases
        .delete("gpu-dra-controller", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(leases.get("gpu-dra-controller").await).code, 404);
}
