//! The real code path against the fake driver root's
//! `nvidia-cuda-mps-control`: a real daemonized process, a real client per
//! command, readiness, adoption, supervision, stop. Every test holds a
//! [`ProcessGuard`], so no daemon outlives it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use fake_driver_root::{Behaviour, FakeDriverRoot, ProcessGuard};

use super::*;

const A: &str = "GPU-9be4bcfc-49b6-4a08-b2e6-cc3ababced20";
const B: &str = "GPU-830e07bc-1e39-4f10-92bd-4acefaecbd38";

struct Env {
    fake: FakeDriverRoot,
    state: PathBuf,
    guard: ProcessGuard,
    _dir: tempfile::TempDir,
}

fn fast() -> Timeouts {
    Timeouts {
        ready: Duration::from_secs(5),
        command: Duration::from_secs(5),
        stop: Duration::from_secs(2),
    }
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeDriverRoot::create(&dir.path().join("driver")).unwrap();
        let guard = fake.guard();
        Self {
            state: dir.path().join("state"),
            fake,
            guard,
            _dir: dir,
        }
    }

    /// A fresh environment whose fake behaves as `behaviour` says.
    fn behaving(behaviour: &Behaviour) -> Self {
        let env = Self::new();
        env.fake.set_behaviour(behaviour).unwrap();
        env
    }

    /// [`Self::control`] waiting at most `ready` for readiness.
    fn control_ready_within(&self, ready: Duration) -> MpsControl {
        self.control().with_timeouts(Timeouts { ready, ..fast() })
    }

    /// After a failed start of `id`: no directory and no process left.
    fn assert_nothing_left(&self, mps: &MpsControl, id: &str) {
        assert!(!mps.dirs(id).unwrap().root.exists());
        let left = self.guard.processes();
        assert!(left.is_empty(), "{left:?}");
    }

    fn control(&self) -> MpsControl {
        self.control_in("mps")
    }

    /// A control of the fake driver root whose `--mps-dir` is
    /// `<state>/<leaf>` (`mps`: [`Self::control`]).
    fn control_in(&self, leaf: &str) -> MpsControl {
        MpsControl::new(
            HostRoot::same(self.fake.path()),
            HostRoot::same(self.state.join(leaf)),
        )
        .with_shm_mode(ShmMode::Inherit)
        .with_timeouts(fast())
    }

    fn commands(&self) -> Vec<String> {
        self.fake
            .mps_commands()
            .unwrap()
            .into_iter()
            .map(|c| c.command)
            .collect()
    }

    fn starts(&self) -> usize {
        self.fake
            .mps_control_calls()
            .unwrap()
            .iter()
            .filter(|c| c.args == ["-d"])
            .count()
    }
}

fn cfg(id: &str) -> DaemonConfig {
    DaemonConfig {
        id: id.into(),
        gpu_uuids: vec![A.into(), B.into()],
        active_thread_percentage: Some(50),
        pinned_memory_limits: BTreeMap::from([(A.into(), "512M".into()), (B.into(), "2G".into())]),
        multi_user: false,
    }
}

fn wait_dead(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs::is_alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} did not die");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn start_waits_for_readiness_then_applies_settings_in_order() {
    let env = Env::new();
    let mps = env.control();
    let record = mps.start(&cfg("claim-1")).unwrap();
    let dirs = mps.dirs("claim-1").unwrap();
    let pid = record.pid.unwrap();
    assert_eq!(mps.pid("claim-1"), Some(pid));
    assert!(mps.is_running("claim-1"));
    // Neither this process's child nor in its process group: signals to
    // the plugin's group never reach it, and it outlives the plugin.
    let me = std::process::id();
    assert_ne!(
        fake_driver_root::process_group_id(pid),
        fake_driver_root::process_group_id(me)
    );
    assert_ne!(fake_driver_root::parent_id(pid), Some(me));
    assert_eq!(record.pipe_dir, dirs.pipe);
    assert_eq!(record.gpu_uuids, [A, B]);
    // The first setting is the readiness probe: no `get_server_list`.
    assert_eq!(
        env.commands(),
        [
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 512M",
            "set_default_device_pinned_mem_limit 1 2048M",
        ]
    );
    let state = FakeDriverRoot::mps_state(&dirs.pipe).unwrap().unwrap();
    assert_eq!(state.daemon_pid, Some(pid));
    assert_eq!(state.visible_devices, format!("{A},{B}"));
    assert_eq!(state.active_thread_percentage.as_deref(), Some("50"));
    assert_eq!(state.pinned_mem_limits["1"], "2048M");

    let start = &env.fake.mps_control_calls().unwrap()[0];
    assert_eq!(start.args, ["-d"]);
    assert_eq!(
        start.env("CUDA_VISIBLE_DEVICES"),
        Some(&*format!("{A},{B}"))
    );
    assert_eq!(start.env("CUDA_MPS_PIPE_DIRECTORY"), dirs.pipe.to_str());
    assert_eq!(start.env("CUDA_MPS_LOG_DIRECTORY"), dirs.log.to_str());
    let log = fs::read_to_string(dirs.log.join("control.log")).unwrap();
    assert!(
        log.contains("Cmd:set_default_active_thread_percentage 50"),
        "{log}"
    );
    assert_eq!(mps.config("claim-1").unwrap(), Some(cfg("claim-1")));
    assert_eq!(mps.list().unwrap(), ["claim-1"]);
    let shm_mode = fs::metadata(&dirs.shm).unwrap().mode() & 0o7777;
    assert_eq!(shm_mode, 0o1777);

    mps.stop("claim-1").unwrap();
    wait_dead(pid);
    assert!(env.guard.processes().is_empty());
}

#[test]
fn a_second_start_re_adopts_and_a_second_control_finds_the_daemon() {
    let env = Env::new();
    let first = env.control();
    let pid = first.start(&cfg("claim-1")).unwrap().pid.unwrap();
    let settings = first.dirs("claim-1").unwrap().config;
    let inode = |path: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    };
    let written = inode(&settings);
    let again = first.start(&cfg("claim-1")).unwrap();
    assert_eq!(again.pid, Some(pid));
    // The same settings: the file is not made again (a rewrite renames a
    // new file over it, a new inode).
    assert_eq!(inode(&settings), written);
    assert_eq!(env.starts(), 1);
    // Settings re-applied, without a second readiness probe.
    let commands = env.commands();
    assert_eq!(commands.len(), 6, "{commands:?}");
    assert_eq!(commands[..3], commands[3..]);

    // A restarted plugin: a new control on the same state dir.
    let restarted = env.control();
    assert!(restarted.is_running("claim-1"));
    assert_eq!(restarted.pid("claim-1"), Some(pid));
    let changed = DaemonConfig {
        active_thread_percentage: Some(20),
        ..cfg("claim-1")
    };
    assert_eq!(restarted.start(&changed).unwrap().pid, Some(pid));
    assert_eq!(env.starts(), 1);
    assert_eq!(restarted.config("claim-1").unwrap(), Some(changed.clone()));
    // An unreadable settings file is rewritten on re-adoption.
    std::fs::write(&settings, b"{not json").unwrap();
    assert_eq!(restarted.start(&changed).unwrap().pid, Some(pid));
    assert_eq!(restarted.config("claim-1").unwrap(), Some(changed));
    let state = FakeDriverRoot::mps_state(&first.dirs("claim-1").unwrap().pipe)
        .unwrap()
        .unwrap();
    assert_eq!(state.active_thread_percentage.as_deref(), Some("20"));

    // Other devices under the same id: refused, the daemon is left alone.
    let other = DaemonConfig {
        gpu_uuids: vec![B.into()],
        pinned_memory_limits: BTreeMap::new(),
        ..cfg("claim-1")
    };
    let err = restarted.start(&other).unwrap_err();
    assert!(matches!(err, MpsError::Conflict { .. }), "{err}");
    assert_eq!(restarted.pid("claim-1"), Some(pid));
    restarted.stop("claim-1").unwrap();
    assert!(!first.is_running("claim-1"));
}

#[test]
fn concurrent_starts_of_one_daemon_start_it_once() {
    let env = Env::new();
    let mps = Arc::new(env.control());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let mps = Arc::clone(&mps);
            thread::spawn(move || mps.start(&cfg("shared")).unwrap().pid)
        })
        .collect();
    let pids: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(pids.iter().all(|p| *p == pids[0]), "{pids:?}");
    assert_eq!(env.starts(), 1);
    mps.stop("shared").unwrap();
}

#[test]
fn stop_quits_removes_directories_and_unknown_ids_succeed() {
    let env = Env::new();
    let mps = env.control();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    let root = mps.dirs("claim-1").unwrap().root;
    mps.stop("claim-1").unwrap();
    wait_dead(pid);
    assert!(!root.exists());
    assert!(!mps.is_running("claim-1"));
    assert_eq!(mps.list().unwrap(), Vec::<String>::new());
    assert_eq!(env.commands().last().map(String::as_str), Some("quit"));
    // Again, and never started: both fine.
    mps.stop("claim-1").unwrap();
    mps.stop("never-started").unwrap();
    // Not an id at all: an error, nothing touched.
    let err = mps.stop("../state").unwrap_err();
    assert!(matches!(err, MpsError::InvalidId { .. }), "{err}");
    assert!(env.state.exists());
}

#[test]
fn stop_kills_a_daemon_that_ignores_quit() {
    let env = Env::new();
    let mps = env.control();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    // Make the client time out: the daemon "hangs" (stopped with SIGSTOP).
    let stopped = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::STOP,
    );
    assert!(stopped.is_ok());
    let mps = mps.with_timeouts(Timeouts {
        command: Duration::from_millis(200),
        stop: Duration::from_millis(200),
        ..fast()
    });
    let begun = Instant::now();
    mps.stop("claim-1").unwrap();
    assert!(begun.elapsed() < Duration::from_secs(4));
    wait_dead(pid);
    assert!(!mps.dirs("claim-1").unwrap().root.exists());
}

#[test]
fn a_daemon_that_never_gets_ready_times_out_cleanly() {
    let env = Env::behaving(&Behaviour {
        mps_never_ready: true,
        ..Behaviour::default()
    });
    // Long enough for the daemon's first log line on a loaded machine.
    let mps = env.control_ready_within(Duration::from_secs(2));
    let begun = Instant::now();
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MpsError::NotReady { .. }), "{text}");
    assert!(
        text.contains("claim-1") && text.contains("not ready after"),
        "{text}"
    );
    assert!(
        text.contains("Starting control daemon"),
        "the log tail is in the error: {text}"
    );
    assert!(begun.elapsed() < Duration::from_secs(10));
    assert_eq!(mps.list().unwrap(), Vec::<String>::new());
    env.assert_nothing_left(&mps, "claim-1");
}

#[test]
fn start_failures_and_slow_starts() {
    let env = Env::new();
    let mps = env.control();
    env.fake
        .set_behaviour(&Behaviour {
            mps_start_failure: Some("CUDA driver not loaded".into()),
            ..Behaviour::default()
        })
        .unwrap();
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    assert!(matches!(err, MpsError::StartFailed { .. }), "{err}");
    assert!(err.to_string().contains("CUDA driver not loaded"), "{err}");
    assert!(!mps.dirs("claim-1").unwrap().root.exists());

    env.fake
        .set_behaviour(&Behaviour {
            mps_start_delay_ms: 100,
            ..Behaviour::default()
        })
        .unwrap();
    let begun = Instant::now();
    mps.start(&cfg("claim-1")).unwrap();
    assert!(begun.elapsed() >= Duration::from_millis(100));
    mps.stop("claim-1").unwrap();

    let missing = MpsControl::new(
        HostRoot::same(env.state.join("nowhere")),
        HostRoot::same(&env.state).join("mps"),
    )
    .with_shm_mode(ShmMode::Inherit);
    let err = missing.start(&cfg("claim-1")).unwrap_err();
    assert!(matches!(err, MpsError::ControlMissing { .. }), "{err}");
}

#[test]
fn a_refused_setting_fails_the_start_and_cleans_up() {
    let env = Env::new();
    let mps = env.control();
    env.fake
        .set_behaviour(&Behaviour {
            mps_refused_command: Some("set_default_device_pinned_mem_limit".into()),
            ..Behaviour::default()
        })
        .unwrap();
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MpsError::Command { .. }), "{text}");
    assert!(
        text.contains("\"set_default_device_pinned_mem_limit 0 512M\"") && text.contains("refused"),
        "{text}"
    );
    env.assert_nothing_left(&mps, "claim-1");

    // On re-adoption the same refusal is an error, and the running daemon stays.
    env.fake.set_behaviour(&Behaviour::default()).unwrap();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    env.fake
        .set_behaviour(&Behaviour {
            mps_refused_command: Some("set_default_active_thread_percentage".into()),
            ..Behaviour::default()
        })
        .unwrap();
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    assert!(matches!(err, MpsError::Command { .. }), "{err}");
    assert_eq!(mps.pid("claim-1"), Some(pid));
    mps.stop("claim-1").unwrap();
}

#[test]
fn a_daemon_without_settings_is_probed_with_get_server_list() {
    let env = Env::new();
    let mps = env.control();
    let bare = DaemonConfig {
        id: "bare".into(),
        gpu_uuids: vec![B.into()],
        active_thread_percentage: None,
        pinned_memory_limits: BTreeMap::new(),
        multi_user: false,
    };
    let pid = mps.start(&bare).unwrap().pid.unwrap();
    assert_eq!(env.commands(), ["get_server_list"]);
    let state = FakeDriverRoot::mps_state(&mps.dirs("bare").unwrap().pipe)
        .unwrap()
        .unwrap();
    assert_eq!(state.daemon_pid, Some(pid));
    assert_eq!(state.active_thread_percentage, None);
    mps.stop("bare").unwrap();
    wait_dead(pid);
}

#[test]
fn a_refused_first_setting_fails_at_once_not_after_the_ready_timeout() {
    let env = Env::behaving(&Behaviour {
        mps_refused_command: Some("set_default_active_thread_percentage".into()),
        ..Behaviour::default()
    });
    // A ready timeout far longer than the test may take: the refusal must
    // be told from a daemon not answering yet.
    let mps = env.control_ready_within(Duration::from_secs(60));
    let begun = Instant::now();
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    assert!(begun.elapsed() < Duration::from_secs(10));
    let text = err.to_string();
    assert!(matches!(err, MpsError::Command { .. }), "{text}");
    assert!(
        text.contains("\"set_default_active_thread_percentage 50\"") && text.contains("refused"),
        "{text}"
    );
    // Refused once, then the daemon was seen to answer; nothing retried.
    assert_eq!(
        env.commands(),
        ["set_default_active_thread_percentage 50", "get_server_list"]
    );
    env.assert_nothing_left(&mps, "claim-1");
}

#[test]
fn only_a_start_over_an_existing_directory_kills_stale_processes() {
    let env = Env::new();
    let mps = env.control();
    let dirs = mps.dirs("claim-1").unwrap();
    // A leftover of a start that crashed half-way: the directory and a
    // process carrying the daemon's marker.
    fs::create_dir_all(&dirs.pipe).unwrap();
    let mut stale = procs::spawn_with_environment(
        Command::new("sleep")
            .arg("60")
            .env(procs::DAEMON_MARKER_ENV, &dirs.root),
    );
    let stale_pid = stale.id();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    // Killed by the start (reaped here: it is this test's child).
    let status = stale.wait().unwrap();
    assert!(!status.success());
    assert!(!procs::is_alive(stale_pid));
    mps.stop("claim-1").unwrap();
    wait_dead(pid);
    assert!(!dirs.root.exists());
}

#[test]
fn start_after_the_daemon_died_launches_a_new_one() {
    let env = Env::new();
    let mps = env.control();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    assert!(procs::kill(pid));
    wait_dead(pid);
    let again = mps.start(&cfg("claim-1")).unwrap();
    assert_ne!(again.pid, Some(pid));
    assert_eq!(env.starts(), 2);
    assert!(mps.is_running("claim-1"));
    mps.stop("claim-1").unwrap();
}

#[test]
fn supervision_restarts_a_killed_daemon_with_its_settings() {
    let env = Env::new();
    let mps = env.control();
    let pid = mps.start(&cfg("claim-1")).unwrap().pid.unwrap();
    mps.start(&DaemonConfig {
        id: "claim-2".into(),
        gpu_uuids: vec![B.into()],
        active_thread_percentage: None,
        pinned_memory_limits: BTreeMap::new(),
        multi_user: false,
    })
    .unwrap();
    let pipe = mps.dirs("claim-1").unwrap().pipe;
    // A marker a running container would have in the bind-mounted pipe dir
    // inode: the restart keeps the directory itself.
    let inode = fs::metadata(&pipe).unwrap().ino();

    assert!(procs::kill(pid));
    wait_dead(pid);
    assert!(!mps.is_running("claim-1"));
    env.fake.clear_log().unwrap();

    let ids = [
        "claim-1".to_owned(),
        "claim-2".to_owned(),
        "gone".to_owned(),
        "../x".to_owned(),
    ];
    let results = mps.check(&ids);
    assert_eq!(results.len(), 4);
    let Ok(Health::Restarted(record)) = &results[0].1 else {
        panic!("claim-1 not restarted: {:?}", results[0]);
    };
    let new_pid = record.pid.unwrap();
    assert_ne!(new_pid, pid);
    assert!(
        matches!(results[1].1, Ok(Health::Running { .. })),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(results[2].1, Err(MpsError::NoRecord { .. })),
        "{:?}",
        results[2]
    );
    assert!(
        matches!(results[3].1, Err(MpsError::InvalidId { .. })),
        "{:?}",
        results[3]
    );
    assert_eq!(fs::metadata(&pipe).unwrap().ino(), inode);
    assert_eq!(
        env.commands(),
        [
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 512M",
            "set_default_device_pinned_mem_limit 1 2048M",
        ]
    );
    assert!(matches!(
        mps.check(&ids[..1])[0].1,
        Ok(Health::Running { pid }) if pid == new_pid
    ));
    mps.stop("claim-1").unwrap();
    mps.stop("claim-2").unwrap();
    assert!(env.guard.processes().is_empty());
}

#[test]
fn a_recycled_pid_in_the_pid_file_is_not_a_daemon() {
    let env = Env::new();
    let mps = env.control();
    let dirs = mps.dirs("claim-1").unwrap();
    fs::create_dir_all(&dirs.pipe).unwrap();
    // This test process is alive but is no nvidia-cuda-mps-control.
    fs::write(dirs.pipe.join(PID_FILE), std::process::id().to_string()).unwrap();
    assert!(!mps.is_running("claim-1"));
    let record = mps.start(&cfg("claim-1")).unwrap();
    assert_ne!(record.pid, Some(std::process::id()));
    assert_eq!(env.starts(), 1);
    mps.stop("claim-1").unwrap();
}

#[test]
fn hostile_configs_start_nothing_and_create_nothing() {
    let env = Env::new();
    let mps = env.control();
    let bad = [
        DaemonConfig {
            id: "../../etc".into(),
            ..cfg("x")
        },
        DaemonConfig {
            id: "a/b".into(),
            ..cfg("x")
        },
        DaemonConfig {
            gpu_uuids: vec![format!("{A}\nquit")],
            pinned_memory_limits: BTreeMap::new(),
            ..cfg("x")
        },
        DaemonConfig {
            gpu_uuids: vec![format!("{A} {B}")],
            pinned_memory_limits: BTreeMap::new(),
            ..cfg("x")
        },
        DaemonConfig {
            pinned_memory_limits: BTreeMap::from([(A.into(), "1M\nquit".into())]),
            ..cfg("x")
        },
        DaemonConfig {
            pinned_memory_limits: BTreeMap::from([(A.into(), "99999999999999999999G".into())]),
            ..cfg("x")
        },
        DaemonConfig {
            active_thread_percentage: Some(255),
            ..cfg("x")
        },
    ];
    for cfg in bad {
        let err = mps.start(&cfg).unwrap_err();
        assert!(
            matches!(
                err,
                MpsError::InvalidId { .. } | MpsError::InvalidConfig { .. }
            ),
            "{cfg:?}: {err}"
        );
    }
    assert_eq!(env.fake.calls().unwrap(), vec![]);
    assert!(!env.state.exists());
}

#[test]
fn private_mount_refuses_an_mps_dir_under_dev_shm() {
    let env = Env::new();
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("SKIPPED private_mount_refuses_an_mps_dir_under_dev_shm: no /dev/shm");
        return;
    };
    let mps = MpsControl::new(HostRoot::same(env.fake.path()), HostRoot::same(dir.path()))
        .with_shm_mode(ShmMode::PrivateMount)
        .with_timeouts(fast());
    let err = mps.start(&cfg("claim-1")).unwrap_err().to_string();
    assert!(
        err.contains("MPS directory")
            && err.contains("is under /dev/shm")
            && err.contains("--mps-dir"),
        "{err}"
    );
    assert_eq!(env.fake.calls().unwrap(), vec![], "nothing was run");
}

#[test]
fn private_mount_without_a_launcher_is_refused_and_leaves_nothing() {
    // The launcher itself is tested with the plugin program in
    // `driver/tests/mps_launch.rs`.
    let env = Env::new();
    let mps = env.control().with_shm_mode(ShmMode::PrivateMount);
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    assert!(
        matches!(err, MpsError::PrivateShmUnavailable { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no launcher"), "{err}");
    env.assert_nothing_left(&mps, "claim-1");
    assert_eq!(env.fake.calls().unwrap(), vec![], "nothing was run");
    assert_eq!(ShmMode::detect(None).0, ShmMode::Inherit);
}

#[test]
fn a_socket_path_too_long_without_a_namespace_is_refused_and_leaves_nothing() {
    let env = Env::new();
    // Under microk8s the kubelet directory alone is 46 bytes; here a state
    // directory long enough that `<state>/mps/claim-1/pipe/control` is over
    // the limit, and one where it is exactly at it.
    let base = env.state.as_os_str().len();
    let tail = "/mps/claim-1/pipe/control".len();
    let at_limit = env
        .state
        .join("s".repeat(MAX_SOCKET_PATH - base - tail - 1));
    let over = env.state.join("s".repeat(MAX_SOCKET_PATH - base - tail));
    let control = |state: &Path| {
        MpsControl::new(
            HostRoot::same(env.fake.path()),
            HostRoot::same(state).join("mps"),
        )
        .with_shm_mode(ShmMode::Inherit)
        .with_timeouts(fast())
    };
    let long = control(&over);
    let socket = long.dirs("claim-1").unwrap().pipe.join(CONTROL_SOCKET);
    assert_eq!(socket.as_os_str().len(), MAX_SOCKET_PATH + 1);
    let err = long.start(&cfg("claim-1")).unwrap_err();
    assert!(
        matches!(&err, MpsError::SocketPathTooLong { len, path, .. }
            if *len == MAX_SOCKET_PATH + 1 && *path == socket),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("over the 107") && text.contains("--state-dir"),
        "{text}"
    );
    env.assert_nothing_left(&long, "claim-1");
    assert_eq!(env.fake.calls().unwrap(), vec![], "nothing was run");

    // One byte shorter: the daemon starts and answers there.
    let fits = control(&at_limit);
    let socket = fits.dirs("claim-1").unwrap().pipe.join(CONTROL_SOCKET);
    assert_eq!(socket.as_os_str().len(), MAX_SOCKET_PATH);
    fits.start(&cfg("claim-1")).unwrap();
    assert!(fits.is_running("claim-1"));
    fits.stop("claim-1").unwrap();
}

/// A memory-shared GPU's daemon (no settings) in `mps`.
fn shared(id: &str) -> DaemonConfig {
    DaemonConfig {
        id: id.into(),
        gpu_uuids: vec![A.into()],
        active_thread_percentage: None,
        pinned_memory_limits: BTreeMap::new(),
        multi_user: false,
    }
}

#[test]
fn a_daemon_recorded_under_an_earlier_mps_dir_is_taken_over_there_until_it_stops() {
    let env = Env::new();
    let before = env.control();
    let id = "shared-gpu0";
    let record = before.start(&shared(id)).unwrap();
    let pid = record.pid.unwrap();
    let old_root = before.dirs(id).unwrap().root;

    // The plugin again, with another --mps-dir.
    let mps = env.control_in("run-mps");
    let old_dir = env.state.join("mps");
    assert_eq!(
        mps.recorded_elsewhere(&record).unwrap(),
        Some(old_dir.clone())
    );
    assert_eq!(
        before.recorded_elsewhere(&record).unwrap(),
        None,
        "its own directory"
    );
    mps.adopt_elsewhere(id, old_dir);
    // A claim joining the GPU joins the running daemon: no second start.
    let joined = mps.start(&shared(id)).unwrap();
    assert_eq!(
        (joined.pid, &joined.pipe_dir),
        (Some(pid), &record.pipe_dir)
    );
    assert_eq!(env.starts(), 1);
    let edits = mps.container_edits(id);
    assert!(
        edits
            .mounts
            .iter()
            .all(|m| Path::new(&m.host_path).starts_with(&old_root)),
        "{edits:?}"
    );
    assert_eq!(
        mps.check(&[id.into()])[0].1.as_ref().ok(),
        Some(&Health::Running { pid })
    );
    // Stopped there, directory and all; the next start is under --mps-dir.
    mps.stop(id).unwrap();
    wait_dead(pid);
    assert!(!old_root.exists());
    let fresh = mps.start(&shared(id)).unwrap();
    assert_ne!(fresh.pid, Some(pid));
    assert!(
        fresh.pipe_dir.starts_with(env.state.join("run-mps")),
        "{fresh:?}"
    );
    assert_eq!(mps.list().unwrap(), [id]);
    mps.stop(id).unwrap();
    assert!(env.guard.processes().is_empty());
}

#[test]
fn a_daemon_of_an_earlier_mps_dir_that_cannot_be_seen_is_never_doubled_and_stops_by_its_marker() {
    let env = Env::new();
    let before = env.control();
    let id = "shared-gpu0";
    let pid = before.start(&shared(id)).unwrap().pid.unwrap();
    // Not mounted in the new plugin's container: here, moved out of sight
    // (the daemon's processes still carry the old directory as marker).
    let old_dir = env.state.join("mps");
    fs::rename(&old_dir, env.state.join("hidden")).unwrap();

    let mps = env.control_in("run-mps");
    mps.adopt_elsewhere(id, old_dir.clone());
    let err = mps.start(&shared(id)).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, MpsError::Unreachable { pids, .. } if pids.contains(&pid)),
        "{text}"
    );
    assert!(
        text.contains(&old_dir.join(id).display().to_string()) && text.contains("--mps-dir"),
        "{text}"
    );
    assert_eq!(env.starts(), 1, "no second daemon for the GPU");
    assert!(!env.state.join("run-mps").exists(), "nothing made");
    assert_eq!(
        mps.check(&[id.into()])[0].1.as_ref().ok(),
        Some(&Health::Running { pid })
    );
    // Unprepare of its last claim: killed by the marker.
    mps.stop(id).unwrap();
    wait_dead(pid);
    assert!(env.guard.processes().is_empty());
    // Forgotten: the next claim gets a daemon under --mps-dir.
    let fresh = mps.start(&shared(id)).unwrap();
    assert!(fresh.pipe_dir.starts_with(env.state.join("run-mps")));
    mps.stop(id).unwrap();
}

/// Entries lost: daemons of an earlier --mps-dir that no record names are
/// found by their owner mark and killed, whether their directory can be
/// seen or not; a daemon taken over from a record, one under --mps-dir, and
/// another owner's are left alone, and a forged mark gets nothing but its
/// own process killed.
#[test]
fn orphans_of_an_earlier_mps_dir_are_stopped_by_owner_and_nothing_else_is() {
    let env = Env::new();
    let owner = env.state.clone();
    let before = env.control_in("old").with_owner(&owner);
    let pid_of = |mps: &MpsControl, id: &str| mps.start(&shared(id)).unwrap().pid.unwrap();
    let seen = pid_of(&before, "orphan-seen");
    let kept = pid_of(&before, "recorded");
    let hidden_owner = env.control_in("hidden-old").with_owner(&owner);
    let hidden = pid_of(&hidden_owner, "orphan-hidden");
    fs::rename(env.state.join("hidden-old"), env.state.join("out-of-sight")).unwrap();
    let foreign = pid_of(
        &env.control_in("theirs")
            .with_owner(env.state.join("another")),
        "foreign",
    );
    let unmarked = pid_of(&env.control_in("unmarked"), "unmarked");

    let mps = env.control_in("run-mps").with_owner(&owner);
    let current = pid_of(&mps, "current");
    mps.adopt_elsewhere("recorded", env.state.join("old"));
    let (stopped, errors) = mps.stop_orphans_elsewhere(&|_| false);
    assert!(errors.is_empty(), "{errors:?}");
    let old = env.state.join("old");
    let hidden_dir = env.state.join("hidden-old");
    assert_eq!(
        stopped,
        [
            format!("orphan-hidden in {}", hidden_dir.display()),
            format!("orphan-seen in {}", old.display()),
        ]
    );
    wait_dead(seen);
    wait_dead(hidden);
    assert!(
        old.join("orphan-seen").exists(),
        "its directory is left: a marker is not trusted with a removal"
    );
    for pid in [kept, foreign, unmarked, current] {
        assert!(procs::is_alive(pid), "{pid} left running");
    }
    assert!(old.join("recorded").exists());
    // Nothing left to find the second time.
    assert_eq!(mps.stop_orphans_elsewhere(&|_| false), (vec![], vec![]));
    // A process with the mark and a directory whose name is no daemon id
    // (not one of ours, or a hostile environment): reported, left alone.
    let mut odd = procs::spawn_with_environment(
        Command::new("sleep")
            .arg("30")
            .env(procs::OWNER_ENV, &owner)
            .env(
                procs::DAEMON_MARKER_ENV,
                env.state.join("old").join("not an id"),
            ),
    );
    let (stopped, errors) = mps.stop_orphans_elsewhere(&|_| false);
    assert!(stopped.is_empty(), "{stopped:?}");
    assert!(
        errors.len() == 1 && errors[0].contains("not an id") && errors[0].contains("left running"),
        "{errors:?}"
    );
    assert!(procs::is_alive(odd.id()));
    let _ = odd.kill();
    let _ = odd.wait();
    // A forged mark naming a directory whose pid file names a daemon that
    // is taken over: only the forging process goes, the daemon and the
    // directory stay.
    let forged = env.state.join("forged").join("x");
    fs::create_dir_all(forged.join("pipe")).unwrap();
    fs::write(forged.join("pipe").join(PID_FILE), kept.to_string()).unwrap();
    let mut forger = procs::spawn_with_environment(
        Command::new("sleep")
            .arg("30")
            .env(procs::OWNER_ENV, &owner)
            .env(procs::DAEMON_MARKER_ENV, &forged),
    );
    let (stopped, errors) = mps.stop_orphans_elsewhere(&|_| false);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        stopped,
        [format!("x in {}", forged.parent().unwrap().display())]
    );
    let _ = forger.wait();
    assert!(
        procs::is_alive(kept),
        "the daemon the pid file names runs on"
    );
    assert!(forged.join("pipe").exists());
    // Without an owner it finds nothing at all.
    let unowned = env.control_in("run-mps");
    assert_eq!(unowned.stop_orphans_elsewhere(&|_| false), (vec![], vec![]));
    for pid in [kept, foreign, unmarked, current] {
        procs::kill(pid);
    }
}

/// Entries lost, but their text names a daemon of an earlier --mps-dir:
/// it runs on, taken over where it is, so its claim's unprepare stops it;
/// a named id that --mps-dir has too is left running and not taken over.
#[test]
fn a_named_orphan_of_an_earlier_mps_dir_is_taken_over_not_killed() {
    let env = Env::new();
    let owner = env.state.clone();
    let before = env.control_in("old").with_owner(&owner);
    let named = before.start(&shared("named")).unwrap().pid.unwrap();
    let twin = before.start(&shared("twin")).unwrap().pid.unwrap();
    let unnamed = before.start(&shared("unnamed")).unwrap().pid.unwrap();
    let mps = env.control_in("run-mps").with_owner(&owner);
    let here = mps.start(&shared("twin")).unwrap().pid.unwrap();

    let keep = |id: &str| id == "named" || id == "twin";
    let (stopped, errors) = mps.stop_orphans_elsewhere(&keep);
    assert!(errors.is_empty(), "{errors:?}");
    let old = env.state.join("old");
    assert_eq!(stopped, [format!("unnamed in {}", old.display())]);
    wait_dead(unnamed);
    for pid in [named, twin, here] {
        assert!(procs::is_alive(pid), "{pid} left running");
    }
    assert!(mps.is_running("named"), "taken over where it runs");
    assert_eq!(
        mps.pid("twin"),
        Some(here),
        "--mps-dir's own is the one known"
    );
    // Its claim's unprepare stops it where it runs.
    mps.stop("named").unwrap();
    wait_dead(named);
    assert!(!old.join("named").exists());
    mps.stop("twin").unwrap();
    wait_dead(here);
    procs::kill(twin);
}

#[test]
fn a_gone_daemon_of_an_earlier_mps_dir_that_cannot_be_seen_starts_afresh() {
    let env = Env::new();
    let before = env.control();
    let id = "shared-gpu0";
    before.start(&shared(id)).unwrap();
    let old_dir = env.state.join("mps");
    // The old plugin's container went, and its daemons with it.
    MpsControl::kill_all(id, &before.dirs(id).unwrap()).unwrap();
    fs::rename(&old_dir, env.state.join("hidden")).unwrap();

    let mps = env.control_in("run-mps");
    mps.adopt_elsewhere(id, old_dir);
    let fresh = mps.start(&shared(id)).unwrap();
    assert!(
        fresh.pipe_dir.starts_with(env.state.join("run-mps")),
        "{fresh:?}"
    );
    assert_eq!(env.starts(), 2);
    mps.stop(id).unwrap();
    assert!(env.guard.processes().is_empty());
}

#[test]
fn hostile_daemon_records_name_no_directory() {
    let env = Env::new();
    let mps = env.control_in("run-mps");
    let record = |id: &str, pipe: &str, log: &str, shm: &str| MpsDaemonRecord {
        id: id.into(),
        pipe_dir: pipe.into(),
        pid: None,
        log_dir: log.into(),
        shm_dir: shm.into(),
        gpu_uuids: vec![],
    };
    let current = env.state.join("run-mps/claim-1");
    let current = |leaf: &str| current.join(leaf).display().to_string();
    for (r, expected) in [
        (
            record(
                "claim-1",
                &current("pipe"),
                &current("log"),
                &current("shm"),
            ),
            None,
        ),
        // The same directory, spelled otherwise.
        (
            record("claim-1", "/old/./mps//claim-1/pipe/", "", ""),
            Some(PathBuf::from("/old/mps")),
        ),
        // Records from before the directories were kept.
        (record("claim-1", "", "", ""), None),
        (
            record("claim-1", "/old/mps/claim-1/pipe", "", ""),
            Some(PathBuf::from("/old/mps")),
        ),
        (
            record(
                "claim-1",
                "/old/mps/claim-1/pipe",
                "/old/mps/claim-1/log",
                "/old/mps/claim-1/shm",
            ),
            Some(PathBuf::from("/old/mps")),
        ),
    ] {
        assert_eq!(mps.recorded_elsewhere(&r).unwrap(), expected, "{r:?}");
    }
    for (r, needle) in [
        (
            record("../etc", "/old/../etc/pipe", "", ""),
            "invalid MPS daemon id",
        ),
        (
            record("claim-1", "old/mps/claim-1/pipe", "", ""),
            "not <absolute dir>/<id>/pipe",
        ),
        (
            record("claim-1", "/old/../etc/claim-1/pipe", "", ""),
            "not <absolute dir>/<id>/pipe",
        ),
        (
            record("claim-1", "/pipe", "", ""),
            "not <absolute dir>/<id>/pipe",
        ),
        (
            record("claim-1", "/old/mps/claim-2/pipe", "", ""),
            "the pipe directory /old/mps/claim-2/pipe is not /old/mps/claim-1/pipe",
        ),
        (
            record("claim-1", "/old/mps/claim-1/log", "", ""),
            "the pipe directory /old/mps/claim-1/log is not",
        ),
        (
            record("claim-1", "/old/mps/claim-1/pipe", "/etc", ""),
            "the log directory /etc is not /old/mps/claim-1/log",
        ),
        (
            record("claim-1", "/old/mps/claim-1/pipe", "", "/dev/shm"),
            "the shm directory /dev/shm is not /old/mps/claim-1/shm",
        ),
    ] {
        let err = mps.recorded_elsewhere(&r).unwrap_err().to_string();
        assert!(err.contains(needle), "{r:?}: {err}");
    }
}

#[test]
fn a_path_that_is_not_utf8_is_refused_before_the_host_is_asked() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let dir = env.state.join(std::ffi::OsStr::from_bytes(b"mps-\xff"));
    let mps = MpsControl::new(HostRoot::same(env.fake.path()), HostRoot::same(dir))
        .with_shm_mode(ShmMode::Inherit)
        .with_timeouts(fast())
        .with_host(env.state.join("host.sock"));
    let err = mps.start(&cfg("claim-1")).unwrap_err();
    assert!(
        matches!(err, MpsError::InvalidConfig { .. })
            && err
                .to_string()
                .contains("is not UTF-8, which the MPS daemon host"),
        "{err}"
    );
    env.assert_nothing_left(&mps, "claim-1");
    assert_eq!(env.starts(), 0);
}

/// A client container of daemon `a` writes daemon `b`'s pid into the pid
/// file of its pipe directory (which it can write): stopping `a` leaves `b`
/// running, and `a` does not pass for running once it has gone.
#[test]
fn a_pid_file_naming_another_daemon_neither_stops_it_nor_stands_for_its_own() {
    let env = Env::new();
    let mps = env.control();
    let a = mps.start(&cfg("claim-a")).unwrap().pid.unwrap();
    let b = mps.start(&cfg("claim-b")).unwrap().pid.unwrap();
    let pid_file = mps.dirs("claim-a").unwrap().pipe.join(PID_FILE);
    fs::write(&pid_file, b.to_string()).unwrap();
    assert!(!mps.is_running("claim-a"), "b's pid stood for a");
    mps.stop("claim-a").unwrap();
    wait_dead(a);
    assert!(procs::is_alive(b), "stopping a killed b");
    assert!(mps.is_running("claim-b"));
    mps.stop("claim-b").unwrap();
    wait_dead(b);
}
