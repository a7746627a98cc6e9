//! The device model: turns what discovery found ([`Inventory`]) into the
//! devices the driver publishes: full GPUs, static MIG devices and dynamic MIG
//! placements with their shared counters. Independent of the Kubernetes API
//! types (see [`k8s`] for the conversion), so it is cheap to build, compare and
//! test.
//!
//! Which devices a GPU yields (the same choice as NVIDIA's driver):
//! - static mode (default): a GPU with MIG mode off is one full GPU
//!   (`gpu-<minor>`); a GPU with MIG mode on yields its existing MIG devices
//!   and no full GPU (it cannot be used whole).
//! - dynamic MIG (`--dynamic-mig`): a MIG-capable GPU whose MIG mode can be
//!   switched without a reset (compute capability 9 and later: Hopper,
//!   Blackwell) yields the full GPU plus every profile x placement, all
//!   consuming the GPU's counter set `gpu-<minor>-counter-set`, so the
//!   scheduler never hands out overlapping placements, or a placement and the
//!   whole GPU. An Ampere GPU needs a reset to switch MIG mode, so it keeps its
//!   current mode: with MIG on it yields every placement (no full GPU), with
//!   MIG off just the full GPU. Existing MIG devices are not published
//!   separately in dynamic mode: they are placements, with the same names.
//!
//! Memory-fraction sharing (`--memory-sharing`, [`sharing`]): a shared GPU is
//! published as its full GPU only (no MIG devices or placements, even with
//! dynamic MIG), with `allowMultipleAllocations` and a request policy on its
//! `memory` capacity ([`Device::memory_sharing`]). A GPU that cannot be used
//! whole (MIG mode on, and not switchable under dynamic MIG) is published as
//! usual, with a note.
//!
//! Consumable shares (`--consumable-shares`, NVIDIA's names, [`shares`]):
//! the same publication for every GPU of the node, with NVIDIA's request
//! policies, also on static MIG devices; `memory` mode is enforced the same
//! way on full GPUs ([`SharedDevice::enforced`]).
//!
//! Every attribute goes through [`gpu_dra_api::schema::DeviceAttributes`], so
//! nothing outside the schema table is ever published.
//!
//! Problems with the input never abort the build: the offending GPU, MIG
//! device or profile is left out (or the attribute omitted or cut) and a
//! [`Note`] says why; the publisher logs the notes.

mod mig;
mod nvlink;
pub mod vfio;

pub mod k8s;
pub mod shares;
pub mod sharing;

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use gpu_dra_api::schema::{self, CheckedAttributes, DeviceAttributes, DeviceKind, names};

use crate::discovery::{DiscoveredGpu, Inventory};

pub use mig::{device_name as mig_device_name, profile_label};
pub(crate) use nvlink::fnv1a;
pub use nvlink::{domain_id, nvlink_domains};
pub use shares::ConsumableShares;
pub use sharing::{GpuSelector, MemoryRequestPolicy, MemorySharing, SharedDevice};

/// The devices of one node, grouped by physical GPU, in inventory order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceModel {
    /// One group per published GPU.
    pub groups: Vec<GpuGroup>,
    /// What was left out or changed, and why.
    pub notes: Vec<Note>,
}

/// The devices of one physical GPU, and its counter set under dynamic MIG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuGroup {
    /// Device minor of the GPU.
    pub minor: u32,
    /// UUID of the GPU.
    pub uuid: String,
    /// The shared counters its devices consume (dynamic MIG only).
    pub counter_set: Option<CounterSet>,
    /// Its devices: the full GPU first (when published), then MIG devices.
    pub devices: Vec<Device>,
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Device name, a DNS label unique in the pool.
    pub name: String,
    /// Full GPU, static or dynamic MIG device.
    pub kind: DeviceKind,
    /// Where it lives and what it is, for the prepare code.
    pub location: DeviceRef,
    /// Attributes and capacities, checked against the schema.
    pub attributes: CheckedAttributes,
    /// Counters it consumes (dynamic MIG only).
    pub consumes: Option<CounterConsumption>,
    /// Taints (from health checks); empty when healthy.
    pub taints: Vec<Taint>,
    /// Set when several claims can share the device (memory-fraction
    /// sharing or consumable shares): it is published with
    /// `allowMultipleAllocations`, and each allocation consumes part of its
    /// `memory` capacity per this policy (the claim's `consumedCapacity`),
    /// and of its `shares` if it has them. Full GPUs, and static MIG devices
    /// under consumable shares.
    pub memory_sharing: Option<SharedDevice>,
}

/// A named set of shared counters (`gpu-<minor>-counter-set`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSet {
    /// Counter set name, a DNS label unique in the pool.
    pub name: String,
    /// Counter name to total value.
    pub counters: BTreeMap<String, u64>,
}

/// What a device takes from a counter set when allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterConsumption {
    /// The counter set.
    pub counter_set: String,
    /// Counter name to consumed value.
    pub counters: BTreeMap<String, u64>,
}

/// A device taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    /// Label-name-like key, e.g. `gpu.nvidia.com/xid`.
    pub key: String,
    /// Optional label-value-like value.
    pub value: Option<String>,
    /// What the taint does.
    pub effect: TaintEffect,
}

/// Effect of a [`Taint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// Informational only (Kubernetes 1.35 and later; dropped before
    /// publishing to a 1.34 API server, see [`crate::slices::split`]).
    None,
    /// No new allocations.
    NoSchedule,
    /// No new allocations, and running pods are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The API's name of the effect.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// Identifies a device by what it is made of; parsed back from device names
/// by the prepare code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceRef {
    /// Full GPU `gpu-<minor>`.
    Gpu {
        /// Device minor.
        minor: u32,
    },
    /// MIG device `gpu-<minor>-mig-<profile>-<profile id>-<placement start>`.
    Mig {
        /// Device minor of the parent GPU.
        parent_minor: u32,
        /// GPU instance profile id.
        profile_id: u32,
        /// First memory slice of the placement.
        placement_start: u32,
    },
    /// VFIO passthrough GPU `gpu-vfio-<index>` (`--passthrough`). Its name
    /// holds the NVML index only, so [`DeviceRef::parse`] does not return
    /// it.
    Vfio {
        /// Device minor of the GPU.
        minor: u32,
        /// NVML index of the GPU.
        index: u32,
    },
}

impl DeviceRef {
    /// Parses a device name published by this driver. Returns `None` for any
    /// other string (including non-canonical numbers such as `gpu-01`).
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        let number = |s: &str| -> Option<u32> {
            if s.is_empty()
                || !s.bytes().all(|b| b.is_ascii_digit())
                || (s.len() > 1 && s.starts_with('0'))
            {
                return None;
            }
            s.parse().ok()
        };
        let Some((minor, mig)) = rest.split_once("-mig-") else {
            return Some(Self::Gpu {
                minor: number(rest)?,
            });
        };
        let mut tail = mig.rsplitn(3, '-');
        let start = number(tail.next()?)?;
        let profile_id = number(tail.next()?)?;
        let profile = tail.next()?;
        if profile.is_empty() {
            return None;
        }
        Some(Self::Mig {
            parent_minor: number(minor)?,
            profile_id,
            placement_start: start,
        })
    }
}

/// What the device model left out or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The driver version could not be made semver; `driverVersion` is omitted.
    DriverVersion {
        /// NVML's version string.
        version: String,
    },
    /// sysfs had no PCIe root for the GPU; `pcieRoot` is omitted.
    PcieRootUnknown {
        /// GPU UUID.
        gpu: String,
    },
    /// sysfs had no NUMA node for the GPU; `numaNode` is omitted.
    NumaNodeUnknown {
        /// GPU UUID.
        gpu: String,
    },
    /// A descriptive value was longer than Kubernetes allows and was cut.
    Truncated {
        /// GPU UUID.
        gpu: String,
        /// Attribute name.
        attribute: &'static str,
        /// The full value.
        value: String,
    },
    /// An optional value was unusable and the attribute is omitted.
    AttributeOmitted {
        /// GPU UUID.
        gpu: String,
        /// Attribute name.
        attribute: &'static str,
        /// Why.
        reason: String,
    },
    /// A whole GPU (and everything on it) is not published.
    GpuSkipped {
        /// GPU UUID (or index when the UUID is unusable).
        gpu: String,
        /// Why.
        reason: String,
    },
    /// One MIG device, profile or placement is not published.
    MigSkipped {
        /// Parent GPU UUID.
        gpu: String,
        /// What was skipped.
        what: String,
        /// Why.
        reason: String,
    },
    /// A GPU instance that is not exactly one MIG device (split into several
    /// compute instances, or with one that does not take all of it) is not
    /// published: a device name stands for a whole GPU instance.
    MigInstanceSplit {
        /// Parent GPU UUID.
        gpu: String,
        /// Device minor of the parent GPU.
        minor: u32,
        /// GPU instance id.
        gpu_instance: u32,
        /// Compute instances in it.
        compute_instances: usize,
        /// For a single partial compute instance: its compute slices and the
        /// GPU instance's.
        slices: Option<(u32, u32)>,
    },
    /// Dynamic MIG was asked for, but this GPU is published without it.
    DynamicMigUnavailable {
        /// GPU UUID.
        gpu: String,
        /// Why.
        reason: String,
    },
    /// Memory sharing was asked for this GPU, but it is published unshared.
    MemorySharingUnavailable {
        /// GPU UUID.
        gpu: String,
        /// Why.
        reason: String,
    },
    /// `--memory-sharing` names a GPU the node does not have (or that is
    /// not published).
    MemorySharingUnmatched {
        /// The index or UUID as given.
        selector: String,
    },
    /// `--passthrough` is on, but this GPU has no VFIO device.
    PassthroughUnavailable {
        /// GPU UUID.
        gpu: String,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverVersion { version } => write!(
                f,
                "driver version {version:?} is not semver-compatible: driverVersion omitted"
            ),
            Self::PcieRootUnknown { gpu } => {
                write!(f, "GPU {gpu}: sysfs has no PCIe root: pcieRoot omitted")
            }
            Self::NumaNodeUnknown { gpu } => {
                write!(f, "GPU {gpu}: sysfs has no NUMA node: numaNode omitted")
            }
            Self::Truncated {
                gpu,
                attribute,
                value,
            } => write!(
                f,
                "GPU {gpu}: {attribute} {value:?} is longer than {} bytes and was cut",
                schema::MAX_STRING_LEN
            ),
            Self::AttributeOmitted {
                gpu,
                attribute,
                reason,
            } => write!(f, "GPU {gpu}: {attribute} omitted: {reason}"),
            Self::GpuSkipped { gpu, reason } => write!(f, "GPU {gpu} not published: {reason}"),
            Self::MigSkipped { gpu, what, reason } => {
                write!(f, "GPU {gpu}: {what} not published: {reason}")
            }
            Self::MigInstanceSplit {
                gpu,
                minor,
                gpu_instance,
                compute_instances,
                slices,
            } => match slices {
                Some((ci, gi)) if *compute_instances == 1 => write!(
                    f,
                    "GPU instance {gpu_instance} on gpu-{minor} ({gpu}) has one compute instance \
                     taking {ci} of its {gi} compute slices: not published; publish it by \
                     recreating it with one compute instance that takes all of it"
                ),
                _ => write!(
                    f,
                    "GPU instance {gpu_instance} on gpu-{minor} ({gpu}) is split into \
                     {compute_instances} compute instances: not published; publish it by \
                     recreating it with one compute instance"
                ),
            },
            Self::DynamicMigUnavailable { gpu, reason } => {
                write!(f, "GPU {gpu}: published without dynamic MIG: {reason}")
            }
            Self::MemorySharingUnavailable { gpu, reason } => {
                write!(f, "GPU {gpu}: published without memory sharing: {reason}")
            }
            Self::MemorySharingUnmatched { selector } => write!(
                f,
                "--memory-sharing names GPU {selector}, which this node does not publish"
            ),
            Self::PassthroughUnavailable { gpu, reason } => {
                write!(f, "GPU {gpu}: not offered for VFIO passthrough: {reason}")
            }
        }
    }
}

/// Per-GPU limits of the slice rules that a dynamic-MIG GPU must respect,
/// because all its devices share one counter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimits {
    /// Counters in one counter set.
    pub max_counters_per_set: usize,
    /// Counters one device consumes.
    pub max_counters_per_device: usize,
    /// Devices of one GPU, when its devices must share a slice with its
    /// counter set (1.34 rules); `None` when they may spread over slices.
    pub max_devices_per_group: Option<usize>,
    /// Counter consumptions of one GPU's devices, when they must share a slice
    /// (1.34 rules).
    pub max_consumptions_per_group: Option<usize>,
}

impl Default for GroupLimits {
    fn default() -> Self {
        Self {
            max_counters_per_set: 32,
            max_counters_per_device: 32,
            max_devices_per_group: None,
            max_consumptions_per_group: None,
        }
    }
}

/// How to build the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BuildOptions {
    /// Publish MIG profile x placements as partitionable devices.
    pub dynamic_mig: bool,
    /// Limits a dynamic-MIG GPU must fit in.
    pub group_limits: GroupLimits,
    /// The GPUs shared by memory fraction.
    pub memory_sharing: MemorySharing,
    /// NVIDIA's consumable shares: every GPU and static MIG device shared.
    pub consumable_shares: ConsumableShares,
    /// `--passthrough`: whole GPUs also published as VFIO devices, with
    /// the facts read at start ([`vfio`]).
    pub passthrough: Option<crate::vfio::Passthrough>,
}

impl DeviceModel {
    /// Builds the model of `inventory`.
    pub fn build(inventory: &Inventory, options: &BuildOptions) -> Self {
        let mut notes = Vec::new();
        let driver_version = schema::semver_from_nvml(&inventory.system.driver_version).ok();
        if driver_version.is_none() {
            notes.push(Note::DriverVersion {
                version: inventory.system.driver_version.clone(),
            });
        }
        let system = SystemFacts {
            driver_version,
            cuda_driver_version: schema::semver_from_pair(inventory.system.cuda_driver_version),
        };

        let gpus = accepted_gpus(&inventory.gpus, &mut notes);
        let domains = nvlink_domains(&gpus.iter().map(|g| &g.info).collect::<Vec<_>>());

        let infos: Vec<&gpu_nvml::GpuInfo> = gpus.iter().map(|g| &g.info).collect();
        for selector in options.memory_sharing.unmatched(&infos) {
            notes.push(Note::MemorySharingUnmatched {
                selector: selector.to_string(),
            });
        }
        let mut groups = Vec::with_capacity(gpus.len());
        for (gpu, domain) in gpus.iter().zip(domains) {
            let facts = GpuFacts::new(gpu, &system, &mut notes);
            match build_group(gpu, &facts, &domain, options, &mut notes) {
                Ok(mut group) => {
                    if let Some(passthrough) = &options.passthrough {
                        vfio::add(&mut group, &facts, passthrough, &mut notes);
                    }
                    groups.push(group);
                }
                Err(reason) => notes.push(Note::GpuSkipped {
                    gpu: gpu.info.uuid.clone(),
                    reason,
                }),
            }
        }
        Self { groups, notes }
    }

    /// All devices, in publication order.
    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.groups.iter().flat_map(|g| g.devices.iter())
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices().find(|d| d.name == name)
    }

    /// Replaces every device's taints with those in `taints` (by device name;
    /// devices not named there become untainted).
    pub fn set_taints(&mut self, taints: &BTreeMap<String, Vec<Taint>>) {
        for group in &mut self.groups {
            for device in &mut group.devices {
                device.taints = taints.get(&device.name).cloned().unwrap_or_default();
            }
        }
    }
}

/// Node-wide attribute values.
struct SystemFacts {
    driver_version: Option<String>,
    cuda_driver_version: String,
}

/// The attribute values a GPU shares with its MIG devices, already fitted to
/// the schema's limits.
struct GpuFacts<'a> {
    gpu: &'a DiscoveredGpu,
    system: &'a SystemFacts,
    product_name: String,
    brand: String,
    architecture: String,
    addressing_mode: Option<String>,
    pcie_root: Option<String>,
}

impl<'a> GpuFacts<'a> {
    fn new(gpu: &'a DiscoveredGpu, system: &'a SystemFacts, notes: &mut Vec<Note>) -> Self {
        let uuid = &gpu.info.uuid;
        let mut fit = |attribute: &'static str, value: &str| {
            let (fitted, cut) = schema::fit_string(value);
            if cut {
                notes.push(Note::Truncated {
                    gpu: uuid.clone(),
                    attribute,
                    value: value.to_owned(),
                });
            }
            fitted
        };
        let product_name = fit(names::PRODUCT_NAME, &gpu.info.product_name);
        let brand = fit(names::BRAND, &gpu.info.brand);
        let architecture = fit(names::ARCHITECTURE, &gpu.info.architecture);
        let addressing_mode = gpu
            .info
            .addressing_mode
            .as_deref()
            .map(|m| fit(names::ADDRESSING_MODE, m));
        let pcie_root = match &gpu.pcie_root {
            None => {
                notes.push(Note::PcieRootUnknown { gpu: uuid.clone() });
                None
            }
            // An identifier: a cut value would be wrong, so leave it out.
            Some(root) if root.is_empty() || root.len() > schema::MAX_STRING_LEN => {
                notes.push(Note::AttributeOmitted {
                    gpu: uuid.clone(),
                    attribute: names::PCIE_ROOT,
                    reason: format!(
                        "{root:?} is empty or longer than {} bytes",
                        schema::MAX_STRING_LEN
                    ),
                });
                None
            }
            Some(root) => Some(root.clone()),
        };
        if gpu.numa_node.is_none() {
            notes.push(Note::NumaNodeUnknown { gpu: uuid.clone() });
        }
        Self {
            gpu,
            system,
            product_name,
            brand,
            architecture,
            addressing_mode,
            pcie_root,
        }
    }

    /// Sets the attributes a full GPU and its MIG devices share.
    fn set_common(&self, a: &mut DeviceAttributes) -> Result<(), schema::SchemaError> {
        let info = &self.gpu.info;
        a.set_string(names::PRODUCT_NAME, self.product_name.clone())?;
        a.set_string(names::BRAND, self.brand.clone())?;
        a.set_string(names::ARCHITECTURE, self.architecture.clone())?;
        a.set_version(
            names::CUDA_COMPUTE_CAPABILITY,
            schema::semver_from_pair(info.cuda_compute_capability),
        )?;
        if let Some(v) = &self.system.driver_version {
            a.set_version(names::DRIVER_VERSION, v.clone())?;
        }
        a.set_version(
            names::CUDA_DRIVER_VERSION,
            self.system.cuda_driver_version.clone(),
        )?;
        a.set_string(names::PCI_BUS_ID, info.pci_bus_id.clone())?;
        if let Some(root) = &self.pcie_root {
            a.set_string(names::PCIE_ROOT, root.clone())?;
        }
        if let Some(numa) = self.gpu.numa_node {
            a.set_int(names::NUMA_NODE, numa)?;
        }
        if let Some(mode) = &self.addressing_mode {
            a.set_string(names::ADDRESSING_MODE, mode.clone())?;
        }
        Ok(())
    }
}

/// The GPUs whose identity is usable: UUID and PCI bus id within the string
/// limit, and UUID and minor unique. Others are skipped with a note.
fn accepted_gpus<'a>(gpus: &'a [DiscoveredGpu], notes: &mut Vec<Note>) -> Vec<&'a DiscoveredGpu> {
    let mut uuids = HashSet::new();
    let mut minors = HashSet::new();
    let mut out = Vec::with_capacity(gpus.len());
    for gpu in gpus {
        let info = &gpu.info;
        let label = if info.uuid.is_empty() || info.uuid.len() > schema::MAX_STRING_LEN {
            format!("index {}", info.index)
        } else {
            info.uuid.clone()
        };
        let reason = if info.uuid.is_empty() || info.uuid.len() > schema::MAX_STRING_LEN {
            Some(format!(
                "UUID {:?} is empty or longer than {} bytes",
                info.uuid,
                schema::MAX_STRING_LEN
            ))
        } else if info.pci_bus_id.is_empty() || info.pci_bus_id.len() > schema::MAX_STRING_LEN {
            Some(format!(
                "PCI bus id {:?} is empty or too long",
                info.pci_bus_id
            ))
        } else if !uuids.insert(info.uuid.as_str()) {
            Some("another GPU has the same UUID".to_owned())
        } else if !minors.insert(info.minor) {
            Some(format!(
                "another GPU has the same minor number {}",
                info.minor
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => notes.push(Note::GpuSkipped { gpu: label, reason }),
            None => out.push(gpu),
        }
    }
    out
}

/// Builds the devices of one GPU.
fn build_group(
    gpu: &DiscoveredGpu,
    facts: &GpuFacts<'_>,
    nvlink_domain: &str,
    options: &BuildOptions,
    notes: &mut Vec<Note>,
) -> Result<GpuGroup, String> {
    let info = &gpu.info;
    let mut group = GpuGroup {
        minor: info.minor,
        uuid: info.uuid.clone(),
        counter_set: None,
        devices: Vec::new(),
    };
    let full_gpu =
        || full_gpu_device(facts, nvlink_domain).map_err(|e| format!("invalid attributes: {e}"));

    let shares = options.consumable_shares;
    if shares.enabled() {
        // A GPU that can be used whole is published whole, shared; one
        // with MIG mode on falls through to its MIG devices, shared below.
        match whole_usable(info, options.dynamic_mig) {
            Ok(()) => {
                let mut full = full_gpu()?;
                if let Err(reason) = share_device(&mut full, shares) {
                    notes.push(Note::MemorySharingUnavailable {
                        gpu: info.uuid.clone(),
                        reason,
                    });
                }
                group.devices.push(full);
                return Ok(group);
            }
            // Under dynamic MIG its placements are published, unshared.
            Err(_) if !options.dynamic_mig => {
                if let Some(mig_info) = info.mig.as_ref().filter(|m| m.current_enabled) {
                    group.devices = mig::static_devices(facts, mig_info, notes);
                    for device in &mut group.devices {
                        if let Err(reason) = share_device(device, shares) {
                            notes.push(Note::MemorySharingUnavailable {
                                gpu: format!("{} ({})", info.uuid, device.name),
                                reason,
                            });
                        }
                    }
                    return Ok(group);
                }
            }
            Err(_) => {}
        }
    } else if options.memory_sharing.selects(info) {
        match shareable(info, options.dynamic_mig) {
            Ok(policy) => {
                let mut full = full_gpu()?;
                full.memory_sharing = Some(SharedDevice::memory_fraction(policy));
                group.devices.push(full);
                return Ok(group);
            }
            Err(reason) => notes.push(Note::MemorySharingUnavailable {
                gpu: info.uuid.clone(),
                reason,
            }),
        }
    }

    if options.dynamic_mig
        && let Some(mig_info) = &info.mig
    {
        match mig::dynamic(facts, mig_info, &options.group_limits, notes) {
            Ok(dynamic) => {
                // Hopper and later switch MIG mode at once: the full GPU stays
                // available and consumes everything. Ampere keeps its mode.
                if mig::runtime_switchable(info) {
                    let mut full = full_gpu()?;
                    full.consumes = Some(dynamic.full_gpu_consumption);
                    group.devices.push(full);
                    group.devices.extend(dynamic.devices);
                    group.counter_set = Some(dynamic.counter_set);
                    return Ok(group);
                }
                if mig_info.current_enabled {
                    group.devices.extend(dynamic.devices);
                    group.counter_set = Some(dynamic.counter_set);
                    return Ok(group);
                }
                notes.push(Note::DynamicMigUnavailable {
                    gpu: info.uuid.clone(),
                    reason: "MIG mode is off and this GPU needs a reset to enable it".to_owned(),
                });
            }
            Err(reason) => notes.push(Note::DynamicMigUnavailable {
                gpu: info.uuid.clone(),
                reason,
            }),
        }
    }

    match &info.mig {
        Some(mig_info) if mig_info.current_enabled => {
            group.devices = mig::static_devices(facts, mig_info, notes);
        }
        _ => group.devices.push(full_gpu()?),
    }
    Ok(group)
}

/// The memory request policy of a GPU that can be shared, or why it cannot:
/// it must be usable whole (MIG mode off, or switchable at prepare time
/// under dynamic MIG) and have at least 1 GiB.
fn shareable(info: &gpu_nvml::GpuInfo, dynamic_mig: bool) -> Result<MemoryRequestPolicy, String> {
    whole_usable(info, dynamic_mig)?;
    MemoryRequestPolicy::for_memory(info.memory_bytes)
}

/// Publishes `device` for consumable shares in mode `shares` (enabled):
/// NVIDIA's memory request policy, and the `shares` capacity in `<N>`
/// mode. Enforced (MPS limits) in `memory` mode on full GPUs. Unchanged,
/// with the reason, when its memory is too small for a request policy.
fn share_device(device: &mut Device, shares: ConsumableShares) -> Result<(), String> {
    let memory = device
        .attributes
        .capacity
        .get(names::MEMORY)
        .copied()
        .unwrap_or(0);
    let policy = shares.memory_policy(memory).ok_or_else(|| {
        format!("{memory} bytes of memory is too little to share (2 MiB at least)")
    })?;
    if let Some(n) = shares.shares() {
        device
            .attributes
            .capacity
            .insert(names::SHARES, u64::from(n));
    }
    device.memory_sharing = Some(SharedDevice {
        memory: policy,
        shares: shares.shares(),
        enforced: shares.enforces_memory() && device.kind == DeviceKind::Gpu,
    });
    Ok(())
}

/// Whether a GPU can be used whole: MIG mode off, or switchable at
/// prepare time under dynamic MIG; else why not.
fn whole_usable(info: &gpu_nvml::GpuInfo, dynamic_mig: bool) -> Result<(), String> {
    if let Some(mig) = &info.mig
        && mig.current_enabled
        && !(dynamic_mig && mig::runtime_switchable(info))
    {
        return Err(if dynamic_mig {
            "MIG mode is on and this GPU needs a reset to turn it off".to_owned()
        } else {
            "MIG mode is on (with --dynamic-mig, Hopper and later GPUs can be shared)".to_owned()
        });
    }
    Ok(())
}

/// The full GPU device `gpu-<minor>`.
fn full_gpu_device(
    facts: &GpuFacts<'_>,
    nvlink_domain: &str,
) -> Result<Device, schema::SchemaError> {
    let info = &facts.gpu.info;
    let mut a = DeviceAttributes::new(DeviceKind::Gpu);
    a.set_string(names::UUID, info.uuid.clone())?;
    a.set_int(names::INDEX, i64::from(info.index))?;
    facts.set_common(&mut a)?;
    a.set_string(names::NVLINK_DOMAIN, nvlink_domain)?;
    a.set_int(names::NVLINK_COUNT, info.nvlinks.len() as i64)?;
    a.set_capacity(names::MEMORY, info.memory_bytes)?;
    Ok(Device {
        name: format!("gpu-{}", info.minor),
        kind: DeviceKind::Gpu,
        location: DeviceRef::Gpu { minor: info.minor },
        attributes: a.finish()?,
        consumes: None,
        taints: Vec::new(),
        memory_sharing: None,
    })
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
