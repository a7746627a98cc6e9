//! Startup recovery: bring the node back to what the checkpoint says, after
//! a crash at any step of a prepare or unprepare.
//!
//! 0. Each kind takes over what it runs where the plugin's flags no longer
//!    point ([`super::kinds::Kind::take_over`]: MPS daemons started under
//!    another `--mps-dir` are taken over there).
//! 1. Entries still `PrepareStarted` were cut off half-way: undo what they
//!    record and drop them (kubelet retries the prepare, which then starts
//!    from scratch). An entry whose undo fails stays, and the next prepare
//!    of that claim undoes it first.
//! 2. Each kind sweeps what it left that no remaining entry references
//!    ([`super::kinds::Kind::sweep`]): with dynamic MIG, MIG devices (a
//!    crash between creating an instance and recording it); MPS daemons,
//!    under `--mps-dir` and, when entries were lost or the ledger names
//!    daemons, this plugin's daemons under an earlier `--mps-dir`.
//! 3. When entries were lost, the compute modes of GPUs no remaining entry
//!    or lost record uses are read, and one other than `Default` is
//!    reported; their time slices, which cannot be read, are reported as
//!    unknown (neither is changed: nothing records who set it).
//! 4. CDI specs of claims without an entry, and temp files of interrupted
//!    writes, are deleted.
//!
//! What the ledger of lost entries names (see
//! [`crate::prepare::checkpoint::LostClaim`]) counts as referenced in steps
//! 2 to 4: kubelet does not prepare a claim again while its pods run, so
//! sweeping what a lost entry set up would take the devices from under
//! them. Names of things no longer there are then forgotten, and a lost
//! claim that names nothing left is dropped from the ledger.
//!
//! Problems are reported and logged; none stops the plugin.

use std::collections::{BTreeMap, HashSet};

use gpu_nvml::ComputeMode;

use super::Inner;
use super::checkpoint::{
    Batch, Checkpoint, ClaimState, ClaimUid, LoadReport, LostClaim, PreparedDeviceRecord,
    UNATTRIBUTED,
};
use super::compute_mode::mode_name;
use super::kinds::{KINDS, Recovery, undo};
use super::mig;
use super::plan::{GpuTarget, Target};
use super::report::{Found, RecoveryReport};

/// Runs the recovery steps (blocking).
pub(crate) fn recover(inner: &Inner, load: LoadReport) -> RecoveryReport {
    let mut report = RecoveryReport {
        load,
        ..RecoveryReport::default()
    };
    let snapshot = inner.store.snapshot();
    for kind in KINDS {
        kind.take_over(inner, &snapshot, &mut report);
    }
    let mut drop_batch = Batch::new();
    for (uid, entry) in &snapshot.claims {
        if entry.state != ClaimState::PrepareStarted {
            continue;
        }
        let others: Vec<_> = snapshot
            .claims
            .iter()
            .filter(|(u, e)| *u != uid && e.state == ClaimState::PrepareCompleted)
            .collect();
        match undo(inner, uid, entry, &others) {
            Ok(()) => {
                report.undone.push(uid.0.clone());
                drop_batch = drop_batch.remove(uid.clone());
            }
            Err(errors) => report
                .errors
                .extend(errors.into_iter().map(|e| format!("undo claim {uid}: {e}"))),
        }
    }
    if let Err(e) = inner.store.commit(drop_batch) {
        report
            .errors
            .push(format!("drop undone claims from the checkpoint: {e}"));
    }

    let remaining = inner.store.snapshot();
    let mut lost = inner.store.lost();
    let read_whole = look_in_damaged_text(inner, &mut lost, &mut report);
    let mut found = Found::default();
    let mut cx = Recovery {
        inner,
        remaining: &remaining,
        lost: &lost,
        report: &mut report,
        found: &mut found,
    };
    for kind in KINDS {
        kind.sweep(&mut cx);
    }
    if report.load.lost_entries() {
        unrecorded_gpu_settings(inner, &remaining, &lost, &mut report);
    }

    let cdi = &inner.opts.cdi;
    if let Err(e) = cdi.remove_temp_files() {
        report.errors.push(format!("remove CDI temp files: {e}"));
    }
    match cdi.list() {
        Ok(uids) => {
            for uid in uids {
                if remaining.claims.keys().any(|u| u.0 == uid) {
                    continue;
                }
                if lost.contains_key(&ClaimUid(uid.clone())) {
                    found.cdi.insert(uid);
                    continue;
                }
                // A claim whose entry's key was damaged: its UID is in the
                // damaged text, a byte off at most. Its spec is its own
                // (named by its UID), so it is kept for it, in a record
                // that names nothing else, until its unprepare.
                if let Some(source) = lost
                    .values()
                    .find(|l| l.holds_nearly(&uid))
                    .map(|l| l.source.clone())
                {
                    lost.insert(
                        ClaimUid(uid.clone()),
                        LostClaim {
                            source: format!("its UID in damaged text of {source}"),
                            ..LostClaim::default()
                        },
                    );
                    found.cdi.insert(uid);
                    continue;
                }
                match cdi.remove(&uid) {
                    Ok(_) => report.cdi_removed.push(uid),
                    Err(e) => report.errors.push(format!("remove CDI spec of {uid}: {e}")),
                }
            }
        }
        Err(e) => report.errors.push(format!("list CDI specs: {e}")),
    }
    if let Err(e) = super::metadata_files::sweep(inner, &remaining, &lost) {
        report.errors.push(format!("sweep device metadata: {e}"));
    }
    prune_lost(inner, lost, &found, read_whole, &mut report);
    report
}

/// Adds to each lost claim the names of the MIG devices (with dynamic MIG,
/// the only ones a sweep or release touches) and MPS daemons on the node
/// that its damaged text holds, one byte off at most
/// ([`LostClaim::holds_nearly`]). Whether every name on the node could be
/// read: if not, the text stays for the next start.
fn look_in_damaged_text(
    inner: &Inner,
    lost: &mut BTreeMap<ClaimUid, LostClaim>,
    report: &mut RecoveryReport,
) -> bool {
    if lost.values().all(|l| l.damaged_text.is_empty()) {
        return true;
    }
    let mut whole = true;
    let mig = if inner.opts.build.dynamic_mig {
        mig::node_uuids(&*inner.backend).unwrap_or_else(|e| {
            report.errors.push(format!(
                "list MIG devices for the damaged checkpoint text: {e}"
            ));
            whole = false;
            Vec::new()
        })
    } else {
        Vec::new()
    };
    let daemons = inner.mps.list().unwrap_or_else(|e| {
        report.errors.push(format!(
            "list MPS daemons for the damaged checkpoint text: {e}"
        ));
        whole = false;
        Vec::new()
    });
    for (uid, claim) in lost.iter_mut() {
        let found_mig: Vec<&String> = mig
            .iter()
            .filter(|u| !claim.mig_uuids.contains(*u) && claim.holds_nearly(u))
            .collect();
        let found_daemons: Vec<&String> = daemons
            .iter()
            .filter(|d| !claim.mps_daemons.contains(*d) && claim.holds_nearly(d))
            .collect();
        if found_mig.is_empty() && found_daemons.is_empty() {
            continue;
        }
        tracing::warn!(
            claim = %uid,
            mig = ?found_mig,
            mps = ?found_daemons,
            "damaged checkpoint text names these, a byte off: kept as named"
        );
        claim.mig_uuids.extend(found_mig.into_iter().cloned());
        claim.mps_daemons.extend(found_daemons.into_iter().cloned());
    }
    whole
}

/// Forgets the names of lost claims whose things are gone, drops claims
/// that name nothing left, and reports what is kept.
fn prune_lost(
    inner: &Inner,
    lost: BTreeMap<ClaimUid, LostClaim>,
    found: &Found,
    read_whole: bool,
    report: &mut RecoveryReport,
) {
    let mut pruned = BTreeMap::new();
    for (uid, mut claim) in lost {
        claim.mig_uuids.retain(|u| found.mig.contains(u));
        claim.mps_daemons.retain(|d| found.daemons.contains(d));
        // Looked in: what it names on the node is named now.
        if read_whole {
            claim.damaged_text.clear();
        }
        let spec = found.cdi.contains(&uid.0);
        if claim.names_nothing() && !spec && claim.damaged_text.is_empty() {
            report.lost_forgotten.push(uid.0);
            continue;
        }
        let mut kept = Vec::new();
        if !claim.mig_uuids.is_empty() {
            kept.push(format!("MIG devices {:?}", claim.mig_uuids));
        }
        if !claim.mps_daemons.is_empty() {
            kept.push(format!("MPS daemons {:?}", claim.mps_daemons));
        }
        if spec {
            kept.push("its CDI spec".to_owned());
        }
        let whose = if uid.0 == UNATTRIBUTED {
            "no claim (unattributed names of damaged checkpoint text)".to_owned()
        } else {
            uid.0.clone()
        };
        report
            .lost_kept
            .push(format!("{whose} ({}): {}", claim.source, kept.join(", ")));
        pruned.insert(uid, claim);
    }
    if let Err(e) = inner.store.update_lost(|ledger| *ledger = pruned) {
        report
            .errors
            .push(format!("update the ledger of lost entries: {e}"));
    }
}

/// After lost entries: the GPUs no remaining entry has a device on whose
/// compute mode is not `Default`, and all of them for their time slices,
/// which cannot be read (nothing records a change to undo, so nothing is
/// changed; see [`RecoveryReport::compute_mode_unrecorded`] and
/// [`RecoveryReport::time_slice_unknown`]).
fn unrecorded_gpu_settings(
    inner: &Inner,
    remaining: &Checkpoint,
    lost: &BTreeMap<ClaimUid, LostClaim>,
    report: &mut RecoveryReport,
) {
    // Settings a lost entry recorded are restored when its claim is
    // unprepared: not unrecorded.
    let used: HashSet<&str> = remaining
        .claims
        .values()
        .flat_map(|e| e.devices.iter())
        .map(PreparedDeviceRecord::gpu_uuid)
        .chain(lost.values().flat_map(|l| {
            l.compute_modes
                .keys()
                .chain(&l.time_slices)
                .map(String::as_str)
        }))
        .collect();
    // The GPUs a claim can get whole: the only ones a prepare sets a
    // compute mode or time slice on.
    let mut gpus: Vec<&GpuTarget> = inner
        .catalog
        .values()
        .filter_map(|t| match t {
            Target::Gpu(g) if !used.contains(g.uuid.as_str()) => Some(g),
            _ => None,
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    gpus.dedup_by_key(|g| g.index);
    for gpu in gpus {
        report
            .time_slice_unknown
            .push(format!("{} (index {})", gpu.uuid, gpu.index));
        match inner.backend.compute_mode(gpu.index) {
            Ok(ComputeMode::Default) => {}
            Ok(mode) => report.compute_mode_unrecorded.push(format!(
                "{} (index {}) is {}",
                gpu.uuid,
                gpu.index,
                mode_name(mode)
            )),
            Err(e) => report.errors.push(format!(
                "read the compute mode of GPU {} (index {}): {e}",
                gpu.uuid, gpu.index
            )),
        }
    }
}
