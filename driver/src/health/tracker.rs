//! The health conditions of each GPU over time: what the events and polls
//! raised, what is sticky, what expires and when a GPU counts as recovered
//! (issue #43, health.md §8.2–8.5). Pure and synchronous: every call takes
//! the time, so tests run whole fault histories in microseconds.
//!
//! A condition lives on a GPU ([`Scope::Gpu`], meaning the GPU and every
//! device on it) or on one MIG device ([`Scope::Mig`], by GPU instance
//! profile and placement, the parts of its device name). It is one of three
//! sorts:
//! - **recoverable**: `gpu-lost`, `reset-required`, `reboot-required`, fatal
//!   `xid`, `degraded=p2p` (the recovery action `DRAIN_P2P`). Cleared
//!   together by [`Tracker::tick`] once the last poll is after the last
//!   fault, the GPU answered it, the recovery action is `NONE` (or unknown on
//!   drivers without one), no remap or page retirement is pending, and
//!   nothing recoverable was raised or seen again for [`Policy::quiet`];
//! - **expiring**: informational `xid`, `degraded` (`thermal`, `pcie`,
//!   `nvlink`, `xid-rate`): removed [`Policy::info_ttl`] after last seen;
//!   `remap-pending` is cleared by the first poll that reports nothing
//!   pending (and expires like these when the GPU reports neither);
//! - **sticky**: `hardware-failure`, cleared only by an admin (see
//!   [`Tracker::clear_hardware_failures`] and docs/health-conditions.md);
//!   `unmonitored`, cleared when the event watch works again
//!   ([`Tracker::monitored`]).
//!
//! [`Tracker`] keeps the GPUs, the checkpointed state and the transitions;
//! `gpu` holds one GPU's rules (raise, refresh, expiry, events, polls,
//! recovery).
//!
//! A fatal condition never turns informational: a later informational XID
//! of the same number only refreshes it. A new boot id clears everything but
//! `hardware-failure` (a reboot resets the GPU).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_nvml::MigDevice;
use gpu_nvml::health::{HealthEvent, HealthPoll, RecoveryAction};
use serde::{Deserialize, Serialize};

use self::gpu::GpuState;
use super::classify::{Policy, rfc3339};
use crate::vfio::NVIDIA_DRIVER;

/// Most conditions one GPU keeps (all scopes); beyond it the oldest
/// informational ones go first.
pub const MAX_CONDITIONS_PER_GPU: usize = 128;
/// Longest condition message kept.
pub const MAX_MESSAGE: usize = 512;

/// Transition reason: a device became unhealthy.
pub const REASON_UNHEALTHY: &str = "GpuUnhealthy";
/// Transition reason: a device's events or polls cannot be read.
pub const REASON_UNMONITORED: &str = "GpuUnmonitored";
/// Transition reason: another driver (a VM's `vfio-pci`) holds the GPU,
/// which is then not probed.
pub const REASON_NOT_PROBED: &str = "GpuNotProbed";
/// Transition reason: a device got worse, short of unhealthy.
pub const REASON_DEGRADED: &str = "GpuDegraded";
/// Transition reason: a device got better.
pub const REASON_RECOVERED: &str = "GpuRecovered";
/// The value of `hardware-failure` for a failed row remap.
pub const ROW_REMAP_FAILURE: &str = "row-remap-failure";
/// PCIe replays per minute above which a GPU is `degraded=pcie` (DCGM's
/// `DCGM_LIMIT_MAX_PCIREPLAY_RATE`).
pub const PCIE_REPLAYS_PER_MINUTE: u64 = 8;

/// A GPU the monitor watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    /// NVML index (what events and polls name).
    pub index: u32,
    /// Device minor (what device names use: `gpu-<minor>`).
    pub minor: u32,
    /// GPU UUID (what the checkpoint and metrics use).
    pub uuid: String,
}

/// Where a condition applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// The whole GPU and every device on it.
    Gpu,
    /// The MIG device with this GPU instance profile and placement.
    Mig {
        /// GPU instance profile id.
        profile_id: u32,
        /// First memory slice of the placement.
        placement_start: u32,
    },
}

/// Why a GPU is `degraded` (the taint's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Degradation {
    /// Thermal or hardware slowdown.
    Thermal,
    /// PCIe replays above 8 a minute.
    Pcie,
    /// An NVLink that was up went down, or an NVLink XID.
    Nvlink,
    /// Repeated informational XIDs.
    XidRate,
    /// The recovery action `DRAIN_P2P`.
    P2p,
}

impl Degradation {
    /// The taint value.
    pub fn value(self) -> &'static str {
        match self {
            Self::Thermal => "thermal",
            Self::Pcie => "pcie",
            Self::Nvlink => "nvlink",
            Self::XidRate => "xid-rate",
            Self::P2p => "p2p",
        }
    }
}

/// What a condition is: one taint key (and, for `xid` and `degraded`, its
/// value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Key {
    /// `hardware-failure` (value in the condition).
    HardwareFailure,
    /// `gpu-lost`.
    GpuLost,
    /// `reboot-required`.
    RebootRequired,
    /// `reset-required` (value: the recovery action, in the condition).
    ResetRequired,
    /// `xid=<n>`.
    Xid(u64),
    /// `unmonitored`.
    Unmonitored,
    /// `remap-pending`.
    RemapPending,
    /// `degraded=<why>`.
    Degraded(Degradation),
}

impl Key {
    /// The short key name (`gpu-lost`); the taint key is
    /// `gpu.nvidia.com/<short>`.
    pub fn short(self) -> &'static str {
        match self {
            Self::HardwareFailure => "hardware-failure",
            Self::GpuLost => "gpu-lost",
            Self::RebootRequired => "reboot-required",
            Self::ResetRequired => "reset-required",
            Self::Xid(_) => "xid",
            Self::Unmonitored => "unmonitored",
            Self::RemapPending => "remap-pending",
            Self::Degraded(_) => "degraded",
        }
    }

    /// Whether a condition of this key with `fatal` blocks scheduling
    /// (`NoSchedule`) rather than informs (`None`).
    pub fn blocks(self, fatal: bool) -> bool {
        match self {
            Self::HardwareFailure | Self::GpuLost | Self::RebootRequired | Self::ResetRequired => {
                true
            }
            Self::Xid(_) => fatal,
            Self::Unmonitored | Self::RemapPending | Self::Degraded(_) => false,
        }
    }

    fn sort(self, fatal: bool) -> Sort {
        match self {
            Self::HardwareFailure | Self::Unmonitored => Sort::Sticky,
            Self::GpuLost
            | Self::RebootRequired
            | Self::ResetRequired
            | Self::Degraded(Degradation::P2p) => Sort::Recoverable,
            Self::Xid(_) if fatal => Sort::Recoverable,
            Self::Xid(_) | Self::Degraded(_) => Sort::Expiring,
            Self::RemapPending => Sort::Remap,
        }
    }
}

/// How a condition ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sort {
    Recoverable,
    Expiring,
    Remap,
    Sticky,
}

/// The health of a GPU or MIG device, worst first in severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum HealthState {
    /// No condition.
    Healthy,
    /// Informational conditions only (still usable; KEP-4680 Healthy with a
    /// message).
    Degraded,
    /// Not watched by events (KEP-4680 Unknown).
    Unknown,
    /// Needs a reset, a reboot or repair, or is lost (KEP-4680 Unhealthy).
    Unhealthy,
}

impl HealthState {
    /// The lower-case name (metrics label values).
    pub fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Unknown => "unknown",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// One active condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Where.
    pub scope: Scope,
    /// What.
    pub key: Key,
    /// The taint value where the key does not carry it (`reset-required`,
    /// `hardware-failure`).
    pub value: Option<String>,
    /// For `xid`: fatal (`NoSchedule`) rather than informational.
    pub fatal: bool,
    /// First raised.
    pub since: SystemTime,
    /// Last raised or seen again.
    pub last: SystemTime,
    /// How often raised or seen.
    pub count: u64,
    /// What happened, for people (`XID 119 at ...; recovery action GPU_RESET`).
    pub message: String,
}

impl Condition {
    /// The taint value.
    pub fn taint_value(&self) -> Option<String> {
        match self.key {
            Key::Xid(n) => Some(n.to_string()),
            Key::Degraded(d) => Some(d.value().to_owned()),
            Key::ResetRequired | Key::HardwareFailure => self.value.clone(),
            _ => None,
        }
    }

    /// Whether it blocks scheduling.
    pub fn blocks(&self) -> bool {
        self.key.blocks(self.fatal)
    }

    /// The health this condition alone gives.
    pub fn state(&self) -> HealthState {
        if self.blocks() {
            HealthState::Unhealthy
        } else if self.key == Key::Unmonitored {
            HealthState::Unknown
        } else {
            HealthState::Degraded
        }
    }
}

/// A change of health of a GPU or MIG device, for Node events and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The GPU.
    pub uuid: String,
    /// Its device minor.
    pub minor: u32,
    /// The GPU or one MIG device on it.
    pub scope: Scope,
    /// Health before.
    pub from: HealthState,
    /// Health after.
    pub to: HealthState,
    /// Event reason: one of the `REASON_*` constants.
    pub reason: &'static str,
    /// What is active now (or what cleared).
    pub message: String,
}

/// What the monitor knows of one GPU, for metrics and the taints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// The GPU.
    pub id: GpuId,
    /// Its health (GPU scope; MIG devices may be worse).
    pub state: HealthState,
    /// The recovery action of the last poll or event (`None`: unknown).
    pub recovery_action: Option<RecoveryAction>,
    /// Active conditions, GPU scope first, then by key.
    pub conditions: Vec<Condition>,
    /// Why the GPU is not probed (another driver holds it); `None`: probed.
    pub not_probed: Option<String>,
}

impl GpuReport {
    /// Full taint keys of the active conditions of the GPU scope
    /// (`gpu.nvidia.com/xid`), without repeats.
    pub fn taint_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .conditions
            .iter()
            .filter(|c| c.scope == Scope::Gpu)
            .map(|c| format!("gpu.nvidia.com/{}", c.key.short()))
            .collect();
        keys.dedup();
        keys
    }
}

/// Which GPUs an admin's clear request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearRequest {
    /// Every GPU (`all`).
    All,
    /// These GPU UUIDs.
    Gpus(BTreeSet<String>),
}

/// One MIG device as NVML numbers it, to attribute events with a GPU
/// instance id to the device (static MIG: from discovery; dynamic MIG: the
/// live instances).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigInstance {
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// GPU instance profile id.
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
}

impl From<&MigDevice> for MigInstance {
    fn from(d: &MigDevice) -> Self {
        Self {
            gpu_instance_id: d.gpu_instance_id,
            profile_id: d.profile_id,
            placement_start: d.placement.start,
        }
    }
}

/// The checkpointed state: active conditions per GPU UUID, and the boot
/// they were seen in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    /// `/proc/sys/kernel/random/boot_id` when saved.
    pub boot_id: String,
    /// Per GPU UUID.
    pub gpus: BTreeMap<String, SavedGpu>,
}

/// One GPU in [`Saved`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedGpu {
    /// Active conditions.
    pub conditions: Vec<SavedCondition>,
    /// Volatile uncorrected ECC count of the last poll (to see growth
    /// across a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volatile_uncorrected_ecc: Option<u64>,
}

/// One condition in [`Saved`]; times in seconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedCondition {
    /// Where.
    pub scope: Scope,
    /// What.
    pub key: Key,
    /// The value where the key does not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Fatal (for `xid`).
    #[serde(default)]
    pub fatal: bool,
    /// First raised.
    pub since: u64,
    /// Last seen.
    pub last: u64,
    /// How often.
    pub count: u64,
    /// What happened.
    pub message: String,
}

/// The health conditions of the node's GPUs.
#[derive(Debug, Clone)]
pub struct Tracker {
    policy: Policy,
    boot_id: String,
    gpus: Vec<GpuState>,
    /// Saved GPUs not present now: their hardware failures are kept.
    dormant: BTreeMap<String, SavedGpu>,
    transitions: Vec<Transition>,
    changed: bool,
}

/// Health per (GPU position, scope), plus what decides the taints.
type Snapshot = (
    BTreeMap<(usize, Scope), HealthState>,
    Vec<(usize, Scope, Key, Option<String>, bool)>,
);

impl Tracker {
    /// A tracker for `gpus`, restoring `saved` conditions of the same GPUs.
    /// From another boot only `hardware-failure` is restored.
    pub fn new(
        policy: Policy,
        gpus: Vec<GpuId>,
        boot_id: String,
        saved: Option<Saved>,
        now: SystemTime,
    ) -> Self {
        let mut tracker = Self {
            policy,
            boot_id,
            gpus: gpus.into_iter().map(GpuState::new).collect(),
            dormant: BTreeMap::new(),
            transitions: Vec::new(),
            changed: false,
        };
        let before = tracker.snapshot();
        if let Some(saved) = saved {
            tracker.restore(saved, now);
        }
        tracker.finish(&before);
        // A restored fault is news to whoever publishes: report it.
        tracker.changed = true;
        tracker
    }

    fn restore(&mut self, saved: Saved, now: SystemTime) {
        let same_boot = saved.boot_id == self.boot_id;
        for (uuid, mut entry) in saved.gpus {
            if !same_boot {
                entry
                    .conditions
                    .retain(|c| c.key == Key::HardwareFailure && c.scope == Scope::Gpu);
                entry.volatile_uncorrected_ecc = None;
            }
            let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.uuid == uuid) else {
                if !entry.conditions.is_empty() {
                    entry
                        .conditions
                        .retain(|c| c.key == Key::HardwareFailure && c.scope == Scope::Gpu);
                    entry.volatile_uncorrected_ecc = None;
                    if !entry.conditions.is_empty() {
                        self.dormant.insert(uuid, entry);
                    }
                }
                continue;
            };
            gpu.ecc = entry.volatile_uncorrected_ecc;
            for c in entry.conditions {
                let condition = Condition {
                    scope: c.scope,
                    key: c.key,
                    value: c.value,
                    fatal: c.fatal,
                    since: from_secs(c.since).min(now),
                    last: from_secs(c.last).min(now),
                    count: c.count,
                    message: cut(&c.message, MAX_MESSAGE),
                };
                if condition.key.sort(condition.fatal) == Sort::Recoverable {
                    gpu.last_fault = gpu.last_fault.max(Some(condition.last));
                }
                if gpu.conditions.len() < MAX_CONDITIONS_PER_GPU {
                    gpu.conditions.insert((c.scope, c.key), condition);
                }
            }
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Tells the tracker which MIG devices GPU `index` has now, so events
    /// with a GPU instance id land on the right device. Without it (or for
    /// an id not listed) such an event counts for the whole GPU.
    pub fn set_mig_instances(&mut self, index: u32, instances: &[MigInstance]) {
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.index == index) {
            gpu.mig = instances
                .iter()
                .map(|m| (m.gpu_instance_id, (m.profile_id, m.placement_start)))
                .collect();
        }
    }

    /// One NVML event. Events of GPUs the tracker does not know are
    /// ignored.
    pub fn event(&mut self, event: &HealthEvent, now: SystemTime) {
        let before = self.snapshot();
        let policy = self.policy.clone();
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.index == event.gpu_index) {
            gpu.event(&policy, event, now);
        } else {
            tracing::debug!(
                gpu_index = event.gpu_index,
                "health event of an unknown GPU ignored"
            );
        }
        self.finish(&before);
    }

    /// One poll of GPU `index`.
    pub fn poll(&mut self, index: u32, poll: &HealthPoll, now: SystemTime) {
        let before = self.snapshot();
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.index == index) {
            gpu.poll(poll, now);
        }
        self.finish(&before);
    }

    /// Events of GPU `index` cannot be watched (registration failed). Not
    /// raised while another driver holds the GPU: NVML cannot reach it
    /// then (see [`Tracker::bound_elsewhere`]); the event thread reports
    /// again at each registration retry.
    pub fn unmonitored(&mut self, index: u32, why: &str, now: SystemTime) {
        let before = self.snapshot();
        if let Some(gpu) = self
            .gpus
            .iter_mut()
            .find(|g| g.id.index == index && g.elsewhere.is_none())
        {
            gpu.raise_simple(
                Key::Unmonitored,
                None,
                format!(
                    "GPU events not watched since {}: {}",
                    rfc3339(now),
                    cut(why, 256)
                ),
                now,
            );
        }
        self.finish(&before);
    }

    /// Events of GPU `index` are watched again: clears `unmonitored`.
    pub fn monitored(&mut self, index: u32) {
        let before = self.snapshot();
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.index == index) {
            gpu.conditions.remove(&(Scope::Gpu, Key::Unmonitored));
        }
        self.finish(&before);
    }

    /// GPU `index` is held by `driver` instead of `nvidia` (a VFIO claim
    /// rebound it to `vfio-pci`), or back on `nvidia` (`None`). While held
    /// it is not probed: its GPU scope is at least Unknown with a message
    /// saying so, `unmonitored` is dropped and not raised, and its other
    /// conditions stay as they were (no poll can clear them). Once back,
    /// the monitor probes it again; the event thread reports whether its
    /// events can be watched.
    pub fn bound_elsewhere(&mut self, index: u32, driver: Option<&str>) {
        let before = self.snapshot();
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.index == index) {
            let driver = driver.map(|d| cut(d, 64));
            if gpu.elsewhere != driver {
                tracing::info!(
                    gpu = index,
                    uuid = %gpu.id.uuid,
                    driver = driver.as_deref().unwrap_or(NVIDIA_DRIVER),
                    "GPU driver changed: {}",
                    if driver.is_some() { "not probed while another driver holds it" } else { "probed again" }
                );
                if driver.is_some() {
                    gpu.conditions.remove(&(Scope::Gpu, Key::Unmonitored));
                }
                gpu.elsewhere = driver;
                self.changed = true;
            }
        }
        self.finish(&before);
    }

    /// Clears the `hardware-failure` of the GPU with `uuid` (present or only
    /// saved): the admin's way out once the GPU was repaired or replaced.
    /// Returns whether there was one. (A GPU whose poll still reports the
    /// failure gets it back at the next poll.)
    pub fn clear_hardware_failure(&mut self, uuid: &str) -> bool {
        let before = self.snapshot();
        let mut found = self.dormant.remove(uuid).is_some();
        if let Some(gpu) = self.gpus.iter_mut().find(|g| g.id.uuid == uuid) {
            let old = gpu.conditions.len();
            gpu.conditions
                .retain(|(_, k), _| *k != Key::HardwareFailure);
            found |= gpu.conditions.len() != old;
        }
        self.finish(&before);
        found
    }

    /// Clears the `hardware-failure` of the GPUs `which` names (see
    /// [`crate::health::store::take_clear_request`]); returns the UUIDs
    /// that had one.
    pub fn clear_hardware_failures(&mut self, which: &ClearRequest) -> Vec<String> {
        let uuids: Vec<String> = match which {
            ClearRequest::All => self
                .gpus
                .iter()
                .map(|g| g.id.uuid.clone())
                .chain(self.dormant.keys().cloned())
                .collect(),
            ClearRequest::Gpus(list) => list.iter().cloned().collect(),
        };
        uuids
            .into_iter()
            .filter(|u| self.clear_hardware_failure(u))
            .collect()
    }

    /// Time passes: informational conditions expire, recovered GPUs clear.
    pub fn tick(&mut self, now: SystemTime) {
        let before = self.snapshot();
        let policy = self.policy.clone();
        for gpu in &mut self.gpus {
            gpu.tick(&policy, now);
        }
        self.finish(&before);
    }

    /// The health changes since the last call.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        std::mem::take(&mut self.transitions)
    }

    /// Everything known per GPU, in the order given to [`Tracker::new`].
    pub fn conditions(&self) -> Vec<GpuReport> {
        self.gpus
            .iter()
            .map(|g| GpuReport {
                id: g.id.clone(),
                state: g.state(Scope::Gpu),
                recovery_action: g.action,
                conditions: g.conditions.values().cloned().collect(),
                not_probed: g.not_probed(),
            })
            .collect()
    }

    /// The state to checkpoint.
    pub fn saved(&self) -> Saved {
        let mut gpus = self.dormant.clone();
        for g in &self.gpus {
            if g.conditions.is_empty() && g.ecc.is_none() {
                continue;
            }
            gpus.insert(
                g.id.uuid.clone(),
                SavedGpu {
                    conditions: g
                        .conditions
                        .values()
                        .map(|c| SavedCondition {
                            scope: c.scope,
                            key: c.key,
                            value: c.value.clone(),
                            fatal: c.fatal,
                            since: secs(c.since),
                            last: secs(c.last),
                            count: c.count,
                            message: c.message.clone(),
                        })
                        .collect(),
                    volatile_uncorrected_ecc: g.ecc,
                },
            );
        }
        Saved {
            boot_id: self.boot_id.clone(),
            gpus,
        }
    }

    /// True once after any change of what the taints or health show.
    pub fn changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    fn snapshot(&self) -> Snapshot {
        let mut states = BTreeMap::new();
        let mut taints = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            states.insert((i, Scope::Gpu), g.state(Scope::Gpu));
            for ((scope, key), c) in &g.conditions {
                states.insert((i, *scope), g.state(*scope));
                taints.push((i, *scope, *key, c.taint_value(), c.blocks()));
            }
        }
        (states, taints)
    }

    /// Records the transitions and the change flag since `before`.
    fn finish(&mut self, before: &Snapshot) {
        let after = self.snapshot();
        if after.1 != before.1 {
            self.changed = true;
        }
        let scopes: BTreeSet<(usize, Scope)> =
            before.0.keys().chain(after.0.keys()).copied().collect();
        for (i, scope) in scopes {
            let from = before
                .0
                .get(&(i, scope))
                .copied()
                .unwrap_or(HealthState::Healthy);
            let to = after
                .0
                .get(&(i, scope))
                .copied()
                .unwrap_or(HealthState::Healthy);
            if from == to {
                continue;
            }
            let gpu = &self.gpus[i];
            let reason = match to {
                HealthState::Unhealthy => REASON_UNHEALTHY,
                HealthState::Unknown if scope == Scope::Gpu && gpu.elsewhere.is_some() => {
                    REASON_NOT_PROBED
                }
                HealthState::Unknown => REASON_UNMONITORED,
                HealthState::Degraded if from < to => REASON_DEGRADED,
                HealthState::Degraded | HealthState::Healthy => REASON_RECOVERED,
            };
            let message = match gpu.summary(scope) {
                Some(s) => s,
                None => format!("no active health condition (was {})", from.name()),
            };
            tracing::info!(
                gpu = %gpu.id.uuid,
                minor = gpu.id.minor,
                scope = ?scope,
                from = from.name(),
                to = to.name(),
                reason,
                detail = %message,
                "GPU health changed"
            );
            self.transitions.push(Transition {
                uuid: gpu.id.uuid.clone(),
                minor: gpu.id.minor,
                scope,
                from,
                to,
                reason,
                message,
            });
        }
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn from_secs(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s.min(u64::from(u32::MAX) * 4))
}

/// `text` cut to `max` bytes at a character boundary, with `...` when cut,
/// and control characters (line breaks from an NVML error text, a hostile
/// checkpoint) shown as spaces: messages end up in one-line logs, Node
/// events and the health stream.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    };
    if text.len() <= max {
        return clean(text);
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", clean(&text[..end]))
}

mod gpu;

#[cfg(test)]
mod tests;
