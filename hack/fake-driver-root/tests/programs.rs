//! The fake programs really run: `nvidia-smi` and the stubs under `/bin/sh`
//! (and under busybox where installed), and the compiled
//! `nvidia-cuda-mps-control` (daemon and client) over its real UNIX socket.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use fake_driver_root::{
    Behaviour, FakeDriverRoot, MpsCommand, NodeKind, Options, cmdline, create_dev_root, is_alive,
    parent_id, process_group_id,
};

const STD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs a program with a clean environment; retries the spawn while another
/// test thread's fork still holds a freshly written program open (ETXTBSY).
fn run(program: &Path, args: &[&str], env: &[(&str, &str)], stdin: impl AsRef<[u8]>) -> Output {
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
        .write_all(stdin.as_ref())
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

/// Writes `request` straight into the daemon's socket, as a program other
/// than the client could; returns whatever comes back before the daemon
/// closes the connection.
fn raw(control: &Path, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(control).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // A request the daemon stops reading may be cut short: not our concern.
    let _ = stream.write_all(request);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

struct Mps {
    root: FakeDriverRoot,
    pipe: PathBuf,
    log: PathBuf,
    _guard: fake_driver_root::ProcessGuard,
    dir: tempfile::TempDir,
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
            dir,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CUDA_MPS_PIPE_DIRECTORY", self.pipe.display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY", self.log.display().to_string()),
            ("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb".into()),
        ]
    }

    fn control(&self, args: &[&str], stdin: impl AsRef<[u8]>) -> Output {
        self.control_with_path(args, stdin, STD_PATH)
    }

    fn control_with_path(&self, args: &[&str], stdin: impl AsRef<[u8]>, path: &str) -> Output {
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

    fn control_log(&self) -> String {
        fs::read_to_string(self.log.join("control.log")).unwrap_or_default()
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

/// Checks the real daemon's log line format: `[YYYY-MM-DD HH:MM:SS.mmm Control <pid>] ...`.
fn check_log_line(line: &str, pid: u32) {
    let stamp = line.get(1..24).unwrap_or_default();
    let pattern = "dddd-dd-dd dd:dd:dd.ddd";
    assert!(
        line.starts_with('[')
            && stamp.len() == pattern.len()
            && stamp
                .bytes()
                .zip(pattern.bytes())
                .all(|(c, p)| if p == b'd' {
                    c.is_ascii_digit()
                } else {
                    c == p
                }),
        "{line}"
    );
    assert!(
        line[24..].starts_with(&format!(" Control {pid:>5}] ")),
        "{line}"
    );
}

#[test]
fn mps_daemon_daemonizes_answers_in_order_logs_and_quits() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    assert!(is_alive(pid));
    // A process group of its own, and a child of neither the `-d` process
    // (gone) nor this test: it outlives its caller and a kill of the
    // caller's process group. (Not a session of its own: std has no setsid
    // without `unsafe`.)
    assert_eq!(process_group_id(pid), Some(pid));
    assert_ne!(process_group_id(pid), process_group_id(std::process::id()));
    assert_ne!(parent_id(pid), Some(std::process::id()));
    // Its command line names the control program, as the driver expects.
    let bin = mps.root.bin("nvidia-cuda-mps-control");
    assert_eq!(
        cmdline(pid).unwrap(),
        [bin.to_str().unwrap(), "--fake-daemon"]
    );
    // The endpoint is a real UNIX socket.
    let control = fs::symlink_metadata(mps.pipe.join("control")).unwrap();
    assert!(control.file_type().is_socket());

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
    // Answered only once its files are gone.
    assert!(!mps.pipe.join("control").exists());
    assert!(!mps.pipe.join("nvidia-cuda-mps-control.pid").exists());
    assert_eq!(FakeDriverRoot::mps_state(&mps.pipe).unwrap(), None);
    wait_for("the daemon to exit", || !is_alive(pid));

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
    assert_eq!(calls[0].env("NVIDIA_VISIBLE_DEVICES"), None);
    assert_eq!(calls[1].args, ["--fake-daemon"]);
    assert_eq!(calls[2].args, Vec::<String>::new());
    assert_eq!(calls.len(), 4);

    let log = mps.control_log();
    for line in log.lines() {
        check_log_line(line, pid);
    }
    let first = log.lines().next().unwrap();
    assert!(
        first.ends_with(&format!(
            "] Starting control daemon using socket {}/control",
            mps.pipe.display()
        )),
        "{first}"
    );
    assert!(log.contains("] Cmd:set_default_active_thread_percentage 40\n"));
    assert_eq!(log.matches("] NEW UI\n").count(), 6);
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
    assert_eq!(
        text(&out.stderr),
        "An instance of this daemon is already running\n"
    );
    assert_eq!(mps.pid(), Some(pid));

    let out = mps.control(&["-x"], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "usage: nvidia-cuda-mps-control [-d]\n");

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
        let out = mps.control(&[], format!("{bad}\n"));
        assert_eq!(out.status.code(), Some(1), "{bad}");
    }
    let out = mps.control(&[], "set_default_active_thread_percentage 101\n");
    assert_eq!(
        text(&out.stdout),
        "Invalid value: the percentage must be a number from 0 to 100\n"
    );
    // One refused line fails the run, the others are still answered.
    let out = mps.control(&[], "quit now\n\nget_default_active_thread_percentage\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "usage: quit [-t <seconds>]\n100.0\n");
    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.active_thread_percentage, None);
    assert!(state.pinned_mem_limits.is_empty());
    assert!(is_alive(pid));

    mps.root
        .set_behaviour(&Behaviour {
            mps_refused_command: Some("set_default_device_pinned_mem_limit".into()),
            ..Behaviour::default()
        })
        .unwrap();
    let out = mps.control(&[], "set_default_device_pinned_mem_limit GPU-aaaa 1M\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stdout),
        "Command refused (fake driver behaviour): set_default_device_pinned_mem_limit\n"
    );
}

#[test]
fn mps_commands_are_data_not_code_and_malformed_requests_leave_it_serving() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    let marker = mps.dir.path().join("pwned");
    let at_limit = format!("{:x<1000}", "y");
    let hostile = [
        format!("$(touch {})", marker.display()),
        format!("`touch {}`", marker.display()),
        format!("get_server_list; touch {}", marker.display()),
        format!("get_server_list | touch {}", marker.display()),
        "get_server_list *".into(),
        "quit\\nquit".into(),
        "'quit'".into(),
        "\"quit\"".into(),
        at_limit.clone(),
    ];
    for line in &hostile {
        let out = mps.control(&[], format!("{line}\n"));
        assert_eq!(out.status.code(), Some(1), "{line}");
    }
    assert!(!marker.exists());
    assert!(is_alive(pid), "a hostile line stopped the daemon");
    let seen: Vec<MpsCommand> = mps.root.mps_commands().unwrap();
    assert_eq!(seen.len(), hostile.len());
    assert!(seen.iter().all(|c| !c.ok));
    assert_eq!(seen[4].command, "get_server_list *");
    assert_eq!(seen[8].command, at_limit);

    // Lines the client does not send; it goes on with the next one.
    for (line, message) in [
        (vec![b'x'; 1001], "Command too long\n"),
        (
            b"quit\xff".to_vec(),
            "Invalid command: not a line of UTF-8 text\n",
        ),
        (
            b"quit\0now".to_vec(),
            "Invalid command: not a line of UTF-8 text\n",
        ),
    ] {
        let mut input = line;
        input.extend_from_slice(b"\nget_default_active_thread_percentage\n");
        let out = mps.control(&[], &input);
        assert_eq!(out.status.code(), Some(1), "{message}");
        assert_eq!(text(&out.stderr), message);
        assert_eq!(text(&out.stdout), "100.0\n");
    }
    assert_eq!(mps.root.mps_commands().unwrap().len(), hostile.len() + 3);

    // Written straight into the socket, malformed requests get no answer
    // and the daemon goes on; a silent connection is dropped after a while.
    let control = mps.pipe.join("control");
    let silent = UnixStream::connect(&control).unwrap();
    let mut long = vec![b'y'; 5000];
    long.push(b'\n');
    for request in [
        b"".as_slice(),
        b"\n",
        b"\xff\xfeget_server_list\n",
        b"get_server_list\0\n",
        &long,
    ] {
        assert_eq!(raw(&control, request), b"", "{request:?}");
    }
    drop(silent);
    // The wire format: a command line in, a status line and output lines out.
    assert_eq!(
        raw(&control, b"get_default_active_thread_percentage\n"),
        b"0\n100.0\n"
    );
    assert_eq!(
        raw(&control, b"start_server -uid 0"),
        b"1\nUnknown command: start_server\n"
    );
    assert!(mps.control(&[], "get_server_list\n").status.success());
    assert!(is_alive(pid));
    assert_eq!(
        mps.control_log()
            .matches("] Invalid request ignored\n")
            .count(),
        6
    );
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
    assert_eq!(
        text(&out.stderr),
        "Cannot find MPS control daemon process\n"
    );
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
    let slow = |delay: u32, timeout: Option<u32>| Behaviour {
        mps_reply_delay_ms: delay,
        mps_reply_timeout_ms: timeout,
        ..Behaviour::default()
    };
    // The pipe directory holds the daemon's files and nothing of its clients.
    let files = |pipe: &Path| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(pipe)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let daemon_files = ["control", "fake-mps-state", "nvidia-cuda-mps-control.pid"];
    // A slow answer is waited for.
    mps.root.set_behaviour(&slow(200, None)).unwrap();
    let begun = Instant::now();
    let out = mps.control(&[], "set_default_active_thread_percentage 30\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "30\n");
    assert!(begun.elapsed() >= Duration::from_millis(200));
    assert_eq!(files(&mps.pipe), daemon_files);

    // Past the client's reply timeout it gives up with a clear message.
    // (The bound leaves the client's start 2.4 s; the next client, queued
    // behind the abandoned answer, waits under its own 5 s timeout.)
    mps.root.set_behaviour(&slow(3000, Some(100))).unwrap();
    let begun = Instant::now();
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Timed out waiting for the MPS control daemon\n"
    );
    assert!(
        begun.elapsed() < Duration::from_millis(2500),
        "{:?}",
        begun.elapsed()
    );
    assert_eq!(files(&mps.pipe), daemon_files);
    // The daemon answers the abandoned request into nothing, then serves
    // the next client (queued meanwhile).
    mps.root.set_behaviour(&slow(0, None)).unwrap();
    let out = mps.control(&[], "get_default_active_thread_percentage\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "30\n");
    assert!(is_alive(pid));

    // A daemon that dies while a client waits is noticed.
    // The kill waits until the daemon has logged the client's command, so
    // the client is connected and waiting however slowly it started.
    mps.root.set_behaviour(&slow(5000, None)).unwrap();
    let asked = || mps.control_log().matches("Cmd:get_server_list").count();
    let before = asked();
    let (begun, out) = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while asked() == before {
                assert!(
                    Instant::now() < deadline,
                    "the client never reached the daemon"
                );
                sleep(Duration::from_millis(10));
            }
            assert!(fake_driver_root::kill(pid));
        });
        (Instant::now(), mps.control(&[], "get_server_list\n"))
    });
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
fn clients_at_once_each_get_their_own_answer() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    // Slow enough answers that the clients overlap.
    mps.root
        .set_behaviour(&Behaviour {
            mps_reply_delay_ms: 20,
            ..Behaviour::default()
        })
        .unwrap();
    let outs: Vec<Output> = std::thread::scope(|s| {
        let mps = &mps;
        let clients: Vec<_> = (1..=4)
            .map(|i| {
                s.spawn(move || {
                    mps.control(
                        &[],
                        format!(
                            "set_default_device_pinned_mem_limit GPU-{i} {i}M\n\
                             get_default_device_pinned_mem_limit GPU-{i}\n"
                        ),
                    )
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    for (i, out) in (1..).zip(&outs) {
        assert!(out.status.success(), "{i}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("{i}M\n"));
    }
    assert_eq!(mps.root.mps_commands().unwrap().len(), 8);
    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.pinned_mem_limits.len(), 4);
    assert!(is_alive(pid));
}

#[test]
fn killed_daemon_is_seen_dead_and_a_new_one_starts() {
    let mps = Mps::new(Options::default());
    let pid = mps.start();
    assert!(fake_driver_root::kill(pid));
    wait_for("the daemon to die", || !is_alive(pid));
    // Its socket stays behind, nobody listening.
    assert!(mps.pipe.join("control").exists());
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Cannot find MPS control daemon process\n"
    );
    // A pid file naming a live process that does not listen: the same.
    let pid_file = mps.pipe.join("nvidia-cuda-mps-control.pid");
    fs::write(&pid_file, format!("{}\n", std::process::id())).unwrap();
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Cannot find MPS control daemon process\n"
    );
    fs::write(&pid_file, format!("{pid}\n")).unwrap();
    // The stale pid file and endpoint do not block a new daemon.
    let out = mps.control(&["-d"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the new daemon", || mps.pid().is_some_and(|p| p != pid));
    let second = mps.pid().unwrap();
    wait_for("the new endpoint", || mps.pipe.join("control").exists());
    assert!(mps.control(&[], "get_server_list\n").status.success());
    let state = FakeDriverRoot::mps_state(&mps.pipe).unwrap().unwrap();
    assert_eq!(state.daemon_pid, Some(second));
}

#[test]
fn a_daemon_is_found_by_its_program_whatever_its_argv0_and_survives_a_rebuilt_root() {
    let mps = Mps::new(Options::default());
    // Started through a PATH lookup, its command line names no path.
    let path = format!("{}:{STD_PATH}", mps.root.path().join("usr/bin").display());
    let env = mps.env();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("PATH", &path));
    let out = run(Path::new("nvidia-cuda-mps-control"), &["-d"], &env, "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the daemon", || mps.pipe.join("control").exists());
    let pid = mps.pid().unwrap();
    assert_eq!(
        cmdline(pid).unwrap(),
        ["nvidia-cuda-mps-control", "--fake-daemon"]
    );
    // Rebuilding the root replaces the program's file under the running
    // daemon (now `<path> (deleted)`), which keeps serving the new clients.
    FakeDriverRoot::create(mps.root.path()).unwrap();
    let out = mps.control(&[], "set_default_active_thread_percentage 70\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "70\n");
    let guard = mps.root.guard();
    assert_eq!(guard.processes(), vec![pid]);
    drop(guard);
    wait_for("the guard's kill", || !is_alive(pid));
    assert_eq!(mps.root.processes(), Vec::<u32>::new());
}

/// `<dir>/p...p` whose `control` path is `len` bytes long.
fn pipe_with_control_len(dir: &Path, len: usize) -> PathBuf {
    let fixed = dir.as_os_str().len() + "/".len() + "/control".len();
    let pipe = dir.join("p".repeat(len - fixed));
    assert_eq!(pipe.join("control").as_os_str().len(), len);
    pipe
}

#[test]
fn a_control_socket_path_over_107_bytes_fails_cleanly() {
    let mut mps = Mps::new(Options::default());
    // sun_path holds 108 bytes with the final NUL: 107 is the longest path.
    mps.pipe = pipe_with_control_len(mps.dir.path(), 107);
    let pid = mps.start();
    let out = mps.control(&[], "get_default_active_thread_percentage\nquit\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "100.0\n");
    wait_for("the daemon to exit", || !is_alive(pid));

    mps.pipe = pipe_with_control_len(mps.dir.path(), 108);
    // `-d` returns at once, as the real one does; its daemon fails later.
    let out = mps.control(&["-d"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = format!("] Cannot listen on socket {}/control: ", mps.pipe.display());
    wait_for("the daemon's error in its log", || {
        mps.control_log().contains(&expected)
    });
    wait_for("the daemon to exit", || mps.root.processes().is_empty());
    for name in [
        "control",
        ".ctlnew",
        "nvidia-cuda-mps-control.pid",
        "fake-mps-state",
    ] {
        assert!(!mps.pipe.join(name).exists(), "{name}");
    }
    let out = mps.control(&[], "get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Cannot find MPS control daemon process\n"
    );
    assert_eq!(mps.root.mps_commands().unwrap().len(), 2);
}

#[test]
fn scripts_run_under_busybox_sh_and_applets() {
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
    let applets = mps.dir.path().join("bb");
    fs::create_dir(&applets).unwrap();
    for applet in ["mkdir", "sh"] {
        symlink(busybox, applets.join(applet)).unwrap();
    }
    let path = applets.to_str().unwrap();
    let root = &mps.root;
    let smi = run(
        &root.bin("nvidia-smi"),
        &["compute-policy", "-i", "GPU-1", "--set-timeslice", "2"],
        &[("PATH", path)],
        "",
    );
    assert!(smi.status.success(), "{}", text(&smi.stderr));
    assert_eq!(root.gpu_state().unwrap().timeslice["GPU-1"], 2);
    let smi = run(&root.bin("nvidia-smi"), &["-L"], &[("PATH", path)], "");
    assert!(smi.status.success(), "{}", text(&smi.stderr));
    let server = run(
        &root.bin("nvidia-cuda-mps-server"),
        &["-x"],
        &[("PATH", path)],
        "",
    );
    assert_eq!(server.status.code(), Some(1));
    assert_eq!(
        text(&server.stderr),
        "nvidia-cuda-mps-server: the fake driver root runs no MPS server\n"
    );
    let hook = run(
        &root.bin("nvidia-cdi-hook"),
        &["update-ldcache", "--folder", "/a b"],
        &[("PATH", path)],
        "",
    );
    assert!(hook.status.success(), "{}", text(&hook.stderr));
    assert_eq!(
        root.calls_of("nvidia-cdi-hook").unwrap()[0].args,
        ["update-ldcache", "--folder", "/a b"]
    );
    // The compiled MPS control program needs no shell at all.
    let pid = {
        let out = mps.control_with_path(&["-d"], "", path);
        assert!(out.status.success(), "{}", text(&out.stderr));
        wait_for("the daemon", || mps.pipe.join("control").exists());
        mps.pid().unwrap()
    };
    let out = mps.control_with_path(&[], "quit\n", path);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the daemon to exit", || !is_alive(pid));
    let tools: Vec<String> = root.calls().unwrap().into_iter().map(|c| c.tool).collect();
    assert_eq!(
        tools,
        [
            "nvidia-smi",
            "nvidia-smi",
            "nvidia-cuda-mps-server",
            "nvidia-cdi-hook",
            "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-control",
        ]
    );
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
