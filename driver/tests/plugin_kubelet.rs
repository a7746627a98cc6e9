//! The real plugin binary driven by the kubelet simulator over real Unix
//! sockets: registration, DRAPlugin v1 and v1beta1, health, any
//! `:authority`, malformed requests, metrics.

mod common;

use std::time::Duration;

use common::{DRIVER, Plugin, http_get, short_dir};
use dra_proto::dra::v1;
use dra_proto::registration::PluginInfo;
use futures::StreamExt;
use gpu_dra_sim::kubelet::{Claim, DraVersion, HealthVersion, KubeletSim, RegistrarEvent, raw};
use prost::Message;

const WAIT: Duration = Duration::from_secs(10);
const V1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
const V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";

fn claims() -> Vec<Claim> {
    vec![
        Claim::new("default", "claim-a", "8d4c7f0e-0000-4000-8000-00000000000a"),
        Claim::new("team-b", "claim-b", "8d4c7f0e-0000-4000-8000-00000000000b"),
    ]
}

#[tokio::test]
async fn registers_and_serves_v1_through_the_simulator() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let mut registrar = KubeletSim::new().watch_registrar(&plugin.reg_dir);
    let p = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(p.dra_version, DraVersion::V1);
    assert_eq!(p.health_version, Some(HealthVersion::V1alpha1));
    assert_eq!(p.endpoint, plugin.dra_socket());
    assert_eq!(
        p.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth"
        ]
    );
    plugin.wait_log("kubelet registered the plugin").await;

    let prepared = p.prepare(&claims()).await.unwrap();
    assert_eq!(prepared.len(), 2);
    for (uid, r) in &prepared {
        let e = r.error.as_deref().unwrap_or_default();
        assert!(e.contains("not found in the API server"), "{uid}: {r:?}");
        assert!(r.devices.is_empty());
    }
    let unprepared = p.unprepare(&claims()).await.unwrap();
    assert!(
        unprepared.values().all(|r| r.error.is_none()),
        "{unprepared:?}"
    );

    let mut health = p.watch_health().await.unwrap();
    let first = tokio::time::timeout(WAIT, health.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Every device of the small machine, healthy (the health monitor).
    assert_eq!(first.len(), 4, "{first:?}");
    assert!(first.iter().all(|d| d.health == "Healthy"), "{first:?}");
    // The stream stays open after the first list.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), health.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn an_old_kubelet_gets_v1beta1() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let sim = KubeletSim::new()
        .with_dra_versions([DraVersion::V1beta1])
        .with_health_versions([]);
    let p = sim.register(&plugin.reg_socket()).await.unwrap();
    assert_eq!(p.dra_version, DraVersion::V1beta1);
    let prepared = p.prepare(&claims()).await.unwrap();
    assert!(prepared.values().all(|r| {
        r.error
            .as_deref()
            .is_some_and(|e| e.contains("not found in the API server"))
    }));
    let unprepared = p
        .unprepare(&[Claim::new("ns", "gone", "never-prepared")])
        .await
        .unwrap();
    assert_eq!(unprepared["never-prepared"].error, None);
    assert!(p.watch_health().await.is_err());
    // The v1 health service answers a kubelet that knows it.
    let sim = KubeletSim::new().with_health_versions([HealthVersion::V1]);
    let p = sim.register(&plugin.reg_socket()).await.unwrap();
    assert_eq!(p.health_version, Some(HealthVersion::V1));
    let mut health = p.watch_health().await.unwrap();
    assert_eq!(health.next().await.unwrap().unwrap().len(), 4);
}

#[tokio::test]
async fn a_rejection_is_logged_with_its_reason() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let mut registrar = KubeletSim::new()
        .with_dra_versions([])
        .watch_registrar(&plugin.reg_dir);
    match registrar.next_event(WAIT).await.unwrap() {
        RegistrarEvent::Rejected { reason, .. } => assert!(reason.contains("none of the versions")),
        other => panic!("{other:?}"),
    }
    plugin
        .wait_log("kubelet rejected the plugin registration")
        .await;
    plugin.wait_log("none of the versions").await;
    let line = plugin
        .stderr()
        .lines()
        .find(|l| l.contains("rejected"))
        .unwrap()
        .to_owned();
    assert!(line.contains("ERROR"), "{line}");
}

#[tokio::test]
async fn hostile_claims_get_per_claim_errors_and_the_rest_is_answered() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    let long = "u".repeat(200);
    let hostile = vec![
        Claim::new("default", "ok", "ok-uid"),
        Claim::new("default", "empty-uid", ""),
        Claim::new("default", "dup", "dup-uid"),
        Claim::new("default", "dup2", "dup-uid"),
        Claim::new("default", "traversal", "../../etc/passwd"),
        Claim::new("Bad/NS", "x", "bad-ns"),
        Claim::new("default", "long", long.as_str()),
    ];
    let answers = p.prepare(&hostile).await.unwrap();
    let error = |k: &str| answers[k].error.clone().unwrap_or_default();
    assert!(error("ok-uid").contains("not found in the API server"));
    assert!(error("").contains("empty"));
    assert!(error("dup-uid").contains("more than once"));
    assert!(error("../../etc/passwd").contains("characters"));
    assert!(error("bad-ns").contains("namespace"));
    assert!(error(&long).contains("bytes long"));
    let answers = p.unprepare(&hostile).await.unwrap();
    assert_eq!(answers["ok-uid"].error, None);
    assert_eq!(
        answers["bad-ns"].error, None,
        "unprepare needs only the UID"
    );
    assert!(answers["dup-uid"].error.is_some());
}

fn unprepare_body(uid: &str) -> Vec<u8> {
    raw::grpc_frame(
        &v1::NodeUnprepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: "c".into(),
            }],
        }
        .encode_to_vec(),
    )
}

fn percent_encode_path(p: &std::path::Path) -> String {
    p.to_str().unwrap().replace('/', "%2F")
}

#[tokio::test]
async fn any_authority_is_accepted() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let dra = plugin.dra_socket();
    let reg = plugin.reg_socket();
    for authority in [
        "localhost".to_owned(),
        percent_encode_path(&dra),
        dra.to_str().unwrap().to_owned(),
        "unix:%2Fvar%2Frun".to_owned(),
    ] {
        let r = raw::call(
            &dra,
            &authority,
            V1_UNPREPARE,
            &unprepare_body("uid-1"),
            WAIT,
        )
        .await
        .unwrap();
        assert_eq!(r.reset, None, "{authority}: stream reset");
        assert_eq!(
            (r.http_status, r.grpc_status),
            (Some(200), Some(0)),
            "{authority}: {r:?}"
        );
        let msgs = r.messages().unwrap();
        let resp = v1::NodeUnprepareResourcesResponse::decode(&msgs[0][..]).unwrap();
        assert_eq!(
            resp.claims.keys().collect::<Vec<_>>(),
            ["uid-1"],
            "{authority}"
        );

        let r = raw::call(
            &reg,
            &authority,
            "/pluginregistration.Registration/GetInfo",
            &raw::grpc_frame(&[]),
            WAIT,
        )
        .await
        .unwrap();
        assert_eq!(r.grpc_status, Some(0), "{authority}: {r:?}");
        let info = PluginInfo::decode(&r.messages().unwrap()[0][..]).unwrap();
        assert_eq!(info.name, DRIVER);
    }
}

#[tokio::test]
async fn malformed_requests_get_error_statuses_and_the_plugin_keeps_serving() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    let dra = plugin.dra_socket();
    // A Claim whose uid (field 2) holds invalid UTF-8.
    let bad_utf8 = {
        let claim = [0x12, 0x02, 0xff, 0xfe];
        let mut m = vec![0x0a, claim.len() as u8];
        m.extend_from_slice(&claim);
        m
    };
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("garbage protobuf", raw::grpc_frame(&[0xff; 16])),
        ("truncated field", raw::grpc_frame(&[0x0a, 0x40, 0x01])),
        ("invalid utf-8", raw::grpc_frame(&bad_utf8)),
        (
            "length prefix longer than the body",
            vec![0, 0, 0, 1, 0, 1, 2],
        ),
        ("compressed flag without encoding", {
            let mut b = raw::grpc_frame(&[]);
            b[0] = 1;
            b
        }),
        ("no message at all", Vec::new()),
    ];
    for (what, body) in &bodies {
        for path in [V1_PREPARE, V1_UNPREPARE] {
            let r = raw::call(&dra, "localhost", path, body, WAIT)
                .await
                .unwrap();
            let status = r
                .grpc_status
                .unwrap_or_else(|| panic!("{what}: no grpc-status: {r:?}"));
            assert_ne!(status, 0, "{what} on {path} succeeded");
        }
    }
    let r = raw::call(
        &dra,
        "localhost",
        "/no.such.Service/Method",
        &raw::grpc_frame(&[]),
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!(r.grpc_status, Some(tonic::Code::Unimplemented as i32));

    // Still serving, through a normal client too.
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    assert_eq!(p.unprepare(&claims()).await.unwrap().len(), 2);
    assert!(plugin.child.id() > 0);
    assert!(!plugin.stderr().contains("panicked"));
}

#[tokio::test]
async fn json_logs_and_metrics_endpoint() {
    let dir = short_dir();
    let plugin = Plugin::start(
        dir.path(),
        &["--metrics-addr", "127.0.0.1:0", "--log-format", "json"],
    );
    plugin.wait_log("metrics endpoint listening").await;
    let addr = plugin
        .stderr()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("every log line is JSON"))
        .find(|v| v["message"] == "metrics endpoint listening")
        .and_then(|v| v["addr"].as_str().map(str::to_owned))
        .unwrap();
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    p.prepare(&claims()).await.unwrap();

    let text = http_get(&addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains(r#"gpu_kubelet_plugin_kubelet_requests_total{service="dra_v1",method="node_prepare_resources",result="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"gpu_kubelet_plugin_kubelet_claims_total{operation="prepare",result="error"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains("gpu_kubelet_plugin_kubelet_registered 1"),
        "{text}"
    );

    // Liveness through the registration socket: alive while it serves,
    // 503 once the socket is gone.
    let alive = http_get(&addr, "/healthz").await;
    assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
    std::fs::remove_file(plugin.reg_socket()).unwrap();
    let dead = http_get(&addr, "/healthz").await;
    assert!(dead.starts_with("HTTP/1.1 503"), "{dead}");
    assert!(dead.contains("registration socket"), "{dead}");
}
