//! Dynamic MIG at prepare time: creating the MIG device a claim was
//! allocated (a GPU instance at exactly the allocated placement and its
//! default compute instance), destroying it at unprepare, giving a GPU back
//! whole, and the startup sweep of MIG devices no prepared claim references.
//!
//! Everything here blocks (NVML calls; the plugin runs it on
//! `spawn_blocking`) and assumes the caller holds the lock of the GPU it
//! touches. It works only through [`GpuBackend`], so the production NVML
//! backend and the fake NVML library run the same code.
//!
//! Rules, the same as NVIDIA's driver:
//! - MIG mode is switched on when needed only where that takes effect
//!   without a GPU reset (compute capability 9 and later: Hopper,
//!   Blackwell). An Ampere GPU with MIG mode off is an error that says a
//!   reset is needed; the driver never resets a GPU.
//! - A failure half-way is rolled back: the backend removes a GPU instance
//!   whose compute instance could not be made, and MIG mode switched on by
//!   this call is switched off again.
//! - A retried prepare (after a crash) finds the MIG device it created
//!   before, with exactly the requested profile and placement, and adopts
//!   it. A GPU instance left at that placement without a compute instance
//!   (a crash between the two steps) is destroyed and made again.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;

use gpu_nvml::{GpuBackend, GpuInfo, MigDevice, MigGpuInstance, MigMode, MigPlacement};

/// The compute capability major from which MIG mode changes take effect
/// without a GPU reset.
pub const RUNTIME_SWITCH_MIN_MAJOR: u32 = 9;

/// Whether `gpu` can switch MIG mode without a reset.
pub fn runtime_switchable(gpu: &GpuInfo) -> bool {
    gpu.cuda_compute_capability.0 >= RUNTIME_SWITCH_MIN_MAJOR
}

/// The MIG device a claim was allocated: a profile at a placement on one
/// GPU (from the published dynamic-MIG device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigRequest {
    /// NVML index of the parent GPU.
    pub gpu_index: u32,
    /// Minor number of the parent GPU (checked against the GPU at the index).
    pub parent_minor: u32,
    /// UUID of the parent GPU (checked against the GPU at the index).
    pub parent_uuid: String,
    /// GPU instance profile id.
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Number of memory slices of the placement.
    pub placement_size: u32,
}

impl MigRequest {
    /// The requested placement.
    pub fn placement(&self) -> MigPlacement {
        MigPlacement {
            start: self.placement_start,
            size: self.placement_size,
        }
    }
}

/// A MIG device made (or adopted) for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedMig {
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// `MIG-...` UUID.
    pub uuid: String,
    /// Whether this call switched MIG mode on.
    pub enabled_mig_mode: bool,
    /// Whether the device already existed (a retried prepare) and was
    /// adopted rather than created.
    pub adopted: bool,
}

/// Errors of MIG device management. Each names the GPU and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MigError {
    /// An NVML call failed.
    #[error("GPU {gpu}: cannot {action}: {source}")]
    Backend {
        /// NVML index of the GPU.
        gpu: u32,
        /// What was being done.
        action: String,
        /// The backend's error.
        #[source]
        source: gpu_nvml::Error,
    },
    /// A node-wide NVML call failed.
    #[error("cannot {action}: {source}")]
    Node {
        /// What was being done.
        action: String,
        /// The backend's error.
        #[source]
        source: gpu_nvml::Error,
    },
    /// The GPU at the index is not the one the request names.
    #[error(
        "GPU {gpu} is {found_uuid} (minor {found_minor}), not {expected_uuid} (minor \
         {expected_minor}) as the allocated device says: the node's GPUs changed since the \
         device was published; the plugin republishes its devices, retry the claim"
    )]
    WrongGpu {
        /// NVML index of the GPU.
        gpu: u32,
        /// UUID the request names.
        expected_uuid: String,
        /// Minor the request names.
        expected_minor: u32,
        /// UUID of the GPU at the index.
        found_uuid: String,
        /// Minor of the GPU at the index.
        found_minor: u32,
    },
    /// The GPU does not support MIG.
    #[error("GPU {gpu} ({uuid}, {product}) does not support MIG")]
    NotMigCapable {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// Product name.
        product: String,
    },
    /// MIG mode would have to change, and on this GPU that needs a reset.
    #[error(
        "GPU {gpu} ({uuid}, {product}, compute capability {cc_major}.{cc_minor}) has MIG mode \
         {current}{pending}; turning it {wanted} needs a GPU reset, which this driver never does: \
         run `nvidia-smi -i {gpu} -mig {wanted_flag}` and reset the GPU (or reboot the node) \
         while nothing uses it",
        current = on_off(*current),
        pending = if pending == current { String::new() } else { format!(" (pending: {})", on_off(*pending)) },
        wanted = on_off(!current),
        wanted_flag = u8::from(!current),
    )]
    ModeNeedsReset {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// Product name.
        product: String,
        /// Compute capability major.
        cc_major: u32,
        /// Compute capability minor.
        cc_minor: u32,
        /// MIG mode in effect.
        current: bool,
        /// MIG mode after the next reset.
        pending: bool,
    },
    /// A MIG mode change was accepted but did not take effect.
    #[error(
        "GPU {gpu} ({uuid}): MIG mode was switched {wanted} but is still {current}{pending}; \
         check `nvidia-smi -i {gpu} -q` (a reset may be pending or a process may hold the GPU)",
        wanted = on_off(*wanted),
        current = on_off(!*wanted),
        pending = if *pending == *wanted { " (the change is pending)" } else { "" },
    )]
    ModeNotApplied {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The mode asked for.
        wanted: bool,
        /// The pending mode NVML reports.
        pending: bool,
    },
    /// The request does not fit this GPU (unknown profile, placement not
    /// among the profile's).
    #[error("GPU {gpu} ({uuid}): {reason}")]
    InvalidRequest {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// What is wrong.
        reason: String,
    },
    /// Other GPU instances occupy (part of) the placement.
    #[error(
        "GPU {gpu} ({uuid}): cannot create {profile} at placement {}:{}: it overlaps {}; \
         unprepare the claims using them, or destroy them if nothing does",
        placement.start,
        placement.size,
        holders.join(", ")
    )]
    PlacementTaken {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// Profile name.
        profile: String,
        /// The requested placement.
        placement: MigPlacement,
        /// What is in the way (MIG UUIDs, or GPU instances without a MIG device).
        holders: Vec<String>,
    },
    /// The GPU is to be used whole but MIG devices exist on it.
    #[error(
        "GPU {gpu} ({uuid}) cannot be used whole: it holds MIG devices ({}); unprepare the \
         claims using them first",
        devices.join(", ")
    )]
    MigDevicesExist {
        /// NVML index of the GPU.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The MIG devices (UUIDs, or GPU instances without a MIG device).
        devices: Vec<String>,
    },
    /// A step failed and undoing the earlier steps failed too.
    #[error("{error}; undoing it also failed: {rollback}")]
    RollbackFailed {
        /// The failure.
        error: Box<MigError>,
        /// Why the rollback failed.
        rollback: Box<MigError>,
    },
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

fn backend_error(gpu: u32, action: impl Into<String>) -> impl FnOnce(gpu_nvml::Error) -> MigError {
    move |source| MigError::Backend {
        gpu,
        action: action.into(),
        source,
    }
}

fn read_gpu(backend: &dyn GpuBackend, gpu: u32) -> Result<GpuInfo, MigError> {
    backend
        .gpu(gpu)
        .map_err(backend_error(gpu, "read the GPU's state"))
}

/// The MIG mode alone (one NVML query, where [`read_gpu`] makes dozens).
fn read_mig_mode(backend: &dyn GpuBackend, gpu: u32) -> Result<Option<MigMode>, MigError> {
    backend
        .mig_mode(gpu)
        .map_err(backend_error(gpu, "read its MIG mode"))
}

fn list_instances(backend: &dyn GpuBackend, gpu: u32) -> Result<Vec<MigGpuInstance>, MigError> {
    backend
        .gpu_instances(gpu)
        .map_err(backend_error(gpu, "list its GPU instances"))
}

/// How a GPU instance is named in messages: its MIG UUIDs, or what it is
/// when it has none.
fn describe(gi: &MigGpuInstance, info: &GpuInfo) -> Vec<String> {
    let uuids: Vec<String> = gi
        .compute_instances
        .iter()
        .filter_map(|c| c.uuid.clone())
        .collect();
    if !uuids.is_empty() {
        return uuids;
    }
    let profile = profile_name(info, gi.profile_id);
    vec![format!(
        "GPU instance {} ({profile} at {}:{}) without a compute instance",
        gi.id, gi.placement.start, gi.placement.size
    )]
}

fn profile_name(info: &GpuInfo, profile_id: u32) -> String {
    info.mig
        .as_ref()
        .and_then(|m| m.profiles.iter().find(|p| p.id == profile_id))
        .map_or_else(|| format!("profile {profile_id}"), |p| p.name.clone())
}

fn overlaps(a: MigPlacement, b: MigPlacement) -> bool {
    a.start < b.start + b.size && b.start < a.start + a.size
}

/// Sets MIG mode and checks it took effect; `Ok` only when it is in effect.
fn switch_mode(backend: &dyn GpuBackend, info: &GpuInfo, enabled: bool) -> Result<(), MigError> {
    let gpu = info.index;
    backend.set_mig_mode(gpu, enabled).map_err(backend_error(
        gpu,
        format!("switch MIG mode {}", on_off(enabled)),
    ))?;
    let after = read_mig_mode(backend, gpu)?;
    if after.is_some_and(|m| m.current_enabled == enabled) {
        tracing::info!(gpu, uuid = %info.uuid, enabled, "MIG mode switched");
        return Ok(());
    }
    Err(MigError::ModeNotApplied {
        gpu,
        uuid: info.uuid.clone(),
        wanted: enabled,
        pending: after.is_some_and(|m| m.pending_enabled),
    })
}

fn needs_reset(info: &GpuInfo, current: bool, pending: bool) -> MigError {
    MigError::ModeNeedsReset {
        gpu: info.index,
        uuid: info.uuid.clone(),
        product: info.product_name.clone(),
        cc_major: info.cuda_compute_capability.0,
        cc_minor: info.cuda_compute_capability.1,
        current,
        pending,
    }
}

/// Enables MIG mode first when it is off and the GPU can switch without a
/// reset (Ampere: [`MigError::ModeNeedsReset`]), then creates the GPU
/// instance at exactly the requested placement and its default compute
/// instance, and reads the MIG UUID. Half-way failure rolls back what it
/// created (MIG mode included). If a MIG device with exactly that profile
/// and placement already exists (a retried prepare after a crash), it is
/// returned (adopted) instead of failing.
///
/// Reads the whole GPU state first; a caller that already holds the GPU's
/// facts (from discovery) uses [`create_on`] and spares that read.
pub fn create(backend: &dyn GpuBackend, req: &MigRequest) -> Result<CreatedMig, MigError> {
    let info = read_gpu(backend, req.gpu_index)?;
    create_on(backend, &info, req)
}

/// [`create`] on a GPU whose facts the caller holds: `info` gives only
/// what does not change while the driver runs (identity, product, compute
/// capability, the MIG profiles and their placements), so discovery's
/// copy serves. What does change is read from the GPU: the MIG mode (one
/// query) and the GPU instances (one listing); the whole state (dozens of
/// queries, every NVLink among them) only to adopt a device a crashed
/// prepare left.
pub fn create_on(
    backend: &dyn GpuBackend,
    info: &GpuInfo,
    req: &MigRequest,
) -> Result<CreatedMig, MigError> {
    let gpu = req.gpu_index;
    if info.index != gpu || info.uuid != req.parent_uuid || info.minor != req.parent_minor {
        return Err(MigError::WrongGpu {
            gpu,
            expected_uuid: req.parent_uuid.clone(),
            expected_minor: req.parent_minor,
            found_uuid: info.uuid.clone(),
            found_minor: info.minor,
        });
    }
    let not_capable = || MigError::NotMigCapable {
        gpu,
        uuid: info.uuid.clone(),
        product: info.product_name.clone(),
    };
    let Some(mig) = &info.mig else {
        return Err(not_capable());
    };
    let invalid = |reason: String| MigError::InvalidRequest {
        gpu,
        uuid: info.uuid.clone(),
        reason,
    };
    let placement = req.placement();
    let Some(profile) = mig.profiles.iter().find(|p| p.id == req.profile_id) else {
        let known: Vec<String> = mig
            .profiles
            .iter()
            .map(|p| format!("{} ({})", p.id, p.name))
            .collect();
        return Err(invalid(format!(
            "no GPU instance profile with id {}; this GPU has {}",
            req.profile_id,
            known.join(", ")
        )));
    };
    if !profile.placements.contains(&placement) {
        let valid: Vec<String> = profile
            .placements
            .iter()
            .map(|p| format!("{}:{}", p.start, p.size))
            .collect();
        return Err(invalid(format!(
            "{} cannot be placed at {}:{}; its placements are {}",
            profile.name,
            placement.start,
            placement.size,
            valid.join(", ")
        )));
    }

    let mode = read_mig_mode(backend, gpu)?.ok_or_else(not_capable)?;
    let mut enabled_mig_mode = false;
    if mode.current_enabled {
        if let Some(adopted) = make_room(backend, info, req, &profile.name)? {
            return Ok(adopted);
        }
    } else if runtime_switchable(info) {
        switch_mode(backend, info, true).map_err(|error| {
            // Leave the mode as it was, even if only pending.
            match switch_mode(backend, info, false) {
                Ok(()) => error,
                Err(rollback) => MigError::RollbackFailed {
                    error: Box::new(error),
                    rollback: Box::new(rollback),
                },
            }
        })?;
        enabled_mig_mode = true;
    } else {
        return Err(needs_reset(info, false, mode.pending_enabled));
    }

    let creating = std::time::Instant::now();
    let device = match backend.create_mig_device(gpu, req.profile_id, placement) {
        Ok(device) => device,
        Err(source) => {
            let error = MigError::Backend {
                gpu,
                action: format!(
                    "create a {} MIG device at placement {}:{}",
                    profile.name, placement.start, placement.size
                ),
                source,
            };
            if enabled_mig_mode && let Err(rollback) = switch_mode(backend, info, false) {
                return Err(MigError::RollbackFailed {
                    error: Box::new(error),
                    rollback: Box::new(rollback),
                });
            }
            return Err(error);
        }
    };
    tracing::info!(
        gpu,
        uuid = %device.uuid,
        profile = %profile.name,
        start = placement.start,
        size = placement.size,
        gi = device.gpu_instance_id,
        ci = device.compute_instance_id,
        enabled_mig_mode,
        // The GPU's own time (instance creation in NVML and the kernel
        // driver), apart from the driver's checks before it.
        create_us = crate::micros(creating),
        "MIG device created"
    );
    Ok(CreatedMig {
        gpu_instance_id: device.gpu_instance_id,
        compute_instance_id: device.compute_instance_id,
        uuid: device.uuid,
        enabled_mig_mode,
        adopted: false,
    })
}

/// On a GPU with MIG mode on: adopts a MIG device that is exactly the
/// request, or clears a GPU instance left at the placement without a
/// compute instance; fails when anything else overlaps the placement.
fn make_room(
    backend: &dyn GpuBackend,
    info: &GpuInfo,
    req: &MigRequest,
    profile: &str,
) -> Result<Option<CreatedMig>, MigError> {
    let gpu = req.gpu_index;
    let placement = req.placement();
    let mut holders = Vec::new();
    for gi in list_instances(backend, gpu)? {
        if !overlaps(gi.placement, placement) {
            continue;
        }
        let exact = gi.profile_id == req.profile_id && gi.placement == placement;
        if exact
            && let [ci] = gi.compute_instances.as_slice()
            && let Some(uuid) = ci.uuid.as_deref()
        {
            // Rare (a retried prepare): the whole state, now, for the
            // device's slices (`info` may be discovery's copy).
            let now = read_gpu(backend, gpu)?;
            let devices: &[MigDevice] = now.mig.as_ref().map_or(&[], |m| &m.devices);
            let device = devices.iter().find(|d| d.uuid == uuid);
            if let Some(device) = device.filter(|d| {
                d.compute_slices
                    .is_none_or(gpu_nvml::ComputeSlices::spans_gpu_instance)
            }) {
                tracing::info!(
                    gpu,
                    uuid = %device.uuid,
                    gi = gi.id,
                    ci = ci.id,
                    "MIG device already exists with the requested profile and placement: adopted"
                );
                return Ok(Some(CreatedMig {
                    gpu_instance_id: gi.id,
                    compute_instance_id: ci.id,
                    uuid: device.uuid.clone(),
                    enabled_mig_mode: false,
                    adopted: true,
                }));
            }
        }
        if exact && gi.compute_instances.is_empty() {
            tracing::warn!(
                gpu,
                gi = gi.id,
                profile,
                start = placement.start,
                size = placement.size,
                "GPU instance without compute instance at the requested placement (left by an \
                 interrupted prepare): destroying it to create the device afresh"
            );
            backend
                .destroy_gpu_instance(gpu, gi.id)
                .map_err(backend_error(
                    gpu,
                    format!(
                        "destroy GPU instance {} left without a compute instance",
                        gi.id
                    ),
                ))?;
            continue;
        }
        holders.extend(describe(&gi, info));
    }
    if holders.is_empty() {
        return Ok(None);
    }
    Err(MigError::PlacementTaken {
        gpu,
        uuid: info.uuid.clone(),
        profile: profile.to_owned(),
        placement,
        holders,
    })
}

/// Destroys compute instance `compute_instance_id` and then GPU instance
/// `gpu_instance_id`; already gone counts as success (also when the GPU's
/// MIG mode is off, so nothing can exist).
pub fn destroy(
    backend: &dyn GpuBackend,
    gpu_index: u32,
    gpu_instance_id: u32,
    compute_instance_id: u32,
) -> Result<(), MigError> {
    let Err(source) = backend.destroy_mig_device(gpu_index, gpu_instance_id, compute_instance_id)
    else {
        return Ok(());
    };
    // NVML refuses instance calls while MIG mode is off: then nothing is
    // left to destroy.
    if let Ok(mode) = backend.mig_mode(gpu_index)
        && mode.is_none_or(|m| !m.current_enabled)
    {
        tracing::info!(
            gpu = gpu_index,
            gi = gpu_instance_id,
            ci = compute_instance_id,
            "MIG mode is off: the MIG device is gone"
        );
        return Ok(());
    }
    Err(MigError::Backend {
        gpu: gpu_index,
        action: format!(
            "destroy MIG device (GPU instance {gpu_instance_id}, compute instance \
             {compute_instance_id})"
        ),
        source,
    })
}

/// Like [`destroy`], but only if the compute instance is still the MIG
/// device `uuid`: after the device is gone its ids may be reused by another
/// claim's device, which a retried unprepare must not destroy. A GPU
/// instance of ours left without compute instances is destroyed.
pub fn destroy_verified(
    backend: &dyn GpuBackend,
    gpu_index: u32,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    uuid: &str,
) -> Result<(), MigError> {
    let instances = match backend.gpu_instances(gpu_index) {
        Ok(instances) => instances,
        Err(source) => {
            return Err(MigError::Backend {
                gpu: gpu_index,
                action: "list its GPU instances".to_owned(),
                source,
            });
        }
    };
    let Some(gi) = instances.iter().find(|g| g.id == gpu_instance_id) else {
        tracing::info!(gpu = gpu_index, %uuid, "MIG device already gone");
        return Ok(());
    };
    match gi
        .compute_instances
        .iter()
        .find(|c| c.id == compute_instance_id)
    {
        Some(ci) if ci.uuid.as_deref().is_some_and(|u| u != uuid) => {
            tracing::warn!(
                gpu = gpu_index,
                gi = gpu_instance_id,
                ci = compute_instance_id,
                expected = %uuid,
                found = ci.uuid.as_deref().unwrap_or_default(),
                "the MIG device is gone and its ids now belong to another device: left alone"
            );
            Ok(())
        }
        Some(_) => destroy(backend, gpu_index, gpu_instance_id, compute_instance_id),
        None if gi.compute_instances.is_empty() => backend
            .destroy_gpu_instance(gpu_index, gpu_instance_id)
            .map_err(backend_error(
                gpu_index,
                format!("destroy GPU instance {gpu_instance_id} left without a compute instance"),
            )),
        None => {
            tracing::info!(
                gpu = gpu_index,
                gi = gpu_instance_id,
                %uuid,
                "MIG device already gone; its GPU instance id now holds other compute instances"
            );
            Ok(())
        }
    }
}

/// Destroys the MIG device `uuid`, on whichever GPU it is (a device named by
/// a lost checkpoint entry: its ids are not known); one already gone counts
/// as success.
pub fn destroy_by_uuid(backend: &dyn GpuBackend, uuid: &str) -> Result<(), MigError> {
    let count = backend.gpu_count().map_err(|source| MigError::Node {
        action: "count the GPUs".to_owned(),
        source,
    })?;
    for gpu in 0..count {
        if read_mig_mode(backend, gpu)?.is_none_or(|m| !m.current_enabled) {
            continue;
        }
        for gi in list_instances(backend, gpu)? {
            if let Some(ci) = gi
                .compute_instances
                .iter()
                .find(|c| c.uuid.as_deref() == Some(uuid))
            {
                // Just found by its UUID: no second look needed.
                return destroy(backend, gpu, gi.id, ci.id);
            }
        }
    }
    tracing::info!(%uuid, "MIG device already gone");
    Ok(())
}

/// A whole-GPU prepare in dynamic MIG mode: if MIG mode is on and no GPU
/// instance exists, switches it off (Hopper and later; Ampere:
/// [`MigError::ModeNeedsReset`]); if MIG devices exist, an error naming
/// them. A GPU with MIG mode off, or without MIG, needs nothing.
pub fn ensure_full_gpu(backend: &dyn GpuBackend, gpu_index: u32) -> Result<(), MigError> {
    // The common case, MIG mode off, costs one query; the whole state is
    // read only when there is something to check or switch.
    if read_mig_mode(backend, gpu_index)?.is_none_or(|m| !m.current_enabled) {
        return Ok(());
    }
    let info = read_gpu(backend, gpu_index)?;
    let Some(mig) = &info.mig else {
        return Ok(());
    };
    if !mig.current_enabled {
        return Ok(());
    }
    let instances = list_instances(backend, gpu_index)?;
    if !instances.is_empty() {
        return Err(MigError::MigDevicesExist {
            gpu: gpu_index,
            uuid: info.uuid.clone(),
            devices: instances.iter().flat_map(|g| describe(g, &info)).collect(),
        });
    }
    if !runtime_switchable(&info) {
        return Err(needs_reset(&info, true, mig.pending_enabled));
    }
    switch_mode(backend, &info, false)
}

/// One GPU instance the sweep destroyed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweptInstance {
    /// NVML index of the GPU.
    pub gpu_index: u32,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// GPU instance profile id.
    pub profile_id: u32,
    /// Its placement.
    pub placement: MigPlacement,
    /// The MIG devices it held (empty for a GPU instance without compute
    /// instances).
    pub uuids: Vec<String>,
}

/// Something the sweep could not do.
#[derive(Debug)]
pub struct SweepFailure {
    /// NVML index of the GPU, when the failure is about one.
    pub gpu_index: Option<u32>,
    /// The GPU instance, when the failure is about one.
    pub gpu_instance_id: Option<u32>,
    /// What went wrong.
    pub error: MigError,
}

impl fmt::Display for SweepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.gpu_instance_id {
            Some(gi) => write!(f, "GPU instance {gi}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// The UUIDs of every MIG device on the node (GPUs in MIG mode only), for
/// the startup recovery's look into damaged checkpoint text.
pub fn node_uuids(backend: &dyn GpuBackend) -> Result<Vec<String>, MigError> {
    let count = backend.gpu_count().map_err(|e| MigError::Node {
        action: "count the GPUs".to_owned(),
        source: e,
    })?;
    let mut uuids = Vec::new();
    for gpu in 0..count {
        if !read_mig_mode(backend, gpu)?.is_some_and(|m| m.current_enabled) {
            continue;
        }
        for gi in list_instances(backend, gpu)? {
            uuids.extend(gi.compute_instances.into_iter().filter_map(|c| c.uuid));
        }
    }
    Ok(uuids)
}

/// What [`sweep`] did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// GPU instances destroyed, with their MIG devices.
    pub destroyed: Vec<SweptInstance>,
    /// MIG UUIDs found and kept (referenced by a prepared claim).
    pub kept: Vec<String>,
    /// Failures; they did not stop the sweep.
    pub failures: Vec<SweepFailure>,
}

/// Startup sweep (dynamic MIG only): destroys every MIG device whose UUID is
/// not in `keep`, and every GPU instance without compute instances (no
/// claim can reference it); returns what was destroyed and per-device
/// failures, which do not stop the sweep. A GPU instance holding a kept
/// device is left whole.
pub fn sweep<S: BuildHasher>(backend: &dyn GpuBackend, keep: &HashSet<String, S>) -> SweepReport {
    let mut report = SweepReport::default();
    let count = match backend.gpu_count() {
        Ok(n) => n,
        Err(e) => {
            report.failures.push(SweepFailure {
                gpu_index: None,
                gpu_instance_id: None,
                error: MigError::Node {
                    action: "count the GPUs".to_owned(),
                    source: e,
                },
            });
            return report;
        }
    };
    for gpu in 0..count {
        sweep_gpu(backend, gpu, keep, &mut report);
    }
    tracing::info!(
        destroyed = report.destroyed.len(),
        kept = report.kept.len(),
        failures = report.failures.len(),
        "MIG sweep done"
    );
    report
}

fn sweep_gpu<S: BuildHasher>(
    backend: &dyn GpuBackend,
    gpu: u32,
    keep: &HashSet<String, S>,
    report: &mut SweepReport,
) {
    let fail = |report: &mut SweepReport, gpu_instance_id, error| {
        tracing::warn!(gpu, gi = ?gpu_instance_id, %error, "MIG sweep: failure");
        report.failures.push(SweepFailure {
            gpu_index: Some(gpu),
            gpu_instance_id,
            error,
        });
    };
    let info = match read_gpu(backend, gpu) {
        Ok(info) => info,
        Err(e) => return fail(report, None, e),
    };
    if info.mig.as_ref().is_none_or(|m| !m.current_enabled) {
        return;
    }
    let instances = match list_instances(backend, gpu) {
        Ok(instances) => instances,
        Err(e) => return fail(report, None, e),
    };
    for gi in instances {
        let uuids: Vec<String> = gi
            .compute_instances
            .iter()
            .filter_map(|c| c.uuid.clone())
            .collect();
        let kept: Vec<String> = uuids
            .iter()
            .filter(|u| keep.contains(*u))
            .cloned()
            .collect();
        if !kept.is_empty() {
            if kept.len() < gi.compute_instances.len() {
                tracing::warn!(
                    gpu,
                    gi = gi.id,
                    kept = ?kept,
                    "MIG sweep: GPU instance holds a referenced MIG device and others; left whole"
                );
            }
            report.kept.extend(kept);
            continue;
        }
        match backend.destroy_gpu_instance(gpu, gi.id) {
            Ok(()) => {
                tracing::info!(gpu, gi = gi.id, uuids = ?uuids, "MIG sweep: destroyed unreferenced GPU instance");
                report.destroyed.push(SweptInstance {
                    gpu_index: gpu,
                    gpu_uuid: info.uuid.clone(),
                    gpu_instance_id: gi.id,
                    profile_id: gi.profile_id,
                    placement: gi.placement,
                    uuids,
                });
            }
            Err(source) => fail(
                report,
                Some(gi.id),
                MigError::Backend {
                    gpu,
                    action: format!("destroy unreferenced GPU instance {}", gi.id),
                    source,
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests;
