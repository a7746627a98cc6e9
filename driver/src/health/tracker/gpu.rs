//! One GPU's conditions and what changes them: the raise, refresh and
//! expiry rules, the event and poll handling, and the recovery check behind
//! [`super::Tracker`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use gpu_nvml::health::{EventKind, HealthEvent, HealthPoll, Liveness, RecoveryAction};

use super::super::classify::{self, ActionClass, Implied, Policy, rfc3339};
use super::{
    Condition, Degradation, GpuId, HealthState, Key, MAX_CONDITIONS_PER_GPU, MAX_MESSAGE,
    PCIE_REPLAYS_PER_MINUTE, ROW_REMAP_FAILURE, Scope, Sort, cut,
};

/// The facts of the last poll that recovery needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct PollFacts {
    at: SystemTime,
    alive: bool,
    pending: bool,
    remap_known: bool,
}

/// The state of one GPU.
#[derive(Debug, Clone)]
pub(super) struct GpuState {
    pub(super) id: GpuId,
    pub(super) conditions: BTreeMap<(Scope, Key), Condition>,
    pub(super) action: Option<RecoveryAction>,
    pub(super) last_poll: Option<PollFacts>,
    /// Last time a recoverable condition was raised or seen again.
    pub(super) last_fault: Option<SystemTime>,
    pub(super) ecc: Option<u64>,
    pub(super) pcie: Option<(u64, SystemTime)>,
    pub(super) links_up: BTreeSet<u32>,
    pub(super) info_xids: BTreeMap<Scope, VecDeque<SystemTime>>,
    pub(super) mig: BTreeMap<u32, (u32, u32)>,
    /// The driver holding the GPU instead of `nvidia` (a VFIO claim's
    /// `vfio-pci`): not probed, Unknown; `None`: on `nvidia`.
    pub(super) elsewhere: Option<String>,
}

/// A condition to raise.
pub(super) struct Raise {
    pub(super) scope: Scope,
    pub(super) key: Key,
    pub(super) value: Option<String>,
    pub(super) fatal: bool,
    pub(super) message: String,
    /// Replace the message of an existing condition (events); polls keep
    /// the first one.
    pub(super) fresh_message: bool,
}

impl GpuState {
    /// A GPU with no conditions yet.
    pub(super) fn new(id: GpuId) -> Self {
        Self {
            id,
            conditions: BTreeMap::new(),
            action: None,
            last_poll: None,
            last_fault: None,
            ecc: None,
            pcie: None,
            links_up: BTreeSet::new(),
            info_xids: BTreeMap::new(),
            mig: BTreeMap::new(),
            elsewhere: None,
        }
    }

    /// The scope's health: its worst condition; at least Unknown for the
    /// GPU scope of a GPU held by another driver (not probed).
    pub(super) fn state(&self, scope: Scope) -> HealthState {
        let worst = self
            .conditions
            .values()
            .filter(|c| c.scope == scope)
            .map(Condition::state)
            .max()
            .unwrap_or(HealthState::Healthy);
        if scope == Scope::Gpu && self.elsewhere.is_some() {
            worst.max(HealthState::Unknown)
        } else {
            worst
        }
    }

    /// Why the GPU is not probed, when another driver holds it.
    pub(super) fn not_probed(&self) -> Option<String> {
        self.elsewhere.as_deref().map(|driver| {
            format!(
                "not probed: the GPU is bound to {driver}, not nvidia (passed through to a VM), and NVML cannot reach it"
            )
        })
    }

    /// The messages of the scope's conditions, worst first.
    pub(super) fn summary(&self, scope: Scope) -> Option<String> {
        let mut list: Vec<&Condition> = self
            .conditions
            .values()
            .filter(|c| c.scope == scope)
            .collect();
        list.sort_by_key(|c| std::cmp::Reverse(c.state()));
        let not_probed = if scope == Scope::Gpu {
            self.not_probed()
        } else {
            None
        };
        let texts: Vec<&str> = not_probed
            .as_deref()
            .into_iter()
            .chain(list.iter().map(|c| c.message.as_str()))
            .collect();
        (!texts.is_empty()).then(|| cut(&texts.join("; "), 1024))
    }

    pub(super) fn raise(&mut self, r: Raise, now: SystemTime) {
        let fatal = r.fatal;
        if let Some(c) = self.conditions.get_mut(&(r.scope, r.key)) {
            c.last = now.max(c.last);
            c.count = c.count.saturating_add(1);
            // Sticky fatal: an informational repeat never downgrades.
            c.fatal |= fatal;
            // The first value stands (a recovery action sets its own, see
            // `apply_action`).
            if c.value.is_none() {
                c.value = r.value;
            }
            if r.fresh_message {
                c.message = cut(&r.message, MAX_MESSAGE);
            }
        } else {
            if self.conditions.len() >= MAX_CONDITIONS_PER_GPU {
                self.evict_one_informational();
            }
            if self.conditions.len() >= MAX_CONDITIONS_PER_GPU {
                return;
            }
            self.conditions.insert(
                (r.scope, r.key),
                Condition {
                    scope: r.scope,
                    key: r.key,
                    value: r.value,
                    fatal,
                    since: now,
                    last: now,
                    count: 1,
                    message: cut(&r.message, MAX_MESSAGE),
                },
            );
        }
        let c = &self.conditions[&(r.scope, r.key)];
        if c.key.sort(c.fatal) == Sort::Recoverable {
            self.last_fault = Some(self.last_fault.map_or(now, |t| t.max(now)));
        }
    }

    pub(super) fn evict_one_informational(&mut self) {
        let oldest = self
            .conditions
            .iter()
            .filter(|(_, c)| c.key.sort(c.fatal) == Sort::Expiring)
            .min_by_key(|(_, c)| c.last)
            .map(|(k, _)| *k);
        if let Some(k) = oldest {
            self.conditions.remove(&k);
        }
    }

    pub(super) fn raise_simple(
        &mut self,
        key: Key,
        value: Option<String>,
        message: String,
        now: SystemTime,
    ) {
        self.raise(
            Raise {
                scope: Scope::Gpu,
                key,
                value,
                fatal: false,
                message,
                fresh_message: false,
            },
            now,
        );
    }

    pub(super) fn event(&mut self, policy: &Policy, event: &HealthEvent, now: SystemTime) {
        let at = rfc3339(event.at);
        match event.kind {
            EventKind::Xid(xid) => self.xid(policy, event, xid, now),
            EventKind::DoubleBitEcc => {
                self.memory_fault(&format!("double-bit ECC error at {at}"), now);
            }
            EventKind::FatalPoison => {
                self.memory_fault(&format!("fatal poison error at {at}"), now);
            }
            EventKind::SingleBitEcc => {}
            EventKind::RecoveryAction(action) => {
                self.apply_action(action, &format!("recovery action event at {at}"), now);
            }
            EventKind::GpuUnavailable => {
                self.raise_simple(Key::GpuLost, None, format!("GPU unavailable at {at}"), now);
            }
            EventKind::DramRetirement => self.raise_simple(
                Key::RemapPending,
                None,
                format!("DRAM row retirement at {at}; a GPU reset applies it"),
                now,
            ),
            EventKind::DramRetirementFailure => self.raise_simple(
                Key::HardwareFailure,
                Some(ROW_REMAP_FAILURE.to_owned()),
                format!("DRAM row retirement failed at {at}"),
                now,
            ),
        }
    }

    /// The scope of an event's GPU instance id: the MIG device when known,
    /// the whole GPU otherwise.
    pub(super) fn scope_of(&self, event: &HealthEvent) -> Scope {
        event
            .gpu_instance_id
            .and_then(|gi| self.mig.get(&gi))
            .map_or(Scope::Gpu, |&(profile_id, placement_start)| Scope::Mig {
                profile_id,
                placement_start,
            })
    }

    pub(super) fn xid(&mut self, policy: &Policy, event: &HealthEvent, xid: u64, now: SystemTime) {
        let scope = self.scope_of(event);
        let verdict = classify::classify_xid(policy, xid, self.action);
        let mut message = format!("XID {xid} at {}", rfc3339(event.at));
        if let (Some(gi), Scope::Gpu) = (event.gpu_instance_id, scope) {
            let _ = write!(
                message,
                " (unknown GPU instance {gi}: counted for the whole GPU)"
            );
        }
        match (verdict.why, self.action) {
            ("recovery action", Some(a)) => {
                let _ = write!(message, "; recovery action {}", classify::action_name(a));
            }
            (why, _) => {
                let class = if verdict.fatal {
                    "fatal"
                } else {
                    "informational"
                };
                let _ = write!(message, "; {class} ({why})");
            }
        }
        self.raise(
            Raise {
                scope,
                key: Key::Xid(xid),
                value: None,
                fatal: verdict.fatal,
                message: message.clone(),
                fresh_message: true,
            },
            now,
        );
        if !verdict.fatal {
            self.escalate(policy, scope, now);
        }
        match verdict.implied {
            None => {}
            Some(Implied::Reset(action)) => {
                self.raise_simple(Key::ResetRequired, Some(action), message, now);
            }
            Some(Implied::Reboot) => self.raise_simple(Key::RebootRequired, None, message, now),
            Some(Implied::Lost) => self.raise_simple(Key::GpuLost, None, message, now),
            Some(Implied::Nvlink) => {
                self.raise_simple(Key::Degraded(Degradation::Nvlink), None, message, now);
            }
        }
        self.xid_48_workflow(xid, now);
    }

    /// The catalog's `WORKFLOW_XID_48`, for drivers without a recovery
    /// action: a double-bit ECC error (48) with a row remap or page
    /// retirement (63, 64) within 30 s of it asks to drain and reset.
    pub(super) fn xid_48_workflow(&mut self, xid: u64, now: SystemTime) {
        const WINDOW: Duration = Duration::from_secs(30);
        if self.action.is_some() || !matches!(xid, 48 | 63 | 64) {
            return;
        }
        let recent = |this: &Self, wanted: &[u64]| {
            this.conditions.values().any(|c| {
                matches!(c.key, Key::Xid(n) if wanted.contains(&n))
                    && elapsed(c.last, now) <= WINDOW
            })
        };
        let other: &[u64] = if xid == 48 { &[63, 64] } else { &[48] };
        if !recent(self, other) {
            return;
        }
        if let Some(c) = self.conditions.get_mut(&(Scope::Gpu, Key::ResetRequired)) {
            c.value = Some("DRAIN_AND_RESET".to_owned());
            let _ = write!(c.message, "; with XID 63/64 within 30 s: drain and reset");
            c.message = cut(&c.message, MAX_MESSAGE);
        }
    }

    /// Counts an informational XID on `scope`; too many in the window raise
    /// `degraded=xid-rate`.
    pub(super) fn escalate(&mut self, policy: &Policy, scope: Scope, now: SystemTime) {
        if policy.escalate_after == 0 {
            return;
        }
        let window = self.info_xids.entry(scope).or_default();
        window.push_back(now);
        while window
            .front()
            .is_some_and(|&t| elapsed(t, now) >= policy.escalate_window)
        {
            window.pop_front();
        }
        let cap = usize::try_from(policy.escalate_after).unwrap_or(usize::MAX);
        while window.len() > cap {
            window.pop_front();
        }
        if window.len() >= cap {
            let message = format!(
                "{} informational XIDs within {} s, the last at {}",
                window.len(),
                policy.escalate_window.as_secs(),
                rfc3339(now)
            );
            self.raise(
                Raise {
                    scope,
                    key: Key::Degraded(Degradation::XidRate),
                    value: None,
                    fatal: false,
                    message,
                    fresh_message: true,
                },
                now,
            );
        }
    }

    /// A double-bit ECC or fatal poison error, or uncorrected ECC growth:
    /// the recovery action decides where the driver has one; without it the
    /// catalog's answer for XID 48 alone (reset).
    pub(super) fn memory_fault(&mut self, message: &str, now: SystemTime) {
        match self.action.map(classify::action_class) {
            None => self.raise_simple(
                Key::ResetRequired,
                Some("GPU_RESET".to_owned()),
                message.to_owned(),
                now,
            ),
            Some(ActionClass::Reset(action)) => self.raise_simple(
                Key::ResetRequired,
                Some(action),
                format!("{message}; recovery action set"),
                now,
            ),
            Some(ActionClass::Reboot) => self.raise_simple(
                Key::RebootRequired,
                None,
                format!("{message}; recovery action set"),
                now,
            ),
            Some(ActionClass::Fine | ActionClass::DrainP2p) => {
                tracing::info!(gpu = %self.id.uuid, detail = %message, "memory error contained: recovery action needs nothing");
            }
        }
    }

    pub(super) fn apply_action(&mut self, action: RecoveryAction, source: &str, now: SystemTime) {
        self.action = Some(action);
        let name = classify::action_name(action);
        match classify::action_class(action) {
            ActionClass::Fine => {}
            ActionClass::DrainP2p => self.raise_simple(
                Key::Degraded(Degradation::P2p),
                None,
                format!("recovery action {name} ({source})"),
                now,
            ),
            ActionClass::Reset(value) => {
                let message = format!("recovery action {name} ({source})");
                self.raise_simple(Key::ResetRequired, Some(value.clone()), message, now);
                // The driver's current action names the reset, whatever
                // raised the condition first.
                if let Some(c) = self.conditions.get_mut(&(Scope::Gpu, Key::ResetRequired)) {
                    c.value = Some(value);
                }
            }
            ActionClass::Reboot => self.raise_simple(
                Key::RebootRequired,
                None,
                format!("recovery action {name} ({source})"),
                now,
            ),
        }
    }

    pub(super) fn poll(&mut self, poll: &HealthPoll, now: SystemTime) {
        let at = rfc3339(now);
        let alive = poll.liveness == Liveness::Alive;
        match &poll.liveness {
            Liveness::Alive | Liveness::Error(_) => {}
            Liveness::Lost => self.raise_simple(
                Key::GpuLost,
                None,
                format!("GPU lost (NVML: GPU is lost) at {at}"),
                now,
            ),
            Liveness::ResetRequired => self.raise_simple(
                Key::ResetRequired,
                Some("GPU_RESET".to_owned()),
                format!("NVML reports reset required at {at}"),
                now,
            ),
        }
        match poll.recovery_action {
            Some(action) => self.apply_action(action, &format!("poll at {at}"), now),
            None => self.action = None,
        }
        if let Some(remap) = poll.remap {
            if remap.failure {
                self.raise_simple(
                    Key::HardwareFailure,
                    Some(ROW_REMAP_FAILURE.to_owned()),
                    format!("row remapping failed (seen at {at})"),
                    now,
                );
            }
            if remap.pending {
                self.raise_simple(
                    Key::RemapPending,
                    None,
                    format!("row remap pending since {at}; a GPU reset applies it"),
                    now,
                );
            }
        }
        if poll.retired_pages_pending == Some(true) {
            self.raise_simple(
                Key::RemapPending,
                None,
                format!("page retirement pending since {at}; a GPU reset applies it"),
                now,
            );
        }
        let pending =
            poll.remap.is_some_and(|r| r.pending) || poll.retired_pages_pending == Some(true);
        let remap_known = poll.remap.is_some() || poll.retired_pages_pending.is_some();
        if remap_known && !pending {
            self.conditions.remove(&(Scope::Gpu, Key::RemapPending));
        }
        if let Some(count) = poll.volatile_uncorrected_ecc {
            if let Some(before) = self.ecc
                && count > before
            {
                self.memory_fault(
                    &format!("volatile uncorrected ECC errors grew from {before} to {count} (seen at {at})"),
                    now,
                );
            }
            self.ecc = Some(count);
        }
        if poll.thermal_slowdown == Some(true) || poll.hw_slowdown == Some(true) {
            let what = if poll.thermal_slowdown == Some(true) {
                "thermal"
            } else {
                "hardware"
            };
            self.raise_simple(
                Key::Degraded(Degradation::Thermal),
                None,
                format!("{what} slowdown since {at}"),
                now,
            );
        }
        if let Some(replays) = poll.pcie_replays {
            match self.pcie {
                Some((before, then)) if replays >= before => {
                    let window = elapsed(then, now);
                    let ms = window.as_millis();
                    // A rate over less than a second says little: the
                    // baseline stays until a second has passed (polls faster
                    // than that, as in tests, add up to one window).
                    if ms >= 1000 {
                        let rate = u128::from(replays - before) * 60_000 / ms;
                        if rate > u128::from(PCIE_REPLAYS_PER_MINUTE) {
                            self.raise_simple(
                                Key::Degraded(Degradation::Pcie),
                                None,
                                format!(
                                    "{} PCIe replays in {:.1} s (over {PCIE_REPLAYS_PER_MINUTE}/min) at {at}",
                                    replays - before,
                                    window.as_secs_f64()
                                ),
                                now,
                            );
                        }
                        self.pcie = Some((replays, now));
                    }
                }
                // The first reading, or a counter that went back (a reset).
                _ => self.pcie = Some((replays, now)),
            }
        }
        let mut down = Vec::new();
        for link in &poll.nvlinks {
            if link.active {
                self.links_up.insert(link.link);
            } else if self.links_up.contains(&link.link) {
                down.push(link.link.to_string());
            }
        }
        if !down.is_empty() {
            self.raise_simple(
                Key::Degraded(Degradation::Nvlink),
                None,
                format!("NVLink {} down since {at}", down.join(", ")),
                now,
            );
        }
        self.last_poll = Some(PollFacts {
            at: now,
            alive,
            pending,
            remap_known,
        });
    }

    pub(super) fn tick(&mut self, policy: &Policy, now: SystemTime) {
        let remap_unknown = self.last_poll.is_none_or(|p| !p.remap_known);
        self.conditions.retain(|_, c| match c.key.sort(c.fatal) {
            Sort::Expiring => elapsed(c.last, now) < policy.info_ttl,
            Sort::Remap => !remap_unknown || elapsed(c.last, now) < policy.info_ttl,
            Sort::Recoverable | Sort::Sticky => true,
        });
        for window in self.info_xids.values_mut() {
            while window
                .front()
                .is_some_and(|&t| elapsed(t, now) >= policy.escalate_window)
            {
                window.pop_front();
            }
        }
        self.info_xids.retain(|_, w| !w.is_empty());
        if self.recovered(policy, now) {
            self.conditions
                .retain(|_, c| c.key.sort(c.fatal) != Sort::Recoverable);
            self.last_fault = None;
        }
    }

    /// Whether the recoverable conditions may clear now.
    pub(super) fn recovered(&self, policy: &Policy, now: SystemTime) -> bool {
        let Some(last_fault) = self.last_fault else {
            return false;
        };
        let Some(poll) = self.last_poll else {
            return false;
        };
        let action_fine = self
            .action
            .is_none_or(|a| classify::action_class(a) == ActionClass::Fine);
        poll.at > last_fault
            && poll.alive
            && action_fine
            && !poll.pending
            && elapsed(last_fault, now) >= policy.quiet
    }
}

/// `now - then`, zero when the clock went back.
pub(super) fn elapsed(then: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or(Duration::ZERO)
}
