//! How GPUs connect: PCIe common ancestor, P2P status, and per-link NVLink
//! queries (state, version, remote PCI info, remote device type, capability).

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::device::pci_info;
use super::{export, fill, full_gpu, write};
use crate::codes::{self, Code};
use crate::machine::Machine;
use crate::pci::PciAddress;
use crate::runtime;
use crate::topology;

export! {
    /// The closest common PCIe ancestor of two GPUs (`nvmlGpuTopologyLevel_t`).
    fn nvmlDeviceGetTopologyCommonAncestor(
        device1: sys::nvmlDevice_t,
        device2: sys::nvmlDevice_t,
        path_info: *mut sys::nvmlGpuTopologyLevel_t,
    ) {
        let level = runtime::with_machine(|m| {
            let a = full_gpu(m, device1, NAME)?;
            let b = full_gpu(m, device2, NAME)?;
            Ok(topology::common_ancestor(&m.gpus[a], &m.gpus[b]))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(path_info, level) }
    }
}

export! {
    /// P2P status between two GPUs for one capability.
    fn nvmlDeviceGetP2PStatus(
        device1: sys::nvmlDevice_t,
        device2: sys::nvmlDevice_t,
        p2p_index: sys::nvmlGpuP2PCapsIndex_t,
        p2p_status: *mut sys::nvmlGpuP2PStatus_t,
    ) {
        let status = runtime::with_machine(|m| {
            let a = full_gpu(m, device1, NAME)?;
            let b = full_gpu(m, device2, NAME)?;
            topology::p2p_status(&m.gpus[a], &m.gpus[b], &m.profile.nvswitches, p2p_index)
                .ok_or(codes::INVALID_ARGUMENT)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(p2p_status, status) }
    }
}

/// The remote end of `link` of GPU `gpu`: NOT_SUPPORTED for a GPU without
/// NVLink, INVALID_ARGUMENT for a link the chip does not have, `None` for an
/// inactive link.
fn remote(m: &Machine, gpu: usize, link: c_uint) -> Result<Option<PciAddress>, Code> {
    let g = &m.gpus[gpu];
    if g.model.nvlink_count == 0 {
        return Err(codes::NOT_SUPPORTED);
    }
    if link >= g.model.nvlink_count {
        return Err(codes::INVALID_ARGUMENT);
    }
    if !crate::faults::link_up(gpu, link) {
        return Ok(None);
    }
    Ok(g.nvlinks.get(&link).copied())
}

export! {
    /// Whether an NVLink is active (`nvmlEnableState_t`).
    fn nvmlDeviceGetNvLinkState(handle: sys::nvmlDevice_t, link: c_uint, is_active: *mut sys::nvmlEnableState_t) {
        let active = runtime::with_machine(|m| remote(m, full_gpu(m, handle, NAME)?, link))?.is_some();
        let state = if active {
            sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
        } else {
            sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
        };
        // SAFETY: output pointer per the contract.
        unsafe { write(is_active, state) }
    }
}

export! {
    /// NVLink version of an active link (`nvmlNvlinkVersion_t`).
    fn nvmlDeviceGetNvLinkVersion(handle: sys::nvmlDevice_t, link: c_uint, version: *mut c_uint) {
        let v = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            remote(m, g, link)?.ok_or(codes::NOT_SUPPORTED)?;
            Ok(m.gpus[g].model.nvlink_version)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(version, v) }
    }
}

/// The bus id NVML reports for the far end of a link that is not a PCI
/// device the GPU can enumerate (an NVSwitch): every field all ones.
pub(crate) const SWITCH_SENTINEL_BUS_ID: &str = "FFFFFFFF:FF:FF.0";

/// The PCI info NVML reports for a link into an NVSwitch, as real HGX and
/// GB200 systems do: domain 0xFFFFFFFF, bus 0xFF, device 0xFF, the bus id
/// strings spelled that way, no device ids. Every switch link reports the
/// same value, so it names no device.
fn switch_sentinel() -> sys::nvmlPciInfo_t {
    sys::nvmlPciInfo_t {
        busIdLegacy: fill("FFFF:FF:FF.0"),
        domain: 0xFFFF_FFFF,
        bus: 0xFF,
        device: 0xFF,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: fill(SWITCH_SENTINEL_BUS_ID),
    }
}

export! {
    /// PCI information of the device at the other end of an active link:
    /// the peer GPU's, or the sentinel for an NVSwitch.
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(handle: sys::nvmlDevice_t, link: c_uint, pci: *mut sys::nvmlPciInfo_t) {
        let info = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            let address = remote(m, g, link)?.ok_or(codes::NOT_SUPPORTED)?;
            Ok(match m.gpus.iter().find(|p| p.pci == address) {
                Some(peer) => pci_info(address, peer.model.pci_device_id, peer.model.pci_subsystem_id),
                None => switch_sentinel(),
            })
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(pci, info) }
    }
}

export! {
    /// What is at the other end of an active link: a GPU or an NVSwitch.
    fn nvmlDeviceGetNvLinkRemoteDeviceType(
        handle: sys::nvmlDevice_t,
        link: c_uint,
        device_type: *mut sys::nvmlIntNvLinkDeviceType_t,
    ) {
        let kind = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            let address = remote(m, g, link)?.ok_or(codes::NOT_SUPPORTED)?;
            Ok(if m.gpus.iter().any(|p| p.pci == address) {
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
            } else {
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
            })
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(device_type, kind) }
    }
}

export! {
    /// An NVLink capability of a link: active links support P2P, P2P atomics
    /// and are valid; nothing else.
    fn nvmlDeviceGetNvLinkCapability(
        handle: sys::nvmlDevice_t,
        link: c_uint,
        capability: sys::nvmlNvLinkCapability_t,
        cap_result: *mut c_uint,
    ) {
        if capability >= sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_COUNT {
            return Err(codes::INVALID_ARGUMENT);
        }
        let active = runtime::with_machine(|m| remote(m, full_gpu(m, handle, NAME)?, link))?.is_some();
        let yes = active
            && matches!(
                capability,
                sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_SUPPORTED
                    | sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_P2P_ATOMICS
                    | sys::nvmlNvLinkCapability_enum_NVML_NVLINK_CAP_VALID
            );
        // SAFETY: output pointer per the contract.
        unsafe { write(cap_result, c_uint::from(yes)) }
    }
}
