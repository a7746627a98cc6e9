//! MIG on a GPU: MIG mode, MIG device handles and their ids, GPU-instance
//! profiles, placements and capacity, and creating and listing GPU
//! instances. On a GPU without MIG these calls are NOT_SUPPORTED. On a
//! MIG-capable GPU with MIG disabled, profile info and possible placements
//! still answer (they are hardware facts; NVIDIA's driver reads them on
//! MIG-disabled Hopper GPUs to publish dynamic MIG devices), while calls on
//! instances (create, list, remaining capacity) are NOT_SUPPORTED.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::{
    device, export, fill, full_gpu, non_null, pointer_of, read, struct_version, struct_version_of,
    write, write_array, write_counted,
};
use crate::codes::{self, Code};
use crate::hardware::GiProfile;
use crate::machine::{self, DeviceRef, Machine};
use crate::runtime;

export! {
    /// Current and pending MIG mode.
    fn nvmlDeviceGetMigMode(handle: sys::nvmlDevice_t, current_mode: *mut c_uint, pending_mode: *mut c_uint) {
        non_null(current_mode)?;
        non_null(pending_mode)?;
        let (current, pending) = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            m.mig_table(g)?;
            Ok((m.gpus[g].mig_current, m.gpus[g].mig_pending))
        })?;
        // SAFETY: output pointers per the contract.
        unsafe {
            write(current_mode, c_uint::from(current))?;
            write(pending_mode, c_uint::from(pending))
        }
    }
}

export! {
    /// Sets the MIG mode. Hopper switches at once; Ampere only records the
    /// pending mode and reports NVML_ERROR_RESET_REQUIRED in
    /// `activationStatus`. Disabling while GPU instances exist is IN_USE.
    fn nvmlDeviceSetMigMode(handle: sys::nvmlDevice_t, mode: c_uint, activation_status: *mut sys::nvmlReturn_t) {
        if mode > sys::NVML_DEVICE_MIG_ENABLE {
            return Err(codes::INVALID_ARGUMENT);
        }
        non_null(activation_status)?;
        let enable = mode == sys::NVML_DEVICE_MIG_ENABLE;
        let status = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            let needs_reset = m.mig_table(g)?.mode_change_needs_reset;
            m.mutate(g, |gpu| {
                if !enable && !gpu.mig.gpu_instances.is_empty() {
                    return Err(codes::IN_USE);
                }
                gpu.mig_pending = enable;
                if gpu.mig_current == enable {
                    Ok(codes::SUCCESS)
                } else if needs_reset {
                    Ok(codes::RESET_REQUIRED)
                } else {
                    gpu.mig_current = enable;
                    Ok(codes::SUCCESS)
                }
            })
        })?;
        // SAFETY: output pointer per the contract (checked non-null above).
        unsafe { write(activation_status, status) }
    }
}

export! {
    /// Maximum number of MIG devices of the GPU.
    fn nvmlDeviceGetMaxMigDeviceCount(handle: sys::nvmlDevice_t, count: *mut c_uint) {
        let n = runtime::with_machine(|m| Ok(m.mig_table(full_gpu(m, handle, NAME)?)?.max_devices))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(count, n) }
    }
}

export! {
    /// The handle of the `index`-th MIG device (compute instance) of the GPU,
    /// ordered by GPU instance id, then compute instance id.
    fn nvmlDeviceGetMigDeviceHandleByIndex(handle: sys::nvmlDevice_t, index: c_uint, mig_device: *mut sys::nvmlDevice_t) {
        let h = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            let table = m.mig_enabled_table(g)?;
            if index >= table.max_devices {
                return Err(codes::INVALID_ARGUMENT);
            }
            let (_, ci) = m.gpus[g].mig.mig_devices().nth(index as usize).ok_or(codes::NOT_FOUND)?;
            Ok(m.mig_handle(g, ci))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(mig_device, pointer_of(h)) }
    }
}

/// Resolves a handle that must be a MIG device; a whole GPU is NOT_SUPPORTED.
fn mig(m: &Machine, handle: sys::nvmlDevice_t, name: &str) -> Result<(usize, u32, u32), Code> {
    match device(m, handle, name)? {
        DeviceRef::Mig(g, gi, ci) => Ok((g, gi, ci)),
        DeviceRef::Gpu(_) => Err(codes::NOT_SUPPORTED),
    }
}

export! {
    /// The parent GPU of a MIG device.
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_device: sys::nvmlDevice_t, handle: *mut sys::nvmlDevice_t) {
        let h = runtime::with_machine(|m| Ok(m.gpu_handle(mig(m, mig_device, NAME)?.0)))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(handle, pointer_of(h)) }
    }
}

export! {
    /// 1 for a MIG device handle, 0 for a GPU handle.
    fn nvmlDeviceIsMigDeviceHandle(handle: sys::nvmlDevice_t, is_mig_device: *mut c_uint) {
        let is_mig = runtime::with_machine(|m| Ok(matches!(device(m, handle, NAME)?, DeviceRef::Mig(..))))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(is_mig_device, c_uint::from(is_mig)) }
    }
}

export! {
    /// GPU instance id of a MIG device.
    fn nvmlDeviceGetGpuInstanceId(handle: sys::nvmlDevice_t, id: *mut c_uint) {
        let gi = runtime::with_machine(|m| Ok(mig(m, handle, NAME)?.1))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(id, gi) }
    }
}

export! {
    /// Compute instance id of a MIG device.
    fn nvmlDeviceGetComputeInstanceId(handle: sys::nvmlDevice_t, id: *mut c_uint) {
        let ci = runtime::with_machine(|m| Ok(mig(m, handle, NAME)?.2))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(id, ci) }
    }
}

/// The GI profile with `NVML_GPU_INSTANCE_PROFILE_*` index `profile` on a
/// MIG-capable GPU. Profile facts (info, possible placements) are hardware
/// properties that NVML answers whatever the current MIG mode (NVIDIA's own
/// driver reads them on MIG-disabled Hopper GPUs to publish dynamic MIG
/// devices); only calls that touch instances need MIG mode on.
fn profile_by_enum<'m>(
    m: &'m Machine,
    handle: sys::nvmlDevice_t,
    name: &str,
    profile: c_uint,
) -> Result<(usize, &'m GiProfile), Code> {
    if profile >= sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(codes::INVALID_ARGUMENT);
    }
    let g = full_gpu(m, handle, name)?;
    let p = m
        .mig_table(g)?
        .profiles
        .iter()
        .find(|p| p.nvml_profile == profile)
        .ok_or(codes::NOT_SUPPORTED)?;
    Ok((g, p))
}

/// The GI profile with id `profile_id` (e.g. 19) on a MIG-capable GPU.
fn profile_by_id<'m>(
    m: &'m Machine,
    handle: sys::nvmlDevice_t,
    name: &str,
    profile_id: c_uint,
) -> Result<(usize, &'m GiProfile), Code> {
    let g = full_gpu(m, handle, name)?;
    let p = m
        .mig_table(g)?
        .profiles
        .iter()
        .find(|p| p.id == profile_id)
        .ok_or(codes::INVALID_ARGUMENT)?;
    Ok((g, p))
}

fn info_v1(p: &GiProfile) -> sys::nvmlGpuInstanceProfileInfo_t {
    sys::nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.compute_slices,
        instanceCount: p.instance_count,
        multiprocessorCount: p.multiprocessors,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: p.encoders,
        jpegCount: p.jpeg_engines,
        ofaCount: p.ofa_engines,
        memorySizeMB: p.memory_mib,
    }
}

/// Fills a versioned GI profile info (v2 or v3, told apart by `version`).
///
/// # Safety
///
/// `info` must be null or valid for writes of the struct its version names.
unsafe fn write_info_versioned(
    info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t,
    p: &GiProfile,
) -> Result<(), Code> {
    // SAFETY: every versioned struct starts with its version word.
    let version = unsafe { struct_version(info) }?;
    let name = format!("MIG {}", p.name);
    if version == struct_version_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2) {
        let v2 = sys::nvmlGpuInstanceProfileInfo_v2_t {
            version,
            id: p.id,
            isP2pSupported: 0,
            sliceCount: p.compute_slices,
            instanceCount: p.instance_count,
            multiprocessorCount: p.multiprocessors,
            copyEngineCount: p.copy_engines,
            decoderCount: p.decoders,
            encoderCount: p.encoders,
            jpegCount: p.jpeg_engines,
            ofaCount: p.ofa_engines,
            memorySizeMB: p.memory_mib,
            name: fill(&name),
        };
        // SAFETY: the caller's struct is a v2 (its version says so).
        unsafe { write(info, v2) }
    } else if version == struct_version_of::<sys::nvmlGpuInstanceProfileInfo_v3_t>(3) {
        let v3 = sys::nvmlGpuInstanceProfileInfo_v3_t {
            version,
            id: p.id,
            sliceCount: p.compute_slices,
            instanceCount: p.instance_count,
            multiprocessorCount: p.multiprocessors,
            copyEngineCount: p.copy_engines,
            decoderCount: p.decoders,
            encoderCount: p.encoders,
            jpegCount: p.jpeg_engines,
            ofaCount: p.ofa_engines,
            memorySizeMB: p.memory_mib,
            name: fill(&name),
            capabilities: 0,
        };
        // SAFETY: the caller's struct is a v3 (its version says so).
        unsafe { write(info.cast::<sys::nvmlGpuInstanceProfileInfo_v3_t>(), v3) }
    } else {
        Err(codes::ARGUMENT_VERSION_MISMATCH)
    }
}

export! {
    /// GPU-instance profile information for an `NVML_GPU_INSTANCE_PROFILE_*` index.
    fn nvmlDeviceGetGpuInstanceProfileInfo(handle: sys::nvmlDevice_t, profile: c_uint, info: *mut sys::nvmlGpuInstanceProfileInfo_t) {
        let v1 = runtime::with_machine(|m| Ok(info_v1(profile_by_enum(m, handle, NAME, profile)?.1)))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(info, v1) }
    }
}

export! {
    /// Versioned (v2/v3) GPU-instance profile information for an
    /// `NVML_GPU_INSTANCE_PROFILE_*` index.
    fn nvmlDeviceGetGpuInstanceProfileInfoV(handle: sys::nvmlDevice_t, profile: c_uint, info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t) {
        let p = runtime::with_machine(|m| Ok(profile_by_enum(m, handle, NAME, profile)?.1.clone()))?;
        // SAFETY: versioned output struct per the contract.
        unsafe { write_info_versioned(info, &p) }
    }
}

export! {
    /// Versioned (v2/v3) GPU-instance profile information for a profile id.
    fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(handle: sys::nvmlDevice_t, profile_id: c_uint, info: *mut sys::nvmlGpuInstanceProfileInfo_v2_t) {
        let p = runtime::with_machine(|m| Ok(profile_by_id(m, handle, NAME, profile_id)?.1.clone()))?;
        // SAFETY: versioned output struct per the contract.
        unsafe { write_info_versioned(info, &p) }
    }
}

export! {
    /// Every placement of a profile, occupied or not. `placements` may be
    /// null to ask for the number; otherwise `*count` is its capacity.
    fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        handle: sys::nvmlDevice_t,
        profile_id: c_uint,
        placements: *mut sys::nvmlGpuInstancePlacement_t,
        count: *mut c_uint,
    ) {
        non_null(count)?;
        let list: Vec<sys::nvmlGpuInstancePlacement_t> = runtime::with_machine(|m| {
            let (_, p) = profile_by_id(m, handle, NAME, profile_id)?;
            Ok(p.placements
                .iter()
                .map(|s| sys::nvmlGpuInstancePlacement_t { start: *s, size: p.placement_size })
                .collect())
        })?;
        // SAFETY: in/out count and array of `*count` elements per the contract.
        unsafe { write_counted(placements, count, &list) }
    }
}

export! {
    /// How many more instances of a profile can be created now.
    fn nvmlDeviceGetGpuInstanceRemainingCapacity(handle: sys::nvmlDevice_t, profile_id: c_uint, count: *mut c_uint) {
        let n = runtime::with_machine(|m| {
            let (g, p) = profile_by_id(m, handle, NAME, profile_id)?;
            m.mig_enabled_table(g)?;
            Ok(m.gpus[g].mig.remaining_gi_capacity(m.mig_table(g)?, p))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(count, n) }
    }
}

fn create(
    handle: sys::nvmlDevice_t,
    name: &str,
    profile_id: c_uint,
    start: Option<sys::nvmlGpuInstancePlacement_t>,
) -> Result<u64, Code> {
    runtime::with_machine(|m| {
        let (g, p) = profile_by_id(m, handle, name, profile_id)?;
        m.mig_enabled_table(g)?;
        if let Some(placement) = start
            && placement.size != p.placement_size
        {
            return Err(codes::INVALID_ARGUMENT);
        }
        let id = m.mutate(g, |gpu| {
            machine::create_gpu_instance(gpu, profile_id, start.map(|s| s.start))
        })?;
        Ok(m.gi_handle(g, m.gi(g, id)?))
    })
}

export! {
    /// Creates a GPU instance at the first free placement (upper half of the
    /// memory first, as the hardware does).
    fn nvmlDeviceCreateGpuInstance(handle: sys::nvmlDevice_t, profile_id: c_uint, gpu_instance: *mut sys::nvmlGpuInstance_t) {
        non_null(gpu_instance)?;
        let h = create(handle, NAME, profile_id, None)?;
        // SAFETY: output pointer per the contract (checked non-null above).
        unsafe { write(gpu_instance, pointer_of(h)) }
    }
}

export! {
    /// Creates a GPU instance at a placement; an occupied placement is
    /// NVML_ERROR_INSUFFICIENT_RESOURCES.
    fn nvmlDeviceCreateGpuInstanceWithPlacement(
        handle: sys::nvmlDevice_t,
        profile_id: c_uint,
        placement: *const sys::nvmlGpuInstancePlacement_t,
        gpu_instance: *mut sys::nvmlGpuInstance_t,
    ) {
        non_null(gpu_instance)?;
        // SAFETY: input pointer per the contract.
        let placement = unsafe { read(placement) }?;
        let h = create(handle, NAME, profile_id, Some(placement))?;
        // SAFETY: output pointer per the contract (checked non-null above).
        unsafe { write(gpu_instance, pointer_of(h)) }
    }
}

export! {
    /// The GPU instances of a profile. The array must hold the profile's
    /// instance count (there is no capacity argument, as in NVML).
    fn nvmlDeviceGetGpuInstances(
        handle: sys::nvmlDevice_t,
        profile_id: c_uint,
        gpu_instances: *mut sys::nvmlGpuInstance_t,
        count: *mut c_uint,
    ) {
        let list: Vec<sys::nvmlGpuInstance_t> = runtime::with_machine(|m| {
            let (g, p) = profile_by_id(m, handle, NAME, profile_id)?;
            m.mig_enabled_table(g)?;
            Ok(m.gpus[g]
                .mig
                .gpu_instances
                .iter()
                .filter(|gi| gi.profile_id == p.id)
                .map(|gi| pointer_of(m.gi_handle(g, gi)))
                .collect())
        })?;
        // SAFETY: array sized for the profile's instance count and output
        // count per the contract.
        unsafe { write_array(gpu_instances, count, &list) }
    }
}

export! {
    /// The GPU instance with an id; NOT_FOUND if there is none.
    fn nvmlDeviceGetGpuInstanceById(handle: sys::nvmlDevice_t, id: c_uint, gpu_instance: *mut sys::nvmlGpuInstance_t) {
        let h = runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            m.mig_enabled_table(g)?;
            let gi = m.gpus[g].mig.gpu_instance(id).ok_or(codes::NOT_FOUND)?;
            Ok(m.gi_handle(g, gi))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(gpu_instance, pointer_of(h)) }
    }
}
