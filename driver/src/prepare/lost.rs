//! Releasing what the ledger names for a claim whose checkpoint entry was
//! lost (see [`crate::prepare::checkpoint::LostClaim`]): when kubelet
//! unprepares the claim, which the checkpoint no longer knows, and once
//! the claim is prepared again (then only what its new entry does not name
//! is released: MIG devices and MPS daemons of the earlier preparation are
//! adopted by the new one).
//!
//! Runs under every GPU's lock: the ledger names devices, not GPUs, and
//! this path is rare. A thing another entry, or another lost claim, names
//! is left; the claim leaves the ledger once every step succeeded. A
//! compute mode the lost entry set is handed to the new entry (see
//! [`adopt_compute_modes`]), whose unprepare then restores it.

use std::collections::HashSet;

use gpu_nvml::ComputeMode;

use super::Inner;
use super::checkpoint::{
    Batch, ClaimEntry, ClaimUid, ComputeModeChange, DeviceKind, LostClaim, PreparedDeviceRecord,
    UNATTRIBUTED, is_daemon_of,
};
use super::compute_mode::{index_of, mode_name, needed_by_others, parse_mode};
use super::kinds::{KINDS, Release};
use super::plan::Target;

/// Every GPU minor of the node (the locks a release takes; the lock table
/// sorts them and drops repeats).
pub(super) fn all_minors(inner: &Inner) -> Vec<u32> {
    inner.catalog.values().map(Target::gpu_minor).collect()
}

/// Releases what the ledger names for `uid`, if it knows the claim, and
/// drops the claim from it (blocking; under every GPU's lock). On failure
/// the claim stays in the ledger, for the retry.
pub(super) fn release(inner: &Inner, uid: &ClaimUid) -> Result<(), Vec<String>> {
    // Names no claim owns are never a claim's to release.
    if uid.0 == UNATTRIBUTED {
        return Ok(());
    }
    release_claim(inner, uid)?;
    release_unattributed(inner, uid)
}

/// Whether the ledger's unattributed names hold an MPS daemon of `uid`
/// (see [`release_unattributed`]).
pub(super) fn names_daemon_of(inner: &Inner, uid: &ClaimUid) -> bool {
    inner.store.any_lost_where(|key, l| {
        key.0 == UNATTRIBUTED && l.mps_daemons.iter().any(|d| is_daemon_of(d, uid))
    })
}

/// Takes the MPS daemons of claim `uid` out of the ledger's unattributed
/// names, at kubelet's unprepare of the claim, and stops those that no
/// checkpoint entry and no other lost claim names (blocking). The only
/// unattributed names a claim's unprepare releases: a daemon's id names
/// the claim it was started for ([`is_daemon_of`]), so this holds however
/// damaged the text it was found in; MIG device UUIDs name no claim and
/// stay until they are gone or the ledger is removed by hand. Called
/// before the claim's entry, if it has one, is undone: a daemon the entry
/// records is left to that undo (which then also restores the compute
/// mode), as it is no longer held by the ledger.
pub(super) fn release_unattributed(inner: &Inner, uid: &ClaimUid) -> Result<(), Vec<String>> {
    let key = ClaimUid::from(UNATTRIBUTED);
    let ledger = inner.store.lost();
    let Some(names) = ledger.get(&key) else {
        return Ok(());
    };
    let ids: Vec<&String> = names
        .mps_daemons
        .iter()
        .filter(|d| is_daemon_of(d, uid))
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let checkpoint = inner.store.snapshot();
    let named = |id: &str| {
        checkpoint
            .claims
            .values()
            .flat_map(|e| e.devices.iter())
            .any(|r| r.sharing.mps_daemon.as_ref().is_some_and(|m| m.id == id))
            || ledger
                .iter()
                .any(|(k, l)| *k != key && l.mps_daemons.contains(id))
    };
    let mut errors = Vec::new();
    let mut released = Vec::new();
    for id in ids {
        if !named(id)
            && let Err(e) = inner.mps.stop(id)
        {
            errors.push(format!(
                "stop MPS daemon {id} (an unattributed name of the ledger of lost entries): {e}"
            ));
            continue;
        }
        released.push(id.clone());
    }
    if let Err(e) = inner.store.update_lost(|ledger| {
        if let Some(names) = ledger.get_mut(&key) {
            names.mps_daemons.retain(|d| !released.contains(d));
            if names.names_nothing() {
                ledger.remove(&key);
            }
        }
    }) {
        errors.push(format!(
            "drop the claim's MPS daemons from the ledger of lost entries: {e}"
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    tracing::info!(claim = %uid, daemons = ?released, "released the claim's MPS daemons the ledger kept as unattributed names of damaged checkpoint text");
    Ok(())
}

/// [`release`] of what the ledger names under the claim's own UID.
fn release_claim(inner: &Inner, uid: &ClaimUid) -> Result<(), Vec<String>> {
    let ledger = inner.store.lost();
    let Some(claim) = ledger.get(uid) else {
        return Ok(());
    };
    let checkpoint = inner.store.snapshot();
    let entries: Vec<_> = checkpoint.claims.iter().collect();
    let other_lost = || ledger.iter().filter(|(u, _)| *u != uid).map(|(_, l)| l);
    let mut errors = Vec::new();
    // GPUs whose mode the claim's new entry now restores.
    let mut adopted = HashSet::new();
    if let Some(entry) = checkpoint.claims.get(uid)
        && let Some((updated, gpus)) = adopt_compute_modes(claim, entry)
    {
        match inner.store.commit(Batch::new().put(uid.clone(), updated)) {
            Ok(()) => adopted = gpus,
            Err(e) => errors.push(format!(
                "hand the compute modes to restore to the claim's new entry: {e}"
            )),
        }
    }
    let mut cx = Release {
        inner,
        claim,
        checkpoint: &checkpoint,
        other_lost: other_lost().collect(),
        errors,
    };
    for kind in KINDS.iter().rev() {
        kind.release_lost(&mut cx);
    }
    let mut errors = cx.errors;
    for (gpu, previous) in claim
        .compute_modes
        .iter()
        .filter(|(gpu, _)| !adopted.contains(gpu.as_str()))
    {
        let needed = needed_by_others(gpu, &entries)
            || other_lost().any(|l| l.compute_modes.contains_key(gpu));
        let (Some(index), Some(mode)) = (index_of(inner, gpu), parse_mode(previous)) else {
            tracing::warn!(claim = %uid, gpu = %gpu, mode = %previous, "compute mode of a lost entry not restored: unknown GPU or mode");
            continue;
        };
        if !needed && let Err(e) = inner.backend.set_compute_mode(index, mode) {
            errors.push(format!("restore the compute mode of GPU {gpu}: {e}"));
        }
    }
    if !checkpoint.claims.contains_key(uid)
        && let Err(e) = inner.opts.cdi.remove(&uid.0)
    {
        errors.push(format!("remove CDI spec: {e}"));
    }
    if !checkpoint.claims.contains_key(uid)
        && let Err(e) = super::metadata_files::remove_lost(inner, uid)
    {
        errors.push(format!("remove device metadata: {e}"));
    }
    if errors.is_empty()
        && let Err(e) = inner.store.update_lost(|ledger| {
            ledger.remove(uid);
        })
    {
        errors.push(format!(
            "drop the claim from the ledger of lost entries: {e}"
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    tracing::info!(
        claim = %uid,
        source = %claim.source,
        mig = ?claim.mig_uuids,
        mps = ?claim.mps_daemons,
        compute_modes_handed_over = ?adopted,
        "released what a lost checkpoint entry named"
    );
    Ok(())
}

/// The claim's new `entry` with the compute modes its lost entry set and
/// the new one did not record, and those GPUs; `None` when there are none.
///
/// Prepared again while a GPU is still in the mode the lost entry set, the
/// new prepare changes nothing and records no mode to restore, and its
/// unprepare would leave the GPU in it. So the whole-GPU record that needs
/// the mode (an MPS daemon: `ExclusiveProcess`; a time slice: `Default`)
/// takes over the change, with the mode the lost entry found before.
fn adopt_compute_modes<'a>(
    lost: &'a LostClaim,
    entry: &ClaimEntry,
) -> Option<(ClaimEntry, HashSet<&'a str>)> {
    let mut updated = entry.clone();
    let mut gpus = HashSet::new();
    for (gpu, previous) in &lost.compute_modes {
        let on_gpu = |r: &PreparedDeviceRecord| {
            !r.admin && matches!(&r.kind, DeviceKind::Gpu { uuid, .. } if uuid == gpu)
        };
        // The new prepare changed the mode itself: it knows the one it found.
        if updated
            .devices
            .iter()
            .any(|r| on_gpu(r) && r.sharing.compute_mode.is_some())
        {
            continue;
        }
        let needing = updated
            .devices
            .iter_mut()
            .filter(|r| on_gpu(r))
            .find_map(|r| {
                let set = if r.sharing.mps_daemon.is_some() {
                    ComputeMode::ExclusiveProcess
                } else if r.sharing.time_slice_interval.is_some() {
                    ComputeMode::Default
                } else {
                    return None;
                };
                Some((r, set))
            });
        if let Some((record, set)) = needing {
            record.sharing.compute_mode = Some(ComputeModeChange {
                set: mode_name(set).to_owned(),
                previous: previous.clone(),
            });
            gpus.insert(gpu.as_str());
        }
    }
    (!gpus.is_empty()).then_some((updated, gpus))
}

#[cfg(test)]
mod tests {
    use super::adopt_compute_modes;
    use crate::prepare::checkpoint::{
        ClaimEntry, ClaimState, ComputeModeChange, DeviceKind, LostClaim, MpsDaemonRecord,
        PreparedDeviceRecord, SharingApplied,
    };

    const GPU: &str = "GPU-11111111-2222-3333-4444-555555555555";

    fn record(uuid: &str, sharing: SharingApplied, admin: bool) -> PreparedDeviceRecord {
        PreparedDeviceRecord {
            kind: DeviceKind::Gpu {
                uuid: uuid.into(),
                minor: 0,
            },
            requests: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            share_id: None,
            cdi_device_ids: vec![],
            sharing,
            admin,
        }
    }

    fn entry(devices: Vec<PreparedDeviceRecord>) -> ClaimEntry {
        ClaimEntry {
            state: ClaimState::PrepareCompleted,
            namespace: "default".into(),
            name: "again".into(),
            devices,
            cdi_spec_paths: vec![],
        }
    }

    fn lost(previous: &str) -> LostClaim {
        LostClaim {
            compute_modes: [(GPU.to_owned(), previous.to_owned())].into(),
            ..LostClaim::default()
        }
    }

    fn mps() -> SharingApplied {
        SharingApplied {
            mps_daemon: Some(MpsDaemonRecord {
                id: "claim-x-0".into(),
                ..MpsDaemonRecord::default()
            }),
            ..SharingApplied::default()
        }
    }

    fn change(set: &str, previous: &str) -> ComputeModeChange {
        ComputeModeChange {
            set: set.into(),
            previous: previous.into(),
        }
    }

    #[test]
    fn the_record_that_needs_the_mode_takes_over_what_the_lost_entry_found() {
        let admin = record(GPU, mps(), true);
        let found = lost("Default");
        let (updated, gpus) = adopt_compute_modes(
            &found,
            &entry(vec![admin.clone(), record(GPU, mps(), false)]),
        )
        .unwrap();
        assert_eq!(gpus.into_iter().collect::<Vec<_>>(), [GPU]);
        assert_eq!(updated.devices[0], admin, "an admin record changes nothing");
        assert_eq!(
            updated.devices[1].sharing.compute_mode,
            Some(change("ExclusiveProcess", "Default"))
        );

        let slice = SharingApplied {
            time_slice_interval: Some("Long".into()),
            ..SharingApplied::default()
        };
        let (updated, _) = adopt_compute_modes(
            &lost("ExclusiveProcess"),
            &entry(vec![record(GPU, slice, false)]),
        )
        .unwrap();
        assert_eq!(
            updated.devices[0].sharing.compute_mode,
            Some(change("Default", "ExclusiveProcess"))
        );
    }

    #[test]
    fn nothing_is_taken_over_where_the_new_entry_knows_the_mode_or_needs_none() {
        let mut own = mps();
        own.compute_mode = Some(change("ExclusiveProcess", "Prohibited"));
        let cases = [
            // Changed by the new prepare itself.
            entry(vec![record(GPU, own, false), record(GPU, mps(), false)]),
            // Another GPU.
            entry(vec![record("GPU-other", mps(), false)]),
            // Exclusive whole GPU: no mode needed.
            entry(vec![record(GPU, SharingApplied::default(), false)]),
            // Only admin access.
            entry(vec![record(GPU, mps(), true)]),
        ];
        for e in cases {
            assert_eq!(adopt_compute_modes(&lost("Default"), &e), None, "{e:?}");
        }
    }
}
