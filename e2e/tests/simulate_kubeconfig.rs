//! `gpu-dra simulate --kubeconfig`, run as a binary against the stand-in API
//! server seeded with a pool the real plugin published (captured in
//! `cli/tests/data/slices/`) and the shipped classes: the cluster's
//! allocations and classes count, the kubeconfig's namespace is the
//! claim's. The binary comes from the target folder or `GPU_DRA_BIN`
//! ([`gpu_dra_e2e::bins`]); without one the test skips loudly, and fails
//! when `GPU_DRA_E2E_REQUIRE_GPU_DRA_BIN=1` (CI, whose `cargo test
//! --workspace` builds it).

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use common::cli::{api_server, data, have_gpu_dra, list_items, repo};
use gpu_dra_sim::apiserver::{Resource, TestApiServer, WriteOptions};
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    repo().join("docs/examples").join(name)
}

const PCIE: &str = "slices/pcie-a100-bridged.yaml";

/// How one run of the binary ended.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `gpu-dra simulate <args>`.
fn simulate<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let bin = gpu_dra_e2e::bins::gpu_dra().expect("the gpu-dra binary");
    let out = Command::new(bin)
        .arg("simulate")
        .args(args)
        .output()
        .expect("run gpu-dra");
    Run {
        code: out.status.code().expect("exit status"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// `gpu-dra simulate --output json <args>`: the exit status and the
/// parsed report (a panic naming both streams when stdout is not JSON).
fn simulate_json<S: AsRef<OsStr>>(args: &[S]) -> (i32, Value) {
    let mut all: Vec<&OsStr> = vec!["--output".as_ref(), "json".as_ref()];
    all.extend(args.iter().map(AsRef::as_ref));
    let run = simulate(&all);
    let report = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout, run.stderr));
    (run.code, report)
}

/// The results of the first allocation.
fn results(report: &Value) -> &Vec<Value> {
    report["allocations"][0]["results"].as_array().unwrap()
}

fn devices(report: &Value) -> Vec<&str> {
    results(report)
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect()
}

/// Seeds a test API server with the captured pool and the shipped classes.
fn cluster(allocated: bool) -> (tokio::runtime::Runtime, TestApiServer) {
    let (runtime, server) = api_server();
    let store = server.store();
    let opts = WriteOptions::default();
    for slice in list_items(&data(PCIE)) {
        store
            .create(Resource::ResourceSlices, None, slice, &opts)
            .unwrap();
    }
    for file in ["gpu.nvidia.com.yaml", "nvlink.gpu.nvidia.com.yaml"] {
        let text = std::fs::read_to_string(repo().join("deviceclasses").join(file)).unwrap();
        let class: Value = yaml_serde::from_str(&text).unwrap();
        store
            .create(Resource::DeviceClasses, None, class, &opts)
            .unwrap();
    }
    if allocated {
        let text = std::fs::read_to_string(data("claims/gpu-0-allocated.yaml")).unwrap();
        let claim: Value = yaml_serde::from_str(&text).unwrap();
        let created = store
            .create(
                Resource::ResourceClaims,
                Some("team-b"),
                claim.clone(),
                &opts,
            )
            .unwrap();
        let mut with_status = created;
        with_status["status"] = claim["status"].clone();
        store
            .update(
                Resource::ResourceClaims,
                Some("team-b"),
                "running-job",
                with_status,
                true,
                &opts,
            )
            .unwrap();
    }
    (runtime, server)
}

#[test]
fn the_cluster_state_comes_through_a_kubeconfig() {
    if !have_gpu_dra("the_cluster_state_comes_through_a_kubeconfig") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let claim = example("nvlink-pair.yaml");

    let (runtime, server) = cluster(false);
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (code, report) = simulate_json(&[
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(devices(&report), ["gpu-0", "gpu-1"]);
    // The kubeconfig's namespace is the claim's.
    assert_eq!(report["claim"]["namespace"], "default");
    runtime.block_on(server.shutdown()).unwrap();

    let (runtime, server) = cluster(true);
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (code, report) = simulate_json(&[
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(devices(&report), ["gpu-2", "gpu-3"], "gpu-0 is taken");

    // Only the cluster's classes count: the built-in MIG class is not there.
    let run = simulate(&[
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
        "--claim".as_ref(),
        example("mig-pair-same-gpu.yaml").as_os_str(),
    ]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("1g.10gb.mig.nvidia.com"),
        "{}",
        run.stderr
    );
    runtime.block_on(server.shutdown()).unwrap();
}
