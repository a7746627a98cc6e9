use std::os::unix::fs::PermissionsExt;

use dra_proto::dra::v1;
use dra_proto::dra::v1::dra_plugin_client::DraPluginClient;
use dra_proto::registration::registration_client::RegistrationClient;
use dra_proto::registration::{InfoRequest, RegistrationStatus as WireStatus};
use tonic::transport::Channel;

use super::*;
use crate::grpc::dra::NotImplementedPreparer;
use crate::grpc::handover::Handover;
use crate::prepare::claim::{ClaimRef, ClaimResults, PreparedDevice};

/// The services of these tests: a preparer that prepares nothing.
fn test_services() -> Services {
    Services {
        preparer: Arc::new(NotImplementedPreparer),
        ..Services::default()
    }
}

fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("g")
        .tempdir_in("/tmp")
        .unwrap()
}

fn config(dir: &Path) -> Config {
    let mut c = Config::new("gpu.nvidia.com", dir.join("reg"), dir.join("plugins"));
    c.drain_timeout = Duration::from_secs(5);
    c
}

async fn channel(path: &Path) -> Channel {
    crate::grpc::handover::connect(path).await.unwrap()
}

#[test]
fn driver_names_must_be_dns_subdomains() {
    validate_driver_name("gpu.nvidia.com").unwrap();
    for bad in [
        "",
        "../x",
        "a/b",
        "GPU.nvidia.com",
        "-x",
        "x.",
        &"a".repeat(64),
    ] {
        let e = validate_driver_name(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidDriverName { .. }), "{bad:?}: {e}");
    }
}

#[test]
fn socket_paths_follow_the_kubelet_conventions() {
    let c = Config::new("gpu.nvidia.com", "/r", "/p");
    assert_eq!(
        c.registration_socket(),
        Path::new("/r/gpu.nvidia.com-reg.sock")
    );
    assert_eq!(c.dra_socket(), Path::new("/p/gpu.nvidia.com/dra.sock"));
}

#[tokio::test]
async fn registration_info_and_status_round_trip() {
    let t = short_tempdir();
    let handle = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    let mut reg = RegistrationClient::new(channel(handle.registration_socket()).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(Path::new(&info.endpoint), handle.dra_socket());
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(info.supported_versions, SUPPORTED_VERSIONS);

    let mut status = handle.registration_status();
    assert_eq!(*status.borrow(), RegistrationStatus::Pending);
    reg.notify_registration_status(WireStatus {
        plugin_registered: false,
        error: "no version in common".into(),
    })
    .await
    .unwrap();
    status.changed().await.unwrap();
    assert_eq!(
        *status.borrow(),
        RegistrationStatus::Rejected("no version in common".into())
    );
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_removes_both_sockets_and_ends_health_streams() {
    let t = short_tempdir();
    let handle = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    let reg_path = handle.registration_socket().to_owned();
    let dra_path = handle.dra_socket().to_owned();
    let mut health =
        dra_proto::health::v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(&dra_path).await,
        );
    let mut stream = health
        .node_watch_resources(dra_proto::health::v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().devices.is_empty());

    let dir_mode = std::fs::metadata(dra_path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o750);
    tokio::time::timeout(Duration::from_secs(5), handle.shutdown())
        .await
        .expect("shutdown hung on an open health stream")
        .unwrap();
    assert!(!reg_path.exists());
    assert!(!dra_path.exists());
    assert!(stream.message().await.unwrap_or(None).is_none());
}

#[tokio::test]
async fn a_failed_start_leaves_nothing_behind() {
    let t = short_tempdir();
    let c = config(t.path());
    std::fs::create_dir_all(&c.registrar_dir).unwrap();
    std::fs::write(c.registration_socket(), b"not a socket").unwrap();
    let e = Server::start(c.clone(), test_services()).await.unwrap_err();
    assert!(matches!(e, Error::NotASocket { .. }), "{e}");
    assert!(!c.dra_socket().exists());
    // The file in the way is untouched.
    assert_eq!(
        std::fs::read(c.registration_socket()).unwrap(),
        b"not a socket"
    );
}

#[tokio::test]
async fn a_second_instance_is_refused_and_dropping_cleans_up() {
    let t = short_tempdir();
    let first = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    let e = Server::start(config(t.path()), test_services())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
    let reg = first.registration_socket().to_owned();
    assert!(reg.exists());
    drop(first);
    assert!(!reg.exists());
    // The lock is free again (once a child another test thread forked
    // meanwhile has exec'd and closed its copy of the lock's file).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let again = loop {
        match Server::start(config(t.path()), test_services()).await {
            Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break other,
        }
    };
    again.unwrap().shutdown().await.unwrap();
}

#[tokio::test]
async fn prepare_through_the_socket_answers_every_claim() {
    let t = short_tempdir();
    let handle = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    let mut dra = DraPluginClient::new(channel(handle.dra_socket()).await);
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![
                v1::Claim {
                    namespace: "default".into(),
                    uid: "u1".into(),
                    name: "c1".into(),
                },
                v1::Claim {
                    namespace: "default".into(),
                    uid: String::new(),
                    name: "c2".into(),
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let mut keys: Vec<_> = resp.claims.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["", "u1"]);
    assert!(resp.claims["u1"].error.contains("not implemented yet"));
    assert!(resp.claims[""].error.contains("empty"));
    handle.shutdown().await.unwrap();
}

/// Unprepares only once released, to have a call in flight during
/// shutdown; says when a call has arrived.
#[derive(Default)]
struct Slow {
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl ClaimPreparer for Slow {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> futures::future::BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        NotImplementedPreparer.prepare(claims)
    }

    fn unprepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> futures::future::BoxFuture<'a, ClaimResults<()>> {
        Box::pin(async move {
            self.arrived.notify_one();
            self.release.notified().await;
            claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect()
        })
    }
}

fn slow_call(
    mut dra: DraPluginClient<Channel>,
) -> tokio::task::JoinHandle<
    Result<tonic::Response<v1::NodeUnprepareResourcesResponse>, tonic::Status>,
> {
    tokio::spawn(async move {
        dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "default".into(),
                uid: "slow".into(),
                name: "c".into(),
            }],
        })
        .await
    })
}

#[tokio::test]
async fn shutdown_drains_in_flight_calls_after_deregistering() {
    let t = short_tempdir();
    let slow = Arc::new(Slow::default());
    let services = Services {
        preparer: slow.clone(),
        ..test_services()
    };
    let handle = Server::start(config(t.path()), services).await.unwrap();
    let reg_path = handle.registration_socket().to_owned();
    let call = slow_call(DraPluginClient::new(channel(handle.dra_socket()).await));
    slow.arrived.notified().await;
    let shutdown = tokio::spawn(handle.shutdown());
    while reg_path.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !shutdown.is_finished(),
        "shutdown did not wait for the call"
    );
    slow.release.notify_one();
    let resp = call.await.unwrap().unwrap().into_inner();
    assert_eq!(resp.claims["slow"].error, "");
    shutdown.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_drain_gives_up_at_its_timeout() {
    let t = short_tempdir();
    let mut c = config(t.path());
    c.drain_timeout = Duration::from_millis(100);
    let slow = Arc::new(Slow::default());
    let services = Services {
        preparer: slow.clone(),
        ..test_services()
    };
    let handle = Server::start(c, services).await.unwrap();
    let dra_path = handle.dra_socket().to_owned();
    let _call = slow_call(DraPluginClient::new(channel(&dra_path).await));
    slow.arrived.notified().await;
    let e = handle.shutdown().await.unwrap_err();
    assert!(matches!(e, Error::DrainTimeout { .. }), "{e}");
    assert!(!dra_path.exists());
}

/// Prepares every claim with one device named after the instance.
struct Named(&'static str);

impl ClaimPreparer for Named {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> futures::future::BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        let device = PreparedDevice {
            request_names: vec![],
            pool_name: "node".into(),
            device_name: self.0.into(),
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={}", self.0)],
            share_id: None,
        };
        Box::pin(async move {
            claims
                .iter()
                .map(|c| (c.uid.clone(), Ok(vec![device.clone()])))
                .collect()
        })
    }

    fn unprepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> futures::future::BoxFuture<'a, ClaimResults<()>> {
        NotImplementedPreparer.unprepare(claims)
    }
}

fn named(name: &'static str) -> Services {
    Services {
        preparer: Arc::new(Named(name)),
        ..test_services()
    }
}

/// The answer over `channel` to a v1 prepare of claim `uid`.
async fn prepare_over(
    channel: Channel,
    uid: &str,
) -> Result<v1::NodePrepareResourcesResponse, tonic::Status> {
    Ok(DraPluginClient::new(channel)
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: "c".into(),
            }],
        })
        .await?
        .into_inner())
}

/// Which instance prepared claim `uid` over `channel`.
async fn who_prepares(channel: Channel, uid: &str) -> Result<String, tonic::Status> {
    let resp = prepare_over(channel, uid).await?;
    Ok(resp.claims[uid].devices[0].device_name.clone())
}

/// The configuration of an instance with socket tag `tag` under `dir`.
fn tagged(dir: &Path, tag: &str) -> Config {
    config(dir).with_instance(Some(tag.into()))
}

/// A dead instance with tag `tag` under `dir`: its sockets, nobody
/// listening, and a lock file nobody holds.
fn dead_instance(dir: &Path, tag: &str) -> Config {
    let dead = tagged(dir, tag);
    std::fs::create_dir_all(dead.dra_dir()).unwrap();
    std::fs::create_dir_all(&dead.registrar_dir).unwrap();
    drop(std::os::unix::net::UnixListener::bind(dead.dra_socket()).unwrap());
    drop(std::os::unix::net::UnixListener::bind(dead.registration_socket()).unwrap());
    std::fs::write(sockets::lock_path(&dead.dra_socket()), b"").unwrap();
    dead
}

#[tokio::test]
async fn a_waiting_instance_forwards_to_the_serving_one_then_serves_itself() {
    let t = short_tempdir();
    // The old instance, with the shared names, as a version before
    // per-instance sockets runs.
    let old = Server::start(config(t.path()), named("old")).await.unwrap();
    let new_config = tagged(t.path(), "0a1b2c3d");
    let bound = Server::bind(new_config.clone(), test_services())
        .await
        .unwrap();
    let new_dra = bound.handle().dra_socket().to_owned();
    assert_eq!(new_dra, new_config.dra_socket());
    assert!(new_dra.ends_with("gpu.nvidia.com/dra-0a1b2c3d.sock"));
    assert!(
        new_config
            .registration_socket()
            .ends_with("gpu.nvidia.com-0a1b2c3d-reg.sock")
    );
    // Both registration sockets live: kubelet can know both instances.
    assert!(old.registration_socket().exists());
    let info = RegistrationClient::new(channel(bound.handle().registration_socket()).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.endpoint, new_dra.to_string_lossy());

    // While waiting, the new instance's socket answers as the old one.
    let kubelet = channel(&new_dra).await;
    assert_eq!(who_prepares(kubelet.clone(), "u1").await.unwrap(), "old");
    assert_eq!(bound.forwarded(), 1);

    // The old instance goes; a call on the same connection waits for the
    // new instance to serve, and is then answered by it.
    old.shutdown().await.unwrap();
    let waiting = tokio::spawn(who_prepares(kubelet.clone(), "u2"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "answered before anybody serves");
    let new = bound.serve(Arc::new(Named("new")));
    assert_eq!(waiting.await.unwrap().unwrap(), "new");
    let link = new_config.dra_dir().join(instance::SERVING_LINK);
    assert_eq!(std::fs::read_link(&link).unwrap(), new.dra_socket());
    assert_eq!(
        who_prepares(channel(new.dra_socket()).await, "u3")
            .await
            .unwrap(),
        "new"
    );

    // Its own files go with it: sockets, lock, the link that names it.
    let lock = sockets::lock_path(new.dra_socket());
    assert!(lock.exists());
    new.shutdown().await.unwrap();
    for gone in [
        new_config.dra_socket(),
        new_config.registration_socket(),
        lock,
        link,
    ] {
        assert!(
            std::fs::symlink_metadata(&gone).is_err(),
            "{} is left",
            gone.display()
        );
    }
}

#[tokio::test]
async fn a_successor_forwards_through_the_serving_link_of_a_tagged_instance() {
    let t = short_tempdir();
    let first = Server::start(tagged(t.path(), "11111111"), named("first"))
        .await
        .unwrap();
    let second = Server::bind(tagged(t.path(), "22222222"), test_services())
        .await
        .unwrap();
    // No dra.sock anywhere: only the link leads to the first instance.
    assert!(!config(t.path()).dra_socket().exists());
    let ch = channel(second.handle().dra_socket()).await;
    assert_eq!(who_prepares(ch, "u").await.unwrap(), "first");
    // A bound instance that never served removes its files when dropped,
    // and leaves the serving link, which names the first, alone.
    let own = second.handle().dra_socket().to_owned();
    drop(second);
    assert!(!own.exists());
    assert!(!sockets::lock_path(&own).exists());
    let link = config(t.path()).dra_dir().join(instance::SERVING_LINK);
    assert_eq!(std::fs::read_link(&link).unwrap(), first.dra_socket());
    first.shutdown().await.unwrap();
}

/// A socket that passes each connection on to another, counting them.
struct CountingProxy {
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    fn start(path: &Path, to: &Path) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (counted, still_open, to) = (accepted.clone(), open.clone(), to.to_owned());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                still_open.fetch_add(1, Ordering::SeqCst);
                let (still_open, to) = (still_open.clone(), to.clone());
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::UnixStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                    still_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            accepted,
            open,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `done` for up to 5 s.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 5 s: {what}");
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: "c".into(),
        uid: uid.into(),
    }
}

/// The name of the device `preparer` prepared for claim `uid`.
async fn prepared_by(preparer: &dyn ClaimPreparer, uid: &str) -> String {
    let mut answer = preparer.prepare(&[claim_ref(uid)]).await;
    answer.remove(uid).unwrap().unwrap()[0].device_name.clone()
}

#[tokio::test]
async fn calls_passed_on_share_one_connection_which_the_take_over_closes() {
    let t = short_tempdir();
    let old = Server::start(config(t.path()), named("old")).await.unwrap();
    let proxy_path = t.path().join("proxy.sock");
    let proxy = CountingProxy::start(&proxy_path, old.dra_socket());
    let handover = Handover::new(vec![proxy_path]);

    for uid in ["u1", "u2", "u3"] {
        assert_eq!(prepared_by(&handover, uid).await, "old");
    }
    assert_eq!(handover.forwarded(), 3);
    assert_eq!(proxy.accepted(), 1, "one connection for three calls");
    assert_eq!(proxy.open(), 1);

    handover.take_over(Arc::new(Named("new")));
    assert!(!handover.has_connection());
    eventually("the connection to the old instance closes", || {
        proxy.open() == 0
    })
    .await;
    assert_eq!(prepared_by(&handover, "u4").await, "new");
    assert_eq!((proxy.accepted(), handover.forwarded()), (1, 3));
    old.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_call_that_fails_lets_the_connection_go_and_the_next_connects_afresh() {
    let t = short_tempdir();
    let old = Server::start(config(t.path()), named("old")).await.unwrap();
    let handover = Arc::new(Handover::new(vec![old.dra_socket().to_owned()]));
    assert_eq!(prepared_by(handover.as_ref(), "u1").await, "old");
    assert!(handover.has_connection());

    // The serving instance goes: the next call fails over the kept
    // connection and waits for the take-over.
    old.shutdown().await.unwrap();
    let waiting = tokio::spawn({
        let handover = handover.clone();
        async move { prepared_by(handover.as_ref(), "u2").await }
    });
    eventually("the failed call lets the connection go", || {
        !handover.has_connection()
    })
    .await;
    assert!(!waiting.is_finished());

    // Another instance serves at that socket: a new call reaches it over
    // a new connection.
    let other = Server::start(config(t.path()), named("other"))
        .await
        .unwrap();
    assert_eq!(prepared_by(handover.as_ref(), "u3").await, "other");
    assert_eq!(handover.forwarded(), 2);

    handover.take_over(Arc::new(Named("new")));
    assert_eq!(waiting.await.unwrap(), "new");
    other.shutdown().await.unwrap();
}

/// Two calls that fail on one connection, one late: the late one lets go
/// only that connection, not the one a call in between made since.
#[tokio::test]
async fn a_late_failure_on_an_old_connection_keeps_the_new_one() {
    let t = short_tempdir();
    let old = Server::start(config(t.path()), named("old")).await.unwrap();
    let handover = Handover::new(vec![old.dra_socket().to_owned()]);
    let first = handover.serving_instance().await.unwrap();
    // The first failure lets it go; the next call connects afresh.
    handover.forget_connection(first.id);
    assert!(!handover.has_connection());
    let second = handover.serving_instance().await.unwrap();
    assert_ne!(first.id, second.id);
    // The second failure on the first connection comes late.
    handover.forget_connection(first.id);
    assert!(handover.has_connection(), "the newer connection was let go");
    assert_eq!(handover.serving_instance().await.unwrap().id, second.id);
    handover.forget_connection(second.id);
    assert!(!handover.has_connection());
    old.shutdown().await.unwrap();
}

#[tokio::test]
async fn binding_removes_the_sockets_of_dead_instances_only() {
    let t = short_tempdir();
    let live = Server::start(tagged(t.path(), "aaaaaaaa"), test_services())
        .await
        .unwrap();
    let dead = dead_instance(t.path(), "dddddddd");

    let bound = Server::bind(tagged(t.path(), "bbbbbbbb"), test_services())
        .await
        .unwrap();
    for gone in [
        dead.dra_socket(),
        dead.registration_socket(),
        sockets::lock_path(&dead.dra_socket()),
    ] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    assert!(live.dra_socket().exists());
    assert!(live.registration_socket().exists());
    drop(bound);
    live.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_serving_instances_claim_errors_reach_kubelet_as_they_are() {
    let t = short_tempdir();
    let old = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    let bound = Server::bind(tagged(t.path(), "0a1b2c3d"), test_services())
        .await
        .unwrap();
    let resp = prepare_over(channel(bound.handle().dra_socket()).await, "u")
        .await
        .unwrap();
    assert!(
        resp.claims["u"].error.contains("not implemented yet"),
        "{:?}",
        resp.claims
    );
    assert_eq!(bound.forwarded(), 1);
    drop(bound);
    old.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_instance_with_the_shared_names_clears_dead_tagged_ones_too() {
    let t = short_tempdir();
    let dead = dead_instance(t.path(), "dddddddd");
    let shared = Server::start(config(t.path()), test_services())
        .await
        .unwrap();
    assert!(!dead.dra_socket().exists());
    assert!(!dead.registration_socket().exists());
    assert!(shared.registration_socket().exists());
    shared.shutdown().await.unwrap();
}
