//! The webhook server over real HTTPS (rustls client trusting a test CA)
//! with real AdmissionReview JSON: transport, routing, limits, hostile
//! input, metrics.

mod common;

use common::{Harness, metric, review, review_with_old, streamed, whole};
use futures::StreamExt as _;
use http::StatusCode;
use serde_json::json;

fn other_driver_class() -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "fpga.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'fpga.example.com'"}}]}
    })
}

#[tokio::test]
async fn healthz_answers_ok() {
    let h = Harness::start().await;
    let answer = h.client.get("/healthz").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.text(), "ok\n");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_refused() {
    let h = Harness::start().await;
    assert_eq!(h.client.get("/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        h.client.get("/validate").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn the_uid_is_echoed_in_a_v1_review() {
    let h = Harness::start().await;
    let sent = review("CREATE", &other_driver_class());
    let answer = h.client.validate(&sent).await;
    assert_eq!(
        answer.headers.get("content-type").unwrap(),
        "application/json"
    );
    let response = answer.response();
    assert_eq!(response["uid"], sent["request"]["uid"]);
    assert_eq!(response["allowed"], true);
}

#[tokio::test]
async fn malformed_reviews_get_400_with_a_message_and_the_server_keeps_serving() {
    let h = Harness::start().await;
    let mut wrong_typed = review("CREATE", &other_driver_class());
    wrong_typed["request"]["operation"] = json!(17);
    let mut v1beta1 = review("CREATE", &other_driver_class());
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let nested = "[".repeat(50_000) + &"]".repeat(50_000);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "malformed AdmissionReview"),
        (b"".to_vec(), "malformed AdmissionReview"),
        (b"{\"apiVersion\": 3}".to_vec(), "apiVersion"),
        (
            serde_json::to_vec(&wrong_typed).unwrap(),
            "request.operation",
        ),
        (
            serde_json::to_vec(&v1beta1).unwrap(),
            "admission.k8s.io/v1beta1",
        ),
        (nested.into_bytes(), "malformed AdmissionReview"),
        (vec![0xff, 0xfe, 0x00, 0x7b], "malformed AdmissionReview"),
    ];
    let mut conn = h.client.connect().await;
    for (body, needle) in cases {
        let answer = conn.validate_raw(body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.text());
        assert!(
            answer.text().contains(needle),
            "{needle}: {}",
            answer.text()
        );
    }
    // Same connection, still fine.
    let ok = conn
        .validate(&review("CREATE", &other_driver_class()))
        .await;
    assert_eq!(ok.response()["allowed"], true);
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="Unknown",result="bad_request"}"#
        ),
        Some(7.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn oversized_bodies_get_413_whether_declared_or_streamed() {
    let h = Harness::start_with(
        std::sync::Arc::new(gpu_dra_analysis::validate::StaticClasses::default()),
        gpu_dra_controller::webhook::WebhookConfig {
            max_body_bytes: 64 * 1024,
            ..Default::default()
        },
    )
    .await;
    // A real review with a huge annotation.
    let mut class = other_driver_class();
    class["metadata"]["annotations"] = json!({"big": "x".repeat(100 * 1024)});
    let answer = h.client.validate(&review("CREATE", &class)).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(answer.text().contains("65536"), "{}", answer.text());

    // Streamed without a declared length: HTTP/1.1 chunks and HTTP/2
    // DATA frames.
    let body = serde_json::to_vec(&review("CREATE", &class)).unwrap();
    let mut h1 = h.client.connect().await;
    let chunked = h1.validate_body(streamed(body.clone(), 8192)).await;
    assert_eq!(chunked.status, StatusCode::PAYLOAD_TOO_LARGE);
    let mut h2 = h.client.connect_h2().await;
    let framed = h2.validate_body(streamed(body, 8192)).await;
    assert_eq!(framed.status, StatusCode::PAYLOAD_TOO_LARGE);

    // Still serving.
    let ok = h
        .client
        .validate(&review("CREATE", &other_driver_class()))
        .await;
    assert_eq!(ok.response()["allowed"], true);
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="Unknown",result="too_large"}"#
        ),
        Some(3.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_review_of_the_largest_object_the_api_server_stores_is_answered() {
    // etcd's default object limit is 1.5 MiB; an UPDATE carries two.
    let h = Harness::start().await;
    let mut old = other_driver_class();
    old["metadata"]["annotations"] = json!({"big": "y".repeat(1_500_000)});
    let mut new = old.clone();
    new["spec"]["selectors"][0]["cel"]["expression"] =
        json!("device.driver == 'fpga.example.com' && true");
    let answer = h
        .client
        .validate(&review_with_old("UPDATE", Some(&new), Some(&old)))
        .await;
    assert_eq!(answer.response()["allowed"], true);
}

#[tokio::test]
async fn non_json_content_types_get_415() {
    let h = Harness::start().await;
    let mut conn = h.client.connect().await;
    let request = http::Request::post("/validate")
        .header("host", "localhost")
        .header("content-type", "application/yaml")
        .body(whole(&b"apiVersion: v1"[..]))
        .unwrap();
    let answer = conn.send(request).await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(answer.text().contains("application/yaml"));
}

#[tokio::test]
async fn http2_is_served_too() {
    let h = Harness::start().await;
    let mut conn = h.client.connect_h2().await;
    for _ in 0..3 {
        let sent = review("CREATE", &other_driver_class());
        let response = conn.validate(&sent).await.response();
        assert_eq!(response["uid"], sent["request"]["uid"]);
    }
}

#[tokio::test]
async fn many_concurrent_reviews_are_all_answered() {
    let h = Harness::start().await;
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let client = h.client.clone();
        tasks.push(tokio::spawn(async move {
            let sent = review("CREATE", &other_driver_class());
            let response = client.validate(&sent).await.response();
            assert_eq!(response["uid"], sent["request"]["uid"]);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="DeviceClass",result="not_ours"}"#
        ),
        Some(40.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_does_not_block_others() {
    let h = Harness::start().await;
    // Open raw TCP connections and send nothing.
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(
            tokio::net::TcpStream::connect(h.server.local_addr())
                .await
                .unwrap(),
        );
    }
    let answer = h.client.get("/healthz").await;
    assert_eq!(answer.status, StatusCode::OK);
    drop(idle);
}

#[tokio::test]
async fn metrics_are_openmetrics_text_with_review_counters_and_latency() {
    let h = Harness::start().await;
    h.client
        .validate(&review("CREATE", &other_driver_class()))
        .await;
    let answer = h.client.get("/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        answer
            .headers
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = answer.text();
    assert_eq!(
        metric(
            &text,
            r#"gpu_dra_controller_webhook_reviews_total{kind="DeviceClass",result="not_ours"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"gpu_dra_controller_webhook_review_duration_seconds_count{kind="DeviceClass"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(text.contains("# TYPE gpu_dra_controller_webhook_tls_reloads counter"));
}

#[tokio::test]
async fn graceful_shutdown_closes_the_listener() {
    let h = Harness::start().await;
    let addr = h.server.local_addr();
    assert_eq!(h.client.get("/healthz").await.status, StatusCode::OK);
    h.server.shutdown().await;
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "still accepting after shutdown");
}

/// A class lookup that panics, standing in for a bug in the validation
/// engine.
struct PanickingClasses;

impl gpu_dra_analysis::validate::ClassLookup for PanickingClasses {
    fn device_class(&self, name: &str) -> Option<serde_json::Value> {
        panic!("lookup of {name} exploded");
    }
}

#[tokio::test]
async fn a_panic_while_judging_is_a_500_and_the_server_keeps_serving() {
    let h = Harness::start_with(
        std::sync::Arc::new(PanickingClasses),
        gpu_dra_controller::webhook::WebhookConfig::default(),
    )
    .await;
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "any"}}]}}
    });
    let answer = h.client.validate(&review("CREATE", &claim)).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        answer.text().contains("internal error"),
        "{}",
        answer.text()
    );
    // Classes are not consulted for DeviceClasses: still judged fine.
    let ok = h
        .client
        .validate(&review("CREATE", &other_driver_class()))
        .await;
    assert_eq!(ok.response()["allowed"], true);
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="Unknown",result="internal_error"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408() {
    let h = Harness::start_with(
        std::sync::Arc::new(gpu_dra_analysis::validate::StaticClasses::default()),
        gpu_dra_controller::webhook::WebhookConfig {
            client_timeout: std::time::Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let first: Result<hyper::body::Frame<hyper::body::Bytes>, std::convert::Infallible> = Ok(
        hyper::body::Frame::data(hyper::body::Bytes::from_static(b"{\"apiVersion\":")),
    );
    let stalled = futures::stream::iter([first]).chain(futures::stream::pending());
    let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(stalled));
    let mut conn = h.client.connect().await;
    let answer = conn.validate_body(body).await;
    assert_eq!(
        answer.status,
        StatusCode::REQUEST_TIMEOUT,
        "{}",
        answer.text()
    );
    assert_eq!(h.client.get("/healthz").await.status, StatusCode::OK);
}
