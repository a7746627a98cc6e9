//! Reading a GPU's NVLink topology from NVML: every active link with what
//! is at its far end, the GPU fabric membership (cluster UUID and clique),
//! and, for switch-attached GPUs without one, the peers NVML's P2P status
//! over NVLink calls OK. The rules live in [`crate::topology`]; this module
//! only asks NVML, with the two raw calls nvml-wrapper lacks or gets wrong
//! (each `unsafe` block says why it is sound).
#![allow(unsafe_code)]

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings as sys;

use crate::topology;
use crate::{FabricInfo, NvLinkInfo, NvLinkRemote};

/// Active NVLinks, each classified. Every active link is kept (an
/// unreadable far end is [`NvLinkRemote::Unknown`]), so the count is the
/// number of active links.
pub(super) fn nvlinks(nvml: &Nvml, device: &Device<'_>, index: u32) -> Vec<NvLinkInfo> {
    let mut links = Vec::new();
    for link in 0..sys::NVML_NVLINK_MAX_LINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                if !matches!(e, NvmlError::NotSupported | NvmlError::InvalidArg) {
                    tracing::debug!(gpu = index, link, error = %e, "NVLink state unreadable, treated as no link");
                }
                continue;
            }
        }
        let device_type = match remote_device_type(nvml, device, link) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::debug!(gpu = index, link, error = %e, "NVLink remote device type unreadable");
                None
            }
        };
        let bus_id = wrapper
            .remote_pci_info()
            .map(|pci| pci.bus_id)
            .map_err(|e| e.to_string());
        let (remote, remote_pci_bus_id, problem) =
            topology::classify_link(device_type, bus_id.as_deref().map_err(Clone::clone));
        if let Some(problem) = problem
            && remote != NvLinkRemote::Switch
        {
            tracing::warn!(gpu = index, link, remote = ?remote, problem = %problem, "NVLink far end not identified by bus id");
        }
        links.push(NvLinkInfo {
            link,
            remote,
            remote_pci_bus_id,
        });
    }
    links
}

/// The GPU's fabric membership, `None` where NVML has none (pre-Hopper,
/// an older driver, no multi-node fabric, registration not complete).
pub(super) fn fabric(nvml: &Nvml, device: &Device<'_>, index: u32) -> Option<FabricInfo> {
    match fabric_info(nvml, device) {
        Ok((uuid, clique, state, status)) => {
            let membership = topology::fabric_membership(uuid, clique, state, status);
            if membership.is_none()
                && state != sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
                && uuid != [0; 16]
            {
                tracing::info!(
                    gpu = index,
                    state,
                    status,
                    "GPU fabric registration not complete, no clique"
                );
            }
            membership
        }
        Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound,
        ) => None,
        Err(e) => {
            tracing::warn!(gpu = index, error = %e, "GPU fabric info unreadable, no clique");
            None
        }
    }
}

/// UUIDs of the other GPUs NVML's P2P status over NVLink calls OK, sorted.
/// A GPU that cannot be read is left out (and logged).
pub(super) fn p2p_nvlink_peers(nvml: &Nvml, device: &Device<'_>, index: u32) -> Vec<String> {
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(gpu = index, error = %e, "GPU count unreadable, no P2P NVLink peers");
            return Vec::new();
        }
    };
    let mut peers = Vec::new();
    for other in (0..count).filter(|&j| j != index) {
        let peer = match nvml.device_by_index(other) {
            Ok(peer) => peer,
            Err(e) => {
                tracing::debug!(gpu = index, peer = other, error = %e, "peer GPU unreadable for P2P status");
                continue;
            }
        };
        match device.p2p_status(&peer, P2pCapabilitiesIndex::NvLink) {
            Ok(P2pStatus::Ok) => match peer.uuid() {
                Ok(uuid) => peers.push(uuid),
                Err(e) => {
                    tracing::debug!(gpu = index, peer = other, error = %e, "peer GPU UUID unreadable");
                }
            },
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(gpu = index, peer = other, error = %e, "P2P NVLink status unreadable");
            }
        }
    }
    peers.sort_unstable();
    peers
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`, called raw: nvml-wrapper 0.13's
/// `NvLink::remote_device_type` hands NVML a pointer to a temporary copy
/// and always answers `Unknown`.
fn remote_device_type(nvml: &Nvml, device: &Device<'_>, link: u32) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref())?;
    // SAFETY: `handle()` only copies the pointer out of a `Device` that
    // borrows `nvml`, so the handle is valid for the call below.
    let handle = unsafe { device.handle() };
    let mut kind: sys::nvmlIntNvLinkDeviceType_t =
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: valid device handle and a valid out pointer for one enum value.
    nvml_try(unsafe { sym(handle, link, &raw mut kind) })?;
    Ok(kind)
}

/// (cluster UUID, clique id, state, status) from
/// `nvmlDeviceGetGpuFabricInfoV` (v2 struct), or from the unversioned
/// `nvmlDeviceGetGpuFabricInfo` where the driver lacks the versioned call
/// or that struct version.
fn fabric_info(nvml: &Nvml, device: &Device<'_>) -> Result<([u8; 16], u32, u32, u32), NvmlError> {
    // SAFETY: as in `remote_device_type`.
    let handle = unsafe { device.handle() };
    let versioned = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref()).and_then(|sym| {
        let mut info = sys::nvmlGpuFabricInfo_v2_t {
            // NVML_STRUCT_VERSION(GpuFabricInfo, 2).
            version: (size_of::<sys::nvmlGpuFabricInfo_v2_t>() as u32) | (2 << 24),
            clusterUuid: [0; 16],
            status: 0,
            cliqueId: 0,
            state: 0,
            healthMask: 0,
        };
        // SAFETY: valid device handle; `info` is a v2 struct whose version
        // word says so, and NVML writes at most that struct (the
        // function's pointer type names the newest version, whose prefix
        // v2 is).
        nvml_try(unsafe { sym(handle, (&raw mut info).cast()) })?;
        Ok((
            info.clusterUuid,
            info.cliqueId,
            u32::from(info.state),
            info.status,
        ))
    });
    match versioned {
        Err(
            NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::UnexpectedVariant(sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        ) => {}
        other => return other,
    }
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
    let mut info = sys::nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: valid device handle and a valid out struct of the unversioned
    // type this entry point takes.
    nvml_try(unsafe { sym(handle, &raw mut info) })?;
    Ok((
        info.clusterUuid,
        info.cliqueId,
        u32::from(info.state),
        info.status,
    ))
}
