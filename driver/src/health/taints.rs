//! The tracker's conditions as what the node publishes: device taints for
//! the ResourceSlices and device health for the KEP-4680 stream.
//!
//! Every device that sits on a GPU is found from the GPU's minor through its
//! [`DeviceRef`]: the full GPU `gpu-<minor>` (also what memory shares, MPS
//! and time-slice shares are allocated from: a shared GPU is one device
//! with `allowMultipleAllocations` or a sharing config on the claim), static
//! MIG devices and dynamic MIG placements `gpu-<minor>-mig-...`. A
//! condition of the GPU scope applies to all of them; a MIG-scoped one only
//! to the device with its profile and placement.
//!
//! Taints are ordered worst first (`hardware-failure`, `gpu-lost`,
//! `reboot-required`, `reset-required`, fatal `xid`s, `unmonitored`,
//! `remap-pending`, `degraded`, informational `xid`s) and cut to
//! [`MAX_TAINTS`] per device; the health message names what was cut. The
//! slice splitter may cut further (4 under 1.34 rules, after dropping
//! `None` taints there), keeping the worst.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::devices::{Device, DeviceModel, DeviceRef, Taint, TaintEffect};
use crate::grpc::health::{DeviceHealth, HealthStatus};

use super::classify::Policy;
use super::tracker::{Condition, GpuReport, HealthState, Key, Scope, Tracker};

/// Most taints of one device (the API limit from 1.35 on).
pub const MAX_TAINTS: usize = 16;
/// Longest health message (the KEP-4680 limit).
pub const MAX_HEALTH_MESSAGE: usize = 1024;
/// What the stream tells kubelet to trust a report for.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// The domain of every health taint key.
pub const KEY_DOMAIN: &str = gpu_dra_api::health::DOMAIN;

/// The taints of every tainted device, by device name (untainted devices
/// are absent), for [`crate::slices::publisher::Publisher::with_taints`].
pub fn device_taints(tracker: &Tracker, model: &DeviceModel) -> BTreeMap<String, Vec<Taint>> {
    let reports = tracker.conditions();
    let mut out = BTreeMap::new();
    for device in model.devices() {
        let Some(report) = report_of(&reports, device) else {
            continue;
        };
        let conditions = applying(report, device);
        let (taints, _) = taints_of(tracker.policy(), &conditions);
        if !taints.is_empty() {
            out.insert(device.name.clone(), taints);
        }
    }
    out
}

/// The health of every device of `model` in `pool`, stamped `now`. A
/// device on a GPU the tracker does not watch, or on a GPU another driver
/// holds (not probed) without an unhealthy condition, is Unknown.
pub fn device_health(
    tracker: &Tracker,
    model: &DeviceModel,
    pool: &str,
    now: SystemTime,
) -> Vec<crate::grpc::health::DeviceHealth> {
    let reports = tracker.conditions();
    model
        .devices()
        .map(|device| {
            let (status, message) = match report_of(&reports, device) {
                None => (
                    HealthStatus::Unknown,
                    "GPU not watched by the health monitor".to_owned(),
                ),
                Some(report) => {
                    let conditions = applying(report, device);
                    let (_, dropped) = taints_of(tracker.policy(), &conditions);
                    let (status, message) = health_of(&conditions, &dropped);
                    match &report.not_probed {
                        // Held by another driver (a VM's `vfio-pci`):
                        // nothing says it is healthy, or sick, now.
                        Some(why) if status == HealthStatus::Healthy => (
                            HealthStatus::Unknown,
                            if message.is_empty() {
                                cut_message(why)
                            } else {
                                cut_message(&format!("{why}; {message}"))
                            },
                        ),
                        Some(why) => (status, cut_message(&format!("{message}; {why}"))),
                        None => (status, message),
                    }
                }
            };
            DeviceHealth {
                pool_name: pool.to_owned(),
                device_name: device.name.clone(),
                status,
                last_updated: now,
                health_check_timeout: Some(HEALTH_CHECK_TIMEOUT),
                message,
            }
        })
        .collect()
}

/// The minor of the GPU a device sits on.
fn minor_of(device: &Device) -> u32 {
    match device.location {
        DeviceRef::Gpu { minor } | DeviceRef::Vfio { minor, .. } => minor,
        DeviceRef::Mig { parent_minor, .. } => parent_minor,
    }
}

fn report_of<'a>(reports: &'a [GpuReport], device: &Device) -> Option<&'a GpuReport> {
    let minor = minor_of(device);
    reports.iter().find(|r| r.id.minor == minor)
}

/// The conditions of `report` that apply to `device`, worst first.
fn applying<'a>(report: &'a GpuReport, device: &Device) -> Vec<&'a Condition> {
    let mut list: Vec<&Condition> = report
        .conditions
        .iter()
        .filter(|c| match (c.scope, device.location) {
            (Scope::Gpu, _) => true,
            (
                Scope::Mig {
                    profile_id,
                    placement_start,
                },
                DeviceRef::Mig {
                    profile_id: p,
                    placement_start: s,
                    ..
                },
            ) => profile_id == p && placement_start == s,
            (Scope::Mig { .. }, DeviceRef::Gpu { .. } | DeviceRef::Vfio { .. }) => false,
        })
        .collect();
    list.sort_by_key(|c| rank(c));
    list
}

/// Sort order of a condition: worst first, then by key.
fn rank(c: &Condition) -> (u8, Key) {
    let r = match c.key {
        Key::HardwareFailure => 0,
        Key::GpuLost => 1,
        Key::RebootRequired => 2,
        Key::ResetRequired => 3,
        Key::Xid(_) if c.fatal => 4,
        Key::Unmonitored => 5,
        Key::RemapPending => 6,
        Key::Degraded(_) => 7,
        Key::Xid(_) => 8,
    };
    (r, c.key)
}

/// The taints of `conditions` (worst first) under `policy`, at most
/// [`MAX_TAINTS`], and the messages of the conditions left out.
fn taints_of(policy: &Policy, conditions: &[&Condition]) -> (Vec<Taint>, Vec<String>) {
    let mut taints: Vec<Taint> = Vec::new();
    let mut dropped = Vec::new();
    for c in conditions {
        let key = format!("{KEY_DOMAIN}/{}", c.key.short());
        let value = c.taint_value();
        let effect = if !c.blocks() {
            TaintEffect::None
        } else if policy.evicts(c.key.short()) {
            TaintEffect::NoExecute
        } else {
            TaintEffect::NoSchedule
        };
        // The same taint from the GPU and the MIG scope: the first (worse)
        // one stands.
        if taints.iter().any(|t| t.key == key && t.value == value) {
            continue;
        }
        if taints.len() >= MAX_TAINTS {
            dropped.push(format!(
                "{key}{}",
                value.map(|v| format!("={v}")).unwrap_or_default()
            ));
            continue;
        }
        taints.push(Taint { key, value, effect });
    }
    (taints, dropped)
}

/// The KEP-4680 status and message of a device with `conditions`.
fn health_of(conditions: &[&Condition], dropped: &[String]) -> (HealthStatus, String) {
    let state = conditions
        .iter()
        .map(|c| c.state())
        .max()
        .unwrap_or(HealthState::Healthy);
    let status = match state {
        HealthState::Healthy | HealthState::Degraded => HealthStatus::Healthy,
        HealthState::Unknown => HealthStatus::Unknown,
        HealthState::Unhealthy => HealthStatus::Unhealthy,
    };
    // One fault often raises several conditions with the same text (XID 79:
    // `gpu-lost` and `xid=79`): each text once, in order.
    let mut texts: Vec<&str> = Vec::new();
    for c in conditions {
        if !texts.contains(&c.message.as_str()) {
            texts.push(&c.message);
        }
    }
    let mut message = texts.join("; ");
    if !dropped.is_empty() {
        message = format!(
            "{} taints not published (limit {MAX_TAINTS}): {}; {message}",
            dropped.len(),
            dropped.join(", ")
        );
    }
    (status, cut_message(&message))
}

/// `message` within [`MAX_HEALTH_MESSAGE`] characters: longer text is cut
/// to 1021 characters and `...`, as kubelet would.
pub fn cut_message(message: &str) -> String {
    if message.chars().count() <= MAX_HEALTH_MESSAGE {
        return message.to_owned();
    }
    let mut out: String = message.chars().take(MAX_HEALTH_MESSAGE - 3).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests;
