//! The simulated machine behind an initialised library: the GPUs of the
//! profile with their mutable state (MIG mode, compute mode, instances), the
//! opaque handles NVML hands out for GPUs, MIG devices, GPU instances and
//! compute instances, failure injection, persistence to the state file, and
//! the MIG capability files (`caps`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::caps::{self, CapRoots};
use crate::codes::{self, Code};
use crate::config::Config;
use crate::error::Error;
use crate::exports;
use crate::hardware::{CiProfile, GiProfile, MigTable};
use crate::ids;
use crate::mig::{ComputeInstance, GpuInstance, MigState};
use crate::pci::PciAddress;
use crate::profile::{ComputeMode, Gpu, Profile};
use crate::state::{self, ComputeInstanceState, GpuInstanceState, GpuState, StateFile};

/// Kinds of handle, in the top byte of the handle value.
const TAG_GPU: u64 = 0xA1;
const TAG_MIG_DEVICE: u64 = 0xA2;
const TAG_GPU_INSTANCE: u64 = 0xA3;
const TAG_COMPUTE_INSTANCE: u64 = 0xA4;

/// Process-wide counters: every machine gets a new generation, every GI/CI a
/// new serial, so handles from an earlier init or of destroyed instances are
/// recognised as invalid.
static GENERATION: AtomicU32 = AtomicU32::new(1);
static SERIAL: AtomicU32 = AtomicU32::new(1);

fn next_serial() -> u64 {
    u64::from(SERIAL.fetch_add(1, Ordering::Relaxed))
}

/// An opaque handle value (a pointer-sized token the caller never
/// dereferences): tag, machine generation, GPU index and serial.
pub type Handle = u64;

/// What a device handle (`nvmlDevice_t`) designates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceRef {
    /// A whole GPU.
    Gpu(usize),
    /// A MIG device: GPU index, GI id, CI id.
    Mig(usize, u32, u32),
}

impl DeviceRef {
    /// The GPU the handle belongs to.
    pub fn gpu(self) -> usize {
        match self {
            DeviceRef::Gpu(g) | DeviceRef::Mig(g, _, _) => g,
        }
    }
}

/// The simulated machine.
#[derive(Clone, Debug)]
pub struct Machine {
    /// The validated profile (static facts).
    pub profile: Profile,
    /// The GPUs with their live state.
    pub gpus: Vec<Gpu>,
    generation: u64,
    state_path: Option<PathBuf>,
    caps: CapRoots,
}

impl Machine {
    /// Builds the machine of `config`: the profile, then the state file over it.
    pub fn build(config: &Config) -> Result<Machine, Error> {
        let profile = Profile::load(&config.profile)?;
        let mut machine = Machine::from_profile(profile);
        machine.state_path.clone_from(&config.state);
        if let Some(path) = &config.state
            && let Some(state) = StateFile::read(path)?
        {
            machine
                .apply_state(&state)
                .map_err(|message| Error::State {
                    path: path.clone(),
                    message,
                })?;
        }
        machine.caps = CapRoots {
            proc_root: config.proc_root.clone(),
            dev_root: config.dev_root.clone(),
        };
        // The kernel has the files of the instances that exist at "boot".
        for gpu in &machine.gpus {
            caps::sync_gpu(&machine.caps, gpu)?;
        }
        Ok(machine)
    }

    /// The machine of a profile, without a state file.
    pub fn from_profile(profile: Profile) -> Machine {
        let mut gpus = profile.gpus.clone();
        for gpu in &mut gpus {
            for gi in &mut gpu.mig.gpu_instances {
                gi.serial = next_serial();
                for ci in &mut gi.compute_instances {
                    ci.serial = next_serial();
                }
            }
        }
        Machine {
            profile,
            gpus,
            generation: u64::from(GENERATION.fetch_add(1, Ordering::Relaxed) & 0xffff),
            state_path: None,
            caps: CapRoots::default(),
        }
    }

    // ---- handles ---------------------------------------------------------

    fn encode(&self, tag: u64, gpu: usize, low: u64) -> Handle {
        (tag << 56) | (self.generation << 40) | ((gpu as u64 & 0xff) << 32) | (low & 0xffff_ffff)
    }

    /// Splits a handle of kind `tag` into (GPU index, low 32 bits).
    fn decode(&self, handle: Handle, tag: u64) -> Option<(usize, u64)> {
        if handle >> 56 != tag || (handle >> 40) & 0xffff != self.generation {
            return None;
        }
        let gpu = ((handle >> 32) & 0xff) as usize;
        (gpu < self.gpus.len()).then_some((gpu, handle & 0xffff_ffff))
    }

    /// Handle of GPU `index`.
    pub fn gpu_handle(&self, index: usize) -> Handle {
        self.encode(TAG_GPU, index, 0)
    }

    /// Handle of the MIG device of a compute instance.
    pub fn mig_handle(&self, gpu: usize, ci: &ComputeInstance) -> Handle {
        self.encode(TAG_MIG_DEVICE, gpu, ci.serial)
    }

    /// Handle of a GPU instance.
    pub fn gi_handle(&self, gpu: usize, gi: &GpuInstance) -> Handle {
        self.encode(TAG_GPU_INSTANCE, gpu, gi.serial)
    }

    /// Handle of a compute instance.
    pub fn ci_handle(&self, gpu: usize, ci: &ComputeInstance) -> Handle {
        self.encode(TAG_COMPUTE_INSTANCE, gpu, ci.serial)
    }

    fn find_ci(&self, gpu: usize, serial: u64) -> Option<(&GpuInstance, &ComputeInstance)> {
        self.gpus[gpu]
            .mig
            .mig_devices()
            .find(|(_, ci)| ci.serial & 0xffff_ffff == serial)
    }

    /// Resolves a device handle (GPU or MIG device).
    pub fn device(&self, handle: Handle) -> Result<DeviceRef, Code> {
        if let Some((gpu, _)) = self.decode(handle, TAG_GPU) {
            return Ok(DeviceRef::Gpu(gpu));
        }
        if let Some((gpu, serial)) = self.decode(handle, TAG_MIG_DEVICE) {
            let (gi, ci) = self.find_ci(gpu, serial).ok_or(codes::INVALID_ARGUMENT)?;
            return Ok(DeviceRef::Mig(gpu, gi.id, ci.id));
        }
        Err(codes::INVALID_ARGUMENT)
    }

    /// Resolves a handle that must designate a whole GPU; a MIG device
    /// handle is `mig_code`.
    pub fn full_gpu(&self, handle: Handle, mig_code: Code) -> Result<usize, Code> {
        match self.device(handle)? {
            DeviceRef::Gpu(g) => Ok(g),
            DeviceRef::Mig(..) => Err(mig_code),
        }
    }

    /// Resolves a GPU instance handle to (GPU index, GI id).
    pub fn gpu_instance(&self, handle: Handle) -> Result<(usize, u32), Code> {
        let (gpu, serial) = self
            .decode(handle, TAG_GPU_INSTANCE)
            .ok_or(codes::INVALID_ARGUMENT)?;
        self.gpus[gpu]
            .mig
            .gpu_instances
            .iter()
            .find(|g| g.serial & 0xffff_ffff == serial)
            .map(|g| (gpu, g.id))
            .ok_or(codes::INVALID_ARGUMENT)
    }

    /// Resolves a compute instance handle to (GPU index, GI id, CI id).
    pub fn compute_instance(&self, handle: Handle) -> Result<(usize, u32, u32), Code> {
        let (gpu, serial) = self
            .decode(handle, TAG_COMPUTE_INSTANCE)
            .ok_or(codes::INVALID_ARGUMENT)?;
        let (gi, ci) = self.find_ci(gpu, serial).ok_or(codes::INVALID_ARGUMENT)?;
        Ok((gpu, gi.id, ci.id))
    }

    // ---- lookups ---------------------------------------------------------

    /// The GPU instance `id` of GPU `gpu`.
    pub fn gi(&self, gpu: usize, id: u32) -> Result<&GpuInstance, Code> {
        self.gpus[gpu]
            .mig
            .gpu_instance(id)
            .ok_or(codes::INVALID_ARGUMENT)
    }

    /// The compute instance `ci` of GPU instance `gi`.
    pub fn ci(&self, gpu: usize, gi: u32, ci: u32) -> Result<&ComputeInstance, Code> {
        self.gi(gpu, gi)?
            .compute_instances
            .iter()
            .find(|c| c.id == ci)
            .ok_or(codes::INVALID_ARGUMENT)
    }

    /// The MIG table of a GPU; NOT_SUPPORTED when it has none.
    pub fn mig_table(&self, gpu: usize) -> Result<&MigTable, Code> {
        self.gpus[gpu]
            .model
            .mig
            .as_ref()
            .ok_or(codes::NOT_SUPPORTED)
    }

    /// The MIG table of a GPU whose MIG mode is current; NOT_SUPPORTED
    /// otherwise, as NVML answers MIG calls on such a GPU.
    pub fn mig_enabled_table(&self, gpu: usize) -> Result<&MigTable, Code> {
        let table = self.mig_table(gpu)?;
        if self.gpus[gpu].mig_current {
            Ok(table)
        } else {
            Err(codes::NOT_SUPPORTED)
        }
    }

    /// The GI profile of a GPU instance.
    pub fn gi_profile(&self, gpu: usize, gi: &GpuInstance) -> Result<&GiProfile, Code> {
        self.mig_table(gpu)?
            .profiles
            .iter()
            .find(|p| p.id == gi.profile_id)
            .ok_or(codes::UNKNOWN)
    }

    /// The CI profile of a compute instance.
    pub fn ci_profile(
        &self,
        gpu: usize,
        gi: &GpuInstance,
        ci: &ComputeInstance,
    ) -> Result<CiProfile, Code> {
        self.gi_profile(gpu, gi)?
            .compute_instance_profiles()
            .into_iter()
            .find(|p| p.id == ci.profile_id)
            .ok_or(codes::UNKNOWN)
    }

    /// The GPU with this UUID, or the MIG device with this UUID.
    pub fn by_uuid(&self, uuid: &str) -> Option<Handle> {
        for (i, gpu) in self.gpus.iter().enumerate() {
            if gpu.uuid.eq_ignore_ascii_case(uuid) {
                return Some(self.gpu_handle(i));
            }
            if let Some((_, ci)) = gpu
                .mig
                .mig_devices()
                .find(|(_, c)| c.uuid.eq_ignore_ascii_case(uuid))
            {
                return Some(self.mig_handle(i, ci));
            }
        }
        None
    }

    /// The index of the GPU at a PCI address.
    pub fn by_pci(&self, address: PciAddress) -> Option<usize> {
        self.gpus.iter().position(|g| g.pci == address)
    }

    // ---- failure injection -----------------------------------------------

    /// The failure a profile injects into `function` (globally, or for `gpu`);
    /// every call on a GPU that fell off the bus (`lose`, `health.lost`) is
    /// GPU_IS_LOST.
    pub fn injected(&self, function: &str, gpu: Option<usize>) -> Result<(), Code> {
        if let Some(g) = gpu
            && crate::faults::is_lost(g)
        {
            return Err(codes::GPU_IS_LOST);
        }
        let global = self.profile.fail.iter();
        let local = gpu.into_iter().flat_map(|g| self.gpus[g].fail.iter());
        match global
            .chain(local)
            .find(|(key, _)| exports::key_matches(key, function))
        {
            Some((_, code)) => Err(*code),
            None => Ok(()),
        }
    }

    // ---- mutation and persistence ----------------------------------------

    /// Applies `change` to a copy of GPU `gpu`, brings its MIG capability
    /// files in line and saves the state file (when configured), and only
    /// then keeps the copy: a failed write changes nothing (the capability
    /// files are put back) and is reported as UNKNOWN.
    pub fn mutate<R>(
        &mut self,
        gpu: usize,
        change: impl FnOnce(&mut Gpu) -> Result<R, Code>,
    ) -> Result<R, Code> {
        let mut copy = self.gpus[gpu].clone();
        let result = change(&mut copy)?;
        let saved =
            caps::sync_change(&self.caps, &self.gpus[gpu], &copy).and_then(|()| {
                match &self.state_path {
                    Some(path) => self.state_file_with(gpu, &copy).write(path),
                    None => Ok(()),
                }
            });
        if let Err(e) = saved {
            eprintln!("mock-nvml: {e}");
            if let Err(e) = caps::sync_gpu(&self.caps, &self.gpus[gpu]) {
                eprintln!("mock-nvml: putting the capability files back: {e}");
            }
            return Err(codes::UNKNOWN);
        }
        self.gpus[gpu] = copy;
        Ok(result)
    }

    /// The state file describing this machine.
    pub fn state_file(&self) -> StateFile {
        StateFile {
            version: state::VERSION,
            gpus: self.gpus.iter().map(gpu_state).collect(),
        }
    }

    fn state_file_with(&self, index: usize, replacement: &Gpu) -> StateFile {
        let mut file = self.state_file();
        file.gpus[index] = gpu_state(replacement);
        file
    }

    fn apply_state(&mut self, file: &StateFile) -> Result<(), String> {
        let mut seen = HashSet::new();
        let mut mig_uuids = HashSet::new();
        for entry in &file.gpus {
            let index = self
                .gpus
                .iter()
                .position(|g| g.uuid == entry.uuid)
                .ok_or_else(|| format!("GPU {} is not in the profile", entry.uuid))?;
            if !seen.insert(index) {
                return Err(format!("GPU {} is listed twice", entry.uuid));
            }
            let gpu = &mut self.gpus[index];
            let restored = restore_gpu(gpu, entry, &mut mig_uuids)
                .map_err(|e| format!("GPU {}: {e}", entry.uuid))?;
            *gpu = restored;
        }
        Ok(())
    }
}

fn gpu_state(gpu: &Gpu) -> GpuState {
    let table = gpu.model.mig.as_ref();
    let gi_name = |id: u32| {
        table
            .and_then(|t| t.profiles.iter().find(|p| p.id == id))
            .map(|p| (p.name.clone(), p.compute_instance_profiles()))
    };
    GpuState {
        uuid: gpu.uuid.clone(),
        mig_current: gpu.mig_current,
        mig_pending: gpu.mig_pending,
        compute_mode: ComputeMode::from_value(gpu.compute_mode).unwrap_or(ComputeMode::Default),
        mig_created: gpu.mig_created,
        gpu_instances: gpu
            .mig
            .gpu_instances
            .iter()
            .map(|gi| {
                let (name, cis) = gi_name(gi.profile_id).unwrap_or_default();
                GpuInstanceState {
                    id: gi.id,
                    profile: name,
                    profile_id: gi.profile_id,
                    start: gi.start,
                    size: gi.size,
                    compute_instances: gi
                        .compute_instances
                        .iter()
                        .map(|ci| ComputeInstanceState {
                            id: ci.id,
                            profile: cis
                                .iter()
                                .find(|p| p.id == ci.profile_id)
                                .map(|p| p.name.clone())
                                .unwrap_or_default(),
                            profile_id: ci.profile_id,
                            start: ci.start,
                            uuid: ci.uuid.clone(),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Rebuilds a GPU's mutable state from its state-file entry, checking it
/// against the hardware rules as if the instances were created again.
fn restore_gpu(
    gpu: &Gpu,
    entry: &GpuState,
    mig_uuids: &mut HashSet<String>,
) -> Result<Gpu, String> {
    let mut gpu = gpu.clone();
    gpu.compute_mode = entry.compute_mode.value();
    gpu.mig_created = entry.mig_created;
    let Some(table) = gpu.model.mig.clone() else {
        if entry.mig_current || entry.mig_pending || !entry.gpu_instances.is_empty() {
            return Err(format!("{} is not MIG capable", gpu.model.key));
        }
        return Ok(gpu);
    };
    gpu.mig_current = entry.mig_current;
    gpu.mig_pending = entry.mig_pending;
    if !entry.mig_current && !entry.gpu_instances.is_empty() {
        return Err("GPU instances exist while MIG mode is disabled".into());
    }
    let mut mig = MigState::default();
    for gi in &entry.gpu_instances {
        let profile = table
            .profiles
            .iter()
            .find(|p| p.id == gi.profile_id)
            .ok_or_else(|| {
                format!(
                    "GPU instance {}: unknown profile id {}",
                    gi.id, gi.profile_id
                )
            })?;
        if gi.size != profile.placement_size {
            return Err(format!(
                "GPU instance {}: size {} is not the size of {} ({})",
                gi.id, gi.size, profile.name, profile.placement_size
            ));
        }
        mig.create_gpu_instance(&table, profile, Some(gi.start), Some(gi.id), next_serial())
            .map_err(|e| format!("GPU instance {}: {e}", gi.id))?;
        let ci_profiles = profile.compute_instance_profiles();
        for ci in &gi.compute_instances {
            let ci_profile = ci_profiles
                .iter()
                .find(|p| p.id == ci.profile_id)
                .ok_or_else(|| {
                    format!(
                        "compute instance {} of GPU instance {}: unknown profile id {}",
                        ci.id, gi.id, ci.profile_id
                    )
                })?;
            if !ids::is_mig_uuid(&ci.uuid) || !mig_uuids.insert(ci.uuid.clone()) {
                return Err(format!(
                    "compute instance {} of GPU instance {}: uuid {:?} is malformed or used twice",
                    ci.id, gi.id, ci.uuid
                ));
            }
            mig.create_compute_instance(
                gi.id,
                profile.compute_slices,
                ci_profile,
                Some(ci.start),
                Some(ci.id),
                ci.uuid.clone(),
                next_serial(),
            )
            .map_err(|e| format!("compute instance {} of GPU instance {}: {e}", ci.id, gi.id))?;
        }
    }
    gpu.mig = mig;
    Ok(gpu)
}

/// Creates a GPU instance on a GPU (used by the C functions).
pub fn create_gpu_instance(
    gpu: &mut Gpu,
    profile_id: u32,
    start: Option<u32>,
) -> Result<u32, Code> {
    let table = gpu.model.mig.clone().ok_or(codes::NOT_SUPPORTED)?;
    if !gpu.mig_current {
        return Err(codes::NOT_SUPPORTED);
    }
    let profile = table
        .profiles
        .iter()
        .find(|p| p.id == profile_id)
        .ok_or(codes::INVALID_ARGUMENT)?;
    gpu.mig
        .create_gpu_instance(&table, profile, start, None, next_serial())
        .map(|g| g.id)
        .map_err(|e| e.code())
}

/// Creates a compute instance in GPU instance `gi` (used by the C functions).
pub fn create_compute_instance(
    gpu: &mut Gpu,
    gi: u32,
    ci_profile_id: u32,
    start: Option<u32>,
) -> Result<u32, Code> {
    let table = gpu.model.mig.clone().ok_or(codes::NOT_SUPPORTED)?;
    let instance = gpu.mig.gpu_instance(gi).ok_or(codes::INVALID_ARGUMENT)?;
    let profile = table
        .profiles
        .iter()
        .find(|p| p.id == instance.profile_id)
        .ok_or(codes::UNKNOWN)?;
    let ci_profile = profile
        .compute_instance_profiles()
        .into_iter()
        .find(|p| p.id == ci_profile_id)
        .ok_or(codes::NOT_SUPPORTED)?;
    let taken: Vec<u32> = instance.compute_instances.iter().map(|c| c.id).collect();
    let next_id = crate::mig::lowest_free_id(&taken);
    let uuid = ids::mig_uuid(&gpu.uuid, gi, next_id, gpu.mig_created);
    let id = gpu
        .mig
        .create_compute_instance(
            gi,
            profile.compute_slices,
            &ci_profile,
            start,
            None,
            uuid,
            next_serial(),
        )
        .map_err(|e| e.code())?
        .id;
    gpu.mig_created += 1;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str) -> Machine {
        let path = format!("{}/profiles/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        Machine::from_profile(Profile::load(std::path::Path::new(&path)).unwrap())
    }

    #[test]
    fn handles_round_trip_and_reject_foreign_values() {
        let m = machine("dgx-a100");
        let h = m.gpu_handle(3);
        assert_eq!(m.device(h), Ok(DeviceRef::Gpu(3)));
        let (gi, ci) = m.gpus[1].mig.mig_devices().nth(2).unwrap();
        let mig = m.mig_handle(1, ci);
        assert_eq!(m.device(mig), Ok(DeviceRef::Mig(1, gi.id, ci.id)));
        assert_eq!(
            m.full_gpu(mig, codes::NOT_SUPPORTED),
            Err(codes::NOT_SUPPORTED)
        );
        assert_eq!(m.device(0), Err(codes::INVALID_ARGUMENT));
        assert_eq!(m.device(0xdead_beef), Err(codes::INVALID_ARGUMENT));
        assert_eq!(m.device(m.gi_handle(1, gi)), Err(codes::INVALID_ARGUMENT));
        // a GPU index past the end
        assert_eq!(
            m.device(m.encode(TAG_GPU, 8, 0)),
            Err(codes::INVALID_ARGUMENT)
        );
        // handles of another machine (another init) are stale
        let other = machine("dgx-a100");
        assert_eq!(other.device(h), Err(codes::INVALID_ARGUMENT));
    }

    #[test]
    fn destroyed_instances_invalidate_their_handles() {
        let mut m = machine("dgx-a100");
        let (gi, ci) = {
            let (gi, ci) = m.gpus[0].mig.mig_devices().next().unwrap();
            (gi.clone(), ci.clone())
        };
        let ci_handle = m.ci_handle(0, &ci);
        assert_eq!(m.compute_instance(ci_handle), Ok((0, gi.id, ci.id)));
        m.mutate(0, |g| {
            g.mig
                .destroy_compute_instance(gi.id, ci.id)
                .map_err(|e| e.code())
        })
        .unwrap();
        assert_eq!(m.compute_instance(ci_handle), Err(codes::INVALID_ARGUMENT));
        assert_eq!(m.device(m.mig_handle(0, &ci)), Err(codes::INVALID_ARGUMENT));
    }

    #[test]
    fn failures_are_injected_per_gpu_and_globally() {
        let path = format!("{}/profiles/t4-inference.yaml", env!("CARGO_MANIFEST_DIR"));
        let mut text = std::fs::read_to_string(path).unwrap();
        text = text.replacen(
            "  - model: T4\n",
            "  - model: T4\n    fail: {nvmlDeviceGetMemoryInfo: GPU_IS_LOST}\n",
            1,
        );
        text.push_str("fail: {nvmlSystemGetDriverVersion: NO_PERMISSION}\n");
        let m = Machine::from_profile(Profile::parse(&text).unwrap());
        assert_eq!(m.injected("nvmlDeviceGetMemoryInfo_v2", Some(0)), Err(15));
        assert_eq!(m.injected("nvmlDeviceGetMemoryInfo_v2", Some(1)), Ok(()));
        assert_eq!(m.injected("nvmlDeviceGetName", Some(0)), Ok(()));
        assert_eq!(m.injected("nvmlSystemGetDriverVersion", None), Err(4));
    }

    #[test]
    fn a_failed_save_changes_nothing() {
        let config = Config {
            profile: format!("{}/profiles/mixed.yaml", env!("CARGO_MANIFEST_DIR")).into(),
            state: Some("/nonexistent-mock-nvml-dir/state.json".into()),
            proc_root: None,
            dev_root: None,
            control: None,
        };
        let mut m = Machine::build(&config).unwrap();
        let change = |g: &mut Gpu| {
            g.compute_mode = 3;
            Ok(())
        };
        assert_eq!(m.mutate(0, change), Err(codes::UNKNOWN));
        assert_eq!(m.gpus[0].compute_mode, 0);
    }

    #[test]
    fn a_failed_capability_write_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("not-a-dir");
        std::fs::write(&blocked, "").unwrap();
        let mut m = machine("mixed");
        m.caps = CapRoots {
            proc_root: None,
            dev_root: Some(blocked),
        };
        let before = m.gpus[1].mig.clone();
        assert_eq!(
            m.mutate(1, |g| create_gpu_instance(g, 19, None)),
            Err(codes::UNKNOWN)
        );
        assert_eq!(m.gpus[1].mig, before);
        // With the roots usable again, the same change goes through.
        m.caps = CapRoots {
            proc_root: None,
            dev_root: Some(dir.path().join("root")),
        };
        let gi = m.mutate(1, |g| create_gpu_instance(g, 19, None)).unwrap();
        let minor = caps::gi_minor(m.gpus[1].minor, gi).unwrap();
        assert!(
            dir.path()
                .join(format!("root/dev/nvidia-caps/nvidia-cap{minor}"))
                .is_file()
        );
    }

    #[test]
    fn created_instances_get_fresh_uuids() {
        let mut m = machine("mixed");
        let gi = m.mutate(1, |g| create_gpu_instance(g, 19, None)).unwrap();
        let a = m
            .mutate(1, |g| create_compute_instance(g, gi, 0, None))
            .unwrap();
        let first = m.ci(1, gi, a).unwrap().uuid.clone();
        m.mutate(1, |g| {
            g.mig.destroy_compute_instance(gi, a).map_err(|e| e.code())
        })
        .unwrap();
        let b = m
            .mutate(1, |g| create_compute_instance(g, gi, 0, None))
            .unwrap();
        assert_eq!(a, b, "the CI id is reused");
        assert_ne!(
            m.ci(1, gi, b).unwrap().uuid,
            first,
            "but the MIG UUID is new"
        );
        assert_eq!(
            m.mutate(0, |g| create_gpu_instance(g, 19, None)),
            Err(codes::NOT_SUPPORTED)
        );
        assert_eq!(
            m.mutate(2, |g| create_gpu_instance(g, 19, None)),
            Err(codes::NOT_SUPPORTED)
        );
    }
}
