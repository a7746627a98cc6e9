//! NodePrepareResources / NodeUnprepareResources handling of the kubelet
//! plugin's `DRAPlugin` service (v1 and v1beta1), end to end: the input is
//! decoded as the request message kubelet sends and handed to the plugin's
//! real gRPC server (`gpu_kubelet_plugin::grpc::Server`) over its Unix
//! socket, with a preparer that answers from the claims themselves (no
//! hardware: succeeds, fails, forgets a claim or answers one nobody asked
//! about, as the claim's name says).
//!
//! Input: the first byte picks the version and the call (bit 0: v1beta1,
//! bit 1: unprepare); the rest is the protobuf request.
//!
//! Checked beyond "no panic": kubelet's response contract, which the
//! transport promises whatever the preparer does: exactly one answer per
//! distinct requested UID, no answer for anything else.

#![no_main]

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use dra_proto::dra::{v1, v1beta1};
use futures::future::BoxFuture;
use gpu_kubelet_plugin::grpc::{Config, Server, ServerHandle, Services};
use gpu_kubelet_plugin::prepare::claim::{
    ClaimError, ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice,
};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Answers each claim by the length of its name: 0 prepared (one device,
/// with a share id when the length is odd), 1 failed, 2 not answered,
/// 3 answered together with a UID nobody asked about.
struct ByName;

fn behaviour(c: &ClaimRef) -> usize {
    c.name.len() % 4
}

impl ClaimPreparer for ByName {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        Box::pin(async move {
            let mut out = HashMap::new();
            for c in claims {
                let device = PreparedDevice {
                    request_names: vec![c.name.clone()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={}-gpu-0", c.uid)],
                    share_id: (c.name.len() % 2 == 1).then(|| c.namespace.clone()),
                };
                match behaviour(c) {
                    0 => {
                        out.insert(c.uid.clone(), Ok(vec![device]));
                    }
                    1 => {
                        out.insert(c.uid.clone(), Err(ClaimError::Failed(c.namespace.clone())));
                    }
                    2 => {}
                    _ => {
                        out.insert(c.uid.clone(), Ok(vec![device.clone()]));
                        out.insert(format!("{}-stray", c.uid), Ok(vec![device]));
                    }
                }
            }
            out
        })
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        Box::pin(async move {
            let mut out = HashMap::new();
            for c in claims {
                match behaviour(c) {
                    0 => {
                        out.insert(c.uid.clone(), Ok(()));
                    }
                    1 => {
                        out.insert(c.uid.clone(), Err(ClaimError::Failed(c.namespace.clone())));
                    }
                    2 => {}
                    _ => {
                        out.insert(c.uid.clone(), Ok(()));
                        out.insert(format!("{}-stray", c.uid), Ok(()));
                    }
                }
            }
            out
        })
    }
}

/// The runtime, the server and a channel to its DRA socket, for the run.
struct Plugin {
    runtime: tokio::runtime::Runtime,
    channel: Channel,
    _server: ServerHandle,
    _dir: tempfile::TempDir,
}

static PLUGIN: LazyLock<Plugin> = LazyLock::new(|| {
    // Short: socket paths must fit into sun_path.
    let dir = tempfile::Builder::new()
        .prefix("fz")
        .tempdir_in("/tmp")
        .expect("a temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let config = Config::new(
        "gpu.nvidia.com",
        dir.path().join("reg"),
        dir.path().join("plugins"),
    );
    let services = Services {
        preparer: Arc::new(ByName),
        ..Services::default()
    };
    let (server, channel) = runtime.block_on(async {
        let server = Server::start(config, services)
            .await
            .expect("the server starts");
        let path: PathBuf = server.dra_socket().to_owned();
        let channel =
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .expect("a channel to the DRA socket");
        (server, channel)
    });
    Plugin {
        runtime,
        channel,
        _server: server,
        _dir: dir,
    }
});

/// The distinct UIDs asked about.
fn asked<'a>(uids: impl Iterator<Item = &'a String>) -> BTreeSet<String> {
    uids.cloned().collect()
}

fn check(call: &str, requested: BTreeSet<String>, answered: BTreeSet<String>) {
    assert_eq!(
        answered, requested,
        "{call}: the answers are not one per requested UID"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let plugin = &*PLUGIN;
    let channel = plugin.channel.clone();
    plugin.runtime.block_on(async move {
        match selector & 3 {
            0 => {
                let Ok(req) = v1::NodePrepareResourcesRequest::decode(body) else {
                    return;
                };
                let want = asked(req.claims.iter().map(|c| &c.uid));
                let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
                let resp = client
                    .node_prepare_resources(req)
                    .await
                    .expect("v1 prepare answered");
                check(
                    "v1 prepare",
                    want,
                    resp.into_inner().claims.into_keys().collect(),
                );
            }
            1 => {
                let Ok(req) = v1beta1::NodePrepareResourcesRequest::decode(body) else {
                    return;
                };
                let want = asked(req.claims.iter().map(|c| &c.uid));
                let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(channel);
                let resp = client
                    .node_prepare_resources(req)
                    .await
                    .expect("v1beta1 prepare answered");
                check(
                    "v1beta1 prepare",
                    want,
                    resp.into_inner().claims.into_keys().collect(),
                );
            }
            2 => {
                let Ok(req) = v1::NodeUnprepareResourcesRequest::decode(body) else {
                    return;
                };
                let want = asked(req.claims.iter().map(|c| &c.uid));
                let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
                let resp = client
                    .node_unprepare_resources(req)
                    .await
                    .expect("v1 unprepare answered");
                check(
                    "v1 unprepare",
                    want,
                    resp.into_inner().claims.into_keys().collect(),
                );
            }
            _ => {
                let Ok(req) = v1beta1::NodeUnprepareResourcesRequest::decode(body) else {
                    return;
                };
                let want = asked(req.claims.iter().map(|c| &c.uid));
                let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(channel);
                let resp = client
                    .node_unprepare_resources(req)
                    .await
                    .expect("v1beta1 unprepare answered");
                check(
                    "v1beta1 unprepare",
                    want,
                    resp.into_inner().claims.into_keys().collect(),
                );
            }
        }
    });
});
