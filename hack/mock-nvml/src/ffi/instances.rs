//! GPU instance and compute instance handles: GI info and destruction,
//! compute-instance profiles, placements, capacity, creation and listing,
//! CI info and destruction.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings as sys;

use super::{
    export, fill, handle_of, non_null, pointer_of, read, struct_version, struct_version_of, write,
    write_array, write_counted,
};
use crate::codes::{self, Code};
use crate::hardware::{CiProfile, GiProfile};
use crate::machine::{self, Machine};
use crate::runtime;

/// Resolves a GPU instance handle, applying injected failures of `name`.
fn gpu_instance(
    m: &Machine,
    handle: sys::nvmlGpuInstance_t,
    name: &str,
) -> Result<(usize, u32), Code> {
    let (g, gi) = m.gpu_instance(handle_of(handle))?;
    m.injected(name, Some(g))?;
    Ok((g, gi))
}

/// Resolves a compute instance handle, applying injected failures of `name`.
fn compute_instance(
    m: &Machine,
    handle: sys::nvmlComputeInstance_t,
    name: &str,
) -> Result<(usize, u32, u32), Code> {
    let (g, gi, ci) = m.compute_instance(handle_of(handle))?;
    m.injected(name, Some(g))?;
    Ok((g, gi, ci))
}

export! {
    /// Parent device, id, profile id and placement of a GPU instance.
    fn nvmlGpuInstanceGetInfo(gpu_instance_handle: sys::nvmlGpuInstance_t, info: *mut sys::nvmlGpuInstanceInfo_t) {
        let value = runtime::with_machine(|m| {
            let (g, id) = gpu_instance(m, gpu_instance_handle, NAME)?;
            let gi = m.gi(g, id)?;
            Ok(sys::nvmlGpuInstanceInfo_t {
                device: pointer_of(m.gpu_handle(g)),
                id: gi.id,
                profileId: gi.profile_id,
                placement: sys::nvmlGpuInstancePlacement_t { start: gi.start, size: gi.size },
            })
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(info, value) }
    }
}

export! {
    /// Destroys a GPU instance; NVML_ERROR_IN_USE while it has compute instances.
    fn nvmlGpuInstanceDestroy(gpu_instance_handle: sys::nvmlGpuInstance_t) {
        runtime::with_machine(|m| {
            let (g, id) = gpu_instance(m, gpu_instance_handle, NAME)?;
            m.mutate(g, |gpu| gpu.mig.destroy_gpu_instance(id).map_err(|e| e.code()))
        })
    }
}

/// The compute-instance profile `profile` (`NVML_COMPUTE_INSTANCE_PROFILE_*`)
/// of a GPU instance, with the GI profile.
fn ci_profile(
    m: &Machine,
    g: usize,
    gi: u32,
    profile: c_uint,
) -> Result<(GiProfile, CiProfile), Code> {
    if profile >= sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(codes::INVALID_ARGUMENT);
    }
    let gi = m.gi(g, gi)?;
    let gp = m.gi_profile(g, gi)?.clone();
    let cp = gp
        .compute_instance_profiles()
        .into_iter()
        .find(|p| p.id == profile)
        .ok_or(codes::NOT_SUPPORTED)?;
    Ok((gp, cp))
}

/// Profile lookup for the ProfileInfo calls, which also take an engine profile.
fn ci_profile_info(
    gpu_instance_handle: sys::nvmlGpuInstance_t,
    name: &str,
    profile: c_uint,
    eng_profile: c_uint,
) -> Result<(GiProfile, CiProfile), Code> {
    if eng_profile != sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return Err(codes::INVALID_ARGUMENT);
    }
    runtime::with_machine(|m| {
        let (g, gi) = gpu_instance(m, gpu_instance_handle, name)?;
        ci_profile(m, g, gi, profile)
    })
}

export! {
    /// Compute-instance profile information.
    fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut sys::nvmlComputeInstanceProfileInfo_t,
    ) {
        let (gp, cp) = ci_profile_info(gpu_instance_handle, NAME, profile, eng_profile)?;
        let value = sys::nvmlComputeInstanceProfileInfo_t {
            id: cp.id,
            sliceCount: cp.slices,
            instanceCount: cp.instance_count,
            multiprocessorCount: cp.multiprocessors,
            sharedCopyEngineCount: gp.copy_engines,
            sharedDecoderCount: gp.decoders,
            sharedEncoderCount: gp.encoders,
            sharedJpegCount: gp.jpeg_engines,
            sharedOfaCount: gp.ofa_engines,
        };
        // SAFETY: output pointer per the contract.
        unsafe { write(info, value) }
    }
}

export! {
    /// Versioned (v2/v3) compute-instance profile information.
    fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile: c_uint,
        eng_profile: c_uint,
        info: *mut sys::nvmlComputeInstanceProfileInfo_v2_t,
    ) {
        let (gp, cp) = ci_profile_info(gpu_instance_handle, NAME, profile, eng_profile)?;
        // SAFETY: every versioned struct starts with its version word.
        let version = unsafe { struct_version(info) }?;
        let name = fill(&format!("MIG {}", cp.name));
        if version == struct_version_of::<sys::nvmlComputeInstanceProfileInfo_v2_t>(2) {
            let v2 = sys::nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: cp.id,
                sliceCount: cp.slices,
                instanceCount: cp.instance_count,
                multiprocessorCount: cp.multiprocessors,
                sharedCopyEngineCount: gp.copy_engines,
                sharedDecoderCount: gp.decoders,
                sharedEncoderCount: gp.encoders,
                sharedJpegCount: gp.jpeg_engines,
                sharedOfaCount: gp.ofa_engines,
                name,
            };
            // SAFETY: the caller's struct is a v2 (its version says so).
            unsafe { write(info, v2) }
        } else if version == struct_version_of::<sys::nvmlComputeInstanceProfileInfo_v3_t>(3) {
            let v3 = sys::nvmlComputeInstanceProfileInfo_v3_t {
                version,
                id: cp.id,
                sliceCount: cp.slices,
                instanceCount: cp.instance_count,
                multiprocessorCount: cp.multiprocessors,
                sharedCopyEngineCount: gp.copy_engines,
                sharedDecoderCount: gp.decoders,
                sharedEncoderCount: gp.encoders,
                sharedJpegCount: gp.jpeg_engines,
                sharedOfaCount: gp.ofa_engines,
                name,
                capabilities: 0,
            };
            // SAFETY: the caller's struct is a v3 (its version says so).
            unsafe { write(info.cast::<sys::nvmlComputeInstanceProfileInfo_v3_t>(), v3) }
        } else {
            Err(codes::ARGUMENT_VERSION_MISMATCH)
        }
    }
}

export! {
    /// How many more compute instances of a profile fit in the GPU instance.
    fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile_id: c_uint,
        count: *mut c_uint,
    ) {
        let n = runtime::with_machine(|m| {
            let (g, gi) = gpu_instance(m, gpu_instance_handle, NAME)?;
            let (gp, cp) = ci_profile(m, g, gi, profile_id)?;
            m.gpus[g]
                .mig
                .remaining_ci_capacity(gi, gp.compute_slices, &cp)
                .map_err(|e| e.code())
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(count, n) }
    }
}

export! {
    /// Every placement of a compute-instance profile in the GPU instance.
    fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile_id: c_uint,
        placements: *mut sys::nvmlComputeInstancePlacement_t,
        count: *mut c_uint,
    ) {
        non_null(count)?;
        let list: Vec<sys::nvmlComputeInstancePlacement_t> = runtime::with_machine(|m| {
            let (g, gi) = gpu_instance(m, gpu_instance_handle, NAME)?;
            let (_, cp) = ci_profile(m, g, gi, profile_id)?;
            Ok(cp
                .placements
                .iter()
                .map(|s| sys::nvmlComputeInstancePlacement_t { start: *s, size: cp.placement_size })
                .collect())
        })?;
        // SAFETY: in/out count and array of `*count` elements per the contract.
        unsafe { write_counted(placements, count, &list) }
    }
}

fn create(
    gpu_instance_handle: sys::nvmlGpuInstance_t,
    name: &str,
    profile_id: c_uint,
    placement: Option<sys::nvmlComputeInstancePlacement_t>,
) -> Result<u64, Code> {
    runtime::with_machine(|m| {
        let (g, gi) = gpu_instance(m, gpu_instance_handle, name)?;
        let (_, cp) = ci_profile(m, g, gi, profile_id)?;
        if let Some(p) = placement
            && p.size != cp.placement_size
        {
            return Err(codes::INVALID_ARGUMENT);
        }
        let id = m.mutate(g, |gpu| {
            machine::create_compute_instance(gpu, gi, profile_id, placement.map(|p| p.start))
        })?;
        Ok(m.ci_handle(g, m.ci(g, gi, id)?))
    })
}

export! {
    /// Creates a compute instance at the first free placement.
    fn nvmlGpuInstanceCreateComputeInstance(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instance: *mut sys::nvmlComputeInstance_t,
    ) {
        non_null(compute_instance)?;
        let h = create(gpu_instance_handle, NAME, profile_id, None)?;
        // SAFETY: output pointer per the contract (checked non-null above).
        unsafe { write(compute_instance, pointer_of(h)) }
    }
}

export! {
    /// Creates a compute instance at a placement.
    fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile_id: c_uint,
        placement: *const sys::nvmlComputeInstancePlacement_t,
        compute_instance: *mut sys::nvmlComputeInstance_t,
    ) {
        non_null(compute_instance)?;
        // SAFETY: input pointer per the contract.
        let placement = unsafe { read(placement) }?;
        let h = create(gpu_instance_handle, NAME, profile_id, Some(placement))?;
        // SAFETY: output pointer per the contract (checked non-null above).
        unsafe { write(compute_instance, pointer_of(h)) }
    }
}

export! {
    /// The compute instances of a profile in the GPU instance. The array must
    /// hold the profile's instance count.
    fn nvmlGpuInstanceGetComputeInstances(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        profile_id: c_uint,
        compute_instances: *mut sys::nvmlComputeInstance_t,
        count: *mut c_uint,
    ) {
        let list: Vec<sys::nvmlComputeInstance_t> = runtime::with_machine(|m| {
            let (g, gi) = gpu_instance(m, gpu_instance_handle, NAME)?;
            let (_, cp) = ci_profile(m, g, gi, profile_id)?;
            Ok(m.gi(g, gi)?
                .compute_instances
                .iter()
                .filter(|c| c.profile_id == cp.id)
                .map(|c| pointer_of(m.ci_handle(g, c)))
                .collect())
        })?;
        // SAFETY: array sized for the profile's instance count and output
        // count per the contract.
        unsafe { write_array(compute_instances, count, &list) }
    }
}

export! {
    /// The compute instance with an id; NOT_FOUND if there is none.
    fn nvmlGpuInstanceGetComputeInstanceById(
        gpu_instance_handle: sys::nvmlGpuInstance_t,
        id: c_uint,
        compute_instance: *mut sys::nvmlComputeInstance_t,
    ) {
        let h = runtime::with_machine(|m| {
            let (g, gi) = gpu_instance(m, gpu_instance_handle, NAME)?;
            let ci = m
                .gi(g, gi)?
                .compute_instances
                .iter()
                .find(|c| c.id == id)
                .ok_or(codes::NOT_FOUND)?;
            Ok(m.ci_handle(g, ci))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(compute_instance, pointer_of(h)) }
    }
}

export! {
    /// Parent device, GPU instance, id, profile id and placement of a
    /// compute instance.
    fn nvmlComputeInstanceGetInfo_v2(
        compute_instance_handle: sys::nvmlComputeInstance_t,
        info: *mut sys::nvmlComputeInstanceInfo_t,
    ) {
        let value = runtime::with_machine(|m| {
            let (g, gi, ci) = compute_instance(m, compute_instance_handle, NAME)?;
            let gpu_instance = m.gi(g, gi)?;
            let c = m.ci(g, gi, ci)?;
            Ok(sys::nvmlComputeInstanceInfo_t {
                device: pointer_of(m.gpu_handle(g)),
                gpuInstance: pointer_of(m.gi_handle(g, gpu_instance)),
                id: c.id,
                profileId: c.profile_id,
                placement: sys::nvmlComputeInstancePlacement_t { start: c.start, size: c.size },
            })
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(info, value) }
    }
}

export! {
    /// Destroys a compute instance.
    fn nvmlComputeInstanceDestroy(compute_instance_handle: sys::nvmlComputeInstance_t) {
        runtime::with_machine(|m| {
            let (g, gi, ci) = compute_instance(m, compute_instance_handle, NAME)?;
            m.mutate(g, |gpu| gpu.mig.destroy_compute_instance(gi, ci).map_err(|e| e.code()))
        })
    }
}
