//! Splitting a node's devices and counter sets into ResourceSlice contents
//! that respect [`Limits`]. Deterministic: the same model and limits always
//! give the same contents in the same order, so slice names stay stable and
//! an unchanged node causes no writes.
//!
//! - 1.35 rules: counter sets first, in slices of their own (at most 8 sets
//!   and 256 counters each), then devices in order, at most 128 per slice, 64
//!   when one of them consumes counters or has taints. A device may consume a
//!   counter set of another slice of the pool.
//! - 1.34 rules: a GPU's counter set and all devices consuming it go into one
//!   slice (the device model already checked they fit); slices fill up in
//!   order with whole GPUs, at most 32 shared counters and 1024 counter
//!   consumptions per slice.
//!
//! Taints beyond a rule set's per-device limit are dropped here (the first
//! ones are kept: the health monitor orders them worst first), so a flood of
//! health events cannot make the slice invalid. Under 1.34 rules taints with
//! effect `None` (a 1.35 addition) are dropped first, before the 64-device
//! limit of slices with taints is applied.

use std::borrow::Cow;

use crate::devices::{CounterSet, Device, DeviceModel, TaintEffect};

use super::Limits;

/// What one ResourceSlice holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceContent {
    /// Devices.
    pub devices: Vec<Device>,
    /// Counter sets.
    pub counter_sets: Vec<CounterSet>,
}

impl SliceContent {
    fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.counter_sets.is_empty()
    }

    fn shared_counters(&self) -> usize {
        self.counter_sets.iter().map(|s| s.counters.len()).sum()
    }

    fn consumptions(&self) -> usize {
        self.devices.iter().map(consumption_count).sum()
    }

    /// Whether `extra` more devices (with the given properties) fit.
    fn fits_devices(&self, limits: &Limits, extra: &[Device]) -> bool {
        let all = || self.devices.iter().chain(extra);
        let mut max = limits.max_devices;
        if all().any(|d| d.consumes.is_some()) {
            max = max.min(limits.max_devices_with_counters);
        }
        if all().any(|d| !d.taints.is_empty()) {
            max = max.min(limits.max_devices_with_taints);
        }
        if self.devices.len() + extra.len() > max {
            return false;
        }
        match limits.max_consumptions_per_slice {
            Some(cap) => {
                self.consumptions() + extra.iter().map(consumption_count).sum::<usize>() <= cap
            }
            None => true,
        }
    }
}

fn consumption_count(d: &Device) -> usize {
    d.consumes.as_ref().map_or(0, |c| c.counters.len())
}

/// Splits `model` into slice contents. Always at least one slice: a node
/// without devices publishes one empty slice, so the pool shows the driver
/// runs there.
pub fn split(model: &DeviceModel, limits: &Limits) -> Vec<SliceContent> {
    let model = without_none_taints(model, limits);
    let mut out = if limits.counters_in_own_slices {
        split_separate(&model, limits)
    } else {
        split_together(&model, limits)
    };
    if out.is_empty() {
        out.push(SliceContent::default());
    }
    for slice in &mut out {
        for d in &mut slice.devices {
            d.taints.truncate(limits.max_taints_per_device);
        }
    }
    out
}

/// `model` without taints of effect `None` when `limits` do not allow them
/// (borrowed unchanged otherwise).
fn without_none_taints<'a>(model: &'a DeviceModel, limits: &Limits) -> Cow<'a, DeviceModel> {
    let has_none = || {
        model
            .devices()
            .any(|d| d.taints.iter().any(|t| t.effect == TaintEffect::None))
    };
    if limits.taint_effect_none || !has_none() {
        return Cow::Borrowed(model);
    }
    let mut owned = model.clone();
    for group in &mut owned.groups {
        for d in &mut group.devices {
            d.taints.retain(|t| t.effect != TaintEffect::None);
        }
    }
    Cow::Owned(owned)
}

/// 1.35 rules.
fn split_separate(model: &DeviceModel, limits: &Limits) -> Vec<SliceContent> {
    let mut out = Vec::new();
    let mut current = SliceContent::default();
    for set in model.groups.iter().filter_map(|g| g.counter_set.as_ref()) {
        let full = current.counter_sets.len() + 1 > limits.max_counter_sets_per_slice
            || current.shared_counters() + set.counters.len()
                > limits.max_shared_counters_per_slice;
        if full && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        current.counter_sets.push(set.clone());
    }
    if !current.is_empty() {
        out.push(std::mem::take(&mut current));
    }
    for device in model.devices() {
        if !current.fits_devices(limits, std::slice::from_ref(device)) && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        current.devices.push(device.clone());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// 1.34 rules.
fn split_together(model: &DeviceModel, limits: &Limits) -> Vec<SliceContent> {
    let mut out = Vec::new();
    let mut current = SliceContent::default();
    for group in &model.groups {
        match &group.counter_set {
            Some(set) => {
                let fits = current.fits_devices(limits, &group.devices)
                    && current.counter_sets.len() < limits.max_counter_sets_per_slice
                    && current.shared_counters() + set.counters.len()
                        <= limits.max_shared_counters_per_slice;
                if !fits && !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                current.counter_sets.push(set.clone());
                current.devices.extend(group.devices.iter().cloned());
            }
            None => {
                for device in &group.devices {
                    if !current.fits_devices(limits, std::slice::from_ref(device))
                        && !current.is_empty()
                    {
                        out.push(std::mem::take(&mut current));
                    }
                    current.devices.push(device.clone());
                }
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests;
