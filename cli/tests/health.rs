//! `gpu-dra health`, run as a binary against slice files: the captured
//! pool of the `dgx-a100` profile with health taints added
//! (`tests/data/slices/dgx-a100-health.yaml`), the same pool without them,
//! and hostile files. Against an API server through a kubeconfig:
//! `gpu-dra-e2e`'s `tests/health_kubeconfig.rs`.

use std::path::Path;

use serde_json::{Value, json};

mod common;

use common::{Run, data};

const HEALTH: &str = "slices/dgx-a100-health.yaml";
const CLEAN: &str = "slices/dgx-a100.yaml";

fn health<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    common::gpu_dra("health", args)
}

fn health_json<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, Value) {
    common::gpu_dra_json("health", args)
}

fn file_arg(path: &Path) -> [&std::ffi::OsStr; 2] {
    ["-f".as_ref(), path.as_os_str()]
}

/// The GPUs of the first node as `(minor, state)`.
fn states(report: &Value) -> Vec<(Value, String)> {
    report["nodes"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["minor"].clone(), g["state"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn the_tainted_pool_is_shown_per_gpu_and_exits_1() {
    let (code, report) = health_json(&file_arg(&data(HEALTH)));
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        states(&report),
        [
            (json!(0), "PartlyUnschedulable".to_owned()),
            (json!(1), "Unschedulable".to_owned()),
            (json!(2), "NoTaints".to_owned()),
            (json!(4), "Informational".to_owned()),
            (json!(5), "Informational".to_owned()),
            (json!(6), "Unschedulable".to_owned()),
            (json!(7), "NoTaints".to_owned()),
        ]
    );
    let gpu1 = &report["nodes"][0]["gpus"][1];
    assert_eq!(gpu1["uuid"], "GPU-0cb1e29c-658c-4a14-95e6-0af593bd04cf");
    assert_eq!(gpu1["devices"].as_array().unwrap().len(), 7);
    assert_eq!(
        gpu1["devices"][3]["taints"][0],
        json!({
            "key": "gpu.nvidia.com/gpu-lost",
            "value": null,
            "effect": "NoSchedule",
            "timeAdded": "2026-11-29T06:12:31Z",
            "known": true,
            "meaning": "the GPU does not answer NVML (lost, e.g. fallen off the bus, XID 79); clears once the GPU recovers and stays quiet",
        })
    );
    assert_eq!(
        report["summary"],
        json!({
            "nodes": 1, "gpus": 7, "devices": 14, "taintedDevices": 11,
            "unschedulableDevices": 9,
            "gpusByState": {"NoTaints": 2, "Informational": 2, "PartlyUnschedulable": 1, "Unschedulable": 2},
        })
    );
    assert_eq!(report["problems"], json!([]));

    let run = health(&file_arg(&data(HEALTH)));
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    // A whole-GPU fault is said once for all the GPU's devices.
    assert!(
        run.stdout.contains(
            "NVIDIA A100-SXM4-80GB: unschedulable (7 of 7 devices)\n    all 7 devices:\n      gpu.nvidia.com/gpu-lost NoSchedule since 2026-11-29T06:12:31Z\n"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .ends_with("1 node, 7 GPUs, 14 devices: 11 tainted, 9 unschedulable\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_pool_without_taints_exits_0() {
    let run = health(&["--node", "node-a", "-f", data(CLEAN).to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .starts_with("node node-a (pool node-a generation 0): 0 of 7 GPUs with taints\n"),
        "{}",
        run.stdout
    );
    assert_eq!(run.stdout.matches(": no taints\n").count(), 7);
}

#[test]
fn no_slices_of_the_node_or_driver_exit_2_with_the_reason() {
    let run = health(&["--node", "node-b", "-f", data(HEALTH).to_str().unwrap()]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert_eq!(
        run.stderr,
        format!(
            "note: 1 ResourceSlice of other nodes skipped (node-a)\nerror: no ResourceSlice of driver gpu.nvidia.com for node node-b in {}\n",
            data(HEALTH).display()
        )
    );

    let claim = common::repo().join("docs/examples/gpu.yaml");
    let run = health(&["-f", claim.to_str().unwrap()]);
    assert_eq!(run.code, 2);
    let file = claim.display();
    assert_eq!(
        run.stderr,
        format!(
            "note: {file}:2 (document 1): ResourceClaimTemplate is not a ResourceSlice: skipped\n\
             note: {file}:14 (document 2): Pod is not a ResourceSlice: skipped\n\
             error: no ResourceSlice of driver gpu.nvidia.com in {file}\n"
        )
    );
}

#[test]
fn hostile_flags_and_files_are_one_line_errors() {
    for node in ["Node-A", "a,spec.driver=x", "-", "", &"a".repeat(300)] {
        let run = health(&["--node", node, "-f", data(HEALTH).to_str().unwrap()]);
        assert_eq!(run.code, 2, "{node}: {}", run.stdout);
        assert!(
            run.stderr.contains("is not a node name (a DNS subdomain"),
            "{node}: {}",
            run.stderr
        );
    }
    let run = health(&["--output", "yaml", "-f", data(HEALTH).to_str().unwrap()]);
    assert_eq!(run.code, 2);
    let run = health::<&str>(&[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--slices"), "{}", run.stderr);

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let broken = write("broken.yaml", "kind: ResourceSlice\nspec: [\n");
    let run = health(&file_arg(&broken));
    assert_eq!(run.code, 2);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);

    let missing = dir.path().join("missing.yaml");
    let run = health(&file_arg(&missing));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("missing.yaml"), "{}", run.stderr);

    let big = dir.path().join("big.yaml");
    std::fs::write(&big, vec![b'#'; 17 * 1024 * 1024]).unwrap();
    let run = health(&file_arg(&big));
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("big.yaml"), "{}", run.stderr);

    let deep = write(
        "deep.yaml",
        &format!(
            "kind: ResourceSlice\nspec: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
    );
    let run = health(&file_arg(&deep));
    assert_eq!(run.code, 2);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn malformed_slices_are_shown_with_located_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.yaml");
    std::fs::write(
        &path,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n  driver: gpu.nvidia.com\n  nodeName: \"evil\\e[2J\"\n  pool: {name: p, generation: 1}\n  devices:\n  - name: gpu-0\n    taints:\n    - key: gpu.nvidia.com/xid\n      value: '79'\n    - key: gpu.nvidia.com/gpu-lost\n      effect: NoExecute\n      flavour: unknown fields are ignored\n  - name: gpu-1\n    taints: {}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
    )
    .unwrap();
    let run = health(&file_arg(&path));
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let file = path.display();
    assert_eq!(
        run.stderr,
        format!(
            "note: {file}:19 (document 2): ConfigMap is not a ResourceSlice: skipped\n\
             warning: {file}:11: ResourceSlice s: spec.devices[0].taints[0].effect: taint gpu.nvidia.com/xid of device gpu-0 without an effect: skipped\n\
             warning: {file}:17: ResourceSlice s: spec.devices[1].taints: taints is not a list: none read\n"
        )
    );
    // The escape character of the node name is shown escaped.
    assert!(
        run.stdout
            .starts_with("node evil\\u{1b}[2J (pool p generation 1): 1 of 2 GPUs with taints\n  gpu 0: NoExecute: pods using it are evicted\n"),
        "{}",
        run.stdout
    );
}
