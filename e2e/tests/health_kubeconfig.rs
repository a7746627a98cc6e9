//! `gpu-dra health --kubeconfig`, run as a binary against the stand-in API
//! server: node-a holds the captured `dgx-a100` pool with health taints
//! (`cli/tests/data/slices/dgx-a100-health.yaml`), node-b the captured
//! PCIe pool without taints, 600 more nodes one GPU each (the list is read
//! page by page, 500 a page), and a slice of another driver. The binary
//! comes from the target folder or `GPU_DRA_BIN` ([`gpu_dra_e2e::bins`]);
//! without one the test skips loudly, and fails when
//! `GPU_DRA_E2E_REQUIRE_GPU_DRA_BIN=1`.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use common::cli::{api_server, data, have_gpu_dra, list_items};
use gpu_dra_sim::apiserver::{Resource, TestApiServer, WriteOptions};
use serde_json::{Value, json};

/// Nodes with one untainted GPU each, beyond node-a and node-b.
const MORE_NODES: usize = 600;

/// `gpu-dra health <args>`: exit status, stdout, stderr.
fn health<S: AsRef<OsStr>>(args: &[S]) -> (i32, String, String) {
    let bin = gpu_dra_e2e::bins::gpu_dra().expect("the gpu-dra binary");
    let out = Command::new(bin)
        .arg("health")
        .args(args)
        .output()
        .expect("run gpu-dra");
    (
        out.status.code().expect("exit status"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The slices of `file` moved to `node` (name, nodeName, pool).
fn on_node(file: &Path, node: &str) -> Vec<Value> {
    list_items(file)
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s["metadata"] = json!({"name": format!("{node}-gpu.nvidia.com-{i}")});
            s["spec"]["nodeName"] = json!(node);
            s["spec"]["pool"]["name"] = json!(node);
            s
        })
        .collect()
}

fn seed(server: &TestApiServer) {
    let store = server.store();
    let opts = WriteOptions::default();
    let mut slices = on_node(&data("slices/dgx-a100-health.yaml"), "node-a");
    slices.extend(on_node(&data("slices/pcie-a100-bridged.yaml"), "node-b"));
    for i in 0..MORE_NODES {
        let node = format!("node-x{i:03}");
        slices.push(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu.nvidia.com-0")},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
            }
        }));
    }
    slices.push(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-other"},
        "spec": {
            "driver": "other.example.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "taints": [{"key": "x", "effect": "NoSchedule"}]}],
        }
    }));
    for slice in slices {
        store
            .create(Resource::ResourceSlices, None, slice, &opts)
            .unwrap();
    }
}

#[test]
fn the_health_view_comes_through_a_kubeconfig() {
    if !have_gpu_dra("the_health_view_comes_through_a_kubeconfig") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (runtime, server) = api_server();
    seed(&server);
    server.write_kubeconfig(&kubeconfig).unwrap();
    let k: &OsStr = kubeconfig.as_os_str();

    // One node: the same view as from the file, and exit 1 for its
    // unschedulable devices.
    let (code, out, err) = health(&[
        "--kubeconfig".as_ref(),
        k,
        "--node".as_ref(),
        "node-a".as_ref(),
        "-o".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let states: Vec<&str> = report["nodes"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "PartlyUnschedulable",
            "Unschedulable",
            "NoTaints",
            "Informational",
            "Informational",
            "Unschedulable",
            "NoTaints"
        ]
    );
    assert_eq!(report["summary"]["unschedulableDevices"], 9);
    assert_eq!(report["problems"], json!([]));
    // The other driver's slice is not even listed (field selector).
    assert_eq!(report["notes"], json!([]));

    // A node without taints exits 0.
    let (code, out, err) = health(&[
        "--kubeconfig".as_ref(),
        k,
        "--node".as_ref(),
        "node-b".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("node node-b (pool node-b generation 0): 0 of 4 GPUs with taints\n"),
        "{out}"
    );

    // Every node, across two pages of the list.
    let (code, out, err) = health(&["--kubeconfig".as_ref(), k, "-o".as_ref(), "json".as_ref()]);
    assert_eq!(code, 1, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["summary"]["nodes"], 2 + MORE_NODES);
    assert_eq!(report["summary"]["gpus"], 7 + 4 + MORE_NODES);

    // A node with no slices.
    let (code, _, err) = health(&[
        "--kubeconfig".as_ref(),
        k,
        "--node".as_ref(),
        "node-c".as_ref(),
    ]);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        format!(
            "error: no ResourceSlice of driver gpu.nvidia.com for node node-c in the cluster of {}\n",
            kubeconfig.display()
        )
    );

    // The server gone: a one-line error, exit 2.
    runtime.block_on(server.shutdown()).unwrap();
    let (code, _, err) = health(&["--kubeconfig".as_ref(), k]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("error: listing resourceslices from http"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
