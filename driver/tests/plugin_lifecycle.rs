//! The real plugin binary's startup and shutdown: socket hygiene (modes,
//! stale sockets, no hijacking), signals, and bad input at startup.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{
    DRIVER, Plugin, assert_one_line_error, http_get, prepare, run_to_exit, short_dir, wait_exit,
};
use dra_proto::dra::v1;
use futures::StreamExt;
use gpu_dra_e2e::grpc_go::{GrpcGo, Session};
use gpu_dra_sim::kubelet::{DraVersion, KubeletSim};
use prost::Message;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn dirs_args(dir: &Path) -> (String, String) {
    (
        dir.join("reg").to_str().unwrap().to_owned(),
        dir.join("plugins").to_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn directories_are_0750_and_sockets_0600() {
    let dir = short_dir();
    let plugin = Plugin::start(dir.path(), &[]);
    for d in [
        &plugin.reg_dir,
        &plugin.plugins_dir,
        &plugin.plugins_dir.join(DRIVER),
    ] {
        assert_eq!(mode(d), 0o750, "{}", d.display());
    }
    assert_eq!(mode(&plugin.reg_socket()), 0o600);
    assert_eq!(mode(&plugin.dra_socket()), 0o600);
}

async fn stops_on(sig: &str) {
    let dir = short_dir();
    let mut plugin = Plugin::start(dir.path(), &[]);
    let mut registrar = KubeletSim::new().watch_registrar(&plugin.reg_dir);
    let p = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    // An open health stream must not hold up the shutdown.
    let mut health = p.watch_health().await.unwrap();
    assert_eq!(health.next().await.unwrap().unwrap().len(), 4);

    plugin.signal(sig);
    registrar.wait_deregistered(DRIVER, WAIT).await.unwrap();
    let status = tokio::task::block_in_place(|| wait_exit(&mut plugin.child, WAIT))
        .unwrap_or_else(|| panic!("still running after {sig}: {}", plugin.stderr()));
    assert!(status.success(), "{sig}: {status}: {}", plugin.stderr());
    assert!(!plugin.reg_socket().exists());
    assert!(!plugin.dra_socket().exists());
    assert!(
        tokio::time::timeout(WAIT, health.next())
            .await
            .unwrap()
            .is_none_or(|m| m.is_err())
    );

    // The registration socket went first, then the drain.
    let log = plugin.stderr();
    let dereg = log.find("removing the registration socket").expect(&log);
    let drain = log.find("draining in-flight DRA calls").expect(&log);
    let closed = log.find("kubelet plugin sockets closed").expect(&log);
    assert!(dereg < drain && drain < closed, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_deregisters_drains_and_exits_zero() {
    stops_on("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_deregisters_drains_and_exits_zero() {
    stops_on("INT").await;
}

#[tokio::test]
async fn a_second_instance_cannot_hijack_a_live_one() {
    let dir = short_dir();
    let first = Plugin::start(dir.path(), &[]);
    let (reg, plugins) = dirs_args(dir.path());
    let (status, stderr) = run_to_exit(
        &[
            "--node-name",
            "node-a",
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            &plugins,
        ],
        dir.path(),
    );
    assert_one_line_error(status, &stderr, "another plugin instance");
    // The first one still serves, on the same sockets.
    let p = KubeletSim::new()
        .register(&first.reg_socket())
        .await
        .unwrap();
    assert_eq!(p.endpoint, first.dra_socket());
    p.unprepare(&[]).await.unwrap();
}

#[test]
fn a_live_foreign_server_on_the_socket_path_is_not_taken_over() {
    let dir = short_dir();
    let reg_dir = dir.path().join("reg");
    std::fs::create_dir_all(&reg_dir).unwrap();
    let sock = reg_dir.join(format!("{DRIVER}-reg.sock"));
    let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (reg, plugins) = dirs_args(dir.path());
    let (status, stderr) = run_to_exit(
        &[
            "--node-name",
            "n",
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            &plugins,
        ],
        dir.path(),
    );
    assert_one_line_error(status, &stderr, "another process is serving on");
    assert!(sock.exists(), "the live socket was removed");
    assert!(
        !dir.path()
            .join("plugins")
            .join(DRIVER)
            .join("dra.sock")
            .exists()
    );
}

#[tokio::test]
async fn stale_sockets_are_taken_over() {
    let dir = short_dir();
    let reg_dir = dir.path().join("reg");
    let dra_dir = dir.path().join("plugins").join(DRIVER);
    std::fs::create_dir_all(&reg_dir).unwrap();
    std::fs::create_dir_all(&dra_dir).unwrap();
    for s in [
        reg_dir.join(format!("{DRIVER}-reg.sock")),
        dra_dir.join("dra.sock"),
    ] {
        // Bound, then closed: the file stays, nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&s).unwrap());
        assert!(s.exists());
    }
    let plugin = Plugin::start(dir.path(), &[]);
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    p.unprepare(&[]).await.unwrap();
    assert!(plugin.stderr().contains("removing stale socket"));
}

#[test]
fn a_file_that_is_not_a_socket_is_refused() {
    let dir = short_dir();
    let dra_dir = dir.path().join("plugins").join(DRIVER);
    std::fs::create_dir_all(&dra_dir).unwrap();
    std::fs::write(dra_dir.join("dra.sock"), b"keep me").unwrap();
    let (reg, plugins) = dirs_args(dir.path());
    let (status, stderr) = run_to_exit(
        &[
            "--node-name",
            "n",
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            &plugins,
        ],
        dir.path(),
    );
    assert_one_line_error(status, &stderr, "is not a socket");
    assert_eq!(std::fs::read(dra_dir.join("dra.sock")).unwrap(), b"keep me");
}

#[test]
fn an_overlong_socket_path_is_refused_before_anything_is_created() {
    let dir = short_dir();
    let plugins = dir.path().join("p".repeat(90));
    let (reg, _) = dirs_args(dir.path());
    let (status, stderr) = run_to_exit(
        &[
            "--node-name",
            "n",
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            plugins.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert_one_line_error(
        status,
        &stderr,
        "Unix socket paths are limited to 107 bytes",
    );
    assert!(!plugins.exists());
    assert!(!dir.path().join("reg").exists());
}

#[test]
fn an_unusable_directory_is_refused() {
    let dir = short_dir();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let (_, plugins) = dirs_args(dir.path());
    let under_file = dir.path().join("file/reg");
    for (reg, needle) in [
        (under_file.to_str().unwrap(), "is not a directory"),
        // Not writable, even for root.
        (
            "/sys/gpu-dra-test-reg",
            "cannot create directory /sys/gpu-dra-test-reg",
        ),
    ] {
        let (status, stderr) = run_to_exit(
            &[
                "--node-name",
                "n",
                "--kubelet-registrar-dir",
                reg,
                "--kubelet-plugins-dir",
                &plugins,
            ],
            dir.path(),
        );
        assert_one_line_error(status, &stderr, needle);
    }
}

#[test]
fn bad_flags_are_one_line_errors() {
    let dir = short_dir();
    for (args, needle) in [
        (&[][..], "--node-name"),
        (&["--node-name", ""][..], "--node-name"),
        (&["--node-name", "n", "--bogus"][..], "--bogus"),
        (&["--node-name", "n", "--log-format", "yaml"][..], "yaml"),
        (
            &["--node-name", "n", "--driver-name", "Bad_Name"][..],
            "invalid driver name",
        ),
        (
            &["--node-name", "n", "--metrics-addr", "999.0.0.1:1"][..],
            "--metrics-addr",
        ),
    ] {
        let (status, stderr) = run_to_exit(args, dir.path());
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert_one_line_error(status, &stderr, needle);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}

#[test]
fn a_taken_metrics_address_is_a_startup_error() {
    let dir = short_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (reg, plugins) = dirs_args(dir.path());
    let (status, stderr) = run_to_exit(
        &[
            "--node-name",
            "n",
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            &plugins,
            "--metrics-addr",
            &addr,
        ],
        dir.path(),
    );
    assert_one_line_error(
        status,
        &stderr,
        &format!("cannot listen on metrics address {addr}"),
    );
    assert!(!dir.path().join("reg").exists());
}

#[test]
fn node_name_comes_from_the_environment_too() {
    let dir = short_dir();
    let (reg, plugins) = dirs_args(dir.path());
    let log = dir.path().join("env.log");
    let mut child = common::command(
        &[
            "--kubelet-registrar-dir",
            &reg,
            "--kubelet-plugins-dir",
            &plugins,
        ],
        &log,
    )
    .env("NODE_NAME", "node-from-env")
    .spawn()
    .unwrap();
    let sock = dir.path().join("reg").join(format!("{DRIVER}-reg.sock"));
    let deadline = std::time::Instant::now() + WAIT;
    while !sock.exists() && std::time::Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("node-from-env")
    );
}

/// A DaemonSet rollout with a surge pod: the new instance starts beside
/// the old one, waits (alive and ready to take over) without touching the
/// node's state or the sockets, and takes the node over the moment the
/// old one exits, claims included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_hands_the_node_to_the_new_pod() {
    rolling_update(&[]).await;
}

/// The same as the chart runs it: each plugin under its supervisor, which
/// passes the signal on and ends with its plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_supervised_plugins_hands_the_node_over() {
    rolling_update(&["--supervise"]).await;
}

async fn rolling_update(extra: &[&str]) {
    let flags = [&["--rolling-update"][..], extra].concat();
    let mut node = prepare::node("dgx-h100", &flags, DraVersion::V1).await;
    let claim = node
        .claim(
            "rolled",
            json!([prepare::result("gpu", "gpu-0")]),
            json!([]),
        )
        .await;
    let first = node.prepare_ok(&claim).await;
    let mut registrar = KubeletSim::new().watch_registrar(&node.plugin.reg_dir);
    let old = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(old.endpoint, node.plugin.dra_socket());

    let new_flags = [&["--metrics-addr", "127.0.0.1:0"][..], &flags].concat();
    let new = Plugin::spawn(&node.env, node.dir.path(), "new", &new_flags);
    new.wait_log("waiting for it to exit").await;
    let addr = new.metrics_addr().await;
    for path in ["/readyz", "/healthz"] {
        let answer = http_get(&addr, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        assert!(
            answer.contains("waiting for the plugin instance that holds"),
            "{path}: {answer}"
        );
    }
    // The old one serves alone meanwhile, on sockets the new one left be.
    assert_eq!(node.prepare_ok(&claim).await, first);
    let settled = registrar.next_event(Duration::from_millis(300)).await;
    assert!(settled.is_err(), "the sockets changed: {settled:?}");
    assert!(!new.stderr().contains("serving kubelet plugin sockets"));

    node.plugin.signal("TERM");
    registrar.wait_deregistered(DRIVER, WAIT).await.unwrap();
    let taken = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(taken.endpoint, node.plugin.dra_socket());
    let status = tokio::task::block_in_place(|| wait_exit(&mut node.plugin.child, WAIT))
        .expect("the old instance exits");
    assert!(status.success(), "{}", node.plugin.stderr());
    let log = new.stderr();
    assert!(log.contains("taking over"), "{log}");
    assert!(log.contains("serving kubelet plugin sockets"), "{log}");

    // The claim the old one prepared is the new one's: answered from the
    // checkpoint, then unprepared.
    let again = taken.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(again[&claim.uid], first);
    assert!(node.spec_path(&claim).exists());
    let undone = taken.unprepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(undone[&claim.uid].error, None, "{}", new.stderr());
    assert!(!node.spec_path(&claim).exists());
    assert!(node.checkpoint_claims().is_empty());

    // Serving now: ready through its own socket.
    let answer = http_get(&addr, "/readyz").await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );
}

/// With per-instance sockets (kubelet 1.33 and later), kubelet always has
/// a plugin that answers during a rollout: the new instance registers
/// while the old one serves, passes kubelet's calls on to it, and serves
/// them itself once the old one has gone. A kubelet that calls the newest
/// plugin, with kubelet's own one-second reconciler, sees every call of a
/// steady stream answered, through the hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_with_per_instance_sockets_never_leaves_kubelet_without_a_plugin() {
    let flags = ["--rolling-update", "--per-instance-sockets=always"];
    let mut node = prepare::node("dgx-h100", &flags, DraVersion::V1).await;
    let claim = node
        .claim(
            "seamless",
            json!([prepare::result("gpu", "gpu-0")]),
            json!([]),
        )
        .await;
    let first = node.prepare_ok(&claim).await;
    let old_reg = node.plugin.reg_socket();
    let old_dra = node.plugin.dra_socket();
    assert_ne!(
        old_reg,
        node.plugin.reg_dir.join(format!("{DRIVER}-reg.sock"))
    );
    let mut registrar = KubeletSim::new()
        .with_reconcile_period(gpu_dra_sim::kubelet::KUBELET_RECONCILE_PERIOD)
        .watch_registrar(&node.plugin.reg_dir);
    let old = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(old.endpoint, old_dra);

    let new_flags = [&["--metrics-addr", "127.0.0.1:0"][..], &flags].concat();
    let new = Plugin::spawn(&node.env, node.dir.path(), "new", &new_flags);
    new.wait_log("waiting for it to exit").await;
    // Registered beside the old one, on sockets of its own; ready once
    // kubelet knows it.
    let newest = registrar.wait_registered(DRIVER, WAIT).await.unwrap();
    assert_eq!(newest.endpoint, new.dra_socket());
    assert_ne!(newest.endpoint, old_dra);
    assert_eq!(registrar.plugin(DRIVER).unwrap().endpoint, newest.endpoint);
    let addr = new.metrics_addr().await;
    let ready = loop {
        let answer = http_get(&addr, "/readyz").await;
        if !answer.contains("waiting for kubelet to register") {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.contains("waiting for the plugin instance"),
        "{ready}"
    );
    // Calls to the new plugin are answered by the old one, which owns the
    // node meanwhile.
    assert_eq!(
        newest.prepare(std::slice::from_ref(&claim)).await.unwrap()[&claim.uid],
        first
    );
    // Kubelet is a grpc-go client and keeps its client (grpc-go's
    // ClientConn) for a plugin: one made now is answered by the old
    // instance through the new one, and after the take-over by the new one.
    let mut go = GrpcGo::detect_or_skip(
        "a_rolling_update_with_per_instance_sockets_never_leaves_kubelet_without_a_plugin (grpc-go part)",
    )
    .unwrap()
    .map(|go| go.connect(&new.dra_socket(), None).unwrap());
    let go_prepare = |session: &mut Session| {
        let request = v1::NodePrepareResourcesRequest {
            claims: vec![claim.to_v1()],
        };
        let reply = tokio::task::block_in_place(|| {
            session.call(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                &request.encode_to_vec(),
            )
        })
        .unwrap()
        .unwrap_or_else(|s| panic!("grpc-go prepare: {s:?}"));
        let answer = v1::NodePrepareResourcesResponse::decode(reply.as_slice()).unwrap();
        let one = &answer.claims[&claim.uid];
        assert_eq!(one.error, "");
        let devices: Vec<(&str, &[String])> = one
            .devices
            .iter()
            .map(|d| (d.device_name.as_str(), d.cdi_device_ids.as_slice()))
            .collect();
        let expected: Vec<(&str, &[String])> = first
            .devices
            .iter()
            .map(|d| (d.device_name.as_str(), d.cdi_device_ids.as_slice()))
            .collect();
        assert_eq!(devices, expected);
    };
    if let Some(session) = &mut go {
        go_prepare(session);
    }

    // A steady stream of calls to the newest plugin through the hand-over.
    let stream = {
        let kubelet = newest.clone();
        let claim = claim.clone();
        let log = new.log.clone();
        tokio::spawn(async move {
            let (mut answered, mut failed, mut after) = (0, Vec::new(), 0);
            while after < 20 {
                match kubelet.prepare(std::slice::from_ref(&claim)).await {
                    Ok(r) if r[&claim.uid].error.is_none() => answered += 1,
                    Ok(r) => failed.push(format!("{:?}", r[&claim.uid].error)),
                    Err(e) => failed.push(e.to_string()),
                }
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                if log.contains("serving kubelet plugin sockets") {
                    after += 1;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (answered, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    node.plugin.signal("TERM");
    let status = tokio::task::block_in_place(|| wait_exit(&mut node.plugin.child, WAIT))
        .expect("the old instance exits");
    assert!(status.success(), "{}", node.plugin.stderr());
    let (answered, failed) = tokio::time::timeout(WAIT, stream)
        .await
        .expect("the calls go on")
        .unwrap();
    assert!(
        failed.is_empty(),
        "{answered} answered, failed: {failed:?}
{}",
        new.stderr()
    );
    assert!(answered >= 20, "{answered}");
    // Kubelet dropped the old plugin and kept calling the new one.
    registrar.wait_deregistered(DRIVER, WAIT).await.unwrap();
    assert_eq!(registrar.plugin(DRIVER).unwrap().endpoint, newest.endpoint);
    let log = new.stderr();
    assert!(log.contains("taking over"), "{log}");
    // It passed calls on before the take-over (the prepare above, at
    // least), and says how many when it serves.
    let forwarded: u64 = log
        .lines()
        .find(|l| l.contains("serving kubelet plugin sockets"))
        .and_then(|l| l.split("forwarded=").nth(1))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no forwarded=N on the serving line: {log}"));
    assert!(forwarded >= 1, "{log}");
    // The old instance took its files along; the link names the new one.
    for gone in [&old_reg, &old_dra] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    let link = node.plugin.plugins_dir.join(DRIVER).join("serving.sock");
    assert_eq!(std::fs::read_link(&link).unwrap(), new.dra_socket());
    // The grpc-go client of before the take-over: the new one answers.
    if let Some(session) = &mut go {
        go_prepare(session);
    }
    drop(go);

    // The claim is the new instance's now: unprepared by it.
    let undone = newest
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(undone[&claim.uid].error, None, "{}", new.stderr());
    assert!(!node.spec_path(&claim).exists());
    assert!(node.checkpoint_claims().is_empty());
}

/// A waiting instance with sockets of its own that is deleted during the
/// rollout takes its sockets along; the old one serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pod_with_sockets_of_its_own_removes_them_when_deleted() {
    let flags = ["--rolling-update", "--per-instance-sockets=always"];
    let node = prepare::node("dgx-h100", &flags, DraVersion::V1).await;
    let mut new = Plugin::spawn(&node.env, node.dir.path(), "undone", &flags);
    new.wait_log("waiting for it to exit").await;
    let (reg, dra) = (new.reg_socket(), new.dra_socket());
    assert!(reg.exists() && dra.exists());
    new.signal("TERM");
    let status = tokio::task::block_in_place(|| new.wait_exit(WAIT));
    assert!(status.success(), "{}", new.stderr());
    for gone in [&reg, &dra] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    node.kubelet.unprepare(&[]).await.unwrap();
    assert!(node.plugin.reg_socket().exists());
}

/// A new pod that cannot start (here: NVML fails) never reports ready, so
/// the DaemonSet keeps the old pod, which serves on untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pod_that_cannot_start_leaves_the_old_one_serving() {
    let node = prepare::node("dgx-h100", &["--rolling-update"], DraVersion::V1).await;
    let mut new = Plugin::spawn(
        &node.env,
        node.dir.path(),
        "broken",
        &[
            "--rolling-update",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ],
    );
    let status = tokio::task::block_in_place(|| new.wait_exit(WAIT));
    assert!(!status.success());
    let log = new.stderr();
    assert!(!log.contains("waiting for it to exit"), "{log}");
    node.kubelet.unprepare(&[]).await.unwrap();
    assert!(node.plugin.reg_socket().exists());
}

/// A signal while waiting for the other instance ends the wait at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pod_deleted_during_the_rollout_exits_at_once() {
    let node = prepare::node("dgx-h100", &["--rolling-update"], DraVersion::V1).await;
    let mut new = Plugin::spawn(&node.env, node.dir.path(), "undone", &["--rolling-update"]);
    new.wait_log("waiting for it to exit").await;
    new.signal("TERM");
    let status = tokio::task::block_in_place(|| new.wait_exit(WAIT));
    assert!(status.success(), "{}", new.stderr());
    assert!(new.stderr().contains("signal received while waiting"));
    // The old one never noticed.
    node.kubelet.unprepare(&[]).await.unwrap();
    assert!(node.plugin.reg_socket().exists());
}
