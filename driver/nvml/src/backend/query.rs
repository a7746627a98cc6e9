//! Reading everything about one GPU into an owned [`GpuInfo`]: identity,
//! memory, PCI bus id, compute mode, addressing mode, MIG state and
//! capabilities, and the NVLink topology (`nvlink`).

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Brand, ComputeMode as NvComputeMode};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

mod nvlink;

use super::call;
use super::raw::{self, RawDevice};
use crate::naming;
use crate::{
    ComputeMode, ComputeSlices, Error, GpuInfo, MigDevice, MigInfo, MigMode, MigPlacement,
    MigProfile, NvLinkRemote, Result,
};

/// Everything about GPU `index`. Any failing query fails this GPU only.
pub(super) fn gpu_info(nvml: &Nvml, handle: RawDevice, index: u32) -> Result<GpuInfo> {
    let device = handle.device(nvml);
    let uuid = device.uuid().map_err(call("nvmlDeviceGetUUID", index))?;
    let minor = device
        .minor_number()
        .map_err(call("nvmlDeviceGetMinorNumber", index))?;
    let product_name = device.name().map_err(call("nvmlDeviceGetName", index))?;
    let brand = match device.brand() {
        Ok(brand) => naming::brand_name(brand),
        Err(NvmlError::UnexpectedVariant(v)) => {
            tracing::warn!(gpu = index, brand = v, "unknown NVML brand value");
            naming::brand_name(Brand::Unknown)
        }
        Err(e) => return Err(call("nvmlDeviceGetBrand", index)(e)),
    };
    let architecture = match device.architecture() {
        Ok(arch) => naming::architecture_name(&arch),
        Err(NvmlError::UnexpectedVariant(v)) => {
            tracing::warn!(
                gpu = index,
                architecture = v,
                "unknown NVML architecture value"
            );
            naming::architecture_name(&DeviceArchitecture::Unknown)
        }
        Err(e) => return Err(call("nvmlDeviceGetArchitecture", index)(e)),
    };
    let cc = device
        .cuda_compute_capability()
        .map_err(call("nvmlDeviceGetCudaComputeCapability", index))?;
    let cuda_compute_capability = match (u32::try_from(cc.major), u32::try_from(cc.minor)) {
        (Ok(major), Ok(minor)) => (major, minor),
        _ => {
            return Err(invalid_answer(
                "nvmlDeviceGetCudaComputeCapability",
                index,
                format!("negative compute capability {}.{}", cc.major, cc.minor),
            ));
        }
    };
    let memory_bytes = device
        .memory_info()
        .map_err(call("nvmlDeviceGetMemoryInfo_v2", index))?
        .total;
    let pci = device
        .pci_info()
        .map_err(call("nvmlDeviceGetPciInfo_v3", index))?;
    let pci_bus_id = naming::normalize_pci_bus_id(&pci.bus_id)
        .map_err(|reason| invalid_answer("nvmlDeviceGetPciInfo_v3", index, reason))?;
    let compute_mode = compute_mode(&device, index)?;
    let addressing_mode = addressing_mode(nvml, handle, index)?;
    let mig = mig_info(nvml, &device, handle, index, memory_bytes)?;
    let nvlinks = nvlink::nvlinks(nvml, &device, index);
    let fabric = nvlink::fabric(nvml, &device, index);
    // Switch-attached GPUs outside a fabric are joined by P2P status.
    let nvlink_p2p_peers =
        if fabric.is_none() && nvlinks.iter().any(|l| l.remote == NvLinkRemote::Switch) {
            nvlink::p2p_nvlink_peers(nvml, &device, index)
        } else {
            Vec::new()
        };
    Ok(GpuInfo {
        index,
        minor,
        uuid,
        product_name,
        brand: brand.to_owned(),
        architecture: architecture.to_owned(),
        cuda_compute_capability,
        memory_bytes,
        pci_bus_id,
        addressing_mode,
        compute_mode,
        mig,
        nvlinks,
        fabric,
        nvlink_p2p_peers,
    })
}

/// The compute mode of GPU `index`.
pub(super) fn compute_mode(device: &Device<'_>, index: u32) -> Result<ComputeMode> {
    Ok(
        match device
            .compute_mode()
            .map_err(call("nvmlDeviceGetComputeMode", index))?
        {
            NvComputeMode::Default => ComputeMode::Default,
            // Exclusive-thread is gone from current drivers; it is exclusive
            // use all the same.
            NvComputeMode::ExclusiveProcess | NvComputeMode::ExclusiveThread => {
                ComputeMode::ExclusiveProcess
            }
            NvComputeMode::Prohibited => ComputeMode::Prohibited,
        },
    )
}

/// The MIG mode of GPU `index`, `None` when it is not MIG capable.
pub(super) fn mig_mode(device: &Device<'_>, index: u32) -> Result<Option<MigMode>> {
    let mode = match device.mig_mode() {
        Ok(mode) => mode,
        Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound,
        ) => {
            return Ok(None);
        }
        Err(e) => return Err(call("nvmlDeviceGetMigMode", index)(e)),
    };
    Ok(Some(MigMode {
        current_enabled: mode.current == sys::NVML_DEVICE_MIG_ENABLE,
        pending_enabled: mode.pending == sys::NVML_DEVICE_MIG_ENABLE,
    }))
}

/// An NVML answer the backend cannot use (malformed bus id, negative value).
fn invalid_answer(call: &'static str, gpu: u32, reason: String) -> Error {
    Error::Call {
        call,
        gpu: Some(gpu),
        reason,
    }
}

/// `HMM`/`ATS`, or `None` when the platform has no addressing mode, the
/// driver predates the call, or the mode is "none".
fn addressing_mode(nvml: &Nvml, handle: RawDevice, index: u32) -> Result<Option<String>> {
    let mode = match raw::addressing_mode(nvml, handle) {
        Ok(mode) => mode,
        Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound,
        ) => sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE,
        Err(e) => return Err(call("nvmlDeviceGetAddressingMode", index)(e)),
    };
    Ok(match mode {
        sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_HMM => {
            Some("HMM".to_owned())
        }
        sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_ATS => {
            Some("ATS".to_owned())
        }
        sys::nvmlDeviceAddressingModeType_t_NVML_DEVICE_ADDRESSING_MODE_NONE => None,
        other => {
            tracing::warn!(
                gpu = index,
                mode = other,
                "unknown NVML addressing mode, left out"
            );
            None
        }
    })
}

/// MIG facts, or `None` when the GPU is not MIG capable.
fn mig_info(
    nvml: &Nvml,
    device: &Device<'_>,
    handle: RawDevice,
    index: u32,
    memory_bytes: u64,
) -> Result<Option<MigInfo>> {
    let Some(MigMode {
        current_enabled,
        pending_enabled,
    }) = mig_mode(device, index)?
    else {
        return Ok(None);
    };
    let profiles = mig_profiles(nvml, device, handle, index, memory_bytes)?;
    let devices = if current_enabled {
        mig_devices(nvml, device, handle, index)?
    } else {
        Vec::new()
    };
    Ok(Some(MigInfo {
        current_enabled,
        pending_enabled,
        profiles,
        devices,
    }))
}

/// Every GPU instance profile NVML knows for this GPU, with its placements.
fn mig_profiles(
    nvml: &Nvml,
    device: &Device<'_>,
    handle: RawDevice,
    index: u32,
    memory_bytes: u64,
) -> Result<Vec<MigProfile>> {
    let mut profiles = Vec::new();
    for profile_enum in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        let info = match device.profile_info(profile_enum) {
            Ok(info) => info,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(call("nvmlDeviceGetGpuInstanceProfileInfo", index)(e)),
        };
        let placements = match raw::possible_placements(nvml, handle, info.id) {
            Ok(placements) => placements,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(call("nvmlDeviceGetGpuInstancePossiblePlacements_v2", index)(e)),
        };
        let mut placements: Vec<MigPlacement> = placements
            .into_iter()
            .map(|(start, size)| MigPlacement { start, size })
            .collect();
        placements.sort_unstable();
        profiles.push(MigProfile {
            id: info.id,
            name: naming::mig_profile_name(
                profile_enum,
                info.slice_count,
                info.memory_size_mb,
                memory_bytes,
            ),
            slice_count: info.slice_count,
            instance_count: info.instance_count,
            multiprocessors: info.multiprocessor_count,
            copy_engines: info.copy_engine_count,
            decoders: info.decoder_count,
            encoders: info.encoder_count,
            jpeg_engines: info.jpeg_count,
            ofa_engines: info.ofa_count,
            memory_mib: info.memory_size_mb,
            placements,
        });
    }
    Ok(profiles)
}

/// The MIG devices that exist now, ordered by GPU instance id.
pub(super) fn mig_devices(
    nvml: &Nvml,
    device: &Device<'_>,
    handle: RawDevice,
    index: u32,
) -> Result<Vec<MigDevice>> {
    let max = device
        .mig_device_count()
        .map_err(call("nvmlDeviceGetMaxMigDeviceCount", index))?;
    let mut devices = Vec::new();
    for slot in 0..max {
        let mig = match device.mig_device_by_index(slot) {
            Ok(mig) => mig,
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(call("nvmlDeviceGetMigDeviceHandleByIndex", index)(e)),
        };
        let uuid = mig.uuid().map_err(call("nvmlDeviceGetUUID (MIG)", index))?;
        let (gpu_instance_id, compute_instance_id) = raw::mig_instance_ids(nvml, &mig)
            .map_err(call("nvmlDeviceGetGpuInstanceId/ComputeInstanceId", index))?;
        let gi = raw::gpu_instance_by_id(nvml, handle, gpu_instance_id)
            .map_err(call("nvmlDeviceGetGpuInstanceById", index))?;
        let gi =
            raw::gpu_instance_info(nvml, &gi).map_err(call("nvmlGpuInstanceGetInfo", index))?;
        let memory_bytes = mig
            .memory_info()
            .map_err(call("nvmlDeviceGetMemoryInfo_v2 (MIG)", index))?
            .total;
        // Optional: only tells whether the compute instance spans its GPU
        // instance.
        let compute_slices = match mig.attributes() {
            Ok(a) if a.gpu_instance_slice_count > 0 => Some(ComputeSlices {
                gpu_instance: a.gpu_instance_slice_count,
                compute_instance: a.compute_instance_slice_count,
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(gpu = index, gi = gpu_instance_id, ci = compute_instance_id, error = %e, "MIG device attributes unreadable");
                None
            }
        };
        devices.push(MigDevice {
            uuid,
            profile_id: gi.profile_id,
            gpu_instance_id,
            compute_instance_id,
            placement: MigPlacement {
                start: gi.start,
                size: gi.size,
            },
            memory_bytes,
            compute_slices,
        });
    }
    devices.sort_by_key(|d| (d.gpu_instance_id, d.compute_instance_id));
    Ok(devices)
}
