//! The blocking half of prepare and unprepare, run under the claim's GPU
//! locks: the checkpoint protocol around the hardware steps, the hardware
//! steps themselves, and their undo.
//!
//! What each kind of device gets:
//! - whole GPU: its node; with dynamic MIG, MIG mode switched off first if
//!   no MIG device is left on it; `TimeSlicing` config: compute mode
//!   `Default` and the interval through `nvidia-smi`; `MPS` config: compute
//!   mode `ExclusiveProcess` and a control daemon for the claim;
//! - memory-shared GPU (`--memory-sharing`): one MPS daemon per GPU, shared
//!   by every claim on it (started with the first, stopped after the last),
//!   and per-client limits derived from the consumed `memory`;
//! - MIG device: created at the allocated placement (dynamic MIG) or found
//!   (static), its capability nodes; `MPS` config: a daemon on its UUID;
//! - admin access: nodes only, no configuration, no exclusivity.
//!
//! Every change is recorded in the claim's entry as it happens, so a
//! failure half-way undoes exactly what was done ([`undo`]), and the same
//! undo serves unprepare and crash recovery.

use std::collections::BTreeMap;

use gpu_dra_api::config::{DeviceConfig, MpsConfig, TimeSliceInterval};
use gpu_nvml::ComputeMode;

use super::plan::{ClaimPlan, GpuTarget, MigTarget, PlannedDevice, Target};
use super::{Inner, commit, entry_for};
use crate::prepare::cdi::{self, CdiError, ClaimSpec, ContainerEdits};
use crate::prepare::checkpoint::{
    Batch, ClaimEntry, ClaimState, ClaimUid, ComputeModeChange, DeviceKind, MpsDaemonRecord,
    PreparedDeviceRecord, SharingApplied,
};
use crate::prepare::mig;
use crate::prepare::mps::{self, DaemonConfig, MpsError};
use crate::prepare::timeslice::{self, TimeSliceError};

const MIB: u64 = 1024 * 1024;

/// Why preparing or unpreparing a claim failed; the text goes to the user.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// Another prepared claim holds an overlapping device.
    #[error(
        "device {device} overlaps device {other_device} {} claim {other} ({other_uid}); a device is never given to two claims: {}",
        .held.how(),
        .held.remedy()
    )]
    Conflict {
        /// Our device.
        device: String,
        /// The other claim's device.
        other_device: String,
        /// How the other claim holds it.
        held: Held,
        /// The other claim (namespace/name).
        other: String,
        /// Its UID.
        other_uid: String,
    },
    /// The checkpoint could not be written.
    #[error("cannot record the claim in the checkpoint ({step}): {reason}")]
    Checkpoint {
        /// The protocol step.
        step: String,
        /// The store's error.
        reason: String,
    },
    /// CDI spec generation or writing failed.
    #[error("CDI spec: {0}")]
    Cdi(#[from] CdiError),
    /// A MIG operation failed.
    #[error("device {device}: {error}")]
    Mig {
        /// The device.
        device: String,
        /// What failed.
        error: mig::MigError,
    },
    /// An MPS daemon could not be started or stopped.
    #[error("MPS: {0}")]
    Mps(#[from] mps::MpsError),
    /// Time-slicing could not be set.
    #[error("device {device}: {error}")]
    TimeSlice {
        /// The device.
        device: String,
        /// What failed.
        error: timeslice::TimeSliceError,
    },
    /// An NVML call failed.
    #[error("device {device}: {error}")]
    Nvml {
        /// The device.
        device: String,
        /// What failed.
        error: gpu_nvml::Error,
    },
    /// The allocation or config cannot be served as asked.
    #[error("device {device}: {reason}")]
    Unsupported {
        /// The device.
        device: String,
        /// Why.
        reason: String,
    },
    /// Undo failed for some steps (each listed).
    #[error("could not undo everything: {}", .0.join("; "))]
    Undo(Vec<String>),
}

/// A crash-test hook: with `GPU_DRA_FAILPOINT=<name>` (or a comma-separated
/// list naming it) the process aborts at that step, as a SIGKILL would stop
/// it (no unwinding, no cleanup).
fn failpoint(name: &str) {
    if std::env::var(crate::prepare::checkpoint::FAILPOINT_ENV)
        .is_ok_and(|value| value.split(',').any(|one| one == name))
    {
        tracing::warn!(failpoint = name, "failpoint hit: aborting");
        std::process::abort();
    }
}

/// What [`stage`] leaves for [`complete`].
pub(crate) enum Staged {
    /// The claim was completed by a concurrent call while this one waited
    /// for the locks: answer its entry.
    Done(ClaimEntry),
    /// The hardware is set up and the CDI spec written; the entry, now
    /// `PrepareCompleted` and registered as pending (see
    /// [`super::pending::Pending`]), still has to be committed.
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

    if let Err(e) = setup(inner, plan, &mut entry, &others_now) {
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
    commit(inner, Batch::new().remove(uid.clone()), "unprepare")
}

/// The entries (committed, with pending ones over them) that touch any of
/// the GPUs `minors`: all that a prepare or undo on those GPUs has to
/// consider. A device overlaps only devices of its own GPU, and a shared
/// MPS daemon serves one GPU (`shared-gpu<minor>`, the others are one
/// claim's own), so entries on other GPUs can change nothing here; copying
/// only these keeps a prepare's cost from growing with the node's claims.
fn view_on(inner: &Inner, minors: &[u32]) -> BTreeMap<ClaimUid, ClaimEntry> {
    let touches = |e: &ClaimEntry| e.devices.iter().any(|d| minors.contains(&record_minor(d)));
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
    let mut minors: Vec<u32> = entry.devices.iter().map(record_minor).collect();
    minors.sort_unstable();
    minors.dedup();
    minors
}

/// The GPU a device record is on (a MIG device's parent).
fn record_minor(d: &PreparedDeviceRecord) -> u32 {
    match &d.kind {
        DeviceKind::Gpu { minor, .. } => *minor,
        DeviceKind::Mig { parent_minor, .. } => *parent_minor,
    }
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

/// What part of a physical GPU a device occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Footprint {
    /// The whole GPU, exclusively.
    Whole(u32),
    /// A share of the GPU's memory (memory-fraction sharing).
    Share(u32),
    /// Memory slices `[start, start + size)` of the GPU.
    Slices(u32, u32, u32),
}

impl Footprint {
    fn overlaps(self, other: Footprint) -> bool {
        use Footprint::{Share, Slices, Whole};
        match (self, other) {
            (Share(_), Share(_)) => false,
            (Whole(a) | Share(a), Whole(b) | Share(b) | Slices(b, _, _))
            | (Slices(a, _, _), Whole(b) | Share(b)) => a == b,
            // In u64: the placements of a checkpoint entry are whatever
            // its file holds.
            (Slices(a, s1, n1), Slices(b, s2, n2)) => {
                let end = |s: u32, n: u32| u64::from(s) + u64::from(n);
                a == b && u64::from(s1) < end(s2, n2) && u64::from(s2) < end(s1, n1)
            }
        }
    }
}

fn planned_footprint(d: &PlannedDevice) -> Footprint {
    match &d.target {
        Target::Gpu(g) if d.share_id.is_some() || g.memory_shared => Footprint::Share(g.minor),
        Target::Gpu(g) => Footprint::Whole(g.minor),
        Target::Mig(m) => Footprint::Slices(
            m.request.parent_minor,
            m.request.placement_start,
            m.request.placement_size,
        ),
    }
}

fn record_footprint(d: &PreparedDeviceRecord) -> Footprint {
    match &d.kind {
        DeviceKind::Gpu { minor, .. } if d.share_id.is_some() => Footprint::Share(*minor),
        DeviceKind::Gpu { minor, .. } => Footprint::Whole(*minor),
        DeviceKind::Mig {
            parent_minor,
            placement_start,
            placement_size,
            ..
        } => Footprint::Slices(*parent_minor, *placement_start, *placement_size),
    }
}

/// How another claim holds a device (for [`PrepareError::Conflict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Its prepare completed.
    Prepared,
    /// Its prepare failed and the rollback could not undo everything: the
    /// entry stays (`PrepareStarted`) until a retry undoes it.
    FailedPrepare,
}

impl Held {
    fn how(self) -> &'static str {
        match self {
            Held::Prepared => "already prepared for",
            Held::FailedPrepare => "still held by a failed prepare of",
        }
    }

    fn remedy(self) -> &'static str {
        match self {
            Held::Prepared => "unprepare the other claim first",
            Held::FailedPrepare => {
                "its rollback could not undo everything (see the plugin's log); it is retried at that claim's next prepare or unprepare and at the plugin's start"
            }
        }
    }
}

/// Refuses a device that overlaps a non-admin device of another claim.
fn check_conflicts(
    plan: &ClaimPlan,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), PrepareError> {
    for d in plan.devices.iter().filter(|d| !d.admin) {
        let mine = planned_footprint(d);
        for (uid, entry) in others {
            for theirs in entry.devices.iter().filter(|r| !r.admin) {
                if mine.overlaps(record_footprint(theirs)) {
                    let held = if entry.state == ClaimState::PrepareCompleted {
                        Held::Prepared
                    } else {
                        Held::FailedPrepare
                    };
                    return Err(PrepareError::Conflict {
                        device: d.device.clone(),
                        other_device: theirs.device.clone(),
                        held,
                        other: format!("{}/{}", entry.namespace, entry.name),
                        other_uid: uid.0.clone(),
                    });
                }
            }
        }
    }
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

/// The memory-shared GPU of the claim's shares (its index) and what they
/// consumed together (admin requests change nothing and are left out).
/// Every share of one GPU in the claim is served by that GPU's one MPS
/// daemon, and all its containers see the sum as their limit: the runtime
/// merges the devices' environments, so each device carries the same
/// values. Shares of two GPUs are refused: the containers would need two
/// daemons at one `CUDA_MPS_PIPE_DIRECTORY`.
fn memory_share(plan: &ClaimPlan) -> Result<Option<(u32, u64)>, PrepareError> {
    let mut share: Option<(&PlannedDevice, u32, u64)> = None;
    for d in plan.devices.iter().filter(|d| !d.admin) {
        let Target::Gpu(g) = &d.target else { continue };
        if !(g.memory_shared || d.consumed_memory.is_some()) {
            continue;
        }
        let consumed = d.consumed_memory.unwrap_or(0);
        share = match share {
            None => Some((d, g.index, consumed)),
            Some((first, index, total)) if first.device == d.device => {
                Some((first, index, total.saturating_add(consumed)))
            }
            Some((first, ..)) => {
                return Err(PrepareError::Unsupported {
                    device: d.device.clone(),
                    reason: format!(
                        "the claim holds memory shares of two GPUs ({} and {}); a container reaches one MPS daemon, which serves one memory-shared GPU: put the shares in separate claims",
                        first.device, d.device
                    ),
                });
            }
        };
    }
    Ok(share.map(|(_, index, total)| (index, total)))
}

/// Sets up every device of `plan`, recording each change in `entry`, and
/// writes the CDI spec.
fn setup(
    inner: &Inner,
    plan: &ClaimPlan,
    entry: &mut ClaimEntry,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), PrepareError> {
    let names = cdi_names(plan);
    let share = memory_share(plan)?;
    let mut spec =
        ClaimSpec::with_kind(inner.opts.cdi.vendor(), inner.opts.cdi.class(), &plan.uid.0)?;
    // Devices asking for MPS, grouped by the config entry they took it
    // from: one daemon each.
    let mut mps_groups: Vec<MpsGroup> = Vec::new();
    // Whole GPUs of those: (device, GPU index), set to EXCLUSIVE_PROCESS
    // while their daemons start (see `start_mps_and_write_spec`).
    let mut exclusive: Vec<(usize, u32)> = Vec::new();
    for (i, d) in plan.devices.iter().enumerate() {
        match &d.target {
            Target::Gpu(g) => {
                let nodes = inner.nodes.gpu(g.minor)?;
                spec.add_gpu(&names[i], &nodes)?;
                if d.admin {
                    continue;
                }
                if g.dynamic_mig {
                    mig::ensure_full_gpu(&*inner.backend, g.index).map_err(|error| {
                        PrepareError::Mig {
                            device: d.device.clone(),
                            error,
                        }
                    })?;
                }
                if let Some((_, total)) = share.filter(|(index, _)| *index == g.index) {
                    let edits = shared_gpu(inner, &plan.uid, entry, i, d, g, total, others)?;
                    spec.add_edits(&names[i], edits)?;
                    continue;
                }
                if let Some(DeviceConfig::Gpu(cfg)) = &d.config {
                    if let Some(interval) = cfg.time_slice() {
                        time_slice(inner, &plan.uid, entry, i, g, interval)?;
                    } else if let Some(mps) = cfg.mps() {
                        exclusive.push((i, g.index));
                        group(&mut mps_groups, d.config_entry, mps, i, g.uuid.clone());
                    }
                }
            }
            Target::Mig(m) => {
                let (gi, ci, uuid) = mig_device(inner, d, m, &mut entry.devices[i])?;
                let nodes = inner.nodes.mig(m.request.parent_minor, gi, ci)?;
                spec.add_mig(&names[i], &nodes)?;
                if d.admin {
                    continue;
                }
                if let Some(DeviceConfig::Mig(cfg)) = &d.config
                    && let Some(mps) = cfg.mps()
                {
                    group(&mut mps_groups, d.config_entry, mps, i, uuid);
                }
            }
        }
    }
    let mut daemons = Vec::with_capacity(mps_groups.len());
    for (n, group) in mps_groups.iter().enumerate() {
        let (config, members) = (&group.config, &group.members);
        let uuids: Vec<&str> = members.iter().map(|(_, u)| u.as_str()).collect();
        let limits =
            config
                .pinned_memory_limits(&uuids)
                .map_err(|e| PrepareError::Unsupported {
                    device: plan.devices[members[0].0].device.clone(),
                    reason: format!("MPS config: {e}"),
                })?;
        daemons.push(DaemonConfig {
            id: format!("claim-{}-{n}", plan.uid.0),
            gpu_uuids: uuids.iter().map(|u| (*u).to_owned()).collect(),
            active_thread_percentage: config
                .default_active_thread_percentage
                .and_then(|p| u8::try_from(p).ok()),
            pinned_memory_limits: limits,
        });
    }
    for (cfg, group) in daemons.iter().zip(&mps_groups) {
        for (i, _) in &group.members {
            spec.add_edits(&names[*i], inner.mps.container_edits(&cfg.id))?;
        }
    }
    let common = common_edits(inner)?;
    let built = spec.build(common)?;
    let write_spec = || {
        inner
            .opts
            .cdi
            .write(&plan.uid.0, &built.spec)
            .map(drop)
            .map_err(PrepareError::from)
    };
    let started =
        start_mps_and_write_spec(inner, &plan.uid, entry, &exclusive, &daemons, write_spec);
    // Every daemon that started is recorded, even when another step
    // failed, so the rollback stops it (and removes the spec).
    let mut first_error = started.side.err();
    for (result, group) in started.daemons.into_iter().zip(&mps_groups) {
        match result {
            Ok(record) => {
                for (i, _) in &group.members {
                    entry.devices[*i].sharing.mps_daemon = Some(record.clone());
                }
            }
            Err(e) => {
                first_error.get_or_insert(e.into());
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if !daemons.is_empty() {
        failpoint("prepare-after-mps");
    }
    for (i, (_, id)) in built.device_ids.iter().enumerate() {
        entry.devices[i].cdi_device_ids = vec![id.clone()];
    }
    failpoint("prepare-after-cdi");
    Ok(())
}

/// What [`start_mps_and_write_spec`] did: the outcome of the compute-mode changes and the
/// spec's write, and each daemon's, in order.
struct MpsStarts {
    side: Result<(), PrepareError>,
    daemons: Vec<Result<MpsDaemonRecord, MpsError>>,
}

/// Sets the `exclusive` GPUs to EXCLUSIVE_PROCESS (each change journalled
/// first) and then writes the claim's CDI spec (`write_spec`) while the
/// `daemons` start, all at once: a daemon's start waits on other processes
/// for milliseconds and needs no compute mode (its server starts at the
/// first client, after the prepare), the journal's fsync need not wait
/// for it, and the spec names only the daemon's directories, which are
/// known before it starts. The first daemon starts on this thread; the
/// mode changes and the spec, and any further daemons, on threads of
/// their own: a thread's creation, and the wake-up of a thread waiting for
/// one, cost tenths of a millisecond on a busy node, and the daemon start
/// is the longest step. A crash in between leaves what a crash between
/// the steps in turn did before: the journalled change, undone by
/// recovery; an unrecorded daemon, stopped by the startup sweep; a spec no
/// completed claim names, removed by the same sweep.
///
/// Without daemons, the modes are set and the spec written here, in turn.
fn start_mps_and_write_spec(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    exclusive: &[(usize, u32)],
    daemons: &[DaemonConfig],
    write_spec: impl FnOnce() -> Result<(), PrepareError> + Send,
) -> MpsStarts {
    let side = |entry: &mut ClaimEntry| {
        exclusive.iter().try_for_each(|&(i, index)| {
            set_compute_mode(inner, uid, entry, i, index, ComputeMode::ExclusiveProcess)
        })?;
        write_spec()
    };
    let Some((first, rest)) = daemons.split_first() else {
        return MpsStarts {
            side: side(entry),
            daemons: Vec::new(),
        };
    };
    std::thread::scope(|scope| {
        let side = scope.spawn(|| side(entry));
        let handles: Vec<_> = rest
            .iter()
            .map(|cfg| scope.spawn(|| inner.mps.start(cfg)))
            .collect();
        let mut started = vec![inner.mps.start(first)];
        started.extend(handles.into_iter().map(join));
        MpsStarts {
            side: join(side),
            daemons: started,
        }
    })
}

/// The result of a scoped thread; its panic goes on in the caller.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The MPS devices of a claim that took their config from one entry of the
/// allocation's configs: one daemon serves them, and index-keyed
/// per-device limits count within them (NVIDIA's driver groups the same
/// way, so two entries with equal content get a daemon each).
struct MpsGroup {
    entry: Option<usize>,
    config: MpsConfig,
    /// (device index in the plan, GPU or MIG UUID)
    members: Vec<(usize, String)>,
}

fn group(
    groups: &mut Vec<MpsGroup>,
    entry: Option<usize>,
    cfg: &MpsConfig,
    i: usize,
    uuid: String,
) {
    // One entry has one content; comparing it too keeps a group from ever
    // mixing two configs.
    match groups
        .iter_mut()
        .find(|g| g.entry == entry && g.config == *cfg)
    {
        Some(g) => g.members.push((i, uuid)),
        None => groups.push(MpsGroup {
            entry,
            config: cfg.clone(),
            members: vec![(i, uuid)],
        }),
    }
}

/// The claim-level edits: the driver's files, found once, and the control
/// nodes. The optional `nvidia-uvm` nodes appear only once that module is
/// loaded (by the first CUDA program on the host), which may be after the
/// plugin's first prepare: until all control nodes are there, they are
/// looked for again at every prepare, so a later claim gets them.
pub(super) struct CommonEdits {
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

pub(super) fn mode_name(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "Default",
        ComputeMode::ExclusiveProcess => "ExclusiveProcess",
        ComputeMode::Prohibited => "Prohibited",
    }
}

pub(super) fn parse_mode(name: &str) -> Option<ComputeMode> {
    match name {
        "Default" => Some(ComputeMode::Default),
        "ExclusiveProcess" => Some(ComputeMode::ExclusiveProcess),
        "Prohibited" => Some(ComputeMode::Prohibited),
        _ => None,
    }
}

/// Writes the entry, still `PrepareStarted`, so that a crash after the
/// next hardware change finds it recorded and recovery undoes it.
fn journal(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
    what: &str,
) -> Result<(), PrepareError> {
    commit(inner, Batch::new().put(uid.clone(), entry.clone()), what)
}

/// Sets the compute mode of device `i`'s GPU to `mode`. When it changes,
/// the change (with the mode to restore) is recorded durably first.
fn set_compute_mode(
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

/// Compute mode `Default` and the time slice, each recorded durably
/// before it is set.
fn time_slice(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    i: usize,
    g: &GpuTarget,
    interval: TimeSliceInterval,
) -> Result<(), PrepareError> {
    set_compute_mode(inner, uid, entry, i, g.index, ComputeMode::Default)?;
    entry.devices[i].sharing.time_slice_interval = Some(format!("{interval:?}"));
    journal(inner, uid, entry, "record a time-slice change")?;
    timeslice::set_timeslice(&inner.opts.driver_root, &g.uuid, interval).map_err(|error| {
        // Refused, or never run: the time slice is as it was. A reset in
        // the rollback would fail the same way and keep the half-done
        // entry holding the GPU. Only a timed-out or unwaited run may
        // have changed it, and stays for the rollback to reset.
        if !matches!(
            error,
            TimeSliceError::TimedOut { .. } | TimeSliceError::Spawn { .. }
        ) {
            entry.devices[i].sharing.time_slice_interval = None;
        }
        PrepareError::TimeSlice {
            device: entry.devices[i].device.clone(),
            error,
        }
    })
}

/// Id of the MPS daemon shared by the claims of a memory-shared GPU.
fn shared_daemon_id(minor: u32) -> String {
    format!("shared-gpu{minor}")
}

/// A share of a memory-shared GPU: the GPU's daemon (started by the first
/// claim) and the claim's per-client limits, from `total`, what all the
/// claim's shares of the GPU consumed (see [`memory_share`]).
#[allow(clippy::too_many_arguments)]
fn shared_gpu(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    i: usize,
    d: &PlannedDevice,
    g: &GpuTarget,
    total: u64,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<ContainerEdits, PrepareError> {
    let unsupported = |reason: String| PrepareError::Unsupported {
        device: d.device.clone(),
        reason,
    };
    let consumed = d.consumed_memory.ok_or_else(|| {
        unsupported("the GPU is shared by memory fraction but the allocation consumed no memory (allocated by a scheduler without DRAConsumableCapacity?)".to_owned())
    })?;
    // Resolved configs are normalized: a `GpuConfig` without sharing
    // reads as time-slicing at the default interval, which changes
    // nothing and is no reason to refuse.
    if let Some(DeviceConfig::Gpu(cfg)) = &d.config
        && cfg.sharing.is_some()
        && cfg.time_slice() != Some(TimeSliceInterval::Default)
    {
        return Err(unsupported(
            "a memory-shared GPU always runs MPS with limits derived from the consumed memory; remove the sharing config from the claim or class".to_owned(),
        ));
    }
    if g.memory_bytes == 0 || consumed == 0 || total > g.memory_bytes {
        return Err(unsupported(format!(
            "consumed memory {total} bytes does not fit the GPU's {} bytes",
            g.memory_bytes
        )));
    }
    let id = shared_daemon_id(g.minor);
    // The compute mode to restore after the last claim: recorded by the
    // first claim, copied by every later one. If the first claim's entry
    // was lost, the ledger kept it (else a claim joining now, last out,
    // would leave the GPU in the mode).
    let inherited = others
        .iter()
        .flat_map(|(_, e)| e.devices.iter())
        .filter(|r| r.sharing.mps_daemon.as_ref().is_some_and(|m| m.id == id))
        .find_map(|r| r.sharing.compute_mode.clone())
        .or_else(|| {
            inner.store.find_lost(|l| {
                let previous = l.compute_modes.get(&g.uuid)?;
                l.mps_daemons.contains(&id).then(|| ComputeModeChange {
                    set: mode_name(ComputeMode::ExclusiveProcess).to_owned(),
                    previous: previous.clone(),
                })
            })
        });
    if inherited.is_none() {
        set_compute_mode(inner, uid, entry, i, g.index, ComputeMode::ExclusiveProcess)?;
    }
    let daemon = inner.mps.start(&DaemonConfig {
        id: id.clone(),
        gpu_uuids: vec![g.uuid.clone()],
        active_thread_percentage: None,
        pinned_memory_limits: BTreeMap::new(),
    })?;
    // A joining claim copies the change only now, together with the
    // daemon: the undo restores the mode only for a record that names the
    // daemon and only when no other claim uses it. A copy recorded before
    // a failed start would have the rollback restore the mode under the
    // claims that still share the GPU.
    if let Some(change) = inherited {
        entry.devices[i].sharing.compute_mode = Some(change);
    }
    entry.devices[i].sharing.mps_daemon = Some(daemon);
    failpoint("prepare-after-mps");
    let pinned_mib = (total / MIB).max(1);
    // Rounded down (at least 1): the claims' shares of the GPU's threads
    // add up to no more than their shares of its memory.
    let percent = (u128::from(total) * 100 / u128::from(g.memory_bytes)).clamp(1, 100);
    let mut edits = inner.mps.container_edits(&id);
    let limits = mps::client_limit_edits(&g.uuid, pinned_mib, u8::try_from(percent).unwrap_or(100));
    edits.env.extend(limits.env);
    edits.mounts.extend(limits.mounts);
    Ok(edits)
}

/// Creates (dynamic) or finds (static) the MIG device; returns GI, CI, UUID.
fn mig_device(
    inner: &Inner,
    d: &PlannedDevice,
    m: &MigTarget,
    record: &mut PreparedDeviceRecord,
) -> Result<(u32, u32, String), PrepareError> {
    let mig_error = |error| PrepareError::Mig {
        device: d.device.clone(),
        error,
    };
    let (gi, ci, uuid, created) = if m.dynamic && !d.admin {
        let made = match inner.gpus.get(&m.request.gpu_index) {
            Some(info) => mig::create_on(&*inner.backend, info, &m.request),
            None => mig::create(&*inner.backend, &m.request),
        }
        .map_err(mig_error)?;
        (
            made.gpu_instance_id,
            made.compute_instance_id,
            made.uuid,
            true,
        )
    } else {
        let info = inner
            .backend
            .gpu(m.request.gpu_index)
            .map_err(|error| PrepareError::Nvml {
                device: d.device.clone(),
                error,
            })?;
        let found = info
            .mig
            .iter()
            .flat_map(|mig| mig.devices.iter())
            .find(|x| {
                x.profile_id == m.request.profile_id
                    && x.placement.start == m.request.placement_start
            })
            .ok_or_else(|| PrepareError::Unsupported {
                device: d.device.clone(),
                reason: if d.admin {
                    "admin access to a MIG placement that no claim has created: nothing to monitor"
                        .to_owned()
                } else {
                    "the MIG device no longer exists on the GPU (changed behind the driver's back?)"
                        .to_owned()
                },
            })?;
        (
            found.gpu_instance_id,
            found.compute_instance_id,
            found.uuid.clone(),
            false,
        )
    };
    if let DeviceKind::Mig {
        gpu_instance_id,
        compute_instance_id,
        mig_uuid,
        created: was_created,
        ..
    } = &mut record.kind
    {
        *gpu_instance_id = Some(gi);
        *compute_instance_id = Some(ci);
        *mig_uuid = Some(uuid.clone());
        *was_created = created;
    }
    if created {
        failpoint("prepare-after-mig");
    }
    Ok((gi, ci, uuid))
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
pub(super) fn mode_needed_by_others(uuid: &str, others: &[(&ClaimUid, &ClaimEntry)]) -> bool {
    others.iter().flat_map(|(_, e)| e.devices.iter()).any(|r| {
        !r.admin
            && matches!(&r.kind, DeviceKind::Gpu { uuid: u, .. } if u == uuid)
            && (r.sharing.mps_daemon.is_some() || r.sharing.compute_mode.is_some())
    })
}

/// Undoes what `entry` records, in reverse: MPS daemons (a shared one only
/// when no other claim, nor one whose entry was lost, uses it), time-slice,
/// compute mode (only when no other claim needs it), MIG devices this
/// plugin created, the CDI spec. Best effort: every step is tried, the
/// failures are returned.
pub(crate) fn undo(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &ClaimEntry,
    others: &[(&ClaimUid, &ClaimEntry)],
) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let mut stopped: Vec<String> = Vec::new();
    for record in entry.devices.iter().rev() {
        if record.admin {
            continue;
        }
        let uuid = match &record.kind {
            DeviceKind::Gpu { uuid, .. } => uuid.clone(),
            DeviceKind::Mig { parent_uuid, .. } => parent_uuid.clone(),
        };
        let index = index_of(inner, &uuid);
        let mut restore_mode = record.sharing.compute_mode.clone();
        if let Some(daemon) = &record.sharing.mps_daemon
            && !stopped.contains(&daemon.id)
        {
            // A claim whose entry was lost may use it too (a memory-shared
            // GPU's daemon): its pods run on until kubelet unprepares it.
            let in_use = others.iter().any(|(_, e)| {
                e.devices.iter().any(|r| {
                    r.sharing
                        .mps_daemon
                        .as_ref()
                        .is_some_and(|m| m.id == daemon.id)
                })
            }) || inner.store.any_lost(|l| l.mps_daemons.contains(&daemon.id));
            if in_use {
                // Another claim still shares the daemon and the mode.
                restore_mode = None;
            } else {
                match inner.mps.stop(&daemon.id) {
                    Ok(()) => stopped.push(daemon.id.clone()),
                    Err(e) => errors.push(format!("stop MPS daemon {}: {e}", daemon.id)),
                }
            }
        }
        if let Some(interval) = &record.sharing.time_slice_interval
            && interval != "Default"
            && let Err(e) =
                timeslice::set_timeslice(&inner.opts.driver_root, &uuid, TimeSliceInterval::Default)
        {
            errors.push(format!("reset time-slice of {}: {e}", record.device));
        }
        // Another claim's MPS daemon or compute-mode change on this GPU
        // (a memory share, or a share whose failed prepare is still to be
        // undone) needs the mode: the last of them restores it.
        if restore_mode.is_some() && mode_needed_by_others(&uuid, others) {
            tracing::debug!(claim = %uid, device = %record.device, "compute mode left: another claim on the GPU needs it");
            restore_mode = None;
        }
        if let Some(change) = restore_mode
            && let Some(mode) = parse_mode(&change.previous)
        {
            if let Some(index) = index {
                if let Err(e) = inner.backend.set_compute_mode(index, mode) {
                    errors.push(format!("restore compute mode of {}: {e}", record.device));
                }
            } else {
                // Not an error that keeps the entry: a GPU this plugin no
                // longer sees cannot be reached by any retry either.
                tracing::error!(
                    claim = %uid,
                    device = %record.device,
                    gpu = %uuid,
                    mode = %change.previous,
                    "cannot restore the compute mode: the GPU is not known to this plugin; set it by hand"
                );
            }
        }
        if let DeviceKind::Mig {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
            mig_uuid: Some(mig_uuid),
            created: true,
            ..
        } = &record.kind
        {
            match index {
                Some(index) => {
                    // Verified by UUID: after a first destroy, another
                    // claim's new device may have got the same ids.
                    if let Err(e) =
                        mig::destroy_verified(&*inner.backend, index, *gi, *ci, mig_uuid)
                    {
                        errors.push(format!("destroy MIG device {}: {e}", record.device));
                    }
                }
                None => errors.push(format!(
                    "destroy MIG device {}: parent GPU {uuid} is not known to this plugin",
                    record.device
                )),
            }
        }
    }
    if let Err(e) = inner.opts.cdi.remove(&uid.0) {
        errors.push(format!("remove CDI spec: {e}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Restarts dead MPS daemons that completed claims, or claims whose entries
/// were lost, still use.
pub(crate) fn supervise(inner: &Inner) {
    // Only the entries with a daemon are copied (every period).
    let with_daemons = inner.store.claims_where(|e| {
        e.state == ClaimState::PrepareCompleted
            && e.devices.iter().any(|r| r.sharing.mps_daemon.is_some())
    });
    let mut ids: Vec<String> = with_daemons
        .values()
        .flat_map(|e| e.devices.iter())
        .filter_map(|r| r.sharing.mps_daemon.as_ref().map(|m| m.id.clone()))
        .collect();
    // A claim whose entry was lost: its pods run on, and the ledger names
    // only daemons that ran at the start (a daemon that died while the
    // plugin was down, or before a reboot, is forgotten there).
    ids.extend(
        inner
            .store
            .lost()
            .values()
            .flat_map(|l| l.mps_daemons.iter().cloned()),
    );
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return;
    }
    for (id, result) in inner.mps.check(&ids) {
        if let Err(e) = result {
            tracing::error!(daemon = %id, error = %e, "MPS daemon is down and could not be restarted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Footprint::{Share, Slices, Whole};

    #[test]
    fn footprints_overlap_exactly_when_they_share_hardware() {
        // Whole GPUs and shares conflict on the same GPU only.
        assert!(Whole(0).overlaps(Whole(0)));
        assert!(!Whole(0).overlaps(Whole(1)));
        assert!(Whole(0).overlaps(Share(0)) && Share(0).overlaps(Whole(0)));
        // Shares of one GPU coexist.
        assert!(!Share(0).overlaps(Share(0)));
        // MIG placements: memory slice ranges.
        assert!(Slices(0, 0, 2).overlaps(Slices(0, 1, 1)));
        assert!(!Slices(0, 0, 2).overlaps(Slices(0, 2, 2)));
        assert!(!Slices(0, 0, 2).overlaps(Slices(1, 0, 2)));
        assert!(Slices(0, 4, 4).overlaps(Slices(0, 0, 8)));
        // A placement and the whole GPU or a share of it.
        assert!(Slices(0, 6, 1).overlaps(Whole(0)) && Whole(0).overlaps(Slices(0, 6, 1)));
        assert!(Slices(0, 6, 1).overlaps(Share(0)) && Share(0).overlaps(Slices(0, 6, 1)));
        assert!(!Slices(0, 6, 1).overlaps(Whole(1)));
    }

    #[test]
    fn a_conflict_says_how_the_other_claim_holds_the_device() {
        let conflict = |held| {
            super::PrepareError::Conflict {
                device: "gpu-0".into(),
                other_device: "gpu-0".into(),
                held,
                other: "ns/other".into(),
                other_uid: "u-1".into(),
            }
            .to_string()
        };
        let prepared = conflict(super::Held::Prepared);
        assert!(
            prepared.contains("already prepared for claim ns/other (u-1)")
                && prepared.ends_with("unprepare the other claim first"),
            "{prepared}"
        );
        let failed = conflict(super::Held::FailedPrepare);
        assert!(
            failed.contains("still held by a failed prepare of claim ns/other (u-1)")
                && failed.contains("retried at that claim's next prepare"),
            "{failed}"
        );
    }

    #[test]
    fn placements_from_a_hostile_checkpoint_neither_overflow_nor_wrap() {
        let max = u32::MAX;
        // Would overflow in u32 (a panic with overflow checks, a wrap to a
        // missed overlap without).
        assert!(Slices(0, max, 2).overlaps(Slices(0, max, 1)));
        assert!(Slices(0, 0, 8).overlaps(Slices(0, 7, max)));
        assert!(Slices(0, 7, max).overlaps(Slices(0, 0, 8)));
        assert!(!Slices(0, 0, 7).overlaps(Slices(0, 7, max)));
        assert!(!Slices(0, max, max).overlaps(Slices(0, 0, max)));
    }
}
