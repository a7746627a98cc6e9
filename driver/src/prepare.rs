//! Claim preparation: what `NodePrepareResources` and
//! `NodeUnprepareResources` do to this node's GPUs, and the durable record
//! of it ([`checkpoint`]) that makes prepare idempotent, lets unprepare
//! work from local state alone and survives plugin crashes.
//!
//! The path of one claim, a module each: [`claim`] (what kubelet asks and
//! gets back) → [`plan`] (the fetched claim to the devices and configs to
//! prepare) → [`locks`] (exactly its GPUs) → `conflicts` (no device given
//! twice) → `apply` (the checkpoint protocol) around `kinds` (each kind's
//! setup and undo: whole GPU, MIG, memory share, time slice, MPS) →
//! [`cdi`] (the spec the runtime reads) → `commits` (grouped checkpoint
//! writes) → `status` (the claim's `status.devices`). The hardware steps
//! the kinds call are [`mig`], [`mps`], [`timeslice`] and `compute_mode`.
//!
//! Prepare of one claim ([`Preparer::prepare_one`]):
//! 1. a claim whose checkpoint entry is `PrepareCompleted` is answered from
//!    the checkpoint (idempotent, no API call);
//! 2. fetch the ResourceClaim, [`plan`] it (UID, allocation, our results,
//!    configs);
//! 3. take the locks of exactly its GPUs ([`locks`]); check that no other
//!    prepared claim holds an overlapping device (the last line of defence
//!    against double allocation; admin access and memory shares excepted);
//! 4. set the hardware up through the `kinds` (a change startup recovery
//!    could not find by itself is journalled as `PrepareStarted` before it
//!    is made), write the CDI spec; a failure rolls back what this attempt
//!    did and removes the entry;
//! 5. commit `PrepareCompleted` (grouped with concurrent claims into one
//!    checkpoint write); answer kubelet, while `status.devices` of the
//!    claim is written in the background (`status`, best effort).
//!
//! Unprepare works from the checkpoint alone: undo what the entry records,
//! delete the spec, remove the entry; an unknown claim is already
//! unprepared, unless its entry was lost: then what the lost text named is
//! released (`lost`). At start ([`Preparer::start`]) the plugin recovers
//! from a crash (`recover`): entries still `PrepareStarted` are undone and
//! dropped, and MIG devices, MPS daemons and CDI specs that neither a
//! completed claim references nor the ledger of lost entries names are
//! removed.

mod apply;
pub(crate) mod capped;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
mod commits;
mod compute_mode;
mod conflicts;
mod error;
mod journal;
mod kinds;
pub mod locks;
mod lost;
pub mod metadata;
mod metadata_files;
pub mod mig;
pub mod mps;
pub mod plan;
mod recover;
mod report;
mod status;
pub mod timeslice;

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use gpu_nvml::GpuBackend;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::sync::watch;

use crate::devices::{BuildOptions, DeviceModel, DeviceRef};
use crate::discovery::Inventory;
use crate::phase::Phase;
use cdi::{HostRoot, NodeLocator, SpecDir};
use checkpoint::{ClaimEntry, ClaimState, ClaimUid, PreparedDeviceRecord, Store};
use claim::{ClaimError, ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice};
use mig::MigRequest;
use mps::MpsControl;

pub use report::RecoveryReport;

use locks::GpuLocks;
use plan::{GpuTarget, MigTarget, PlanError, Target};

/// Where the preparer reads and writes, and whose claims it takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// DRA driver name (`gpu.nvidia.com`).
    pub driver_name: String,
    /// This node: the pool name of our devices.
    pub node_name: String,
    /// Transient CDI specs.
    pub cdi: SpecDir,
    /// The NVIDIA driver installation (libraries, binaries).
    pub driver_root: HostRoot,
    /// Where device nodes are (`/` in production).
    pub dev_root: HostRoot,
    /// Where `driver/nvidia/capabilities` is read (`/proc` in production).
    pub proc_root: PathBuf,
    /// The plugin's state: checkpoint, lock.
    pub state_dir: HostRoot,
    /// The MPS daemons' directories (`--mps-dir`).
    pub mps_dir: HostRoot,
    /// The device model options the publisher uses (dynamic MIG, memory
    /// sharing), so the preparer sees the same devices.
    pub build: BuildOptions,
    /// The program that starts MPS daemons in a private mount namespace
    /// ([`MpsControl::with_launcher`]).
    pub mps_launcher: Option<PathBuf>,
    /// The MPS daemon host's socket (`--mps-host-socket`,
    /// [`MpsControl::with_host`]); `None`: the plugin starts daemons itself.
    pub mps_host: Option<PathBuf>,
    /// Host path of `nvidia-cdi-hook` (`--nvidia-cdi-hook-path`); `None`:
    /// the one in the driver root, if any.
    pub cdi_hook: Option<String>,
    /// A rolling update (`--rolling-update`): when another instance holds the
    /// state or MPS directory, wait for it to exit (reported here) instead
    /// of failing. `None`: a held directory is [`Error::Locked`].
    pub wait_for_lock: Option<watch::Sender<Phase>>,
    /// How often MPS daemons still in use are checked and restarted if
    /// dead (`--mps-check-interval`).
    pub mps_check_interval: Duration,
    /// Where sysfs is (`--sysfs-root`): VFIO passthrough rebinds GPUs
    /// there.
    pub sysfs_root: PathBuf,
    /// Where KEP-5304 device metadata files go
    /// (`<kubelet-plugins-dir>/<driver>/dra-device-metadata`, see
    /// [`metadata`]); `None`: none are written (`--device-metadata=false`).
    pub device_metadata: Option<HostRoot>,
}

/// Errors that stop the preparer from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint cannot be opened.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    /// Another plugin instance holds the state directory or the MPS
    /// directory.
    #[error(
        "{what} {path} is locked by another plugin instance on this node; stop it first or give each instance its own (two instances would undo each other's claims)"
    )]
    Locked {
        /// `state directory` or `MPS directory`.
        what: &'static str,
        /// The lock file.
        path: PathBuf,
    },
    /// A directory the preparer needs (state, MPS, CDI) or its lock file
    /// cannot be used.
    #[error("cannot use {what} {path}: {source}")]
    Dir {
        /// `state directory`, `MPS directory` or `CDI directory`.
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A blocking task panicked.
    #[error("preparer startup task failed: {0}")]
    Task(String),
}

/// Where the kernel's boot id is read.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Name of the lock file in the state directory (and in the MPS directory
/// when it is elsewhere).
pub const LOCK_FILE: &str = "preparer.lock";

/// Takes the exclusive lock of `dir` (the `what`), held for the
/// preparer's life; creates the directory if needed. When another process
/// holds it: with `wait`, blocks until that process lets it go (exits),
/// reporting the wait there; without, fails at once.
fn lock_dir(
    dir: &std::path::Path,
    what: &'static str,
    wait: Option<&watch::Sender<Phase>>,
) -> Result<std::fs::File, Error> {
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| Error::Dir { what, path, source }
    };
    // 0750, as the kubelet plugin directories (the state dir is by
    // default the plugin's socket directory).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(io(dir))?;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    match (file.try_lock(), wait) {
        (Ok(()), _) => Ok(file),
        (Err(std::fs::TryLockError::WouldBlock), None) => Err(Error::Locked { what, path }),
        (Err(std::fs::TryLockError::WouldBlock), Some(phase)) => {
            tracing::info!(
                lock = %path.display(),
                what,
                "another plugin instance holds the {what} (a rolling update?); waiting for it to exit"
            );
            phase.send_replace(Phase::WaitingFor(path.clone()));
            let waited = std::time::Instant::now();
            file.lock().map_err(io(&path))?;
            tracing::info!(
                lock = %path.display(),
                waited_us = crate::micros(waited),
                "the other instance let the {what} go; taking over"
            );
            phase.send_replace(Phase::Starting);
            Ok(file)
        }
        (Err(std::fs::TryLockError::Error(source)), _) => Err(Error::Dir { what, path, source }),
    }
}

/// The [`ClaimPreparer`] of the plugin.
#[derive(Clone)]
pub struct Preparer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preparer")
            .field("options", &self.inner.opts)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    opts: Options,
    client: kube::Client,
    backend: Arc<dyn GpuBackend>,
    catalog: HashMap<String, Target>,
    /// With dynamic MIG, discovery's facts of each GPU, by NVML index:
    /// MIG creation takes the parts that never change from here instead of
    /// reading the whole GPU again (see [`crate::prepare::mig::create_on`]).
    /// Empty otherwise: nothing else reads them.
    gpus: HashMap<u32, gpu_nvml::GpuInfo>,
    store: Store,
    locks: GpuLocks,
    /// Claims staged and being committed (see [`commits`]).
    pending: commits::Pending,
    /// `status.devices` writes still running (see [`status`]).
    status_writes: status::Writes,
    mps: MpsControl,
    nodes: NodeLocator,
    /// Claim-level CDI edits (driver files, control nodes, hooks), found on
    /// the first prepare and kept (see `kinds::CommonEdits`).
    common_edits: Mutex<Option<kinds::CommonEdits>>,
    /// The device metadata writer, unless turned off.
    metadata: Option<metadata::Writer>,
    /// The state directory's lock, and the MPS directory's when it is
    /// elsewhere (see [`LOCK_FILE`]).
    _locks: Vec<std::fs::File>,
}

impl Preparer {
    /// Opens the checkpoint, recovers from a crash (see `recover`) and
    /// starts the MPS supervisor. Runs the blocking parts off the runtime.
    pub async fn start(
        opts: Options,
        client: kube::Client,
        backend: Arc<dyn GpuBackend>,
        inventory: &Inventory,
    ) -> Result<(Self, RecoveryReport), Error> {
        let model = DeviceModel::build(inventory, &opts.build);
        let catalog = catalog(inventory, &model, &opts.build);
        let metadata = opts
            .device_metadata
            .clone()
            .map(|root| metadata::Writer::new(root, &opts.driver_name, &model));
        let gpus = inventory
            .gpus
            .iter()
            .filter(|_| opts.build.dynamic_mig)
            .map(|g| (g.info.index, g.info.clone()))
            .collect();
        let inner = tokio::task::spawn_blocking(move || -> Result<_, Error> {
            let wait = opts.wait_for_lock.as_ref();
            let mut locks = vec![lock_dir(&opts.state_dir.path, "state directory", wait)?];
            // Each instance stops the daemons in its MPS directory that
            // none of its claims use: one directory per instance.
            if !opts.mps_dir.path.starts_with(&opts.state_dir.path) {
                locks.push(lock_dir(&opts.mps_dir.path, "MPS directory", wait)?);
            }
            let cdi_root = opts.cdi.root();
            std::fs::create_dir_all(cdi_root).map_err(|source| Error::Dir {
                what: "CDI directory",
                path: cdi_root.to_path_buf(),
                source,
            })?;
            // Not under --proc-root: the boot id is the same in every
            // container of the node, and the chart mounts only
            // /proc/driver/nvidia at --proc-root.
            let boot_id = std::path::Path::new(BOOT_ID);
            let (store, load) = Store::open(&opts.state_dir.path, boot_id)?;
            let mut mps = MpsControl::new(opts.driver_root.clone(), opts.mps_dir.clone())
                .with_owner(&opts.state_dir.path);
            if let Some(launcher) = &opts.mps_launcher {
                mps = mps.with_launcher(launcher);
            }
            if let Some(socket) = &opts.mps_host {
                mps = mps.with_host(socket);
            }
            let nodes = NodeLocator::new(opts.dev_root.clone(), opts.proc_root.clone());
            let inner = Arc::new(Inner {
                opts,
                client,
                backend,
                catalog,
                gpus,
                store,
                locks: GpuLocks::default(),
                pending: commits::Pending::default(),
                status_writes: status::Writes::default(),
                mps,
                nodes,
                common_edits: Mutex::new(None),
                metadata,
                _locks: locks,
            });
            let report = recover::recover(&inner, load);
            Ok((inner, report))
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))??;
        let (inner, report) = inner;
        report.log();
        let period = inner.opts.mps_check_interval;
        tokio::spawn(supervise_mps(Arc::downgrade(&inner), period));
        tokio::spawn(status::republish_missing(Arc::downgrade(&inner)));
        tokio::spawn(keep_state_on_disk(Arc::downgrade(&inner)));
        Ok((Self { inner }, report))
    }

    /// The checkpoint (for tests and the demo).
    pub fn checkpoint(&self) -> checkpoint::Checkpoint {
        self.inner.store.snapshot()
    }

    /// Prepares one claim; see the module docs for the steps.
    pub async fn prepare_one(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, ClaimError> {
        let started = std::time::Instant::now();
        let inner = &self.inner;
        let uid = ClaimUid(claim.uid.clone());
        if let Some(entry) = self.completed(&uid).await {
            tracing::debug!(claim = %uid, "already prepared; answering from the checkpoint");
            // Its status may have been lost (a crash between the checkpoint
            // and the write, while the API server could not be read at the
            // start, or removed by hand).
            let (worker, claim, kept) = (Arc::clone(inner), claim.clone(), entry.clone());
            tokio::spawn(status::publish_if_missing(worker, claim, kept));
            return Ok(answer(&entry));
        }
        let reading = std::time::Instant::now();
        let object = fetch(&self.inner.client, claim, CLAIM_READ_TIMEOUT).await?;
        let read_us = crate::micros(reading);
        let plan = Arc::new(
            plan::plan(
                &object,
                &claim.uid,
                &inner.opts.driver_name,
                &inner.opts.node_name,
                &inner.catalog,
            )
            .map_err(|e: PlanError| ClaimError::Failed(e.to_string()))?,
        );
        let failed = |e: &dyn std::fmt::Display| ClaimError::Failed(e.to_string());
        let task_failed = |e: tokio::task::JoinError| {
            failed(&format!("internal error: prepare task failed: {e}"))
        };
        let entry = loop {
            // The claim's GPUs, and those of a half-prepared entry an
            // earlier attempt left (undone first, under their locks).
            let mut minors = plan.gpu_minors();
            if let Some(stale) = inner.store.get(&uid) {
                minors.extend(apply::entry_minors(&stale));
            }
            let held = inner.locks.lock(&minors, &uid).await;
            let (worker, work) = (Arc::clone(inner), Arc::clone(&plan));
            let attempt = tokio::task::spawn_blocking(move || attempt(&worker, &work, held))
                .await
                .map_err(task_failed)?
                .map_err(|e| failed(&e))?;
            match attempt {
                Attempt::Prepared(entry) => {
                    inner.status_writes.publish(inner, claim, &entry);
                    break entry;
                }
                // A concurrent call for the same claim is committing: once
                // it settles, staging again answers its entry (or prepares
                // afresh if it failed).
                Attempt::InFlight => inner.pending.wait_settled(&uid).await,
                // Its entry changed between the look and the locks.
                Attempt::Relock => {}
            }
        };
        if inner.store.is_lost(&uid) {
            // Prepared again after its entry was lost: what the new entry
            // does not name is left over from the earlier preparation.
            if let Err(e) = self.release_lost(&uid).await {
                tracing::warn!(claim = %uid, error = %e, "what the lost entry named is kept for the claim's unprepare");
            }
        }
        tracing::info!(
            claim = %uid,
            namespace = %claim.namespace,
            name = %claim.name,
            devices = entry.devices.len(),
            read_us,
            elapsed_us = crate::micros(started),
            "claim prepared"
        );
        Ok(answer(&entry))
    }

    /// The completed entry of `uid`, once no call is committing it.
    async fn completed(&self, uid: &ClaimUid) -> Option<ClaimEntry> {
        self.inner.pending.wait_settled(uid).await;
        self.inner
            .store
            .get(uid)
            .filter(|e| e.state == ClaimState::PrepareCompleted)
    }

    /// Unprepares one claim from its checkpoint entry; unknown = done.
    pub async fn unprepare_one(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let started = std::time::Instant::now();
        let inner = &self.inner;
        let uid = ClaimUid(claim.uid.clone());
        let (entry, held) = loop {
            // A prepare of this claim still running (or committing)
            // finishes first: answered before it, this unprepare would
            // find nothing, and that prepare's devices would stay.
            inner.pending.wait_idle(&uid).await;
            let Some(seen) = inner.store.get(&uid) else {
                if inner.store.is_lost(&uid) || lost::names_daemon_of(inner, &uid) {
                    self.release_lost(&uid).await.map_err(ClaimError::Failed)?;
                    tracing::info!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name, "claim whose entry was lost unprepared");
                } else {
                    tracing::debug!(claim = %uid, "unprepare of a claim not prepared here: nothing to do");
                }
                // A crash may have come between the checkpoint and the status.
                inner.status_writes.clear(inner, claim);
                return Ok(());
            };
            let minors = apply::entry_minors(&seen);
            let held = inner.locks.lock(&minors, &uid).await;
            // Read again under the locks: while this call waited for them,
            // another (a retry, or the claim twice in one call) may have
            // unprepared the claim, and a new claim may have set up these
            // GPUs since. Undoing the entry seen before the wait would undo
            // that claim's settings.
            match inner.store.get(&uid) {
                Some(now)
                    if !inner.pending.contains(&uid) && apply::entry_minors(&now) == minors =>
                {
                    break (now, held);
                }
                // Gone (the next round answers it), prepared again on other
                // GPUs, or being committed: look again without the locks.
                _ => drop(held),
            }
        };
        let worker = Arc::clone(inner);
        let undone = uid.clone();
        tokio::task::spawn_blocking(move || {
            // The claim's daemons among the ledger's unattributed names go
            // with it (those its entry records, with the entry's undo).
            lost::release_unattributed(&worker, &undone).map_err(error::PrepareError::Undo)?;
            apply::unprepare(&worker, &undone, &entry)
        })
        .await
        .map_err(|e| ClaimError::Failed(format!("internal error: unprepare task failed: {e}")))?
        .map_err(|e| ClaimError::Failed(e.to_string()))?;
        drop(held);
        if inner.store.is_lost(&uid) {
            // Prepared again after its entry was lost, and the release
            // then failed: what the lost entry named goes now.
            self.release_lost(&uid).await.map_err(ClaimError::Failed)?;
        }
        tracing::info!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name, elapsed_us = crate::micros(started), "claim unprepared");
        // After the claim's status writes still running, in the background;
        // a prepare of it from now on writes after the clear.
        inner.status_writes.clear(inner, claim);
        Ok(())
    }

    /// Releases what the ledger of lost entries names for `uid`, under
    /// every GPU's lock (see [`lost`]).
    async fn release_lost(&self, uid: &ClaimUid) -> Result<(), String> {
        let inner = &self.inner;
        let held = inner.locks.lock(&lost::all_minors(inner), uid).await;
        let (worker, released) = (Arc::clone(inner), uid.clone());
        let result = tokio::task::spawn_blocking(move || lost::release(&worker, &released))
            .await
            .map_err(|e| format!("internal error: release task failed: {e}"))?;
        drop(held);
        result.map_err(|errors| {
            format!(
                "releasing what the lost checkpoint entry of the claim named failed: {}",
                errors.join("; ")
            )
        })
    }
}

/// How long the read of a claim may take. The kube client has no read
/// timeout of its own, and a prepare stuck on a hung API server would hold
/// up the claim's unprepare (it waits for the prepare) for good. Under
/// kubelet's own limit on the call (45 s), so kubelet gets this error.
const CLAIM_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Reads the claim a prepare names, giving up after `limit`.
async fn fetch(
    client: &kube::Client,
    claim: &ClaimRef,
    limit: Duration,
) -> Result<ResourceClaim, ClaimError> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    match status::bounded(limit, api.get_opt(&claim.name)).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(ClaimError::Failed(format!(
            "ResourceClaim {}/{} not found in the API server",
            claim.namespace, claim.name
        ))),
        Err(e) => Err(ClaimError::Failed(format!(
            "cannot read ResourceClaim {}/{} from the API server: {e}",
            claim.namespace, claim.name
        ))),
    }
}

impl ClaimPreparer for Preparer {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        let me = self.clone();
        Box::pin(per_claim(claims, "prepare", move |c| {
            // Counted before the task starts: an unprepare of the claim
            // waits until this prepare ends.
            let running = Running::begin(&me.inner, &c.uid);
            let me = me.clone();
            async move {
                let _running = running;
                me.prepare_one(&c).await
            }
        }))
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        let me = self.clone();
        Box::pin(per_claim(claims, "unprepare", move |c| {
            let me = me.clone();
            async move { me.unprepare_one(&c).await }
        }))
    }
}

/// What the blocking part of one prepare attempt ended with.
enum Attempt {
    /// Committed, or completed by a concurrent call: answer it.
    Prepared(ClaimEntry),
    /// Another call is committing this claim: wait for it and look again.
    InFlight,
    /// The claim's half-prepared entry is on GPUs not locked: lock them too.
    Relock,
}

/// Stages `plan` under the GPU locks `held`, lets them go, and commits
/// the entry, on one blocking thread (each hop between the runtime and a
/// blocking thread costs a wake-up). Until it settles the entry is
/// pending: other claims on these GPUs see it while it is committed, and
/// their commits join this one in one checkpoint write. A failed commit
/// is rolled back under the locks again.
fn attempt(
    inner: &Arc<Inner>,
    plan: &plan::ClaimPlan,
    held: locks::Held,
) -> Result<Attempt, error::PrepareError> {
    let entry = match apply::stage(inner, plan, held.minors())? {
        apply::Staged::Done(entry) => return Ok(Attempt::Prepared(entry)),
        apply::Staged::InFlight => return Ok(Attempt::InFlight),
        apply::Staged::Relock => return Ok(Attempt::Relock),
        apply::Staged::Ready(entry) => entry,
    };
    drop(held);
    let _settle = commits::Settle::new(&inner.pending, &plan.uid);
    let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        apply::complete(inner, &plan.uid, &entry)
    }))
    .unwrap_or_else(|_| {
        Err(error::PrepareError::Checkpoint {
            step: "PrepareCompleted".to_owned(),
            reason: "internal error: the commit panicked".to_owned(),
        })
    });
    match committed {
        Ok(()) => Ok(Attempt::Prepared(entry)),
        Err(error) => {
            // A blocking thread may wait for the async locks.
            let held = tokio::runtime::Handle::current()
                .block_on(inner.locks.lock(&plan.gpu_minors(), &plan.uid));
            let error = apply::abandon(inner, &plan.uid, entry, error);
            drop(held);
            Err(error)
        }
    }
}

/// A prepare of a claim, counted as running until dropped (see
/// [`commits::Pending::begin_prepare`]).
struct Running {
    inner: Arc<Inner>,
    uid: ClaimUid,
}

impl Running {
    fn begin(inner: &Arc<Inner>, uid: &str) -> Self {
        let uid = ClaimUid(uid.to_owned());
        inner.pending.begin_prepare(&uid);
        Self {
            inner: Arc::clone(inner),
            uid,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.inner.pending.end_prepare(&self.uid);
    }
}

/// Runs `work` for every claim, each in a task of its own: a call kubelet
/// gives up on (its future dropped) does not stop a claim half-way.
async fn per_claim<T, F, Fut>(claims: &[ClaimRef], what: &str, work: F) -> ClaimResults<T>
where
    T: Send + 'static,
    F: Fn(ClaimRef) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClaimError>> + Send + 'static,
{
    let tasks = claims.iter().map(|c| tokio::spawn(work(c.clone())));
    let results = futures::future::join_all(tasks).await.into_iter().map(|r| {
        r.unwrap_or_else(|e| {
            Err(ClaimError::Failed(format!(
                "internal error: {what} task failed: {e}"
            )))
        })
    });
    claims
        .iter()
        .zip(results)
        .map(|(c, r)| (c.uid.clone(), r))
        .collect()
}

/// The kubelet answer recorded in a completed entry.
fn answer(entry: &ClaimEntry) -> Vec<PreparedDevice> {
    entry
        .devices
        .iter()
        .map(|d: &PreparedDeviceRecord| PreparedDevice {
            request_names: d.requests.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

/// The devices this node publishes (`model`, built from `inventory` and
/// `build`), by name, with their hardware.
pub fn catalog(
    inventory: &Inventory,
    model: &DeviceModel,
    build: &BuildOptions,
) -> HashMap<String, Target> {
    let mut out = HashMap::new();
    for device in model.devices() {
        let target = match device.location {
            DeviceRef::Gpu { minor } => {
                let Some(gpu) = inventory.gpus.iter().find(|g| g.info.minor == minor) else {
                    continue;
                };
                Target::Gpu(GpuTarget {
                    index: gpu.info.index,
                    minor,
                    uuid: gpu.info.uuid.clone(),
                    memory_bytes: gpu.info.memory_bytes,
                    memory_shared: device.memory_sharing.is_some_and(|s| s.enforced),
                    counted_share: device.memory_sharing.is_some_and(|s| !s.enforced),
                    compute_capability: gpu.info.cuda_compute_capability,
                    dynamic_mig: build.dynamic_mig
                        && gpu.info.mig.is_some()
                        && gpu.info.cuda_compute_capability.0 >= 9,
                })
            }
            DeviceRef::Mig {
                parent_minor,
                profile_id,
                placement_start,
            } => {
                let Some(gpu) = inventory.gpus.iter().find(|g| g.info.minor == parent_minor) else {
                    continue;
                };
                let Some(mig) = gpu.info.mig.as_ref() else {
                    continue;
                };
                let size = mig
                    .profiles
                    .iter()
                    .find(|p| p.id == profile_id)
                    .and_then(|p| p.placements.iter().find(|pl| pl.start == placement_start))
                    .map(|pl| pl.size)
                    .or_else(|| {
                        mig.devices
                            .iter()
                            .find(|d| {
                                d.profile_id == profile_id && d.placement.start == placement_start
                            })
                            .map(|d| d.placement.size)
                    });
                let Some(placement_size) = size else {
                    continue;
                };
                Target::Mig(MigTarget {
                    request: MigRequest {
                        gpu_index: gpu.info.index,
                        parent_minor,
                        parent_uuid: gpu.info.uuid.clone(),
                        profile_id,
                        placement_start,
                        placement_size,
                    },
                    dynamic: build.dynamic_mig,
                })
            }
            DeviceRef::Vfio { minor, index } => {
                let Some(gpu) = inventory.gpus.iter().find(|g| g.info.minor == minor) else {
                    continue;
                };
                Target::Vfio(plan::VfioTarget {
                    index,
                    minor,
                    uuid: gpu.info.uuid.clone(),
                    pci_bus_id: gpu.info.pci_bus_id.clone(),
                })
            }
        };
        out.insert(device.name.clone(), target);
    }
    out
}

/// Restarts MPS daemons still in use (see `kinds::mps::supervise`) every
/// `period`, until the preparer is dropped.
async fn supervise_mps(inner: std::sync::Weak<Inner>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || kinds::mps::supervise(&inner)).await;
    }
}

/// How often [`keep_state_on_disk`] looks for the checkpoint file.
const STATE_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Writes the checkpoint again whenever its file was removed under the
/// running plugin (`checkpoint::Store::restore_if_removed`), until the
/// preparer is dropped: kubelet's sockets are bound again in the same case
/// (`grpc::rebind`), and a crash must not find the prepared claims gone.
async fn keep_state_on_disk(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(STATE_CHECK_INTERVAL).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let store_of = inner.clone();
        match tokio::task::spawn_blocking(move || store_of.store.restore_if_removed()).await {
            Ok(Ok(true)) => tracing::warn!(
                path = %inner.store.path().display(),
                claims = inner.store.snapshot().claims.len(),
                "the checkpoint file was removed under the plugin; written again"
            ),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::error!(
                error = %e,
                retry_in = ?STATE_CHECK_INTERVAL,
                "the checkpoint file was removed under the plugin and cannot be written again"
            ),
            Err(e) => tracing::error!(error = %e, "the checkpoint check task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ClaimRef, Error, LOCK_FILE, fetch, lock_dir};
    use crate::prepare::claim::ClaimError;

    /// A hung API server fails the claim's read at the limit, with a
    /// message that says so, instead of holding the prepare.
    #[tokio::test]
    async fn a_claim_read_from_a_hung_api_server_gives_up_at_its_limit() {
        let (client, _, server) = crate::test_support::hung_api_server().await;
        let claim = ClaimRef {
            namespace: "ml".into(),
            name: "train".into(),
            uid: "u".into(),
        };
        let read = fetch(&client, &claim, Duration::from_millis(300));
        let error = tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the read gave up on its own")
            .unwrap_err();
        let ClaimError::Failed(message) = error else {
            panic!("{error:?}");
        };
        assert!(
            message.starts_with("cannot read ResourceClaim ml/train from the API server")
                && message.contains("no answer from the API server within 300 ms"),
            "{message}"
        );
        server.abort();
    }

    #[test]
    fn a_directory_another_instance_holds_is_refused_by_name_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let mps = dir.path().join("run").join("mps");
        let held = lock_dir(&mps, "MPS directory", None).unwrap();
        let err = lock_dir(&mps, "MPS directory", None).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err:?}");
        let expected = format!(
            "MPS directory {} is locked by another plugin instance on this node",
            mps.join(LOCK_FILE).display()
        );
        assert!(err.to_string().starts_with(&expected), "{err}");
        drop(held);
        crate::test_support::once_released(
            || lock_dir(&mps, "MPS directory", None),
            |e| matches!(e, Error::Locked { .. }),
        )
        .unwrap();
    }

    #[test]
    fn in_a_rolling_update_a_held_directory_is_waited_for_and_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let held = lock_dir(&state, "state directory", None).unwrap();
        let (phase, mut seen) = crate::phase::channel();
        let waiter = {
            let state = state.clone();
            std::thread::spawn(move || lock_dir(&state, "state directory", Some(&phase)))
        };
        let lock = state.join(LOCK_FILE);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    seen.wait_for(|p| *p == crate::phase::Phase::WaitingFor(lock.clone())),
                )
                .await
                .expect("the wait is reported")
                .unwrap();
            });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "took a lock another process holds");
        drop(held);
        let taken = waiter.join().unwrap().unwrap();
        assert_eq!(*seen.borrow(), crate::phase::Phase::Starting);
        // And it is held now: a third taker is refused.
        let err = lock_dir(&state, "state directory", None).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err:?}");
        drop(taken);
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let mps = file.join("mps");
        let err = lock_dir(&mps, "MPS directory", None).unwrap_err();
        assert!(matches!(err, Error::Dir { .. }), "{err:?}");
        let expected = format!("cannot use MPS directory {}: ", mps.display());
        assert!(err.to_string().starts_with(&expected), "{err}");
        assert!(!mps.exists());
    }
}
