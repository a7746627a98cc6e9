//! MPS (`GpuConfig` or `MigDeviceConfig` with `MPS`): one control daemon
//! for the devices of a claim that took their config from one entry of the
//! allocation's configs, with its thread and pinned-memory limits; whole
//! GPUs in compute mode `ExclusiveProcess` while it runs. The daemons start
//! while the claim's CDI spec is written ([`start_beside`]). This kind also
//! owns the MPS directory: the undo and the startup sweep of every daemon
//! (a memory share's too), the take-over of
//! daemons under an earlier `--mps-dir`, and the supervision that restarts
//! dead daemons still in use ([`supervise`]).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use gpu_dra_api::config::{DeviceConfig, MpsConfig};
use gpu_nvml::ComputeMode;

use super::{Kind, Recovery, Release, Setup, Undo};
use crate::prepare::Inner;
use crate::prepare::checkpoint::{
    Checkpoint, ClaimEntry, ClaimState, ClaimUid, DeviceKind, MpsDaemonRecord, PreparedDeviceRecord,
};
use crate::prepare::compute_mode;
use crate::prepare::error::PrepareError;
use crate::prepare::journal::failpoint;
use crate::prepare::mps::{DaemonConfig, MpsError};
use crate::prepare::plan::Target;
use crate::prepare::report::RecoveryReport;

/// The MPS kind.
pub(crate) struct Mps;

/// Volta (7.0) is the first architecture with multi-user MPS servers.
/// Earlier ones take `-M` but their non-root clients fail `cuInit`
/// (NVIDIA's driver lets the daemon start; here the prepare fails).
const MULTI_USER_MIN_CC: (u32, u32) = (7, 0);

/// Refuses `multiUser` on a GPU of compute capability `cc` below 7.0. MIG
/// devices need Ampere, so only whole GPUs are checked.
fn check_multi_user(mps: &MpsConfig, cc: (u32, u32)) -> Result<(), String> {
    if mps.multi_user == Some(true) && cc < MULTI_USER_MIN_CC {
        return Err(format!(
            "mpsConfig.multiUser needs compute capability 7.0 (Volta) or later; this GPU has {}.{}: leave multiUser out",
            cc.0, cc.1
        ));
    }
    Ok(())
}

/// The MPS daemons a claim asks for, gathered device by device.
#[derive(Default)]
pub(crate) struct Daemons {
    /// The devices asking for MPS, grouped by the config entry they took
    /// it from: one daemon each.
    groups: Vec<MpsGroup>,
    /// Whole GPUs of those: (device, GPU index), set to EXCLUSIVE_PROCESS
    /// while their daemons start (see [`start_and_write_spec`]).
    exclusive: Vec<(usize, u32)>,
    /// One per group, once every device is set up ([`Kind::finish`]).
    configs: Vec<DaemonConfig>,
}

impl Kind for Mps {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        match (&d.target, claim.sharing_config(i)) {
            (Target::Gpu(g), Some(DeviceConfig::Gpu(cfg))) => {
                if cfg.time_slice().is_none()
                    && let Some(mps) = cfg.mps()
                {
                    check_multi_user(mps, g.compute_capability).map_err(|reason| {
                        PrepareError::Unsupported {
                            device: d.device.clone(),
                            reason,
                        }
                    })?;
                    claim.mps.exclusive.push((i, g.index));
                    group(
                        &mut claim.mps.groups,
                        d.config_entry,
                        mps,
                        i,
                        g.uuid.clone(),
                    );
                }
            }
            (Target::Mig(_), Some(DeviceConfig::Mig(cfg))) => {
                if let Some(mps) = cfg.mps()
                    && let DeviceKind::Mig {
                        mig_uuid: Some(uuid),
                        ..
                    } = &claim.entry.devices[i].kind
                {
                    let uuid = uuid.clone();
                    group(&mut claim.mps.groups, d.config_entry, mps, i, uuid);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(&self, claim: &mut Setup<'_>) -> Result<(), PrepareError> {
        let mut configs = Vec::with_capacity(claim.mps.groups.len());
        for (n, group) in claim.mps.groups.iter().enumerate() {
            let (config, members) = (&group.config, &group.members);
            let uuids: Vec<&str> = members.iter().map(|(_, u)| u.as_str()).collect();
            let limits =
                config
                    .pinned_memory_limits(&uuids)
                    .map_err(|e| PrepareError::Unsupported {
                        device: claim.plan.devices[members[0].0].device.clone(),
                        reason: format!("MPS config: {e}"),
                    })?;
            configs.push(DaemonConfig {
                id: crate::prepare::checkpoint::daemon_id(&claim.plan.uid, n),
                gpu_uuids: uuids.iter().map(|u| (*u).to_owned()).collect(),
                active_thread_percentage: config
                    .default_active_thread_percentage
                    .and_then(|p| u8::try_from(p).ok()),
                pinned_memory_limits: limits,
                multi_user: config.multi_user == Some(true),
            });
        }
        for (cfg, group) in configs.iter().zip(&claim.mps.groups) {
            for (i, _) in &group.members {
                claim
                    .spec
                    .add_edits(&claim.names[*i], claim.inner.mps.container_edits(&cfg.id))?;
            }
        }
        claim.mps.configs = configs;
        Ok(())
    }

    /// Every daemon a record names, a claim's own or a memory-shared
    /// GPU's, once no other claim uses it.
    fn undo(&self, cx: &mut Undo<'_>, record: &PreparedDeviceRecord) {
        if let Some(daemon) = &record.sharing.mps_daemon {
            stop_unless_in_use(cx, &daemon.id);
        }
    }

    /// Every MPS daemon whose records name another MPS directory than
    /// `--mps-dir` is taken over there.
    fn take_over(&self, inner: &Inner, snapshot: &Checkpoint, report: &mut RecoveryReport) {
        let records = snapshot
            .claims
            .values()
            .flat_map(|e| e.devices.iter())
            .filter_map(|d| d.sharing.mps_daemon.as_ref());
        let (adopt, errors) = daemons_elsewhere(records, |r| inner.mps.recorded_elsewhere(r));
        report.errors.extend(errors);
        for (id, dir) in adopt {
            report
                .mps_elsewhere
                .push(format!("{id} in {}", dir.join(&id).display()));
            inner.mps.adopt_elsewhere(&id, dir);
        }
    }

    /// MPS daemons no remaining entry references are stopped: those under
    /// `--mps-dir`, and, when entries were lost or the ledger names
    /// daemons, this plugin's daemons under an earlier `--mps-dir`, found
    /// by process and killed (their directories are left: see
    /// `MpsControl::stop_orphans_elsewhere`). A lost entry's daemon that
    /// still runs serves its pods and is kept.
    fn sweep(&self, cx: &mut Recovery<'_>) {
        let inner = cx.inner;
        let daemons: HashSet<String> = cx
            .remaining
            .claims
            .values()
            .flat_map(|e| e.devices.iter())
            .filter_map(|d| d.sharing.mps_daemon.as_ref().map(|m| m.id.clone()))
            .collect();
        let lost_daemons: HashSet<&str> = cx
            .lost
            .values()
            .flat_map(|l| l.mps_daemons.iter().map(String::as_str))
            .collect();
        let report = &mut *cx.report;
        match inner.mps.list() {
            Ok(ids) => {
                for id in ids.into_iter().filter(|id| !daemons.contains(id)) {
                    if lost_daemons.contains(id.as_str()) && inner.mps.is_running(&id) {
                        continue;
                    }
                    match inner.mps.stop(&id) {
                        Ok(()) => report.mps_stopped.push(id),
                        Err(e) => report.errors.push(format!("stop MPS daemon {id}: {e}")),
                    }
                }
            }
            Err(e) => report.errors.push(format!("list MPS daemons: {e}")),
        }
        if report.load.lost_entries() || !lost_daemons.is_empty() {
            let keep = |id: &str| lost_daemons.contains(id);
            let (stopped, errors) = inner.mps.stop_orphans_elsewhere(&keep);
            report.mps_stopped.extend(stopped);
            report.errors.extend(errors);
        }
        cx.found.daemons.extend(
            lost_daemons
                .iter()
                .filter(|id| inner.mps.is_running(id))
                .map(|id| (*id).to_owned()),
        );
    }

    fn release_lost(&self, cx: &mut Release<'_>) {
        let named: HashSet<&str> = cx
            .records()
            .filter_map(|r| r.sharing.mps_daemon.as_ref().map(|m| m.id.as_str()))
            .chain(
                cx.other_lost
                    .iter()
                    .flat_map(|l| l.mps_daemons.iter().map(String::as_str)),
            )
            .collect();
        let mut errors = Vec::new();
        for id in cx
            .claim
            .mps_daemons
            .iter()
            .filter(|id| !named.contains(id.as_str()))
        {
            if let Err(e) = cx.inner.mps.stop(id) {
                errors.push(format!("stop MPS daemon {id}: {e}"));
            }
        }
        cx.errors.extend(errors);
    }
}

/// Stops daemon `id` unless this undo stopped it already or another claim
/// still uses it ([`Undo::daemon_in_use`]).
fn stop_unless_in_use(cx: &mut Undo<'_>, id: &str) {
    if cx.stopped.iter().any(|s| s == id) || cx.daemon_in_use(id) {
        return;
    }
    match cx.inner.mps.stop(id) {
        Ok(()) => cx.stopped.push(id.to_owned()),
        Err(e) => cx.errors.push(format!("stop MPS daemon {id}: {e}")),
    }
}

/// Starts the claim's MPS daemons while its CDI spec is written, and
/// records every daemon that started, even when another step failed, so
/// the rollback stops it (and removes the spec).
pub(crate) fn start_beside(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    daemons: Daemons,
    write_spec: impl FnOnce() -> Result<(), PrepareError> + Send,
) -> Result<(), PrepareError> {
    let started = start_and_write_spec(
        inner,
        uid,
        entry,
        &daemons.exclusive,
        &daemons.configs,
        write_spec,
    );
    let mut first_error = started.side.err();
    for (result, group) in started.daemons.into_iter().zip(&daemons.groups) {
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
    if !daemons.configs.is_empty() {
        failpoint("prepare-after-mps");
    }
    Ok(())
}

/// What [`start_and_write_spec`] did: the outcome of the compute-mode changes and the
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
fn start_and_write_spec(
    inner: &Inner,
    uid: &ClaimUid,
    entry: &mut ClaimEntry,
    exclusive: &[(usize, u32)],
    daemons: &[DaemonConfig],
    write_spec: impl FnOnce() -> Result<(), PrepareError> + Send,
) -> MpsStarts {
    let side = |entry: &mut ClaimEntry| {
        exclusive.iter().try_for_each(|&(i, index)| {
            compute_mode::set(inner, uid, entry, i, index, ComputeMode::ExclusiveProcess)
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

/// The daemons of `records` to take over under another directory, by id,
/// and what was wrong. `recorded` says where a record's daemon lives
/// (`None`: `--mps-dir`). An id recorded under `--mps-dir` too stays there
/// (a daemon started afresh after the earlier one was gone); one recorded
/// under two other directories is taken over under the first, with an error.
fn daemons_elsewhere<'a, E: std::fmt::Display>(
    records: impl Iterator<Item = &'a MpsDaemonRecord>,
    recorded: impl Fn(&MpsDaemonRecord) -> Result<Option<PathBuf>, E>,
) -> (BTreeMap<String, PathBuf>, Vec<String>) {
    let mut here = HashSet::new();
    let mut elsewhere: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut errors = Vec::new();
    for record in records {
        match recorded(record) {
            Ok(None) => {
                here.insert(record.id.clone());
            }
            Ok(Some(dir)) => match elsewhere.get(&record.id) {
                Some(first) if *first != dir => errors.push(format!(
                    "MPS daemon {} is recorded under both {} and {}; taken over under the first",
                    record.id,
                    first.display(),
                    dir.display()
                )),
                Some(_) => {}
                None => {
                    elsewhere.insert(record.id.clone(), dir);
                }
            },
            Err(e) => errors.push(e.to_string()),
        }
    }
    elsewhere.retain(|id, _| !here.contains(id));
    (elsewhere, errors)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn multi_user_needs_volta() {
        let on = MpsConfig {
            multi_user: Some(true),
            ..MpsConfig::default()
        };
        assert_eq!(check_multi_user(&on, (7, 0)), Ok(()));
        assert_eq!(check_multi_user(&on, (10, 0)), Ok(()));
        let err = check_multi_user(&on, (6, 1)).unwrap_err();
        assert!(
            err.contains("needs compute capability 7.0 (Volta) or later; this GPU has 6.1"),
            "{err}"
        );
        for off in [Some(false), None] {
            let cfg = MpsConfig {
                multi_user: off,
                ..MpsConfig::default()
            };
            assert_eq!(check_multi_user(&cfg, (6, 1)), Ok(()));
        }
    }

    #[test]
    fn daemons_elsewhere_are_taken_over_once_and_never_over_the_current_dir() {
        let record = |id: &str, dir: &str| MpsDaemonRecord {
            id: id.into(),
            pipe_dir: PathBuf::from(dir).join(id).join("pipe"),
            ..MpsDaemonRecord::default()
        };
        let records = [
            // Two claims of one memory-shared GPU, both under the old dir.
            record("shared-gpu0", "/old"),
            record("shared-gpu0", "/old"),
            // Started afresh under --mps-dir after the old one was gone.
            record("shared-gpu1", "/old"),
            record("shared-gpu1", "/current"),
            // Under two old directories.
            record("shared-gpu2", "/old"),
            record("shared-gpu2", "/older"),
            record("claim-x-0", "/current"),
            record("bad", "/old"),
        ];
        let (adopt, errors) = daemons_elsewhere(records.iter(), |r| {
            let dir = r.pipe_dir.parent().and_then(Path::parent).unwrap();
            match r.id.as_str() {
                "bad" => Err("a bad record"),
                _ if dir == Path::new("/current") => Ok(None),
                _ => Ok(Some(dir.to_path_buf())),
            }
        });
        assert_eq!(
            adopt,
            BTreeMap::from([
                ("shared-gpu0".to_owned(), PathBuf::from("/old")),
                ("shared-gpu2".to_owned(), PathBuf::from("/old")),
            ])
        );
        assert_eq!(
            errors,
            [
                "MPS daemon shared-gpu2 is recorded under both /old and /older; taken over under the first",
                "a bad record",
            ]
        );
    }
}
