//! Hand-built inventories for unit tests, mirroring the fake NVML profiles
//! (H100 with its MIG profile table, A100 PCIe with NVLink bridges).

use super::*;
use gpu_dra_api::schema::AttributeValue;
use gpu_nvml::{
    ComputeMode, GpuInfo, MigDevice, MigInfo, MigPlacement, MigProfile, NvLinkInfo, NvLinkRemote,
    SystemInfo,
};

pub(crate) fn system() -> SystemInfo {
    SystemInfo {
        driver_version: "580.95.05".into(),
        cuda_driver_version: (13, 0),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn profile(
    id: u32,
    name: &str,
    slices: u32,
    count: u32,
    sm: u32,
    engines: (u32, u32, u32, u32, u32),
    mem_mib: u64,
    starts: &[u32],
) -> MigProfile {
    MigProfile {
        id,
        name: name.into(),
        slice_count: slices,
        instance_count: count,
        multiprocessors: sm,
        copy_engines: engines.0,
        decoders: engines.1,
        encoders: engines.2,
        jpeg_engines: engines.3,
        ofa_engines: engines.4,
        memory_mib: mem_mib,
        placements: starts
            .iter()
            .map(|&start| MigPlacement {
                start,
                size: slices_to_mem(name, slices),
            })
            .collect(),
    }
}

/// Memory slices of a placement: the `Ng` part for most profiles, but
/// `1g.20gb` covers two memory slices and the 7g profile all eight.
pub(crate) fn slices_to_mem(name: &str, slices: u32) -> u32 {
    match name {
        "1g.20gb" => 2,
        n if n.starts_with("7g") => 8,
        n if n.starts_with("3g") => 4,
        _ => slices,
    }
}

pub(crate) fn h100_profiles() -> Vec<MigProfile> {
    vec![
        profile(
            19,
            "1g.10gb",
            1,
            7,
            16,
            (1, 1, 0, 1, 0),
            9856,
            &[0, 1, 2, 3, 4, 5, 6],
        ),
        profile(
            20,
            "1g.10gb+me",
            1,
            1,
            16,
            (1, 1, 0, 1, 1),
            9856,
            &[0, 1, 2, 3, 4, 5, 6],
        ),
        profile(
            15,
            "1g.20gb",
            1,
            4,
            26,
            (1, 1, 0, 1, 0),
            19968,
            &[0, 2, 4, 6],
        ),
        profile(14, "2g.20gb", 2, 3, 32, (2, 2, 0, 2, 0), 19968, &[0, 2, 4]),
        profile(9, "3g.40gb", 3, 2, 60, (3, 3, 0, 3, 0), 40448, &[0, 4]),
        profile(5, "4g.40gb", 4, 1, 64, (4, 4, 0, 4, 0), 40448, &[0]),
        profile(0, "7g.80gb", 7, 1, 132, (8, 7, 0, 7, 1), 80896, &[0]),
    ]
}

pub(crate) fn gpu(
    index: u32,
    arch: (&str, (u32, u32)),
    mig: Option<MigInfo>,
    links: &[&str],
) -> DiscoveredGpu {
    DiscoveredGpu {
        info: GpuInfo {
            index,
            minor: index,
            uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            brand: "Nvidia".into(),
            architecture: arch.0.into(),
            cuda_compute_capability: arch.1,
            memory_bytes: 81_559 << 20,
            pci_bus_id: format!("0000:{:02x}:00.0", index + 1),
            addressing_mode: None,
            compute_mode: ComputeMode::Default,
            mig,
            nvlinks: links
                .iter()
                .enumerate()
                .map(|(i, r)| link(i as u32, r))
                .collect(),
            fabric: None,
            nvlink_p2p_peers: Vec::new(),
        },
        pcie_root: Some(format!("pci0000:{:02x}", index * 16)),
        numa_node: Some(i64::from(index / 4)),
    }
}

/// Link `link` to the device at bus id `remote`: a peer GPU, or an NVSwitch
/// when `remote` is NVML's sentinel (any case), as the NVML backend
/// classifies them.
pub(crate) fn link(link: u32, remote: &str) -> NvLinkInfo {
    if remote.eq_ignore_ascii_case(gpu_nvml::topology::SWITCH_SENTINEL_BUS_ID) {
        NvLinkInfo {
            link,
            remote: NvLinkRemote::Switch,
            remote_pci_bus_id: None,
        }
    } else {
        NvLinkInfo {
            link,
            remote: NvLinkRemote::Gpu,
            remote_pci_bus_id: Some(remote.into()),
        }
    }
}

pub(crate) const HOPPER: (&str, (u32, u32)) = ("Hopper", (9, 0));
pub(crate) const AMPERE: (&str, (u32, u32)) = ("Ampere", (8, 0));

pub(crate) fn mig_info(enabled: bool, devices: Vec<MigDevice>) -> MigInfo {
    MigInfo {
        current_enabled: enabled,
        pending_enabled: enabled,
        profiles: h100_profiles(),
        devices,
    }
}

pub(crate) fn inventory(gpus: Vec<DiscoveredGpu>) -> Inventory {
    Inventory {
        system: system(),
        gpus,
    }
}

pub(crate) fn attr<'a>(d: &'a Device, name: &str) -> Option<&'a AttributeValue> {
    d.attributes.attributes.get(name)
}

pub(crate) fn s(v: &str) -> AttributeValue {
    AttributeValue::String(v.into())
}

pub(crate) fn dynamic() -> BuildOptions {
    BuildOptions {
        dynamic_mig: true,
        group_limits: GroupLimits::default(),
        memory_sharing: MemorySharing::None,
        consumable_shares: crate::devices::ConsumableShares::Disabled,
        passthrough: None,
    }
}

/// A DGX H100 like node: 8 H100 GPUs, each with 18 active NVLinks to four
/// NVSwitches, MIG mode as given, no MIG devices.
pub(crate) fn dgx_h100(mig_enabled: bool) -> Inventory {
    let switches = [
        "0000:f0:00.0",
        "0000:f1:00.0",
        "0000:f2:00.0",
        "0000:f3:00.0",
    ];
    let links: Vec<&str> = (0..18).map(|i| switches[i % 4]).collect();
    inventory(
        (0..8)
            .map(|i| gpu(i, HOPPER, Some(mig_info(mig_enabled, vec![])), &links))
            .collect(),
    )
}

/// A node like the pcie-a100-bridged profile: 4 A100 PCIe GPUs, NVLink
/// bridges (12 links each) joining GPUs 0+1 and 2+3, MIG off.
pub(crate) fn pcie_a100_bridged() -> Inventory {
    let peer = |i: u32| format!("0000:{:02x}:00.0", (i ^ 1) + 1);
    let peers: Vec<String> = (0..4).map(peer).collect();
    inventory(
        (0..4)
            .map(|i| {
                let links: Vec<&str> = vec![peers[i as usize].as_str(); 12];
                let mut g = gpu(i, AMPERE, None, &links);
                g.info.product_name = "NVIDIA A100-PCIE-40GB".into();
                g.info.memory_bytes = 40_960 << 20;
                g
            })
            .collect(),
    )
}
