//! The fake programs really run: `nvidia-smi` and `nvidia-cuda-mps-control`
//! (daemon and client) under `/bin/sh`, and under busybox where installed.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use fake_driver_root::{
    Behaviour, FakeDriverRoot, MpsCommand, NodeKind, Options, create_dev_root, is_alive, session_id,
};

const STD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs a program with a clean environment; retries the spawn while another
/// test thread's fork still holds a freshly written script open (ETXTBSY).
fn run(program: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut tries = 0;
    let mut child = loop {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", STD_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        match cmd.spawn() {
            Ok(c) => break c,
            Err(e) if e.raw_os_error() == Some(26) && tries < 50 => {
                tries += 1;
                sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("spawn {}: {e}", program.display()),
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(5));
    }
}

struct Mps {
    root: FakeDriverRoot,
    pipe: PathBuf,
    log: PathBuf,
    _guard: fake_driver_root::ProcessGuard,
    _dir: tempfile::TempDir,
}

impl Mps {
    fn new(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = FakeDriverRoot::create_with(&dir.path().join("root"), options).unwrap();
        let guard = root.guard();
        Self {
            pipe: dir.path().join("pipe"),
            log: dir.path().join("log"),
            root,
            _guard: guard,
            _dir: dir,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CUDA_MPS_PIPE_DIRECTORY", self.pipe.display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY", self.log.display().to_string()),
            ("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb".into()),
        ]
    }

    fn control(&self, args: &[&str], stdin: &str) -> Output {
        self.control_with_path(args, stdin, STD_PATH)
    }

    fn control_with_path(&self, args: &[&str], stdin: &str, path: &str) -> Output {
        let env = self.env();
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.push(("PATH", path));
        run(&self.root.bin("nvidia-cuda-mps-control"), args, &env, stdin)
    }

    fn pid(&self) -> Option<u32> {
        fs::read_to_string(self.pipe.join("nvidia-cuda-mps-control.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn start(&self) -> u32 {
        let out = self.control(&["-d"], "");
        assert!(out.status.success(), "-d failed: {}", text(&out.stderr));
        wait_for("the control endpoint", || {
            self.pipe.join("control").exists()
        });
        self.pid().expect("pid file")
    }
}

#[test]
fn nvidia_smi_sets_timeslice_and_compute_mode_and_records_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let root = FakeDriverRoot::create_with(
        dir.path(),
        Options {
            gpus: vec!["GPU-1111".into(), "GPU-2222".into()],
            ..Options::default()
        },
    )
    .unwrap();
    let smi = root.bin("nvidia-smi");
    let out = run(
        &smi,
        &["compute-policy", "-i", "GPU-2222", "--set-timeslice", "3"],
        &[("CUDA_VISIBLE_DEVICES", "x y")],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(
        &smi,
        &["-i", "GPU-1111", "-c", "EXCLUSIVE_PROCESS"],
        &[],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(
        &smi,
        &["compute-policy", "--id=GPU-2222", "--set-timeslice=1"],
        &[],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&smi, &["-L"], &[], "");
    assert_eq!(
        text(&out.stdout),
        "GPU 0: Fake GPU (UUID: GPU-1111)\nGPU 1: Fake GPU (UUID: GPU-2222)\n"
    );

    let state = root.gpu_state().unwrap();
    assert_eq!(state.timeslice, BTreeMap::from([("GPU-2222".into(), 1)]));
    assert_eq!(state.compute_mode["GPU-1111"], "EXCLUSIVE_PROCESS");

    let calls = root.nvidia_smi_calls().unwrap();
    assert_eq!(calls.len(), 4);
    assert_eq!(
        calls[0].args,
        ["compute-policy", "-i", "GPU-2222", "--set-timeslice", "3"]
    );
    assert_eq!(calls[0].env("CUDA_VISIBLE_DEVICES"), Some("x y"));
    assert_eq!(calls[1].env("CUDA_VISIBLE_DEVICES"), None);
    assert_eq!(calls[3].args, ["-L"]);
}

#[test]
fn nvidia_smi_refuses_bad_input_like_the_real_one_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = FakeDriverRoot::create_with(
        dir.path(),
        Options {
            gpus: vec!["GPU-1111".into()],
            ..Options::default()
        },
    )
    .unwrap();
    let smi = root.bin("nvidia-smi");
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["compute-policy", "-i", "GPU-9999", "--set-timeslice", "1"],
            6,
            "No devices were found",
        ),
        (
            &["compute-policy", "-i", "GPU-1111", "--set-timeslice", "4"],
            2,
            "Invalid timeslice value",
        ),
        (
            &["compute-policy", "-i", "../../etc", "--set-timeslice", "1"],
            2,
            "Invalid device id",
        ),
        (
            &[
                "compute-policy",
                "-i",
                "GPU-1111\ntimeslice GPU-1111 3",
                "--set-timeslice",
                "1",
            ],
            2,
            "Invalid device id",
        ),
        (&["compute-policy", "-i"], 2, "Missing value"),
        (
            &["-i", "GPU-1111", "-c", "SHARED"],
            2,
            "Invalid compute mode",
        ),
        (&["--bogus"], 2, "Invalid combination"),
    ];
    for (args, code, message) in cases {
        let out = run(&smi, args, &[], "");
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(message),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        root.gpu_state().unwrap(),
        fake_driver_root::GpuState::default()
    );
    assert_eq!(root.nvidia_smi_calls().unwrap().len(), cases.len());

    root.set_behaviour(&Behaviour {
        nvidia_smi_failure: Some((9, "NVML: driver/library version mismatch".into())),
        ..Behaviour::default()
    })
    .unwrap();
    let out = run(&smi, &["-L"], &[], "");
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(text(&out.stderr), "NVML: driver/library version mismatch\n");
}

#[test]
fn mps_daemon_daemonizes_answers_in_order_logs_and_quits() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    assert!(is_alive(pid));
    // A session of its own, so it outlives the `-d` parent (already gone)
    // and whatever kills this test's process group.
    assert_eq!(session_id(pid), Some(pid));
    assert_ne!(session_id(pid), session_id(std::process::id()));

    let out = mps.control(
        &[],
        "set_default_active_thread_percentage 40\n\
         set_default_device_pinned_mem_limit GPU-aaaa 1024M\n\
         set_default_device_pinned_mem_limit GPU-bbbb 2G\n\
         get_default_device_pinned_mem_limit GPU-bbbb\n\
         get_server_list\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "40\n2G\n");

    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.daemon_pid, Some(pid));
    assert_eq!(state.visible_devices, "GPU-aaaa,GPU-bbbb");
    assert_eq!(state.active_thread_percentage.as_deref(), Some("40"));
    assert_eq!(state.pinned_mem_limits["GPU-aaaa"], "1024M");
    let shm = fs::metadata("/dev/shm").unwrap();
    assert_eq!(state.dev_shm, Some((shm.dev(), shm.ino())));

    let out = mps.control(&[], "quit\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the daemon to exit", || !is_alive(pid));
    assert!(!mps.pipe.join("control").exists());
    assert!(!mps.pipe.join("nvidia-cuda-mps-control.pid").exists());
    assert_eq!(FakeDriverRoot::mps_state(&mps.pipe).unwrap(), None);

    let commands: Vec<String> = mps
        .root
        .mps_commands()
        .unwrap()
        .into_iter()
        .map(|c| {
            assert_eq!(c.pipe_dir, mps.pipe);
            assert!(c.ok, "{c:?}");
            c.command
        })
        .collect();
    assert_eq!(
        commands,
        [
            "set_default_active_thread_percentage 40",
            "set_default_device_pinned_mem_limit GPU-aaaa 1024M",
            "set_default_device_pinned_mem_limit GPU-bbbb 2G",
            "get_default_device_pinned_mem_limit GPU-bbbb",
            "get_server_list",
            "quit",
        ]
    );
    let calls = mps.root.mps_control_calls().unwrap();
    assert_eq!(calls[0].args, ["-d"]);
    assert_eq!(
        calls[0].env("CUDA_MPS_PIPE_DIRECTORY"),
        Some(mps.pipe.to_str().unwrap())
    );
    assert_eq!(
        calls[0].env("CUDA_VISIBLE_DEVICES"),
        Some("GPU-aaaa,GPU-bbbb")
    );

    let log = fs::read_to_string(mps.log.join("control.log")).unwrap();
    let first = log.lines().next().unwrap();
    assert!(
        first.ends_with(&format!(
            "Control {pid:>5}] Starting control daemon using socket {}/control",
            mps.pipe.display()
        )),
        "{first}"
    );
    assert!(log.contains("] Cmd:set_default_active_thread_percentage 40\n"));
    assert!(log.trim_end().ends_with("] Exit"), "{log}");
}

#[test]
fn mps_client_errors_are_clear() {
    let mps = Mps::new(Options::default());
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Cannot find MPS control daemon process\n"
    );

    let pid = mps.start();
    let out = mps.control(&["-d"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already running"));
    assert_eq!(mps.pid(), Some(pid));

    let out = mps.control(&["-x"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("usage"));

    // Bad values are refused and leave the settings alone.
    for bad in [
        "set_default_active_thread_percentage 101",
        "set_default_active_thread_percentage -5",
        "set_default_active_thread_percentage 5.5.5",
        "set_default_device_pinned_mem_limit GPU-aaaa 10T",
        "set_default_device_pinned_mem_limit GPU-aaaa M",
        "set_default_device_pinned_mem_limit ../x 1M",
        "set_default_device_pinned_mem_limit GPU-aaaa 1M extra",
        "quit now",
        "start_server -uid 0",
    ] {
        let out = mps.control(&[], &format!("{bad}\n"));
        assert_eq!(out.status.code(), Some(1), "{bad}");
    }
    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.active_thread_percentage, None);
    assert!(state.pinned_mem_limits.is_empty());
    assert!(is_alive(pid));
}

#[test]
fn mps_commands_are_data_not_code() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    let marker = mps.pipe.parent().unwrap().join("pwned");
    let hostile = [
        format!("$(touch {})", marker.display()),
        format!("`touch {}`", marker.display()),
        format!("get_server_list; touch {}", marker.display()),
        "get_server_list *".into(),
        "quit\\nquit".into(),
        "x".repeat(2000),
    ];
    for line in &hostile {
        let out = mps.control(&[], &format!("{line}\n"));
        assert_eq!(out.status.code(), Some(1), "{line}");
    }
    assert!(!marker.exists());
    assert!(is_alive(pid), "a hostile line stopped the daemon");
    // The long line never reached the daemon; the others were refused by it.
    let seen: Vec<MpsCommand> = mps.root.mps_commands().unwrap();
    assert_eq!(seen.len(), hostile.len() - 1);
    assert!(seen.iter().all(|c| !c.ok));
    assert_eq!(seen[3].command, "get_server_list *");

    // A request written straight into the control FIFO with a forged pid is ignored.
    fs::OpenOptions::new()
        .write(true)
        .open(mps.pipe.join("control"))
        .unwrap()
        .write_all(b"../../x quit\n")
        .unwrap();
    let out = mps.control(&[], "get_server_list\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(is_alive(pid));
}

#[test]
fn mps_slow_start_never_ready_and_start_failure() {
    let mps = Mps::new(Options::default());
    mps.root
        .set_behaviour(&Behaviour {
            mps_start_delay_ms: 150,
            ..Behaviour::default()
        })
        .unwrap();
    let begun = Instant::now();
    let out = mps.control(&["-d"], "");
    assert!(out.status.success());
    // `-d` returns at once; the daemon becomes ready later.
    assert!(mps.pid().is_none() || begun.elapsed() >= Duration::from_millis(150));
    wait_for("the slow daemon", || mps.pipe.join("control").exists());
    assert!(begun.elapsed() >= Duration::from_millis(150));
    let pid = mps.pid().unwrap();
    assert!(mps.control(&[], "quit\n").status.success());
    wait_for("the daemon to exit", || !is_alive(pid));

    mps.root
        .set_behaviour(&Behaviour {
            mps_never_ready: true,
            ..Behaviour::default()
        })
        .unwrap();
    assert!(mps.control(&["-d"], "").status.success());
    wait_for("the pid file", || mps.pid().is_some());
    let stuck = mps.pid().unwrap();
    sleep(Duration::from_millis(50));
    assert!(!mps.pipe.join("control").exists());
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(fake_driver_root::kill(stuck));
    wait_for("the stuck daemon to die", || !is_alive(stuck));

    mps.root
        .set_behaviour(&Behaviour {
            mps_start_failure: Some("CUDA driver not loaded".into()),
            ..Behaviour::default()
        })
        .unwrap();
    let out = mps.control(&["-d"], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "CUDA driver not loaded\n");
}

#[test]
fn a_client_waits_for_a_slow_answer_and_gives_up_on_a_dead_or_silent_daemon() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    // A slow answer is waited for (and no reply FIFO is left behind).
    let slow = |delay: u32, timeout: Option<u32>| Behaviour {
        mps_reply_delay_ms: delay,
        mps_reply_timeout_ms: timeout,
        ..Behaviour::default()
    };
    mps.root.set_behaviour(&slow(200, None)).unwrap();
    let begun = Instant::now();
    let out = mps.control(&[], "set_default_active_thread_percentage 30\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "30\n");
    assert!(begun.elapsed() >= Duration::from_millis(200));
    let leftovers = |pipe: &Path| -> Vec<String> {
        fs::read_dir(pipe)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".reply"))
            .collect()
    };
    assert_eq!(leftovers(&mps.pipe), Vec::<String>::new());

    // Past the client's reply timeout it gives up with a clear message.
    mps.root.set_behaviour(&slow(1500, Some(100))).unwrap();
    let begun = Instant::now();
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Timed out waiting for the MPS control daemon\n"
    );
    assert!(
        begun.elapsed() < Duration::from_millis(1200),
        "{:?}",
        begun.elapsed()
    );
    assert_eq!(leftovers(&mps.pipe), Vec::<String>::new());
    // The daemon still answers the abandoned request into nothing, then goes on.
    mps.root.set_behaviour(&slow(0, None)).unwrap();
    sleep(Duration::from_millis(1500));
    assert!(mps.control(&[], "get_server_list\n").status.success());
    assert!(is_alive(pid));

    // A daemon that dies while a client waits is noticed.
    mps.root.set_behaviour(&slow(5000, None)).unwrap();
    let killer = std::thread::spawn(move || {
        sleep(Duration::from_millis(150));
        assert!(fake_driver_root::kill(pid));
    });
    let begun = Instant::now();
    let out = mps.control(&[], "get_server_list\n");
    killer.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "MPS control daemon exited before answering\n"
    );
    assert!(
        begun.elapsed() < Duration::from_secs(4),
        "{:?}",
        begun.elapsed()
    );
}

#[test]
fn killed_daemon_is_seen_dead_and_a_new_one_starts() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    assert!(fake_driver_root::kill(pid));
    wait_for("the daemon to die", || !is_alive(pid));
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    // The stale pid file and endpoint do not block a new daemon.
    let out = mps.control(&["-d"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the new daemon", || mps.pid().is_some_and(|p| p != pid));
    let second = mps.pid().unwrap();
    // The new daemon removed the old endpoint before writing its pid file.
    wait_for("the new endpoint", || mps.pipe.join("control").exists());
    assert!(mps.control(&[], "get_server_list\n").status.success());
    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.daemon_pid, Some(second));
}

#[test]
fn guard_kills_daemons_when_dropped() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    let guard = mps.root.guard();
    assert_eq!(guard.processes(), vec![pid]);
    drop(guard);
    wait_for("the guard's kill", || !is_alive(pid));
    assert_eq!(mps.root.processes(), Vec::<u32>::new());
}

#[test]
fn programs_run_under_busybox_sh_and_applets() {
    let busybox = Path::new("/usr/bin/busybox");
    if !busybox.exists() {
        eprintln!("SKIPPED: /usr/bin/busybox is not installed (apt-get install busybox-static)");
        return;
    }
    let mps = Mps::new(Options {
        shell: "/usr/bin/busybox sh".into(),
        ..Options::default()
    });
    // Only busybox applets on PATH, as in a busybox container.
    let applets = mps.pipe.parent().unwrap().join("bb");
    fs::create_dir(&applets).unwrap();
    for applet in [
        "date", "mv", "rm", "mkdir", "mkfifo", "sleep", "setsid", "stat", "sh",
    ] {
        symlink(busybox, applets.join(applet)).unwrap();
    }
    let path = applets.to_str().unwrap();
    let out = mps.control_with_path(&["-d"], "", path);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the busybox daemon", || mps.pipe.join("control").exists());
    let pid = mps.pid().unwrap();
    assert_eq!(session_id(pid), Some(pid));
    let out = mps.control_with_path(
        &[],
        "set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n",
        path,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "25\n25\n");
    let out = mps.control_with_path(&[], "quit\n", path);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the busybox daemon to exit", || !is_alive(pid));

    let smi = run(
        &mps.root.bin("nvidia-smi"),
        &["compute-policy", "-i", "GPU-1", "--set-timeslice", "2"],
        &[("PATH", path)],
        "",
    );
    assert!(smi.status.success(), "{}", text(&smi.stderr));
    assert_eq!(mps.root.gpu_state().unwrap().timeslice["GPU-1"], 2);
}

#[test]
fn dev_root_nodes_are_char_devices_as_root_and_files_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let dev = create_dev_root(dir.path(), &[0, 3]).unwrap();
    let names: Vec<String> = dev
        .nodes
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia0",
            "nvidia3",
            "nvidiactl"
        ]
    );
    assert!(dir.path().join("dev/nvidia-caps").is_dir());
    let null = fs::metadata("/dev/null").unwrap();
    if let NodeKind::RegularFile { reason } = &dev.kind {
        eprintln!("stand-in nodes are regular files: {reason}");
    }
    for node in &dev.nodes {
        let meta = fs::metadata(node).unwrap();
        match &dev.kind {
            NodeKind::CharDevice { .. } => {
                assert!(meta.file_type().is_char_device(), "{}", node.display());
                assert_eq!(meta.rdev(), null.rdev());
            }
            NodeKind::RegularFile { .. } => assert!(meta.is_file()),
        }
    }
    // Idempotent: a second call replaces the nodes.
    let again = create_dev_root(dir.path(), &[0, 3]).unwrap();
    assert_eq!(again.nodes, dev.nodes);
}
