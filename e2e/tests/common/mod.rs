//! The real plugin on a fake machine, publishing to a test API server, for
//! the tests that hand its slices to the project's allocator: the fake
//! machine's files, the plugin started in-process from its command line,
//! and the shipped device classes. [`cli`]: for the tests that run the
//! `gpu-dra` binary.

#![allow(dead_code)]

pub mod cli;

use std::path::Path;
use std::time::Duration;

use clap::Parser as _;
use gpu_dra_sim::apiserver::{Resource, ServerOptions, TestApiServer, ValidationRules};
use gpu_dra_sim::pool;
use gpu_kubelet_plugin::flags::Flags;
use gpu_kubelet_plugin::plugin::{Plugin, PluginHandle, Services, kube_client};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::{Value, json};

/// How long the pool may take to be published.
pub const WAIT: Duration = Duration::from_secs(30);
/// The driver name the plugin publishes under.
pub const DRIVER: &str = "gpu.nvidia.com";
/// The node the plugin runs as.
pub const NODE: &str = "node-a";

/// The shipped class `name` whose selector takes the devices of `type_`
/// (`gpu`, `mig`) (deviceclasses/).
fn class(name: &str, type_: &str) -> DeviceClass {
    let expression = format!(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{type_}'"
    );
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]}
    }))
    .unwrap()
}

/// The shipped `gpu.nvidia.com` class.
pub fn gpu_class() -> DeviceClass {
    class("gpu.nvidia.com", "gpu")
}

/// The shipped `mig.nvidia.com` class.
pub fn mig_class() -> DeviceClass {
    class("mig.nvidia.com", "mig")
}

/// A running plugin on its fake machine, with its API server; all stopped
/// and removed on drop.
pub struct Node {
    _plugin: PluginHandle,
    _server: TestApiServer,
    _processes: fake_driver_root::ProcessGuard,
    /// The machine's files and the plugin's directories.
    pub dir: tempfile::TempDir,
}

/// The fake `profile` machine in `root` (fake NVML with its state and MIG
/// files, sysfs tree, device nodes, NVIDIA proc tree, driver root) and the
/// flags that point the plugin at it and at `kubeconfig`.
fn machine(
    root: &Path,
    kubeconfig: &Path,
    profile: &str,
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

/// Starts the plugin on the bundled machine `profile` with `flags` and
/// returns the stored slices of its (complete) pool.
pub async fn published_on(profile: &str, flags: &[&str]) -> (Node, Vec<ResourceSlice>) {
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
    let (mut argv, processes) = machine(dir.path(), &kubeconfig, profile);
    argv.extend(flags.iter().map(|f| (*f).to_owned()));
    let flags = Flags::try_parse_from(&argv).expect("plugin flags");
    let client = kube_client(Some(&kubeconfig)).await.unwrap();
    let (phase, _) = gpu_kubelet_plugin::phase::channel();
    let plugin = Plugin::start(&flags, client, Services::default(), phase)
        .await
        .expect("the plugin starts");
    let pool: Vec<Value> = server
        .store()
        .wait_for(Resource::ResourceSlices, WAIT, |items| {
            // Complete, and no slice of an older generation left.
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
        dir,
    };
    (node, slices)
}
