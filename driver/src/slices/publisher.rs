//! The ResourceSlice publisher: keeps the node's pool on the API server equal
//! to the device model of the latest inventory.
//!
//! It watches its own slices (field selector `spec.nodeName=<node>,
//! spec.driver=<driver>`) and reconciles after every change it sees (debounced
//! by a few milliseconds), after every new inventory or taint set, and every
//! few minutes as a safety net. A reconcile reads the Node (its UID is the
//! slices' owner) and lists the pool's slices at once, builds the desired
//! ones from the latest inventory unless they are unchanged and still held
//! by the server, and writes only what differs
//! ([`super::pool::plan`]), with server-side apply: wave by wave, the writes
//! of a wave concurrently (at most `CONCURRENT_WRITES`), so counter-set
//! slices exist before the device slices that consume them and deletions
//! come last. The desired slices are dropped when the reconcile ends; only
//! digests of them stay ([`PoolState`]). API answers are decoded only as far
//! as they are read (`super::wire`). API errors are retried with capped
//! exponential backoff and logged once per distinct error. On shutdown it
//! stops at once, or first deletes its slices when `--delete-slices-on-exit`
//! is set.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::devices::{BuildOptions, DeviceModel, Note, Taint};
use crate::discovery::Inventory;

use super::pool::{self, PoolOwner, PoolState};
use super::split::split;
use super::wire::{self, SliceMeta};
use super::{Backoff, ErrorLog, Flags, SliceRules};

/// Field manager of the publisher's server-side applies.
pub const FIELD_MANAGER: &str = "gpu-kubelet-plugin";

/// Errors of one reconcile (all are retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The Node object has no UID to own the slices.
    #[error("Node {0:?} has no metadata.uid")]
    NodeWithoutUid(String),
    /// Deleting the slices on exit did not finish in time.
    #[error("deleting ResourceSlices on exit timed out after {0:?}")]
    ExitTimeout(Duration),
    /// One reconcile got no (final) answer in time: a hung API server, or
    /// one throttling every write (the kube client retries a 429 on its
    /// own, for minutes, without a word).
    #[error("publishing ResourceSlices got no answer from the API server within {0:?}")]
    ReconcileTimeout(Duration),
}

impl PublishError {
    fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Api { action, source }
    }
}

/// Timing of the publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublisherOptions {
    /// First retry delay after an API error.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Wait after a watch event before reconciling, to batch events.
    pub debounce: Duration,
    /// Reconcile at least this often, watch or not.
    pub resync: Duration,
    /// Longest time spent deleting slices on exit.
    pub exit_timeout: Duration,
    /// Longest time one reconcile may take before it counts as failed
    /// (logged, retried with backoff).
    pub reconcile_timeout: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self {
            backoff_initial: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
            debounce: Duration::from_millis(20),
            resync: Duration::from_secs(300),
            exit_timeout: Duration::from_secs(5),
            reconcile_timeout: Duration::from_secs(30),
        }
    }
}

/// What the publisher has achieved so far (for readiness, metrics, tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStatus {
    /// Generation of the published pool, once published.
    pub generation: Option<i64>,
    /// Slices in the pool.
    pub slices: usize,
    /// Devices in the pool.
    pub devices: usize,
    /// Whether the last reconcile succeeded (the API server holds the pool).
    pub in_sync: bool,
    /// Writes (applies and deletes) so far.
    pub writes: u64,
    /// Successful reconciles so far.
    pub reconciles: u64,
    /// Failed reconciles so far (each retried with backoff).
    pub failures: u64,
    /// The rules in use, once known.
    pub rules: Option<SliceRules>,
    /// The last error, while failing.
    pub last_error: Option<String>,
}

/// Publishes the node's ResourceSlices. Build it with [`Publisher::new`],
/// then `run` it until shutdown.
pub struct Publisher {
    client: kube::Client,
    node: String,
    driver: String,
    flags: Flags,
    options: PublisherOptions,
    status: watch::Sender<PublishStatus>,
    taints: Option<watch::Receiver<BTreeMap<String, Vec<Taint>>>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher of `driver`'s pool on `node`.
    pub fn new(
        client: kube::Client,
        node: impl Into<String>,
        driver: impl Into<String>,
        flags: Flags,
    ) -> Self {
        Self {
            client,
            node: node.into(),
            driver: driver.into(),
            flags,
            options: PublisherOptions::default(),
            status: watch::Sender::new(PublishStatus::default()),
            taints: None,
        }
    }

    /// Replaces the timing options.
    pub fn with_options(mut self, options: PublisherOptions) -> Self {
        self.options = options;
        self
    }

    /// Publishes device taints from `taints` (device name to taints).
    pub fn with_taints(mut self, taints: watch::Receiver<BTreeMap<String, Vec<Taint>>>) -> Self {
        self.taints = Some(taints);
        self
    }

    /// A receiver of the publisher's status.
    pub fn status(&self) -> watch::Receiver<PublishStatus> {
        self.status.subscribe()
    }

    /// Runs until `shutdown` completes. Publishes the pool of the latest
    /// `inventory` (a closed channel keeps the last one), repairs it when it
    /// changes behind its back, and on shutdown deletes it if configured.
    /// Errors are retried, never returned, except from the deletion on exit.
    pub async fn run(
        self,
        inventory: watch::Receiver<Inventory>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), PublishError> {
        let selector = pool::field_selector(&self.node, &self.driver);
        let events = Arc::new(Notify::new());
        let watch_task = AbortOnDrop(tokio::spawn(watch_slices(
            self.client.clone(),
            selector.clone(),
            events.clone(),
        )));

        let mut reconciler = Reconciler {
            client: self.client.clone(),
            node: self.node.clone(),
            driver: self.driver.clone(),
            selector: selector.clone(),
            flags: self.flags.clone(),
            rules: self.flags.slice_rules.fixed(),
            state: PoolState::default(),
            published: None,
            inputs_version: 0,
            logged_notes: Vec::new(),
            status: self.status.clone(),
        };
        self.status.send_modify(|s| s.rules = reconciler.rules);

        let mut inventory = inventory;
        let mut inventory_open = true;
        let mut taints = self.taints;
        let mut shutdown = pin!(shutdown);
        let mut backoff = Backoff::new(self.options.backoff_initial, self.options.backoff_max);
        let mut errors = ErrorLog::default();
        let mut failing = false;
        let mut next: Option<Instant> = Some(Instant::now());
        let mut resync =
            tokio::time::interval_at(Instant::now() + self.options.resync, self.options.resync);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let schedule = |next: &mut Option<Instant>, at: Instant| {
            *next = Some(next.map_or(at, |n| n.min(at)));
        };

        loop {
            let due = next;
            tokio::select! {
                () = &mut shutdown => break,
                changed = inventory.changed(), if inventory_open => {
                    if changed.is_ok() {
                        reconciler.inputs_version += 1;
                        if !failing {
                            schedule(&mut next, Instant::now());
                        }
                    } else {
                        inventory_open = false;
                    }
                }
                changed = wait_taints(&mut taints) => {
                    if changed {
                        reconciler.inputs_version += 1;
                        if !failing {
                            schedule(&mut next, Instant::now());
                        }
                    } else {
                        taints = None;
                    }
                }
                () = events.notified() => {
                    if !failing {
                        schedule(&mut next, Instant::now() + self.options.debounce);
                    }
                }
                _ = resync.tick() => {
                    if !failing {
                        schedule(&mut next, Instant::now());
                    }
                }
                () = sleep_until(due), if due.is_some() => {
                    next = None;
                    let limit = self.options.reconcile_timeout;
                    let result = tokio::select! {
                        r = tokio::time::timeout(limit, reconciler.reconcile(&inventory, taints.as_ref())) => {
                            r.unwrap_or(Err(PublishError::ReconcileTimeout(limit)))
                        }
                        () = &mut shutdown => break,
                    };
                    match result {
                        Ok(()) => {
                            failing = false;
                            backoff.reset();
                            errors.success("publish ResourceSlices");
                            self.status.send_modify(|s| s.last_error = None);
                        }
                        Err(e) => {
                            failing = true;
                            let delay = backoff.next_delay();
                            let message = error_message(&e);
                            errors.failure("publish ResourceSlices", &message, delay);
                            self.status.send_modify(|s| {
                                s.failures += 1;
                                s.in_sync = false;
                                s.last_error = Some(message.clone());
                            });
                            next = Some(Instant::now() + delay);
                        }
                    }
                }
            }
        }
        drop(watch_task);

        if self.flags.delete_slices_on_exit {
            let timeout = self.options.exit_timeout;
            match tokio::time::timeout(timeout, delete_all(&self.client, &selector)).await {
                Ok(Ok(n)) => {
                    tracing::info!(slices = n, node = %self.node, "deleted ResourceSlices on exit");
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "deleting ResourceSlices on exit failed");
                    return Err(e);
                }
                Err(_) => {
                    tracing::error!(timeout = ?timeout, "deleting ResourceSlices on exit timed out");
                    return Err(PublishError::ExitTimeout(timeout));
                }
            }
        }
        Ok(())
    }
}

/// Sleeps until `at` (or forever without one; the select arm is disabled then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for a new taint set; `false` when the channel closed. Never returns
/// without a channel.
async fn wait_taints(taints: &mut Option<watch::Receiver<BTreeMap<String, Vec<Taint>>>>) -> bool {
    match taints {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// The text an error is logged and deduplicated by.
fn error_message(e: &PublishError) -> String {
    match e {
        PublishError::Api {
            action,
            source: kube::Error::Api(status),
        } => format!(
            "{action}: {} {} ({})",
            status.code, status.reason, status.message
        ),
        other => other.to_string(),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches the pool's slices (names and `resourceVersion`s only) and pokes
/// `events` on every change.
async fn watch_slices(client: kube::Client, selector: String, events: Arc<Notify>) {
    let api: Api<SliceMeta> = Api::all(client);
    let config = watcher::Config::default().fields(&selector);
    let mut stream = pin!(watcher(api, config).default_backoff());
    let mut errors = ErrorLog::default();
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                errors.success("watch ResourceSlices");
                events.notify_one();
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(e) => {
                errors.failure("watch ResourceSlices", &e.to_string(), Duration::ZERO);
            }
        }
    }
}

/// Deletes every slice matching `selector`; returns how many.
async fn delete_all(client: &kube::Client, selector: &str) -> Result<usize, PublishError> {
    let slices = wire::list_slices(client, selector)
        .await
        .map_err(PublishError::api("list ResourceSlices"))?;
    let mut deleted = 0;
    for slice in slices {
        let name = slice.name;
        match wire::delete_slice(client, &name).await {
            Ok(()) => deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(PublishError::api(format!("delete ResourceSlice {name}"))(e)),
        }
    }
    Ok(deleted)
}

/// Writes of one wave in flight at once. A dynamic-MIG pool of 8 GPUs has
/// one counter-set slice and four device slices, so its device slices go in
/// one round trip; the bound keeps request bodies (about 100 kB each) and the
/// API server's load in check for larger pools.
const CONCURRENT_WRITES: usize = 4;

/// The state of the reconcile loop.
struct Reconciler {
    client: kube::Client,
    node: String,
    driver: String,
    selector: String,
    flags: Flags,
    rules: Option<SliceRules>,
    state: PoolState,
    /// Summaries of the pool last published, and what it was built from.
    published: Option<Published>,
    /// Bumped on every new inventory or taint set.
    inputs_version: u64,
    logged_notes: Vec<Note>,
    status: watch::Sender<PublishStatus>,
}

/// The desired pool of one reconcile; dropped when the reconcile ends.
struct Desired {
    slices: Vec<ResourceSlice>,
    devices: usize,
}

/// The pool last published, as summaries (a few hundred bytes): enough to
/// tell that the API server still holds it without building it again.
struct Published {
    inputs_version: u64,
    node_uid: String,
    rules: SliceRules,
    wanted: Vec<pool::Wanted>,
    devices: usize,
}

/// The slice rules: fixed by flag, or from the API server's version.
async fn server_rules(
    client: &kube::Client,
    fixed: Option<SliceRules>,
) -> Result<SliceRules, PublishError> {
    if let Some(rules) = fixed {
        return Ok(rules);
    }
    let rules = match client.apiserver_version().await {
        Ok(info) => SliceRules::for_server_version(&info.major, &info.minor).unwrap_or_else(|| {
            tracing::warn!(major = %info.major, minor = %info.minor, "unreadable API server version: using 1.35 slice rules");
            SliceRules::V1_35
        }),
        // The server answered, but without a version: use the default.
        Err(kube::Error::Api(status)) => {
            tracing::warn!(code = status.code, message = %status.message, "API server version unknown: using 1.35 slice rules");
            SliceRules::V1_35
        }
        Err(e) => return Err(PublishError::api("read API server version")(e)),
    };
    tracing::info!(rules = %rules, "ResourceSlice rules chosen");
    Ok(rules)
}

impl Reconciler {
    async fn reconcile(
        &mut self,
        inventory: &watch::Receiver<Inventory>,
        taints: Option<&watch::Receiver<BTreeMap<String, Vec<Taint>>>>,
    ) -> Result<(), PublishError> {
        // The rules (once), the Node's UID and the pool's slices, in one
        // round trip; an error is reported in that order.
        let node_uid = async {
            wire::node_uid(&self.client, &self.node)
                .await
                .map_err(PublishError::api(format!("get Node {}", self.node)))?
                .filter(|u| !u.is_empty())
                .ok_or_else(|| PublishError::NodeWithoutUid(self.node.clone()))
        };
        let (rules, node_uid, observed) = tokio::join!(
            server_rules(&self.client, self.rules),
            node_uid,
            self.list()
        );
        let (rules, node_uid, observed) = (rules?, node_uid?, observed?);
        if self.rules.is_none() {
            self.rules = Some(rules);
            self.status.send_modify(|s| s.rules = Some(rules));
        }

        // Inputs unchanged since the last publication: if the server still
        // holds that pool, there is nothing to build or write.
        let current = self.published.as_ref().filter(|p| {
            p.inputs_version == self.inputs_version && p.node_uid == node_uid && p.rules == rules
        });
        if let Some(published) = current {
            let mut trial = self.state.clone();
            let plan = pool::plan_wanted(&published.wanted, &observed, &mut trial);
            if plan.is_empty() {
                self.state = trial;
                let (slices, devices) = (published.wanted.len(), published.devices);
                self.mark_in_sync(plan.generation, slices, devices);
                return Ok(());
            }
        }

        // Build the desired pool.
        let inputs_version = self.inputs_version;
        let (mut desired, notes) = {
            let taints = taints.map(|t| t.borrow().clone()).unwrap_or_default();
            let inventory = inventory.borrow();
            build(
                &inventory,
                &taints,
                &self.flags,
                rules,
                &PoolOwner {
                    node: self.node.clone(),
                    driver: self.driver.clone(),
                    node_uid: node_uid.clone(),
                },
            )
        };
        self.log_notes(notes);
        let wanted: Vec<pool::Wanted> = desired.slices.iter().map(pool::Wanted::of).collect();
        let plan = pool::plan_wanted(&wanted, &observed, &mut self.state);
        for slice in &mut desired.slices {
            slice.spec.pool.generation = plan.generation;
        }

        let (slices, devices) = (desired.slices.len(), desired.devices);
        if !plan.is_empty() {
            tracing::info!(
                generation = plan.generation,
                writes = plan.len(),
                slices,
                devices,
                "publishing ResourceSlices"
            );
        }
        // Forget the last publication until this one is written.
        self.published = None;
        for wave in &plan.waves {
            self.write_wave(wave, &desired.slices, &wanted).await?;
        }
        self.published = Some(Published {
            inputs_version,
            node_uid,
            rules,
            wanted,
            devices,
        });
        drop(desired);
        self.mark_in_sync(plan.generation, slices, devices);
        Ok(())
    }

    /// The pool's slices on the server.
    async fn list(&self) -> Result<Vec<pool::Observed>, PublishError> {
        wire::list_slices(&self.client, &self.selector)
            .await
            .map_err(PublishError::api("list ResourceSlices"))
    }

    fn mark_in_sync(&self, generation: i64, slices: usize, devices: usize) {
        self.status.send_modify(|s| {
            s.generation = Some(generation);
            s.slices = slices;
            s.devices = devices;
            s.in_sync = true;
            s.reconciles += 1;
        });
    }

    /// Runs the writes of one wave, at most [`CONCURRENT_WRITES`] at once,
    /// and records each that succeeded. Fails with the first error, after
    /// the writes already in flight have finished.
    async fn write_wave(
        &mut self,
        wave: &[pool::Op],
        desired: &[ResourceSlice],
        wanted: &[pool::Wanted],
    ) -> Result<(), PublishError> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let writes: Vec<_> = wave
            .iter()
            .map(|op| write(&self.client, op, desired, &params))
            .collect();
        let results: Vec<Result<Option<String>, PublishError>> = futures::stream::iter(writes)
            .buffered(CONCURRENT_WRITES)
            .collect()
            .await;
        let mut first_error = None;
        for (op, result) in wave.iter().zip(results) {
            match (op, result) {
                (pool::Op::Apply(i), Ok(resource_version)) => {
                    let generation = desired[*i].spec.pool.generation;
                    pool::record_write(&mut self.state, &wanted[*i], generation, resource_version);
                }
                (pool::Op::Delete(name), Ok(_)) => pool::record_delete(&mut self.state, name),
                (_, Err(e)) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            self.status.send_modify(|s| s.writes += 1);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Logs what the device model left out (each note once, while it
    /// persists).
    fn log_notes(&mut self, notes: Vec<Note>) {
        for note in notes.iter().filter(|n| !self.logged_notes.contains(n)) {
            tracing::warn!(node = %self.node, "{note}");
        }
        self.logged_notes = notes;
    }
}

/// One write; an apply returns the `resourceVersion` of the answer.
async fn write(
    client: &kube::Client,
    op: &pool::Op,
    desired: &[ResourceSlice],
    params: &PatchParams,
) -> Result<Option<String>, PublishError> {
    match op {
        pool::Op::Apply(i) => {
            let slice = &desired[*i];
            wire::apply_slice(client, slice, params)
                .await
                .map_err(PublishError::api(format!(
                    "apply ResourceSlice {}",
                    slice.metadata.name.as_deref().unwrap_or_default()
                )))
        }
        pool::Op::Delete(name) => match wire::delete_slice(client, name).await {
            Ok(()) => Ok(None),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(PublishError::api(format!("delete ResourceSlice {name}"))(e)),
        },
    }
}

/// Builds the desired slices of `inventory` and returns them with the
/// device model's notes. The model and the split contents are dropped
/// before returning: only the slices live on, for one reconcile.
fn build(
    inventory: &Inventory,
    taints: &BTreeMap<String, Vec<Taint>>,
    flags: &Flags,
    rules: SliceRules,
    owner: &PoolOwner,
) -> (Desired, Vec<Note>) {
    let mut model = DeviceModel::build(
        inventory,
        &BuildOptions {
            dynamic_mig: flags.dynamic_mig,
            group_limits: rules.group_limits(),
            memory_sharing: flags.memory_sharing.clone(),
            consumable_shares: flags.consumable_shares,
            passthrough: flags.passthrough.clone(),
        },
    );
    model.set_taints(taints);
    let devices = model.devices().count();
    let contents = split(&model, &rules.limits());
    let notes = std::mem::take(&mut model.notes);
    drop(model);
    let slices = pool::build_slices(owner, &contents, 0);
    (Desired { slices, devices }, notes)
}
