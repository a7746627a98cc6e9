//! The MPS daemon launcher (`gpu-kubelet-plugin mps-launch`, see
//! `prepare::mps::launch`), run as the plugin runs it: as root a daemon
//! started through it gets its own `shm/` as `/dev/shm` and its pipe
//! directory at `/tmp/nvidia-mps`, in a mount namespace of its own; a
//! malformed or failing launch says why in one line and changes no mount
//! of the caller's.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fake_driver_root::FakeDriverRoot;
use gpu_kubelet_plugin::prepare::cdi::HostRoot;
use gpu_kubelet_plugin::prepare::mps::{
    CONTAINER_PIPE_DIR, CONTROL_SOCKET, DaemonConfig, MAX_SOCKET_PATH, MpsControl, PID_FILE,
    ShmMode, Timeouts, procs,
};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-kubelet-plugin");
const GPU: &str = "GPU-9be4bcfc-49b6-4a08-b2e6-cc3ababced20";

fn wait_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs::is_alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} did not die");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fake driver root, and an [`MpsControl`] that starts its daemons
/// through the plugin program with their state under `<dir>/<state>`;
/// `None` (the test says it is skipped, and why) where a private mount
/// namespace cannot be had (not root).
struct Launched {
    fake: FakeDriverRoot,
    mps: MpsControl,
    _guard: fake_driver_root::ProcessGuard,
    _dir: tempfile::TempDir,
}

fn launched(test: &str, state: &str) -> Option<Launched> {
    let (mode, why) = ShmMode::detect(Some(Path::new(BIN)));
    if mode != ShmMode::PrivateMount {
        eprintln!("SKIPPED {test}: {}", why.unwrap_or_default());
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeDriverRoot::create(&dir.path().join("driver")).unwrap();
    let guard = fake.guard();
    let mps = MpsControl::new(
        HostRoot::same(fake.path()),
        HostRoot::same(dir.path().join(state)).join("mps"),
    )
    .with_launcher(BIN)
    .with_timeouts(Timeouts {
        ready: Duration::from_secs(5),
        command: Duration::from_secs(5),
        stop: Duration::from_secs(2),
    });
    assert_eq!(mps.shm_mode(), ShmMode::PrivateMount);
    Some(Launched {
        fake,
        mps,
        _guard: guard,
        _dir: dir,
    })
}

#[test]
fn a_daemon_started_through_the_launcher_sees_its_own_shm_and_pipe_dirs() {
    let Some(launched) = launched(
        "a_daemon_started_through_the_launcher_sees_its_own_shm_and_pipe_dirs",
        "state",
    ) else {
        return;
    };
    // The whole of it lives to the end: it holds the directory and guard.
    let (fake, mps) = (&launched.fake, &launched.mps);
    let cfg = DaemonConfig {
        id: "claim-1".into(),
        gpu_uuids: vec![GPU.into()],
        active_thread_percentage: Some(50),
        pinned_memory_limits: BTreeMap::from([(GPU.into(), "512M".into())]),
        multi_user: false,
    };
    let pid = mps.start(&cfg).unwrap().pid.unwrap();
    let dirs = mps.dirs("claim-1").unwrap();
    // The daemon's /dev/shm is its shm directory, not the host's.
    let state = FakeDriverRoot::mps_state(&dirs.pipe).unwrap().unwrap();
    let shm = fs::metadata(&dirs.shm).unwrap();
    assert_eq!(state.dev_shm, Some((shm.dev(), shm.ino())));
    let host_shm = fs::metadata("/dev/shm").unwrap();
    assert_ne!((host_shm.dev(), host_shm.ino()), (shm.dev(), shm.ino()));
    // It and its clients use the pipe directory where containers see it.
    let calls = fake.mps_control_calls().unwrap();
    assert_eq!(calls[0].args, ["-d"]);
    assert_eq!(
        calls[0].env("CUDA_MPS_PIPE_DIRECTORY"),
        Some(CONTAINER_PIPE_DIR)
    );
    let seen = fake.mps_commands().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen.iter()
            .all(|c| c.pipe_dir == Path::new(CONTAINER_PIPE_DIR))
    );
    // The plugin's own clients reach the socket at its path on this side.
    let clients: Vec<_> = calls.iter().filter(|c| c.args.is_empty()).collect();
    assert_eq!(clients.len(), 2, "{calls:?}");
    assert!(
        clients
            .iter()
            .all(|c| c.env("CUDA_MPS_PIPE_DIRECTORY") == dirs.pipe.to_str()),
        "{clients:?}"
    );
    // Nothing of it shows in this namespace's /tmp/nvidia-mps.
    assert!(!Path::new(CONTAINER_PIPE_DIR).join(PID_FILE).exists());
    mps.stop("claim-1").unwrap();
    wait_dead(pid);
    assert!(!dirs.root.exists());
}

#[test]
fn a_state_dir_too_long_for_a_socket_path_works_through_the_launcher() {
    // As under microk8s: /var/snap/microk8s/common/var/lib/kubelet/plugins/gpu.nvidia.com.
    let Some(launched) = launched(
        "a_state_dir_too_long_for_a_socket_path_works_through_the_launcher",
        "var/snap/microk8s/common/var/lib/kubelet/plugins/gpu.nvidia.com",
    ) else {
        return;
    };
    // The whole of it lives to the end: it holds the directory and guard.
    let (fake, mps) = (&launched.fake, &launched.mps);
    let id = "claim-8e12ec19-e79f-4f05-aaac-f310d730cd48-0";
    let dirs = mps.dirs(id).unwrap();
    let socket = dirs.pipe.join(CONTROL_SOCKET);
    assert!(
        socket.as_os_str().len() > MAX_SOCKET_PATH,
        "{}",
        socket.display()
    );
    let cfg = DaemonConfig {
        id: id.into(),
        gpu_uuids: vec![GPU.into()],
        active_thread_percentage: Some(25),
        pinned_memory_limits: BTreeMap::from([(GPU.into(), "1G".into())]),
        // Through the launcher, a multi-user server keeps its `-M`.
        multi_user: true,
    };
    let pid = mps.start(&cfg).unwrap().pid.unwrap();
    assert!(mps.is_running(id));
    // The daemon got both settings, from clients that saw the pipe
    // directory where the daemon and containers see it.
    let seen = fake.mps_commands().unwrap();
    let commands: Vec<&str> = seen.iter().map(|c| c.command.as_str()).collect();
    assert_eq!(
        commands,
        [
            "set_default_active_thread_percentage 25",
            "set_default_device_pinned_mem_limit 0 1024M"
        ],
        "{seen:?}"
    );
    let calls = fake.mps_control_calls().unwrap();
    assert!(
        calls
            .iter()
            .all(|c| c.env("CUDA_MPS_PIPE_DIRECTORY") == Some(CONTAINER_PIPE_DIR)),
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| c.args == ["-d", "-M"]).count(),
        1,
        "{calls:?}"
    );
    // Stopping goes through the same way (`quit` answered, no kill needed
    // for the daemon to be gone) and leaves nothing.
    mps.stop(id).unwrap();
    wait_dead(pid);
    assert!(!dirs.root.exists());
    assert!(
        fake.mps_commands()
            .unwrap()
            .iter()
            .any(|c| c.command == "quit"),
        "quit was not delivered"
    );
}

fn launch(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("mps-launch")
        .args(args)
        .output()
        .unwrap();
    assert!(out.stdout.is_empty(), "{out:?}");
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn malformed_or_failing_launches_say_why_and_change_no_mount_here() {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let missing = format!("{d}/missing");
    // Refused before anything is done.
    for (args, expected) in [
        (vec![], "expected --probe or <shm-dir> <pipe-dir> <program>"),
        (vec!["--probe", "now"], "unexpected argument \"now\""),
        (vec![d, d], "got 2 argument(s)"),
        (
            vec!["shm", d, "/bin/true"],
            "the shm directory must be an absolute path",
        ),
    ] {
        let (code, err) = launch(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: mps-launch") && err.ends_with('\n') && err.lines().count() == 1,
            "{err:?}"
        );
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // Failing steps, each named with the OS's reason.
    let failing: Vec<(Vec<&str>, String)> = if rustix::process::geteuid().is_root() {
        vec![
            (
                vec![&missing, d, "/bin/true"],
                format!("error: bind mount {missing} on /dev/shm: No such file or directory\n"),
            ),
            (
                vec![d, d, "/nonexistent/nvidia-cuda-mps-control", "-d"],
                "error: run /nonexistent/nvidia-cuda-mps-control: No such file or directory (os error 2)\n"
                    .to_owned(),
            ),
        ]
    } else {
        vec![(
            vec![d, d, "/bin/true"],
            "error: unshare the mount namespace: Operation not permitted\n".to_owned(),
        )]
    };
    for (args, expected) in failing {
        let (code, err) = launch(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err, expected, "{args:?}");
    }
    // The probe: 0 where a private namespace can be had, else the reason.
    let (code, err) = launch(&["--probe"]);
    if rustix::process::geteuid().is_root() {
        assert_eq!((code, err.as_str()), (Some(0), ""));
    } else {
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("Operation not permitted"), "{err}");
    }
    assert_eq!(
        fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts,
        "the launches changed this namespace's mounts"
    );
}
