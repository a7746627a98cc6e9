//! Creating and destroying MIG devices: a GPU instance at a placement plus
//! one compute instance covering all of it. Creation is all or nothing: if
//! any step after the GPU instance fails, what was created is destroyed again.
//! Also listing every GPU instance with its compute instances (including a
//! GPU instance left without one), and destroying a whole GPU instance.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;

use super::call;
use super::query;
use super::raw::{self, ComputeInstance, GpuInstance, RawDevice};
use crate::{Error, MigComputeInstance, MigDevice, MigGpuInstance, MigPlacement, Result};

/// Creates GPU instance `profile_id` at `placement` and a full compute
/// instance in it, and returns the resulting MIG device.
pub(super) fn create(
    nvml: &Nvml,
    handle: RawDevice,
    index: u32,
    profile_id: u32,
    placement: MigPlacement,
) -> Result<MigDevice> {
    let gi = raw::create_gpu_instance(nvml, handle, profile_id, placement.start, placement.size)
        .map_err(call("nvmlDeviceCreateGpuInstanceWithPlacement", index))?;
    let created = finish(nvml, handle, index, &gi);
    match created {
        Ok((device, _ci)) => {
            // Debug: the caller reports the creation at info level, with
            // the profile's name and the time it took; a second info line
            // would cost each prepare a log write for nothing.
            tracing::debug!(
                gpu = index,
                profile_id,
                start = placement.start,
                size = placement.size,
                gi = device.gpu_instance_id,
                ci = device.compute_instance_id,
                uuid = %device.uuid,
                "MIG device created"
            );
            Ok(device)
        }
        Err(Failure { error, ci }) => {
            if let Some(ci) = ci
                && let Err(e) = raw::destroy_compute_instance(nvml, ci)
            {
                tracing::error!(gpu = index, error = %e, "rollback: destroying the compute instance failed");
            }
            if let Err(e) = raw::destroy_gpu_instance(nvml, gi) {
                tracing::error!(gpu = index, error = %e, "rollback: destroying the GPU instance failed");
                return Err(Error::Call {
                    call: "nvmlGpuInstanceDestroy",
                    gpu: Some(index),
                    reason: format!("{error}; rolling back the GPU instance also failed: {e}"),
                });
            }
            Err(error)
        }
    }
}

/// A failed step after the GPU instance exists, with the compute instance to
/// roll back if one was created.
struct Failure<'n> {
    error: Error,
    ci: Option<ComputeInstance<'n>>,
}

/// The steps after GPU instance creation: compute instance, ids, MIG handle.
fn finish<'n>(
    nvml: &'n Nvml,
    handle: RawDevice,
    index: u32,
    gi: &GpuInstance<'n>,
) -> Result<(MigDevice, ComputeInstance<'n>), Failure<'n>> {
    let fail = |error: Error| Failure { error, ci: None };
    let gi_info = raw::gpu_instance_info(nvml, gi)
        .map_err(call("nvmlGpuInstanceGetInfo", index))
        .map_err(fail)?;
    let ci_profile = full_compute_profile(nvml, gi, index).map_err(fail)?;
    let ci = raw::create_compute_instance(nvml, gi, ci_profile)
        .map_err(call("nvmlGpuInstanceCreateComputeInstance", index))
        .map_err(fail)?;
    let ci_id = match raw::compute_instance_id(nvml, &ci) {
        Ok(id) => id,
        Err(e) => {
            return Err(Failure {
                error: call("nvmlComputeInstanceGetInfo_v2", index)(e),
                ci: Some(ci),
            });
        }
    };
    let device = handle.device(nvml);
    let found = query::mig_devices(nvml, &device, handle, index).map(|devices| {
        devices
            .into_iter()
            .find(|d| d.gpu_instance_id == gi_info.id && d.compute_instance_id == ci_id)
    });
    match found {
        Ok(Some(mig)) => Ok((mig, ci)),
        Ok(None) => Err(Failure {
            error: Error::Invalid(format!(
                "GPU {index}: NVML created GPU instance {} and compute instance {ci_id} but lists no MIG device for them",
                gi_info.id
            )),
            ci: Some(ci),
        }),
        Err(error) => Err(Failure {
            error,
            ci: Some(ci),
        }),
    }
}

/// The compute instance profile that takes every slice of the GPU instance:
/// the supported one with the most slices.
fn full_compute_profile(nvml: &Nvml, gi: &GpuInstance<'_>, index: u32) -> Result<u32> {
    let mut best: Option<raw::ComputeInstanceProfile> = None;
    for profile in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        match raw::compute_instance_profile(nvml, gi, profile) {
            Ok(p) if best.is_none_or(|b| p.slice_count > b.slice_count) => best = Some(p),
            Ok(_) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(e) => {
                return Err(call("nvmlGpuInstanceGetComputeInstanceProfileInfo", index)(
                    e,
                ));
            }
        }
    }
    best.map(|p| p.id).ok_or_else(|| {
        Error::Invalid(format!(
            "GPU {index}: the new GPU instance offers no compute instance profile"
        ))
    })
}

/// Destroys compute instance `ci_id` and then GPU instance `gi_id`. A GPU
/// instance that no longer exists counts as destroyed (unprepare may be
/// retried); a GPU instance whose compute instance is already gone is
/// destroyed all the same.
pub(super) fn destroy(
    nvml: &Nvml,
    handle: RawDevice,
    index: u32,
    gi_id: u32,
    ci_id: u32,
) -> Result<()> {
    let gi = match raw::gpu_instance_by_id(nvml, handle, gi_id) {
        Ok(gi) => gi,
        Err(NvmlError::NotFound) => {
            tracing::info!(
                gpu = index,
                gi = gi_id,
                ci = ci_id,
                "MIG device already gone"
            );
            return Ok(());
        }
        Err(e) => return Err(call("nvmlDeviceGetGpuInstanceById", index)(e)),
    };
    match raw::compute_instance_by_id(nvml, &gi, ci_id) {
        Ok(ci) => {
            raw::destroy_compute_instance(nvml, ci)
                .map_err(call("nvmlComputeInstanceDestroy", index))?;
        }
        Err(NvmlError::NotFound) => {
            tracing::info!(
                gpu = index,
                gi = gi_id,
                ci = ci_id,
                "compute instance already gone"
            );
        }
        Err(e) => return Err(call("nvmlGpuInstanceGetComputeInstanceById", index)(e)),
    }
    raw::destroy_gpu_instance(nvml, gi).map_err(call("nvmlGpuInstanceDestroy", index))?;
    tracing::info!(gpu = index, gi = gi_id, ci = ci_id, "MIG device destroyed");
    Ok(())
}

/// Every GPU instance of the GPU with its compute instances, ordered by id;
/// empty when the GPU has no MIG or MIG mode is off.
pub(super) fn list(nvml: &Nvml, handle: RawDevice, index: u32) -> Result<Vec<MigGpuInstance>> {
    let device = handle.device(nvml);
    match device.mig_mode() {
        Ok(mode) if mode.current == sys::NVML_DEVICE_MIG_ENABLE => {}
        Ok(_)
        | Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound,
        ) => return Ok(Vec::new()),
        Err(e) => return Err(call("nvmlDeviceGetMigMode", index)(e)),
    }
    let uuids = query::mig_devices(nvml, &device, handle, index)?;
    let mut out: Vec<MigGpuInstance> = Vec::new();
    for profile_enum in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        let info = match device.profile_info(profile_enum) {
            Ok(info) => info,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(call("nvmlDeviceGetGpuInstanceProfileInfo", index)(e)),
        };
        let gis = match raw::gpu_instances(nvml, handle, info.id, info.instance_count) {
            Ok(gis) => gis,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(call("nvmlDeviceGetGpuInstances", index)(e)),
        };
        for gi in gis {
            let gi_info =
                raw::gpu_instance_info(nvml, &gi).map_err(call("nvmlGpuInstanceGetInfo", index))?;
            if out.iter().any(|g| g.id == gi_info.id) {
                continue;
            }
            let compute_instances = compute_instances(nvml, &gi, index)?
                .into_iter()
                .map(|(_, id, profile_id)| MigComputeInstance {
                    id,
                    profile_id,
                    uuid: uuids
                        .iter()
                        .find(|d| d.gpu_instance_id == gi_info.id && d.compute_instance_id == id)
                        .map(|d| d.uuid.clone()),
                })
                .collect();
            out.push(MigGpuInstance {
                id: gi_info.id,
                profile_id: gi_info.profile_id,
                placement: MigPlacement {
                    start: gi_info.start,
                    size: gi_info.size,
                },
                compute_instances,
            });
        }
    }
    out.sort_by_key(|g| g.id);
    Ok(out)
}

/// The compute instances of a GPU instance as (handle, id, profile id),
/// ordered by id.
fn compute_instances<'n>(
    nvml: &'n Nvml,
    gi: &GpuInstance<'n>,
    index: u32,
) -> Result<Vec<(ComputeInstance<'n>, u32, u32)>> {
    let mut out: Vec<(ComputeInstance<'n>, u32, u32)> = Vec::new();
    for profile_enum in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let profile = match raw::compute_instance_profile(nvml, gi, profile_enum) {
            Ok(p) => p,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => {
                return Err(call("nvmlGpuInstanceGetComputeInstanceProfileInfo", index)(
                    e,
                ));
            }
        };
        let cis = raw::compute_instances(nvml, gi, profile.id, profile.instance_count)
            .map_err(call("nvmlGpuInstanceGetComputeInstances", index))?;
        for ci in cis {
            let (id, profile_id) = raw::compute_instance_info(nvml, &ci)
                .map_err(call("nvmlComputeInstanceGetInfo_v2", index))?;
            if !out.iter().any(|(_, i, _)| *i == id) {
                out.push((ci, id, profile_id));
            }
        }
    }
    out.sort_by_key(|(_, id, _)| *id);
    Ok(out)
}

/// Destroys every compute instance of GPU instance `gi_id`, then the GPU
/// instance. A GPU instance that no longer exists counts as destroyed.
pub(super) fn destroy_gpu_instance(
    nvml: &Nvml,
    handle: RawDevice,
    index: u32,
    gi_id: u32,
) -> Result<()> {
    let gi = match raw::gpu_instance_by_id(nvml, handle, gi_id) {
        Ok(gi) => gi,
        Err(NvmlError::NotFound) => {
            tracing::info!(gpu = index, gi = gi_id, "GPU instance already gone");
            return Ok(());
        }
        Err(e) => return Err(call("nvmlDeviceGetGpuInstanceById", index)(e)),
    };
    let cis = compute_instances(nvml, &gi, index)?;
    let count = cis.len();
    for (ci, _, _) in cis {
        raw::destroy_compute_instance(nvml, ci)
            .map_err(call("nvmlComputeInstanceDestroy", index))?;
    }
    raw::destroy_gpu_instance(nvml, gi).map_err(call("nvmlGpuInstanceDestroy", index))?;
    tracing::info!(
        gpu = index,
        gi = gi_id,
        compute_instances = count,
        "GPU instance destroyed"
    );
    Ok(())
}
