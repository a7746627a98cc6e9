//! NVLink topology through the real backend over the fake NVML: switch links
//! classified by the remote device type (the sentinel bus id never becomes a
//! peer), fabric membership on GB200, P2P NVLink peers as the fallback, and
//! what is left when NVML's answers are missing or fail.

mod common;

use common::{Machine, profile_text};
use gpu_nvml::{FabricInfo, GpuBackend, GpuInfo, NvLinkRemote};

fn all_gpus(backend: &dyn GpuBackend) -> Vec<GpuInfo> {
    (0..backend.gpu_count().unwrap())
        .map(|i| backend.gpu(i).unwrap())
        .collect()
}

#[test]
fn gb200_gpus_are_one_fabric_clique_behind_switches() {
    let machine = Machine::shipped("gb200-nvl");
    let gpus = all_gpus(&machine.open());
    assert_eq!(gpus.len(), 4);
    for gpu in &gpus {
        assert_eq!(gpu.architecture, "Blackwell");
        assert_eq!(gpu.nvlinks.len(), 18);
        common::assert_links_end_at_switches(gpu);
        let fabric = gpu.fabric.as_ref().unwrap();
        assert_eq!(
            fabric,
            &FabricInfo {
                cluster_uuid: "09b319a2-e553-400e-b9ab-1ff0bd7d7daf".into(),
                clique_id: 1,
            }
        );
        assert_eq!(fabric.clique(), "09b319a2-e553-400e-b9ab-1ff0bd7d7daf.1");
        // The fabric decides; P2P is not asked.
        assert!(gpu.nvlink_p2p_peers.is_empty());
    }
}

#[test]
fn without_the_device_type_the_sentinel_still_means_a_switch() {
    let yaml = profile_text("dgx-h100").replacen(
        "nvswitches:",
        "fail: {nvmlDeviceGetNvLinkRemoteDeviceType: NOT_SUPPORTED}\nnvswitches:",
        1,
    );
    let machine = Machine::from_yaml(&yaml);
    let gpus = all_gpus(&machine.open());
    for gpu in &gpus {
        assert_eq!(gpu.nvlinks.len(), 18);
        common::assert_links_end_at_switches(gpu);
        assert_eq!(gpu.nvlink_p2p_peers.len(), 7);
    }
}

#[test]
fn failing_link_and_fabric_queries_keep_every_active_link() {
    // The remote end unreadable: the link still counts, far end unknown
    // but typed by NVML; a failing fabric call means no clique, and the
    // switch links fall back to P2P.
    let yaml = profile_text("gb200-nvl").replacen(
        "gpus:",
        "fail: {nvmlDeviceGetNvLinkRemotePciInfo: UNKNOWN, nvmlDeviceGetGpuFabricInfoV: UNKNOWN}\ngpus:",
        1,
    );
    let machine = Machine::from_yaml(&yaml);
    let gpus = all_gpus(&machine.open());
    for gpu in &gpus {
        assert_eq!(gpu.nvlinks.len(), 18);
        assert!(gpu.nvlinks.iter().all(|l| l.remote == NvLinkRemote::Switch));
        assert_eq!(gpu.fabric, None);
        assert_eq!(gpu.nvlink_p2p_peers.len(), 3);
    }
}

#[test]
fn an_old_driver_without_the_versioned_fabric_call_uses_the_plain_one() {
    let yaml = profile_text("gb200-nvl").replacen(
        "gpus:",
        "fail: {nvmlDeviceGetGpuFabricInfoV: FUNCTION_NOT_FOUND}\ngpus:",
        1,
    );
    let machine = Machine::from_yaml(&yaml);
    let gpu = machine.open().gpu(2).unwrap();
    assert_eq!(gpu.fabric.as_ref().map(|f| f.clique_id), Some(1));
}

#[test]
fn an_unfinished_fabric_registration_is_no_clique() {
    let yaml =
        profile_text("gb200-nvl").replacen("cliqueId: 1}", "cliqueId: 1, state: InProgress}", 1);
    let machine = Machine::from_yaml(&yaml);
    let gpus = all_gpus(&machine.open());
    for gpu in &gpus {
        assert_eq!(gpu.fabric, None);
        // The switches still join them through P2P.
        assert_eq!(gpu.nvlink_p2p_peers.len(), 3);
    }
}
