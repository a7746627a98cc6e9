//! How GPUs of a machine are connected: the PCIe common-ancestor level
//! (`nvmlDeviceGetTopologyCommonAncestor`), NVLink reachability and the P2P
//! status NVML reports for each P2P capability.

use nvml_wrapper_sys::bindings as sys;

use crate::pci::PciAddress;
use crate::profile::Gpu;

/// `nvmlGpuTopologyLevel_t` between two GPUs, from their PCIe paths: the same
/// GPU is INTERNAL; under one PCIe switch (paths differ only in the last
/// bridge) SINGLE; under a tree of switches MULTIPLE; the same root complex
/// HOSTBRIDGE; the same NUMA node NODE; otherwise SYSTEM.
pub fn common_ancestor(a: &Gpu, b: &Gpu) -> u32 {
    if a.pci == b.pci {
        return sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL;
    }
    if a.pcie_root == b.pcie_root {
        let common = a
            .pci_bridges
            .iter()
            .zip(&b.pci_bridges)
            .take_while(|(x, y)| x == y)
            .count();
        if common == 0 {
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE
        } else if a.pci_bridges.len() == common + 1 && b.pci_bridges.len() == common + 1 {
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        } else {
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE
        }
    } else if a.numa_node >= 0 && a.numa_node == b.numa_node {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
    } else {
        sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
    }
}

/// Whether two GPUs reach each other over NVLink: a direct link, or links
/// from both into the same NVSwitch.
pub fn nvlinked(a: &Gpu, b: &Gpu, nvswitches: &[PciAddress]) -> bool {
    if a.nvlinks.values().any(|r| *r == b.pci) {
        return true;
    }
    a.nvlinks
        .values()
        .filter(|r| nvswitches.contains(r))
        .any(|switch| b.nvlinks.values().any(|r| r == switch))
}

/// `nvmlDeviceGetP2PStatus` for a `nvmlGpuP2PCapsIndex_t`; `None` for an
/// index NVML does not define. NVLink-connected GPUs can do everything; over
/// PCIe, reads, writes and property queries work up to a shared root complex
/// and fail across CPU sockets, atomics need NVLink.
pub fn p2p_status(a: &Gpu, b: &Gpu, nvswitches: &[PciAddress], index: u32) -> Option<u32> {
    let ok = sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK;
    let not_supported = sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED;
    let chipset = sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED;
    if index >= sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_UNKNOWN {
        return None;
    }
    if a.pci == b.pci {
        return Some(ok);
    }
    let linked = nvlinked(a, b, nvswitches);
    Some(match index {
        sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK
        | sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_ATOMICS => {
            if linked {
                ok
            } else {
                not_supported
            }
        }
        _ => {
            let near = common_ancestor(a, b) <= sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE;
            if linked || near { ok } else { chipset }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn load(name: &str) -> Profile {
        let path = format!("{}/profiles/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        Profile::load(std::path::Path::new(&path)).unwrap()
    }

    #[test]
    fn dgx_a100_levels_follow_the_pcie_tree() {
        let p = load("dgx-a100");
        let g = &p.gpus;
        assert_eq!(
            common_ancestor(&g[0], &g[0]),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
        );
        assert_eq!(
            common_ancestor(&g[0], &g[1]),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE
        );
        assert_eq!(
            common_ancestor(&g[0], &g[2]),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
        );
        assert_eq!(
            common_ancestor(&g[0], &g[7]),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
        );
    }

    #[test]
    fn t4s_share_one_switch() {
        let p = load("t4-inference");
        assert_eq!(
            common_ancestor(&p.gpus[0], &p.gpus[3]),
            sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        );
        let nvlink = sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK;
        let read = sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ;
        assert_eq!(
            p2p_status(&p.gpus[0], &p.gpus[1], &p.nvswitches, nvlink),
            Some(sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED)
        );
        assert_eq!(
            p2p_status(&p.gpus[0], &p.gpus[1], &p.nvswitches, read),
            Some(sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK)
        );
        assert_eq!(p2p_status(&p.gpus[0], &p.gpus[1], &p.nvswitches, 9), None);
    }

    #[test]
    fn nvswitch_connects_every_pair_and_bridges_only_their_pair() {
        let h = load("dgx-h100");
        for a in &h.gpus {
            for b in &h.gpus {
                assert!(nvlinked(a, b, &h.nvswitches));
            }
        }
        let p = load("pcie-a100-bridged");
        let g = &p.gpus;
        assert!(nvlinked(&g[0], &g[1], &p.nvswitches));
        assert!(nvlinked(&g[3], &g[2], &p.nvswitches));
        assert!(!nvlinked(&g[1], &g[2], &p.nvswitches));
        let read = sys::nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ;
        assert_eq!(
            p2p_status(&g[0], &g[3], &p.nvswitches, read),
            Some(sys::nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED)
        );
    }
}
