//! Writing a claim's entry: every checkpoint write of prepare and unprepare
//! goes through [`commit`], which names the protocol step in its error, and
//! the crash tests stop the process between writes ([`failpoint`]).

use super::Inner;
use super::checkpoint::{Batch, ClaimEntry, ClaimState, ClaimUid};
use super::error::PrepareError;
use super::plan::ClaimPlan;

/// A crash-test hook: with `GPU_DRA_FAILPOINT=<name>` (or a comma-separated
/// list naming it) the process aborts at that step, as a SIGKILL would stop
/// it (no unwinding, no cleanup).
pub(super) fn failpoint(name: &str) {
    if std::env::var(crate::prepare::checkpoint::FAILPOINT_ENV)
        .is_ok_and(|value| value.split(',').any(|one| one == name))
    {
        tracing::warn!(failpoint = name, "failpoint hit: aborting");
        std::process::abort();
    }
}

/// Writes the entry, still `PrepareStarted`, so that a crash after the
/// next hardware change finds it recorded and recovery undoes it.
pub(super) fn journal(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
    what: &str,
) -> Result<(), PrepareError> {
    commit(inner, Batch::new().put(uid.clone(), entry.clone()), what)
}

/// Adds `batch` to the checkpoint; the error text names the step.
pub(super) fn commit(inner: &Inner, batch: Batch, step: &str) -> Result<(), PrepareError> {
    inner
        .store
        .commit(batch)
        .map_err(|e| PrepareError::Checkpoint {
            step: step.to_owned(),
            reason: e.to_string(),
        })
}

/// A new entry for `plan` in state `state`.
pub(super) fn entry_for(plan: &ClaimPlan, state: ClaimState) -> ClaimEntry {
    ClaimEntry {
        state,
        namespace: plan.namespace.clone(),
        name: plan.name.clone(),
        devices: Vec::new(),
        cdi_spec_paths: Vec::new(),
    }
}
