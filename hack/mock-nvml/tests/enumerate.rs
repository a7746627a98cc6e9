//! Every bundled profile enumerates through nvml-wrapper exactly as the
//! profile and the hardware tables say: identity, PCI, memory, MIG mode,
//! NVLinks, topology.
// Raw calls where nvml-wrapper 0.13 is broken (remote_device_type writes into
// a temporary and always returns Unknown).
#![allow(unsafe_code)]

mod common;

use common::Fake;
use nvidia_ml::fixture::{BUNDLED_PROFILES, bundled_profile};
use nvidia_ml::profile::Profile;
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Brand, ComputeMode, P2pCapabilitiesIndex, P2pStatus, TopologyLevel,
};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

/// What the driver reads of every GPU, in one comparable record.
#[derive(Debug, PartialEq)]
struct Seen {
    name: String,
    uuid: String,
    bus_id: String,
    minor: u32,
    index: u32,
    memory_mib: u64,
    active_nvlinks: usize,
}

fn seen(d: &Device<'_>) -> Seen {
    let active_nvlinks = (0..18)
        .filter(|l| d.link_wrapper_for(*l).is_active().unwrap_or(false))
        .count();
    Seen {
        name: d.name().unwrap(),
        uuid: d.uuid().unwrap(),
        bus_id: d.pci_info().unwrap().bus_id,
        minor: d.minor_number().unwrap(),
        index: d.index().unwrap(),
        memory_mib: d.memory_info().unwrap().total / (1024 * 1024),
        active_nvlinks,
    }
}

#[test]
fn every_profile_enumerates_as_written() {
    for name in BUNDLED_PROFILES {
        let profile = Profile::load(&bundled_profile(name)).unwrap();
        let fake = Fake::bundled(name);
        let nvml = fake.nvml();
        assert_eq!(nvml.sys_driver_version().unwrap(), "580.95.05", "{name}");
        assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000, "{name}");
        assert_eq!(nvml.sys_nvml_version().unwrap(), "13.580.95.05", "{name}");
        assert_eq!(
            nvml.device_count().unwrap() as usize,
            profile.gpus.len(),
            "{name}"
        );
        for (i, gpu) in profile.gpus.iter().enumerate() {
            let d = nvml.device_by_index(i as u32).unwrap();
            let expected = Seen {
                name: gpu.model.name.clone(),
                uuid: gpu.uuid.clone(),
                bus_id: gpu.pci.nvml(),
                minor: gpu.minor,
                index: i as u32,
                memory_mib: gpu.model.memory_mib,
                active_nvlinks: gpu.nvlinks.len(),
            };
            assert_eq!(seen(&d), expected, "{name} GPU {i}");
            // the same GPU by UUID and by PCI address, in sysfs spelling
            assert_eq!(
                nvml.device_by_uuid(gpu.uuid.as_str())
                    .unwrap()
                    .index()
                    .unwrap(),
                i as u32
            );
            assert_eq!(
                nvml.device_by_pci_bus_id(gpu.pci.sysfs())
                    .unwrap()
                    .index()
                    .unwrap(),
                i as u32
            );
            let numa = d.numa_node_id().unwrap();
            assert_eq!(i64::from(numa), i64::from(gpu.numa_node), "{name} GPU {i}");
            assert_eq!(d.compute_mode().unwrap(), ComputeMode::Default);
        }
    }
}

#[test]
fn products_report_real_identities() {
    let cases = [
        (
            "dgx-h100",
            "NVIDIA H100 80GB HBM3",
            DeviceArchitecture::Hopper,
            (9, 0),
            81559,
        ),
        (
            "dgx-a100",
            "NVIDIA A100-SXM4-80GB",
            DeviceArchitecture::Ampere,
            (8, 0),
            81920,
        ),
        (
            "pcie-a100-bridged",
            "NVIDIA A100-PCIE-40GB",
            DeviceArchitecture::Ampere,
            (8, 0),
            40960,
        ),
        (
            "t4-inference",
            "Tesla T4",
            DeviceArchitecture::Turing,
            (7, 5),
            15360,
        ),
    ];
    for (profile, product, arch, (major, minor), mib) in cases {
        let fake = Fake::bundled(profile);
        let nvml = fake.nvml();
        let d = nvml.device_by_index(0).unwrap();
        assert_eq!(d.name().unwrap(), product);
        assert_eq!(d.architecture().unwrap(), arch, "{profile}");
        assert_eq!(d.brand().unwrap(), Brand::Nvidia, "{profile}");
        let cc = d.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), (major, minor), "{profile}");
        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, mib * 1024 * 1024);
        assert_eq!(mem.free + mem.used, mem.total);
        let pci = d.pci_info().unwrap();
        assert_eq!(pci.pci_device_id & 0xffff, 0x10de, "NVIDIA vendor id");
        assert!(pci.bus_id.starts_with("00000000:"), "{}", pci.bus_id);
        assert_eq!(d.serial().unwrap().len(), 13);
    }
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let l4 = nvml.device_by_index(2).unwrap();
    assert_eq!(l4.name().unwrap(), "NVIDIA L4");
    assert_eq!(l4.architecture().unwrap(), DeviceArchitecture::Ada);
    let cc = l4.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (8, 9));
}

#[test]
fn mig_mode_is_reported_per_gpu() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    for i in 0..8 {
        let mode = nvml.device_by_index(i).unwrap().mig_mode().unwrap();
        let on = u32::from(i < 4);
        assert_eq!((mode.current, mode.pending), (on, on), "GPU {i}");
    }
    let fake = Fake::bundled("t4-inference");
    let nvml = fake.nvml();
    let t4 = nvml.device_by_index(0).unwrap();
    assert!(matches!(t4.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        t4.mig_device_count(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(t4.profile_info(0), Err(NvmlError::NotSupported)));
    assert!(!t4.mig_is_mig_device_handle().unwrap());
}

#[test]
fn nvswitch_fabric_connects_every_pair() {
    let fake = Fake::bundled("dgx-h100");
    let nvml = fake.nvml();
    let gpus: Vec<Device<'_>> = (0..8).map(|i| nvml.device_by_index(i).unwrap()).collect();
    for a in &gpus {
        let link = a.link_wrapper_for(0);
        assert_eq!(link.version().unwrap(), 6, "NVML_NVLINK_VERSION_4_0");
        // An NVSwitch is no PCI device of the node: NVML reports the sentinel.
        let remote = link.remote_pci_info().unwrap();
        assert_eq!(remote.bus_id, "FFFFFFFF:FF:FF.0");
        assert_eq!(
            (remote.domain, remote.bus, remote.device),
            (0xFFFF_FFFF, 0xFF, 0xFF)
        );
        assert_eq!(
            common::remote_device_type(&nvml, a, 0),
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
        );
        for b in &gpus {
            assert_eq!(common::nvlink_p2p(a, b), P2pStatus::Ok);
        }
    }
    // links past the chip's 18 are invalid, not inactive
    assert!(matches!(
        gpus[0].link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));
    assert_eq!(
        gpus[0]
            .topology_common_ancestor(nvml.device_by_index(7).unwrap())
            .unwrap(),
        TopologyLevel::System
    );
    assert_eq!(
        gpus[0]
            .topology_common_ancestor(nvml.device_by_index(1).unwrap())
            .unwrap(),
        TopologyLevel::Node
    );
}

#[test]
fn nvlink_bridges_join_only_their_pair() {
    let fake = Fake::bundled("pcie-a100-bridged");
    let nvml = fake.nvml();
    let g: Vec<Device<'_>> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    let peer = |d: &Device<'_>| d.link_wrapper_for(0).remote_pci_info().unwrap().bus_id;
    assert_eq!(peer(&g[0]), g[1].pci_info().unwrap().bus_id);
    assert_eq!(peer(&g[3]), g[2].pci_info().unwrap().bus_id);
    assert_eq!(
        common::remote_device_type(&nvml, &g[0], 0),
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
    );
    assert_eq!(common::nvlink_p2p(&g[0], &g[1]), P2pStatus::Ok);
    assert_eq!(common::nvlink_p2p(&g[1], &g[2]), P2pStatus::NotSupported);
    assert_eq!(
        g[1].p2p_status(&g[2], P2pCapabilitiesIndex::Read).unwrap(),
        P2pStatus::ChipsetNotSupported
    );
    assert_eq!(g[0].numa_node_id().unwrap(), 0);
    assert_eq!(g[3].numa_node_id().unwrap(), 1);
    // links 12..18 do not exist on A100
    assert!(matches!(
        g[0].link_wrapper_for(12).is_active(),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn t4s_have_no_nvlink_and_share_a_switch() {
    let fake = Fake::bundled("t4-inference");
    let nvml = fake.nvml();
    let a = nvml.device_by_index(0).unwrap();
    let b = nvml.device_by_index(3).unwrap();
    assert!(matches!(
        a.link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(
        a.topology_common_ancestor(b).unwrap(),
        TopologyLevel::Single
    );
}

#[test]
fn lookups_of_unknown_devices_fail_like_nvml() {
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    assert!(matches!(
        nvml.device_by_index(4),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("0000:99:00.0"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("not-an-address"),
        Err(NvmlError::InvalidArg)
    ));
    // upper case and the 8-digit domain are accepted
    assert_eq!(
        nvml.device_by_pci_bus_id("00000000:3C:00.0")
            .unwrap()
            .index()
            .unwrap(),
        2
    );
}

#[test]
fn sysfs_tree_matches_what_nvml_reports() {
    let profile = Profile::load(&bundled_profile("dgx-a100")).unwrap();
    let root = tempfile::tempdir().unwrap();
    nvidia_ml::sysfs::write(&profile, root.path()).unwrap();
    let devices = std::fs::canonicalize(root.path()).unwrap().join("devices");
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    for i in 0..8 {
        let d = nvml.device_by_index(i).unwrap();
        // NVML's 8-digit domain to sysfs' 4-digit, lower case
        let bus_id = d.pci_info().unwrap().bus_id;
        let name = bus_id[4..].to_lowercase();
        let real = std::fs::canonicalize(root.path().join("bus/pci/devices").join(&name)).unwrap();
        assert_eq!(real.file_name().unwrap().to_str().unwrap(), name);
        let numa: u32 = std::fs::read_to_string(real.join("numa_node"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(numa, d.numa_node_id().unwrap(), "GPU {i}");
        let pcie_root = real
            .strip_prefix(&devices)
            .unwrap()
            .components()
            .next()
            .unwrap();
        assert_eq!(
            pcie_root.as_os_str().to_str().unwrap(),
            profile.gpus[i as usize].pcie_root,
            "GPU {i}"
        );
    }
}

#[test]
fn addressing_mode_is_reported_only_when_the_profile_sets_it() {
    let yaml = std::fs::read_to_string(bundled_profile("mixed"))
        .unwrap()
        .replacen(
            "    minor: 0\n",
            "    minor: 0\n    addressingMode: HMM\n",
            1,
        );
    let fake = Fake::with_yaml(&yaml);
    let nvml = fake.nvml();
    let sym = nvml.lib().nvmlDeviceGetAddressingMode.as_ref().unwrap();
    let mode = |index: u32| {
        let d = nvml.device_by_index(index).unwrap();
        let mut mode = sys::nvmlDeviceAddressingMode_t {
            version: (std::mem::size_of::<sys::nvmlDeviceAddressingMode_v1_t>() as u32) | (1 << 24),
            value: 99,
        };
        // SAFETY: a device handle of this library and a versioned v1 struct.
        let rc = unsafe { sym(d.handle(), &raw mut mode) };
        (rc, mode.value)
    };
    assert_eq!(
        mode(0),
        (
            0,
            sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM
        )
    );
    assert_eq!(mode(1).0, 3, "NOT_SUPPORTED without addressingMode");
}

#[test]
fn init_with_flags_works_like_init() {
    let fake = Fake::bundled("t4-inference");
    let nvml = Nvml::builder()
        .lib_path(fake.lib.as_os_str())
        .flags(nvml_wrapper::bitmasks::InitFlags::NO_GPUS)
        .init()
        .unwrap();
    assert_eq!(nvml.device_count().unwrap(), 4);
}
