//! Claim preparation end to end: the real plugin binary on the fake NVML,
//! a fake driver root (recording `nvidia-smi` and a real daemonizing fake
//! MPS control daemon), stand-in device nodes, driven by the kubelet
//! simulator over its Unix sockets, with claims in the test API server read
//! through the real kube client. One test per kind of allocation, both
//! DRAPlugin versions, plus the per-claim errors.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{DRIVER, NODE, Plugin, TestEnv, short_dir};
use gpu_dra_e2e::kubelet::{Claim, DraVersion, KubeletSim, PrepareResult};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const VENDOR_KIND: &str = "k8s.gpu.nvidia.com/claim";

/// A node: environment, plugin process, registered kubelet connection.
struct Node {
    _dir: tempfile::TempDir,
    env: Arc<TestEnv>,
    plugin: Plugin,
    kubelet: gpu_dra_e2e::kubelet::Plugin,
    client: kube::Client,
}

async fn node(profile: &str, extra: &[&str], version: DraVersion) -> Node {
    let dir = short_dir();
    let env = Arc::new(TestEnv::builder(dir.path()).bundled(profile).build());
    let plugin = Plugin::launch(&env, dir.path(), "run", extra);
    let kubelet = KubeletSim::new()
        .with_dra_versions([version])
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    assert_eq!(kubelet.dra_version, version);
    let config = kube::Config::new(env.api.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    Node {
        _dir: dir,
        env,
        plugin,
        kubelet,
        client,
    }
}

fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device})
}

fn gpu_config(sharing: Value) -> Value {
    json!({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}})
}

impl Node {
    /// Creates claim `name` allocated with `results` and `config`; returns
    /// the kubelet's reference to it.
    async fn claim(&self, name: &str, results: Value, config: Value) -> Claim {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
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

    async fn prepare(&self, claims: &[Claim]) -> std::collections::BTreeMap<String, PrepareResult> {
        self.kubelet.prepare(claims).await.unwrap()
    }

    async fn prepare_ok(&self, claim: &Claim) -> PrepareResult {
        let mut r = self.prepare(std::slice::from_ref(claim)).await;
        let r = r.remove(&claim.uid).unwrap();
        assert!(r.error.is_none(), "{:?}\n{}", r.error, self.plugin.stderr());
        r
    }

    async fn unprepare_ok(&self, claim: &Claim) {
        let r = self
            .kubelet
            .unprepare(std::slice::from_ref(claim))
            .await
            .unwrap();
        assert_eq!(r[&claim.uid].error, None, "{}", self.plugin.stderr());
    }

    fn spec_path(&self, claim: &Claim) -> PathBuf {
        self.env
            .cdi_root
            .join(format!("k8s.gpu.nvidia.com-claim_{}.json", claim.uid))
    }

    fn spec(&self, claim: &Claim) -> Value {
        let text = std::fs::read_to_string(self.spec_path(claim)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The CDI device named `<uid>-<device>` in the claim's spec.
    fn spec_device(&self, claim: &Claim, device: &str) -> Value {
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

    async fn status_devices(&self, claim: &Claim) -> Vec<Value> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), "default");
        let c = api.get(&claim.name).await.unwrap();
        let v = serde_json::to_value(c).unwrap();
        v.pointer("/status/devices")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn checkpoint(&self) -> Value {
        let path = self.plugin.plugins_dir.join(DRIVER).join("checkpoint.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn checkpoint_claims(&self) -> Vec<String> {
        let c = self.checkpoint();
        c["entries"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// MPS daemons with directories in the state dir.
    fn mps_daemons(&self) -> usize {
        let dir = self.plugin.plugins_dir.join(DRIVER).join("mps");
        std::fs::read_dir(dir).map_or(0, |d| {
            d.filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
                .count()
        })
    }

    /// Processes started from the fake driver root (daemons, clients); a
    /// daemon told to quit may take a moment to be reaped, so a count of 0
    /// is waited for (up to 5 s).
    fn processes(&self) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let me = self.plugin.child.id();
            let n = self
                .env
                .driver_root
                .processes()
                .into_iter()
                .filter(|p| *p != me)
                .count();
            if n == 0 || std::time::Instant::now() > deadline {
                for pid in self
                    .env
                    .driver_root
                    .processes()
                    .into_iter()
                    .filter(|p| *p != me)
                {
                    eprintln!("left: {pid} {:?}", fake_driver_root::cmdline(pid));
                }
                return n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn env_of(device: &Value) -> Vec<String> {
    device["containerEdits"]["env"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

async fn whole_gpu(version: DraVersion) {
    let n = node("t4-inference", &[], version).await;
    let c = n
        .claim("whole", json!([result("gpu", "gpu-1")]), json!([]))
        .await;
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices.len(), 1);
    let d = &r.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-1")
    );
    assert_eq!(d.request_names, ["gpu"]);
    let id = format!("{VENDOR_KIND}={}-gpu-1", c.uid);
    assert_eq!(d.cdi_device_ids, [id]);

    // The spec: the GPU's node, the control nodes, the driver's files.
    let spec = n.spec(&c);
    assert_eq!(spec["kind"], VENDOR_KIND);
    let dev = n.spec_device(&c, "gpu-1");
    let nodes = dev["containerEdits"]["deviceNodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["path"], "/dev/nvidia1");
    let common = &spec["containerEdits"];
    let control: Vec<&str> = common["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        control,
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    let mounts: Vec<&str> = common["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(
        mounts.iter().any(|m| m.ends_with("/libcuda.so.1")),
        "{mounts:?}"
    );
    assert!(
        mounts.iter().any(|m| m.ends_with("/nvidia-smi")),
        "{mounts:?}"
    );
    let driver = n.env.driver_root.path().to_str().unwrap().to_owned();
    assert!(
        common["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["hostPath"].as_str().unwrap().starts_with(&driver)),
        "host paths come from the driver root"
    );
    // No configuration asked, none applied.
    assert!(n.env.driver_root.nvidia_smi_calls().unwrap().is_empty());

    // The claim's status shows what the pod got.
    let status = n.status_devices(&c).await;
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0]["device"], "gpu-1");
    assert_eq!(status[0]["conditions"][0]["type"], "Ready");
    assert!(
        status[0]["data"]["uuid"]
            .as_str()
            .unwrap()
            .starts_with("GPU-")
    );

    // Idempotent: the same answer again, from the checkpoint.
    let again = n.prepare_ok(&c).await;
    assert_eq!(again.devices, r.devices);
    assert_eq!(n.checkpoint_claims(), [c.uid.clone()]);

    n.unprepare_ok(&c).await;
    assert!(!n.spec_path(&c).exists());
    assert!(n.checkpoint_claims().is_empty());
    let left = n.status_devices(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", n.plugin.stderr());
    // Unprepare of what is not prepared succeeds.
    n.unprepare_ok(&c).await;
}

#[tokio::test]
async fn whole_gpu_v1() {
    whole_gpu(DraVersion::V1).await;
}

#[tokio::test]
async fn whole_gpu_v1beta1() {
    whole_gpu(DraVersion::V1beta1).await;
}

#[tokio::test]
async fn time_slicing_sets_and_resets_the_interval() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n
        .claim(
            "ts",
            json!([result("gpu", "gpu-2")]),
            json!([gpu_config(
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
            )]),
        )
        .await;
    n.prepare_ok(&c).await;
    let calls: Vec<Vec<String>> = n
        .env
        .driver_root
        .nvidia_smi_calls()
        .unwrap()
        .into_iter()
        .map(|c| c.args)
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].contains(&"--set-timeslice".to_owned()),
        "{calls:?}"
    );
    assert_eq!(calls[0].last().unwrap(), "3", "{calls:?}");
    n.unprepare_ok(&c).await;
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].args.last().unwrap(), "0", "reset to Default");
}

#[tokio::test]
async fn mps_claim_gets_a_daemon_with_its_limits_and_the_pipe() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n
        .claim(
            "mps",
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "10Gi"}}))]),
        )
        .await;
    n.prepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 1, "one control daemon");
    let commands: Vec<String> = n
        .env
        .driver_root
        .mps_commands()
        .unwrap()
        .into_iter()
        .map(|c| c.command)
        .collect();
    assert!(
        commands
            .iter()
            .any(|c| c == "set_default_active_thread_percentage 25"),
        "{commands:?}"
    );
    assert!(
        commands
            .iter()
            .any(|c| c.starts_with("set_default_device_pinned_mem_limit") && c.ends_with("10240M")),
        "{commands:?}"
    );
    let dev = n.spec_device(&c, "gpu-0");
    let env = env_of(&dev);
    assert!(
        env.iter()
            .any(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY=")),
        "{env:?}"
    );
    assert!(
        dev["containerEdits"]["mounts"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );
    let status = n.status_devices(&c).await;
    assert!(status[0]["data"]["mpsDaemon"].is_string(), "{status:?}");
    assert!(n.processes() > 0, "the daemon runs");
    n.unprepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 0, "daemon stopped");
    assert_eq!(n.processes(), 0, "no process left");
}

#[tokio::test]
async fn dynamic_mig_creates_and_destroys_the_instance() {
    let n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    // Wait for the pool so the device name is one the plugin publishes.
    let slices = n.env.wait_pool(NODE, Duration::from_secs(20)).await;
    let name = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .find(|d| d.starts_with("gpu-0-mig-1g10gb"))
        .expect("a 1g.10gb placement on GPU 0");
    let c = n
        .claim("mig", json!([result("mig", &name)]), json!([]))
        .await;
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices[0].device_name, name);
    let dev = n.spec_device(&c, &name);
    let nodes: Vec<String> = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(nodes[0], "/dev/nvidia0");
    assert!(
        nodes[1].starts_with("/dev/nvidia-caps/nvidia-cap"),
        "{nodes:?}"
    );
    let caps = n.env.proc_root.join("driver/nvidia/capabilities/gpu0/mig");
    assert!(caps.exists(), "the GPU instance's capability files exist");
    let status = n.status_devices(&c).await;
    assert!(
        status[0]["data"]["uuid"]
            .as_str()
            .unwrap()
            .starts_with("MIG-"),
        "{status:?}"
    );
    n.unprepare_ok(&c).await;
    let left: Vec<_> = std::fs::read_dir(&caps)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|f| !f.to_string_lossy().starts_with("gi")),
        "instance destroyed: {left:?}"
    );
}

#[tokio::test]
async fn memory_fraction_shares_one_daemon_until_the_last_claim_leaves() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let share = |request: &str, id: &str, memory: &str| {
        let mut r = result(request, "gpu-3");
        r["shareID"] = json!(id);
        r["consumedCapacity"] = json!({"memory": memory});
        r
    };
    let a = n
        .claim(
            "share-a",
            json!([share("a", "11111111-0000-4000-8000-000000000001", "4Gi")]),
            json!([]),
        )
        .await;
    let b = n
        .claim(
            "share-b",
            json!([share("b", "11111111-0000-4000-8000-000000000002", "8Gi")]),
            json!([]),
        )
        .await;
    let ra = n.prepare_ok(&a).await;
    assert_eq!(
        ra.devices[0].share_id.as_deref(),
        Some("11111111-0000-4000-8000-000000000001")
    );
    n.prepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 1, "one daemon for the GPU");
    let env_a = env_of(&n.spec_device(&a, "gpu-3"));
    let env_b = env_of(&n.spec_device(&b, "gpu-3"));
    assert!(
        env_a.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M".to_owned()),
        "{env_a:?}"
    );
    assert!(
        env_b.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M".to_owned()),
        "{env_b:?}"
    );
    // A T4 has 15 GiB usable in the profile: 4 GiB is about 27 %.
    assert!(
        env_a
            .iter()
            .any(|e| e.starts_with("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=")),
        "{env_a:?}"
    );
    n.unprepare_ok(&a).await;
    assert_eq!(n.mps_daemons(), 1, "b still uses the daemon");
    n.unprepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 0, "stopped after the last claim");
    assert_eq!(n.processes(), 0, "no process left");
}

#[tokio::test]
async fn a_device_is_never_given_to_two_claims_but_admin_access_may_watch() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let first = n
        .claim("first", json!([result("gpu", "gpu-0")]), json!([]))
        .await;
    let second = n
        .claim("second", json!([result("gpu", "gpu-0")]), json!([]))
        .await;
    let mut admin_result = result("mon", "gpu-0");
    admin_result["adminAccess"] = json!(true);
    let admin = n.claim("monitor", json!([admin_result]), json!([])).await;
    n.prepare_ok(&first).await;
    let r = n.prepare(std::slice::from_ref(&second)).await;
    let e = r[&second.uid].error.clone().unwrap();
    assert!(
        e.contains("already prepared for claim default/first"),
        "{e}"
    );
    assert!(
        !n.spec_path(&second).exists(),
        "nothing left by the refused claim"
    );
    n.prepare_ok(&admin).await;
    n.unprepare_ok(&first).await;
    n.prepare_ok(&second).await;
    n.unprepare_ok(&second).await;
    n.unprepare_ok(&admin).await;
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn unusable_claims_get_precise_per_claim_errors_and_leave_nothing() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let ok = n
        .claim("ok", json!([result("gpu", "gpu-0")]), json!([]))
        .await;
    let foreign = n
        .claim(
            "elsewhere",
            json!([{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}]),
            json!([]),
        )
        .await;
    let unknown = n
        .claim("unknown", json!([result("gpu", "gpu-9")]), json!([]))
        .await;
    let bad_config = n
        .claim(
            "bad-config",
            json!([result("gpu", "gpu-1")]),
            json!([gpu_config(json!({"strategy": "Sometimes"}))]),
        )
        .await;
    let missing = Claim::new("default", "missing", "00000000-0000-4000-8000-00000000dead");
    let renamed = Claim::new("default", "ok", "00000000-0000-4000-8000-00000000beef");
    let all = [
        ok.clone(),
        foreign.clone(),
        unknown.clone(),
        bad_config.clone(),
        missing.clone(),
        renamed.clone(),
    ];
    let r = n.prepare(&all).await;
    assert_eq!(r[&ok.uid].error, None);
    let err = |c: &Claim| r[&c.uid].error.clone().unwrap_or_default();
    assert!(
        err(&foreign).contains("on node node-a") && err(&foreign).contains("node-b"),
        "{}",
        err(&foreign)
    );
    assert!(err(&unknown).contains("\"gpu-9\""), "{}", err(&unknown));
    assert!(
        err(&bad_config).contains("Sometimes"),
        "{}",
        err(&bad_config)
    );
    assert!(err(&missing).contains("not found"), "{}", err(&missing));
    assert!(
        err(&renamed).contains("deleted and re-created"),
        "{}",
        err(&renamed)
    );
    assert_eq!(n.checkpoint_claims(), [ok.uid.clone()]);
    let specs = std::fs::read_dir(&n.env.cdi_root).unwrap().count();
    assert_eq!(specs, 1, "only the good claim has a spec");
}
