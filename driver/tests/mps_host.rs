//! The MPS daemon host (`gpu-kubelet-plugin mps-host`) as the real program:
//! starts through it, its answers to malformed and hostile requests, the
//! daemons it adopts and reaps, its shutdown; and the reason it exists: with
//! `--mps-host-socket`, an MPS daemon outlives the end of the plugin's
//! container (a DaemonSet upgrade), which ends every process descended from
//! the container's main process, and the next plugin re-adopts it. Under
//! `--supervise`, the daemons also outlive a crash of the host itself.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::prepare::node;
use gpu_dra_sim::kubelet::DraVersion;
use gpu_kubelet_plugin::prepare::mps::host::{
    Outcome, Reply, StartRequest, pid_namespace, request_start,
};
use rustix::process::{Pid, Signal, kill_process};

/// The host program serving on `<dir>/host.sock` for the driver in
/// `driver_root`, logging to `<dir>/host.log`; killed when dropped.
struct Host {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Host {
    fn start(dir: &Path, driver_root: &Path) -> Self {
        Self::start_with(dir, driver_root, &[])
    }

    /// [`Host::start`] with `extra` arguments.
    fn start_with(dir: &Path, driver_root: &Path, extra: &[&str]) -> Self {
        Self::start_under(&[], dir, driver_root, extra)
    }

    /// [`Host::start_with`], the program run by the command `wrapper`
    /// (none: directly).
    fn start_under(wrapper: &[&str], dir: &Path, driver_root: &Path, extra: &[&str]) -> Self {
        let socket = dir.join("host.sock");
        let log = dir.join("host.log");
        let mut args = wrapper.to_vec();
        if !wrapper.is_empty() {
            args.push(common::BIN);
        }
        args.extend([
            "mps-host",
            "--socket",
            socket.to_str().unwrap(),
            "--container-driver-root",
            driver_root.to_str().unwrap(),
        ]);
        args.extend_from_slice(extra);
        let mut command = if wrapper.is_empty() {
            common::bare_command(&args, &log)
        } else {
            common::program_command(args[0], &args[1..], &log)
        };
        let child = command.spawn().unwrap();
        let mut host = Self { child, socket, log };
        host.wait_serving(1);
        host
    }

    /// Waits until the log says `times` times that a host serves.
    fn wait_serving(&mut self, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.stderr().matches("MPS daemon host serving").count() < times {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("host exited with {status}: {}", self.stderr());
            }
            assert!(Instant::now() < deadline, "not serving: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM to the host's main process: it exits 0 and takes its socket
    /// along, and `daemon` runs on (then killed).
    fn terminate_leaving(&mut self, daemon: u32) {
        assert!(fake_driver_root::terminate(self.child.id()));
        let status = common::wait_exit(&mut self.child, Duration::from_secs(10)).expect("exits");
        assert!(status.success(), "{}", self.stderr());
        assert!(!self.socket.exists(), "socket left behind");
        assert!(
            fake_driver_root::is_alive(daemon),
            "the daemon ended with the host"
        );
        assert!(fake_driver_root::kill(daemon));
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // A supervised host's serving process and daemons too.
        for pid in tree(self.child.id()).into_iter().skip(1) {
            fake_driver_root::kill(pid);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in `nvidia-cuda-mps-control` in the driver root `dir` that runs
/// `script`.
fn program(dir: &Path, script: &str) -> PathBuf {
    let bin = dir.join("usr/bin");
    fs::create_dir_all(&bin).unwrap();
    let path = bin.join("nvidia-cuda-mps-control");
    // Written to a new file and renamed: a running copy is never rewritten.
    let tmp = bin.join(".new");
    fs::write(&tmp, format!("#!/bin/sh\n{script}\n")).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&tmp, &path).unwrap();
    path
}

fn request(dir: &Path, program: &Path) -> StartRequest {
    StartRequest {
        program: program.to_owned(),
        private_mount: None,
        env: [
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_owned(),
                dir.join("pipe").display().to_string(),
            ),
        ]
        .into(),
        output: dir.join("out"),
        timeout_ms: 5_000,
        multi_user: false,
    }
}

/// Sends raw bytes, returns the reply.
fn raw(socket: &Path, bytes: &[u8]) -> Reply {
    let mut stream = UnixStream::connect(socket).unwrap();
    // A host that stops reading early may reset the rest: not an error here.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

fn wait_for_pid_file(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "{what} ({pid}) still there");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_host_runs_starts_reaps_its_daemons_and_refuses_bad_requests() {
    let dir = common::short_dir();
    let scratch = tempfile::tempdir().unwrap();
    let host = Host::start(dir.path(), scratch.path());
    let dir = scratch.path();

    // A start: the environment is exactly the request's, output captured.
    let prog = program(
        dir,
        "echo \"pipe=$CUDA_MPS_PIPE_DIRECTORY home=${HOME-unset} arg=$1\"\nexit 0",
    );
    let outcome = request_start(&host.socket, &request(dir, &prog)).unwrap();
    assert!(outcome.success(), "{outcome}");
    assert_eq!(
        fs::read_to_string(dir.join("out")).unwrap(),
        format!("pipe={} home=unset arg=-d\n", dir.join("pipe").display())
    );
    // A multi-user server (`mpsConfig.multiUser`): `-d -M`.
    let prog = program(dir, "echo \"args=$*\"\nexit 0");
    let multi = StartRequest {
        multi_user: true,
        ..request(dir, &prog)
    };
    let outcome = request_start(&host.socket, &multi).unwrap();
    assert!(outcome.success(), "{outcome}");
    assert_eq!(fs::read_to_string(dir.join("out")).unwrap(), "args=-d -M\n");

    // A failing start: its status and output.
    let prog = program(dir, "echo no GPU >&2\nexit 3");
    let outcome = request_start(&host.socket, &request(dir, &prog)).unwrap();
    assert_eq!(
        outcome,
        Outcome::Exited {
            code: Some(3),
            signal: None
        }
    );
    assert_eq!(fs::read_to_string(dir.join("out")).unwrap(), "no GPU\n");

    // A start that hangs is killed at its timeout.
    let prog = program(dir, "exec sleep 30");
    let begun = Instant::now();
    let hung = StartRequest {
        timeout_ms: 200,
        ..request(dir, &prog)
    };
    assert_eq!(
        request_start(&host.socket, &hung).unwrap(),
        Outcome::TimedOut
    );
    assert!(begun.elapsed() < Duration::from_secs(10));

    // A daemonizing start: `-d` returns, its background child is adopted
    // by the host and reaped when it exits (no zombie left).
    let pid_file = dir.join("daemon.pid");
    let prog = program(
        dir,
        &format!(
            "sh -c 'echo $$ > {}; exec sleep 0.5' &\nexit 0",
            pid_file.display()
        ),
    );
    let outcome = request_start(&host.socket, &request(dir, &prog)).unwrap();
    assert!(outcome.success(), "{outcome}");
    let daemon = wait_for_pid_file(&pid_file);
    assert_eq!(
        fake_driver_root::parent_id(daemon),
        Some(host.child.id()),
        "adopted by the host"
    );
    wait_gone(daemon, "the exited daemon, reaped by the host");

    // A missing program is an answer, not a hang.
    fs::remove_file(&prog).unwrap();
    let outcome = request_start(&host.socket, &request(dir, &prog)).unwrap();
    assert!(
        matches!(&outcome, Outcome::Failed { error } if error.contains("cannot run")),
        "{outcome:?}"
    );

    // Malformed and hostile requests: refused with a reason, nothing run.
    let marker = dir.join("ran");
    let evil = program(dir, &format!("touch {}", marker.display()));
    let mut preload = request(dir, &evil);
    preload
        .env
        .insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
    let shell = StartRequest {
        program: "/bin/sh".into(),
        ..request(dir, &evil)
    };
    // A control program, but not the host's driver root's.
    let elsewhere = program(
        &dir.join("elsewhere"),
        &format!("touch {}", marker.display()),
    );
    let other_root = request(dir, &elsewhere);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json\n".to_vec(), "malformed request"),
        (b"".to_vec(), "malformed request"),
        (b"{\"program\":\"/bin/sh\"}\n".to_vec(), "malformed request"),
        (serde_json::to_vec(&preload).unwrap(), "LD_PRELOAD"),
        (
            serde_json::to_vec(&shell).unwrap(),
            "program /bin/sh is not",
        ),
        (
            serde_json::to_vec(&other_root).unwrap(),
            "the driver root's MPS control program",
        ),
        (vec![b'x'; 70_000], "longer than 65536 bytes"),
    ];
    for (bytes, needle) in cases {
        let reply = raw(&host.socket, &bytes);
        assert!(
            matches!(&reply.outcome, Outcome::Failed { error } if error.contains(needle)),
            "{needle:?}: {reply:?}"
        );
        assert_eq!(reply.pid_namespace, pid_namespace().unwrap());
    }
    assert!(!marker.exists(), "a refused request ran");

    // Only its owner can reach the socket.
    let mode = fs::metadata(&host.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn sigterm_stops_the_host_and_leaves_its_daemons_running() {
    let dir = common::short_dir();
    let mut host = Host::start(dir.path(), dir.path());
    let pid_file = dir.path().join("daemon.pid");
    let prog = program(
        dir.path(),
        &format!(
            "sh -c 'echo $$ > {}; exec sleep 30' &\nexit 0",
            pid_file.display()
        ),
    );
    let outcome = request_start(&host.socket, &request(dir.path(), &prog)).unwrap();
    assert!(outcome.success(), "{outcome}");
    let daemon = wait_for_pid_file(&pid_file);

    host.terminate_leaving(daemon);

    // A second host refuses a socket a live one serves.
    let first = Host::start(dir.path(), dir.path());
    let (status, stderr) = common::run_bare(
        &["mps-host", "--socket", first.socket.to_str().unwrap()],
        &[],
        dir.path(),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    common::assert_one_line_error(status, &stderr, "error: MPS daemon host: MPS host socket:");
    // Bad flags: one line, exit 2.
    let (status, stderr) = common::run_bare(&["mps-host", "--socket", "rel.sock"], &[], dir.path());
    common::assert_one_line_error(status, &stderr, "not an absolute path");
    assert_eq!(status.code(), Some(2));
}

/// SIGTERM while a start runs: the host stops taking requests at once,
/// answers the start when it ends, then exits; the plugin learns whether
/// its daemon started instead of finding the connection closed.
#[test]
fn sigterm_during_a_start_answers_it_before_the_host_exits() {
    let dir = common::short_dir();
    let mut host = Host::start(dir.path(), dir.path());
    let running = dir.path().join("running");
    let prog = program(
        dir.path(),
        // Long enough that the SIGTERM below comes while it runs.
        &format!("touch {}\nsleep 2\nexit 0", running.display()),
    );
    let asking = {
        let (socket, req) = (host.socket.clone(), request(dir.path(), &prog));
        std::thread::spawn(move || request_start(&socket, &req))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running.exists() {
        assert!(
            Instant::now() < deadline,
            "never started: {}",
            host.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(fake_driver_root::terminate(host.child.id()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.socket.exists() {
        assert!(Instant::now() < deadline, "still taking requests");
        std::thread::sleep(Duration::from_millis(10));
    }
    let outcome = asking.join().unwrap();
    assert!(
        outcome.as_ref().is_ok_and(Outcome::success),
        "{outcome:?}\n{}",
        host.stderr()
    );
    let status = common::wait_exit(&mut host.child, Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{}", host.stderr());
    assert!(
        host.stderr()
            .contains("answering the requests it is running first"),
        "{}",
        host.stderr()
    );
}

/// Under `--supervise`, a crash of the host ends neither the daemons it
/// started nor the service: the supervisor (the container's main process)
/// adopts and reaps the daemons, and starts the host again on the same
/// socket. Without it, the host is the container's main process, and its
/// crash ends the container with every daemon in it.
#[test]
fn a_supervised_host_is_started_again_after_a_crash_or_a_stray_sigterm_and_its_daemons_live_on() {
    let dir = common::short_dir();
    let mut host = Host::start_with(dir.path(), dir.path(), &["--supervise"]);
    let supervisor = host.child.id();
    // The host: the supervisor's one child that runs the same program (the
    // others are adopted daemons).
    let exe = |pid: u32| fs::read_link(format!("/proc/{pid}/exe")).ok();
    let serving = || -> u32 {
        let hosts: Vec<u32> = children(supervisor)
            .into_iter()
            .filter(|&p| exe(p) == exe(supervisor))
            .collect();
        assert_eq!(hosts.len(), 1, "one host under the supervisor: {hosts:?}");
        hosts[0]
    };
    let first = serving();
    let socket = host.socket.clone();
    let daemon_of = |name: &str| {
        let pid_file = dir.path().join(format!("{name}.pid"));
        let prog = program(
            dir.path(),
            &format!(
                "sh -c 'echo $$ > {}; exec sleep 30' &\nexit 0",
                pid_file.display()
            ),
        );
        let outcome = request_start(&socket, &request(dir.path(), &prog)).unwrap();
        assert!(outcome.success(), "{outcome}");
        wait_for_pid_file(&pid_file)
    };
    let daemon = daemon_of("first");
    assert_eq!(fake_driver_root::parent_id(daemon), Some(first));

    // The host crashes.
    assert!(fake_driver_root::kill(first));
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake_driver_root::parent_id(daemon) != Some(supervisor) {
        assert!(
            Instant::now() < deadline,
            "the daemon was not adopted by the supervisor: parent {:?}",
            fake_driver_root::parent_id(daemon)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon ended with the host"
    );
    assert!(
        host.child.try_wait().unwrap().is_none(),
        "the supervisor exited: {}",
        host.stderr()
    );

    // Started again (after the policy's first delay), on the same socket.
    host.wait_serving(2);
    assert!(
        host.stderr()
            .contains("MPS daemon host died; starting it again"),
        "{}",
        host.stderr()
    );
    let second = serving();
    assert_ne!(second, first);
    let later = daemon_of("second");
    assert_eq!(fake_driver_root::parent_id(later), Some(second));

    // The old daemon, now the supervisor's, is reaped when it ends: no zombie.
    assert!(fake_driver_root::kill(daemon));
    wait_gone(daemon, "the orphaned daemon, reaped by the supervisor");

    // SIGTERM to the host process alone (a `pkill` meant for the plugin):
    // it exits 0, and the supervisor starts it again rather than end the
    // container and the daemons in it.
    assert!(fake_driver_root::terminate(second));
    host.wait_serving(3);
    let third = serving();
    assert_ne!(third, second);
    assert!(
        host.child.try_wait().unwrap().is_none(),
        "the supervisor exited: {}",
        host.stderr()
    );
    assert!(
        fake_driver_root::is_alive(later),
        "the daemon ended with the host"
    );

    // SIGTERM to the supervisor: the host stops cleanly, its daemons run on.
    host.terminate_leaving(later);
}

/// The node's MPS daemon processes: those started from the fake driver
/// root, less the plugin's own processes (the supervisor's child).
fn daemons_of(n: &common::prepare::Node) -> Vec<u32> {
    n.live_processes()
        .into_iter()
        .filter(|p| {
            fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|exe| exe != Path::new(common::BIN))
        })
        .collect()
}

/// The processes whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&pid| fake_driver_root::parent_id(pid) == Some(parent))
        .collect()
}

/// Every process descended from `root`, `root` first.
fn tree(root: u32) -> Vec<u32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        for pid in children(all[i]) {
            if !all.contains(&pid) {
                all.push(pid);
            }
        }
        i += 1;
    }
    all
}

/// What a container runtime does when a container stops: every process in
/// its cgroup is killed. A process's cgroup is its parent's at fork, so
/// here that is the container's main process and everything descended
/// from it (frozen first, so nothing escapes by forking meanwhile).
fn end_container(main: u32) {
    let mut frozen = Vec::new();
    loop {
        let now = tree(main);
        if now.iter().all(|p| frozen.contains(p)) {
            break;
        }
        for p in now {
            if !frozen.contains(&p) {
                if let Some(pid) = i32::try_from(p).ok().and_then(Pid::from_raw) {
                    let _ = kill_process(pid, Signal::STOP);
                }
                frozen.push(p);
            }
        }
    }
    for p in frozen {
        fake_driver_root::kill(p);
    }
}

/// With the host, a plugin upgrade keeps the MPS daemon: the old plugin's
/// container ends (SIGTERM to its supervisor, then everything that was in
/// it killed; later a hard kill of the whole container), the daemon, the
/// host's child, runs on, and each new plugin serves the claim with it; the
/// last one stops it at unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_host_an_mps_daemon_outlives_the_plugins_container() {
    let host_dir = common::short_dir();
    let socket = host_dir.path().join("host.sock");
    let mut n = node(
        "t4-inference",
        &["--supervise", "--mps-host-socket", socket.to_str().unwrap()],
        DraVersion::V1,
    )
    .await;
    // The host of the node's driver root (needed from the first MPS prepare on).
    let host = Host::start(host_dir.path(), n.env.driver_root.path());
    let c = n.mps_claim("mps").await;
    let first = n.prepare_ok(&c).await;
    let daemons = daemons_of(&n);
    assert_eq!(
        daemons.len(),
        1,
        "one MPS daemon: {daemons:?}\n{}",
        n.logs()
    );
    let daemon = daemons[0];
    assert_eq!(
        fake_driver_root::parent_id(daemon),
        Some(host.child.id()),
        "{}",
        host.stderr()
    );
    // Through the host's own launcher when the plugin chose a private
    // /dev/shm (as root): a mount namespace of the daemon's own.
    if n.plugin.stderr().contains("shm=PrivateMount") {
        let ns = |pid: u32| fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
        assert_ne!(ns(daemon), ns(host.child.id()));
    }

    // An upgrade: the runtime sends SIGTERM to the container's main
    // process (the supervisor passes it on; the plugin drains and exits
    // without touching the daemons), then kills what was in the container.
    let container = tree(n.plugin.child.id());
    n.plugin.signal("TERM");
    let status = tokio::task::block_in_place(|| n.plugin.wait_exit(Duration::from_secs(20)));
    assert!(status.success(), "{}", n.logs());
    for p in container {
        fake_driver_root::kill(p);
    }
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon ended with the plugin's container"
    );

    // The new plugin ("the new pod"): same flags, same node.
    n.restart(&[]).await;
    assert_eq!(n.prepare_ok(&c).await, first);
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon was replaced"
    );
    assert_eq!(daemons_of(&n), vec![daemon]);

    // A pod deleted past its grace period: everything in it killed at once.
    end_container(n.plugin.child.id());
    let _ = n.plugin.child.wait();
    assert!(
        fake_driver_root::is_alive(daemon),
        "the daemon ended with the plugin's container"
    );
    n.restart(&[]).await;
    assert_eq!(n.prepare_ok(&c).await, first);
    assert_eq!(daemons_of(&n), vec![daemon]);
    n.unprepare_ok(&c).await;
    wait_gone(
        daemon,
        "the daemon, stopped at unprepare and reaped by the host",
    );
    assert_eq!(n.mps_daemons(), 0);
    assert!(
        host.stderr().contains("ran an MPS daemon start"),
        "{}",
        host.stderr()
    );
}

/// The same without the host: the daemon is in the plugin's container and
/// ends with it (what the host is for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_host_an_mps_daemon_ends_with_the_plugins_container() {
    let mut n = node("t4-inference", &["--supervise"], DraVersion::V1).await;
    let c = n.mps_claim("mps").await;
    n.prepare_ok(&c).await;
    let daemons = daemons_of(&n);
    assert_eq!(daemons.len(), 1, "one MPS daemon: {daemons:?}");
    end_container(n.plugin.child.id());
    let _ = n.plugin.child.wait();
    wait_gone(daemons[0], "the daemon of the ended container");
}

/// The command that runs a program in a PID namespace of its own, where
/// it can run here; else `None`, after saying loudly that `test` skips.
fn pid_unshare(test: &str) -> Option<[&'static str; 4]> {
    let unshare = ["unshare", "--pid", "--fork", "--kill-child"];
    let works = std::process::Command::new(unshare[0])
        .args(&unshare[1..])
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        eprintln!(
            "\n!!!!!!!! SKIPPED {test}: `unshare --pid` (util-linux, as root) cannot run here\n"
        );
    }
    works.then_some(unshare)
}

/// A host in a PID namespace of its own (a pod without `hostPID`) is
/// refused before it is asked anything: it starts no daemon whose pid file
/// would name pids the plugin cannot see.
#[test]
fn a_host_in_another_pid_namespace_starts_nothing() {
    let Some(unshare) = pid_unshare("a_host_in_another_pid_namespace_starts_nothing") else {
        return;
    };
    let dir = common::short_dir();
    let scratch = tempfile::tempdir().unwrap();
    let host = Host::start_under(&unshare, dir.path(), scratch.path(), &[]);
    let ran = scratch.path().join("ran");
    let prog = program(scratch.path(), &format!("touch {}", ran.display()));

    let err = request_start(&host.socket, &request(scratch.path(), &prog)).unwrap_err();
    let own = pid_namespace().unwrap();
    let text = err.to_string();
    assert!(
        text.contains("runs in another PID namespace (pid:[")
            && text.contains(&format!("than the plugin ({own})"))
            && text.contains("hostPID"),
        "{text}"
    );
    // Nothing ran, and the host still serves (it saw a connection close
    // without a request).
    std::thread::sleep(Duration::from_millis(200));
    assert!(!ran.exists(), "the host ran the program: {}", host.stderr());
    assert!(host.socket.exists());
}

/// The reverse: the plugin in a PID namespace of its own (its pod without
/// `hostPID`) and the host in the node's. The listener cannot be seen from
/// the plugin, so nothing is sent. The test runs itself again under
/// `unshare --pid` as that plugin (`MPS_HOST_TEST_SOCKET` names the host),
/// which prints the error.
#[test]
fn a_plugin_that_cannot_see_its_host_asks_nothing() {
    const NAME: &str = "a_plugin_that_cannot_see_its_host_asks_nothing";
    if let Ok(socket) = std::env::var("MPS_HOST_TEST_SOCKET") {
        let scratch = PathBuf::from(std::env::var("MPS_HOST_TEST_SCRATCH").unwrap());
        let prog = scratch.join("usr/bin/nvidia-cuda-mps-control");
        let err = request_start(Path::new(&socket), &request(&scratch, &prog)).unwrap_err();
        println!("ERROR<{err}>");
        return;
    }
    let Some(unshare) = pid_unshare(NAME) else {
        return;
    };
    let dir = common::short_dir();
    let scratch = tempfile::tempdir().unwrap();
    let host = Host::start(dir.path(), scratch.path());
    let ran = scratch.path().join("ran");
    program(scratch.path(), &format!("touch {}", ran.display()));

    let out = std::process::Command::new(unshare[0])
        .args(&unshare[1..])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env("MPS_HOST_TEST_SOCKET", &host.socket)
        .env("MPS_HOST_TEST_SCRATCH", scratch.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Some((text, _)) = stdout
        .split_once("ERROR<")
        .and_then(|(_, rest)| rest.split_once('>'))
    else {
        panic!("no error printed: {stdout}");
    };
    assert!(
        text.contains("runs in another PID namespace (one the plugin cannot see)")
            && text.contains("hostPID"),
        "{text}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!ran.exists(), "the host ran the program: {}", host.stderr());
    assert!(host.socket.exists());
}

/// A plugin whose host is not there: the MPS prepare fails with an error
/// that names the socket, and nothing of the claim is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_prepare_without_its_host_fails_clearly_and_leaves_nothing() {
    let dir = common::short_dir();
    let socket = dir.path().join("absent.sock");
    let n = node(
        "t4-inference",
        &["--mps-host-socket", socket.to_str().unwrap()],
        DraVersion::V1,
    )
    .await;
    let c = n.mps_claim("mps").await;
    let error = n.prepare_error(&c).await;
    assert!(
        error.contains("cannot reach the MPS daemon host at")
            && error.contains(socket.to_str().unwrap()),
        "{error}"
    );
    assert!(n.live_processes().is_empty());
    assert_eq!(n.mps_daemons(), 0);
    assert!(!n.spec_path(&c).exists());
    assert!(n.checkpoint_claims().is_empty(), "{}", n.checkpoint());
}
