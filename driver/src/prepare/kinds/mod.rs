//! One seam per kind of claim: each kind (a whole GPU, a MIG device, an
//! MPS daemon, a time slice, a share of a memory-shared GPU) says in one
//! file, behind [`Kind`], how it sets a device up, how it undoes that from
//! the checkpoint alone, and what it sweeps at start and releases for a
//! claim whose entry was lost. [`KINDS`] is the registry, in setup order.
//!
//! Every device of a claim passes every kind in that order ([`setup`]): the
//! kinds of hardware ([`whole_gpu`], [`mig`], [`vfio`]) give the device its nodes in
//! the claim's CDI spec; the kinds of sharing ([`memory_share`],
//! [`timeslice`], [`mps`]) act on the devices [`Setup::sharing_config`]
//! hands them. Undo ([`undo`]) runs the kinds in reverse for each record,
//! then restores the record's compute mode (`super::compute_mode`), then
//! deletes the spec. Adding a kind is a file here and a line in [`KINDS`].

pub(crate) mod memory_share;
pub(crate) mod mig;
pub(crate) mod mps;
pub(crate) mod timeslice;
pub(crate) mod vfio;
pub(crate) mod whole_gpu;

use std::collections::BTreeMap;

use gpu_dra_api::config::DeviceConfig;

use super::Inner;
use super::cdi::{self, ClaimSpec, ContainerEdits};
use super::checkpoint::{Checkpoint, ClaimEntry, ClaimUid, LostClaim, PreparedDeviceRecord};
use super::compute_mode::{index_of, needed_by_others, parse_mode};
use super::error::PrepareError;
use super::journal::failpoint;
use super::plan::{ClaimPlan, PlannedDevice, Target};
use super::report::{Found, RecoveryReport};

/// How one kind of device is set up, undone, recovered and released. Every
/// method but [`Kind::setup`] does nothing by default.
pub(crate) trait Kind: Sync {
    /// Sets device `i` of the claim up, as far as this kind concerns it
    /// (a kind that does not returns `Ok`), recording every change in
    /// `claim.entry` as it is made, and adding the device's edits to
    /// `claim.spec`.
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError>;

    /// Claim-level work once every device is set up, before the spec is
    /// built.
    fn finish(&self, _claim: &mut Setup<'_>) -> Result<(), PrepareError> {
        Ok(())
    }

    /// Undoes what `record` holds of this kind. Best effort: a failure goes
    /// to `cx.errors` and the other steps are still tried.
    fn undo(&self, _cx: &mut Undo<'_>, _record: &PreparedDeviceRecord) {}

    /// Recovery, step 0, before half-prepared entries are undone: takes
    /// over what this kind runs where the plugin's flags no longer point.
    fn take_over(&self, _inner: &Inner, _snapshot: &Checkpoint, _report: &mut RecoveryReport) {}

    /// Recovery, after half-prepared entries are undone: removes what this
    /// kind left on the node that no entry, nor the ledger of lost
    /// entries, names.
    fn sweep(&self, _cx: &mut Recovery<'_>) {}

    /// Releases what the ledger names of this kind for a claim whose entry
    /// was lost, leaving what another entry or lost claim names.
    fn release_lost(&self, _cx: &mut Release<'_>) {}
}

/// The kinds, in setup order: hardware first, then sharing.
pub(crate) static KINDS: [&dyn Kind; 6] = [
    &whole_gpu::WholeGpu,
    &mig::Mig,
    &vfio::Vfio,
    &memory_share::MemoryShare,
    &timeslice::TimeSlice,
    &mps::Mps,
];

/// One claim being set up: what the kinds read, the entry they record
/// their changes in and the CDI spec they add to.
pub(crate) struct Setup<'a> {
    pub(crate) inner: &'a Inner,
    pub(crate) plan: &'a ClaimPlan,
    pub(crate) entry: &'a mut ClaimEntry,
    /// Every other claim's entry on the claim's GPUs.
    pub(crate) others: &'a [(&'a ClaimUid, &'a ClaimEntry)],
    /// The claim's CDI spec being built.
    pub(crate) spec: ClaimSpec,
    /// The CDI device name of each device (see [`cdi_names`]).
    pub(crate) names: Vec<String>,
    /// The memory-shared GPU of the claim's shares (NVML index) and what
    /// they consumed together (see [`memory_share::of_claim`]).
    pub(crate) memory_share: Option<(u32, u64)>,
    /// The MPS daemons the claim asks for, gathered device by device.
    pub(crate) mps: mps::Daemons,
}

impl<'a> Setup<'a> {
    /// Device `i` of the plan.
    pub(crate) fn device(&self, i: usize) -> &'a PlannedDevice {
        &self.plan.devices[i]
    }

    /// Whether device `i` is a share of the claim's memory-shared GPU.
    pub(crate) fn is_memory_share(&self, i: usize) -> bool {
        let d = self.device(i);
        match &d.target {
            Target::Gpu(g) => {
                !d.admin && self.memory_share.is_some_and(|(index, _)| index == g.index)
            }
            Target::Mig(_) | Target::Vfio(_) => false,
        }
    }

    /// The config a kind of sharing acts on for device `i`: none for admin
    /// access (nothing is configured) and for a memory share (the share's
    /// MPS daemon and limits are its only sharing).
    pub(crate) fn sharing_config(&self, i: usize) -> Option<&'a DeviceConfig> {
        let d = self.device(i);
        if d.admin || self.is_memory_share(i) {
            return None;
        }
        d.config.as_ref()
    }
}

/// Sets up every device of `plan` through the kinds, recording each change
/// in `entry`, and writes the CDI spec.
pub(crate) fn setup(
    inner: &Inner,
    plan: &ClaimPlan,
    entry: &mut ClaimEntry,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), PrepareError> {
    let memory_share = memory_share::of_claim(plan)?;
    let spec = ClaimSpec::with_kind(inner.opts.cdi.vendor(), inner.opts.cdi.class(), &plan.uid.0)?;
    let mut claim = Setup {
        inner,
        plan,
        entry,
        others,
        spec,
        names: cdi_names(plan),
        memory_share,
        mps: mps::Daemons::default(),
    };
    for i in 0..plan.devices.len() {
        for kind in KINDS {
            kind.setup(&mut claim, i)?;
        }
    }
    for kind in KINDS {
        kind.finish(&mut claim)?;
    }
    super::metadata_files::add_to_claim(inner, plan, &claim.names, &mut claim.spec)?;
    let Setup {
        entry, spec, mps, ..
    } = claim;
    // A claim of VFIO devices only gets none of the driver's files and
    // nodes: the GPUs are off `nvidia`.
    let common = if plan
        .devices
        .iter()
        .all(|d| matches!(d.target, Target::Vfio(_)))
    {
        cdi::spec::ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".to_owned()],
            ..cdi::spec::ContainerEdits::default()
        }
    } else {
        common_edits(inner)?
    };
    let built = spec.build(common)?;
    let write_spec = || {
        inner
            .opts
            .cdi
            .write(&plan.uid.0, &built.spec)
            .map(drop)
            .map_err(PrepareError::from)
    };
    mps::start_beside(inner, &plan.uid, entry, mps, write_spec)?;
    for (i, (_, id)) in built.device_ids.iter().enumerate() {
        entry.devices[i].cdi_device_ids = vec![id.clone()];
    }
    failpoint("prepare-after-cdi");
    Ok(())
}

/// The CDI device name of each planned device: its DRA device name, with
/// the share id appended when the claim holds two shares of one device.
fn cdi_names(plan: &ClaimPlan) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(plan.devices.len());
    for d in &plan.devices {
        let name = if names.contains(&d.device) {
            format!("{}-{}", d.device, d.share_id.as_deref().unwrap_or("dup"))
        } else {
            d.device.clone()
        };
        names.push(name);
    }
    names
}

/// One claim's entry being undone.
pub(crate) struct Undo<'a> {
    pub(crate) inner: &'a Inner,
    pub(crate) uid: &'a ClaimUid,
    /// Every other claim's entry on the entry's GPUs.
    pub(crate) others: &'a [(&'a ClaimUid, &'a ClaimEntry)],
    /// MPS daemons this undo stopped (one daemon may serve several of the
    /// entry's devices).
    pub(crate) stopped: Vec<String>,
    /// What failed.
    pub(crate) errors: Vec<String>,
}

impl Undo<'_> {
    /// Whether MPS daemon `id` still serves another claim, or a claim whose
    /// entry was lost (its pods run on until kubelet unprepares it).
    pub(crate) fn daemon_in_use(&self, id: &str) -> bool {
        self.others.iter().any(|(_, e)| {
            e.devices
                .iter()
                .any(|r| r.sharing.mps_daemon.as_ref().is_some_and(|m| m.id == id))
        }) || self
            .inner
            .store
            .any_lost(|l| l.mps_daemons.iter().any(|d| d == id))
    }
}

/// Undoes what `entry` records, in reverse: for each device the kinds in
/// reverse order (MPS daemons, a shared one only when no other claim, nor
/// one whose entry was lost, uses it; time slice; MIG devices this plugin
/// created), then its compute mode (only when no other claim needs it);
/// last the CDI spec. Best effort: every step is tried, the failures are
/// returned.
pub(crate) fn undo(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), Vec<String>> {
    let mut cx = Undo {
        inner,
        uid,
        others,
        stopped: Vec::new(),
        errors: Vec::new(),
    };
    for record in entry.devices.iter().rev().filter(|r| !r.admin) {
        for kind in KINDS.iter().rev() {
            kind.undo(&mut cx, record);
        }
        restore_compute_mode(&mut cx, record);
    }
    if let Err(e) = inner.opts.cdi.remove(&uid.0) {
        cx.errors.push(format!("remove CDI spec: {e}"));
    }
    if cx.errors.is_empty() {
        Ok(())
    } else {
        Err(cx.errors)
    }
}

/// The undo step of a record's compute-mode change, after the kinds
/// undid theirs: the mode found before is restored unless the record's
/// MPS daemon still serves another claim, or another claim's MPS daemon or
/// compute-mode change on the GPU (a memory share, or a share whose failed
/// prepare is still to be undone) needs the mode: the last of them
/// restores it.
fn restore_compute_mode(cx: &mut Undo<'_>, record: &PreparedDeviceRecord) {
    let Some(change) = &record.sharing.compute_mode else {
        return;
    };
    // Another claim still shares the daemon and the mode.
    if record
        .sharing
        .mps_daemon
        .as_ref()
        .is_some_and(|daemon| cx.daemon_in_use(&daemon.id))
    {
        return;
    }
    let uuid = record.gpu_uuid();
    if needed_by_others(uuid, cx.others) {
        tracing::debug!(claim = %cx.uid, device = %record.device, "compute mode left: another claim on the GPU needs it");
        return;
    }
    let Some(mode) = parse_mode(&change.previous) else {
        return;
    };
    if let Some(index) = index_of(cx.inner, uuid) {
        if let Err(e) = cx.inner.backend.set_compute_mode(index, mode) {
            cx.errors
                .push(format!("restore compute mode of {}: {e}", record.device));
        }
    } else {
        // Not an error that keeps the entry: a GPU this plugin no
        // longer sees cannot be reached by any retry either.
        tracing::error!(
            claim = %cx.uid,
            device = %record.device,
            gpu = %uuid,
            mode = %change.previous,
            "cannot restore the compute mode: the GPU is not known to this plugin; set it by hand"
        );
    }
}

/// Startup recovery after the half-prepared entries are undone.
pub(crate) struct Recovery<'a> {
    pub(crate) inner: &'a Inner,
    /// The entries left.
    pub(crate) remaining: &'a Checkpoint,
    /// The ledger of lost entries.
    pub(crate) lost: &'a BTreeMap<ClaimUid, LostClaim>,
    pub(crate) report: &'a mut RecoveryReport,
    /// What the ledger names that is still on the node.
    pub(crate) found: &'a mut Found,
}

/// The release of what the ledger names for one lost claim.
pub(crate) struct Release<'a> {
    pub(crate) inner: &'a Inner,
    /// The lost claim.
    pub(crate) claim: &'a LostClaim,
    /// The checkpoint's entries (the claim's new one among them, if it was
    /// prepared again).
    pub(crate) checkpoint: &'a Checkpoint,
    /// The other lost claims.
    pub(crate) other_lost: Vec<&'a LostClaim>,
    pub(crate) errors: Vec<String>,
}

impl Release<'_> {
    /// Every device record of the checkpoint.
    pub(crate) fn records(&self) -> impl Iterator<Item = &PreparedDeviceRecord> {
        self.checkpoint
            .claims
            .values()
            .flat_map(|e| e.devices.iter())
    }
}

/// The claim-level edits: the driver's files, found once, and the control
/// nodes. The optional `nvidia-uvm` nodes appear only once that module is
/// loaded (by the first CUDA program on the host), which may be after the
/// plugin's first prepare: until all control nodes are there, they are
/// looked for again at every prepare, so a later claim gets them.
pub(crate) struct CommonEdits {
    files: cdi::DriverFiles,
    /// The edits, once every control node was found.
    complete: Option<ContainerEdits>,
}

fn common_edits(inner: &Inner) -> Result<ContainerEdits, PrepareError> {
    let mut cached = inner
        .common_edits
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(edits) = cached.as_ref().and_then(|c| c.complete.as_ref()) {
        return Ok(edits.clone());
    }
    let common = if let Some(common) = cached.as_mut() {
        common
    } else {
        let mut files = cdi::driver_root::discover(&inner.opts.driver_root)?;
        if let Some(hook) = &inner.opts.cdi_hook {
            files.cdi_hook = Some(hook.clone());
        }
        if files.cdi_hook.is_none() {
            tracing::warn!(
                driver_root = %inner.opts.driver_root.path.display(),
                "no nvidia-cdi-hook in the driver root and no --nvidia-cdi-hook-path: containers get no ldcache hook, so the driver's libraries are also mounted under /usr/lib/<triplet> and /usr/lib64, where glibc looks by default"
            );
        }
        cached.insert(CommonEdits {
            files,
            complete: None,
        })
    };
    let control = inner.nodes.control()?;
    let edits = cdi::claim_edits(&common.files, &control);
    if control.nodes.len() == cdi::nodes::CONTROL_NODES.len() {
        common.complete = Some(edits.clone());
    }
    Ok(edits)
}
