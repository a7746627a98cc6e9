//! The `test-apiserver` binary: flags, the URL on stdout, the kubeconfig it writes, graceful
//! shutdown on SIGTERM, and clear errors for bad flags.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

const BIN: &str = env!("CARGO_BIN_EXE_test-apiserver");

#[tokio::test]
async fn serves_writes_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(BIN)
        .args([
            "--addr",
            "127.0.0.1:0",
            "--rules",
            "1.34",
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line.trim().to_owned()
    })
    .await
    .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(written.contains(&url));

    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();
    assert_eq!(client.apiserver_version().await.unwrap().minor, "34");
    let nodes: Api<Node> = Api::all(client);
    assert!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || child.wait().unwrap()),
    )
    .await
    .expect("exits within 10 s of SIGTERM")
    .unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn bad_flags_fail_clearly() {
    let out = Command::new(BIN)
        .args(["--rules", "1.20"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unsupported validation rules \"1.20\""),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["--addr", "not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--addr"));

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("--kubeconfig-out")
        .arg(dir.path().join("missing/dir/kubeconfig"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("writing the kubeconfig"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no URL is printed when startup fails"
    );
}
