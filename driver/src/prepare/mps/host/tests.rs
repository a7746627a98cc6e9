//! The host's request checks, its messages, its command line, and the
//! plugin's side against servers that answer wrongly. The host itself
//! serving (it becomes its process's child subreaper and reaps every
//! child, which other tests in this process must not see) is tested with
//! the real program in `tests/mps_host.rs`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::thread;

use super::client::REPLY_SLACK;
use super::*;

fn request(dir: &Path, program: &Path) -> StartRequest {
    StartRequest {
        program: program.to_owned(),
        private_mount: None,
        env: BTreeMap::from([
            ("PATH".into(), "/usr/bin:/bin".into()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                dir.join("pipe").display().to_string(),
            ),
        ]),
        output: dir.join("out"),
        timeout_ms: 5_000,
        multi_user: false,
    }
}

#[test]
fn checks_refuse_what_a_daemon_start_never_needs() {
    let dir = Path::new("/run/mps");
    let ok = request(
        dir,
        Path::new("/driver-root/usr/bin/nvidia-cuda-mps-control"),
    );
    let root = Path::new("/driver-root");
    ok.check(root).unwrap();
    let cases: Vec<(StartRequest, &str)> = vec![
        (
            StartRequest {
                program: "/bin/sh".into(),
                ..ok.clone()
            },
            "program /bin/sh is not /driver-root/usr/bin/nvidia-cuda-mps-control, the driver root's",
        ),
        (
            StartRequest {
                program: "/tmp/usr/bin/nvidia-cuda-mps-control".into(),
                ..ok.clone()
            },
            "is not /driver-root/usr/bin/nvidia-cuda-mps-control",
        ),
        (
            StartRequest {
                program: "usr/bin/nvidia-cuda-mps-control".into(),
                ..ok.clone()
            },
            "program usr/bin/nvidia-cuda-mps-control is not an absolute path",
        ),
        (
            StartRequest {
                program: "/x\0/nvidia-cuda-mps-control".into(),
                ..ok.clone()
            },
            "contains a NUL byte",
        ),
        (
            StartRequest {
                output: "out".into(),
                ..ok.clone()
            },
            "output file out is not an absolute path",
        ),
        (
            StartRequest {
                private_mount: Some(PrivateMount {
                    shm: "shm".into(),
                    pipe: "/run/mps/pipe".into(),
                }),
                ..ok.clone()
            },
            "shm directory shm is not an absolute path",
        ),
        (
            StartRequest {
                env: BTreeMap::from([("LD_PRELOAD".into(), "/tmp/evil.so".into())]),
                ..ok.clone()
            },
            "environment variable \"LD_PRELOAD\" is not one a daemon gets",
        ),
        (
            StartRequest {
                env: BTreeMap::from([("PATH".into(), "/bin\0x".into())]),
                ..ok.clone()
            },
            "environment variable PATH contains a NUL byte",
        ),
        (
            StartRequest {
                timeout_ms: 0,
                ..ok.clone()
            },
            "timeoutMs 0 is outside 1..=60000",
        ),
        (
            StartRequest {
                timeout_ms: u64::MAX,
                ..ok.clone()
            },
            "is outside 1..=60000",
        ),
    ];
    for (req, needle) in cases {
        let err = req.check(root).unwrap_err();
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
}

#[test]
fn messages_are_strict_json_both_ways() {
    let req = request(
        Path::new("/run/mps"),
        Path::new("/d/nvidia-cuda-mps-control"),
    );
    let text = serde_json::to_string(&req).unwrap();
    assert!(text.contains("\"timeoutMs\":5000"), "{text}");
    assert!(!text.contains("privateMount"), "{text}");
    assert_eq!(serde_json::from_str::<StartRequest>(&text).unwrap(), req);
    let extra = text.replacen('{', "{\"args\":[\"-c\",\"id\"],", 1);
    let err = serde_json::from_str::<StartRequest>(&extra).unwrap_err();
    assert!(err.to_string().contains("unknown field `args`"), "{err}");
    for outcome in [
        Outcome::Exited {
            code: Some(0),
            signal: None,
        },
        Outcome::Exited {
            code: None,
            signal: Some(9),
        },
        Outcome::TimedOut,
        Outcome::Failed { error: "x".into() },
    ] {
        let reply = Reply {
            pid_namespace: "pid:[1]".into(),
            outcome,
        };
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), reply);
    }
    assert!(
        Outcome::Exited {
            code: Some(0),
            signal: None
        }
        .success()
    );
    assert!(
        !Outcome::Exited {
            code: Some(1),
            signal: None
        }
        .success()
    );
    assert!(!Outcome::TimedOut.success());
}

#[test]
fn the_command_line_selects_the_host_by_its_first_argument() {
    let args = |a: &[&str]| {
        a.iter()
            .map(Into::into)
            .collect::<Vec<std::ffi::OsString>>()
    };
    assert_eq!(
        asked(&args(&["p", HOST_ARG, "--socket", "/s"])),
        Some(args(&["p", "--socket", "/s"]))
    );
    assert_eq!(asked(&args(&["p", "--node-name", HOST_ARG])), None);
    assert_eq!(asked(&args(&["p"])), None);
    let parse =
        |a: &[&str]| <HostFlags as clap::Parser>::try_parse_from(a).map_err(|e| e.to_string());
    let flags = parse(&["p", "--socket", "/run/h.sock"]).unwrap();
    assert_eq!(flags.socket, PathBuf::from("/run/h.sock"));
    assert_eq!(flags.driver_root, PathBuf::from("/"));
    assert!(!flags.supervise);
    let flags = parse(&[
        "p",
        "--socket=/run/h.sock",
        "--container-driver-root=/driver-root",
        "--supervise",
    ])
    .unwrap();
    assert_eq!(flags.driver_root, PathBuf::from("/driver-root"));
    assert!(flags.supervise);
    for (bad, needle) in [
        (&["p"][..], "--socket"),
        (
            &["p", "--socket=/s", "--container-driver-root=driver"][..],
            "not an absolute path",
        ),
        (&["p", "--socket", "h.sock"][..], "not an absolute path"),
        (&["p", "--socket", "/run/h.sock", "--bogus"][..], "--bogus"),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

#[test]
fn asking_an_absent_or_foreign_host_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let req = request(dir.path(), Path::new("/d/nvidia-cuda-mps-control"));
    let err = request_start(&socket, &req).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot reach the MPS daemon host at")
            && err
                .to_string()
                .contains("is its pod (the chart's mpsHost) running"),
        "{err}"
    );

    // A server that answers with another PID namespace, and one that
    // answers with garbage.
    for (answer, needle) in [
        (
            "{\"pidNamespace\":\"pid:[1]\",\"outcome\":\"timedOut\"}\n",
            "runs in another PID namespace (pid:[1])",
        ),
        ("hello\n", "answered with something else than a reply"),
        ("", "nothing (the host closed the connection)"),
    ] {
        let socket = dir.path().join("fake.sock");
        let _ = fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let server = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = String::new();
            stream.read_to_string(&mut request).unwrap();
            stream.write_all(answer.as_bytes()).unwrap();
            request
        });
        let err = request_start(&socket, &req).unwrap_err();
        assert!(err.to_string().contains(needle), "{needle:?} not in {err}");
        let sent: StartRequest = serde_json::from_str(&server.join().unwrap()).unwrap();
        assert_eq!(sent, req);
    }
}

#[test]
fn a_host_that_does_not_answer_in_time_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mute.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Takes the connection and the request, and does not answer until
    // the client has given up.
    let (gave_up, given_up) = std::sync::mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = String::new();
        stream.read_to_string(&mut request).unwrap();
        let _ = given_up.recv_timeout(REPLY_SLACK + Duration::from_secs(10));
        drop(stream);
    });
    let req = StartRequest {
        timeout_ms: 1,
        ..request(dir.path(), Path::new("/d/nvidia-cuda-mps-control"))
    };
    let err = request_start(&socket, &req).unwrap_err();
    gave_up.send(()).unwrap();
    assert!(matches!(err, HostError::NoReply { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "did not answer within {} s; the daemon's start may still be running there",
            REPLY_SLACK.as_secs()
        )),
        "{err}"
    );
    server.join().unwrap();
}
