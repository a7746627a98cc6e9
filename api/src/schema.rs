//! The attribute schema of published devices: every attribute and capacity the
//! kubelet plugin puts on a device, its value type, the device kinds that carry
//! it, and a description for users.
//!
//! [`SCHEMA`] is the single source of truth. The plugin builds every device's
//! attributes and capacities through [`DeviceAttributes`], which refuses names
//! that are not in the table, values of the wrong type, entries on device kinds
//! that do not carry them, values Kubernetes would reject, and a device that
//! lacks an entry the table says is always there. The CEL validation of the
//! controller reads the same table to type-check selectors, and
//! [`markdown_table`] renders it for the user documentation.
//!
//! Names without a `/` belong to the driver's own domain (CEL sees them under
//! `device.attributes["<driver name>"]`); qualified names such as
//! `resource.kubernetes.io/pcieRoot` are standard Kubernetes attributes.
//! This module is free of Kubernetes API types on purpose.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

/// Domain of the device attributes standardised by Kubernetes.
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";
/// Maximum length, in bytes, of a string attribute value (Kubernetes validation).
pub const MAX_STRING_LEN: usize = 64;
/// Maximum length, in bytes, of a version attribute value (Kubernetes validation).
pub const MAX_VERSION_LEN: usize = 64;
/// Maximum number of attributes and capacities of one device, combined.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;

/// Attribute and capacity names, as published (see [`SCHEMA`] for their meaning).
pub mod names {
    /// `gpu`, `mig` or `vfio`.
    pub const TYPE: &str = "type";
    /// `GPU-...` or `MIG-...` UUID.
    pub const UUID: &str = "uuid";
    /// UUID of the GPU a MIG device lives on.
    pub const PARENT_UUID: &str = "parentUUID";
    /// MIG profile, e.g. `1g.10gb`.
    pub const PROFILE: &str = "profile";
    /// NVML index of a full GPU.
    pub const INDEX: &str = "index";
    /// Marketing name of the GPU.
    pub const PRODUCT_NAME: &str = "productName";
    /// Brand of the GPU.
    pub const BRAND: &str = "brand";
    /// Architecture name.
    pub const ARCHITECTURE: &str = "architecture";
    /// CUDA compute capability as a version.
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// Kernel driver version as a version.
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// CUDA driver API version as a version.
    pub const CUDA_DRIVER_VERSION: &str = "cudaDriverVersion";
    /// Addressing mode (`HMM`/`ATS`).
    pub const ADDRESSING_MODE: &str = "addressingMode";
    /// Standard Kubernetes attribute: PCI bus id.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// Standard Kubernetes attribute: PCIe root complex.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
    /// NUMA node of the GPU.
    pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
    /// Identifier of the GPU's NVLink domain.
    pub const NVLINK_DOMAIN: &str = "nvlinkDomain";
    /// Number of active NVLinks of the GPU.
    pub const NVLINK_COUNT: &str = "nvlinkCount";
    /// PCI device id of a VFIO GPU, hex (`0x2330`).
    pub const DEVICE_ID: &str = "deviceID";
    /// PCI vendor id of a VFIO GPU, hex (`0x10de`).
    pub const VENDOR_ID: &str = "vendorID";
    /// Whether the node offers iommufd (`/dev/iommu`) for a VFIO GPU.
    pub const IOMMU_FD_ENABLED: &str = "iommuFDEnabled";

    /// Capacity: memory in bytes.
    pub const MEMORY: &str = "memory";
    /// Capacity: memory a VFIO GPU's guest can address, in bytes.
    pub const ADDRESSABLE_MEMORY: &str = "addressableMemory";
    /// Capacity: streaming multiprocessors.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// Capacity: copy engines.
    pub const COPY_ENGINES: &str = "copyEngines";
    /// Capacity: video decoders.
    pub const DECODERS: &str = "decoders";
    /// Capacity: video encoders.
    pub const ENCODERS: &str = "encoders";
    /// Capacity: JPEG engines.
    pub const JPEG_ENGINES: &str = "jpegEngines";
    /// Capacity: optical flow accelerators.
    pub const OFA_ENGINES: &str = "ofaEngines";
    /// Capacity: consumable shares of the device (`--consumable-shares=<N>`).
    pub const SHARES: &str = "shares";
}

/// Values of the `type` attribute.
pub mod device_types {
    /// A full GPU.
    pub const GPU: &str = "gpu";
    /// A MIG device (static or dynamic).
    pub const MIG: &str = "mig";
    /// A full GPU for VFIO passthrough (`--passthrough`).
    pub const VFIO: &str = "vfio";
}

/// Names of the shared counters of a dynamic-MIG GPU's counter set.
pub mod counters {
    /// Streaming multiprocessors.
    pub const MULTIPROCESSORS: &str = "multiprocessors";
    /// Copy engines.
    pub const COPY_ENGINES: &str = "copy-engines";
    /// Video decoders.
    pub const DECODERS: &str = "decoders";
    /// Video encoders.
    pub const ENCODERS: &str = "encoders";
    /// JPEG engines.
    pub const JPEG_ENGINES: &str = "jpeg-engines";
    /// Optical flow accelerators.
    pub const OFA_ENGINES: &str = "ofa-engines";
    /// Memory in bytes. Also the one counter of a GPU's counter set under
    /// `--passthrough` without dynamic MIG: the full GPU and its VFIO
    /// sibling each consume all of it, so only one is allocated at a time.
    pub const MEMORY: &str = "memory";
    /// Prefix of the per-memory-slice counters `memory-slice-0..N-1`.
    pub const MEMORY_SLICE_PREFIX: &str = "memory-slice-";

    /// The name of the counter of memory slice `index`.
    pub fn memory_slice(index: u32) -> String {
        format!("{MEMORY_SLICE_PREFIX}{index}")
    }

    /// The name of the counter set of the GPU with device minor `minor`.
    pub fn counter_set(minor: u32) -> String {
        format!("gpu-{minor}-counter-set")
    }
}

/// The value type of an attribute or capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 64-bit signed integer attribute.
    Int,
    /// Boolean attribute.
    Bool,
    /// String attribute, at most [`MAX_STRING_LEN`] bytes.
    String,
    /// Semantic version 2.0.0 attribute (CEL sees a `Semver`).
    Version,
    /// Capacity: a Kubernetes quantity (CEL sees a `Quantity`).
    Quantity,
}

impl ValueType {
    /// The name used in documentation and in error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Int => "int",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Version => "version",
            Self::Quantity => "quantity",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether an entry is an attribute or a capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// `device.attributes`.
    Attribute,
    /// `device.capacity`.
    Capacity,
}

impl Section {
    /// `attribute` or `capacity`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Attribute => "attribute",
            Self::Capacity => "capacity",
        }
    }
}

/// The kinds of devices the plugin publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// A full GPU (`gpu-<minor>`).
    Gpu,
    /// A MIG device that exists on the GPU (static MIG).
    MigStatic,
    /// A MIG profile x placement the plugin creates on demand (dynamic MIG).
    MigDynamic,
    /// A full GPU handed to a container through VFIO (`gpu-vfio-<index>`,
    /// `--passthrough`).
    Vfio,
}

impl DeviceKind {
    /// Every kind, in documentation order.
    pub const ALL: [DeviceKind; 4] = [Self::Gpu, Self::MigStatic, Self::MigDynamic, Self::Vfio];

    /// The value of the `type` attribute for this kind.
    pub fn type_value(self) -> &'static str {
        match self {
            Self::Gpu => device_types::GPU,
            Self::MigStatic | Self::MigDynamic => device_types::MIG,
            Self::Vfio => device_types::VFIO,
        }
    }

    /// A short name for documentation and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::MigStatic => "mig (static)",
            Self::MigDynamic => "mig (dynamic)",
            Self::Vfio => "vfio",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When an entry is present on a device of a kind that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// On every device of the kinds that carry it: a CEL selector may read it
    /// without `has()`.
    Always,
    /// Only under the stated condition: CEL selectors must guard it with
    /// `has()` or `.?name.orValue(...)`.
    When(&'static str),
}

/// Where an entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Published by NVIDIA's driver too, with the same name and type.
    Nvidia,
    /// Added by this driver.
    Extension,
}

/// One row of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Qualified name as published (`type`, `resource.kubernetes.io/pcieRoot`).
    pub name: &'static str,
    /// Attribute or capacity.
    pub section: Section,
    /// Value type.
    pub value_type: ValueType,
    /// Device kinds that carry it.
    pub kinds: &'static [DeviceKind],
    /// When it is present on those kinds.
    pub presence: Presence,
    /// NVIDIA-compatible or our extension.
    pub origin: Origin,
    /// What it means, for users.
    pub description: &'static str,
}

impl Entry {
    /// Whether devices of `kind` carry this entry.
    pub fn carried_by(&self, kind: DeviceKind) -> bool {
        self.kinds.contains(&kind)
    }

    /// The (domain, identifier) pair under which CEL sees this entry for a
    /// driver named `driver`: `device.attributes[domain][identifier]`.
    pub fn cel_key<'a>(&'a self, driver: &'a str) -> (&'a str, &'a str) {
        match self.name.split_once('/') {
            Some((domain, id)) => (domain, id),
            None => (driver, self.name),
        }
    }
}

use DeviceKind::{Gpu, MigDynamic, MigStatic, Vfio};

const ALL_KINDS: &[DeviceKind] = &[Gpu, MigStatic, MigDynamic, Vfio];
const CUDA_KINDS: &[DeviceKind] = &[Gpu, MigStatic, MigDynamic];
const GPU_ONLY: &[DeviceKind] = &[Gpu];
const MIG_KINDS: &[DeviceKind] = &[MigStatic, MigDynamic];
const EXISTING: &[DeviceKind] = &[Gpu, MigStatic, Vfio];
const VFIO_ONLY: &[DeviceKind] = &[Vfio];

const SYSFS: Presence = Presence::When("when sysfs has an entry for the GPU");

/// The schema: every attribute and capacity the plugin publishes.
pub static SCHEMA: &[Entry] = &[
    Entry {
        name: names::TYPE,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: ALL_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "`gpu` for a full GPU, `mig` for a MIG device (static or dynamic), `vfio` for a full GPU for VFIO passthrough",
    },
    Entry {
        name: names::UUID,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: EXISTING,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "`GPU-...` or `MIG-...` UUID (a VFIO device has its GPU's); a dynamic MIG device has none until it is created",
    },
    Entry {
        name: names::PARENT_UUID,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "UUID of the GPU the MIG device lives on",
    },
    Entry {
        name: names::PROFILE,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "MIG profile, e.g. `1g.10gb`, `1g.10gb+me`, `3g.40gb`",
    },
    Entry {
        name: names::INDEX,
        section: Section::Attribute,
        value_type: ValueType::Int,
        kinds: GPU_ONLY,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "NVML index of the GPU (enumeration order; prefer `uuid` to identify a GPU)",
    },
    Entry {
        name: names::PRODUCT_NAME,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: ALL_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "product name of the (parent) GPU, e.g. `NVIDIA H100 80GB HBM3`; cut to 64 bytes if longer",
    },
    Entry {
        name: names::BRAND,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: CUDA_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "brand of the (parent) GPU, e.g. `Nvidia`, `Tesla`",
    },
    Entry {
        name: names::ARCHITECTURE,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: CUDA_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "architecture of the (parent) GPU, e.g. `Hopper`, `Ampere`, `Turing`",
    },
    Entry {
        name: names::CUDA_COMPUTE_CAPABILITY,
        section: Section::Attribute,
        value_type: ValueType::Version,
        kinds: CUDA_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "CUDA compute capability of the (parent) GPU as `<major>.<minor>.0`, e.g. `9.0.0`",
    },
    Entry {
        name: names::DRIVER_VERSION,
        section: Section::Attribute,
        value_type: ValueType::Version,
        kinds: CUDA_KINDS,
        presence: Presence::When(
            "when the NVIDIA driver reports a version of at most three numeric parts (every released driver does)",
        ),
        origin: Origin::Nvidia,
        description: "NVIDIA kernel driver version as semver: NVML's `580.95.05` is published as `580.95.5`",
    },
    Entry {
        name: names::CUDA_DRIVER_VERSION,
        section: Section::Attribute,
        value_type: ValueType::Version,
        kinds: CUDA_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "CUDA driver API version as `<major>.<minor>.0`, e.g. `13.0.0`",
    },
    Entry {
        name: names::PCI_BUS_ID,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: ALL_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "PCI bus id of the (parent) GPU, e.g. `0000:18:00.0`",
    },
    Entry {
        name: names::PCIE_ROOT,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: ALL_KINDS,
        presence: SYSFS,
        origin: Origin::Nvidia,
        description: "PCIe root complex of the (parent) GPU, e.g. `pci0000:10`; match it with a NIC's to keep traffic off the CPU interconnect",
    },
    Entry {
        name: names::NUMA_NODE,
        section: Section::Attribute,
        value_type: ValueType::Int,
        kinds: ALL_KINDS,
        presence: SYSFS,
        origin: Origin::Nvidia,
        description: "NUMA node of the (parent) GPU",
    },
    Entry {
        name: names::ADDRESSING_MODE,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: CUDA_KINDS,
        presence: Presence::When("when NVML reports an addressing mode"),
        origin: Origin::Nvidia,
        description: "`HMM` or `ATS`",
    },
    Entry {
        name: names::NVLINK_DOMAIN,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: GPU_ONLY,
        presence: Presence::Always,
        origin: Origin::Extension,
        description: "NVLink domain: GPUs with the same value are joined by active NVLinks (directly or through NVSwitches). A GPU without active NVLinks has a domain of its own. Derived from the sorted member UUIDs, so it is stable across restarts. Use `matchAttribute: gpu.nvidia.com/nvlinkDomain` to ask for NVLink-connected GPUs",
    },
    Entry {
        name: names::NVLINK_COUNT,
        section: Section::Attribute,
        value_type: ValueType::Int,
        kinds: GPU_ONLY,
        presence: Presence::Always,
        origin: Origin::Extension,
        description: "number of active NVLinks of the GPU (0 without NVLink)",
    },
    Entry {
        name: names::DEVICE_ID,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: VFIO_ONLY,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "PCI device id of the GPU, hex, e.g. `0x2330`",
    },
    Entry {
        name: names::VENDOR_ID,
        section: Section::Attribute,
        value_type: ValueType::String,
        kinds: VFIO_ONLY,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "PCI vendor id of the GPU, hex: `0x10de`",
    },
    Entry {
        name: names::IOMMU_FD_ENABLED,
        section: Section::Attribute,
        value_type: ValueType::Bool,
        kinds: VFIO_ONLY,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "whether the node offers iommufd (`/dev/iommu`), so `VfioDeviceConfig` `backendPolicy: PreferIommuFD` gets the device's iommufd cdev",
    },
    Entry {
        name: names::MEMORY,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: CUDA_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "memory in bytes",
    },
    Entry {
        name: names::ADDRESSABLE_MEMORY,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: VFIO_ONLY,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "memory of the GPU in bytes, which the guest addresses",
    },
    Entry {
        name: names::MULTIPROCESSORS,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "streaming multiprocessors of the MIG device",
    },
    Entry {
        name: names::COPY_ENGINES,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "copy engines of the MIG device",
    },
    Entry {
        name: names::DECODERS,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "video decoders of the MIG device",
    },
    Entry {
        name: names::ENCODERS,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "video encoders of the MIG device",
    },
    Entry {
        name: names::JPEG_ENGINES,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "JPEG engines of the MIG device",
    },
    Entry {
        name: names::OFA_ENGINES,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: MIG_KINDS,
        presence: Presence::Always,
        origin: Origin::Nvidia,
        description: "optical flow accelerators of the MIG device",
    },
    Entry {
        name: names::SHARES,
        section: Section::Capacity,
        value_type: ValueType::Quantity,
        kinds: &[Gpu, MigStatic],
        presence: Presence::When("with `--consumable-shares=<N>`"),
        origin: Origin::Nvidia,
        description: "consumable shares: N claims can share the device, each consuming 1 unless it asks for more (`capacity.requests.shares`)",
    },
];

/// One shared counter of a dynamic-MIG GPU's counter set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterEntry {
    /// Counter name (a DNS label).
    pub name: &'static str,
    /// What it counts.
    pub description: &'static str,
}

/// The counters of the counter set `gpu-<minor>-counter-set` published per GPU
/// under dynamic MIG, besides `memory-slice-0..N-1` (value 1 each, one per
/// memory slice of the GPU). Each MIG placement consumes its resources and the
/// memory slices it covers; the full GPU consumes everything, so the scheduler
/// never hands out overlapping placements, or a placement and the full GPU.
pub static COUNTERS: &[CounterEntry] = &[
    CounterEntry {
        name: counters::MULTIPROCESSORS,
        description: "streaming multiprocessors",
    },
    CounterEntry {
        name: counters::COPY_ENGINES,
        description: "copy engines",
    },
    CounterEntry {
        name: counters::DECODERS,
        description: "video decoders",
    },
    CounterEntry {
        name: counters::ENCODERS,
        description: "video encoders",
    },
    CounterEntry {
        name: counters::JPEG_ENGINES,
        description: "JPEG engines",
    },
    CounterEntry {
        name: counters::OFA_ENGINES,
        description: "optical flow accelerators",
    },
    CounterEntry {
        name: counters::MEMORY,
        description: "memory in bytes",
    },
];

/// The schema entry named `name` in `section`.
pub fn lookup(section: Section, name: &str) -> Option<&'static Entry> {
    SCHEMA
        .iter()
        .find(|e| e.section == section && e.name == name)
}

/// The entries of `section` carried by devices of `kind`.
pub fn entries_for(kind: DeviceKind, section: Section) -> impl Iterator<Item = &'static Entry> {
    SCHEMA
        .iter()
        .filter(move |e| e.section == section && e.carried_by(kind))
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttributeValue {
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `version` (semver 2.0.0).
    Version(String),
}

impl AttributeValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::Int(_) => ValueType::Int,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Version(_) => ValueType::Version,
        }
    }
}

/// Errors of schema checks and value normalisation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The name is not in [`SCHEMA`] for that section.
    #[error("{section} {name:?} is not in the attribute schema")]
    UnknownName {
        /// Attribute or capacity.
        section: &'static str,
        /// The offending name.
        name: String,
    },
    /// The entry exists, but devices of this kind do not carry it.
    #[error("{name:?} is not published on {kind} devices")]
    WrongKind {
        /// The entry.
        name: &'static str,
        /// The device kind.
        kind: DeviceKind,
    },
    /// The value's type differs from the schema's.
    #[error("{name:?} is of type {expected}, got a {got} value")]
    WrongType {
        /// The entry.
        name: &'static str,
        /// The schema's type.
        expected: ValueType,
        /// The value's type.
        got: ValueType,
    },
    /// A string or version value longer than Kubernetes accepts.
    #[error("value of {name:?} is {len} bytes long, the limit is {max}")]
    TooLong {
        /// The entry.
        name: &'static str,
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A version value that is not semver 2.0.0.
    #[error("value {value:?} of {name:?} is not a semantic version (2.0.0)")]
    InvalidVersion {
        /// The entry.
        name: &'static str,
        /// The offending value.
        value: String,
    },
    /// The same entry was set twice on one device.
    #[error("{name:?} is set twice")]
    Duplicate {
        /// The entry.
        name: &'static str,
    },
    /// An entry the schema says is always present was not set.
    #[error("{name:?} is always published on {kind} devices but was not set")]
    Missing {
        /// The entry.
        name: &'static str,
        /// The device kind.
        kind: DeviceKind,
    },
    /// More attributes and capacities than Kubernetes accepts on one device.
    #[error(
        "{count} attributes and capacities on one device, the limit is {MAX_ATTRIBUTES_AND_CAPACITIES}"
    )]
    TooMany {
        /// How many were set.
        count: usize,
    },
    /// An NVML version string that cannot be turned into semver.
    #[error("NVML version {0:?} is not made of one to three numeric parts")]
    InvalidNvmlVersion(String),
}

/// The attributes and capacities of one device, checked against [`SCHEMA`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttributes {
    kind: DeviceKind,
    attributes: BTreeMap<&'static str, AttributeValue>,
    capacity: BTreeMap<&'static str, u64>,
}

/// A finished, checked set of attributes and capacities.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckedAttributes {
    /// Attributes by qualified name.
    pub attributes: BTreeMap<&'static str, AttributeValue>,
    /// Capacities by qualified name (integers: bytes or counts).
    pub capacity: BTreeMap<&'static str, u64>,
}

impl DeviceAttributes {
    /// An empty set for a device of `kind`. The `type` attribute is set
    /// already, from the kind.
    pub fn new(kind: DeviceKind) -> Self {
        let mut attributes = BTreeMap::new();
        attributes.insert(
            names::TYPE,
            AttributeValue::String(kind.type_value().to_owned()),
        );
        Self {
            kind,
            attributes,
            capacity: BTreeMap::new(),
        }
    }

    /// The device kind.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    fn entry(&self, section: Section, name: &str) -> Result<&'static Entry, SchemaError> {
        let entry = lookup(section, name).ok_or_else(|| SchemaError::UnknownName {
            section: section.as_str(),
            name: name.to_owned(),
        })?;
        if !entry.carried_by(self.kind) {
            return Err(SchemaError::WrongKind {
                name: entry.name,
                kind: self.kind,
            });
        }
        Ok(entry)
    }

    /// Sets attribute `name`.
    pub fn set(&mut self, name: &str, value: AttributeValue) -> Result<(), SchemaError> {
        let entry = self.entry(Section::Attribute, name)?;
        if entry.value_type != value.value_type() {
            return Err(SchemaError::WrongType {
                name: entry.name,
                expected: entry.value_type,
                got: value.value_type(),
            });
        }
        match &value {
            AttributeValue::String(s) if s.len() > MAX_STRING_LEN => {
                return Err(SchemaError::TooLong {
                    name: entry.name,
                    len: s.len(),
                    max: MAX_STRING_LEN,
                });
            }
            AttributeValue::Version(v) => {
                if v.len() > MAX_VERSION_LEN {
                    return Err(SchemaError::TooLong {
                        name: entry.name,
                        len: v.len(),
                        max: MAX_VERSION_LEN,
                    });
                }
                if !is_semver(v) {
                    return Err(SchemaError::InvalidVersion {
                        name: entry.name,
                        value: v.clone(),
                    });
                }
            }
            _ => {}
        }
        if entry.name == names::TYPE {
            // `type` follows from the kind; setting it to anything else is a bug.
            if value != AttributeValue::String(self.kind.type_value().to_owned()) {
                return Err(SchemaError::Duplicate { name: entry.name });
            }
            return Ok(());
        }
        if self.attributes.insert(entry.name, value).is_some() {
            return Err(SchemaError::Duplicate { name: entry.name });
        }
        Ok(())
    }

    /// Sets a string attribute.
    pub fn set_string(&mut self, name: &str, value: impl Into<String>) -> Result<(), SchemaError> {
        self.set(name, AttributeValue::String(value.into()))
    }

    /// Sets an int attribute.
    pub fn set_int(&mut self, name: &str, value: i64) -> Result<(), SchemaError> {
        self.set(name, AttributeValue::Int(value))
    }

    /// Sets a bool attribute.
    pub fn set_bool(&mut self, name: &str, value: bool) -> Result<(), SchemaError> {
        self.set(name, AttributeValue::Bool(value))
    }

    /// Sets a version attribute.
    pub fn set_version(&mut self, name: &str, value: impl Into<String>) -> Result<(), SchemaError> {
        self.set(name, AttributeValue::Version(value.into()))
    }

    /// Sets capacity `name` (bytes or a count).
    pub fn set_capacity(&mut self, name: &str, value: u64) -> Result<(), SchemaError> {
        let entry = self.entry(Section::Capacity, name)?;
        if self.capacity.insert(entry.name, value).is_some() {
            return Err(SchemaError::Duplicate { name: entry.name });
        }
        Ok(())
    }

    /// Checks that every entry the schema marks [`Presence::Always`] for this
    /// kind is set and that the device stays within Kubernetes' limits.
    pub fn finish(self) -> Result<CheckedAttributes, SchemaError> {
        for entry in SCHEMA
            .iter()
            .filter(|e| e.carried_by(self.kind) && e.presence == Presence::Always)
        {
            let present = match entry.section {
                Section::Attribute => self.attributes.contains_key(entry.name),
                Section::Capacity => self.capacity.contains_key(entry.name),
            };
            if !present {
                return Err(SchemaError::Missing {
                    name: entry.name,
                    kind: self.kind,
                });
            }
        }
        let count = self.attributes.len() + self.capacity.len();
        if count > MAX_ATTRIBUTES_AND_CAPACITIES {
            return Err(SchemaError::TooMany { count });
        }
        Ok(CheckedAttributes {
            attributes: self.attributes,
            capacity: self.capacity,
        })
    }
}

/// Turns an NVML version string into semver: one to three numeric parts,
/// leading zeros dropped, missing parts filled with 0. `580.95.05` becomes
/// `580.95.5`, `550.54` becomes `550.54.0`.
pub fn semver_from_nvml(version: &str) -> Result<String, SchemaError> {
    let bad = || SchemaError::InvalidNvmlVersion(version.to_owned());
    let parts: Vec<&str> = version.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(bad());
    }
    let mut numbers = [0u64; 3];
    for (slot, part) in numbers.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        *slot = part.parse().map_err(|_| bad())?;
    }
    Ok(format!("{}.{}.{}", numbers[0], numbers[1], numbers[2]))
}

/// A (major, minor) pair as semver `<major>.<minor>.0`.
pub fn semver_from_pair((major, minor): (u32, u32)) -> String {
    format!("{major}.{minor}.0")
}

/// Cuts a string attribute value to at most [`MAX_STRING_LEN`] bytes, at a
/// character boundary. Returns the value and whether it was cut. Used for
/// descriptive values (product names and the like), where a cut value is more
/// useful than none; identifiers are never cut.
pub fn fit_string(value: &str) -> (String, bool) {
    if value.len() <= MAX_STRING_LEN {
        return (value.to_owned(), false);
    }
    let mut end = MAX_STRING_LEN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    (value[..end].to_owned(), true)
}

/// Whether `s` is a semantic version 2.0.0 (`MAJOR.MINOR.PATCH`, optional
/// `-pre.release` and `+build.metadata`), as Kubernetes requires of version
/// attributes.
pub fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let ident =
        |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let core_parts: Vec<&str> = core.split('.').collect();
    if core_parts.len() != 3 || !core_parts.iter().all(|p| numeric(p)) {
        return false;
    }
    if let Some(pre) = pre
        && !pre
            .split('.')
            .all(|p| ident(p) && (!p.bytes().all(|b| b.is_ascii_digit()) || numeric(p)))
    {
        return false;
    }
    if let Some(build) = build
        && !build.split('.').all(ident)
    {
        return false;
    }
    true
}

/// Whether `name` is a valid Kubernetes qualified attribute name: a C
/// identifier of at most 32 characters, optionally prefixed by a DNS
/// subdomain of at most 63 characters and a `/`.
pub fn is_qualified_name(name: &str) -> bool {
    let c_ident = |s: &str| {
        let mut bytes = s.bytes();
        matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && s.len() <= 32
    };
    match name.split_once('/') {
        None => c_ident(name),
        Some((domain, id)) => is_dns_subdomain(domain) && domain.len() <= 63 && c_ident(id),
    }
}

/// Whether `s` is a DNS subdomain as Kubernetes checks one
/// (`IsDNS1123Subdomain`): at most 253 characters of dot-separated parts,
/// each lower-case alphanumerics or `-`, starting and ending with an
/// alphanumeric. Kubernetes puts no length limit on a single part, so a
/// claim or class name with a part longer than 63 characters is valid.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_shaped)
}

/// Whether `s` is a DNS label (RFC 1123): at most 63 lower-case alphanumerics
/// or `-`, starting and ending with an alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// The characters and ends of a DNS label, without its length limit.
fn is_label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The schema as a Markdown table, for the user documentation.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| name | kind | type | gpu | mig (static) | mig (dynamic) | vfio | present | origin | meaning |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for e in SCHEMA {
        let mark = |k| if e.carried_by(k) { "yes" } else { "" };
        let presence = match e.presence {
            Presence::Always => "always",
            Presence::When(cond) => cond,
        };
        let origin = match e.origin {
            Origin::Nvidia => "NVIDIA-compatible",
            Origin::Extension => "extension",
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            e.name,
            e.section.as_str(),
            e.value_type,
            mark(Gpu),
            mark(MigStatic),
            mark(MigDynamic),
            mark(Vfio),
            presence,
            origin,
            e.description
        );
    }
    out
}

#[cfg(test)]
mod tests;
