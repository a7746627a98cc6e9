//! The health monitor's runtime: one blocking thread per physical GPU waits
//! on its NVML event set, a poll of every GPU runs every
//! `--health-poll-interval` (and once at start, before kubelet's calls are
//! served), a tick ages conditions; one task owns the [`Tracker`] and, on a
//! change (debounced), sends the device taints to the slice publisher, the
//! device health list to the KEP-4680 stream, saves the checkpoint, updates
//! the metrics and records Node Events for the transitions.
//!
//! Heartbeat: the same task re-sends the whole health list every
//! [`Setup::heartbeat`] (10 s) even when nothing changed, so kubelet never
//! ages a device to Unknown; if the task wedges (an NVML poll that never
//! returns), the re-sends stop and kubelet's 30 s timeout shows Unknown.
//!
//! Passthrough: under `--passthrough` each poll (and each failed event
//! wait or event) first reads which driver holds the GPU; a GPU that a VFIO
//! claim put on `vfio-pci` is not probed and is reported Unknown, not lost
//! ([`super::binding`]).
//!
//! NVLink: a poll whose link states differ from the published inventory
//! reads that GPU again and republishes the inventory (`nvlinkCount` and
//! `nvlinkDomain` follow the active links).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use gpu_nvml::{EventKind, GpuBackend, HealthEvent, HealthPoll, HealthSource};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::binding::Bindings;
use super::classify::Policy;
use super::events::NodeEvents;
use super::metrics::{DeviceView, HealthMetrics, recovery_raw};
use super::store::{self, HealthStore};
use super::taints::{device_health, device_taints};
use super::tracker::{GpuId, MigInstance, Tracker, Transition};
use crate::devices::{BuildOptions, DeviceModel, Taint};
use crate::discovery::Inventory;
use crate::grpc::health::{DeviceHealth, HealthSender, HealthStatus};

/// Device name to its health taints, as the slice publisher reads them.
pub type TaintMap = BTreeMap<String, Vec<Taint>>;

/// How long one event wait blocks before the thread looks at the stop flag.
pub const EVENT_WAIT: Duration = Duration::from_secs(5);
/// How long [`MonitorHandle::stop`] waits for the loop.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// Everything the monitor is built from.
pub struct Setup {
    /// Events and polls.
    pub source: Arc<dyn HealthSource>,
    /// The GPUs (read again when their NVLinks change).
    pub backend: Arc<dyn GpuBackend>,
    /// The inventory being published.
    pub inventory: Inventory,
    /// How the publisher builds the device model.
    pub build: BuildOptions,
    /// Classification and timing of conditions.
    pub policy: Policy,
    /// `--health-poll-interval`.
    pub poll_interval: Duration,
    /// Longest time between two sends of the health list.
    pub heartbeat: Duration,
    /// Wait after a change before publishing, to batch bursts.
    pub debounce: Duration,
    /// How often conditions are aged (expiry, recovery).
    pub tick: Duration,
    /// The checkpoint file; an admin's request to clear hardware failures
    /// is read from [`store::CLEAR_FILE`] beside it at every poll.
    pub store_path: PathBuf,
    /// The node's boot id.
    pub boot_id: String,
    /// The pool (node) name the health list names devices in.
    pub pool: String,
    /// Where each GPU's driver is read (`--passthrough`: the sysfs root):
    /// a GPU another driver holds (a VFIO claim's `vfio-pci`) is not
    /// probed and is Unknown, not lost ([`Bindings`]); `None`: not read.
    pub sysfs_root: Option<PathBuf>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("gpus", &self.inventory.gpus.len())
            .field("poll_interval", &self.poll_interval)
            .field("store_path", &self.store_path)
            .finish_non_exhaustive()
    }
}

impl Setup {
    /// Default timing (10 s heartbeat, 200 ms debounce, a tick at every
    /// poll: recovery needs a poll anyway, and expiry to the poll period is
    /// exact enough) for the given parts.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Arc<dyn HealthSource>,
        backend: Arc<dyn GpuBackend>,
        inventory: Inventory,
        build: BuildOptions,
        policy: Policy,
        poll_interval: Duration,
        store_path: PathBuf,
        boot_id: String,
        pool: String,
    ) -> Self {
        Self {
            source,
            backend,
            inventory,
            build,
            policy,
            poll_interval,
            heartbeat: Duration::from_secs(10),
            debounce: Duration::from_millis(200),
            tick: poll_interval,
            store_path,
            boot_id,
            pool,
            sysfs_root: None,
        }
    }
}

/// Where the monitor's results go.
#[derive(Debug)]
pub struct Outputs {
    /// Device taints, read by the slice publisher.
    pub taints: watch::Sender<TaintMap>,
    /// The device health list of the KEP-4680 stream.
    pub health: HealthSender,
    /// The inventory the publisher publishes (replaced on NVLink changes).
    pub inventory: watch::Sender<Inventory>,
    /// Metrics.
    pub metrics: HealthMetrics,
    /// Node Events at transitions; `None`: none recorded.
    pub events: Option<NodeEvents>,
}

/// Errors starting the monitor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A blocking task of the start panicked.
    #[error("the health monitor's start failed: {0}")]
    Task(String),
}

/// The running monitor.
#[derive(Debug)]
pub struct MonitorHandle {
    stop: Option<oneshot::Sender<()>>,
    threads_stop: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl MonitorHandle {
    /// Stops the loop and tells the event threads to end (each notices
    /// within [`EVENT_WAIT`]; they are not waited for). A loop stuck in an
    /// NVML call that does not return is abandoned after [`STOP_WAIT`], so
    /// a hung GPU cannot hold up the plugin's shutdown.
    pub async fn stop(mut self) {
        self.threads_stop.store(true, Ordering::SeqCst);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(STOP_WAIT, &mut task).await.is_err()
        {
            tracing::warn!(wait = ?STOP_WAIT, "the health monitor did not stop in time (an NVML call hangs); abandoned");
            task.abort();
        }
    }
}

impl Drop for MonitorHandle {
    fn drop(&mut self) {
        self.threads_stop.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What the event threads tell the loop.
#[derive(Debug)]
enum Msg {
    /// An NVML event.
    Event(HealthEvent),
    /// The GPU cannot be watched by events.
    Unmonitored { index: u32, why: String },
    /// Its events are watched again.
    Monitored { index: u32 },
}

/// Reads the node's boot id from `<proc_root>/sys/kernel/random/boot_id`,
/// else from this process's `/proc` (the boot id is the kernel's, the same
/// in every namespace; the chart mounts only `/proc/driver/nvidia` under
/// its proc root); empty (no reboot detection) when neither can be read.
pub fn boot_id(proc_root: &std::path::Path) -> String {
    let mut tried = Vec::new();
    for root in [proc_root, std::path::Path::new("/proc")] {
        let path = root.join("sys/kernel/random/boot_id");
        match std::fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => {
                return text
                    .trim()
                    .chars()
                    .filter(|c| c.is_ascii_hexdigit() || *c == '-')
                    .take(64)
                    .collect();
            }
            Ok(_) => tried.push(format!("{}: empty", path.display())),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    tracing::warn!(tried = %tried.join("; "), "cannot read the boot id: a reboot is not told from a restart");
    String::new()
}

/// Starts the monitor: opens the checkpoint, registers every GPU's event
/// set (waiting for each registration to succeed or fail), runs the first
/// poll and publishes its result, then runs in the background.
pub async fn start(setup: Setup, outputs: Outputs) -> Result<MonitorHandle, Error> {
    let started = std::time::Instant::now();
    let now = SystemTime::now();
    let gpus: Vec<GpuId> = setup
        .inventory
        .gpus
        .iter()
        .map(|g| GpuId {
            index: g.info.index,
            minor: g.info.minor,
            uuid: g.info.uuid.clone(),
        })
        .collect();

    let path = setup.store_path.clone();
    let (store, saved) = match tokio::task::spawn_blocking(move || HealthStore::open(path))
        .await
        .map_err(|e| Error::Task(e.to_string()))?
    {
        Ok((store, saved)) => (Some(store), saved),
        Err(e) => {
            tracing::warn!(path = %setup.store_path.display(), error = %e, "health checkpoint unreadable: starting without saved faults, and not saving any");
            (None, None)
        }
    };
    if saved.is_some() {
        tracing::info!(path = %setup.store_path.display(), "health checkpoint read");
    }
    let mut tracker = Tracker::new(
        setup.policy.clone(),
        gpus.clone(),
        setup.boot_id.clone(),
        saved,
        now,
    );

    let bindings = Bindings::new(setup.sysfs_root.clone(), &setup.inventory);

    // One event thread per GPU; wait for every registration.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let threads_stop = Arc::new(AtomicBool::new(false));
    let (registered_tx, registered_rx) = std::sync::mpsc::channel::<u32>();
    for gpu in &gpus {
        spawn_watch(
            setup.source.clone(),
            gpu.index,
            tx.clone(),
            threads_stop.clone(),
            registered_tx.clone(),
            setup.poll_interval,
        );
    }
    drop(registered_tx);
    let expected = gpus.len();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = 0;
        while seen < expected {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if registered_rx.recv_timeout(left).is_err() {
                tracing::warn!(
                    registered = seen,
                    gpus = expected,
                    "not every GPU's event registration finished in 10 s"
                );
                break;
            }
            seen += 1;
        }
    })
    .await
    .map_err(|e| Error::Task(e.to_string()))?;
    while let Ok(msg) = rx.try_recv() {
        apply(
            &mut tracker,
            &outputs.metrics,
            &gpus,
            &bindings,
            msg,
            SystemTime::now(),
        );
    }

    let mut state = State {
        setup,
        outputs,
        tracker,
        gpus,
        bindings,
        store,
        model: None,
        sent_taints: None,
    };
    state.rebuild_model();
    state.poll().await;
    // Published now whatever changed; the loop publishes the next change.
    let _ = state.tracker.changed();
    state.publish(SystemTime::now());
    tracing::info!(
        elapsed_us = crate::micros(started),
        gpus = state.gpus.len(),
        "health monitor started: first poll done"
    );

    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(state.run(rx, stopped));
    Ok(MonitorHandle {
        stop: Some(stop),
        threads_stop,
        task: Some(task),
    })
}

/// Starts the event thread of GPU `index`.
fn spawn_watch(
    source: Arc<dyn HealthSource>,
    index: u32,
    tx: mpsc::UnboundedSender<Msg>,
    stop: Arc<AtomicBool>,
    registered: std::sync::mpsc::Sender<u32>,
    retry: Duration,
) {
    let spawned = std::thread::Builder::new()
        .name(format!("gpu-health-{index}"))
        .spawn({
            let tx = tx.clone();
            move || watch_gpu(source.as_ref(), index, &tx, &stop, registered, retry)
        });
    if let Err(e) = spawned {
        let _ = tx.send(Msg::Unmonitored {
            index,
            why: format!("cannot start the event thread: {e}"),
        });
    }
}

/// The body of one GPU's event thread: registers, waits for events, and
/// after a failure (registration refused, a broken wait) reports the GPU
/// unmonitored and registers again every `retry`, reporting it monitored
/// once that works.
fn watch_gpu(
    source: &dyn HealthSource,
    index: u32,
    tx: &mpsc::UnboundedSender<Msg>,
    stop: &AtomicBool,
    registered: std::sync::mpsc::Sender<u32>,
    retry: Duration,
) {
    let mut registered = Some(registered);
    let mut unmonitored = false;
    while !stop.load(Ordering::SeqCst) {
        match source.watch(index) {
            Ok(mut watch) => {
                tracing::debug!(gpu = index, "NVML events registered");
                if let Some(r) = registered.take() {
                    let _ = r.send(index);
                }
                if unmonitored {
                    tracing::info!(gpu = index, "NVML events registered again: GPU monitored");
                    if tx.send(Msg::Monitored { index }).is_err() {
                        return;
                    }
                }
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match watch.wait(EVENT_WAIT) {
                        Ok(Some(event)) => {
                            if tx.send(Msg::Event(event)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            if stop.load(Ordering::SeqCst) {
                                return;
                            }
                            tracing::warn!(gpu = index, error = %e, "NVML event wait failed: GPU unmonitored (still polled)");
                            unmonitored = true;
                            let why = format!("event wait failed: {e}");
                            if tx.send(Msg::Unmonitored { index, why }).is_err() {
                                return;
                            }
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                if !unmonitored {
                    tracing::warn!(gpu = index, error = %e, "cannot register NVML events: GPU unmonitored (still polled)");
                    unmonitored = true;
                }
                // Every failed retry is reported: the GPU may have come back
                // from another driver since the last one (the tracker does
                // not raise `unmonitored` while another driver holds it).
                let why = format!("event registration failed: {e}");
                if tx.send(Msg::Unmonitored { index, why }).is_err() {
                    return;
                }
                if let Some(r) = registered.take() {
                    let _ = r.send(index);
                }
            }
        }
        // Register again after `retry`, looking at the stop flag meanwhile.
        let until = std::time::Instant::now() + retry;
        while std::time::Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100).min(retry));
        }
    }
}

/// Feeds one thread message to the tracker. What NVML says of a GPU
/// another driver holds (its events, a failed wait) is not believed: the
/// GPU is marked not probed instead.
fn apply(
    tracker: &mut Tracker,
    metrics: &HealthMetrics,
    gpus: &[GpuId],
    bindings: &Bindings,
    msg: Msg,
    now: SystemTime,
) {
    match msg {
        Msg::Event(event) => {
            let uuid = uuid_of(gpus, event.gpu_index);
            if let Some(driver) = bindings.elsewhere(event.gpu_index) {
                tracing::info!(gpu = event.gpu_index, uuid, driver, kind = ?event.kind, "NVML event of a GPU another driver holds: ignored");
                tracker.bound_elsewhere(event.gpu_index, Some(&driver));
                return;
            }
            tracing::info!(
                gpu = event.gpu_index,
                uuid,
                kind = ?event.kind,
                gi = ?event.gpu_instance_id,
                ci = ?event.compute_instance_id,
                "NVML health event"
            );
            if let EventKind::Xid(xid) = event.kind {
                metrics.xid(uuid, xid);
            }
            tracker.event(&event, now);
        }
        Msg::Unmonitored { index, why } => {
            if let Some(driver) = bindings.elsewhere(index) {
                tracker.bound_elsewhere(index, Some(&driver));
            } else {
                tracker.bound_elsewhere(index, None);
                tracker.unmonitored(index, &why, now);
            }
        }
        Msg::Monitored { index } => tracker.monitored(index),
    }
}

/// What one GPU's poll found.
enum Probe<P, I> {
    /// Another driver holds the GPU: not probed.
    Elsewhere(String),
    /// NVML's poll and the GPU's MIG instances (when it has MIG on).
    Polled(P, I),
}

/// The UUID of GPU `index` (empty for a GPU not watched).
fn uuid_of(gpus: &[GpuId], index: u32) -> &str {
    gpus.iter()
        .find(|g| g.index == index)
        .map(|g| g.uuid.as_str())
        .unwrap_or_default()
}

/// The monitor's loop state.
struct State {
    setup: Setup,
    outputs: Outputs,
    tracker: Tracker,
    gpus: Vec<GpuId>,
    bindings: Bindings,
    store: Option<HealthStore>,
    model: Option<DeviceModel>,
    /// The taints last sent (none sent yet: `None`).
    sent_taints: Option<TaintMap>,
}

impl State {
    /// The loop: events, polls, ticks, debounced publications and the
    /// heartbeat, until `stopped`.
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        mut stopped: oneshot::Receiver<()>,
    ) {
        let period = |d: Duration| {
            let mut i = tokio::time::interval_at(Instant::now() + d, d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        let mut polls = period(self.setup.poll_interval);
        let mut ticks = period(self.setup.tick);
        let mut heartbeat = period(self.setup.heartbeat);
        let mut due: Option<Instant> = None;
        let mut events_open = true;
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                msg = rx.recv(), if events_open => match msg {
                    Some(msg) => {
                        apply(&mut self.tracker, &self.outputs.metrics, &self.gpus, &self.bindings, msg, SystemTime::now());
                        due.get_or_insert(Instant::now() + self.setup.debounce);
                    }
                    None => events_open = false,
                },
                _ = polls.tick() => {
                    self.poll().await;
                    due.get_or_insert(Instant::now() + self.setup.debounce);
                }
                _ = ticks.tick() => {
                    self.tracker.tick(SystemTime::now());
                    due.get_or_insert(Instant::now() + self.setup.debounce);
                }
                () = sleep_until(due), if due.is_some() => {
                    due = None;
                    if self.tracker.changed() {
                        self.publish(SystemTime::now());
                        heartbeat.reset();
                    }
                }
                _ = heartbeat.tick() => {
                    self.send_health(SystemTime::now());
                }
            }
        }
        tracing::info!("health monitor stopped");
    }

    /// Builds the device model of the current inventory.
    fn rebuild_model(&mut self) {
        let inventory = self.outputs.inventory.borrow().clone();
        self.model = Some(DeviceModel::build(&inventory, &self.setup.build));
    }

    /// Polls every GPU once (on a blocking thread) and feeds the tracker;
    /// republishes the inventory when NVLinks changed.
    async fn poll(&mut self) {
        let source = self.setup.source.clone();
        let backend = self.setup.backend.clone();
        let indices: Vec<u32> = self.gpus.iter().map(|g| g.index).collect();
        let mig: Vec<u32> = self
            .outputs
            .inventory
            .borrow()
            .gpus
            .iter()
            .filter(|g| g.info.mig.as_ref().is_some_and(|m| m.current_enabled))
            .map(|g| g.info.index)
            .collect();
        let clear_path = self.setup.store_path.with_file_name(store::CLEAR_FILE);
        let bindings = self.bindings.clone();
        let polled = tokio::task::spawn_blocking(move || {
            let clear = store::take_clear_request(&clear_path);
            let polled = indices
                .into_iter()
                .map(|i| {
                    if let Some(driver) = bindings.elsewhere(i) {
                        return (i, Probe::Elsewhere(driver));
                    }
                    // The live MIG devices, so events with a GPU instance id
                    // land on the device (dynamic MIG creates them at prepare).
                    let instances = mig.contains(&i).then(|| backend.gpu_instances(i));
                    let poll = source.poll(i);
                    // Read again: NVML's answers about a GPU rebound during
                    // the poll say nothing of its health.
                    match bindings.elsewhere(i) {
                        Some(driver) => (i, Probe::Elsewhere(driver)),
                        None => (i, Probe::Polled(poll, instances)),
                    }
                })
                .collect::<Vec<_>>();
            (clear, polled)
        })
        .await;
        let Ok((clear, polled)) = polled else {
            tracing::warn!("the health poll task failed");
            return;
        };
        let now = SystemTime::now();
        match clear {
            Ok(Some(request)) => {
                let cleared = self.tracker.clear_hardware_failures(&request);
                tracing::info!(request = ?request, cleared = ?cleared, "an admin's request to clear hardware failures taken");
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the request to clear hardware failures was not used (and is removed)");
            }
        }
        let mut reached = false;
        let mut links_changed = Vec::new();
        for (index, probe) in polled {
            let (result, instances) = match probe {
                Probe::Elsewhere(driver) => {
                    // Done what could be done: a node whose only GPU runs a
                    // VM must not look like a monitor that stopped.
                    reached = true;
                    self.tracker.bound_elsewhere(index, Some(&driver));
                    continue;
                }
                Probe::Polled(result, instances) => {
                    self.tracker.bound_elsewhere(index, None);
                    (result, instances)
                }
            };
            let uuid = uuid_of(&self.gpus, index).to_owned();
            match instances {
                Some(Ok(instances)) => {
                    let instances: Vec<MigInstance> = instances
                        .iter()
                        .map(|gi| MigInstance {
                            gpu_instance_id: gi.id,
                            profile_id: gi.profile_id,
                            placement_start: gi.placement.start,
                        })
                        .collect();
                    self.tracker.set_mig_instances(index, &instances);
                }
                Some(Err(e)) => {
                    tracing::debug!(gpu = index, error = %e, "cannot list MIG instances");
                }
                None => {}
            }
            match result {
                Ok(poll) => {
                    reached = true;
                    self.outputs
                        .metrics
                        .recovery_action(&uuid, poll.recovery_action.map(recovery_raw));
                    if self.links_differ(index, &poll) {
                        links_changed.push(index);
                    }
                    self.tracker.poll(index, &poll, now);
                }
                Err(e) => {
                    tracing::warn!(gpu = index, uuid, error = %e, "health poll failed");
                }
            }
        }
        if reached {
            self.outputs.metrics.success(now);
        }
        if !links_changed.is_empty() {
            self.refresh_gpus(links_changed).await;
        }
    }

    /// Whether the poll's active links differ from the published ones.
    fn links_differ(&self, index: u32, poll: &HealthPoll) -> bool {
        if poll.nvlinks.is_empty() {
            return false;
        }
        let inventory = self.outputs.inventory.borrow();
        let Some(gpu) = inventory.gpus.iter().find(|g| g.info.index == index) else {
            return false;
        };
        let mut published: Vec<u32> = gpu.info.nvlinks.iter().map(|l| l.link).collect();
        let mut active: Vec<u32> = poll
            .nvlinks
            .iter()
            .filter(|l| l.active)
            .map(|l| l.link)
            .collect();
        published.sort_unstable();
        active.sort_unstable();
        published != active
    }

    /// Reads GPUs `indices` again and republishes the inventory.
    async fn refresh_gpus(&mut self, indices: Vec<u32>) {
        let backend = self.setup.backend.clone();
        let read = tokio::task::spawn_blocking(move || {
            indices
                .into_iter()
                .map(|i| (i, backend.gpu(i)))
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(read) = read else {
            return;
        };
        let mut changed = false;
        self.outputs.inventory.send_if_modified(|inventory| {
            for (index, info) in read {
                match info {
                    Ok(info) => {
                        if let Some(gpu) = inventory.gpus.iter_mut().find(|g| g.info.index == index)
                            && gpu.info.nvlinks != info.nvlinks
                        {
                            tracing::info!(gpu = index, links = info.nvlinks.len(), "NVLinks changed: republishing the inventory");
                            gpu.info.nvlinks = info.nvlinks;
                            changed = true;
                        }
                    }
                    Err(e) => tracing::warn!(gpu = index, error = %e, "cannot read the GPU again after an NVLink change"),
                }
            }
            changed
        });
        if changed {
            self.rebuild_model();
        }
    }

    /// Sends the taints (when they changed), the health list, the
    /// checkpoint, the metrics and the transitions' Events.
    fn publish(&mut self, now: SystemTime) {
        let Some(model) = self.model.as_ref() else {
            return;
        };
        let taints = device_taints(&self.tracker, model);
        if self.sent_taints.as_ref() != Some(&taints) {
            tracing::info!(
                tainted = taints.values().filter(|t| !t.is_empty()).count(),
                "device health taints changed"
            );
            self.outputs.taints.send_replace(taints.clone());
            self.sent_taints = Some(taints);
        }
        let health = self.send_health(now);
        self.update_metrics(&health);
        if let Some(store) = &self.store
            && let Err(e) = store.save(&self.tracker.saved())
        {
            tracing::warn!(error = %e, "cannot save the health checkpoint");
        }
        for transition in self.tracker.take_transitions() {
            let note = describe(&transition);
            tracing::info!(
                uuid = %transition.uuid,
                minor = transition.minor,
                from = transition.from.name(),
                to = transition.to.name(),
                reason = transition.reason,
                "GPU health transition: {note}"
            );
            if let Some(events) = &self.outputs.events {
                events.record(transition.reason, &note);
            }
        }
    }

    /// Sends the whole health list (also the heartbeat).
    fn send_health(&self, now: SystemTime) -> Vec<DeviceHealth> {
        let Some(model) = self.model.as_ref() else {
            return Vec::new();
        };
        let health = device_health(&self.tracker, model, &self.setup.pool, now);
        self.outputs.health.send_replace(health.clone());
        health
    }

    fn update_metrics(&self, health: &[DeviceHealth]) {
        let Some(model) = self.model.as_ref() else {
            return;
        };
        let status: BTreeMap<&str, HealthStatus> = health
            .iter()
            .map(|h| (h.device_name.as_str(), h.status))
            .collect();
        let mut views = Vec::new();
        for group in &model.groups {
            for device in &group.devices {
                let state = status
                    .get(device.name.as_str())
                    .copied()
                    .unwrap_or(HealthStatus::Unknown);
                views.push(DeviceView {
                    device: device.name.clone(),
                    uuid: group.uuid.clone(),
                    state: format!("{state:?}"),
                    taints: self
                        .sent_taints
                        .as_ref()
                        .and_then(|taints| taints.get(&device.name))
                        .into_iter()
                        .flatten()
                        .map(|t| (t.key.clone(), t.effect.as_str().to_owned()))
                        .collect(),
                });
            }
        }
        self.outputs.metrics.set_devices(&views);
    }
}

/// The note of a transition's Node Event: which GPU (or MIG device), the
/// change, and what is active now.
fn describe(t: &Transition) -> String {
    format!(
        "GPU {} ({}) {:?}: {} -> {}: {}",
        t.minor,
        t.uuid,
        t.scope,
        t.from.name(),
        t.to.name(),
        t.message
    )
}

/// Sleeps until `at` (forever without one; the select arm is off then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};

    use gpu_nvml::{
        ComputeMode, EventWatch, GpuInfo, Liveness, MigDevice, MigPlacement, SystemInfo,
    };

    use super::*;
    use crate::devices::fixtures;

    /// A health source whose polls block while `wedged` is set, as a hung
    /// NVML call would.
    #[derive(Default)]
    struct Wedgeable {
        wedged: Mutex<bool>,
        released: Condvar,
    }

    impl Wedgeable {
        fn set(&self, wedged: bool) {
            *self.wedged.lock().unwrap() = wedged;
            self.released.notify_all();
        }
    }

    /// An event set that never delivers.
    struct Quiet;

    impl EventWatch for Quiet {
        fn wait(&mut self, timeout: Duration) -> gpu_nvml::Result<Option<HealthEvent>> {
            std::thread::sleep(timeout.min(Duration::from_millis(20)));
            Ok(None)
        }
    }

    impl HealthSource for Wedgeable {
        fn watch(&self, _: u32) -> gpu_nvml::Result<Box<dyn EventWatch>> {
            Ok(Box::new(Quiet))
        }

        fn poll(&self, _: u32) -> gpu_nvml::Result<HealthPoll> {
            let mut wedged = self.wedged.lock().unwrap();
            while *wedged {
                wedged = self.released.wait(wedged).unwrap();
            }
            Ok(HealthPoll::liveness_only(Liveness::Alive))
        }
    }

    /// A backend the monitor never needs here (no NVLinks, no MIG).
    struct Unused;

    impl GpuBackend for Unused {
        fn system(&self) -> gpu_nvml::Result<SystemInfo> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn gpu_count(&self) -> gpu_nvml::Result<u32> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn gpu(&self, _: u32) -> gpu_nvml::Result<GpuInfo> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn set_mig_mode(&self, _: u32, _: bool) -> gpu_nvml::Result<()> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn create_mig_device(
            &self,
            _: u32,
            _: u32,
            _: MigPlacement,
        ) -> gpu_nvml::Result<MigDevice> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn destroy_mig_device(&self, _: u32, _: u32, _: u32) -> gpu_nvml::Result<()> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
        fn set_compute_mode(&self, _: u32, _: ComputeMode) -> gpu_nvml::Result<()> {
            Err(gpu_nvml::Error::Invalid("unused".into()))
        }
    }

    /// Counts the health list sends seen within `window`.
    async fn sends_within(rx: &mut watch::Receiver<Vec<DeviceHealth>>, window: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + window;
        let mut n = 0;
        while let Ok(Ok(())) = tokio::time::timeout_at(deadline, rx.changed()).await {
            rx.borrow_and_update();
            n += 1;
        }
        n
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_heartbeat_stops_while_the_loop_is_wedged_and_resumes_after() {
        let dir = tempfile::tempdir().unwrap();
        let source = Arc::new(Wedgeable::default());
        let inventory = fixtures::inventory(vec![fixtures::gpu(0, fixtures::HOPPER, None, &[])]);
        let mut setup = Setup::new(
            source.clone(),
            Arc::new(Unused),
            inventory.clone(),
            BuildOptions::default(),
            Policy::default(),
            Duration::from_millis(100),
            dir.path().join("health.json"),
            "boot-1".into(),
            "node-a".into(),
        );
        setup.heartbeat = Duration::from_millis(100);
        setup.debounce = Duration::from_millis(10);
        let (health, mut rx) = crate::grpc::health::channel();
        let outputs = Outputs {
            taints: watch::channel(TaintMap::new()).0,
            health,
            inventory: watch::channel(inventory).0,
            metrics: HealthMetrics::default(),
            events: None,
        };
        let handle = start(setup, outputs).await.unwrap();
        let first = rx.borrow_and_update().clone();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].status, HealthStatus::Healthy);
        // Nothing changes: the list is sent again about every 100 ms.
        let beats = sends_within(&mut rx, Duration::from_millis(600)).await;
        assert!(beats >= 3, "{beats} sends in 600 ms");

        // NVML hangs in a poll: the loop waits in it, and the re-sends stop,
        // so kubelet's own timeout shows the devices as Unknown.
        source.set(true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        rx.borrow_and_update();
        assert_eq!(sends_within(&mut rx, Duration::from_millis(600)).await, 0);

        // NVML answers again: so does the heartbeat.
        source.set(false);
        assert!(sends_within(&mut rx, Duration::from_millis(600)).await >= 1);

        // Stopping while wedged does not hang.
        source.set(true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        handle.stop().await;
        assert!(started.elapsed() < STOP_WAIT + Duration::from_secs(1));
        source.set(false);
    }

    #[test]
    fn the_boot_id_comes_from_the_proc_root_else_from_this_proc() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sys/kernel/random/boot_id");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "3f0c1e2a-1111-4222-8333-944455556666\n").unwrap();
        assert_eq!(boot_id(dir.path()), "3f0c1e2a-1111-4222-8333-944455556666");
        // Hostile content is reduced to what a boot id holds.
        std::fs::write(&file, format!("ab\u{1b}[31m-cd{}\n", "e".repeat(500))).unwrap();
        let id = boot_id(dir.path());
        assert!(
            id.len() <= 64 && id.starts_with("ab") && !id.contains('\u{1b}'),
            "{id}"
        );
        // Missing under the proc root: this process's /proc (the kernel's).
        let own = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        assert_eq!(boot_id(&dir.path().join("nowhere")), own);
    }
}
