//! NVSwitch machines as NVML reports them: the sentinel remote bus id of
//! switch links, the switch device type, the GPU fabric info (cluster UUID,
//! clique, state) and P2P-over-NVLink status, on the DGX and GB200 profiles.
// Raw calls: nvml-wrapper 0.13 has no fabric info call and a broken
// remote_device_type.
#![allow(unsafe_code)]

mod common;

use common::Fake;
use nvidia_ml::fixture::bundled_profile;
use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::P2pStatus;
use nvml_wrapper_sys::bindings as sys;

const NOT_SUPPORTED: u32 = 3;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

fn v2() -> sys::nvmlGpuFabricInfo_v2_t {
    sys::nvmlGpuFabricInfo_v2_t {
        version: (std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as u32) | (2 << 24),
        clusterUuid: [0xAA; 16],
        status: 99,
        cliqueId: 99,
        state: 99,
        healthMask: 99,
    }
}

/// `nvmlDeviceGetGpuFabricInfoV` with a v2 struct.
fn fabric_v2(nvml: &Nvml, d: &Device<'_>) -> (u32, sys::nvmlGpuFabricInfo_v2_t) {
    let sym = nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref().unwrap();
    let mut info = v2();
    // SAFETY: a device handle of this library; the v2 struct the version
    // word declares.
    let rc = unsafe { sym(d.handle(), (&raw mut info).cast()) };
    (rc, info)
}

/// `nvmlDeviceGetGpuFabricInfo` (unversioned).
fn fabric_v1(nvml: &Nvml, d: &Device<'_>) -> (u32, sys::nvmlGpuFabricInfo_t) {
    let sym = nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().unwrap();
    let mut info = sys::nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 99,
        cliqueId: 99,
        state: 99,
    };
    // SAFETY: a device handle of this library and a valid out struct.
    let rc = unsafe { sym(d.handle(), &raw mut info) };
    (rc, info)
}

#[test]
fn gb200_gpus_share_one_fabric_clique_behind_switch_sentinels() {
    let fake = Fake::bundled("gb200-nvl");
    let nvml = fake.nvml();
    let gpus: Vec<Device<'_>> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    let cluster = nvidia_ml::fabric::parse_uuid("09b319a2-e553-400e-b9ab-1ff0bd7d7daf").unwrap();
    for (i, a) in gpus.iter().enumerate() {
        assert_eq!(a.name().unwrap(), "NVIDIA GB200");
        for link in 0..18 {
            assert!(a.link_wrapper_for(link).is_active().unwrap());
            let remote = a.link_wrapper_for(link).remote_pci_info().unwrap();
            assert_eq!(remote.bus_id, "FFFFFFFF:FF:FF.0", "GPU {i} link {link}");
            assert_eq!(
                common::remote_device_type(&nvml, a, link),
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
            );
        }
        let (rc, info) = fabric_v2(&nvml, a);
        assert_eq!(rc, 0);
        assert_eq!(info.clusterUuid, cluster);
        assert_eq!(info.cliqueId, 1);
        assert_eq!(u32::from(info.state), sys::NVML_GPU_FABRIC_STATE_COMPLETED);
        assert_eq!(info.status, 0);
        let (rc, plain) = fabric_v1(&nvml, a);
        assert_eq!(rc, 0);
        assert_eq!((plain.clusterUuid, plain.cliqueId), (cluster, 1));
        for b in &gpus {
            assert_eq!(common::nvlink_p2p(a, b), P2pStatus::Ok);
        }
    }
}

#[test]
fn fabric_info_follows_the_architecture_and_the_struct_version() {
    // HGX H100: the call works, the state says no multi-node fabric.
    let h100 = Fake::bundled("dgx-h100");
    let nvml = h100.nvml();
    let d = nvml.device_by_index(0).unwrap();
    let (rc, info) = fabric_v2(&nvml, &d);
    assert_eq!(rc, 0);
    assert_eq!(
        u32::from(info.state),
        sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    );
    assert_eq!(info.clusterUuid, [0; 16]);
    // An unknown struct version is refused before anything is written.
    let sym = nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref().unwrap();
    let mut bad = v2();
    bad.version = (std::mem::size_of::<sys::nvmlGpuFabricInfo_v2_t>() as u32) | (9 << 24);
    // SAFETY: a device handle of this library and a valid struct.
    let rc = unsafe { sym(d.handle(), (&raw mut bad).cast()) };
    assert_eq!(rc, ARGUMENT_VERSION_MISMATCH);
    assert_eq!(bad.cliqueId, 99);
    // A null struct is an invalid argument.
    // SAFETY: null is allowed by the contract (refused).
    let rc = unsafe { sym(d.handle(), std::ptr::null_mut()) };
    assert_eq!(rc, 2);
    drop(nvml);
    drop(h100);

    // DGX A100 (Ampere): no fabric call.
    let a100 = Fake::bundled("dgx-a100");
    let nvml = a100.nvml();
    let d = nvml.device_by_index(4).unwrap();
    assert_eq!(fabric_v2(&nvml, &d).0, NOT_SUPPORTED);
    assert_eq!(fabric_v1(&nvml, &d).0, NOT_SUPPORTED);
}

#[test]
fn bridges_report_the_peer_and_switches_the_sentinel_on_one_machine() {
    // One GPU pair bridged, the other two on a switch.
    let yaml = std::fs::read_to_string(bundled_profile("pcie-a100-bridged"))
        .unwrap()
        .replacen("gpus:\n", "nvswitches: [\"0000:f0:00.0\"]\ngpus:\n", 1);
    let profile = nvidia_ml::Profile::parse(&yaml).unwrap();
    let third = profile.gpus[2].pci.sysfs();
    let fourth = profile.gpus[3].pci.sysfs();
    let yaml = yaml
        .replace(&format!("remote: \"{fourth}\""), "remote: \"0000:f0:00.0\"")
        .replace(&format!("remote: \"{third}\""), "remote: \"0000:f0:00.0\"");
    let fake = Fake::with_yaml(&yaml);
    let nvml = fake.nvml();
    let g: Vec<Device<'_>> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    let peer = |d: &Device<'_>| d.link_wrapper_for(0).remote_pci_info().unwrap().bus_id;
    assert_eq!(peer(&g[0]), g[1].pci_info().unwrap().bus_id);
    assert_eq!(peer(&g[2]), "FFFFFFFF:FF:FF.0");
    assert_eq!(
        common::remote_device_type(&nvml, &g[2], 0),
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
    );
    assert_eq!(
        common::remote_device_type(&nvml, &g[0], 0),
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
    );
    assert_eq!(common::nvlink_p2p(&g[2], &g[3]), P2pStatus::Ok);
    assert_eq!(common::nvlink_p2p(&g[1], &g[2]), P2pStatus::NotSupported);
}
