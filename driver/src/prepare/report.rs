//! What startup recovery found and did ([`RecoveryReport`], logged and
//! returned by `Preparer::start`), and what it found on the node of what
//! the ledger of lost entries names ([`Found`]), filled in by the kinds'
//! sweeps and read by the ledger's pruning.

use std::collections::HashSet;

use super::checkpoint::LoadReport;

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// What loading the checkpoint found.
    pub load: LoadReport,
    /// Claims that were half-prepared and were undone.
    pub undone: Vec<String>,
    /// MIG devices destroyed because no claim referenced them (UUIDs).
    pub mig_destroyed: Vec<String>,
    /// MPS daemons of an earlier `--mps-dir`, taken over where they were
    /// started (`<id> in <directory>`).
    pub mps_elsewhere: Vec<String>,
    /// MPS daemons stopped because no claim referenced them.
    pub mps_stopped: Vec<String>,
    /// After lost entries: GPUs in a compute mode other than `Default`
    /// that no remaining claim has a device on (`<uuid> (index <i>) is
    /// <mode>`). A lost entry may have set it; it is left as it is, since
    /// an admin may have set it too.
    pub compute_mode_unrecorded: Vec<String>,
    /// After lost entries: every GPU a claim can get whole that no
    /// remaining claim has a device on (`<uuid> (index <i>)`). A lost entry
    /// may have set its time slice, which cannot be read back (NVML has no
    /// call for it, `nvidia-smi` only sets it); it is left as it is.
    pub time_slice_unknown: Vec<String>,
    /// GPUs found on `vfio-pci` that no claim held, bound back to
    /// `nvidia` (PCI bus ids).
    pub vfio_rebound: Vec<String>,
    /// CDI specs deleted because no claim referenced them (claim UIDs).
    pub cdi_removed: Vec<String>,
    /// Claims whose entries were lost, with what was kept for them because
    /// the lost text names it (`<uid> (<source>): ...`).
    pub lost_kept: Vec<String>,
    /// Lost claims dropped from the ledger: nothing they name is left.
    pub lost_forgotten: Vec<String>,
    /// Steps that failed.
    pub errors: Vec<String>,
}

impl RecoveryReport {
    /// Logs what was found, one line per kind.
    pub fn log(&self) {
        for (entry, reason) in &self.load.quarantined {
            tracing::error!(entry = %entry, reason = %reason, "checkpoint entry quarantined");
        }
        if let Some((path, reason)) = &self.load.moved_aside {
            tracing::error!(path = %path.display(), reason = %reason, "unusable checkpoint moved aside");
        }
        if self.load.discarded_for_reboot > 0 {
            tracing::info!(
                entries = self.load.discarded_for_reboot,
                "checkpoint entries of an earlier boot discarded"
            );
        }
        if !self.undone.is_empty() {
            tracing::warn!(claims = ?self.undone, "half-prepared claims undone");
        }
        if !self.mig_destroyed.is_empty() {
            tracing::warn!(devices = ?self.mig_destroyed, "unreferenced MIG devices destroyed");
        }
        if !self.mps_elsewhere.is_empty() {
            tracing::warn!(daemons = ?self.mps_elsewhere, "MPS daemons of an earlier --mps-dir taken over where they run; they stay there until stopped");
        }
        if !self.mps_stopped.is_empty() {
            tracing::warn!(daemons = ?self.mps_stopped, "unreferenced MPS daemons stopped");
        }
        if !self.compute_mode_unrecorded.is_empty() {
            tracing::warn!(
                gpus = ?self.compute_mode_unrecorded,
                "checkpoint entries were lost and these GPUs, which no claim uses, are not in compute mode Default; a lost entry may have set it (MPS), and it is left as it is: if nothing else on the node needs it, reset it with nvidia-smi -i <index> -c DEFAULT"
            );
        }
        if !self.time_slice_unknown.is_empty() {
            tracing::warn!(
                gpus = ?self.time_slice_unknown,
                "checkpoint entries were lost and a lost entry may have set the time slice of these GPUs, which no claim uses; time slices cannot be read back, so they are left as they are: to be sure a GPU runs at the default interval, set it with nvidia-smi compute-policy -i <uuid> --set-timeslice 0"
            );
        }
        if !self.cdi_removed.is_empty() {
            tracing::warn!(claims = ?self.cdi_removed, "unreferenced CDI specs deleted");
        }
        if !self.vfio_rebound.is_empty() {
            tracing::warn!(gpus = ?self.vfio_rebound, "GPUs on vfio-pci that no claim held bound back to nvidia");
        }
        if !self.lost_kept.is_empty() {
            tracing::warn!(
                claims = ?self.lost_kept,
                "kept for claims whose checkpoint entries were lost, until kubelet unprepares them (to release them by hand: remove checkpoint.lost.json from the state directory and restart the plugin)"
            );
        }
        if !self.lost_forgotten.is_empty() {
            tracing::info!(claims = ?self.lost_forgotten, "lost claims forgotten: nothing they named is left");
        }
        for e in &self.errors {
            tracing::error!(error = %e, "recovery step failed");
        }
        tracing::info!(claims = self.load.loaded, "checkpoint loaded");
    }
}

/// What recovery found on the node of what lost entries name.
#[derive(Default)]
pub(crate) struct Found {
    /// MIG devices (UUIDs), with dynamic MIG.
    pub(crate) mig: HashSet<String>,
    /// MPS daemons running (those an entry names too among them: a
    /// memory-shared GPU's daemon serves several claims).
    pub(crate) daemons: HashSet<String>,
    /// CDI specs of claims without an entry (UIDs).
    pub(crate) cdi: HashSet<String>,
}
