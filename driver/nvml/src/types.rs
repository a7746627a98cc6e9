//! Owned descriptions of what NVML reports about a node's GPUs.
//!
//! These structs carry no NVML lifetimes, so discovery results can move freely
//! between threads, be compared in tests and be built by hand in unit tests of
//! the device model. The NVML backend fills them; nothing else in the driver
//! talks to NVML.

use serde::{Deserialize, Serialize};

/// Node-wide facts reported by the NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemInfo {
    /// The kernel driver version exactly as NVML reports it, e.g. `580.159.04`.
    pub driver_version: String,
    /// The CUDA driver API version as (major, minor), e.g. (13, 0) for NVML's 13000.
    pub cuda_driver_version: (u32, u32),
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (enumeration order).
    pub index: u32,
    /// Device minor number: `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// Brand as NVIDIA's driver publishes it, e.g. `Nvidia`, `Tesla`.
    pub brand: String,
    /// Architecture name, e.g. `Hopper`, `Ampere`, `Turing`, `Ada Lovelace`.
    pub architecture: String,
    /// CUDA compute capability (major, minor).
    pub cuda_compute_capability: (u32, u32),
    /// Total framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// PCI bus id, normalised to lower case with a 4-digit domain: `0000:18:00.0`.
    pub pci_bus_id: String,
    /// `HMM` or `ATS` when NVML reports an addressing mode; `None` otherwise.
    pub addressing_mode: Option<String>,
    /// Current compute mode.
    pub compute_mode: ComputeMode,
    /// MIG facts; `None` when the GPU is not MIG capable (NVML answers NOT_SUPPORTED).
    pub mig: Option<MigInfo>,
    /// Active NVLinks only (inactive or unsupported links are left out).
    pub nvlinks: Vec<NvLinkInfo>,
    /// The GPU's NVLink fabric membership (GPU fabric info, Hopper and
    /// later): `None` when NVML has none, the registration is not complete
    /// or the GPU is in no cluster (single-node NVSwitch systems).
    #[serde(default)]
    pub fabric: Option<FabricInfo>,
    /// UUIDs of the node's other GPUs that NVML's P2P status over NVLink
    /// (`NVML_P2P_CAPS_INDEX_NVLINK`) calls OK, sorted. Read only for a GPU
    /// with switch links and no fabric membership (what joins switch-attached
    /// GPUs then); empty otherwise.
    #[serde(default)]
    pub nvlink_p2p_peers: Vec<String>,
}

/// A GPU's place in a (multi-node) NVLink fabric, from NVML's GPU fabric
/// info: GPUs with the same cluster UUID and clique id reach each other over
/// NVLink through the switches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FabricInfo {
    /// The fabric's cluster UUID, lower case `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub cluster_uuid: String,
    /// The clique id inside the cluster.
    pub clique_id: u32,
}

impl FabricInfo {
    /// `<clusterUUID>.<cliqueId>` (decimal clique id): the value of NVIDIA's
    /// node label `nvidia.com/gpu.clique`.
    pub fn clique(&self) -> String {
        format!("{}.{}", self.cluster_uuid, self.clique_id)
    }
}

/// NVML compute modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComputeMode {
    /// Several contexts may use the GPU at once (time-slicing).
    Default,
    /// One process at a time (MPS needs this).
    ExclusiveProcess,
    /// No contexts allowed.
    Prohibited,
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkInfo {
    /// Link number on this GPU.
    pub link: u32,
    /// What is at the other end (NVML's remote device type, with the remote
    /// bus id as a second signal).
    pub remote: NvLinkRemote,
    /// PCI bus id (normalised like [`GpuInfo::pci_bus_id`]) of the device at
    /// the other end when it is a PCI device (a GPU through a bridge). `None`
    /// for switch links (NVML reports the sentinel `FFFFFFFF:FF:FF.0` for
    /// every one of them, which names no device) and unreadable ends.
    pub remote_pci_bus_id: Option<String>,
}

/// What is at the far end of an NVLink (`nvmlIntNvLinkDeviceType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NvLinkRemote {
    /// Another GPU, through a bridge or a direct board link.
    Gpu,
    /// An NVSwitch.
    Switch,
    /// An IBM NPU (POWER9 CPUs with NVLink).
    IbmNpu,
    /// NVML could not say.
    Unknown,
}

/// The MIG mode of a MIG-capable GPU, read alone ([`crate::GpuBackend::mig_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMode {
    /// MIG mode now in effect.
    pub current_enabled: bool,
    /// MIG mode after the next GPU reset.
    pub pending_enabled: bool,
}

/// MIG state and capabilities of a MIG-capable GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInfo {
    /// MIG mode now in effect.
    pub current_enabled: bool,
    /// MIG mode after the next GPU reset.
    pub pending_enabled: bool,
    /// GPU instance profiles this GPU supports, with their possible placements.
    /// Listed whatever the MIG mode (NVML answers profile and placement
    /// queries on MIG-disabled GPUs; dynamic MIG relies on it).
    pub profiles: Vec<MigProfile>,
    /// MIG devices that exist now (a GPU instance with a compute instance).
    pub devices: Vec<MigDevice>,
}

/// A GPU instance profile (one row of the hardware MIG table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// NVML's GPU instance profile id (`nvmlGpuInstanceProfileInfo_t.id`).
    pub id: u32,
    /// Canonical name without the `MIG ` prefix: `1g.10gb`, `1g.10gb+me`, `7g.80gb`.
    pub name: String,
    /// Compute slices the profile takes.
    pub slice_count: u32,
    /// How many instances of this profile fit on an empty GPU.
    pub instance_count: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical flow accelerators.
    pub ofa_engines: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Every placement NVML lists for this profile (possible placements).
    pub placements: Vec<MigPlacement>,
}

/// Where a GPU instance sits on the GPU's memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// An existing MIG device: a GPU instance and the compute instance in it.
/// A GPU instance may hold several compute instances, each its own MIG
/// device with the same GPU instance id and placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// `MIG-...` UUID.
    pub uuid: String,
    /// GPU instance profile id (matches [`MigProfile::id`]).
    pub profile_id: u32,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// Placement of the GPU instance.
    pub placement: MigPlacement,
    /// Memory of the MIG device in bytes.
    pub memory_bytes: u64,
    /// Compute slices of the GPU instance and of this compute instance, when
    /// NVML reports them (the MIG device's attributes).
    #[serde(default)]
    pub compute_slices: Option<ComputeSlices>,
}

/// A GPU instance as it exists now, with its compute instances. Unlike
/// [`MigDevice`] (one per compute instance), this also shows a GPU instance
/// without any compute instance: no MIG device, but its placement is taken
/// (what a crash between creating the two leaves behind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpuInstance {
    /// GPU instance id.
    pub id: u32,
    /// GPU instance profile id (matches [`MigProfile::id`]).
    pub profile_id: u32,
    /// Placement.
    pub placement: MigPlacement,
    /// Its compute instances, by id.
    pub compute_instances: Vec<MigComputeInstance>,
}

/// A compute instance of a [`MigGpuInstance`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigComputeInstance {
    /// Compute instance id.
    pub id: u32,
    /// Compute instance profile id.
    pub profile_id: u32,
    /// The MIG device's `MIG-...` UUID, when NVML lists the device.
    pub uuid: Option<String>,
}

/// How much of its GPU instance's compute a compute instance takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeSlices {
    /// Compute slices of the GPU instance.
    pub gpu_instance: u32,
    /// Compute slices of the compute instance.
    pub compute_instance: u32,
}

impl ComputeSlices {
    /// Whether the compute instance takes all of its GPU instance.
    pub fn spans_gpu_instance(self) -> bool {
        self.compute_instance >= self.gpu_instance
    }
}

/// A process NVML sees with a context on a GPU
/// (`nvmlDeviceGet{Compute,Graphics}RunningProcesses`), one per pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// The pid, in the namespace NVML runs in (the host's for the driver).
    pub pid: u32,
    /// GPU memory it uses in bytes; `None` when NVML does not know
    /// (`NVML_VALUE_NOT_AVAILABLE`).
    pub used_memory_bytes: Option<u64>,
    /// It has a compute context (CUDA).
    pub compute: bool,
    /// It has a graphics context (OpenGL, Vulkan, ...).
    pub graphics: bool,
}
