//! The real nvml-wrapper path of `NvmlBackend` against the project's fake
//! libnvidia-ml, one shipped machine profile per test: every GPU, its
//! identity, MIG profiles with placements, existing MIG devices and NVLinks.

mod common;

use std::collections::BTreeMap;

use common::Machine;
use gpu_nvml::{
    ComputeMode, GpuBackend, GpuInfo, MigPlacement, MigProfile, NvLinkInfo, NvLinkRemote,
};

const MIB: u64 = 1 << 20;

/// `nvidia-smi mig -lgip` names of an 80GB A100 or H100, sorted.
const NAMES_80GB: [&str; 7] = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
];

/// `nvidia-smi mig -lgip` names of a 40GB A100, sorted.
const NAMES_40GB: [&str; 7] = [
    "1g.10gb",
    "1g.5gb",
    "1g.5gb+me",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
];

fn all_gpus(backend: &dyn GpuBackend) -> Vec<GpuInfo> {
    let count = backend.gpu_count().expect("GPU count");
    (0..count)
        .map(|i| backend.gpu(i).unwrap_or_else(|e| panic!("GPU {i}: {e}")))
        .collect()
}

fn profiles_by_name(gpu: &GpuInfo) -> BTreeMap<String, MigProfile> {
    let mig = gpu.mig.as_ref().expect("MIG capable");
    let map: BTreeMap<_, _> = mig
        .profiles
        .iter()
        .map(|p| (p.name.clone(), p.clone()))
        .collect();
    assert_eq!(
        map.len(),
        mig.profiles.len(),
        "profile names are unique: {:?}",
        mig.profiles
    );
    map
}

fn starts(profile: &MigProfile) -> Vec<u32> {
    profile.placements.iter().map(|p| p.start).collect()
}

fn sizes(profile: &MigProfile) -> Vec<u32> {
    profile.placements.iter().map(|p| p.size).collect()
}

#[test]
fn dgx_a100_every_gpu_mig_table_and_existing_mig_devices() {
    let machine = Machine::shipped("dgx-a100");
    let backend = machine.open();
    let system = backend.system().unwrap();
    assert_eq!(system.driver_version, "580.95.05");
    assert_eq!(system.cuda_driver_version, (13, 0));

    let gpus = all_gpus(&backend);
    assert_eq!(gpus.len(), 8);
    let bus_ids: Vec<&str> = gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
    assert_eq!(
        bus_ids,
        [
            "0000:07:00.0",
            "0000:0f:00.0",
            "0000:47:00.0",
            "0000:4e:00.0",
            "0000:87:00.0",
            "0000:90:00.0",
            "0000:b7:00.0",
            "0000:bd:00.0"
        ]
    );
    for (i, gpu) in gpus.iter().enumerate() {
        assert_eq!(gpu.index, i as u32);
        assert_eq!(gpu.minor, i as u32);
        assert_eq!(gpu.product_name, "NVIDIA A100-SXM4-80GB");
        assert_eq!(gpu.brand, "Nvidia");
        assert_eq!(gpu.architecture, "Ampere");
        assert_eq!(gpu.cuda_compute_capability, (8, 0));
        assert_eq!(gpu.memory_bytes, 81920 * MIB);
        assert_eq!(gpu.compute_mode, ComputeMode::Default);
        assert_eq!(gpu.addressing_mode, None);
        assert!(gpu.uuid.starts_with("GPU-"), "{}", gpu.uuid);
        // 12 links into the NVSwitches, which have no bus id NVML reports
        // (the sentinel): classified by the remote device type.
        let expected: Vec<NvLinkInfo> = (0..12)
            .map(|link| NvLinkInfo {
                link,
                remote: NvLinkRemote::Switch,
                remote_pci_bus_id: None,
            })
            .collect();
        assert_eq!(gpu.nvlinks, expected);
        // Ampere: no fabric info; the switches join every pair by P2P.
        assert_eq!(gpu.fabric, None);
        let mut others: Vec<&str> = gpus
            .iter()
            .filter(|g| g.index != gpu.index)
            .map(|g| g.uuid.as_str())
            .collect();
        others.sort_unstable();
        assert_eq!(gpu.nvlink_p2p_peers, others, "GPU {i}");

        let mig = gpu.mig.as_ref().unwrap();
        assert_eq!(mig.current_enabled, i < 4, "GPU {i}");
        assert_eq!(mig.pending_enabled, i < 4, "GPU {i}");
        // Profiles are hardware facts, listed whatever the MIG mode.
        let profiles = profiles_by_name(gpu);
        assert_eq!(
            profiles.keys().map(String::as_str).collect::<Vec<_>>(),
            NAMES_80GB
        );
        let p = &profiles["1g.10gb"];
        assert_eq!(
            (p.id, p.slice_count, p.instance_count, p.memory_mib),
            (19, 1, 7, 9728)
        );
        assert_eq!((p.multiprocessors, p.copy_engines, p.decoders), (14, 1, 0));
        assert_eq!(starts(p), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(sizes(p), [1; 7]);
        let me = &profiles["1g.10gb+me"];
        assert_eq!(
            (me.id, me.instance_count, me.jpeg_engines, me.ofa_engines),
            (20, 1, 1, 1)
        );
        assert_eq!(starts(&profiles["1g.20gb"]), [0, 2, 4, 6]);
        assert_eq!(sizes(&profiles["1g.20gb"]), [2; 4]);
        assert_eq!(starts(&profiles["2g.20gb"]), [0, 2, 4]);
        assert_eq!(starts(&profiles["3g.40gb"]), [0, 4]);
        assert_eq!(sizes(&profiles["3g.40gb"]), [4, 4]);
        let full = &profiles["7g.80gb"];
        assert_eq!(full.placements, [MigPlacement { start: 0, size: 8 }]);
        assert_eq!(
            (full.id, full.multiprocessors, full.memory_mib),
            (0, 98, 80640)
        );
    }

    // GPU 0: 4g.40gb at 0 and 3g.40gb at 4.
    let devices = &gpus[0].mig.as_ref().unwrap().devices;
    let summary: Vec<(u32, MigPlacement)> = devices
        .iter()
        .map(|d| (d.profile_id, d.placement))
        .collect();
    assert_eq!(
        summary,
        [
            (5, MigPlacement { start: 0, size: 4 }),
            (9, MigPlacement { start: 4, size: 4 })
        ]
    );
    // GPU 1: seven 1g.10gb, one per slice, each with its own GPU instance.
    let devices = &gpus[1].mig.as_ref().unwrap().devices;
    assert_eq!(devices.len(), 7);
    let mut placements: Vec<u32> = devices.iter().map(|d| d.placement.start).collect();
    placements.sort_unstable();
    assert_eq!(placements, [0, 1, 2, 3, 4, 5, 6]);
    assert!(
        devices
            .iter()
            .all(|d| d.profile_id == 19 && d.placement.size == 1)
    );
    let mut gis: Vec<u32> = devices.iter().map(|d| d.gpu_instance_id).collect();
    gis.dedup();
    assert_eq!(gis.len(), 7, "one GPU instance per device: {devices:?}");
    // GPU 2: 2g.20gb, plus a 3g.40gb split into two compute instances; the
    // 1g.20gb without a compute instance is no MIG device.
    let mut devices = gpus[2].mig.as_ref().unwrap().devices.clone();
    assert_eq!(devices.len(), 3, "{devices:?}");
    devices.sort_by_key(|d| (d.placement.start, d.compute_instance_id));
    assert_eq!(devices[0].profile_id, 14);
    assert_eq!(devices[0].placement, MigPlacement { start: 0, size: 2 });
    for split in &devices[1..] {
        assert_eq!(split.profile_id, 9);
        assert_eq!(split.placement, MigPlacement { start: 4, size: 4 });
    }
    assert_eq!(devices[1].gpu_instance_id, devices[2].gpu_instance_id);
    assert_ne!(
        devices[1].compute_instance_id,
        devices[2].compute_instance_id
    );
    // Each reports how much of its GPU instance it takes: the 2g.20gb's
    // compute instance all of it, the split 3g.40gb's 1 and 2 of 3 slices.
    let slices = |d: &gpu_nvml::MigDevice| {
        let s = d.compute_slices.expect("MIG attributes reported");
        (s.gpu_instance, s.compute_instance, s.spans_gpu_instance())
    };
    assert_eq!(slices(&devices[0]), (2, 2, true));
    let mut split: Vec<_> = devices[1..].iter().map(slices).collect();
    split.sort_unstable();
    assert_eq!(split, [(3, 1, false), (3, 2, false)]);
    // The order is by GPU instance id, then compute instance id.
    let listed = &gpus[2].mig.as_ref().unwrap().devices;
    assert!(
        listed
            .windows(2)
            .all(|w| (w[0].gpu_instance_id, w[0].compute_instance_id)
                < (w[1].gpu_instance_id, w[1].compute_instance_id))
    );
    // GPU 3: MIG on, nothing created; GPUs 4-7: MIG off.
    for gpu in &gpus[3..] {
        assert!(
            gpu.mig.as_ref().unwrap().devices.is_empty(),
            "GPU {}",
            gpu.index
        );
    }
    // Every MIG device has its own MIG UUID and a plausible memory size.
    let mut uuids = std::collections::HashSet::new();
    for gpu in &gpus {
        for d in &gpu.mig.as_ref().unwrap().devices {
            assert!(d.uuid.starts_with("MIG-"), "{}", d.uuid);
            assert!(uuids.insert(d.uuid.clone()), "duplicate {}", d.uuid);
            assert!(
                d.memory_bytes > 0 && d.memory_bytes <= gpu.memory_bytes,
                "{d:?}"
            );
        }
    }
    assert_eq!(uuids.len(), 2 + 7 + 3);
}

#[test]
fn dgx_h100_hopper_with_eighteen_links_and_mig_off() {
    let machine = Machine::shipped("dgx-h100");
    let backend = machine.open();
    let gpus = all_gpus(&backend);
    assert_eq!(gpus.len(), 8);
    for gpu in &gpus {
        assert_eq!(gpu.product_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpu.architecture, "Hopper");
        assert_eq!(gpu.cuda_compute_capability, (9, 0));
        assert_eq!(gpu.memory_bytes, 81559 * MIB);
        assert_eq!(gpu.nvlinks.len(), 18, "GPU {}", gpu.index);
        // Every link ends at a switch; the sentinel bus id is no peer.
        common::assert_links_end_at_switches(gpu);
        // Hopper HGX: fabric state "not supported", so P2P joins the GPUs.
        assert_eq!(gpu.fabric, None);
        assert_eq!(gpu.nvlink_p2p_peers.len(), 7, "GPU {}", gpu.index);
        assert!(!gpu.nvlink_p2p_peers.contains(&gpu.uuid));
        let mig = gpu.mig.as_ref().unwrap();
        assert!(!mig.current_enabled && !mig.pending_enabled);
        assert!(mig.devices.is_empty());
        let names: Vec<&str> = mig.profiles.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.contains(&"1g.10gb") && names.contains(&"7g.80gb"),
            "profiles are listed while MIG is off (dynamic MIG needs them): {names:?}"
        );
    }
    let uuids: std::collections::HashSet<_> = gpus.iter().map(|g| &g.uuid).collect();
    assert_eq!(uuids.len(), 8);
}

#[test]
fn pcie_a100_bridged_pairs_and_40gb_profile_names() {
    let machine = Machine::shipped("pcie-a100-bridged");
    let backend = machine.open();
    let gpus = all_gpus(&backend);
    assert_eq!(gpus.len(), 4);
    let peers = [
        "0000:31:00.0",
        "0000:17:00.0",
        "0000:ca:00.0",
        "0000:b1:00.0",
    ];
    for (gpu, peer) in gpus.iter().zip(peers) {
        assert_eq!(gpu.product_name, "NVIDIA A100-PCIE-40GB");
        assert_eq!(gpu.memory_bytes, 40960 * MIB);
        assert_eq!(gpu.nvlinks.len(), 12);
        assert!(
            gpu.nvlinks
                .iter()
                .all(|l| l.remote == NvLinkRemote::Gpu
                    && l.remote_pci_bus_id.as_deref() == Some(peer)),
            "{:?}",
            gpu.nvlinks
        );
        // Bridges only: no switch, so no P2P peers are read.
        assert!(gpu.nvlink_p2p_peers.is_empty() && gpu.fabric.is_none());
        assert!(!gpu.mig.as_ref().unwrap().current_enabled);
    }
}

#[test]
fn a100_40gb_profile_names_follow_nvidia_smi() {
    let machine = Machine::from_yaml(
        r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: A100-PCIE-40GB
    uuid: GPU-907a70c3-1012-4037-b64c-e4228c38fb29
    pciBusId: "0000:17:00.0"
    minor: 0
    numaNode: 0
    pcieRoot: pci0000:16
    mig: {current: true}
"#,
    );
    let gpu = machine.open().gpu(0).unwrap();
    let profiles = profiles_by_name(&gpu);
    assert_eq!(
        profiles.keys().map(String::as_str).collect::<Vec<_>>(),
        NAMES_40GB
    );
    // The 1g profile with twice the memory takes two memory slices.
    assert_eq!(profiles["1g.10gb"].id, 15);
    assert_eq!(sizes(&profiles["1g.10gb"]), [2; 4]);
    assert_eq!(starts(&profiles["1g.5gb+me"]), [0, 1, 2, 3, 4, 5, 6]);
}

#[test]
fn t4_node_has_no_mig_and_no_nvlink() {
    let machine = Machine::shipped("t4-inference");
    let backend = machine.open();
    let gpus = all_gpus(&backend);
    assert_eq!(gpus.len(), 4);
    for gpu in &gpus {
        assert_eq!(gpu.product_name, "Tesla T4");
        assert_eq!(gpu.architecture, "Turing");
        assert_eq!(gpu.cuda_compute_capability, (7, 5));
        assert_eq!(gpu.memory_bytes, 15360 * MIB);
        assert_eq!(gpu.mig, None);
        assert!(gpu.nvlinks.is_empty());
    }
    assert_eq!(
        gpus.iter()
            .map(|g| g.pci_bus_id.as_str())
            .collect::<Vec<_>>(),
        [
            "0000:3d:00.0",
            "0000:3e:00.0",
            "0000:3f:00.0",
            "0000:40:00.0"
        ]
    );
}

#[test]
fn mixed_node_h100_and_l4() {
    let machine = Machine::shipped("mixed");
    let backend = machine.open();
    let gpus = all_gpus(&backend);
    assert_eq!(gpus.len(), 4);
    let h100_off = gpus[0].mig.as_ref().unwrap();
    assert!(!h100_off.current_enabled);
    let h100_on = gpus[1].mig.as_ref().unwrap();
    assert!(h100_on.current_enabled);
    assert_eq!(h100_on.devices.len(), 1);
    assert_eq!(h100_on.devices[0].profile_id, 9);
    assert_eq!(
        h100_on.devices[0].placement,
        MigPlacement { start: 0, size: 4 }
    );
    let profiles = profiles_by_name(&gpus[1]);
    assert_eq!(
        profiles.keys().map(String::as_str).collect::<Vec<_>>(),
        NAMES_80GB
    );
    assert_eq!(profiles["7g.80gb"].multiprocessors, 132);
    assert_eq!(profiles["1g.20gb"].memory_mib, 20096);
    for l4 in &gpus[2..] {
        assert_eq!(l4.product_name, "NVIDIA L4");
        assert_eq!(l4.architecture, "Ada Lovelace");
        assert_eq!(l4.cuda_compute_capability, (8, 9));
        assert_eq!(l4.mig, None);
    }
}

#[test]
fn addressing_and_compute_modes_and_brands_from_the_profile() {
    let machine = Machine::from_yaml(
        r#"
driverVersion: "570.124.06"
cudaDriverVersion: 12080
gpus:
  - model: H100-SXM5-80GB
    uuid: GPU-11111111-2222-3333-4444-555555555555
    pciBusId: "0000:1B:00.0"
    minor: 4
    numaNode: 0
    pcieRoot: pci0000:15
    addressingMode: ATS
    computeMode: ExclusiveProcess
  - model: L4
    uuid: GPU-66666666-7777-8888-9999-000000000000
    pciBusId: "0001:02:00.0"
    minor: 1
    numaNode: -1
    pcieRoot: pci0001:00
    addressingMode: None
    computeMode: Prohibited
    overrides: {brand: Tesla}
"#,
    );
    let backend = machine.open();
    assert_eq!(backend.system().unwrap().cuda_driver_version, (12, 8));
    let gpus = all_gpus(&backend);
    assert_eq!(gpus[0].pci_bus_id, "0000:1b:00.0");
    assert_eq!(gpus[0].minor, 4);
    assert_eq!(gpus[0].addressing_mode.as_deref(), Some("ATS"));
    assert_eq!(gpus[0].compute_mode, ComputeMode::ExclusiveProcess);
    assert_eq!(gpus[1].pci_bus_id, "0001:02:00.0");
    assert_eq!(gpus[1].addressing_mode, None);
    assert_eq!(gpus[1].compute_mode, ComputeMode::Prohibited);
    assert_eq!(gpus[1].brand, "Tesla");
}
