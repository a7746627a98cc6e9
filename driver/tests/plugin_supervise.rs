//! `--supervise` with the real binary, a fake NVML machine and the fake
//! driver root's MPS daemon: the plugin process dies (SIGKILL, as in a crash)
//! and its supervisor starts it again; the MPS daemon the first run started
//! keeps running with the same pid, the new run re-adopts it from the
//! checkpoint and serves the claim's unprepare, which stops the daemon (and
//! the supervisor reaps it: no zombie). SIGTERM to the supervisor stops the
//! plugin through its orderly shutdown and ends both with status 0.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::prepare::node;
use gpu_dra_sim::kubelet::DraVersion;

const STARTED: &str = "serving kubelet plugin sockets";

/// Children of `parent` that run the plugin binary.
fn plugin_children(parent: u32) -> Vec<u32> {
    let binary = Path::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin"));
    let Ok(text) = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")) else {
        return Vec::new();
    };
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|p| {
            std::fs::read_link(format!("/proc/{p}/exe"))
                .is_ok_and(|exe| exe == binary || exe.file_name() == binary.file_name())
        })
        .collect()
}

/// Whether `pid` exists at all (a zombie counts: it has not been reaped).
fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// Multi-threaded: the kubelet simulator's connection must stay responsive
// while the test blocks on the plugin's exit (the drain waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_crash_under_the_supervisor_leaves_the_mps_daemon_running() {
    let mut n = node("t4-inference", &["--supervise"], DraVersion::V1).await;
    let supervisor = n.plugin.child.id();
    let first = plugin_children(supervisor);
    assert_eq!(first.len(), 1, "one plugin child: {first:?}\n{}", n.logs());
    let c = n.mps_claim("mps").await;
    n.prepare_ok(&c).await;
    let daemons: Vec<u32> = n
        .live_processes()
        .into_iter()
        .filter(|p| !first.contains(p))
        .collect();
    assert_eq!(daemons.len(), 1, "one MPS daemon: {daemons:?}");
    let daemon = daemons[0];

    // The crash: only the plugin process dies.
    assert!(fake_driver_root::kill(first[0]));
    until("a new plugin process", Duration::from_secs(20), || {
        let now = plugin_children(supervisor);
        now.len() == 1 && now[0] != first[0]
    })
    .await;
    until("the new run's sockets", Duration::from_secs(20), || {
        n.plugin.stderr().matches(STARTED).count() == 2
    })
    .await;
    assert!(
        n.plugin.child.try_wait().unwrap().is_none(),
        "supervisor exited"
    );
    assert!(
        n.plugin.stderr().contains("plugin died; starting it again"),
        "{}",
        n.logs()
    );
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon died with the plugin"
    );
    n.reregister().await;

    // The prepared claim is the new run's: a repeated prepare returns the
    // stored result and the unprepare stops the same daemon.
    n.prepare_ok(&c).await;
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon was replaced"
    );
    n.unprepare_ok(&c).await;
    until(
        "the daemon to be stopped and reaped",
        Duration::from_secs(10),
        || !exists(daemon),
    )
    .await;
    assert_eq!(n.mps_daemons(), 0);

    // SIGTERM: the plugin's orderly shutdown, then the supervisor exits 0.
    let second = plugin_children(supervisor);
    n.plugin.signal("TERM");
    let status = tokio::task::block_in_place(|| n.plugin.wait_exit(Duration::from_secs(20)));
    let log = n.plugin.stderr();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(second.iter().all(|p| !fake_driver_root::is_alive(*p)));
    assert!(
        log.contains("plugin stopped on a signal; supervisor exits"),
        "{log}"
    );
    assert!(!log.contains("drain timed out"), "{log}");
}

#[tokio::test]
async fn bad_flags_under_the_supervisor_exit_2_without_a_restart() {
    let dir = common::short_dir();
    let (status, stderr) =
        common::run_to_exit(&["--supervise", "--memory-sharing=gpu-x"], dir.path());
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("starting it again"), "{stderr}");
}
