//! `gpu-dra simulate`, run as a binary against pools the real plugin
//! published (captured in `tests/data/slices/`): satisfiable claims name
//! their devices, impossible ones exit 1 with the explanation, bad input
//! exits 2. Against an API server through a kubeconfig: `gpu-dra-e2e`'s
//! `tests/simulate_kubeconfig.rs` (the stand-in API server is not a
//! dependency of the CLI).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod common;

use common::{Run, data, repo};

fn example(name: &str) -> PathBuf {
    repo().join("docs/examples").join(name)
}

const PCIE: &str = "slices/pcie-a100-bridged.yaml";
const DGX_A100: &str = "slices/dgx-a100.yaml";
const DGX_H100: &str = "slices/dgx-h100.yaml";

fn simulate<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    common::gpu_dra("simulate", args)
}

fn simulate_json<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, Value) {
    common::gpu_dra_json("simulate", args)
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

/// Every object of a YAML `List` file.
fn list_items(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    let list: Value = yaml_serde::from_str(&text).unwrap();
    list["items"].as_array().unwrap().clone()
}

#[test]
fn two_nvlink_gpus_on_a_bridged_server_are_a_linked_pair() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("nvlink-pair.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["satisfiable"], true);
    assert_eq!(report["allocations"][0]["node"], "node-a");
    let results = results(&report);
    assert_eq!(results.len(), 2);
    let domain = |r: &Value| r["attributes"]["nvlinkDomain"].as_str().unwrap().to_owned();
    assert_eq!(domain(&results[0]), domain(&results[1]));
    assert_ne!(results[0]["device"], results[1]["device"]);
    // The scheduler's first fit: the first bridged pair.
    assert_eq!(devices(&report), ["gpu-0", "gpu-1"]);
    for r in results {
        assert_eq!(r["request"], "gpus");
        assert_eq!(r["driver"], "gpu.nvidia.com");
        assert_eq!(r["pool"], "node-a");
    }

    let run = simulate(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("nvlink-pair.yaml").as_os_str(),
    ]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.starts_with(
            "ResourceClaimTemplate default/nvlink-pair: can be allocated\nnode node-a:\n"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("gpus     gpu-0   node-a  type=gpu productName=NVIDIA A100-PCIE-40GB memory=40Gi nvlinkDomain="), "{}", run.stdout);
}

/// HGX H100: every NVLink ends at an NVSwitch (NVML's sentinel far end), and
/// the plugin publishes one NVLink domain for the 8 GPUs, so a claim for all
/// of them in one domain is satisfiable. The same pool with a domain per GPU
/// (what a plugin keyed on the sentinel published) is not.
#[test]
fn eight_nvlink_gpus_on_hgx_h100() {
    let claim = data("claims/eight-nvlink-gpus.yaml");
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(DGX_H100).as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    let mut names = devices(&report);
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let domains: std::collections::BTreeSet<&str> = results(&report)
        .iter()
        .map(|r| r["attributes"]["nvlinkDomain"].as_str().unwrap())
        .collect();
    assert_eq!(domains.len(), 1, "{domains:?}");

    let dir = tempfile::tempdir().unwrap();
    let split = dir.path().join("split.yaml");
    let mut text = std::fs::read_to_string(data(DGX_H100)).unwrap();
    let domain = *domains.iter().next().unwrap();
    for i in 0..8 {
        text = text.replacen(domain, &format!("{i:016x}"), 1);
    }
    assert!(!text.contains(domain));
    std::fs::write(&split, text).unwrap();
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        split.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["satisfiable"], false);
}

#[test]
fn an_allocated_claim_pushes_the_pair_to_the_other_bridge() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        data("claims/gpu-0-allocated.yaml").as_os_str(),
        "--claim".as_ref(),
        example("nvlink-pair.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(devices(&report), ["gpu-2", "gpu-3"]);
}

#[test]
fn an_impossible_claim_names_the_closest_device() {
    let run = simulate(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("large-memory.yaml").as_os_str(),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .starts_with("ResourceClaim default/large-memory: cannot be allocated\n  why: "),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("closest device `gpu-0`"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("large-memory.gpu.nvidia.com"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("quantity('80G')"), "{}", run.stdout);

    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("large-memory.yaml").as_os_str(),
    ]);
    assert_eq!(code, 1);
    assert_eq!(report["satisfiable"], false);
    assert_eq!(report["allocations"], json!([]));
    let node = &report["explanation"]["nodes"][0];
    assert_eq!(node["node"], "node-a");
    assert_eq!(node["devices"], 4);
    assert_eq!(node["reason"], json!({"type": "Request", "request": "gpu"}));
    let variants = node["requests"][0]["variants"].as_array().unwrap();
    assert_eq!(
        variants.len(),
        2,
        "both firstAvailable alternatives are reported"
    );
    let any = &variants[1];
    assert_eq!(any["name"], "gpu/any");
    assert_eq!(any["matching"], 0);
    // The class's type selector passes every GPU, the memory one none.
    let passed: Vec<u64> = any["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["passed"].as_u64().unwrap())
        .collect();
    assert_eq!(passed, [4, 0]);
    assert_eq!(any["closest"]["device"], "gpu-0");
    assert_eq!(any["closest"]["failedStage"], 1);
}

#[test]
fn three_linked_gpus_fail_on_the_constraint() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        data("claims/three-nvlink-gpus.yaml").as_os_str(),
    ]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["claim"]["namespace"], "team-a");
    let node = &report["explanation"]["nodes"][0];
    assert_eq!(node["reason"]["type"], "Constraints", "{report:#}");
    assert!(
        report["explanation"]["summary"]
            .as_str()
            .unwrap()
            .contains("nvlinkDomain"),
        "{report:#}"
    );
}

#[test]
fn two_mig_devices_share_their_parent() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(DGX_A100).as_os_str(),
        "--claim".as_ref(),
        example("mig-pair-same-gpu.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    let results = results(&report);
    assert_eq!(results.len(), 2);
    let requests: Vec<&str> = results
        .iter()
        .map(|r| r["request"].as_str().unwrap())
        .collect();
    assert_eq!(requests, ["mig-a", "mig-b"]);
    for r in results {
        assert_eq!(r["attributes"]["profile"], "1g.10gb");
        assert_eq!(r["attributes"]["type"], "mig");
    }
    assert_eq!(
        results[0]["attributes"]["parentUUID"],
        results[1]["attributes"]["parentUUID"]
    );
}

#[test]
fn first_available_falls_back_to_the_second_alternative() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(DGX_A100).as_os_str(),
        "--claim".as_ref(),
        example("large-memory.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    let r = &results(&report)[0];
    assert_eq!(r["request"], "gpu/any", "A100s are not Hopper: {report:#}");
    assert_eq!(r["attributes"]["type"], "gpu");
    assert_eq!(r["capacity"]["memory"], "85899345920");
}

#[test]
fn nvidias_shared_gpus_template_gets_two_gpus() {
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("shared-gpus.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    let requests: Vec<&str> = results(&report)
        .iter()
        .map(|r| r["request"].as_str().unwrap())
        .collect();
    assert_eq!(requests, ["ts-gpu", "mps-gpu"]);
}

#[test]
fn a_node_without_devices_cannot_take_the_claim() {
    let run = simulate(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--claim".as_ref(),
        example("gpu.yaml").as_os_str(),
        "--node".as_ref(),
        "node-z".as_ref(),
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("node-z"), "{}", run.stdout);
}

#[test]
fn all_nodes_reports_every_fitting_node() {
    // Two nodes: the captured one and a renamed copy.
    let dir = tempfile::tempdir().unwrap();
    let mut items = list_items(&data(PCIE));
    let mut copy = items.clone();
    for slice in &mut copy {
        slice["metadata"]["name"] = json!("node-b-slice");
        slice["spec"]["nodeName"] = json!("node-b");
        slice["spec"]["pool"]["name"] = json!("node-b");
    }
    items.extend(copy);
    let file = dir.path().join("two-nodes.yaml");
    std::fs::write(
        &file,
        yaml_serde::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
            .unwrap(),
    )
    .unwrap();
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        file.as_os_str(),
        "--claim".as_ref(),
        example("gpu.yaml").as_os_str(),
        "--all-nodes".as_ref(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    let nodes: Vec<&str> = report["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["node-a", "node-b"]);
}

#[test]
fn malformed_slices_exit_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let claim = example("gpu.yaml");

    let broken_yaml = dir.path().join("broken.yaml");
    std::fs::write(
        &broken_yaml,
        "apiVersion: v1\nkind: List\nitems:\n- {kind: ResourceSlice\n",
    )
    .unwrap();
    let run = simulate(&[
        "--slices".as_ref(),
        broken_yaml.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!("{}:", broken_yaml.display()))
            && run.stderr.contains("invalid YAML"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());

    // A field of the wrong type: the file line and the field are named.
    let text = std::fs::read_to_string(data(PCIE)).unwrap().replacen(
        "generation: 0",
        "generation: zero",
        1,
    );
    let bad_field = dir.path().join("bad-field.yaml");
    std::fs::write(&bad_field, &text).unwrap();
    let line = text
        .lines()
        .position(|l| l.contains("generation: zero"))
        .unwrap()
        + 1;
    let run = simulate(&[
        "--slices".as_ref(),
        bad_field.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "{}:{line} (document 1, items[0]): ResourceSlice `node-a-gpu.nvidia.com-0`: spec.pool.generation: ",
            bad_field.display()
        )),
        "{}",
        run.stderr
    );

    // No slices at all.
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "apiVersion: v1\nkind: List\nitems: []\n").unwrap();
    let run = simulate(&[
        "--slices".as_ref(),
        empty.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("no ResourceSlice objects"),
        "{}",
        run.stderr
    );

    // Missing file.
    let run = simulate(&[
        "--slices".as_ref(),
        dir.path().join("nope.yaml").as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("nope.yaml"), "{}", run.stderr);
}

#[test]
fn bad_claim_files_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let slices = data(PCIE);

    let two = dir.path().join("two.yaml");
    let text = std::fs::read_to_string(example("gpu.yaml")).unwrap();
    std::fs::write(&two, format!("{text}---\n{text}")).unwrap();
    let run = simulate(&[
        "--slices".as_ref(),
        slices.as_os_str(),
        "--claim".as_ref(),
        two.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("2 claims"), "{}", run.stderr);

    let none = repo().join("deviceclasses/gpu.nvidia.com.yaml");
    let run = simulate(&[
        "--slices".as_ref(),
        slices.as_os_str(),
        "--claim".as_ref(),
        none.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no ResourceClaim"), "{}", run.stderr);

    let unknown = dir.path().join("unknown-class.yaml");
    std::fs::write(
        &unknown,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: no-such-class}\n",
    )
    .unwrap();
    let run = simulate(&[
        "--slices".as_ref(),
        slices.as_os_str(),
        "--claim".as_ref(),
        unknown.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("no-such-class")
            && run
                .stderr
                .contains("known classes: 1g.10gb.mig.nvidia.com, gpu.nvidia.com"),
        "{}",
        run.stderr
    );

    let bad_count = dir.path().join("bad-count.yaml");
    std::fs::write(
        &bad_count,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly:\n        deviceClassName: gpu.nvidia.com\n        count: many\n",
    )
    .unwrap();
    let run = simulate(&[
        "--slices".as_ref(),
        slices.as_os_str(),
        "--claim".as_ref(),
        bad_count.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains(&format!("{}:10 ", bad_count.display()))
            && run
                .stderr
                .contains("spec.devices.requests[0].exactly.count"),
        "{}",
        run.stderr
    );

    // Neither --slices nor --kubeconfig.
    let run = simulate(&["--claim".as_ref(), example("gpu.yaml").as_os_str()]);
    assert_eq!(run.code, 2);
}

#[test]
fn classes_from_files_replace_the_built_in_ones() {
    // A stricter gpu.nvidia.com that only takes GPUs on NUMA node 1.
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("class.yaml");
    std::fs::write(
        &class,
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.nvidia.com}\nspec:\n  selectors:\n  - cel: {expression: \"device.attributes['resource.kubernetes.io'].numaNode == 1\"}\n",
    )
    .unwrap();
    let (code, report) = simulate_json(&[
        "--slices".as_ref(),
        data(PCIE).as_os_str(),
        "--classes".as_ref(),
        class.as_os_str(),
        "--claim".as_ref(),
        example("gpu.yaml").as_os_str(),
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(devices(&report), ["gpu-2"]);
}

/// The golden pool of `profile` as a `kubectl get -o yaml` List, without
/// the server's metadata.
fn golden_pool(profile: &str) -> Value {
    let snap = std::fs::read_to_string(repo().join(format!(
        "driver/tests/snapshots/pool_golden__{profile}.snap"
    )))
    .unwrap();
    let body = snap.splitn(3, "---\n").nth(2).expect("snapshot header");
    let mut golden: Vec<Value> = serde_json::from_str(body).unwrap();
    for slice in &mut golden {
        let meta = slice["metadata"].as_object_mut().unwrap();
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "ownerReferences",
        ] {
            meta.remove(key);
        }
    }
    json!({"apiVersion": "v1", "kind": "List", "items": golden})
}

/// The sample slices are the golden pools the real plugin publishes,
/// without the server's metadata: they must not drift apart. Run with
/// `UPDATE_SAMPLES=1` to rewrite them from the snapshots.
#[test]
fn sample_slices_agree_with_the_golden_snapshots() {
    for profile in ["pcie-a100-bridged", "dgx-a100", "dgx-h100", "gb200-nvl"] {
        let golden = golden_pool(profile);
        let path = data(&format!("slices/{profile}.yaml"));
        if std::env::var_os("UPDATE_SAMPLES").is_some() {
            let header = format!(
                "# The ResourceSlices the kubelet plugin publishes for node-a on the fake NVML\n\
                 # machine profile `{profile}` (hack/mock-nvml/profiles/{profile}.yaml), as\n\
                 # `kubectl get resourceslices -o yaml` lists them: the reviewed golden snapshot\n\
                 # driver/tests/snapshots/pool_golden__{profile}.snap without the server-assigned\n\
                 # metadata. Regenerate: UPDATE_SAMPLES=1 cargo test -p gpu-dra --test simulate\n"
            );
            let text = header + &yaml_serde::to_string(&golden).unwrap();
            std::fs::write(&path, text).unwrap();
        }
        let sample: Value = yaml_serde::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            sample == golden,
            "{} differs from the golden snapshot; regenerate with UPDATE_SAMPLES=1 cargo test -p gpu-dra --test simulate",
            path.display()
        );
    }
}

#[test]
fn an_unusable_kubeconfig_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let claim = example("gpu.yaml");
    let run = simulate(&[
        "--kubeconfig".as_ref(),
        dir.path().join("missing").as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("kubeconfig"), "{}", run.stderr);

    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "clusters: 7\n").unwrap();
    let run = simulate(&[
        "--kubeconfig".as_ref(),
        garbage.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("kubeconfig"), "{}", run.stderr);

    // A server that is not there: a port that was just free.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = dir.path().join("dead");
    std::fs::write(&dead, kubeconfig_yaml(&format!("http://127.0.0.1:{port}"))).unwrap();
    let run = simulate(&[
        "--kubeconfig".as_ref(),
        dead.as_os_str(),
        "--claim".as_ref(),
        claim.as_os_str(),
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("resourceslices"), "{}", run.stderr);
}

/// A kubeconfig (YAML) for a server at `url`, with namespace `default`.
fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: test-apiserver\n  cluster:\n    server: {url}\n\
         contexts:\n\
         - name: test-apiserver\n  context:\n    cluster: test-apiserver\n    user: test-user\n    namespace: default\n\
         current-context: test-apiserver\n\
         users:\n\
         - name: test-user\n  user: {{}}\n"
    )
}
