//! Compute modes: the one GPU setting three kinds share. Time-slicing needs
//! `Default`, MPS and memory shares `ExclusiveProcess`; the mode found is
//! recorded (journalled before the change) with the claim's device, and the
//! last claim on the GPU that needs a mode restores it (the undo step is
//! `kinds::restore_compute_mode`).

use gpu_nvml::ComputeMode;

use super::Inner;
use super::checkpoint::{ClaimEntry, ClaimUid, ComputeModeChange, DeviceKind};
use super::error::PrepareError;
use super::journal::journal;
use super::plan::Target;

/// The name a compute mode is recorded under in the checkpoint.
pub(super) fn mode_name(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "Default",
        ComputeMode::ExclusiveProcess => "ExclusiveProcess",
        ComputeMode::Prohibited => "Prohibited",
    }
}

/// The compute mode a checkpoint names; `None` for a name it cannot hold.
pub(super) fn parse_mode(name: &str) -> Option<ComputeMode> {
    match name {
        "Default" => Some(ComputeMode::Default),
        "ExclusiveProcess" => Some(ComputeMode::ExclusiveProcess),
        "Prohibited" => Some(ComputeMode::Prohibited),
        _ => None,
    }
}

/// Sets the compute mode of device `i`'s GPU to `mode`. When it changes,
/// the change (with the mode to restore) is recorded durably first.
pub(super) fn set(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    i: usize,
    index: u32,
    mode: ComputeMode,
) -> Result<(), PrepareError> {
    let device = entry.devices[i].device.clone();
    let nvml = |error| PrepareError::Nvml {
        device: device.clone(),
        error,
    };
    let current = inner.backend.compute_mode(index).map_err(nvml)?;
    if current == mode {
        return Ok(());
    }
    entry.devices[i].sharing.compute_mode = Some(ComputeModeChange {
        set: mode_name(mode).to_owned(),
        previous: mode_name(current).to_owned(),
    });
    journal(inner, uid, entry, "record a compute mode change")?;
    if let Err(error) = inner.backend.set_compute_mode(index, mode) {
        // Refused: the mode is as it was, nothing for the rollback to
        // restore (a restore would fail the same way and keep the entry).
        entry.devices[i].sharing.compute_mode = None;
        return Err(nvml(error));
    }
    Ok(())
}

/// NVML index of the GPU with `uuid` (from the catalog).
pub(super) fn index_of(inner: &Inner, uuid: &str) -> Option<u32> {
    inner.catalog.values().find_map(|t| match t {
        Target::Gpu(g) if g.uuid == uuid => Some(g.index),
        Target::Mig(m) if m.request.parent_uuid == uuid => Some(m.request.gpu_index),
        _ => None,
    })
}

/// Whether a claim in `others` has an MPS daemon or a compute-mode change
/// on the whole GPU `uuid`.
pub(super) fn needed_by_others(uuid: &str, others: &[(&ClaimUid, &ClaimEntry)]) -> bool {
    others.iter().flat_map(|(_, e)| e.devices.iter()).any(|r| {
        !r.admin
            && matches!(&r.kind, DeviceKind::Gpu { uuid: u, .. } if u == uuid)
            && (r.sharing.mps_daemon.is_some() || r.sharing.compute_mode.is_some())
    })
}
