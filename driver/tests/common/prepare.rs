//! Claim-preparation helpers shared by the `prepare_*` tests: a node (a fake
//! machine, the plugin process on it, a kubelet simulator registered with
//! it, a kube client of the test API server) that can be restarted on the
//! same machine, claims allocated in the API server, and views of what a
//! prepare leaves on the node (CDI specs, checkpoint entries, MPS daemons,
//! MIG instances in the fake NVML's state and capability files).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_driver_root::sysfs::{FakeSysfs, Kernel, create_vfio_nodes};
use gpu_dra_sim::kubelet::{Claim, DraVersion, KubeletSim, PrepareResult};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{DRIVER, NODE, Plugin, TestEnv, short_dir};

/// The plugin's environment for debug lines of the GPU locks (which claim
/// waits for which GPU, and when it holds its locks).
pub const LOCK_LOGS: (&str, &str) = ("RUST_LOG", "info,gpu_kubelet_plugin::prepare::locks=debug");

/// The CDI kind of the plugin's claim specs.
pub const VENDOR_KIND: &str = "k8s.gpu.nvidia.com/claim";

/// A node: environment, plugin process, registered kubelet connection.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub env: Arc<TestEnv>,
    pub plugin: Plugin,
    pub kubelet: gpu_dra_sim::kubelet::Plugin,
    pub client: kube::Client,
    version: DraVersion,
    extra: Vec<String>,
    /// Logs of the plugin runs so far, the current one last.
    logs: Vec<PathBuf>,
}

/// A node on bundled machine `profile`, the plugin started with `extra`
/// flags, registered in `version`.
pub async fn node(profile: &str, extra: &[&str], version: DraVersion) -> Node {
    node_with(profile, extra, version, &[]).await
}

/// Like [`node`], the plugin started with environment variables `envs`.
pub async fn node_with(
    profile: &str,
    extra: &[&str],
    version: DraVersion,
    envs: &[(&str, &str)],
) -> Node {
    let dir = short_dir();
    let env = TestEnv::builder(dir.path()).bundled(profile).build();
    start_node(dir, env, extra, version, envs).await
}

/// Like [`node`], the fake NVML following the control file it returns
/// (`common::inject` appends to it), which holds `initial` before the
/// plugin starts (so those commands are in force at its first NVML call).
pub async fn node_with_control(
    profile: &str,
    extra: &[&str],
    version: DraVersion,
    initial: &str,
) -> (Node, PathBuf) {
    let dir = short_dir();
    let control = dir.path().join("control");
    std::fs::write(&control, initial).expect("write the control file");
    let env = TestEnv::builder(dir.path())
        .bundled(profile)
        .control(&control)
        .build();
    (start_node(dir, env, extra, version, &[]).await, control)
}

/// A node on the machine of profile text `yaml` (a shipped profile with a
/// failure injected, say), the plugin started with `extra` flags.
pub async fn node_yaml(yaml: &str, extra: &[&str], version: DraVersion) -> Node {
    let dir = short_dir();
    let env = TestEnv::builder(dir.path()).yaml(yaml).build();
    start_node(dir, env, extra, version, &[]).await
}

/// A node on the machine `env` (laid out in `dir`), the plugin started
/// with `extra` flags and `envs`, registered in `version`.
async fn start_node(
    dir: tempfile::TempDir,
    env: TestEnv,
    extra: &[&str],
    version: DraVersion,
    envs: &[(&str, &str)],
) -> Node {
    let env = Arc::new(env);
    let plugin = Plugin::launch_with(&env, dir.path(), "run", extra, envs);
    let kubelet = register(&plugin, version).await;
    let config = kube::Config::new(env.api.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    Node {
        logs: vec![plugin.log.clone()],
        dir,
        env,
        plugin,
        kubelet,
        client,
        version,
        extra: extra.iter().map(|s| (*s).to_owned()).collect(),
    }
}

async fn register(plugin: &Plugin, version: DraVersion) -> gpu_dra_sim::kubelet::Plugin {
    let kubelet = KubeletSim::new()
        .with_dra_versions([version])
        .register(&plugin.reg_socket())
        .await
        .unwrap_or_else(|e| panic!("registration failed: {e}\n{}", plugin.stderr()));
    assert_eq!(kubelet.dra_version, version);
    kubelet
}

/// Creates claim `name` in namespace `default` through `client`, with one
/// request (class `gpu.nvidia.com`) per request name in `results`, and
/// allocates it with `results` and `config`; returns the kubelet's
/// reference to it.
pub async fn allocated_claim(
    client: &kube::Client,
    name: &str,
    results: Value,
    config: Value,
) -> Claim {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let requests: Vec<Value> = {
        let mut names: Vec<String> = results
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let n = r["request"].as_str().unwrap();
                n.split('/').next().unwrap().to_owned()
            })
            .collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|n| json!({"name": n, "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
            .collect()
    };
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": requests}},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    let status =
        json!({"status": {"allocation": {"devices": {"results": results, "config": config}}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    Claim::new("default", name, created.metadata.uid.unwrap())
}

/// The stand-in sysfs and kernel of a node, and its VFIO nodes.
pub struct Vfio {
    pub sysfs: FakeSysfs,
    _kernel: Kernel,
}

impl Vfio {
    /// The IOMMU group of the GPU at `bus`.
    pub fn iommu_group(&self, bus: &str) -> u32 {
        self.sysfs
            .gpus()
            .iter()
            .find(|g| g.bus == bus)
            .unwrap_or_else(|| panic!("no GPU at {bus}"))
            .iommu_group
    }
}

/// Adopts `n`'s sysfs as the stand-in one, creates the VFIO nodes of its
/// GPUs' IOMMU groups (the cdevs too with `iommufd`) and starts the
/// stand-in kernel, which rebinds GPUs as the plugin writes sysfs (until
/// the returned [`Vfio`] is dropped).
pub fn vfio_of(n: &Node, iommufd: bool) -> Vfio {
    let sysfs = FakeSysfs::adopt(&n.env.sysfs).expect("adopt the machine's sysfs");
    let groups: Vec<u32> = sysfs.gpus().iter().map(|g| g.iommu_group).collect();
    create_vfio_nodes(&n.env.dev_root, &groups, iommufd).expect("VFIO nodes");
    let kernel = sysfs.start_kernel().expect("start the stand-in kernel");
    Vfio {
        sysfs,
        _kernel: kernel,
    }
}

/// The PCI bus id a published device names.
pub fn bus_of(device: &Value) -> String {
    device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An allocation result of our driver on this node.
pub fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device})
}

/// A claim config with a `GpuConfig` of `sharing`.
pub fn gpu_config(sharing: Value) -> Value {
    json!({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}})
}

/// A claim config with a `GpuConfig` of `sharing`, for `requests`.
pub fn gpu_config_for(requests: &[&str], sharing: Value) -> Value {
    let mut config = gpu_config(sharing);
    config["requests"] = json!(requests);
    config
}

/// A claim config with a `MigDeviceConfig` of `sharing`, for `requests`.
pub fn mig_config(requests: &[&str], sharing: Value) -> Value {
    json!({"source": "FromClaim", "requests": requests, "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": sharing}}})
}

/// A claim `name` for `gpu-2`, time-sliced at the `Long` interval.
pub async fn long_time_slices(n: &Node, name: &str) -> Claim {
    n.claim(
        name,
        json!([result("gpu", "gpu-2")]),
        json!([gpu_config(
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
        )]),
    )
    .await
}

/// A result for a memory share `id` of `device` consuming `memory`.
pub fn share(request: &str, device: &str, id: &str, memory: &str) -> serde_json::Value {
    let mut r = result(request, device);
    r["shareID"] = json!(id);
    r["consumedCapacity"] = json!({"memory": memory});
    r
}

/// The share id of share `letter`.
pub fn share_id(letter: char) -> String {
    format!("11111111-0000-4000-8000-00000000000{letter}")
}

/// A claim `share-<letter>` for a memory share of `gpu-3` consuming
/// `memory`.
pub async fn shared_claim(n: &Node, letter: char, memory: &str) -> Claim {
    let name = format!("share-{letter}");
    let result = share(&name, "gpu-3", &share_id(letter), memory);
    n.claim(&name, json!([result]), json!([])).await
}

/// The `env` of a CDI device's container edits.
pub fn env_of(device: &Value) -> Vec<String> {
    device["containerEdits"]["env"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

impl Node {
    /// The stderr of every plugin run on this node so far, each under a
    /// header, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for log in &self.logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let _ = write!(out, "===== {} =====\n{text}", log.display());
        }
        out
    }

    /// Where the current run's log ends now: lines after this mark are
    /// what the plugin logged since.
    pub fn log_mark(&self) -> usize {
        self.plugin.stderr().len()
    }

    /// The current run's log lines after `mark` that contain every one of
    /// `needles`.
    pub fn lines_after(&self, mark: usize, needles: &[&str]) -> Vec<String> {
        let log = self.plugin.stderr();
        log.get(mark..)
            .unwrap_or_default()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_owned)
            .collect()
    }

    /// Polls (up to 20 s) until the current run has logged, after `mark`, a
    /// line containing every one of `needles`.
    pub async fn wait_line(&self, mark: usize, needles: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.lines_after(mark, needles).is_empty() {
            assert!(
                Instant::now() < deadline,
                "no line with {needles:?} logged\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the plugin (SIGKILL if it still runs) and starts a new one on
    /// the same machine, plugin directories and state (checkpoint, fake NVML
    /// state, MPS daemons), with environment variables `envs`; registers the
    /// kubelet with it again.
    pub async fn restart(&mut self, envs: &[(&str, &str)]) {
        self.stop();
        let name = format!("run-{}", self.logs.len());
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.plugin = Plugin::launch_with(&self.env, self.dir.path(), &name, &extra, envs);
        self.logs.push(self.plugin.log.clone());
        self.kubelet = register(&self.plugin, self.version).await;
    }

    /// Stops the plugin (SIGKILL if it still runs), leaving everything it
    /// made in place; [`Self::restart`] starts it again.
    pub fn stop(&mut self) {
        let _ = self.plugin.child.kill();
        let _ = self.plugin.child.wait();
    }

    /// Makes the fake driver root's programs behave as `behaviour` says.
    pub fn fake_behaves(&self, behaviour: fake_driver_root::Behaviour) {
        self.env.driver_root.set_behaviour(&behaviour).unwrap();
    }

    /// [`Self::restart`] with the plugin's flags replaced by `extra`.
    pub async fn restart_with_flags(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        self.restart(&[]).await;
    }

    /// Registers the kubelet again with the plugin's new sockets (after the
    /// plugin process was restarted by its supervisor).
    pub async fn reregister(&mut self) {
        self.kubelet = register(&self.plugin, self.version).await;
    }

    /// The first published device whose name starts with `prefix`.
    pub async fn device_starting_with(&self, prefix: &str) -> String {
        let names = self.device_names().await;
        names
            .iter()
            .find(|d| d.starts_with(prefix))
            .unwrap_or_else(|| panic!("no device {prefix}* in {names:?}"))
            .clone()
    }

    /// Waits for the published pool and returns its device names.
    pub async fn device_names(&self) -> Vec<String> {
        let slices = self.env.wait_pool(NODE, Duration::from_secs(20)).await;
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Waits for the published pool and returns its device `name`.
    pub async fn published_device(&self, name: &str) -> Value {
        let slices = self.env.wait_pool(NODE, Duration::from_secs(20)).await;
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} not published"))
    }

    /// A claim for the whole GPU `device`, without configs.
    pub async fn gpu_claim(&self, name: &str, device: &str) -> Claim {
        self.claim(name, json!([result("gpu", device)]), json!([]))
            .await
    }

    /// A claim for the VFIO device `device` (request `vm`), without configs.
    pub async fn vfio_claim(&self, name: &str, device: &str) -> Claim {
        self.claim(name, json!([result("vm", device)]), json!([]))
            .await
    }

    /// Waits for the published pool and returns the PCI bus id of its
    /// device `name`.
    pub async fn published_bus(&self, name: &str) -> String {
        bus_of(&self.published_device(name).await)
    }

    /// A claim for `gpu-0` shared by MPS, default active thread percentage 25.
    pub async fn mps_claim(&self, name: &str) -> Claim {
        self.claim(
            name,
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 25}}))]),
        )
        .await
    }

    /// Creates claim `name` allocated with `results` and `config`; returns
    /// the kubelet's reference to it ([`allocated_claim`]).
    pub async fn claim(&self, name: &str, results: Value, config: Value) -> Claim {
        allocated_claim(&self.client, name, results, config).await
    }

    pub async fn prepare(&self, claims: &[Claim]) -> BTreeMap<String, PrepareResult> {
        self.kubelet
            .prepare(claims)
            .await
            .unwrap_or_else(|e| panic!("prepare call failed: {e}\n{}", self.logs()))
    }

    pub async fn prepare_ok(&self, claim: &Claim) -> PrepareResult {
        let mut r = self.prepare(std::slice::from_ref(claim)).await;
        let r = r.remove(&claim.uid).unwrap();
        assert!(r.error.is_none(), "{:?}\n{}", r.error, self.logs());
        r
    }

    /// Prepares `claim` alone and returns the error the plugin answered
    /// for it; panics (with the plugin's log) when it was prepared.
    pub async fn prepare_error(&self, claim: &Claim) -> String {
        let mut r = self.prepare(std::slice::from_ref(claim)).await;
        let r = r.remove(&claim.uid).unwrap();
        r.error
            .unwrap_or_else(|| panic!("{} was prepared\n{}", claim.name, self.logs()))
    }

    pub async fn unprepare_ok(&self, claim: &Claim) {
        let r = self
            .kubelet
            .unprepare(std::slice::from_ref(claim))
            .await
            .unwrap_or_else(|e| panic!("unprepare call failed: {e}\n{}", self.logs()));
        assert_eq!(r[&claim.uid].error, None, "{}", self.logs());
    }

    pub fn spec_path(&self, claim: &Claim) -> PathBuf {
        self.env
            .cdi_root
            .join(format!("k8s.gpu.nvidia.com-claim_{}.json", claim.uid))
    }

    pub fn spec(&self, claim: &Claim) -> Value {
        let text = std::fs::read_to_string(self.spec_path(claim)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The CDI device named `<uid>-<device>` in the claim's spec.
    pub fn spec_device(&self, claim: &Claim, device: &str) -> Value {
        let spec = self.spec(claim);
        let name = format!("{}-{device}", claim.uid);
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in {spec}"))
    }

    /// Every file in the CDI directory (specs and temp files).
    pub fn cdi_files(&self) -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(&self.env.cdi_root)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    }

    /// The claim's `status.devices` once it holds `n` entries: the plugin
    /// writes it in the background after answering, so a read right after
    /// the answer can come first. Gives up after 10 s with what is there.
    pub async fn status_devices_eventually(&self, claim: &Claim, n: usize) -> Vec<Value> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let got = self.status_devices(claim).await;
            if got.len() == n || std::time::Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub async fn status_devices(&self, claim: &Claim) -> Vec<Value> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        let c = api.get(&claim.name).await.unwrap();
        let v = serde_json::to_value(c).unwrap();
        v.pointer("/status/devices")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    /// Removes every entry of the claim's `status.devices` (as if the
    /// plugin died between its answer and its write).
    pub async fn remove_status_devices(&self, claim: &Claim) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        let mut object = api.get(&claim.name).await.unwrap();
        object.status.as_mut().unwrap().devices = None;
        api.replace_status(&claim.name, &PostParams::default(), &object)
            .await
            .unwrap();
        assert!(self.status_devices(claim).await.is_empty());
    }

    /// The plugin's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.plugin.plugins_dir.join(DRIVER)
    }

    /// The checkpoint file (`Null` when none was written yet).
    pub fn checkpoint(&self) -> Value {
        let path = self.state_dir().join("checkpoint.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    /// Opens the checkpoint of the stopped plugin through the plugin's own
    /// store, for `edit` to seed or change entries with valid checksums.
    pub fn edit_checkpoint(
        &self,
        edit: impl FnOnce(&gpu_kubelet_plugin::prepare::checkpoint::Store),
    ) {
        let boot_id = std::path::Path::new(gpu_kubelet_plugin::prepare::BOOT_ID);
        let (store, _) =
            gpu_kubelet_plugin::prepare::checkpoint::Store::open(&self.state_dir(), boot_id)
                .unwrap();
        edit(&store);
    }

    /// Changes `claim`'s entry in the checkpoint file behind its checksum
    /// (its `name`), so the next start quarantines it. For a stopped plugin.
    pub fn tamper_entry(&self, claim: &Claim) {
        let mut checkpoint = self.checkpoint();
        checkpoint["entries"][&claim.uid]["entry"]["name"] = json!("tampered");
        let path = self.state_dir().join("checkpoint.json");
        std::fs::write(&path, serde_json::to_vec(&checkpoint).unwrap()).unwrap();
    }

    /// Loses `claim`'s checkpoint entry: the plugin stopped, the entry
    /// changed behind its checksum, the plugin started again (same flags).
    pub async fn lose_entry(&mut self, claim: &Claim) {
        self.stop();
        self.tamper_entry(claim);
        self.restart(&[]).await;
    }

    /// The ledger of lost checkpoint entries.
    pub fn ledger_path(&self) -> PathBuf {
        self.state_dir()
            .join(gpu_kubelet_plugin::prepare::checkpoint::LOST_FILE_NAME)
    }

    /// The ledger's content (`Null` when there is no ledger file).
    pub fn ledger(&self) -> Value {
        match std::fs::read(self.ledger_path()) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => panic!("{}: {e}", self.ledger_path().display()),
        }
    }

    /// Writes `ledger` as the ledger's file (a hand edit).
    pub fn write_ledger(&self, ledger: &Value) {
        std::fs::write(self.ledger_path(), serde_json::to_vec(ledger).unwrap()).unwrap();
    }

    /// UIDs of the claims in the checkpoint.
    pub fn checkpoint_claims(&self) -> Vec<String> {
        let c = self.checkpoint();
        c["entries"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// MPS daemons with directories in the state dir.
    pub fn mps_daemons(&self) -> usize {
        let dir = self.state_dir().join("mps");
        std::fs::read_dir(dir).map_or(0, |d| {
            d.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
                .count()
        })
    }

    /// Live processes started from the fake driver root (daemons,
    /// clients), the plugin excluded, right now.
    pub fn live_processes(&self) -> Vec<u32> {
        let me = self.plugin.child.id();
        self.env
            .driver_root
            .processes()
            .into_iter()
            .filter(|p| *p != me)
            .collect()
    }

    /// Kills every process started from the fake driver root (SIGKILL, as
    /// a daemon crash) and asserts that the plugin's MPS check, within
    /// 10 s, says so and starts the daemon again (settings applied: the
    /// plugin logs the start after them), and that a new process runs.
    pub fn kill_daemons_and_see_them_started_again(&self) {
        const STARTED: &str = "started MPS control daemon";
        let starts = || self.logs().matches(STARTED).count();
        let before = starts();
        let killed = self.live_processes();
        assert!(!killed.is_empty(), "no daemon to kill\n{}", self.logs());
        for pid in &killed {
            fake_driver_root::kill(*pid);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while starts() == before {
            assert!(
                Instant::now() < deadline,
                "not started again\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let logs = self.logs();
        assert!(
            logs.contains("MPS control daemon is gone; restarting it"),
            "{logs}"
        );
        let now = self.live_processes();
        assert!(
            now.iter().any(|p| !killed.contains(p)),
            "no new process: {now:?}\n{logs}"
        );
    }

    /// Processes started from the fake driver root (daemons, clients), the
    /// plugin excluded; a daemon told to quit may take a moment to be
    /// reaped, so a count of 0 is waited for (up to 5 s).
    pub fn processes(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = self.live_processes();
            if left.is_empty() || Instant::now() > deadline {
                for pid in &left {
                    eprintln!("left: {pid} {:?}", fake_driver_root::cmdline(*pid));
                }
                return left.len();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The fake NVML's state file (`Null` before the first change).
    pub fn nvml_state(&self) -> Value {
        let path = self.env.root.join("nvml-state.json");
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    /// MIG GPU instances in the fake NVML's state: `(GPU UUID, GI id)`.
    pub fn mig_instances(&self) -> Vec<(String, u64)> {
        let state = self.nvml_state();
        let mut out = Vec::new();
        for gpu in state["gpus"].as_array().into_iter().flatten() {
            for gi in gpu["gpuInstances"].as_array().into_iter().flatten() {
                out.push((
                    gpu["uuid"].as_str().unwrap_or_default().to_owned(),
                    gi["id"].as_u64().unwrap_or_default(),
                ));
            }
        }
        out
    }

    /// UUIDs of the GPUs whose compute mode is `ExclusiveProcess` (as MPS
    /// sets it), sorted.
    pub fn exclusive_gpus(&self) -> Vec<String> {
        self.compute_modes()
            .into_iter()
            .filter(|(_, m)| m == "ExclusiveProcess")
            .map(|(uuid, _)| uuid)
            .collect()
    }

    /// Compute modes of the GPUs the fake NVML has state for, by UUID.
    pub fn compute_modes(&self) -> BTreeMap<String, String> {
        let state = self.nvml_state();
        state["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                (
                    g["uuid"].as_str().unwrap_or_default().to_owned(),
                    g["computeMode"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// MIG capability entries (`gpu<N>/mig/gi<G>`, `.../ci<C>`) under the
    /// proc root, as the kernel shows them for existing instances.
    pub fn mig_caps(&self) -> Vec<String> {
        let root = self.env.proc_root.join("driver/nvidia/capabilities");
        let mut out = Vec::new();
        for gpu in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let mig = gpu.path().join("mig");
            for gi in std::fs::read_dir(&mig).into_iter().flatten().flatten() {
                let name = gi.file_name().to_string_lossy().into_owned();
                if !name.starts_with("gi") {
                    continue;
                }
                out.push(format!("{}/{name}", gpu.file_name().to_string_lossy()));
                for ci in std::fs::read_dir(gi.path()).into_iter().flatten().flatten() {
                    let c = ci.file_name().to_string_lossy().into_owned();
                    if c.starts_with("ci") {
                        out.push(format!("{}/{name}/{c}", gpu.file_name().to_string_lossy()));
                    }
                }
            }
        }
        out.sort();
        out
    }
}
