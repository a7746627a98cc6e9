//! MIG devices of the model: canonical names, the existing MIG devices of
//! static mode, and under dynamic MIG every profile x placement with the GPU's
//! counter set and what each device consumes from it.
//!
//! Counter totals: each memory slice is a counter of value 1, so placements
//! that share a memory slice exclude each other (and the full GPU, which
//! consumes every slice). The other counters are sized so that any set of
//! placements NVML can create at once fits: for each resource the maximum over
//! profiles of (per-instance amount x instance count), and for memory at least
//! the GPU's total memory.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpu_dra_api::schema::{self, DeviceAttributes, DeviceKind, counters, names};
use gpu_nvml::{GpuInfo, MigInfo, MigPlacement, MigProfile};

use super::{CounterConsumption, CounterSet, Device, DeviceRef, GpuFacts, GroupLimits, Note};

/// Whether the GPU can switch MIG mode without a reset (compute capability 9
/// and later: Hopper, Blackwell). Ampere cannot.
pub(super) fn runtime_switchable(info: &GpuInfo) -> bool {
    info.cuda_compute_capability.0 >= 9
}

/// The profile part of a MIG device name: dots removed, lower case, anything
/// but `[a-z0-9-]` turned into `-`, no leading or trailing `-`
/// (`1g.10gb+me` becomes `1g10gb-me`).
pub fn profile_label(profile: &str) -> String {
    let mapped: String = profile
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_owned()
}

/// The canonical MIG device name
/// `gpu-<parent minor>-mig-<profile label>-<profile id>-<placement start>`, or
/// `None` when it would not be a valid device name (a DNS label).
pub fn device_name(
    parent_minor: u32,
    profile: &str,
    profile_id: u32,
    start: u32,
) -> Option<String> {
    let label = profile_label(profile);
    if label.is_empty() {
        return None;
    }
    let name = format!("gpu-{parent_minor}-mig-{label}-{profile_id}-{start}");
    schema::is_dns_label(&name).then_some(name)
}

/// Sets the attributes and capacities every MIG device has.
fn mig_attributes(
    facts: &GpuFacts<'_>,
    kind: DeviceKind,
    profile: &MigProfile,
    memory_bytes: u64,
) -> Result<DeviceAttributes, schema::SchemaError> {
    let mut a = DeviceAttributes::new(kind);
    a.set_string(names::PARENT_UUID, facts.gpu.info.uuid.clone())?;
    a.set_string(names::PROFILE, profile.name.clone())?;
    facts.set_common(&mut a)?;
    a.set_capacity(names::MULTIPROCESSORS, u64::from(profile.multiprocessors))?;
    a.set_capacity(names::COPY_ENGINES, u64::from(profile.copy_engines))?;
    a.set_capacity(names::DECODERS, u64::from(profile.decoders))?;
    a.set_capacity(names::ENCODERS, u64::from(profile.encoders))?;
    a.set_capacity(names::JPEG_ENGINES, u64::from(profile.jpeg_engines))?;
    a.set_capacity(names::OFA_ENGINES, u64::from(profile.ofa_engines))?;
    a.set_capacity(names::MEMORY, memory_bytes)?;
    Ok(a)
}

/// Why a profile cannot be published, if it cannot.
fn profile_problem(profile: &MigProfile) -> Option<String> {
    if profile.name.is_empty() || profile.name.len() > schema::MAX_STRING_LEN {
        return Some(format!(
            "profile name {:?} is empty or longer than {} bytes",
            profile.name,
            schema::MAX_STRING_LEN
        ));
    }
    if profile.memory_mib.checked_mul(1 << 20).is_none() {
        return Some(format!("memory of {} MiB overflows", profile.memory_mib));
    }
    None
}

/// The MIG devices that exist on a GPU in MIG mode (static mode).
///
/// A device is named per GPU instance (profile and placement), so a GPU
/// instance that is not exactly one MIG device cannot be published: one
/// split into several compute instances, or whose only compute instance
/// does not take all of it (when NVML tells). Such a GPU instance is left
/// out with one [`Note::MigInstanceSplit`].
pub(super) fn static_devices(
    facts: &GpuFacts<'_>,
    mig: &MigInfo,
    notes: &mut Vec<Note>,
) -> Vec<Device> {
    let info = &facts.gpu.info;
    let mut per_instance: HashMap<u32, usize> = HashMap::new();
    for dev in &mig.devices {
        *per_instance.entry(dev.gpu_instance_id).or_default() += 1;
    }
    let mut seen = HashSet::new();
    let mut noted = HashSet::new();
    let mut devices = Vec::with_capacity(mig.devices.len());
    for dev in &mig.devices {
        let skip = |reason: String| Note::MigSkipped {
            gpu: info.uuid.clone(),
            what: format!("MIG device {:?}", dev.uuid),
            reason,
        };
        let compute_instances = per_instance[&dev.gpu_instance_id];
        let partial = dev.compute_slices.filter(|s| !s.spans_gpu_instance());
        if compute_instances > 1 || partial.is_some() {
            if noted.insert(dev.gpu_instance_id) {
                notes.push(Note::MigInstanceSplit {
                    gpu: info.uuid.clone(),
                    minor: info.minor,
                    gpu_instance: dev.gpu_instance_id,
                    compute_instances,
                    slices: partial.map(|s| (s.compute_instance, s.gpu_instance)),
                });
            }
            continue;
        }
        let Some(profile) = mig.profiles.iter().find(|p| p.id == dev.profile_id) else {
            notes.push(skip(format!(
                "unknown GPU instance profile id {}",
                dev.profile_id
            )));
            continue;
        };
        if let Some(problem) = profile_problem(profile) {
            notes.push(skip(problem));
            continue;
        }
        if dev.uuid.is_empty() || dev.uuid.len() > schema::MAX_STRING_LEN {
            notes.push(skip(format!(
                "UUID is empty or longer than {} bytes",
                schema::MAX_STRING_LEN
            )));
            continue;
        }
        let Some(name) = device_name(info.minor, &profile.name, profile.id, dev.placement.start)
        else {
            notes.push(skip("its name would not be a valid device name".to_owned()));
            continue;
        };
        if !seen.insert(name.clone()) {
            notes.push(skip(format!(
                "another MIG device has the same placement ({name})"
            )));
            continue;
        }
        let built = mig_attributes(facts, DeviceKind::MigStatic, profile, dev.memory_bytes)
            .and_then(|mut a| {
                a.set_string(names::UUID, dev.uuid.clone())?;
                a.finish()
            });
        match built {
            Ok(attributes) => devices.push(Device {
                name,
                kind: DeviceKind::MigStatic,
                location: DeviceRef::Mig {
                    parent_minor: info.minor,
                    profile_id: profile.id,
                    placement_start: dev.placement.start,
                },
                attributes,
                consumes: None,
                taints: Vec::new(),
                memory_sharing: None,
            }),
            Err(e) => notes.push(skip(format!("invalid attributes: {e}"))),
        }
    }
    devices
}

/// The dynamic-MIG part of a GPU.
pub(super) struct Dynamic {
    /// `gpu-<minor>-counter-set`.
    pub counter_set: CounterSet,
    /// What the full GPU consumes: everything.
    pub full_gpu_consumption: CounterConsumption,
    /// One device per profile x placement.
    pub devices: Vec<Device>,
}

/// The per-instance amounts of a profile, by counter name.
fn profile_amounts(profile: &MigProfile) -> [(&'static str, u64); 7] {
    [
        (
            counters::MULTIPROCESSORS,
            u64::from(profile.multiprocessors),
        ),
        (counters::COPY_ENGINES, u64::from(profile.copy_engines)),
        (counters::DECODERS, u64::from(profile.decoders)),
        (counters::ENCODERS, u64::from(profile.encoders)),
        (counters::JPEG_ENGINES, u64::from(profile.jpeg_engines)),
        (counters::OFA_ENGINES, u64::from(profile.ofa_engines)),
        (counters::MEMORY, profile.memory_mib.saturating_mul(1 << 20)),
    ]
}

/// Every profile x placement of a MIG-capable GPU, with its counter set.
/// Fails (and the GPU is published without dynamic MIG) when NVML lists no
/// placement or the result would break the slice rules.
pub(super) fn dynamic(
    facts: &GpuFacts<'_>,
    mig: &MigInfo,
    limits: &GroupLimits,
    notes: &mut Vec<Note>,
) -> Result<Dynamic, String> {
    let info = &facts.gpu.info;
    let mut usable: Vec<(&MigProfile, Vec<MigPlacement>)> = Vec::new();
    for profile in &mig.profiles {
        if let Some(problem) = profile_problem(profile) {
            notes.push(Note::MigSkipped {
                gpu: info.uuid.clone(),
                what: format!("MIG profile {:?}", profile.name),
                reason: problem,
            });
            continue;
        }
        let mut placements = Vec::new();
        for p in &profile.placements {
            if p.size == 0 || p.start.checked_add(p.size).is_none() {
                notes.push(Note::MigSkipped {
                    gpu: info.uuid.clone(),
                    what: format!(
                        "placement {}:{} of MIG profile {}",
                        p.start, p.size, profile.name
                    ),
                    reason: "empty or out-of-range placement".to_owned(),
                });
                continue;
            }
            placements.push(*p);
        }
        if !placements.is_empty() {
            usable.push((profile, placements));
        }
    }
    let memory_slices = usable
        .iter()
        .flat_map(|(_, ps)| ps.iter().map(|p| p.start + p.size))
        .max()
        .ok_or_else(|| "NVML lists no MIG placement for this GPU".to_owned())?;

    let base_counters = schema::COUNTERS.len();
    let set_size = base_counters + memory_slices as usize;
    if set_size > limits.max_counters_per_set || set_size > limits.max_counters_per_device {
        return Err(format!(
            "{memory_slices} memory slices make a counter set of {set_size} counters, the limit is {}",
            limits
                .max_counters_per_set
                .min(limits.max_counters_per_device)
        ));
    }

    // Totals.
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for (name, _) in profile_amounts(usable[0].0) {
        totals.insert(name.to_owned(), 0);
    }
    for (profile, _) in &usable {
        let instances = u64::from(profile.instance_count.max(1));
        for (name, amount) in profile_amounts(profile) {
            let total = totals.get_mut(name).expect("all counters inserted above");
            *total = (*total).max(amount.saturating_mul(instances));
        }
    }
    let memory_total = totals
        .get_mut(counters::MEMORY)
        .expect("memory counter inserted above");
    *memory_total = (*memory_total).max(info.memory_bytes);
    for slice in 0..memory_slices {
        totals.insert(counters::memory_slice(slice), 1);
    }
    let set_name = counters::counter_set(info.minor);
    let full_gpu_consumption = CounterConsumption {
        counter_set: set_name.clone(),
        counters: totals
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
    };

    let mut seen = HashSet::new();
    let mut devices = Vec::new();
    for (profile, placements) in &usable {
        for p in placements {
            let what = || {
                format!(
                    "placement {}:{} of MIG profile {}",
                    p.start, p.size, profile.name
                )
            };
            let Some(name) = device_name(info.minor, &profile.name, profile.id, p.start) else {
                notes.push(Note::MigSkipped {
                    gpu: info.uuid.clone(),
                    what: what(),
                    reason: "its name would not be a valid device name".to_owned(),
                });
                continue;
            };
            if !seen.insert(name.clone()) {
                notes.push(Note::MigSkipped {
                    gpu: info.uuid.clone(),
                    what: what(),
                    reason: format!("listed twice ({name})"),
                });
                continue;
            }
            let mut consumed: BTreeMap<String, u64> = profile_amounts(profile)
                .into_iter()
                .filter(|(_, v)| *v > 0)
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            for slice in p.start..p.start + p.size {
                consumed.insert(counters::memory_slice(slice), 1);
            }
            let memory = profile.memory_mib.saturating_mul(1 << 20);
            let attributes = match mig_attributes(facts, DeviceKind::MigDynamic, profile, memory)
                .and_then(DeviceAttributes::finish)
            {
                Ok(a) => a,
                Err(e) => {
                    notes.push(Note::MigSkipped {
                        gpu: info.uuid.clone(),
                        what: what(),
                        reason: format!("invalid attributes: {e}"),
                    });
                    continue;
                }
            };
            devices.push(Device {
                name,
                kind: DeviceKind::MigDynamic,
                location: DeviceRef::Mig {
                    parent_minor: info.minor,
                    profile_id: profile.id,
                    placement_start: p.start,
                },
                attributes,
                consumes: Some(CounterConsumption {
                    counter_set: set_name.clone(),
                    counters: consumed,
                }),
                taints: Vec::new(),
                memory_sharing: None,
            });
        }
    }

    // Rules that bind when a GPU's devices must share one slice (1.34).
    let device_count = devices.len() + 1;
    if let Some(max) = limits.max_devices_per_group
        && device_count > max
    {
        return Err(format!(
            "{device_count} devices would have to share one ResourceSlice, the limit is {max}"
        ));
    }
    let consumptions: usize = devices
        .iter()
        .filter_map(|d| d.consumes.as_ref())
        .map(|c| c.counters.len())
        .sum::<usize>()
        + full_gpu_consumption.counters.len();
    if let Some(max) = limits.max_consumptions_per_group
        && consumptions > max
    {
        return Err(format!(
            "{consumptions} counter consumptions would have to share one ResourceSlice, the limit is {max}"
        ));
    }

    Ok(Dynamic {
        counter_set: CounterSet {
            name: set_name,
            counters: totals,
        },
        full_gpu_consumption,
        devices,
    })
}
