//! NVLink topology from publication to allocation: the real plugin
//! (started in-process from its command line) publishes the pool of a fake
//! NVSwitch machine, whose every NVLink reports NVML's switch sentinel as
//! its far end, to the test API server, and the project's allocator (the
//! scheduler's rules) allocates claims constrained by
//! `matchAttribute: gpu.nvidia.com/nvlinkDomain` on the slices as stored:
//! all 8 GPUs of an HGX H100 (joined through the switches by P2P status),
//! all 4 of a GB200 tray (joined by their fabric clique), and on a server
//! of bridged pairs only pairs.
//!
//! Here and not among the plugin's tests: the plugin does not depend on the
//! analysis crate (no CEL in its build).

use std::path::Path;
use std::time::Duration;

use clap::Parser as _;
use gpu_dra_analysis::allocator::{Allocator, Outcome, SimulateOptions, Snapshot};
use gpu_dra_sim::apiserver::{Resource, ServerOptions, TestApiServer, ValidationRules};
use gpu_dra_sim::pool;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::grpc;
use gpu_kubelet_plugin::plugin::{Plugin, PluginHandle, kube_client};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";

/// The shipped `gpu.nvidia.com` class's selector (deviceclasses/).
fn gpu_class() -> DeviceClass {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
    }))
    .unwrap()
}

/// A claim for `count` GPUs in one NVLink domain.
fn linked_gpus(count: u32) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("linked-{count}"), "namespace": "default", "uid": format!("uid-{count}")},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]
        }}
    }))
    .unwrap()
}

fn simulate(slices: &[ResourceSlice], claim: &ResourceClaim) -> Outcome {
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(slices, &classes, &[]);
    Allocator::new()
        .simulate(&snapshot, claim, &SimulateOptions::default())
        .expect("the allocator gives a verdict")
}

/// The devices of a satisfiable outcome, sorted.
fn allocated(outcome: &Outcome) -> Vec<String> {
    let Some(allocations) = outcome.allocations() else {
        panic!("not allocated: {outcome:#?}");
    };
    let mut devices: Vec<String> = allocations[0]
        .results
        .iter()
        .map(|r| r.device.clone())
        .collect();
    devices.sort();
    devices
}

/// A running plugin on its fake machine, with its API server; all stopped
/// and removed on drop.
struct Node {
    _plugin: PluginHandle,
    _server: TestApiServer,
    _processes: fake_driver_root::ProcessGuard,
    _dir: tempfile::TempDir,
}

/// The fake `profile` machine in `root` and the plugin flags for it.
fn machine(
    profile: &str,
    root: &Path,
    kubeconfig: &Path,
) -> (Vec<String>, fake_driver_root::ProcessGuard) {
    let profile = nvidia_ml::fixture::bundled_profile(profile);
    let machine = nvidia_ml::Profile::load(&profile).expect("the bundled profile loads");
    let minors: Vec<u32> = machine.gpus.iter().map(|g| g.minor).collect();
    let dev_root = root.join("devroot");
    fake_driver_root::create_dev_root(&dev_root, &minors).expect("create the dev root");
    let proc_root =
        fake_driver_root::create_proc_root(&root.join("proc")).expect("create the proc root");
    let driver_root =
        fake_driver_root::FakeDriverRoot::create(&root.join("driver")).expect("driver root");
    let options = nvidia_ml::fixture::InstallOptions {
        state: Some(root.join("nvml-state.json")),
        proc_root: Some(proc_root.clone()),
        dev_root: Some(dev_root.clone()),
        control: None,
    };
    let library = nvidia_ml::fixture::install_with(&root.join("nvml"), &profile, &options)
        .expect("install the fake NVML");
    let sysfs = root.join("sys");
    nvidia_ml::sysfs::write(&machine, &sysfs).expect("write the fake sysfs");
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let argv = vec![
        "gpu-kubelet-plugin".to_owned(),
        format!("--node-name={NODE}"),
        format!("--driver-name={DRIVER}"),
        format!("--kubelet-registrar-dir={}", path(&root.join("reg"))),
        format!("--kubelet-plugins-dir={}", path(&root.join("plugins"))),
        format!("--nvml-lib={}", path(&library)),
        format!("--sysfs-root={}", path(&sysfs)),
        format!("--kubeconfig={}", path(kubeconfig)),
        format!("--dev-root={}", path(&dev_root)),
        format!("--proc-root={}", path(&proc_root)),
        format!("--driver-root={}", path(driver_root.path())),
        format!("--cdi-root={}", path(&root.join("cdi"))),
    ];
    (argv, driver_root.guard())
}

/// Starts the plugin on `profile` and returns the stored slices of its
/// (complete) pool.
async fn published(profile: &str) -> (Node, Vec<ResourceSlice>) {
    // Short: the plugin's socket paths must stay under 108 bytes.
    let dir = tempfile::Builder::new()
        .prefix("p")
        .tempdir_in("/tmp")
        .unwrap();
    let server = TestApiServer::start(ServerOptions {
        rules: ValidationRules::V1_35,
        ..ServerOptions::default()
    })
    .await
    .expect("the test API server starts");
    server.store().create_node(NODE).expect("create the Node");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (argv, processes) = machine(profile, dir.path(), &kubeconfig);
    let flags = Flags::try_parse_from(&argv).expect("plugin flags");
    let client = kube_client(Some(&kubeconfig)).await.unwrap();
    let (phase, _) = gpu_kubelet_plugin::phase::channel();
    let plugin = Plugin::start(&flags, client, grpc::Services::default(), phase)
        .await
        .expect("the plugin starts");
    let pool: Vec<Value> = server
        .store()
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            pool::complete(pool::of(items, DRIVER, NODE)).is_some_and(|p| p.stale == 0)
        })
        .await
        .unwrap_or_else(|last| panic!("the pool never completed; last: {last:#?}"));
    let slices = pool::of(&pool, DRIVER, NODE)
        .map(|s| serde_json::from_value(s.clone()).expect("a ResourceSlice"))
        .collect();
    let node = Node {
        _plugin: plugin,
        _server: server,
        _processes: processes,
        _dir: dir,
    };
    (node, slices)
}

fn gpus(n: u32) -> Vec<String> {
    let mut names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
    names.sort();
    names
}

#[tokio::test]
async fn eight_nvlink_gpus_on_hgx_h100() {
    let (_node, slices) = published("dgx-h100").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(8))), gpus(8));
    // Nine do not exist: refused on the count, not on the constraint.
    assert!(!simulate(&slices, &linked_gpus(9)).is_satisfiable());
}

#[tokio::test]
async fn four_nvlink_gpus_on_a_gb200_tray() {
    let (_node, slices) = published("gb200-nvl").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(4))), gpus(4));
}

#[tokio::test]
async fn bridged_pairs_give_pairs_only() {
    let (_node, slices) = published("pcie-a100-bridged").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(2))).len(), 2);
    assert!(!simulate(&slices, &linked_gpus(3)).is_satisfiable());
}
