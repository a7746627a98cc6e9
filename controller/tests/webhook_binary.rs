//! The real `gpu-dra-controller` binary: bad flags and files give one-line
//! errors, a good start serves the webhook over HTTPS, SIGTERM stops it
//! cleanly.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Client, TestCa, review, write_leaf};
use serde_json::json;

fn controller() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-dra-controller"));
    for var in [
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "WEBHOOK_ADDR",
        "TLS_CERT_FILE",
        "TLS_KEY_FILE",
        "NO_WEBHOOK",
        "DRIVER_NAME",
        "LOG_FORMAT",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

fn stderr_of(args: &[&str]) -> (i32, String) {
    let out = controller().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for (args, needle) in [
        (&[][..], "--tls-cert-file"),
        (&["--tls-cert-file", "c"][..], "--tls-key-file"),
        (
            &["--no-webhook", "--driver-name", "Bad_Name"][..],
            "invalid driver name",
        ),
    ] {
        let (code, stderr) = stderr_of(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn unusable_files_exit_1_with_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let garbage = dir.path().join("garbage.key");
    std::fs::write(&garbage, "not a key").unwrap();
    let ca = TestCa::new();
    let files = write_leaf(dir.path(), &ca.leaf(1));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "clusters: [").unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec![
                "--tls-cert-file".into(),
                missing.display().to_string(),
                "--tls-key-file".into(),
                files.key.display().to_string(),
            ],
            "missing.crt".into(),
        ),
        (
            vec![
                "--tls-cert-file".into(),
                files.cert.display().to_string(),
                "--tls-key-file".into(),
                garbage.display().to_string(),
            ],
            "garbage.key".into(),
        ),
        (
            vec![
                "--no-webhook".into(),
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
            ],
            "kubeconfig".into(),
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = stderr_of(&args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        assert!(last.starts_with("error: "), "{stderr}");
        assert!(last.contains(&needle), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let files = write_leaf(dir.path(), &ca.leaf(1));
    let mut child = controller()
        .args(["--webhook-addr", "127.0.0.1:0", "--log-format", "json"])
        .arg("--tls-cert-file")
        .arg(&files.cert)
        .arg("--tls-key-file")
        .arg(&files.key)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no listening line; log so far: {seen:#?}"));
        let parsed: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        seen.push(line);
        if parsed["message"] == "admission webhook listening" {
            break parsed["addr"].as_str().unwrap().parse().unwrap();
        }
    };

    let client = Client::new(addr, &ca.der);
    assert_eq!(client.get("/healthz").await.text(), "ok\n");
    let class = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "other"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'other.example.com'"}}]}
    });
    let sent = review("CREATE", &class);
    let response = client.validate(&sent).await.response();
    assert_eq!(response["uid"], sent["request"]["uid"]);
    assert_eq!(response["allowed"], true);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
}
