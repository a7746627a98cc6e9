//! The plugin's sockets against grpc-go, the gRPC library kubelet is built
//! on (`gpu_dra_e2e::grpc_go`: the grpc-go of Kubernetes v1.37.2 through
//! `hack/grpc-go-kubelet`, dialling as kubelet 1.37 does and decoding each
//! reply with kubelet's generated types): the registration service's
//! `GetInfo` (grpc-go's own `:authority` for kubelet's plugin watcher, the
//! socket's path percent-encoded), and a claim prepared and unprepared over
//! DRAPlugin v1 and v1beta1, with each `:authority` a kubelet sends on a
//! Unix socket (grpc-go's own choice for kubelet's DRA client,
//! `localhost`; the percent-encoded path; and `localhost` set by the
//! caller), several calls on one connection, a malformed body and an
//! unknown method among them; and kubelet's device health watch
//! (`DRAResourceHealth`, v1alpha1 and v1) as a server stream beside those
//! calls.

mod common;

use std::path::Path;

use common::prepare::{VENDOR_KIND, node, result};
use common::{DRIVER, NODE};
use dra_proto::dra::{v1, v1beta1};
use dra_proto::registration::PluginInfo;
use gpu_dra_e2e::grpc_go::{GrpcGo, Status};
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use prost::Message;
use serde_json::json;

const V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
const V1BETA1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin";

/// The calls of two connections: a v1 prepare of `c`, a malformed body and
/// an unknown method; then unprepare, and prepare and unprepare again in
/// v1beta1.
fn calls(c: &Claim) -> [Vec<(String, Vec<u8>)>; 2] {
    let mut all = vec![
        (
            format!("{V1}/NodePrepareResources"),
            v1::NodePrepareResourcesRequest {
                claims: vec![c.to_v1()],
            }
            .encode_to_vec(),
        ),
        // Field 1 as a varint where a message is expected.
        (format!("{V1}/NodePrepareResources"), vec![0x08, 0x01]),
        (format!("{V1}/NoSuchMethod"), Vec::new()),
        (
            format!("{V1}/NodeUnprepareResources"),
            v1::NodeUnprepareResourcesRequest {
                claims: vec![c.to_v1()],
            }
            .encode_to_vec(),
        ),
        (
            format!("{V1BETA1}/NodePrepareResources"),
            v1beta1::NodePrepareResourcesRequest {
                claims: vec![c.to_v1beta1()],
            }
            .encode_to_vec(),
        ),
        (
            format!("{V1BETA1}/NodeUnprepareResources"),
            v1beta1::NodeUnprepareResourcesRequest {
                claims: vec![c.to_v1beta1()],
            }
            .encode_to_vec(),
        ),
    ];
    let second = all.split_off(3);
    [all, second]
}

/// Makes `calls` over one connection to `socket`.
fn call(
    go: &GrpcGo,
    socket: &Path,
    authority: Option<&str>,
    calls: &[(String, Vec<u8>)],
) -> Vec<Result<Vec<u8>, Status>> {
    let borrowed: Vec<(&str, Vec<u8>)> =
        calls.iter().map(|(m, b)| (m.as_str(), b.clone())).collect();
    go.calls(socket, authority, &borrowed).unwrap()
}

fn reply(r: &Result<Vec<u8>, Status>, what: &str, logs: &str) -> Vec<u8> {
    r.clone()
        .unwrap_or_else(|s| panic!("{what}: gRPC status {s:?}\n{logs}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_go_client_registers_prepares_and_unprepares_with_every_kubelet_authority() {
    let Some(go) = GrpcGo::detect_or_skip(
        "a_grpc_go_client_registers_prepares_and_unprepares_with_every_kubelet_authority",
    )
    .unwrap() else {
        return;
    };
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let dra = n.plugin.dra_socket();
    let reg = n.plugin.reg_socket();

    // Registration, as kubelet's plugin watcher asks.
    let info = go
        .calls(
            &reg,
            None,
            &[("/pluginregistration.Registration/GetInfo", Vec::new())],
        )
        .unwrap();
    let info = PluginInfo::decode(reply(&info[0], "GetInfo", &n.logs()).as_slice()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), dra);
    assert!(
        info.supported_versions.iter().any(|v| v == "v1.DRAPlugin")
            && info
                .supported_versions
                .iter()
                .any(|v| v == "v1beta1.DRAPlugin"),
        "{:?}",
        info.supported_versions
    );

    let path = dra.to_str().unwrap();
    let encoded: String = path.replace('/', "%2F");
    for (round, authority) in [None, Some(encoded.as_str()), Some("localhost")]
        .into_iter()
        .enumerate()
    {
        let c = n
            .claim(
                &format!("go-{round}"),
                json!([result("gpu", "gpu-1")]),
                json!([]),
            )
            .await;
        let [first, second] = calls(&c);
        let replies = call(&go, &dra, authority, &first);
        let logs = n.logs();
        let context = format!("authority {authority:?}");

        // v1 prepare: the GPU and its CDI device.
        let prepared = v1::NodePrepareResourcesResponse::decode(
            reply(&replies[0], &context, &logs).as_slice(),
        )
        .unwrap();
        let one = &prepared.claims[&c.uid];
        assert_eq!(one.error, "", "{context}");
        assert_eq!(one.devices.len(), 1, "{context}");
        let d = &one.devices[0];
        assert_eq!(
            (d.pool_name.as_str(), d.device_name.as_str()),
            (NODE, "gpu-1")
        );
        assert_eq!(
            d.cdi_device_ids,
            [format!("{VENDOR_KIND}={}-gpu-1", c.uid)],
            "{context}"
        );
        assert!(n.spec_path(&c).exists(), "{context}: no CDI spec");

        // A body that is no request: an error for that call only.
        let bad = replies[1]
            .clone()
            .expect_err("a malformed body was accepted");
        assert_ne!(bad.code, 0);
        assert!(bad.message.contains("decode"), "{context}: {bad:?}");
        // An unknown method: UNIMPLEMENTED.
        assert_eq!(
            replies[2]
                .clone()
                .expect_err("an unknown method answered")
                .code,
            12,
            "{context}"
        );

        // A second connection: v1 unprepare, then v1beta1.
        let replies = call(&go, &dra, authority, &second);
        let logs = n.logs();
        let unprepared = v1::NodeUnprepareResourcesResponse::decode(
            reply(&replies[0], &context, &logs).as_slice(),
        )
        .unwrap();
        assert_eq!(unprepared.claims[&c.uid].error, "", "{context}");

        // v1beta1, the same claim again, on the same connection.
        let prepared = v1beta1::NodePrepareResourcesResponse::decode(
            reply(&replies[1], &context, &logs).as_slice(),
        )
        .unwrap();
        let one = &prepared.claims[&c.uid];
        assert_eq!(one.error, "", "{context}");
        assert_eq!(one.devices[0].device_name, "gpu-1", "{context}");
        let unprepared = v1beta1::NodeUnprepareResourcesResponse::decode(
            reply(&replies[2], &context, &logs).as_slice(),
        )
        .unwrap();
        assert_eq!(unprepared.claims[&c.uid].error, "", "{context}");

        assert!(!n.spec_path(&c).exists(), "{context}: CDI spec left behind");
        assert!(
            n.checkpoint_claims().is_empty(),
            "{context}: {:?}",
            n.checkpoint_claims()
        );
    }
}

/// Kubelet's device health watch, through grpc-go: the stream opens on the
/// DRA socket with the list at once and stays open; the calls go on over
/// the same connection, during the stream and after kubelet cancels it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_go_client_watches_device_health_while_it_prepares() {
    use dra_proto::health::{v1 as health_v1, v1alpha1};
    use gpu_dra_e2e::grpc_go::StreamEnd;
    use std::time::Duration;

    let Some(go) =
        GrpcGo::detect_or_skip("a_grpc_go_client_watches_device_health_while_it_prepares").unwrap()
    else {
        return;
    };
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n.gpu_claim("go-health", "gpu-1").await;
    let mut kubelet = go
        .connect(&n.plugin.dra_socket(), Some("localhost"))
        .unwrap();
    let request = health_v1::NodeWatchResourcesRequest {}.encode_to_vec();

    for method in [
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        "/v1.DRAResourceHealth/NodeWatchResources",
    ] {
        // The list comes at once; kubelet then cancels the stream.
        let once = kubelet
            .stream(method, &request, 1, Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            once.end,
            StreamEnd::Cancelled,
            "{method}: {once:?}\n{}",
            n.logs()
        );
        assert_eq!(once.messages.len(), 1, "{method}");
        // Every device of the machine, healthy (the health monitor's list).
        let list =
            v1alpha1::NodeWatchResourcesResponse::decode(once.messages[0].as_slice()).unwrap();
        assert_eq!(list.devices.len(), 4, "{method}: {list:?}");
        assert!(
            list.devices
                .iter()
                .all(|d| d.health == i32::from(v1alpha1::HealthStatus::Healthy)),
            "{method}: {list:?}"
        );

        // The stream stays open after the list: waiting for a second one
        // ends at the client's deadline, not at the server's end.
        let open = kubelet
            .stream(method, &request, 2, Duration::from_millis(300))
            .unwrap();
        assert_eq!(open.messages.len(), 1, "{method}: {open:?}");
        match &open.end {
            StreamEnd::Failed(s) if s.code == 4 => {}
            other => panic!("{method}: the stream ended with {other:?}, not at the deadline"),
        }
    }

    // The same connection prepares and unprepares after the cancelled
    // streams (v1: the first call of each of `calls`' two connections).
    let [first, second] = calls(&c);
    let (prepare, unprepare) = (&first[0], &second[0]);
    let prepared = kubelet.call(&prepare.0, &prepare.1).unwrap();
    let prepared =
        v1::NodePrepareResourcesResponse::decode(reply(&prepared, "prepare", &n.logs()).as_slice())
            .unwrap();
    assert_eq!(prepared.claims[&c.uid].error, "");
    assert_eq!(prepared.claims[&c.uid].devices[0].device_name, "gpu-1");
    let unprepared = kubelet.call(&unprepare.0, &unprepare.1).unwrap();
    let unprepared = v1::NodeUnprepareResourcesResponse::decode(
        reply(&unprepared, "unprepare", &n.logs()).as_slice(),
    )
    .unwrap();
    assert_eq!(unprepared.claims[&c.uid].error, "");
    assert!(!n.spec_path(&c).exists());
}
