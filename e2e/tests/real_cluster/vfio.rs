//! VFIO passthrough on the real cluster (issue #44): a pod with a claim of
//! class `vfio.gpu.nvidia.com` runs with its VFIO nodes and
//! `NVIDIA_VISIBLE_DEVICES=void`, its GPU is bound to `vfio-pci` while it
//! runs and back to `nvidia` once the pod is gone, and a full-GPU claim for
//! the same GPU is not allocated meanwhile (the two devices share a counter).
//!
//! The node has no IOMMU, so the GPUs' sysfs is a stand-in
//! (`fake_driver_root::sysfs`, laid out from the machine profile) whose
//! stand-in kernel runs in this process and acts on the plugin's
//! `driver_override`, `unbind` and `drivers_probe` writes; the VFIO nodes
//! are stand-in character devices in the host's `/dev/vfio` (with
//! `/dev/null`'s numbers, listed in the cluster's `dev-nodes` for
//! `hack/cluster/down`). Passthrough and the stand-in sysfs are turned on
//! for this test only (chart values `kubeletPlugin.passthrough` and
//! `kubeletPlugin.sysfsRoot`, a rolling update of the plugin) and turned
//! off after it, as they publish extra devices the other tests do not
//! expect.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fake_driver_root::sysfs::{FakeSysfs, Kernel, create_vfio_nodes};
use libtest_mimic::Failed;

use crate::claims::{
    allocated, check_against_spec, claim_rest, claim_yaml, delete_and_check_clean,
    device_attribute, get_json, helm_upgrade, run_check_pod, script_pod, sleeping_pod,
    slice_devices, wait_plugin_rollout,
};
use crate::harness::{Cluster, PROFILE, cluster_state};

pub const TESTS: [(&str, crate::Test); 1] = [(
    "vfio::a_vfio_claim_runs_a_pod_on_a_gpu_rebound_to_vfio_pci",
    vfio_claim,
)];

/// The stand-in sysfs on the node (under the fake node's root, which
/// `hack/cluster/down` removes).
const SYSFS_ROOT: &str = "/var/lib/gpu-dra-cluster-node/sys";
/// How long the plugin may take to come back with the new values and
/// publish (or stop publishing) the VFIO devices.
const REPUBLISH: Duration = Duration::from_secs(180);
/// How long a pod may take to start, and the GPU to be bound back.
const POD_START: Duration = Duration::from_secs(120);
/// How long the full-GPU claim is watched staying unallocated.
const HELD_OFF: Duration = Duration::from_secs(15);

/// The container's check: its VFIO and NVIDIA nodes, env and mounts
/// between the markers `claims::parse_seen` reads, then it waits.
const VFIO_SCRIPT: &str = "echo ==DEV; for f in /dev/vfio/* /dev/vfio/devices/* /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && echo \"$f\"; done; \
     echo ==ENV; env; echo ==MOUNTS; cut -d' ' -f2 /proc/mounts; echo ==END; \
     trap 'exit 0' TERM; sleep 3600 & wait";

/// The stand-in sysfs with its kernel, and the VFIO nodes made for it;
/// dropping it stops the kernel and removes the nodes.
struct StandIn {
    sysfs: FakeSysfs,
    _kernel: Kernel,
    nodes: Vec<PathBuf>,
}

impl StandIn {
    fn start(c: &Cluster) -> Result<Self, Failed> {
        // The host's own /dev/vfio (a machine with VFIO) is never touched.
        let listed = std::fs::read_to_string(cluster_state().join("dev-nodes")).unwrap_or_default();
        if Path::new("/dev/vfio/vfio").exists() && !listed.lines().any(|l| l == "/dev/vfio/vfio") {
            return Err(
                "this machine has a /dev/vfio of its own; the stand-in nodes would replace it"
                    .into(),
            );
        }
        let root = Path::new(SYSFS_ROOT);
        if root.exists() {
            std::fs::remove_dir_all(root).map_err(|e| format!("remove {SYSFS_ROOT}: {e}"))?;
        }
        let profile = c
            .repo
            .join("hack/mock-nvml/profiles")
            .join(format!("{PROFILE}.yaml"));
        let profile = nvidia_ml::Profile::load(&profile)
            .map_err(|e| format!("profile {}: {e}", profile.display()))?;
        nvidia_ml::sysfs::write(&profile, root).map_err(|e| format!("sysfs: {e}"))?;
        let sysfs = FakeSysfs::adopt(root).map_err(|e| format!("stand-in sysfs: {e}"))?;
        let groups: Vec<u32> = sysfs.gpus().iter().map(|g| g.iommu_group).collect();
        let mut nodes = vec![PathBuf::from("/dev/vfio/vfio")];
        for g in &groups {
            nodes.push(PathBuf::from(format!("/dev/vfio/{g}")));
            nodes.push(PathBuf::from(format!("/dev/vfio/devices/vfio{g}")));
        }
        // Listed first, so that down removes them even if this process dies.
        let mut missing = String::new();
        for n in nodes
            .iter()
            .filter(|n| !listed.lines().any(|l| Path::new(l) == n.as_path()))
        {
            missing.push_str(&n.to_string_lossy());
            missing.push('\n');
        }
        {
            use std::io::Write as _;
            let path = cluster_state().join("dev-nodes");
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            f.write_all(missing.as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        create_vfio_nodes(Path::new("/"), &groups, false)
            .map_err(|e| format!("VFIO nodes: {e}"))?;
        for n in &nodes {
            use std::os::unix::fs::FileTypeExt as _;
            let char_device = std::fs::metadata(n).is_ok_and(|m| m.file_type().is_char_device());
            if !char_device {
                return Err(format!("{} is not a character device", n.display()).into());
            }
        }
        let kernel = sysfs
            .start_kernel()
            .map_err(|e| format!("stand-in kernel: {e}"))?;
        Ok(Self {
            sysfs,
            _kernel: kernel,
            nodes,
        })
    }

    /// The stand-in's bus id (as sysfs spells it) and IOMMU group of the
    /// GPU published with `bus`.
    fn gpu_of(&self, bus: &str) -> Result<(String, u32), Failed> {
        self.sysfs
            .gpus()
            .iter()
            .find(|g| g.bus.eq_ignore_ascii_case(bus))
            .map(|g| (g.bus.clone(), g.iommu_group))
            .ok_or_else(|| format!("no GPU {bus} in the stand-in sysfs").into())
    }

    /// Waits until the GPU at `bus` is bound to `driver`.
    fn wait_driver(&self, bus: &str, driver: &str, limit: Duration) -> Result<(), Failed> {
        let start = Instant::now();
        loop {
            let now = self.sysfs.driver_of(bus);
            if now.as_deref() == Some(driver) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(format!(
                    "GPU {bus} is on {now:?}, not {driver}, after {limit:?}; kernel events: {:?}",
                    self.sysfs.events().unwrap_or_default()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        for n in &self.nodes {
            let _ = std::fs::remove_file(n);
        }
        let _ = std::fs::remove_dir("/dev/vfio/devices");
        let _ = std::fs::remove_dir("/dev/vfio");
    }
}

/// Sets chart values on the installed release (`--reuse-values`, a rolling
/// update of the plugin) and waits for the rollout.
fn set_values(c: &Cluster, sets: &[&str]) -> Result<(), Failed> {
    let flags: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
    helm_upgrade(c, &flags)?;
    wait_plugin_rollout(c)
}

/// The names of the node's published VFIO devices.
fn vfio_devices(c: &Cluster) -> Result<Vec<String>, Failed> {
    Ok(slice_devices(c, &[])?
        .iter()
        .filter(|d| d["attributes"]["type"]["string"] == "vfio")
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect())
}

/// Waits until the node publishes VFIO devices (`want`) or none.
fn wait_vfio_published(c: &Cluster, want: bool) -> Result<Vec<String>, Failed> {
    let start = Instant::now();
    loop {
        let devices = vfio_devices(c)?;
        if devices.is_empty() != want {
            return Ok(devices);
        }
        if start.elapsed() > REPUBLISH {
            return Err(format!("VFIO devices published: {devices:?}, want some: {want}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn vfio_claim(c: &Cluster) -> Result<(), Failed> {
    let stand_in = StandIn::start(c)?;
    let outcome = set_values(
        c,
        &[
            "kubeletPlugin.passthrough=true",
            &format!("kubeletPlugin.sysfsRoot={SYSFS_ROOT}"),
        ],
    )
    .and_then(|()| on_passthrough(c, &stand_in));
    // The claims go while the stand-in kernel still answers the plugin's
    // unbinds; then the plugin goes back to the shared install's values.
    let cleaned = c.delete_test_namespaces();
    let restored = set_values(
        c,
        &[
            "kubeletPlugin.passthrough=false",
            "kubeletPlugin.sysfsRoot=",
        ],
    )
    .and_then(|()| wait_vfio_published(c, false).map(|_| ()));
    drop(stand_in);
    outcome?;
    cleaned?;
    restored
}

fn on_passthrough(c: &Cluster, s: &StandIn) -> Result<(), Failed> {
    let published = wait_vfio_published(c, true)?;
    eprintln!("VFIO devices published: {published:?}");

    let ns = "e2e-vfio";
    c.fresh_namespace(ns)?;
    c.apply(ns, &claim_yaml("vm", "vfio.gpu.nvidia.com", &[], "", ""))?;
    let pod = "vm";
    let seen = run_check_pod(c, ns, pod, &script_pod(pod, VFIO_SCRIPT, &claim_rest("vm")))?;
    check_against_spec(c, ns, "vm", &seen)?;

    let claim = get_json(c, ns, &["resourceclaim", "vm"])?;
    let devices = allocated(&claim);
    let [(_, device)] = devices.as_slice() else {
        return Err(format!("claim vm is allocated {devices:?}, want one device").into());
    };
    if !device.starts_with("gpu-vfio-") {
        return Err(format!("claim vm got {device}, not a VFIO device").into());
    }
    let bus = device_attribute(c, device, "resource.kubernetes.io/pciBusID")?;
    let uuid = device_attribute(c, device, "uuid")?;
    let (bus, group) = s.gpu_of(&bus)?;
    // The container: its group and the VFIO container node, no NVIDIA
    // node, and the NVIDIA runtime told to inject nothing.
    for node in [format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_owned()] {
        if !seen.dev.contains(&node) {
            return Err(format!("the pod lacks {node}: {:?}", seen.dev).into());
        }
    }
    if let Some(n) = seen.dev.iter().find(|d| d.starts_with("/dev/nvidia")) {
        return Err(format!("a VFIO pod got the NVIDIA node {n}: {:?}", seen.dev).into());
    }
    if !seen.env.contains("NVIDIA_VISIBLE_DEVICES=void") {
        return Err(format!(
            "the pod lacks NVIDIA_VISIBLE_DEVICES=void: {:?}",
            seen.env
                .iter()
                .filter(|e| e.starts_with("NVIDIA"))
                .collect::<Vec<_>>()
        )
        .into());
    }
    // The GPU is on vfio-pci while the pod runs.
    if s.sysfs.driver_of(&bus).as_deref() != Some("vfio-pci") {
        return Err(format!(
            "GPU {bus} of {device} is on {:?} while the pod runs; kernel events: {:?}",
            s.sysfs.driver_of(&bus),
            s.sysfs.events().unwrap_or_default()
        )
        .into());
    }
    eprintln!("pod {pod} runs on {device} ({bus}, IOMMU group {group}), the GPU on vfio-pci");

    // The same GPU whole: the scheduler does not allocate it meanwhile.
    let selector = format!("device.attributes['gpu.nvidia.com'].uuid == '{uuid}'");
    c.apply(
        ns,
        &claim_yaml("whole", "gpu.nvidia.com", &[&selector], "", ""),
    )?;
    let whole_pod = "whole";
    c.apply(ns, &sleeping_pod(whole_pod, "whole"))?;
    let start = Instant::now();
    while start.elapsed() < HELD_OFF {
        let whole = get_json(c, ns, &["resourceclaim", "whole"])?;
        if !whole["status"]["allocation"].is_null() {
            return Err(format!(
                "the whole GPU {uuid} was allocated while its VFIO device {device} is: {:?}",
                allocated(&whole)
            )
            .into());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let phase = c.kubectl(&[
        "get",
        "-n",
        ns,
        "pod",
        whole_pod,
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    if phase.trim() != "Pending" {
        return Err(format!("pod {whole_pod} is {phase}, want Pending").into());
    }

    // The pod and its claim go: the GPU is bound back to nvidia, and then
    // the whole-GPU pod gets it.
    let uid = claim["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    c.kubectl(&["delete", "resourceclaim", "-n", ns, "vm", "--wait=false"])?;
    delete_and_check_clean(c, ns, &[pod], &[uid])?;
    s.wait_driver(&bus, "nvidia", POD_START)?;
    let events = s.sysfs.events().map_err(|e| format!("kernel log: {e}"))?;
    let want = [
        format!("unbind {bus} nvidia"),
        format!("bind {bus} vfio-pci"),
        format!("unbind {bus} vfio-pci"),
        format!("bind {bus} nvidia"),
    ];
    let mine: Vec<&String> = events.iter().filter(|e| e.contains(&bus)).collect();
    if mine != want.iter().collect::<Vec<_>>() {
        return Err(format!("the stand-in kernel saw {mine:?} for {bus}, want {want:?}").into());
    }
    if s.sysfs.override_of(&bus).is_some() {
        return Err(format!(
            "GPU {bus} keeps driver_override {:?}",
            s.sysfs.override_of(&bus)
        )
        .into());
    }
    c.wait_pod_phase(ns, whole_pod, "Running", POD_START)?;
    let whole = get_json(c, ns, &["resourceclaim", "whole"])?;
    eprintln!(
        "after the VFIO claim: {bus} back on nvidia, pod {whole_pod} runs on {:?}",
        allocated(&whole)
    );
    Ok(())
}
