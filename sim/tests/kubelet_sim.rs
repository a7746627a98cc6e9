//! The kubelet simulator against a small in-test plugin (registration and
//! DRAPlugin v1 on one Unix socket): the `kubelet-sim` binary's
//! registration, version choice, JSON output and one-line errors, and the
//! registrar's handling of a second plugin claiming a taken endpoint, and
//! the retries of a GetInfo that a plugin too busy did not answer in time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dra_proto::dra::v1;
use dra_proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse, registration_server,
};
use gpu_dra_sim::kubelet::{KubeletSim, RegistrarEvent};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const BIN: &str = env!("CARGO_BIN_EXE_kubelet-sim");

/// A plugin that prepares one device per claim; with `drop_claims` it
/// answers a UID nobody asked for instead. Its first `slow_get_infos`
/// GetInfo calls answer after 1.5 s, past kubelet's 1 s deadline.
#[derive(Clone, Default)]
struct TestPlugin {
    versions: Vec<String>,
    endpoint: String,
    drop_claims: bool,
    notified: Arc<Mutex<Vec<(bool, String)>>>,
    slow_get_infos: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl registration_server::Registration for TestPlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        let slow = self
            .slow_get_infos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if slow {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        Ok(Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "test.example.com".into(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        self.notified
            .lock()
            .unwrap()
            .push((r.plugin_registered, r.error));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for TestPlugin {
    async fn node_prepare_resources(
        &self,
        r: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = r
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let uid = if self.drop_claims {
                    "other".to_owned()
                } else {
                    c.uid.clone()
                };
                let device = v1::Device {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec![format!("k8s.test.example.com/claim={}-gpu-0", c.uid)],
                    share_id: None,
                };
                (
                    uid,
                    v1::NodePrepareResourceResponse {
                        devices: vec![device],
                        error: String::new(),
                    },
                )
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = r
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                (
                    c.uid,
                    v1::NodeUnprepareResourceResponse {
                        error: String::new(),
                    },
                )
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    plugin: TestPlugin,
}

/// A directory whose socket paths fit a UNIX socket address.
fn short_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("k")
        .tempdir_in("/tmp")
        .unwrap()
}

/// A plugin serving on `<dir>/<file>` whose first `slow` GetInfo calls miss
/// kubelet's deadline.
fn busy(dir: &Path, file: &str, slow: usize) -> (PathBuf, TestPlugin) {
    let socket = dir.join(file);
    let plugin = TestPlugin {
        slow_get_infos: Arc::new(AtomicUsize::new(slow)),
        ..plugin_at(&socket)
    };
    serve_on(&socket, &plugin);
    (socket, plugin)
}

fn serve(plugin: TestPlugin) -> Served {
    let dir = short_dir();
    let socket = dir.path().join("test.example.com-reg.sock");
    serve_on(&socket, &plugin);
    Served {
        _dir: dir,
        socket,
        plugin,
    }
}

fn serve_on(socket: &Path, plugin: &TestPlugin) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(socket).unwrap();
    let router = tonic::transport::Server::builder()
        .add_service(registration_server::RegistrationServer::new(plugin.clone()))
        .add_service(v1::dra_plugin_server::DraPluginServer::new(plugin.clone()));
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    })
}

fn both_versions() -> TestPlugin {
    TestPlugin {
        versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
        ..TestPlugin::default()
    }
}

/// A plugin of both versions whose endpoint is `socket`.
fn plugin_at(socket: &Path) -> TestPlugin {
    TestPlugin {
        endpoint: socket.to_str().unwrap().to_owned(),
        ..both_versions()
    }
}

async fn sim(socket: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_clear()
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn register_prints_the_plugin_and_notifies_it() {
    let s = serve(both_versions());
    let (code, out, err) = sim(&s.socket, &["register"]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["name"], "test.example.com");
    assert_eq!(v["dra_version"], "v1.DRAPlugin");
    // Empty endpoint: the registration socket serves DRA too.
    assert_eq!(v["endpoint"], s.socket.to_str().unwrap());
    assert_eq!(
        *s.plugin.notified.lock().unwrap(),
        vec![(true, String::new())]
    );
}

#[tokio::test]
async fn prepare_and_unprepare_print_per_claim_results() {
    let s = serve(both_versions());
    let (code, out, err) = sim(
        &s.socket,
        &[
            "prepare",
            "--claim",
            "default/c1/uid-1",
            "--claim",
            "ns2/c2/uid-2",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["uid-1"]["devices"][0]["cdi_device_ids"][0],
        "k8s.test.example.com/claim=uid-1-gpu-0"
    );
    assert_eq!(v["uid-2"]["devices"][0]["request_names"][0], "gpu");
    assert!(v["uid-1"].get("error").is_none());

    let (code, out, err) = sim(&s.socket, &["unprepare", "--claim", "default/c1/uid-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!({"uid-1": {}})
    );
}

#[tokio::test]
async fn a_response_with_the_wrong_claims_fails() {
    let s = serve(TestPlugin {
        drop_claims: true,
        ..both_versions()
    });
    let (code, out, err) = sim(&s.socket, &["prepare", "--claim", "default/c1/uid-1"]).await;
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: NodePrepareResources answered the wrong claims"),
        "{err}"
    );
    assert!(
        err.contains("missing [\"uid-1\"]") && err.contains("unexpected [\"other\"]"),
        "{err}"
    );
}

#[tokio::test]
async fn an_old_kubelet_rejects_a_v1_only_plugin_and_says_why() {
    let s = serve(TestPlugin {
        versions: vec!["v1.DRAPlugin".into()],
        ..TestPlugin::default()
    });
    let (code, _, err) = sim(
        &s.socket,
        &["--dra-versions", "v1beta1.DRAPlugin", "register"],
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.starts_with("error: registration of"), "{err}");
    assert!(err.contains("none of the versions"), "{err}");
    let notified = s.plugin.notified.lock().unwrap().clone();
    assert_eq!(notified.len(), 1);
    assert!(!notified[0].0);
    assert!(notified[0].1.contains("v1beta1.DRAPlugin"), "{notified:?}");
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let s = serve(both_versions());
    let (code, _, err) = sim(&s.socket, &["prepare", "--claim", "only/two"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("expected namespace/name/uid"), "{err}");
    let (code, _, err) = sim(&s.socket, &["--dra-versions", "v9.Nope", "register"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("unknown DRAPlugin version"), "{err}");
    let missing = s.socket.with_file_name("missing.sock");
    let (code, _, err) = sim(&missing, &["--wait", "0", "register"]).await;
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: registration socket") && err.contains("did not appear"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
}

#[tokio::test]
async fn a_plugin_too_busy_for_get_info_is_registered_on_a_retry() {
    let dir = short_dir();
    let (socket, plugin) = busy(dir.path(), "busy-reg.sock", 2);
    let begun = Instant::now();
    let mut registrar = KubeletSim::new().watch_registrar(dir.path());
    let p = registrar
        .wait_registered("test.example.com", Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(p.registration_socket, socket);
    // Two missed deadlines, each followed by the one-second retry delay.
    assert!(
        begun.elapsed() >= Duration::from_secs(4),
        "{:?}",
        begun.elapsed()
    );
    assert_eq!(plugin.slow_get_infos.load(Ordering::SeqCst), 0);
    // Only the attempt that got an answer told the plugin anything.
    assert_eq!(*plugin.notified.lock().unwrap(), [(true, String::new())]);

    // Still too busy when the wait ends: the error names the last failure.
    let other = short_dir();
    let (_socket, plugin) = busy(other.path(), "busier-reg.sock", usize::MAX);
    let mut registrar = KubeletSim::new().watch_registrar(other.path());
    let err = registrar
        .wait_registered("test.example.com", Duration::from_millis(2500))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("plugin test.example.com to register")
            && err.contains("busier-reg.sock")
            && err.contains("GetInfo"),
        "{err}"
    );
    assert!(plugin.notified.lock().unwrap().is_empty());
}

#[tokio::test]
async fn register_tries_a_get_info_past_its_deadline_again_a_few_times() {
    let dir = short_dir();
    let (socket, plugin) = busy(dir.path(), "busy-reg.sock", 1);
    let p = KubeletSim::new().register(&socket).await.unwrap();
    assert_eq!(p.registration_socket, socket);
    assert_eq!(plugin.slow_get_infos.load(Ordering::SeqCst), 0);
    assert_eq!(*plugin.notified.lock().unwrap(), [(true, String::new())]);

    // A plugin that never answers in time: the last try's timeout.
    let (socket, plugin) = busy(dir.path(), "stuck-reg.sock", usize::MAX);
    let begun = Instant::now();
    let err = KubeletSim::new().register(&socket).await.unwrap_err();
    assert!(
        matches!(
            err,
            gpu_dra_sim::kubelet::Error::Timeout {
                method: "GetInfo",
                ..
            }
        ),
        "{err}"
    );
    let tries = gpu_dra_sim::kubelet::REGISTER_TRIES;
    // Each try waits out the 1 s deadline, with a 1 s pause between tries.
    let least = Duration::from_secs(u64::from(2 * tries - 1));
    assert!(begun.elapsed() >= least, "{:?}", begun.elapsed());
    assert_eq!(
        plugin.slow_get_infos.load(Ordering::SeqCst),
        usize::MAX - tries as usize
    );
    assert!(plugin.notified.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_registrar_refuses_a_taken_endpoint_and_notices_deletions() {
    let dir = short_dir();
    let a = dir.path().join("a-reg.sock");
    let b = dir.path().join("b-reg.sock");
    let plugin = plugin_at(&a);
    serve_on(&a, &plugin);
    let wait = std::time::Duration::from_secs(10);
    let mut registrar = KubeletSim::new().watch_registrar(dir.path());
    let p = registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(p.registration_socket, a);
    assert_eq!(p.endpoint, a);

    // A second registration socket advertising the same endpoint.
    serve_on(&b, &plugin);
    match registrar.next_event(wait).await.unwrap() {
        RegistrarEvent::Rejected {
            socket,
            reason,
            told,
        } => {
            assert_eq!(socket, b);
            assert!(told, "the plugin is told of this rejection");
            assert!(reason.contains("already registered"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let notified = plugin.notified.lock().unwrap().clone();
    assert_eq!(notified.len(), 2);
    assert!(notified[0].0 && !notified[1].0, "{notified:?}");

    // Deleting a registration socket deregisters its plugin.
    std::fs::remove_file(&a).unwrap();
    registrar
        .wait_deregistered("test.example.com", wait)
        .await
        .unwrap();
    assert!(registrar.plugin("test.example.com").is_none());
}

#[tokio::test]
async fn of_two_plugins_of_one_driver_the_last_registered_is_called() {
    let dir = short_dir();
    let old = dir.path().join("a-reg.sock");
    let new = dir.path().join("b-reg.sock");
    let wait = std::time::Duration::from_secs(10);
    serve_on(&old, &plugin_at(&old));
    let mut registrar = KubeletSim::new().watch_registrar(dir.path());
    registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(registrar.plugin("test.example.com").unwrap().endpoint, old);

    // A rolling update's new plugin, registered later: it is the one
    // called, though the old one's socket comes first in the directory.
    serve_on(&new, &plugin_at(&new));
    registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(registrar.plugin("test.example.com").unwrap().endpoint, new);
    std::fs::remove_file(&new).unwrap();
    registrar
        .wait_deregistered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(registrar.plugin("test.example.com").unwrap().endpoint, old);
}

#[tokio::test]
async fn a_socket_bound_again_at_the_same_path_is_a_new_registration() {
    let dir = short_dir();
    let socket = dir.path().join("test.example.com-reg.sock");
    let plugin = plugin_at(&socket);
    let mut server = serve_on(&socket, &plugin);
    let wait = std::time::Duration::from_secs(10);
    let mut registrar = KubeletSim::new().watch_registrar(dir.path());
    registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    // The server gone and another bound at the same path between two
    // looks at the directory (a plugin restarted, or its successor taking
    // over): the file system often hands the freed inode number out again.
    for round in 0..5 {
        server.abort();
        let _ = (&mut server).await;
        std::fs::remove_file(&socket).unwrap();
        server = serve_on(&socket, &plugin);
        registrar
            .wait_deregistered("test.example.com", wait)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        registrar
            .wait_registered("test.example.com", wait)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    assert_eq!(plugin.notified.lock().unwrap().len(), 6);
}

/// Kubelet's reconciler runs one operation per socket path at a time: a
/// socket replaced under the same name is deregistered on one pass and
/// registered on the next, a period later; a successor on a name of its
/// own is registered while its predecessor still is.
#[tokio::test]
async fn a_replaced_socket_waits_a_pass_and_a_new_name_does_not() {
    let period = std::time::Duration::from_millis(300);
    let wait = std::time::Duration::from_secs(10);
    let dir = short_dir();
    let socket = dir.path().join("test.example.com-reg.sock");
    let plugin = plugin_at(&socket);
    let mut server = serve_on(&socket, &plugin);
    let mut registrar = KubeletSim::new()
        .with_reconcile_period(period)
        .watch_registrar(dir.path());
    registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();

    // The same name: a pass without the driver.
    server.abort();
    let _ = (&mut server).await;
    std::fs::remove_file(&socket).unwrap();
    let _server = serve_on(&socket, &plugin);
    registrar
        .wait_deregistered("test.example.com", wait)
        .await
        .unwrap();
    let gone = std::time::Instant::now();
    assert!(registrar.plugin("test.example.com").is_none());
    registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    let gap = gone.elapsed();
    assert!(
        gap >= period.mul_f64(0.8),
        "registered again after {gap:?}, within one pass of {period:?}"
    );

    // A name of its own: registered beside the old one, called from then.
    let successor = dir.path().join("test.example.com-0a1b2c3d-reg.sock");
    let next = plugin_at(&successor);
    let _next = serve_on(&successor, &next);
    let newest = registrar
        .wait_registered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(newest.registration_socket, successor);
    assert_eq!(
        registrar.plugin("test.example.com").unwrap().endpoint,
        successor
    );
    // The old one's socket goes: the driver keeps its plugin throughout.
    std::fs::remove_file(&socket).unwrap();
    registrar
        .wait_deregistered("test.example.com", wait)
        .await
        .unwrap();
    assert_eq!(
        registrar.plugin("test.example.com").unwrap().endpoint,
        successor
    );
}
