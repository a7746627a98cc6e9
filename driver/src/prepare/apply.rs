//! The checkpoint protocol of prepare and unprepare, run under the claim's
//! GPU locks around the kinds' hardware steps ([`super::kinds`]):
//!
//! - [`stage`]: a half-prepared entry an earlier attempt left is undone
//!   first; the claim's devices are checked against the other claims'
//!   ([`super::conflicts`]); the kinds set the devices up, each change
//!   recorded in the claim's entry as it happens (a change startup recovery
//!   could not find by looking is journalled as `PrepareStarted` before it
//!   is made, [`super::journal`]); a failure rolls back exactly what was done;
//! - [`complete`]: the entry, now `PrepareCompleted`, is committed (grouped
//!   with concurrent claims, `super::commits`); [`abandon`] undoes a
//!   staged claim whose commit failed;
//! - [`unprepare`]: the entry's undo, then its removal.
//!
//! The same undo ([`super::kinds::undo`]) serves rollback, unprepare and
//! crash recovery.

use std::collections::BTreeMap;

use super::Inner;
use super::checkpoint::{
    Batch, ClaimEntry, ClaimState, ClaimUid, DeviceKind, PreparedDeviceRecord, SharingApplied,
};
use super::conflicts::check_conflicts;
use super::error::PrepareError;
use super::journal::{commit, entry_for, failpoint};
use super::kinds::{self, undo};
use super::plan::{ClaimPlan, PlannedDevice, Target};

/// What [`stage`] leaves for [`complete`].
pub(crate) enum Staged {
    /// The claim was completed by a concurrent call while this one waited
    /// for the locks: answer its entry.
    Done(ClaimEntry),
    /// The hardware is set up and the CDI spec written; the entry, now
    /// `PrepareCompleted` and registered as pending (see
    /// [`super::commits::Pending`]), still has to be committed.
    Ready(ClaimEntry),
    /// Another call is committing this claim right now: wait for it to
    /// settle and look again.
    InFlight,
    /// An earlier attempt left the claim half-prepared on GPUs whose locks
    /// this call does not hold (the claim was allocated elsewhere since):
    /// take those too and look again.
    Relock,
}

/// Sets up the hardware of `plan` and writes its CDI spec (see the module
/// docs); the caller commits the entry with [`complete`].
///
/// Nothing is written to the checkpoint before the first change that
/// startup recovery could not find on its own: compute mode and
/// time-slice changes are journalled (`PrepareStarted`) before they are
/// made. What recovery finds by looking (MIG devices in dynamic mode, MPS
/// daemons, CDI specs that no completed claim references) is recorded only
/// with `PrepareCompleted`: a crash before it leaves them to the sweep, and
/// a whole-GPU or MIG prepare costs one checkpoint write, not two.
pub(crate) fn stage(inner: &Inner, plan: &ClaimPlan, held: &[u32]) -> Result<Staged, PrepareError> {
    if inner.pending.contains(&plan.uid) {
        return Ok(Staged::InFlight);
    }
    if let Some(stale) = inner.store.get(&plan.uid) {
        // A completed entry appeared while we waited for the locks (the
        // same claim prepared by a concurrent call): answer it.
        if stale.state == ClaimState::PrepareCompleted {
            return Ok(Staged::Done(stale));
        }
        // Undone only under the locks of the GPUs it touched.
        if !entry_minors(&stale).iter().all(|m| held.contains(m)) {
            return Ok(Staged::Relock);
        }
        tracing::warn!(claim = %plan.uid, "an earlier attempt left the claim half-prepared; undoing it first");
        let view = view_on(inner, &entry_minors(&stale));
        let others = others(&view, &plan.uid);
        undo(inner, &plan.uid, &stale, &others).map_err(PrepareError::Undo)?;
        commit(
            inner,
            Batch::new().remove(plan.uid.clone()),
            "drop stale entry",
        )?;
    }
    let view = view_on(inner, &plan.gpu_minors());
    let others_now = others(&view, &plan.uid);
    check_conflicts(plan, &others_now)?;

    let spec_path = inner.opts.cdi.path(&plan.uid.0)?;
    let mut entry = entry_for(plan, ClaimState::PrepareStarted);
    entry.devices = plan.devices.iter().map(planned_record).collect();
    entry.cdi_spec_paths = vec![spec_path];
    failpoint("prepare-after-started");

    if let Err(e) = kinds::setup(inner, plan, &mut entry, &others_now) {
        return Err(roll_back(inner, &plan.uid, entry, &others_now, e));
    }
    entry.state = ClaimState::PrepareCompleted;
    inner.pending.insert(plan.uid.clone(), entry.clone());
    Ok(Staged::Ready(entry))
}

/// Commits the entry [`stage`] made ready. Needs no GPU lock: the entry is
/// pending until the caller settles it, so every other prepare and
/// unprepare sees it.
pub(crate) fn complete(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
) -> Result<(), PrepareError> {
    commit(
        inner,
        Batch::new().put(uid.clone(), entry.clone()),
        "PrepareCompleted",
    )?;
    failpoint("prepare-after-completed");
    Ok(())
}

/// Undoes a staged claim whose commit failed (under its GPU locks again).
pub(crate) fn abandon(
    inner: &Inner,
    uid: &ClaimUid,
    entry: ClaimEntry,
    error: PrepareError,
) -> PrepareError {
    let view = view_on(inner, &entry_minors(&entry));
    let others_now = others(&view, uid);
    roll_back(inner, uid, entry, &others_now, error)
}

/// Undoes a failed prepare and drops its entry if one was journalled;
/// returns the prepare's error. An incomplete undo leaves the entry
/// (`PrepareStarted`) so the next attempt or the next start retries it.
///
/// A failed `PrepareCompleted` commit may have put the entry on disk all
/// the same (only the directory's fsync failed): the store then holds it,
/// and a retry would be answered from it. So the hardware is undone only
/// once the entry reads `PrepareStarted` again; if that write fails too,
/// the claim stays prepared, whole, and the retry's answer is true.
fn roll_back(
    inner: &Inner,
    uid: &ClaimUid,
    mut entry: ClaimEntry,
    others: &[(&ClaimUid, &ClaimEntry)],
    error: PrepareError,
) -> PrepareError {
    tracing::warn!(claim = %uid, error = %error, "prepare failed; rolling back");
    entry.state = ClaimState::PrepareStarted;
    let completed = || {
        inner
            .store
            .get(uid)
            .is_some_and(|e| e.state == ClaimState::PrepareCompleted)
    };
    if completed() {
        let marked = commit(
            inner,
            Batch::new().put(uid.clone(), entry.clone()),
            "mark the completed entry for the rollback",
        );
        if completed() {
            tracing::error!(
                claim = %uid,
                error = %marked.err().map(|e| e.to_string()).unwrap_or_default(),
                "rollback not started: the completed entry is on disk and could not be marked; the claim stays prepared and a retry is answered from it"
            );
            return error;
        }
    }
    if let Err(undo_errors) = undo(inner, uid, &entry, others) {
        tracing::error!(claim = %uid, errors = ?undo_errors, "rollback incomplete; the entry stays for a retry");
        let _ = inner.store.commit(Batch::new().put(uid.clone(), entry));
        return error;
    }
    if inner.store.get(uid).is_some()
        && let Err(e) = commit(inner, Batch::new().remove(uid.clone()), "rollback")
    {
        return e;
    }
    super::metadata_files::remove_after(inner, uid, &entry);
    error
}

/// Undoes `entry` and removes it from the checkpoint.
pub(crate) fn unprepare(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
) -> Result<(), PrepareError> {
    let view = view_on(inner, &entry_minors(entry));
    let others = others(&view, uid);
    undo(inner, uid, entry, &others).map_err(PrepareError::Undo)?;
    failpoint("unprepare-after-undo");
    commit(inner, Batch::new().remove(uid.clone()), "unprepare")?;
    super::metadata_files::remove_after(inner, uid, entry);
    Ok(())
}

/// The entries (committed, with pending ones over them) that touch any of
/// the GPUs `minors`: all that a prepare or undo on those GPUs has to
/// consider. A device overlaps only devices of its own GPU, and a shared
/// MPS daemon serves one GPU (`shared-gpu<minor>`, the others are one
/// claim's own), so entries on other GPUs can change nothing here; copying
/// only these keeps a prepare's cost from growing with the node's claims.
fn view_on(inner: &Inner, minors: &[u32]) -> BTreeMap<ClaimUid, ClaimEntry> {
    let touches = |e: &ClaimEntry| e.devices.iter().any(|d| minors.contains(&d.gpu_minor()));
    inner
        .pending
        .overlay(inner.store.claims_where(touches), touches)
}

/// Every other claim's entry.
fn others<'a>(
    claims: &'a BTreeMap<ClaimUid, ClaimEntry>,
    uid: &ClaimUid,
) -> Vec<(&'a ClaimUid, &'a ClaimEntry)> {
    claims.iter().filter(|(u, _)| *u != uid).collect()
}

/// GPU minors an entry touches (its locks).
pub(crate) fn entry_minors(entry: &ClaimEntry) -> Vec<u32> {
    let mut minors: Vec<u32> = entry
        .devices
        .iter()
        .map(PreparedDeviceRecord::gpu_minor)
        .collect();
    minors.sort_unstable();
    minors.dedup();
    minors
}

/// The record of a device before anything is done to it.
fn planned_record(d: &PlannedDevice) -> PreparedDeviceRecord {
    let kind = match &d.target {
        Target::Gpu(g) => DeviceKind::Gpu {
            uuid: g.uuid.clone(),
            minor: g.minor,
        },
        Target::Mig(m) => DeviceKind::Mig {
            parent_uuid: m.request.parent_uuid.clone(),
            parent_minor: m.request.parent_minor,
            profile_id: m.request.profile_id,
            placement_start: m.request.placement_start,
            placement_size: m.request.placement_size,
            gpu_instance_id: None,
            compute_instance_id: None,
            mig_uuid: None,
            created: false,
        },
        Target::Vfio(v) => DeviceKind::Vfio {
            uuid: v.uuid.clone(),
            minor: v.minor,
            pci_bus_id: v.pci_bus_id.clone(),
            previous_driver: None,
            iommu_group: None,
        },
    };
    PreparedDeviceRecord {
        kind,
        requests: d.requests.clone(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        share_id: d.share_id.clone(),
        cdi_device_ids: Vec::new(),
        sharing: SharingApplied::default(),
        admin: d.admin,
    }
}
