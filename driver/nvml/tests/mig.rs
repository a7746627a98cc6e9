//! MIG management through `NvmlBackend` against the fake libnvidia-ml:
//! create and destroy MIG devices (overlaps rejected, nothing left behind on
//! failure), MIG and compute mode changes, and concurrent changes on
//! different GPUs.

mod common;

use std::sync::Arc;

use common::{Machine, Minimal};
use gpu_nvml::{ComputeMode, Error, GpuBackend, MigPlacement};

/// Profile ids of the 80GB A100/H100 table.
const P_1G_10GB: u32 = 19;
const P_3G_40GB: u32 = 9;
const P_4G_40GB: u32 = 5;
const P_7G_80GB: u32 = 0;

fn at(start: u32, size: u32) -> MigPlacement {
    MigPlacement { start, size }
}

/// One A100-SXM4-80GB with MIG on and nothing created, plus `extra` YAML
/// lines for the GPU (failure injection).
fn one_a100(extra: &str) -> String {
    format!(
        r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: A100-SXM4-80GB
    uuid: GPU-6b4cb242-4a23-4596-a217-beaddbc496cb
    pciBusId: "0000:4e:00.0"
    minor: 0
    numaNode: 0
    pcieRoot: pci0000:40
    mig: {{current: true}}
{extra}"#
    )
}

#[test]
fn create_list_and_destroy_mig_devices() {
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    // GPU 3 has MIG on and no devices.
    let created = backend.create_mig_device(3, P_3G_40GB, at(4, 4)).unwrap();
    assert_eq!(created.profile_id, P_3G_40GB);
    assert_eq!(created.placement, at(4, 4));
    assert!(created.uuid.starts_with("MIG-"), "{}", created.uuid);
    // The profile's memory (40192 MiB in the A100 80GB table).
    assert_eq!(created.memory_bytes, 40192 << 20, "{created:?}");

    let listed = backend.gpu(3).unwrap().mig.unwrap().devices;
    assert_eq!(listed, std::slice::from_ref(&created));
    assert_eq!(machine.gpu_instances(3).len(), 1);

    let second = backend.create_mig_device(3, P_1G_10GB, at(0, 1)).unwrap();
    assert_ne!(second.uuid, created.uuid);
    assert_ne!(second.gpu_instance_id, created.gpu_instance_id);
    assert_eq!(backend.gpu(3).unwrap().mig.unwrap().devices.len(), 2);

    backend
        .destroy_mig_device(3, created.gpu_instance_id, created.compute_instance_id)
        .unwrap();
    let left = backend.gpu(3).unwrap().mig.unwrap().devices;
    assert_eq!(left, std::slice::from_ref(&second));
    assert_eq!(machine.gpu_instances(3).len(), 1);

    // Destroying again is harmless (unprepare may be retried).
    backend
        .destroy_mig_device(3, created.gpu_instance_id, created.compute_instance_id)
        .unwrap();
    backend
        .destroy_mig_device(3, second.gpu_instance_id, second.compute_instance_id)
        .unwrap();
    assert!(backend.gpu(3).unwrap().mig.unwrap().devices.is_empty());
    assert!(machine.gpu_instances(3).is_empty());
    // The other GPUs were not touched.
    assert_eq!(backend.gpu(1).unwrap().mig.unwrap().devices.len(), 7);
}

#[test]
fn overlapping_and_invalid_placements_are_rejected_and_leave_nothing() {
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    let first = backend.create_mig_device(3, P_3G_40GB, at(0, 4)).unwrap();
    let before = machine.gpu_instances(3);

    let err = backend
        .create_mig_device(3, P_4G_40GB, at(0, 4))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nvmlDeviceCreateGpuInstanceWithPlacement"),
        "{text}"
    );
    assert!(text.contains("GPU 3"), "{text}");

    // 3g.40gb only fits at 0 or 4.
    let err = backend
        .create_mig_device(3, P_3G_40GB, at(1, 4))
        .unwrap_err();
    assert!(matches!(err, Error::Call { gpu: Some(3), .. }), "{err}");
    // An unknown profile id.
    let err = backend.create_mig_device(3, 4242, at(0, 1)).unwrap_err();
    assert!(matches!(err, Error::Call { gpu: Some(3), .. }), "{err}");
    // The whole GPU does not fit next to the existing 3g.
    assert!(backend.create_mig_device(3, P_7G_80GB, at(0, 8)).is_err());

    assert_eq!(machine.gpu_instances(3), before);
    assert_eq!(backend.gpu(3).unwrap().mig.unwrap().devices, [first]);
}

#[test]
fn gpu_instance_is_rolled_back_when_the_compute_instance_fails() {
    let machine = Machine::from_yaml(&one_a100(
        "    fail: {nvmlGpuInstanceCreateComputeInstance: INSUFFICIENT_RESOURCES}\n",
    ));
    let backend = machine.open();
    let err = backend
        .create_mig_device(0, P_3G_40GB, at(0, 4))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nvmlGpuInstanceCreateComputeInstance"),
        "{text}"
    );
    assert!(
        machine.gpu_instances(0).is_empty(),
        "GPU instance left behind"
    );
    assert!(backend.gpu(0).unwrap().mig.unwrap().devices.is_empty());

    // The same machine without the failure: the placement is free.
    let healthy = machine.sibling(&one_a100(""));
    let backend = healthy.open();
    let created = backend.create_mig_device(0, P_3G_40GB, at(0, 4)).unwrap();
    assert_eq!(created.placement, at(0, 4));
}

#[test]
fn a_failed_rollback_is_reported_with_both_errors() {
    let machine = Machine::from_yaml(&one_a100(
        "    fail: {nvmlGpuInstanceCreateComputeInstance: UNKNOWN, nvmlGpuInstanceDestroy: IN_USE}\n",
    ));
    let backend = machine.open();
    let err = backend
        .create_mig_device(0, P_3G_40GB, at(0, 4))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nvmlGpuInstanceCreateComputeInstance"),
        "{text}"
    );
    assert!(
        text.contains("rolling back the GPU instance also failed"),
        "{text}"
    );
}

#[test]
fn creating_on_a_gpu_without_mig_fails_cleanly() {
    let machine = Machine::shipped("mixed");
    let backend = machine.open();
    // GPU 0: H100 with MIG off; GPU 2: L4, not MIG capable.
    for gpu in [0, 2] {
        let err = backend
            .create_mig_device(gpu, P_1G_10GB, at(0, 1))
            .unwrap_err();
        assert!(
            matches!(err, Error::Call { gpu: Some(g), .. } if g == gpu),
            "{err}"
        );
    }
    // A GPU index that does not exist.
    let err = backend
        .create_mig_device(9, P_1G_10GB, at(0, 1))
        .unwrap_err();
    assert!(matches!(err, Error::Call { gpu: Some(9), .. }), "{err}");
    assert!(machine.gpu_instances(0).is_empty());
}

#[test]
fn mig_mode_takes_effect_at_once_on_hopper_and_stays_pending_on_ampere() {
    let machine = Machine::shipped("mixed");
    let backend = machine.open();
    backend.set_mig_mode(0, true).unwrap();
    let mig = backend.gpu(0).unwrap().mig.unwrap();
    assert!(mig.current_enabled && mig.pending_enabled);
    assert!(!mig.profiles.is_empty(), "profiles appear once MIG is on");
    backend.set_mig_mode(0, false).unwrap();
    assert!(!backend.gpu(0).unwrap().mig.unwrap().current_enabled);
    // Not MIG capable.
    assert!(backend.set_mig_mode(2, true).is_err());

    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    backend.set_mig_mode(4, true).unwrap();
    let mig = backend.gpu(4).unwrap().mig.unwrap();
    assert!(!mig.current_enabled, "Ampere needs a reset");
    assert!(mig.pending_enabled);
}

#[test]
fn compute_mode_changes_are_read_back() {
    let machine = Machine::shipped("t4-inference");
    let backend = machine.open();
    backend
        .set_compute_mode(1, ComputeMode::ExclusiveProcess)
        .unwrap();
    assert_eq!(
        backend.gpu(1).unwrap().compute_mode,
        ComputeMode::ExclusiveProcess
    );
    assert_eq!(backend.gpu(0).unwrap().compute_mode, ComputeMode::Default);
    backend
        .set_compute_mode(1, ComputeMode::Prohibited)
        .unwrap();
    assert_eq!(
        backend.gpu(1).unwrap().compute_mode,
        ComputeMode::Prohibited
    );
    backend.set_compute_mode(1, ComputeMode::Default).unwrap();
    assert_eq!(backend.gpu(1).unwrap().compute_mode, ComputeMode::Default);
}

/// The single queries (`compute_mode`, `mig_mode`) answer what the whole
/// read says, on every kind of GPU and after changes; the trait's defaults
/// (derived from `gpu`) answer the same.
#[test]
fn the_single_mode_queries_agree_with_the_whole_read() {
    fn check(backend: &dyn GpuBackend, gpu: u32) {
        let info = backend.gpu(gpu).unwrap();
        assert_eq!(backend.compute_mode(gpu).unwrap(), info.compute_mode);
        let mode = backend.mig_mode(gpu).unwrap();
        assert_eq!(
            mode.map(|m| (m.current_enabled, m.pending_enabled)),
            info.mig.map(|m| (m.current_enabled, m.pending_enabled)),
            "GPU {gpu}"
        );
    }
    // GPU 0: H100, MIG off; 1: H100, MIG on; 2 and 3: L4, not MIG capable.
    let machine = Machine::shipped("mixed");
    let backend = machine.open();
    assert_eq!(backend.mig_mode(2).unwrap(), None);
    let h100 = backend.mig_mode(0).unwrap().unwrap();
    assert!(!h100.current_enabled && !h100.pending_enabled);
    let h100 = backend.mig_mode(1).unwrap().unwrap();
    assert!(h100.current_enabled && h100.pending_enabled);
    for gpu in 0..4 {
        check(&backend, gpu);
        check(&Minimal(machine.open()), gpu);
    }
    backend.set_mig_mode(0, true).unwrap();
    backend
        .set_compute_mode(2, ComputeMode::ExclusiveProcess)
        .unwrap();
    let h100 = backend.mig_mode(0).unwrap().unwrap();
    assert!(h100.current_enabled && h100.pending_enabled);
    assert_eq!(
        backend.compute_mode(2).unwrap(),
        ComputeMode::ExclusiveProcess
    );
    for gpu in 0..4 {
        check(&backend, gpu);
    }
    // Ampere: the change waits for a reset, and the query says so.
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    backend.set_mig_mode(4, true).unwrap();
    let a100 = backend.mig_mode(4).unwrap().unwrap();
    assert!(!a100.current_enabled && a100.pending_enabled);
    check(&backend, 4);
    // A GPU that does not exist is an error naming it, not "no MIG".
    for err in [
        backend.mig_mode(9).unwrap_err(),
        backend.compute_mode(9).map(|_| ()).unwrap_err(),
    ] {
        assert!(matches!(err, Error::Call { gpu: Some(9), .. }), "{err}");
    }
}

#[test]
fn concurrent_mig_changes_on_different_gpus() {
    let machine = Machine::shipped("dgx-h100");
    let backend = Arc::new(machine.open());
    for gpu in 0..8 {
        backend.set_mig_mode(gpu, true).unwrap();
    }
    let threads: Vec<_> = (0..8)
        .map(|gpu| {
            let backend = Arc::clone(&backend);
            std::thread::spawn(move || {
                let mut made = Vec::new();
                for start in 0..7 {
                    made.push(
                        backend
                            .create_mig_device(gpu, P_1G_10GB, at(start, 1))
                            .unwrap(),
                    );
                }
                backend
                    .set_compute_mode(gpu, ComputeMode::ExclusiveProcess)
                    .unwrap();
                for d in made.iter().step_by(2) {
                    backend
                        .destroy_mig_device(gpu, d.gpu_instance_id, d.compute_instance_id)
                        .unwrap();
                }
                made
            })
        })
        .collect();
    let mut uuids = std::collections::HashSet::new();
    for (gpu, thread) in threads.into_iter().enumerate() {
        let made = thread.join().expect("no panic");
        assert_eq!(made.len(), 7);
        uuids.extend(made.into_iter().map(|d| d.uuid));
        let info = backend.gpu(gpu as u32).unwrap();
        assert_eq!(info.compute_mode, ComputeMode::ExclusiveProcess);
        let starts: Vec<u32> = info
            .mig
            .unwrap()
            .devices
            .iter()
            .map(|d| d.placement.start)
            .collect::<Vec<_>>();
        let mut starts = starts;
        starts.sort_unstable();
        assert_eq!(starts, [1, 3, 5], "GPU {gpu}");
    }
    assert_eq!(uuids.len(), 56);
}

/// Profile ids of the A100 80GB table not used above.
const P_2G_20GB: u32 = 14;
const P_1G_20GB: u32 = 15;

fn ids(instances: &[gpu_nvml::MigGpuInstance]) -> Vec<(u32, u32, MigPlacement, Vec<u32>)> {
    instances
        .iter()
        .map(|g| {
            (
                g.id,
                g.profile_id,
                g.placement,
                g.compute_instances.iter().map(|c| c.id).collect(),
            )
        })
        .collect()
}

#[test]
fn gpu_instances_are_listed_with_their_compute_instances() {
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    // GPU 2: 2g.20gb@0 (one CI), 1g.20gb@2 without CI, 3g.40gb@4 split into
    // two CIs. GI ids: quarters 3 (at 0) and 4 (at 2), the upper half 2.
    let listed = backend.gpu_instances(2).unwrap();
    assert_eq!(
        ids(&listed),
        [
            (2, P_3G_40GB, at(4, 4), vec![0, 1]),
            (3, P_2G_20GB, at(0, 2), vec![0]),
            (4, P_1G_20GB, at(2, 2), vec![]),
        ]
    );
    // UUIDs agree with the MIG devices NVML lists.
    let devices = backend.gpu(2).unwrap().mig.unwrap().devices;
    for gi in &listed {
        for ci in &gi.compute_instances {
            let device = devices
                .iter()
                .find(|d| d.gpu_instance_id == gi.id && d.compute_instance_id == ci.id)
                .unwrap();
            assert_eq!(ci.uuid.as_deref(), Some(device.uuid.as_str()));
        }
    }
    // GPU 1: seven 1g.10gb; GPU 3: none; GPU 4: MIG off; not there: error.
    assert_eq!(backend.gpu_instances(1).unwrap().len(), 7);
    assert!(backend.gpu_instances(3).unwrap().is_empty());
    assert!(backend.gpu_instances(4).unwrap().is_empty());
    assert!(matches!(
        backend.gpu_instances(9),
        Err(Error::Call { gpu: Some(9), .. })
    ));
    // No MIG at all.
    let t4 = Machine::shipped("t4-inference");
    assert!(t4.open().gpu_instances(0).unwrap().is_empty());
}

#[test]
fn whole_gpu_instances_are_destroyed_split_or_empty() {
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    // The split 3g.40gb (two compute instances) and the GI without CI.
    backend.destroy_gpu_instance(2, 2).unwrap();
    backend.destroy_gpu_instance(2, 4).unwrap();
    assert_eq!(
        ids(&backend.gpu_instances(2).unwrap()),
        [(3, P_2G_20GB, at(0, 2), vec![0])]
    );
    assert_eq!(machine.gpu_instances(2), [(3, 14, 0, 2)]);
    // Gone already: success.
    backend.destroy_gpu_instance(2, 2).unwrap();
    // The freed placements can be used again.
    backend.create_mig_device(2, P_3G_40GB, at(4, 4)).unwrap();
}

#[test]
fn a_failing_listing_names_the_call() {
    let machine = Machine::from_yaml(&one_a100(
        "    fail: {nvmlGpuInstanceGetComputeInstances: UNKNOWN}\n",
    ));
    let backend = machine.open();
    backend.create_mig_device(0, P_3G_40GB, at(0, 4)).unwrap();
    let err = backend.gpu_instances(0).unwrap_err().to_string();
    assert!(
        err.contains("nvmlGpuInstanceGetComputeInstances") && err.contains("GPU 0"),
        "{err}"
    );
}

#[test]
fn the_default_listing_sees_mig_devices_only() {
    let machine = Machine::shipped("dgx-a100");
    let minimal = Minimal(machine.open());
    // The GI without compute instance (4) is invisible to the default.
    assert_eq!(
        ids(&minimal.gpu_instances(2).unwrap()),
        [
            (2, P_3G_40GB, at(4, 4), vec![0, 1]),
            (3, P_2G_20GB, at(0, 2), vec![0]),
        ]
    );
    // One compute instance: destroyed; two: refused with a reason.
    minimal.destroy_gpu_instance(2, 3).unwrap();
    let err = minimal.destroy_gpu_instance(2, 2).unwrap_err().to_string();
    assert!(
        err.contains("GPU instance 2 with 2 compute instances"),
        "{err}"
    );
    assert_eq!(machine.gpu_instances(2), [(2, 9, 4, 4), (4, 15, 2, 2)]);
    // Unknown: nothing to do.
    minimal.destroy_gpu_instance(2, 11).unwrap();
}
