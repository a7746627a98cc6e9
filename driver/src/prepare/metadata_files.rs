//! When prepare, unprepare and recovery write and remove the KEP-5304
//! device metadata files ([`super::metadata`] writes them): the files of a
//! claim go with its CDI spec, are removed once its unprepare is recorded,
//! and the start's sweep removes those of claims without an entry. Kept
//! apart from the writer so that the writer does not depend on the plan
//! and the prepare error, which name it.

use std::collections::BTreeMap;

use super::cdi::{ClaimSpec, ContainerEdits};
use super::checkpoint::{Checkpoint, ClaimEntry, ClaimUid, LostClaim};
use super::error::PrepareError;
use super::metadata::{ClaimId, PreparedDevice};
use super::plan::ClaimPlan;

/// Writes the files of the claim `plan` and adds each request's mount to
/// the first of its devices in `spec` (`names`: the CDI device name of each
/// planned device), when the plugin writes metadata.
pub(crate) fn add_to_claim(
    inner: &super::Inner,
    plan: &ClaimPlan,
    names: &[String],
    spec: &mut ClaimSpec,
) -> Result<(), PrepareError> {
    let Some(writer) = &inner.metadata else {
        return Ok(());
    };
    let devices: Vec<PreparedDevice<'_>> = plan
        .devices
        .iter()
        .map(|d| PreparedDevice {
            requests: &d.requests,
            pool: &d.pool,
            device: &d.device,
        })
        .collect();
    let claim = ClaimId {
        uid: &plan.uid.0,
        namespace: &plan.namespace,
        name: &plan.name,
    };
    let mounts = writer.write(claim, &plan.metadata, &devices)?;
    for (i, mount) in mounts {
        let edits = ContainerEdits {
            mounts: vec![mount],
            ..ContainerEdits::default()
        };
        spec.add_edits(&names[i], edits)?;
    }
    Ok(())
}

/// Removes the files of the claim `entry` records, once its unprepare or
/// rollback is done: after the checkpoint write, so that the write's
/// fsync does not also wait for these directory changes. A failure is
/// logged; the start's sweep removes the files of a claim without entry.
pub(crate) fn remove_after(inner: &super::Inner, uid: &ClaimUid, entry: &ClaimEntry) {
    let Some(writer) = &inner.metadata else {
        return;
    };
    if let Err(e) = writer.remove(&entry.namespace, &entry.name, &uid.0) {
        tracing::warn!(claim = %uid, error = %e, "device metadata files not removed; the next start removes them");
    }
}

/// Removes the files of a claim whose entry was lost.
pub(crate) fn remove_lost(inner: &super::Inner, uid: &ClaimUid) -> Result<(), String> {
    let Some(writer) = &inner.metadata else {
        return Ok(());
    };
    writer
        .remove_uid(&uid.0)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The start's sweep (recovery, beside the CDI specs'): files of claims
/// with no entry go; those of claims the ledger of lost entries names (or
/// whose UID its damaged text holds) stay for their unprepare.
pub(crate) fn sweep(
    inner: &super::Inner,
    remaining: &Checkpoint,
    lost: &BTreeMap<ClaimUid, LostClaim>,
) -> Result<(), String> {
    let Some(writer) = &inner.metadata else {
        return Ok(());
    };
    let keep = |uid: &str| {
        let uid = ClaimUid(uid.to_owned());
        remaining.claims.contains_key(&uid)
            || lost.contains_key(&uid)
            || lost.values().any(|l| l.holds_nearly(&uid.0))
    };
    let removed = writer.sweep(&keep).map_err(|e| e.to_string())?;
    if !removed.is_empty() {
        tracing::info!(
            files = ?removed,
            "removed device metadata files of claims not prepared here"
        );
    }
    Ok(())
}
