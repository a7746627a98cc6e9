//! The test API server's answers where they were found to differ from a real kube-apiserver
//! (1.37) by `tests/real_cluster/apiserver.rs`, which sends the same requests to both: unknown
//! fields under each `fieldValidation`, the Go-type round trip of bodies (no `null`s or empty
//! maps, struct values present), a claim without generation, `Success` Statuses for deleted
//! Leases and Events, the wording and kind of precondition failures, and the plugin's
//! server-side apply of `status.devices`. These run without a cluster.

use std::time::Duration;

use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use http_body_util::BodyExt as _;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Request;
use kube::{Client, Config};
use serde_json::{Value, json};

async fn start() -> (TestApiServer, Client) {
    let server = TestApiServer::start(ServerOptions {
        bookmark_interval: Duration::from_millis(100),
        ..ServerOptions::default()
    })
    .await
    .expect("server starts");
    let config = Config::new(server.url().parse().expect("url parses"));
    (server, Client::try_from(config).expect("client builds"))
}

/// Status code, body and `Warning` headers of one request.
async fn send(client: &Client, request: http::Request<Vec<u8>>) -> (u16, Value, Vec<String>) {
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .expect("the server answers");
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|w| w.to_str().unwrap_or_default().to_owned())
        .collect();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (code, body, warnings)
}

fn query(request: http::Request<Vec<u8>>, q: &str) -> http::Request<Vec<u8>> {
    let (mut parts, body) = request.into_parts();
    let uri = parts.uri.to_string();
    let sep = if uri.contains('?') { '&' } else { '?' };
    parts.uri = format!("{uri}{sep}{q}").parse().unwrap();
    http::Request::from_parts(parts, body)
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";

fn slice(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[tokio::test]
async fn unknown_fields_are_dropped_warned_or_refused() {
    let (_server, client) = start().await;
    let pp = PostParams::default();
    let with_unknown = |name: &str| {
        let mut s = slice(name);
        s["spec"]["unknownField"] = json!("x");
        s["spec"]["devices"][0]["alsoUnknown"] = json!(1);
        s
    };
    let warned = [
        "299 - \"unknown field \\\"spec.devices[0].alsoUnknown\\\"\"",
        "299 - \"unknown field \\\"spec.unknownField\\\"\"",
    ];
    // Default (Warn): stored without them, one warning each.
    let req = Request::new(SLICES)
        .create(&pp, bytes(&with_unknown("a")))
        .unwrap();
    let (code, body, warnings) = send(&client, req).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(warnings, warned);
    assert!(body["spec"].get("unknownField").is_none(), "{body}");
    assert!(body["spec"]["devices"][0].get("alsoUnknown").is_none());
    // Ignore: dropped silently.
    let req = Request::new(SLICES)
        .create(&pp, bytes(&with_unknown("b")))
        .unwrap();
    let (code, _, warnings) = send(&client, query(req, "fieldValidation=Ignore")).await;
    assert_eq!((code, warnings.len()), (201, 0));
    // Strict: refused.
    let req = Request::new(SLICES)
        .create(&pp, bytes(&with_unknown("c")))
        .unwrap();
    let (code, body, _) = send(&client, query(req, "fieldValidation=Strict")).await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        body["message"],
        "ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: strict decoding \
         error: unknown field \"spec.devices[0].alsoUnknown\", unknown field \"spec.unknownField\""
    );
    // An unknown level is an invalid option.
    let req = Request::new(SLICES)
        .create(&pp, bytes(&slice("d")))
        .unwrap();
    let (code, body, _) = send(&client, query(req, "fieldValidation=Bogus")).await;
    assert_eq!(code, 422);
    assert_eq!(body["details"]["kind"], "CreateOptions");
    assert_eq!(body["details"]["causes"][0]["field"], "fieldValidation");
    // A server-side apply with unknown fields fails, whatever the level.
    let params = PatchParams::apply("gpu-kubelet-plugin").force();
    let req = Request::new(SLICES)
        .patch("e", &params, &Patch::Apply(with_unknown("e")))
        .unwrap();
    let (code, body, _) = send(&client, req).await;
    assert_eq!(code, 500);
    assert!(body.get("reason").is_none(), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("failed to create typed patch object (/e; resource.k8s.io/v1, Kind=ResourceSlice): errors:\n  .spec.devices[0].alsoUnknown: field not declared in schema"),
        "{body}"
    );
    // An apply without field manager names the option.
    let req = Request::new(SLICES)
        .patch("f", &PatchParams::default(), &Patch::Apply(slice("f")))
        .unwrap();
    let (code, body, _) = send(&client, req).await;
    assert_eq!(code, 422);
    assert_eq!(
        (&body["details"]["group"], &body["details"]["kind"]),
        (&json!("meta.k8s.io"), &json!("PatchOptions"))
    );
    assert_eq!(
        body["details"]["causes"][0],
        json!({"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"})
    );
}

#[tokio::test]
async fn bodies_round_trip_through_the_go_types() {
    let (_server, client) = start().await;
    let pp = PostParams::default();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "labels": {}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}]}}
    });
    let (code, created, _) = send(
        &client,
        Request::new(CLAIMS).create(&pp, bytes(&claim)).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    // No generation for claims, an empty status, count 0 defaulted like unset, no empty labels.
    assert!(created["metadata"].get("generation").is_none(), "{created}");
    assert!(created["metadata"].get("labels").is_none(), "{created}");
    assert_eq!(created["status"], json!({}));
    assert_eq!(
        created["spec"]["devices"]["requests"][0]["exactly"]["count"],
        1
    );
    // The demo's merge patch of the allocation: nulls and empty maps are not stored.
    let allocation = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
         "shareID": null, "consumedCapacity": {}}
    ]}}}});
    let req = Request::new(CLAIMS)
        .patch_subresource(
            "status",
            "c",
            &PatchParams::default(),
            &Patch::Merge(&allocation),
        )
        .unwrap();
    let (code, patched, _) = send(&client, req).await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(
        patched["status"]["allocation"]["devices"]["results"][0],
        json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"})
    );
    // The updater owns the allocation it created (`.`), the atomic results as a whole.
    let entry = patched["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["subresource"] == "status")
        .unwrap()
        .clone();
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:status": {"f:allocation": {".": {}, "f:devices": {".": {}, "f:results": {}}}}})
    );
    // Events keep their unset deprecated times as null and a deprecatedSource.
    let event = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "c.1", "namespace": "ns"},
        "eventTime": "2026-01-02T03:04:05.000000Z", "type": "Warning", "reason": "Unallocatable",
        "action": "SimulateAllocation", "note": "n", "reportingController": "gpu.nvidia.com/controller",
        "reportingInstance": "i", "regarding": {"kind": "ResourceClaim", "namespace": "ns", "name": "c"}
    });
    let events = "/apis/events.k8s.io/v1/namespaces/ns/events";
    let (code, stored, _) = send(
        &client,
        Request::new(events).create(&pp, bytes(&event)).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{stored}");
    assert_eq!(stored["deprecatedSource"], json!({}));
    assert_eq!(stored["deprecatedFirstTimestamp"], Value::Null);
    assert!(
        stored
            .as_object()
            .unwrap()
            .contains_key("deprecatedLastTimestamp")
    );
    assert_eq!(
        stored["metadata"]["managedFields"][0]["fieldsV1"]["f:regarding"],
        json!({}),
        "regarding is atomic"
    );
    // Deleting an Event or a Lease answers with a Status, a claim with the object.
    let (code, status, _) = send(
        &client,
        Request::new(events)
            .delete("c.1", &DeleteParams::default())
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Success");
    assert_eq!(
        status["details"],
        json!({"name": "c.1", "group": "events.k8s.io", "kind": "events", "uid": stored["metadata"]["uid"]})
    );
    let (_, deleted, _) = send(
        &client,
        Request::new(CLAIMS)
            .delete("c", &DeleteParams::default())
            .unwrap(),
    )
    .await;
    assert_eq!(deleted["kind"], "ResourceClaim");
}

#[tokio::test]
async fn uid_preconditions_and_immutability() {
    let (_server, client) = start().await;
    let pp = PostParams::default();
    let (_, created, _) = send(
        &client,
        Request::new(SLICES)
            .create(&pp, bytes(&slice("s")))
            .unwrap(),
    )
    .await;
    let other = "0b7e5a52-1111-4222-8333-444455556666";
    // A PUT naming another UID fails its storage precondition: 409.
    let mut put = created.clone();
    put["metadata"]["uid"] = json!(other);
    let (code, body, _) = send(
        &client,
        Request::new(SLICES).replace("s", &pp, bytes(&put)).unwrap(),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (409, Some("Conflict")));
    assert!(
        body["message"].as_str().unwrap().contains(&format!(
            "StorageError: invalid object, Code: 4, Key: /registry/resourceslices/s, ResourceVersion: 0, \
             AdditionalErrorMsg: Precondition failed: UID in precondition: {other}"
        )),
        "{body}"
    );
    assert_eq!(body["details"]["kind"], "resourceslices");
    // A patch or an apply may not change it: 422.
    let mut applied = slice("s");
    applied["metadata"]["uid"] = json!(other);
    let req = Request::new(SLICES)
        .patch(
            "s",
            &PatchParams::apply("m").force(),
            &Patch::Apply(&applied),
        )
        .unwrap();
    let (code, body, _) = send(&client, req).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.uid");
    // A delete precondition names the Kind.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(other.into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let (code, body, _) = send(&client, Request::new(SLICES).delete("s", &dp).unwrap()).await;
    assert_eq!(code, 409);
    assert_eq!(body["details"]["kind"], "ResourceSlice");
    assert!(
        body["message"].as_str().unwrap().starts_with(&format!(
            "Operation cannot be fulfilled on ResourceSlice.resource.k8s.io \"s\": the UID in the \
             precondition ({other}) does not match the UID in record"
        )),
        "{body}"
    );
}

/// The plugin's `status.devices` apply body for one device.
fn status_apply(device: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"devices": [{
            "driver": "gpu.nvidia.com", "pool": "node-a", "device": device,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                            "message": "prepared", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
            "data": {"uuid": "GPU-1"}
        }]}
    })
}

#[tokio::test]
async fn the_plugins_status_applies_replace_its_entries_whole() {
    let (_server, client) = start().await;
    let pp = PostParams::default();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}
    });
    let (_, created, _) = send(
        &client,
        Request::new(CLAIMS).create(&pp, bytes(&claim)).unwrap(),
    )
    .await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let allocation = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}
    ]}}}});
    let req = Request::new(CLAIMS)
        .patch_subresource(
            "status",
            "c",
            &PatchParams::default(),
            &Patch::Merge(&allocation),
        )
        .unwrap();
    assert_eq!(send(&client, req).await.0, 200);
    let params = PatchParams::apply("gpu.nvidia.com/node-a").force();
    for device in ["gpu-0", "gpu-1"] {
        let req = Request::new(CLAIMS)
            .patch_subresource(
                "status",
                "c",
                &params,
                &Patch::Apply(status_apply(device, &uid)),
            )
            .unwrap();
        let (code, body, _) = send(&client, req).await;
        assert_eq!(code, 200, "{body}");
        // The entry it applied before is removed whole: nothing of it is left behind.
        let devices = body["status"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{body}");
        assert_eq!(devices[0]["device"], device);
        let fields = &body["metadata"]["managedFields"];
        let entry = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "gpu.nvidia.com/node-a")
            .unwrap();
        let key = format!(
            "k:{{\"device\":\"{device}\",\"driver\":\"gpu.nvidia.com\",\"pool\":\"node-a\"}}"
        );
        assert_eq!(
            entry["fieldsV1"]["f:status"]["f:devices"][&key]["f:data"],
            json!({}),
            "data is raw JSON, owned whole: {entry}"
        );
        // Applies come before updates in managedFields.
        assert_eq!(fields[0]["operation"], "Apply", "{fields}");
    }
    // A condition must be a metav1.Condition.
    let mut bad = status_apply("gpu-0", &uid);
    bad["status"]["devices"][0]["conditions"][0]["status"] = json!("Maybe");
    let req = Request::new(CLAIMS)
        .patch_subresource("status", "c", &params, &Patch::Apply(&bad))
        .unwrap();
    let (code, body, _) = send(&client, req).await;
    assert_eq!(code, 422);
    assert_eq!(
        body["details"]["causes"][0]["field"],
        "status.devices[0].conditions[0].status"
    );
}
