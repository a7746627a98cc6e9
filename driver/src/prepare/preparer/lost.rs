//! Releasing what the ledger names for a claim whose checkpoint entry was
//! lost (see [`crate::prepare::checkpoint::LostClaim`]): when kubelet
//! unprepares the claim, which the checkpoint no longer knows, and once
//! the claim is prepared again (then only what its new entry does not name
//! is released: MIG devices and MPS daemons of the earlier preparation are
//! adopted by the new one).
//!
//! Runs under every GPU's lock: the ledger names devices, not GPUs, and
//! this path is rare. A thing another entry, or another lost claim, names
//! is left; the claim leaves the ledger once every step succeeded.

use std::collections::HashSet;

use gpu_dra_api::config::TimeSliceInterval;

use super::Inner;
use super::apply::{index_of, mode_needed_by_others, parse_mode};
use super::plan::Target;
use crate::prepare::checkpoint::{ClaimUid, DeviceKind};
use crate::prepare::{mig, timeslice};

/// Every GPU minor of the node (the locks a release takes; the lock table
/// sorts them and drops repeats).
pub(super) fn all_minors(inner: &Inner) -> Vec<u32> {
    inner.catalog.values().map(Target::gpu_minor).collect()
}

/// Releases what the ledger names for `uid`, if it knows the claim, and
/// drops the claim from it (blocking; under every GPU's lock). On failure
/// the claim stays in the ledger, for the retry.
pub(super) fn release(inner: &Inner, uid: &ClaimUid) -> Result<(), Vec<String>> {
    let ledger = inner.store.lost();
    let Some(claim) = ledger.get(uid) else {
        return Ok(());
    };
    let checkpoint = inner.store.snapshot();
    let entries: Vec<_> = checkpoint.claims.iter().collect();
    let records = || checkpoint.claims.values().flat_map(|e| e.devices.iter());
    let other_lost = || ledger.iter().filter(|(u, _)| *u != uid).map(|(_, l)| l);
    let named_mig: HashSet<&str> = records()
        .filter_map(|r| match &r.kind {
            DeviceKind::Mig {
                mig_uuid: Some(u), ..
            } => Some(u.as_str()),
            DeviceKind::Mig { .. } | DeviceKind::Gpu { .. } => None,
        })
        .chain(other_lost().flat_map(|l| l.mig_uuids.iter().map(String::as_str)))
        .collect();
    let named_daemons: HashSet<&str> = records()
        .filter_map(|r| r.sharing.mps_daemon.as_ref().map(|m| m.id.as_str()))
        .chain(other_lost().flat_map(|l| l.mps_daemons.iter().map(String::as_str)))
        .collect();
    let mut errors = Vec::new();

    for id in claim
        .mps_daemons
        .iter()
        .filter(|id| !named_daemons.contains(id.as_str()))
    {
        if let Err(e) = inner.mps.stop(id) {
            errors.push(format!("stop MPS daemon {id}: {e}"));
        }
    }
    for gpu in &claim.time_slices {
        let set_since = records().any(|r| {
            matches!(&r.kind, DeviceKind::Gpu { uuid, .. } if uuid == gpu)
                && r.sharing
                    .time_slice_interval
                    .as_deref()
                    .is_some_and(|i| i != "Default")
        });
        // A GPU this plugin does not know is no name to hand nvidia-smi.
        if set_since || index_of(inner, gpu).is_none() {
            continue;
        }
        if let Err(e) =
            timeslice::set_timeslice(&inner.opts.driver_root, gpu, TimeSliceInterval::Default)
        {
            errors.push(format!("reset the time slice of GPU {gpu}: {e}"));
        }
    }
    for (gpu, previous) in &claim.compute_modes {
        let needed = mode_needed_by_others(gpu, &entries)
            || other_lost().any(|l| l.compute_modes.contains_key(gpu));
        let (Some(index), Some(mode)) = (index_of(inner, gpu), parse_mode(previous)) else {
            tracing::warn!(claim = %uid, gpu = %gpu, mode = %previous, "compute mode of a lost entry not restored: unknown GPU or mode");
            continue;
        };
        if !needed && let Err(e) = inner.backend.set_compute_mode(index, mode) {
            errors.push(format!("restore the compute mode of GPU {gpu}: {e}"));
        }
    }
    if inner.opts.build.dynamic_mig {
        for uuid in claim
            .mig_uuids
            .iter()
            .filter(|u| !named_mig.contains(u.as_str()))
        {
            if let Err(e) = mig::destroy_by_uuid(&*inner.backend, uuid) {
                errors.push(format!("destroy MIG device {uuid}: {e}"));
            }
        }
    }
    if !checkpoint.claims.contains_key(uid)
        && let Err(e) = inner.opts.cdi.remove(&uid.0)
    {
        errors.push(format!("remove CDI spec: {e}"));
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
        "released what a lost checkpoint entry named"
    );
    Ok(())
}
