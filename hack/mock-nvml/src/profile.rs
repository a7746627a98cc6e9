//! Machine profiles: the YAML schema (strict: unknown fields are errors) and
//! its validation into a [`Profile`], the machine the fake library simulates.
//! The format is documented in `hack/mock-nvml/README.md`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::codes::{self, Code};
use crate::error::Error;
use crate::exports;
use crate::fabric::{self, Fabric, FabricSpec};
use crate::hardware::{self, GpuModel, MigTable};
use crate::health::{GpuHealth, HealthSpec};
use crate::ids;
use crate::mig::MigState;
use crate::pci::{self, PciAddress};
use crate::processes::{self, ProcessSpec};

/// The profile document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileSpec {
    /// `nvmlSystemGetDriverVersion`, e.g. `580.95.05`.
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 13000.
    pub cuda_driver_version: i32,
    /// `nvmlSystemGetNVMLVersion`; default `<cuda major>.<driver version>`.
    #[serde(default)]
    pub nvml_version: Option<String>,
    /// PCI addresses of NVSwitches that NVLinks may point at.
    #[serde(default)]
    pub nvswitches: Vec<String>,
    /// Injected failures of functions, for every device (`nvmlInit: DRIVER_NOT_LOADED`).
    #[serde(default)]
    pub fail: BTreeMap<String, String>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<GpuSpec>,
}

/// One GPU of a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuSpec {
    /// Hardware table key, e.g. `A100-SXM4-80GB`.
    pub model: String,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// PCI address, e.g. `0000:18:00.0`.
    pub pci_bus_id: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// NUMA node of the GPU, -1 when unknown.
    pub numa_node: i32,
    /// PCIe root complex, e.g. `pci0000:10`.
    pub pcie_root: String,
    /// Bridges between the root complex and the GPU, top down (root port,
    /// switch ports); used for the topology level and the sysfs path.
    #[serde(default)]
    pub pci_bridges: Vec<String>,
    /// Board serial; default derived from the UUID.
    #[serde(default)]
    pub serial: Option<String>,
    /// Board id; default derived from the PCI address.
    #[serde(default)]
    pub board_id: Option<u32>,
    /// Compute mode; default `Default`.
    #[serde(default)]
    pub compute_mode: Option<ComputeMode>,
    /// `nvmlDeviceGetAddressingMode`; absent: the call is NOT_SUPPORTED.
    #[serde(default)]
    pub addressing_mode: Option<AddressingMode>,
    /// MIG mode and existing MIG devices (MIG-capable models only).
    #[serde(default)]
    pub mig: Option<MigSpec>,
    /// Active NVLinks.
    #[serde(default)]
    pub nvlinks: Vec<NvLinkSpec>,
    /// GPU fabric facts (Hopper and later); absent: state "not supported".
    #[serde(default)]
    pub fabric: Option<FabricSpec>,
    /// Injected failures of functions called on this GPU.
    #[serde(default)]
    pub fail: BTreeMap<String, String>,
    /// Values that replace the hardware table's.
    #[serde(default)]
    pub overrides: Option<Overrides>,
    /// Faults present at start (see `health.rs` and the README).
    #[serde(default)]
    pub health: Option<HealthSpec>,
    /// Processes with a context on the GPU at start (see `processes.rs`).
    #[serde(default)]
    pub processes: Vec<ProcessSpec>,
}

/// Compute modes (`nvmlComputeMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComputeMode {
    /// NVML_COMPUTEMODE_DEFAULT.
    Default,
    /// NVML_COMPUTEMODE_EXCLUSIVE_THREAD.
    ExclusiveThread,
    /// NVML_COMPUTEMODE_PROHIBITED.
    Prohibited,
    /// NVML_COMPUTEMODE_EXCLUSIVE_PROCESS.
    ExclusiveProcess,
}

impl ComputeMode {
    /// The NVML value.
    pub fn value(self) -> u32 {
        match self {
            ComputeMode::Default => 0,
            ComputeMode::ExclusiveThread => 1,
            ComputeMode::Prohibited => 2,
            ComputeMode::ExclusiveProcess => 3,
        }
    }

    /// The mode of an NVML value.
    pub fn from_value(value: u32) -> Option<ComputeMode> {
        Some(match value {
            0 => ComputeMode::Default,
            1 => ComputeMode::ExclusiveThread,
            2 => ComputeMode::Prohibited,
            3 => ComputeMode::ExclusiveProcess,
            _ => return None,
        })
    }
}

/// Addressing modes (`nvmlDeviceAddressingModeType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AddressingMode {
    /// NVML_DEVICE_ADDRESSING_MODE_NONE.
    None,
    /// NVML_DEVICE_ADDRESSING_MODE_HMM.
    #[serde(rename = "HMM")]
    Hmm,
    /// NVML_DEVICE_ADDRESSING_MODE_ATS.
    #[serde(rename = "ATS")]
    Ats,
}

impl AddressingMode {
    /// The NVML value.
    pub fn value(self) -> u32 {
        match self {
            AddressingMode::None => 0,
            AddressingMode::Hmm => 1,
            AddressingMode::Ats => 2,
        }
    }
}

/// MIG mode and the MIG devices that exist when the machine "boots".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigSpec {
    /// Current MIG mode.
    pub current: bool,
    /// Pending MIG mode; default: the current mode.
    #[serde(default)]
    pub pending: Option<bool>,
    /// Existing GPU instances (each with its compute instances).
    #[serde(default)]
    pub devices: Vec<MigDeviceSpec>,
}

/// A GPU instance that exists, with its compute instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceSpec {
    /// GI profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// Placement start (memory slice).
    pub placement: u32,
    /// UUID of the compute instance created by default (when
    /// `computeInstances` is absent); default derived.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Compute instances; absent: one spanning the GI; empty: none (a GI
    /// without CI, which is not a usable MIG device).
    #[serde(default)]
    pub compute_instances: Option<Vec<CiSpec>>,
}

/// A compute instance that exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CiSpec {
    /// CI profile name as nvidia-smi prints it: `1c.3g.40gb`, or the GI
    /// profile name for a CI spanning the GI.
    pub profile: String,
    /// Placement start (compute slice); default the first free one.
    #[serde(default)]
    pub placement: Option<u32>,
    /// MIG device UUID; default derived.
    #[serde(default)]
    pub uuid: Option<String>,
}

/// One active NVLink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NvLinkSpec {
    /// Link number.
    pub link: u32,
    /// PCI address at the other end: a GPU of the profile or an NVSwitch.
    pub remote: String,
}

/// Values replacing the hardware table's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Overrides {
    /// Product name.
    #[serde(default)]
    pub name: Option<String>,
    /// Brand: Nvidia, Tesla, Quadro, GeForce, Titan, NvidiaRTX, GRID, NVS, Unknown.
    #[serde(default)]
    pub brand: Option<String>,
    /// Memory in MiB.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Streaming multiprocessors.
    #[serde(default)]
    pub multiprocessors: Option<u32>,
    /// A whole MIG table (makes any model MIG capable).
    #[serde(default)]
    pub mig_table: Option<MigTable>,
}

/// A validated GPU, with the hardware table resolved.
#[derive(Clone, Debug)]
pub struct Gpu {
    /// Hardware description, overrides applied.
    pub model: GpuModel,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// PCI address.
    pub pci: PciAddress,
    /// Minor number.
    pub minor: u32,
    /// NUMA node, -1 when unknown.
    pub numa_node: i32,
    /// Root complex, e.g. `pci0000:10`.
    pub pcie_root: String,
    /// Bridges from the root complex down to the GPU.
    pub pci_bridges: Vec<PciAddress>,
    /// Board serial.
    pub serial: String,
    /// Board id.
    pub board_id: u32,
    /// Compute mode (NVML value).
    pub compute_mode: u32,
    /// Addressing mode (NVML value), if reported.
    pub addressing_mode: Option<u32>,
    /// Current MIG mode.
    pub mig_current: bool,
    /// Pending MIG mode.
    pub mig_pending: bool,
    /// Existing MIG instances (serials all 0).
    pub mig: MigState,
    /// How many compute instances were created so far (MIG UUID derivation).
    pub mig_created: u64,
    /// Active NVLinks: link number to remote address.
    pub nvlinks: BTreeMap<u32, PciAddress>,
    /// GPU fabric facts; `None` when the model has no fabric call.
    pub fabric: Option<Fabric>,
    /// Health at start: the faults of the `health:` block.
    pub health: GpuHealth,
    /// Injected failures.
    pub fail: BTreeMap<String, Code>,
}

/// A validated machine profile.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The document as written.
    pub spec: ProfileSpec,
    /// The GPUs, in index order.
    pub gpus: Vec<Gpu>,
    /// NVSwitch addresses.
    pub nvswitches: Vec<PciAddress>,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// Injected failures for every device.
    pub fail: BTreeMap<String, Code>,
}

impl Profile {
    /// Reads and validates a profile file (at most [`MAX_PROFILE_BYTES`];
    /// one byte past that is read, to tell).
    pub fn load(path: &Path) -> Result<Profile, Error> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| {
                f.take(MAX_PROFILE_BYTES as u64 + 1)
                    .read_to_string(&mut text)
            })
            .map_err(|e| Error::io("read profile", path, e))?;
        Profile::parse_named(&text, &path.display().to_string())
    }

    /// Validates a profile given as text.
    pub fn parse(text: &str) -> Result<Profile, Error> {
        Profile::parse_named(text, "<inline>")
    }

    fn parse_named(text: &str, origin: &str) -> Result<Profile, Error> {
        let spec: ProfileSpec =
            bounded_yaml::from_str(text, MAX_PROFILE_BYTES).map_err(|e| Error::ProfileSyntax {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?;
        validate(spec).map_err(|message| Error::ProfileInvalid {
            origin: origin.to_owned(),
            message,
        })
    }
}

/// Largest profile file read: 1 MiB, a hundred times the largest shipped
/// one, room for [`MAX_GPUS`] GPUs with every field spelled out. Nesting
/// and alias expansion are held to [`bounded_yaml`]'s limits.
pub const MAX_PROFILE_BYTES: usize = 1024 * 1024;

/// Most GPUs a profile may have (handles carry the index in 8 bits).
pub const MAX_GPUS: usize = 256;
/// Most NVSwitches a profile may list.
pub const MAX_NVSWITCHES: usize = 64;

fn parse_fail(fail: &BTreeMap<String, String>) -> Result<BTreeMap<String, Code>, String> {
    fail.iter()
        .map(|(function, code)| {
            if !exports::is_failable(function) {
                return Err(format!(
                    "fail: {function:?} is not a function of the fake library"
                ));
            }
            let code = codes::from_name(code).ok_or_else(|| {
                format!(
                    "fail: {function}: {code:?} is not an NVML error code (one of {})",
                    codes::failure_names().join(", ")
                )
            })?;
            Ok((function.clone(), code))
        })
        .collect()
}

fn validate_version(driver: &str) -> Result<(), String> {
    let parts: Vec<&str> = driver.split('.').collect();
    let ok = (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.chars().all(|c| c.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "driverVersion {driver:?} is not a driver version like \"580.95.05\""
        ))
    }
}

fn apply_overrides(mut model: GpuModel, overrides: Option<&Overrides>) -> Result<GpuModel, String> {
    let Some(o) = overrides else { return Ok(model) };
    if let Some(name) = &o.name {
        if name.is_empty() || name.len() >= 96 {
            return Err(format!(
                "overrides.name {name:?} must have 1 to 95 characters"
            ));
        }
        model.name.clone_from(name);
    }
    if let Some(brand) = &o.brand {
        model.brand = hardware::brand_from_name(brand).ok_or_else(|| {
            format!(
                "overrides.brand {brand:?} is not one of Nvidia, Tesla, Quadro, GeForce, \
                 Titan, NvidiaRTX, GRID, NVS, Unknown"
            )
        })?;
    }
    if let Some(mib) = o.memory_mib {
        if mib == 0 {
            return Err("overrides.memoryMib must be positive".into());
        }
        model.memory_mib = mib;
    }
    if let Some(sm) = o.multiprocessors {
        model.multiprocessors = sm;
    }
    if let Some(table) = &o.mig_table {
        validate_mig_table(table).map_err(|e| format!("overrides.migTable: {e}"))?;
        model.mig = Some(table.clone());
    }
    Ok(model)
}

fn validate_mig_table(table: &MigTable) -> Result<(), String> {
    if table.memory_slices == 0 || table.memory_slices > 32 || table.compute_slices == 0 {
        return Err("memorySlices must be 1 to 32 and computeSlices positive".into());
    }
    if table.profiles.is_empty() {
        return Err("profiles must not be empty".into());
    }
    let mut names = HashSet::new();
    let mut ids = HashSet::new();
    let mut enums = HashSet::new();
    for p in &table.profiles {
        if !names.insert(&p.name) || !ids.insert(p.id) || !enums.insert(p.nvml_profile) {
            return Err(format!(
                "profile {}: duplicate name, id or nvmlProfile",
                p.name
            ));
        }
        if p.nvml_profile >= nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT {
            return Err(format!(
                "profile {}: nvmlProfile {} out of range",
                p.name, p.nvml_profile
            ));
        }
        if p.compute_slices == 0 || p.compute_slices > table.compute_slices {
            return Err(format!("profile {}: computeSlices out of range", p.name));
        }
        if p.placement_size == 0
            || p.placements.is_empty()
            || p.placements
                .iter()
                .any(|s| s + p.placement_size > table.memory_slices)
        {
            return Err(format!(
                "profile {}: placements must fit in {} memory slices",
                p.name, table.memory_slices
            ));
        }
        if p.instance_count == 0 || p.instance_count as usize > p.placements.len() {
            return Err(format!(
                "profile {}: instanceCount must be 1 to the number of placements",
                p.name
            ));
        }
    }
    Ok(())
}

fn validate(spec: ProfileSpec) -> Result<Profile, String> {
    validate_version(&spec.driver_version)?;
    if spec.cuda_driver_version < 1000 {
        return Err(format!(
            "cudaDriverVersion {} is not a CUDA version like 13000 (13.0)",
            spec.cuda_driver_version
        ));
    }
    let nvml_version = match &spec.nvml_version {
        Some(v) if v.is_empty() || v.len() >= 80 => {
            return Err("nvmlVersion must have 1 to 79 characters".into());
        }
        Some(v) => v.clone(),
        None => format!(
            "{}.{}",
            spec.cuda_driver_version / 1000,
            spec.driver_version
        ),
    };
    let fail = parse_fail(&spec.fail)?;
    if spec.gpus.len() > MAX_GPUS {
        return Err(format!(
            "gpus: {} GPUs, at most {MAX_GPUS} are supported",
            spec.gpus.len()
        ));
    }
    if spec.nvswitches.len() > MAX_NVSWITCHES {
        return Err(format!(
            "nvswitches: at most {MAX_NVSWITCHES} are supported"
        ));
    }

    let mut nvswitches = Vec::new();
    for (i, s) in spec.nvswitches.iter().enumerate() {
        let addr = PciAddress::parse(s)
            .ok_or_else(|| format!("nvswitches[{i}]: {s:?} is not a PCI address"))?;
        if nvswitches.contains(&addr) {
            return Err(format!("nvswitches[{i}]: {addr} is listed twice"));
        }
        nvswitches.push(addr);
    }

    // First pass: addresses, to resolve NVLink ends.
    let mut gpu_addrs = Vec::new();
    for (i, g) in spec.gpus.iter().enumerate() {
        let addr = PciAddress::parse(&g.pci_bus_id).ok_or_else(|| {
            format!(
                "gpus[{i}]: pciBusId {:?} is not a PCI address like 0000:18:00.0",
                g.pci_bus_id
            )
        })?;
        if let Some(j) = gpu_addrs.iter().position(|a| *a == addr) {
            return Err(format!(
                "gpus[{i}]: pciBusId {addr} is also the address of gpus[{j}]"
            ));
        }
        if nvswitches.contains(&addr) {
            return Err(format!(
                "gpus[{i}]: pciBusId {addr} is also listed as an NVSwitch"
            ));
        }
        gpu_addrs.push(addr);
    }

    let mut gpus: Vec<Gpu> = Vec::with_capacity(spec.gpus.len());
    let mut uuids = HashSet::new();
    let mut minors = BTreeMap::new();
    let mut mig_uuids = HashSet::new();
    for (i, g) in spec.gpus.iter().enumerate() {
        let gpu = validate_gpu(g, gpu_addrs[i], &gpu_addrs, &nvswitches, &mut mig_uuids)
            .and_then(|gpu| with_health(gpu, g, &spec.driver_version))
            .map_err(|e| format!("gpus[{i}] ({}): {e}", g.uuid))?;
        if !uuids.insert(gpu.uuid.clone()) {
            return Err(format!(
                "gpus[{i}]: uuid {} is used by another GPU",
                gpu.uuid
            ));
        }
        if let Some(j) = minors.insert(gpu.minor, i) {
            return Err(format!(
                "gpus[{i}]: minor {} is also the minor of gpus[{j}]",
                gpu.minor
            ));
        }
        gpus.push(gpu);
    }

    // NVLinks between GPUs come in pairs: as many links from A to B as from B to A.
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            let a_to_b = a.nvlinks.values().filter(|r| **r == b.pci).count();
            let b_to_a = b.nvlinks.values().filter(|r| **r == a.pci).count();
            if a_to_b != b_to_a {
                return Err(format!(
                    "gpus[{i}] has {a_to_b} NVLink(s) to gpus[{j}] ({}) but gpus[{j}] has {b_to_a} back",
                    b.pci
                ));
            }
        }
    }

    Ok(Profile {
        spec,
        gpus,
        nvswitches,
        nvml_version,
        fail,
    })
}

/// Sets a validated GPU's health at start from its `health:` block and
/// its processes from `processes:`.
fn with_health(mut gpu: Gpu, g: &GpuSpec, driver: &str) -> Result<Gpu, String> {
    let links = gpu.nvlinks.keys().copied().collect();
    let healthy = GpuHealth::healthy(&gpu.model, gpu.minor, links, driver);
    let mut health = match &g.health {
        Some(spec) => healthy.with_spec(spec)?,
        None => healthy,
    };
    let (compute, graphics) = processes::from_specs(&g.processes)?;
    health.compute_processes = compute;
    health.graphics_processes = graphics;
    gpu.health = health;
    Ok(gpu)
}

fn validate_gpu(
    g: &GpuSpec,
    pci: PciAddress,
    gpu_addrs: &[PciAddress],
    nvswitches: &[PciAddress],
    mig_uuids: &mut HashSet<String>,
) -> Result<Gpu, String> {
    let model = hardware::model(&g.model).ok_or_else(|| {
        format!(
            "model {:?} is not in the hardware table (one of {})",
            g.model,
            hardware::MODEL_KEYS.join(", ")
        )
    })?;
    let model = apply_overrides(model, g.overrides.as_ref())?;
    if !ids::is_gpu_uuid(&g.uuid) {
        return Err(format!(
            "uuid {:?} is not like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
            g.uuid
        ));
    }
    if g.minor >= 255 {
        return Err(format!(
            "minor {} must be below 255 (255 is /dev/nvidiactl)",
            g.minor
        ));
    }
    if g.numa_node < -1 {
        return Err(format!(
            "numaNode {} must be -1 (unknown) or a node number",
            g.numa_node
        ));
    }
    let (root_domain, _) = pci::parse_root(&g.pcie_root).ok_or_else(|| {
        format!(
            "pcieRoot {:?} is not a root complex like pci0000:10",
            g.pcie_root
        )
    })?;
    if root_domain != pci.domain {
        return Err(format!(
            "pcieRoot {} is in PCI domain {root_domain:04x} but the GPU is in {:04x}",
            g.pcie_root, pci.domain
        ));
    }
    let mut pci_bridges = Vec::new();
    for (k, b) in g.pci_bridges.iter().enumerate() {
        let addr = PciAddress::parse(b)
            .ok_or_else(|| format!("pciBridges[{k}]: {b:?} is not a PCI address"))?;
        if addr == pci || pci_bridges.contains(&addr) {
            return Err(format!("pciBridges[{k}]: {addr} appears twice on the path"));
        }
        if gpu_addrs.contains(&addr) || nvswitches.contains(&addr) {
            return Err(format!(
                "pciBridges[{k}]: {addr} is the address of a GPU or NVSwitch, not a bridge"
            ));
        }
        pci_bridges.push(addr);
    }
    if let Some(serial) = &g.serial
        && (serial.is_empty() || serial.len() >= 30)
    {
        return Err("serial must have 1 to 29 characters".into());
    }
    let fail = parse_fail(&g.fail)?;

    let mut nvlinks = BTreeMap::new();
    for (k, l) in g.nvlinks.iter().enumerate() {
        if model.nvlink_count == 0 {
            return Err(format!("nvlinks: {} has no NVLink", model.key));
        }
        if l.link >= model.nvlink_count {
            return Err(format!(
                "nvlinks[{k}]: link {} does not exist ({} has links 0-{})",
                l.link,
                model.key,
                model.nvlink_count - 1
            ));
        }
        let remote = PciAddress::parse(&l.remote)
            .ok_or_else(|| format!("nvlinks[{k}]: remote {:?} is not a PCI address", l.remote))?;
        if remote == pci {
            return Err(format!(
                "nvlinks[{k}]: link {} points at the GPU itself",
                l.link
            ));
        }
        if !gpu_addrs.contains(&remote) && !nvswitches.contains(&remote) {
            return Err(format!(
                "nvlinks[{k}]: remote {remote} is neither a GPU of the profile nor an NVSwitch"
            ));
        }
        if nvlinks.insert(l.link, remote).is_some() {
            return Err(format!("nvlinks[{k}]: link {} is listed twice", l.link));
        }
    }

    let fabric_spec = g
        .fabric
        .as_ref()
        .map(|f| fabric::validate(f, &model))
        .transpose()?;
    let fabric = Fabric::of(&model, fabric_spec);

    let (mig_current, mig_pending, mig, mig_created) = match &g.mig {
        None => (false, false, MigState::default(), 0),
        Some(spec) => {
            let table = model
                .mig
                .as_ref()
                .ok_or_else(|| format!("mig: {} is not MIG capable", model.key))?;
            let (state, created) = build_mig(spec, table, &g.uuid, mig_uuids)?;
            (
                spec.current,
                spec.pending.unwrap_or(spec.current),
                state,
                created,
            )
        }
    };

    // Replaced by `with_health`, which knows the driver version.
    let health = GpuHealth::healthy(&model, g.minor, nvlinks.keys().copied().collect(), "");
    Ok(Gpu {
        serial: g.serial.clone().unwrap_or_else(|| ids::serial_for(&g.uuid)),
        board_id: g.board_id.unwrap_or(
            (pci.domain << 16) | (u32::from(pci.bus) << 8) | (u32::from(pci.device) << 3),
        ),
        compute_mode: g.compute_mode.unwrap_or(ComputeMode::Default).value(),
        addressing_mode: g.addressing_mode.map(AddressingMode::value),
        model,
        uuid: g.uuid.clone(),
        pci,
        minor: g.minor,
        numa_node: g.numa_node,
        pcie_root: g.pcie_root.clone(),
        pci_bridges,
        mig_current,
        mig_pending,
        mig,
        mig_created,
        health,
        nvlinks,
        fabric,
        fail,
    })
}

fn build_mig(
    spec: &MigSpec,
    table: &MigTable,
    parent: &str,
    mig_uuids: &mut HashSet<String>,
) -> Result<(MigState, u64), String> {
    let mut state = MigState::default();
    let mut created = 0_u64;
    if !spec.current && !spec.devices.is_empty() {
        return Err("mig.devices: MIG devices exist only while MIG mode is current".into());
    }
    for (d, dev) in spec.devices.iter().enumerate() {
        let at = |e: String| format!("mig.devices[{d}]: {e}");
        let profile = table
            .profiles
            .iter()
            .find(|p| p.name == dev.profile)
            .ok_or_else(|| {
                let known: Vec<&str> = table.profiles.iter().map(|p| p.name.as_str()).collect();
                at(format!(
                    "profile {:?} is not one of {}",
                    dev.profile,
                    known.join(", ")
                ))
            })?;
        let gi = state
            .create_gpu_instance(table, profile, Some(dev.placement), None, 0)
            .map_err(|e| at(e.to_string()))?
            .id;
        let ci_profiles = profile.compute_instance_profiles();
        let cis: Vec<CiSpec> = match (&dev.compute_instances, &dev.uuid) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "uuid belongs on each of computeInstances when they are listed".into(),
                ));
            }
            (Some(list), None) => list.clone(),
            (None, uuid) => vec![CiSpec {
                profile: profile.name.clone(),
                placement: None,
                uuid: uuid.clone(),
            }],
        };
        for (c, ci) in cis.iter().enumerate() {
            let at = |e: String| format!("mig.devices[{d}].computeInstances[{c}]: {e}");
            let ci_profile = ci_profiles
                .iter()
                .find(|p| p.name == ci.profile)
                .ok_or_else(|| {
                    let known: Vec<&str> = ci_profiles.iter().map(|p| p.name.as_str()).collect();
                    at(format!(
                        "profile {:?} is not one of {}",
                        ci.profile,
                        known.join(", ")
                    ))
                })?;
            let uuid = match &ci.uuid {
                Some(u) if !ids::is_mig_uuid(u) => {
                    return Err(at(format!(
                        "uuid {u:?} is not like MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
                    )));
                }
                Some(u) => u.clone(),
                None => {
                    let taken: Vec<u32> = state
                        .gpu_instance(gi)
                        .map(|g| g.compute_instances.iter().map(|c| c.id).collect())
                        .unwrap_or_default();
                    let next = crate::mig::lowest_free_id(&taken);
                    ids::mig_uuid(parent, gi, next, created)
                }
            };
            if !mig_uuids.insert(uuid.clone()) {
                return Err(at(format!("uuid {uuid} is used twice")));
            }
            state
                .create_compute_instance(
                    gi,
                    profile.compute_slices,
                    ci_profile,
                    ci.placement,
                    None,
                    uuid,
                    0,
                )
                .map_err(|e| at(e.to_string()))?;
            created += 1;
        }
    }
    Ok((state, created))
}

#[cfg(test)]
mod tests;
