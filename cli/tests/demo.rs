//! Runs `gpu-dra demo` as a user would and checks what it reports: the real
//! plugin code against the fake NVML library, the API server stand-in and
//! the kubelet simulator, with nothing left behind.

use std::process::Command;

use serde_json::Value;

fn demo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .arg("demo")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run gpu-dra")
}

fn demo_json(args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let out = demo(&all);
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the JSON report")
}

#[test]
fn default_demo_publishes_a_dgx_h100_pool_and_cleans_up() {
    let report = demo_json(&[]);
    assert_eq!(report["profile"], "dgx-h100");
    assert_eq!(report["registration"]["draVersion"], "v1.DRAPlugin");
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    // NVSwitch: one NVLink domain for all eight GPUs.
    let domain = &gpus[0]["nvlinkDomain"];
    assert!(domain.is_string());
    assert!(gpus.iter().all(|g| &g["nvlinkDomain"] == domain));
    // Dynamic MIG is on by default: placements and one counter set per GPU.
    assert_eq!(report["pool"]["byType"]["gpu"], 8);
    assert!(report["pool"]["byType"]["mig"].as_u64().unwrap() > 8);
    assert_eq!(report["pool"]["counterSets"], 8);
    assert_eq!(report["cleanup"]["slicesLeft"], 0);
    assert_eq!(report["cleanup"]["tempDirRemoved"], true);
    assert_eq!(
        report["cleanup"]["socketsLeft"].as_array().unwrap().len(),
        0
    );
}

#[test]
fn t4_node_has_no_mig_and_no_shared_nvlink_domain() {
    let report = demo_json(&["--profile", "t4-inference"]);
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 4);
    assert!(gpus.iter().all(|g| g["mig"] == "not capable"));
    let mut domains: Vec<&str> = gpus
        .iter()
        .map(|g| g["nvlinkDomain"].as_str().unwrap())
        .collect();
    domains.sort_unstable();
    domains.dedup();
    assert_eq!(domains.len(), 4, "no NVLink: each GPU is its own domain");
    assert_eq!(report["pool"]["byType"]["gpu"], 4);
    assert!(report["pool"]["byType"]["mig"].is_null());
}

#[test]
fn static_mig_mode_publishes_whole_gpus_only_on_a_mig_off_node() {
    let report = demo_json(&["--dynamic-mig", "false"]);
    assert_eq!(report["pool"]["devices"], 8);
    assert_eq!(report["pool"]["counterSets"], 0);
}

#[test]
fn text_output_has_tables_and_the_cleanup_verdict() {
    let out = demo(&["--profile", "pcie-a100-bridged"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("GPUs found"), "{text}");
    assert!(text.contains("NVIDIA A100-PCIE-40GB"), "{text}");
    assert!(text.contains("ResourceSlices published"), "{text}");
    assert!(text.contains("nothing left behind"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no colour when stdout is not a terminal"
    );
}

#[test]
fn unknown_profile_is_a_one_line_error() {
    let out = demo(&["--profile", "no-such-machine"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: unknown profile \"no-such-machine\""),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn malformed_profile_file_is_reported_not_panicked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "driverVersion: [\n").unwrap();
    let out = demo(&["--profile", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
