//! Dynamic MIG against the production NVML backend over the project's fake
//! `libnvidia-ml.so` (a private copy per test, with its own state file,
//! proc root and dev root, so the MIG capability files the fake keeps like
//! the kernel are read back through the CDI node locator).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use gpu_nvml::{GpuBackend, MigPlacement, NvmlBackend};
use nvidia_ml::fixture::{self, InstallOptions};

use super::*;
use crate::prepare::cdi::{HostRoot, NodeLocator};

/// GPU instance profile ids of the A100/H100 80GB table.
const P_1G_10GB: u32 = 19;
const P_1G_20GB: u32 = 15;
const P_3G_40GB: u32 = 9;
const P_4G_40GB: u32 = 5;
const P_7G_80GB: u32 = 0;

/// One private fake machine.
struct Machine {
    dir: tempfile::TempDir,
    backend: NvmlBackend,
}

impl Machine {
    fn shipped(name: &str) -> Self {
        Self::install(|dir, options| {
            fixture::install_with(dir, &fixture::bundled_profile(name), options)
        })
    }

    fn yaml(text: &str) -> Self {
        Self::install(|dir, options| fixture::install_yaml_with(dir, text, options))
    }

    fn install(
        install: impl FnOnce(&Path, &InstallOptions) -> Result<PathBuf, nvidia_ml::Error>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let options = InstallOptions {
            state: Some(dir.path().join("state.json")),
            proc_root: Some(dir.path().join("proc")),
            dev_root: Some(dir.path().join("root")),
            control: None,
        };
        let library = install(&dir.path().join("nvml"), &options).unwrap();
        // Stand-ins for the GPU nodes the CDI locator requires.
        std::fs::create_dir_all(dir.path().join("root/dev")).unwrap();
        for minor in 0..8 {
            std::fs::write(dir.path().join(format!("root/dev/nvidia{minor}")), "").unwrap();
        }
        let backend = NvmlBackend::open(Some(&library)).unwrap();
        Self { dir, backend }
    }

    /// Another backend on the same machine (as after a plugin restart).
    fn reopen(&self) -> NvmlBackend {
        NvmlBackend::open(Some(&self.dir.path().join("nvml/libnvidia-ml.so.1"))).unwrap()
    }

    fn request(&self, gpu: u32, profile_id: u32, start: u32, size: u32) -> MigRequest {
        let info = self.backend.gpu(gpu).unwrap();
        MigRequest {
            gpu_index: gpu,
            parent_minor: info.minor,
            parent_uuid: info.uuid,
            profile_id,
            placement_start: start,
            placement_size: size,
        }
    }

    /// (GI id, profile id, start, size, CI ids) of every GPU instance.
    fn instances(&self, gpu: u32) -> Vec<(u32, u32, u32, u32, Vec<u32>)> {
        self.backend
            .gpu_instances(gpu)
            .unwrap()
            .into_iter()
            .map(|g| {
                (
                    g.id,
                    g.profile_id,
                    g.placement.start,
                    g.placement.size,
                    g.compute_instances.iter().map(|c| c.id).collect(),
                )
            })
            .collect()
    }

    fn mig_mode(&self, gpu: u32) -> (bool, bool) {
        let mig = self.backend.gpu(gpu).unwrap().mig.unwrap();
        (mig.current_enabled, mig.pending_enabled)
    }

    fn nodes(&self) -> NodeLocator {
        NodeLocator::new(
            HostRoot::same(self.dir.path().join("root")),
            self.dir.path().join("proc"),
        )
    }
}

fn all_uuids(m: &Machine, gpu: u32) -> Vec<String> {
    m.backend
        .gpu(gpu)
        .unwrap()
        .mig
        .map(|mig| mig.devices.into_iter().map(|d| d.uuid).collect())
        .unwrap_or_default()
}

#[test]
fn hopper_mig_mode_is_switched_on_and_the_device_made() {
    let m = Machine::shipped("dgx-h100");
    assert_eq!(m.mig_mode(2), (false, false));
    let created = create(&m.backend, &m.request(2, P_1G_10GB, 3, 1)).unwrap();
    assert!(created.enabled_mig_mode && !created.adopted, "{created:?}");
    assert!(created.uuid.starts_with("MIG-"), "{}", created.uuid);
    assert_eq!(m.mig_mode(2), (true, true));
    assert_eq!(
        m.instances(2),
        [(
            created.gpu_instance_id,
            P_1G_10GB,
            3,
            1,
            vec![created.compute_instance_id]
        )]
    );
    assert_eq!(all_uuids(&m, 2), std::slice::from_ref(&created.uuid));
    // The kernel's capability files exist: the CDI locator finds the nodes.
    let nodes = m
        .nodes()
        .mig(2, created.gpu_instance_id, created.compute_instance_id)
        .unwrap();
    assert_eq!(nodes.nodes.len(), 3);
    // Other GPUs untouched.
    assert_eq!(m.mig_mode(3), (false, false));

    // A second device on the same GPU: MIG mode is on already.
    let second = create(&m.backend, &m.request(2, P_3G_40GB, 4, 4)).unwrap();
    assert!(!second.enabled_mig_mode && !second.adopted);

    destroy(
        &m.backend,
        2,
        created.gpu_instance_id,
        created.compute_instance_id,
    )
    .unwrap();
    destroy(
        &m.backend,
        2,
        second.gpu_instance_id,
        second.compute_instance_id,
    )
    .unwrap();
    assert!(m.instances(2).is_empty());
    assert!(
        m.nodes()
            .mig(2, created.gpu_instance_id, created.compute_instance_id)
            .is_err(),
        "capability files removed with the device"
    );
    // Whole again: MIG mode goes off.
    ensure_full_gpu(&m.backend, 2).unwrap();
    assert_eq!(m.mig_mode(2), (false, false));
}

#[test]
fn ampere_with_mig_off_is_refused_and_nothing_changes() {
    let m = Machine::shipped("dgx-a100");
    let err = create(&m.backend, &m.request(5, P_1G_10GB, 0, 1)).unwrap_err();
    assert!(
        matches!(err, MigError::ModeNeedsReset { gpu: 5, .. }),
        "{err}"
    );
    let text = err.to_string();
    for part in [
        "GPU 5 (GPU-",
        "NVIDIA A100-SXM4-80GB",
        "compute capability 8.0",
        "has MIG mode off",
        "turning it on needs a GPU reset, which this driver never does",
        "nvidia-smi -i 5 -mig 1",
    ] {
        assert!(text.contains(part), "{part:?} missing in: {text}");
    }
    assert_eq!(m.mig_mode(5), (false, false));
    assert!(m.instances(5).is_empty());
}

#[test]
fn a_pending_ampere_mode_change_is_named() {
    let m = Machine::shipped("dgx-a100");
    // An admin asked for MIG on but did not reset the GPU.
    m.backend.set_mig_mode(6, true).unwrap();
    assert_eq!(m.mig_mode(6), (false, true));
    let text = create(&m.backend, &m.request(6, P_1G_10GB, 0, 1))
        .unwrap_err()
        .to_string();
    assert!(text.contains("MIG mode off (pending: on)"), "{text}");
}

/// One H100 with MIG `mig` and extra per-GPU lines.
fn one_h100(mig: &str, extra: &str) -> String {
    format!(
        r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: H100-SXM5-80GB
    uuid: GPU-6513270e-269e-4d37-b2a7-4de452e6b438
    pciBusId: "0000:1b:00.0"
    minor: 0
    numaNode: 0
    pcieRoot: pci0000:15
    mig: {mig}
{extra}"#
    )
}

#[test]
fn a_failed_compute_instance_rolls_back_the_instance_and_the_mode() {
    let m = Machine::yaml(&one_h100(
        "{current: false}",
        "    fail: {nvmlGpuInstanceCreateComputeInstance: INSUFFICIENT_RESOURCES}\n",
    ));
    let err = create(&m.backend, &m.request(0, P_3G_40GB, 0, 4)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("GPU 0: cannot create a 3g.40gb MIG device at placement 0:4: ")
            && text.contains("nvmlGpuInstanceCreateComputeInstance"),
        "{text}"
    );
    // MIG mode was switched on by this call and is off again.
    assert_eq!(m.mig_mode(0), (false, false));
    let state = std::fs::read_to_string(m.dir.path().join("state.json")).unwrap();
    assert!(state.contains("\"gpuInstances\": []"), "{state}");
    // No capability file is left either.
    assert!(
        !m.dir
            .path()
            .join("proc/driver/nvidia/capabilities/gpu0/mig")
            .exists()
    );
}

#[test]
fn a_failed_create_with_mig_on_keeps_the_mode() {
    let m = Machine::yaml(&one_h100(
        "{current: true}",
        "    fail: {nvmlGpuInstanceCreateComputeInstance: UNKNOWN}\n",
    ));
    let err = create(&m.backend, &m.request(0, P_1G_10GB, 0, 1)).unwrap_err();
    assert!(matches!(err, MigError::Backend { gpu: 0, .. }), "{err}");
    assert_eq!(m.mig_mode(0), (true, true));
    assert!(m.instances(0).is_empty());
}

#[test]
fn a_failed_rollback_reports_both_errors() {
    let m = Machine::yaml(&one_h100(
        "{current: false}",
        "    fail: {nvmlGpuInstanceCreateComputeInstance: UNKNOWN, nvmlGpuInstanceDestroy: IN_USE}\n",
    ));
    let err = create(&m.backend, &m.request(0, P_3G_40GB, 4, 4)).unwrap_err();
    assert!(matches!(err, MigError::RollbackFailed { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rolling back the GPU instance also failed")
            && text.contains("undoing it also failed")
            && text.contains("switch MIG mode off"),
        "{text}"
    );
}

#[test]
fn a_retried_create_adopts_the_device() {
    let m = Machine::shipped("dgx-h100");
    let req = m.request(0, P_4G_40GB, 0, 4);
    let first = create(&m.backend, &req).unwrap();
    // The plugin restarts (new NVML session) and the prepare is retried.
    let backend = m.reopen();
    let again = create(&backend, &req).unwrap();
    assert!(again.adopted && !again.enabled_mig_mode, "{again:?}");
    assert_eq!(
        (
            again.gpu_instance_id,
            again.compute_instance_id,
            &again.uuid
        ),
        (
            first.gpu_instance_id,
            first.compute_instance_id,
            &first.uuid
        )
    );
    assert_eq!(m.instances(0).len(), 1);
}

#[test]
fn an_instance_left_without_compute_instance_is_made_afresh() {
    let m = Machine::shipped("dgx-a100");
    // dgx-a100 GPU 2: 1g.20gb at 2 (GI 4) has no compute instance.
    assert!(m.instances(2).contains(&(4, P_1G_20GB, 2, 2, vec![])));
    let created = create(&m.backend, &m.request(2, P_1G_20GB, 2, 2)).unwrap();
    assert!(!created.adopted && !created.enabled_mig_mode);
    assert_eq!(created.gpu_instance_id, 4);
    assert!(
        m.instances(2)
            .contains(&(4, P_1G_20GB, 2, 2, vec![created.compute_instance_id]))
    );
    m.nodes()
        .mig(2, created.gpu_instance_id, created.compute_instance_id)
        .unwrap();
}

#[test]
fn occupied_placements_are_refused_naming_the_holders() {
    let m = Machine::shipped("dgx-a100");
    // GPU 2: the 3g.40gb at 4 is split in two compute instances: the same
    // profile and placement, but not one device: not adopted.
    let split: Vec<String> = m
        .backend
        .gpu_instances(2)
        .unwrap()
        .into_iter()
        .find(|g| g.id == 2)
        .unwrap()
        .compute_instances
        .into_iter()
        .map(|c| c.uuid.unwrap())
        .collect();
    let before = m.instances(2);
    let err = create(&m.backend, &m.request(2, P_3G_40GB, 4, 4)).unwrap_err();
    let MigError::PlacementTaken { holders, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(holders, &split);
    // GPU 2: a 1g.10gb at 2 overlaps the GI without compute instance.
    let text = create(&m.backend, &m.request(2, P_1G_10GB, 2, 1))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("cannot create 1g.10gb at placement 2:1: it overlaps GPU instance 4 (1g.20gb at 2:2) without a compute instance"),
        "{text}"
    );
    assert_eq!(m.instances(2), before);
    // GPU 0 is full (4g.40gb at 0, 3g.40gb at 4): 7g.80gb overlaps both.
    let text = create(&m.backend, &m.request(0, P_7G_80GB, 0, 8))
        .unwrap_err()
        .to_string();
    for uuid in all_uuids(&m, 0) {
        assert!(text.contains(&uuid), "{uuid} not named: {text}");
    }
}

#[test]
fn requests_that_do_not_fit_the_gpu_are_refused() {
    let m = Machine::shipped("dgx-h100");
    let mut req = m.request(1, P_3G_40GB, 1, 4);
    let text = create(&m.backend, &req).unwrap_err().to_string();
    assert!(
        text.contains("3g.40gb cannot be placed at 1:4; its placements are 0:4, 4:4"),
        "{text}"
    );
    req.placement_start = 0;
    req.profile_id = 4242;
    let text = create(&m.backend, &req).unwrap_err().to_string();
    assert!(
        text.contains("no GPU instance profile with id 4242; this GPU has")
            && text.contains("19 (1g.10gb)"),
        "{text}"
    );
    // The device was published for another GPU.
    let mut req = m.request(1, P_1G_10GB, 0, 1);
    req.parent_uuid = "GPU-00000000-0000-0000-0000-000000000000".into();
    let err = create(&m.backend, &req).unwrap_err();
    assert!(matches!(err, MigError::WrongGpu { gpu: 1, .. }), "{err}");
    let mut req = m.request(1, P_1G_10GB, 0, 1);
    req.parent_minor = 7;
    assert!(matches!(
        create(&m.backend, &req),
        Err(MigError::WrongGpu { .. })
    ));
    // No such GPU.
    let mut req = m.request(1, P_1G_10GB, 0, 1);
    req.gpu_index = 8;
    let text = create(&m.backend, &req).unwrap_err().to_string();
    assert!(
        text.starts_with("GPU 8: cannot read the GPU's state"),
        "{text}"
    );
    // Nothing changed anywhere.
    for gpu in 0..8 {
        assert_eq!(m.mig_mode(gpu), (false, false));
    }

    let t4 = Machine::shipped("t4-inference");
    let err = create(&t4.backend, &t4.request(0, P_1G_10GB, 0, 1)).unwrap_err();
    assert!(
        err.to_string().starts_with("GPU 0 (GPU-")
            && err.to_string().ends_with("Tesla T4) does not support MIG"),
        "{err}"
    );
}

#[test]
fn destroy_is_idempotent() {
    let m = Machine::shipped("dgx-h100");
    let d = create(&m.backend, &m.request(0, P_1G_10GB, 6, 1)).unwrap();
    destroy(&m.backend, 0, d.gpu_instance_id, d.compute_instance_id).unwrap();
    destroy(&m.backend, 0, d.gpu_instance_id, d.compute_instance_id).unwrap();
    // Never existed.
    destroy(&m.backend, 0, 3, 0).unwrap();
    // MIG mode is off now: nothing can exist.
    ensure_full_gpu(&m.backend, 0).unwrap();
    destroy(&m.backend, 0, d.gpu_instance_id, d.compute_instance_id).unwrap();
    // A GPU that never had MIG on.
    destroy(&m.backend, 5, 1, 0).unwrap();
    // A GPU that does not exist is an error.
    let err = destroy(&m.backend, 9, 1, 0).unwrap_err();
    assert!(matches!(err, MigError::Backend { gpu: 9, .. }), "{err}");
}

#[test]
fn destroy_failures_are_reported() {
    let m = Machine::yaml(&one_h100(
        "{current: true, devices: [{profile: 3g.40gb, placement: 0}]}",
        "    fail: {nvmlComputeInstanceDestroy: IN_USE}\n",
    ));
    let (gi, ci) = {
        let d = &m.backend.gpu(0).unwrap().mig.unwrap().devices[0];
        (d.gpu_instance_id, d.compute_instance_id)
    };
    let text = destroy(&m.backend, 0, gi, ci).unwrap_err().to_string();
    assert!(
        text.starts_with(&format!(
            "GPU 0: cannot destroy MIG device (GPU instance {gi}, compute instance {ci})"
        )) && text.contains("nvmlComputeInstanceDestroy"),
        "{text}"
    );
    assert_eq!(m.instances(0).len(), 1);
}

#[test]
fn a_verified_destroy_leaves_a_device_that_reused_the_ids() {
    let m = Machine::shipped("dgx-h100");
    let req = m.request(0, P_1G_10GB, 0, 1);
    let ours = create(&m.backend, &req).unwrap();
    destroy(
        &m.backend,
        0,
        ours.gpu_instance_id,
        ours.compute_instance_id,
    )
    .unwrap();
    // Another claim gets the same placement: same ids, new UUID.
    let theirs = create(&m.backend, &req).unwrap();
    assert_eq!(
        (theirs.gpu_instance_id, theirs.compute_instance_id),
        (ours.gpu_instance_id, ours.compute_instance_id)
    );
    assert_ne!(theirs.uuid, ours.uuid);
    // Our unprepare is retried: their device survives.
    destroy_verified(
        &m.backend,
        0,
        ours.gpu_instance_id,
        ours.compute_instance_id,
        &ours.uuid,
    )
    .unwrap();
    assert_eq!(all_uuids(&m, 0), std::slice::from_ref(&theirs.uuid));
    // Their own unprepare destroys it, twice is fine.
    for _ in 0..2 {
        destroy_verified(
            &m.backend,
            0,
            theirs.gpu_instance_id,
            theirs.compute_instance_id,
            &theirs.uuid,
        )
        .unwrap();
    }
    assert!(m.instances(0).is_empty());
}

#[test]
fn a_verified_destroy_finishes_an_interrupted_one() {
    let m = Machine::shipped("dgx-a100");
    // GI 4 on GPU 2 has lost its compute instance (as if a destroy was
    // interrupted between the two steps).
    destroy_verified(&m.backend, 2, 4, 0, "MIG-whatever").unwrap();
    assert!(!m.instances(2).iter().any(|g| g.0 == 4));
}

#[test]
fn ensure_full_gpu_switches_mig_off_only_when_nothing_is_on_it() {
    let m = Machine::shipped("dgx-h100");
    // MIG off: nothing to do.
    ensure_full_gpu(&m.backend, 0).unwrap();
    assert_eq!(m.mig_mode(0), (false, false));
    // MIG on with a device: refused, naming it.
    let d = create(&m.backend, &m.request(0, P_1G_10GB, 0, 1)).unwrap();
    let err = ensure_full_gpu(&m.backend, 0).unwrap_err();
    assert!(
        matches!(err, MigError::MigDevicesExist { gpu: 0, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&d.uuid) && text.contains("unprepare the claims using them first"),
        "{text}"
    );
    assert_eq!(m.mig_mode(0), (true, true));
    // MIG on and empty: switched off.
    destroy(&m.backend, 0, d.gpu_instance_id, d.compute_instance_id).unwrap();
    ensure_full_gpu(&m.backend, 0).unwrap();
    assert_eq!(m.mig_mode(0), (false, false));

    // Ampere with MIG on: GPU 3 of dgx-a100 has no instances, but turning
    // MIG off needs a reset.
    let a = Machine::shipped("dgx-a100");
    let text = ensure_full_gpu(&a.backend, 3).unwrap_err().to_string();
    assert!(
        text.contains("has MIG mode on; turning it off needs a GPU reset")
            && text.contains("nvidia-smi -i 3 -mig 0"),
        "{text}"
    );
    assert_eq!(a.mig_mode(3), (true, true));
    // A GPU instance without compute instance counts as in the way.
    let text = ensure_full_gpu(&a.backend, 2).unwrap_err().to_string();
    assert!(
        text.contains("GPU instance 4 (1g.20gb at 2:2) without a compute instance"),
        "{text}"
    );
    // No MIG at all.
    let t4 = Machine::shipped("t4-inference");
    ensure_full_gpu(&t4.backend, 0).unwrap();
}

/// Counts the whole-GPU reads (`gpu`) a caller makes; everything else goes
/// straight to the backend.
struct CountingReads {
    backend: NvmlBackend,
    reads: std::sync::atomic::AtomicUsize,
}

impl CountingReads {
    fn new(backend: NvmlBackend) -> Self {
        Self {
            backend,
            reads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl GpuBackend for CountingReads {
    fn system(&self) -> gpu_nvml::Result<gpu_nvml::SystemInfo> {
        self.backend.system()
    }
    fn gpu_count(&self) -> gpu_nvml::Result<u32> {
        self.backend.gpu_count()
    }
    fn gpu(&self, index: u32) -> gpu_nvml::Result<GpuInfo> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.backend.gpu(index)
    }
    fn compute_mode(&self, index: u32) -> gpu_nvml::Result<gpu_nvml::ComputeMode> {
        self.backend.compute_mode(index)
    }
    fn mig_mode(&self, index: u32) -> gpu_nvml::Result<Option<MigMode>> {
        self.backend.mig_mode(index)
    }
    fn set_mig_mode(&self, index: u32, enabled: bool) -> gpu_nvml::Result<()> {
        self.backend.set_mig_mode(index, enabled)
    }
    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement: MigPlacement,
    ) -> gpu_nvml::Result<MigDevice> {
        self.backend.create_mig_device(index, profile_id, placement)
    }
    fn destroy_mig_device(&self, index: u32, gi: u32, ci: u32) -> gpu_nvml::Result<()> {
        self.backend.destroy_mig_device(index, gi, ci)
    }
    fn set_compute_mode(&self, index: u32, mode: gpu_nvml::ComputeMode) -> gpu_nvml::Result<()> {
        self.backend.set_compute_mode(index, mode)
    }
    fn gpu_instances(&self, index: u32) -> gpu_nvml::Result<Vec<MigGpuInstance>> {
        self.backend.gpu_instances(index)
    }
    fn destroy_gpu_instance(&self, index: u32, gi: u32) -> gpu_nvml::Result<()> {
        self.backend.destroy_gpu_instance(index, gi)
    }
}

/// A whole-GPU prepare on a dynamic-MIG node asks for the MIG mode alone
/// when it is off (the common case: one NVML query, not the dozens of a
/// whole read); a mode switch checks its effect, and a destroy on a GPU
/// whose MIG mode went off finds the device gone, the same way.
#[test]
fn whole_gpu_checks_read_the_mig_mode_alone() {
    let m = Machine::shipped("dgx-h100");
    let counting = CountingReads::new(m.reopen());
    ensure_full_gpu(&counting, 0).unwrap();
    ensure_full_gpu(&counting, 1).unwrap();
    assert_eq!(counting.reads(), 0, "MIG off: no whole read");
    // No MIG at all: the same.
    let t4 = Machine::shipped("t4-inference");
    let counting_t4 = CountingReads::new(t4.reopen());
    ensure_full_gpu(&counting_t4, 0).unwrap();
    assert_eq!(counting_t4.reads(), 0);
    // MIG on and empty: one whole read (to check what is on it and name
    // the GPU), the switch itself checked through the mode alone.
    m.backend.set_mig_mode(2, true).unwrap();
    ensure_full_gpu(&counting, 2).unwrap();
    assert_eq!(counting.reads(), 1);
    assert_eq!(m.mig_mode(2), (false, false));
    // Destroying a device on a GPU whose MIG mode went off meanwhile:
    // the mode alone says it is gone.
    let d = create(&counting, &m.request(3, P_1G_10GB, 0, 1)).unwrap();
    let after_create = counting.reads();
    m.backend
        .destroy_mig_device(3, d.gpu_instance_id, d.compute_instance_id)
        .unwrap();
    m.backend.set_mig_mode(3, false).unwrap();
    destroy(&counting, 3, d.gpu_instance_id, d.compute_instance_id).unwrap();
    assert_eq!(counting.reads(), after_create);
}

#[test]
fn sweep_keeps_referenced_devices_and_destroys_the_rest() {
    let m = Machine::shipped("dgx-a100");
    let gpu1 = all_uuids(&m, 1);
    assert_eq!(gpu1.len(), 7);
    let gpu0 = all_uuids(&m, 0);
    let keep: HashSet<String> = [gpu1[2].clone(), gpu0[0].clone(), "MIG-not-there".into()]
        .into_iter()
        .collect();
    let report = sweep(&m.backend, &keep);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let mut kept = report.kept.clone();
    kept.sort();
    let mut expect = vec![gpu1[2].clone(), gpu0[0].clone()];
    expect.sort();
    assert_eq!(kept, expect);
    // GPU 0: one GI; GPU 1: six; GPU 2: three (split, plain, without CI).
    let per_gpu = |g: u32| report.destroyed.iter().filter(|d| d.gpu_index == g).count();
    assert_eq!((per_gpu(0), per_gpu(1), per_gpu(2)), (1, 6, 3));
    let destroyed: HashSet<&String> = report.destroyed.iter().flat_map(|d| &d.uuids).collect();
    assert!(!destroyed.contains(&gpu1[2]) && !destroyed.contains(&gpu0[0]));
    assert!(destroyed.contains(&gpu0[1]));
    assert!(report.destroyed.iter().any(|d| d.gpu_index == 2
        && d.uuids.is_empty()
        && d.placement == MigPlacement { start: 2, size: 2 }));
    // What is left is exactly what was kept.
    assert_eq!(all_uuids(&m, 0), [gpu0[0].clone()]);
    assert_eq!(all_uuids(&m, 1), [gpu1[2].clone()]);
    assert!(m.instances(2).is_empty());
    // A second sweep finds nothing more to do.
    let again = sweep(&m.backend, &keep);
    assert!(again.destroyed.is_empty() && again.failures.is_empty());
    assert_eq!(again.kept.len(), 2);
    // Empty keep set: everything goes.
    let all = sweep(&m.backend, &HashSet::new());
    assert_eq!(all.destroyed.len(), 2);
    for gpu in 0..8 {
        assert!(m.instances(gpu).is_empty(), "GPU {gpu}");
    }
}

#[test]
fn sweep_failures_do_not_stop_it() {
    let yaml = format!(
        "{}{}",
        one_h100(
            "{current: true, devices: [{profile: 3g.40gb, placement: 0}, {profile: 3g.40gb, placement: 4}]}",
            "    fail: {nvmlComputeInstanceDestroy: IN_USE}\n",
        ),
        r#"  - model: H100-SXM5-80GB
    uuid: GPU-830e07bc-1e39-4f10-92bd-4acefaecbd38
    pciBusId: "0000:2a:00.0"
    minor: 1
    numaNode: 0
    pcieRoot: pci0000:15
    mig: {current: true, devices: [{profile: 1g.10gb, placement: 0}]}
"#
    );
    let m = Machine::yaml(&yaml);
    let report = sweep(&m.backend, &HashSet::new());
    assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
    for f in &report.failures {
        assert_eq!(f.gpu_index, Some(0));
        let text = f.to_string();
        assert!(
            text.contains("cannot destroy unreferenced GPU instance")
                && text.contains("nvmlComputeInstanceDestroy"),
            "{text}"
        );
    }
    assert_eq!(report.destroyed.len(), 1);
    assert_eq!(report.destroyed[0].gpu_index, 1);
    assert!(m.instances(1).is_empty());
    assert_eq!(m.instances(0).len(), 2);
}

#[test]
fn creation_on_discovery_facts_reads_only_what_changes() {
    let m = Machine::shipped("dgx-h100");
    let counting = CountingReads::new(m.reopen());
    // Discovery's copy, read while MIG mode was off and nothing existed.
    let facts = m.backend.gpu(4).unwrap();
    assert!(!facts.mig.as_ref().unwrap().current_enabled);
    let req = m.request(4, P_1G_10GB, 0, 1);

    // MIG mode is read live (off: switched on), and no whole read is made.
    let first = create_on(&counting, &facts, &req).unwrap();
    assert!(first.enabled_mig_mode && !first.adopted, "{first:?}");
    assert_eq!(counting.reads(), 0);
    assert!(m.mig_mode(4).0);

    // The instances are listed live: a device made since the copy (here
    // the first one) holds the placement against another profile ...
    let err = create_on(&counting, &facts, &m.request(4, P_3G_40GB, 0, 4)).unwrap_err();
    assert!(
        matches!(&err, MigError::PlacementTaken { holders, .. } if holders.as_slice() == std::slice::from_ref(&first.uuid)),
        "{err}"
    );
    assert_eq!(counting.reads(), 0);
    // ... and a retried prepare of the same request adopts it, with MIG mode
    // on although the copy says off; only this rare path reads it all.
    let again = create_on(&counting, &facts, &req).unwrap();
    assert!(again.adopted && !again.enabled_mig_mode, "{again:?}");
    assert_eq!(again.uuid, first.uuid);
    assert_eq!(counting.reads(), 1);
    assert_eq!(m.instances(4).len(), 1);

    // Another GPU's facts are refused before anything is touched.
    let other = m.backend.gpu(5).unwrap();
    let err = create_on(&counting, &other, &m.request(4, P_1G_10GB, 1, 1)).unwrap_err();
    assert!(matches!(err, MigError::WrongGpu { gpu: 4, .. }), "{err}");
    assert_eq!(m.instances(4).len(), 1);
}
