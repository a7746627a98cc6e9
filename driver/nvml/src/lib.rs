//! The NVML boundary of the GPU DRA driver.
//!
//! [`GpuBackend`] is everything the rest of the driver may ask of the GPUs.
//! It deals only in owned types ([`types`]), so the device model, the slice
//! publisher and the prepare code never see NVML handles. The production
//! implementation wraps `nvml-wrapper`; this crate is the only one in the
//! workspace allowed to contain `unsafe` code.

mod backend;
pub mod health;
pub mod naming;
pub mod topology;
pub mod types;

pub use backend::{DEFAULT_LIBRARY, NvmlBackend};
pub use health::{
    EventKind, EventWatch, HealthEvent, HealthPoll, HealthSource, LinkState, Liveness,
    RecoveryAction, RemapState,
};
pub use types::{
    ComputeMode, ComputeSlices, FabricInfo, GpuInfo, GpuProcess, MigComputeInstance, MigDevice,
    MigGpuInstance, MigInfo, MigMode, MigPlacement, MigProfile, NvLinkInfo, NvLinkRemote,
    SystemInfo,
};

/// Errors from the GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The NVML library could not be loaded or initialised.
    #[error("cannot initialise NVML from {library}: {reason}")]
    Init {
        /// Path or soname that was tried.
        library: String,
        /// What NVML or the loader said.
        reason: String,
    },
    /// An NVML call failed.
    #[error("NVML {call} failed{}: {reason}", gpu.map(|i| format!(" on GPU {i}")).unwrap_or_default())]
    Call {
        /// The NVML function or wrapper method.
        call: &'static str,
        /// The GPU index, when the call was about one GPU.
        gpu: Option<u32>,
        /// NVML's error text.
        reason: String,
    },
    /// The caller asked for something the GPU does not have or cannot do.
    #[error("{0}")]
    Invalid(String),
    /// The GPU, its driver or this backend cannot answer the query
    /// (NVML's NOT_SUPPORTED, or a library without the function).
    #[error("NVML {call} is not supported{}", gpu.map(|i| format!(" on GPU {i}")).unwrap_or_default())]
    NotSupported {
        /// The NVML function or backend method.
        call: &'static str,
        /// The GPU index, when the call was about one GPU.
        gpu: Option<u32>,
    },
    /// The GPU has fallen off the bus (NVML's GPU_IS_LOST).
    #[error("NVML {call} failed on GPU {gpu}: the GPU is lost")]
    GpuLost {
        /// The NVML function or wrapper method.
        call: &'static str,
        /// The GPU index.
        gpu: u32,
    },
}

/// Result alias for backend calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the driver may ask of a node's GPUs. Implementations are blocking:
/// async callers run them on `spawn_blocking` or a dedicated thread.
pub trait GpuBackend: Send + Sync + 'static {
    /// Driver-wide facts.
    fn system(&self) -> Result<SystemInfo>;

    /// Number of GPUs NVML sees.
    fn gpu_count(&self) -> Result<u32>;

    /// Everything about one GPU. An error affects this GPU only; callers skip
    /// it and publish the others.
    fn gpu(&self, index: u32) -> Result<GpuInfo>;

    /// The GPU's compute mode now. Prepares that change the mode read it
    /// here: one NVML query where [`GpuBackend::gpu`] makes dozens (every
    /// NVLink, every MIG profile). The default reads it from `gpu`.
    fn compute_mode(&self, index: u32) -> Result<ComputeMode> {
        Ok(self.gpu(index)?.compute_mode)
    }

    /// The GPU's MIG mode now, `None` when it is not MIG capable: one NVML
    /// query (see [`GpuBackend::compute_mode`]). The default reads it from
    /// `gpu`.
    fn mig_mode(&self, index: u32) -> Result<Option<MigMode>> {
        Ok(self.gpu(index)?.mig.map(|m| MigMode {
            current_enabled: m.current_enabled,
            pending_enabled: m.pending_enabled,
        }))
    }

    /// Enables or disables MIG mode (takes effect at once on Hopper and later;
    /// Ampere needs a reset, which the driver never does).
    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<()>;

    /// Creates a GPU instance of `profile_id` at `placement` and a default
    /// compute instance covering it, and returns the new MIG device. On
    /// failure nothing is left behind.
    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<MigDevice>;

    /// Destroys the compute instance and then the GPU instance. A GPU
    /// instance (or compute instance) that no longer exists counts as
    /// destroyed, so a retried unprepare succeeds.
    fn destroy_mig_device(
        &self,
        index: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<()>;

    /// Sets the compute mode.
    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<()>;

    /// The GPU instances of GPU `index` with their compute instances, by
    /// id; empty when MIG mode is off (or the GPU has no MIG).
    ///
    /// The default derives them from [`GpuBackend::gpu`]'s MIG devices, so
    /// it cannot see a GPU instance without compute instances;
    /// [`NvmlBackend`] lists them from NVML and sees those too.
    fn gpu_instances(&self, index: u32) -> Result<Vec<MigGpuInstance>> {
        let Some(mig) = self.gpu(index)?.mig else {
            return Ok(Vec::new());
        };
        let mut out: Vec<MigGpuInstance> = Vec::new();
        for d in mig.devices {
            let ci = MigComputeInstance {
                id: d.compute_instance_id,
                profile_id: d.profile_id,
                uuid: Some(d.uuid),
            };
            match out.iter_mut().find(|g| g.id == d.gpu_instance_id) {
                Some(gi) => gi.compute_instances.push(ci),
                None => out.push(MigGpuInstance {
                    id: d.gpu_instance_id,
                    profile_id: d.profile_id,
                    placement: d.placement,
                    compute_instances: vec![ci],
                }),
            }
        }
        out.sort_by_key(|g| g.id);
        Ok(out)
    }

    /// The processes NVML sees on GPU `index` (compute and graphics
    /// contexts, one entry per pid, ordered by pid); empty when none.
    ///
    /// The default is [`Error::NotSupported`], so backends that cannot
    /// see processes (test doubles) need not implement it; callers treat
    /// that as "unknown", not as "idle".
    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>> {
        Err(Error::NotSupported {
            call: "processes",
            gpu: Some(index),
        })
    }

    /// Destroys every compute instance of GPU instance `gpu_instance_id`
    /// and then the GPU instance; a GPU instance that no longer exists
    /// counts as destroyed.
    ///
    /// The default handles a GPU instance with exactly one compute instance
    /// (through [`GpuBackend::destroy_mig_device`]) or none left, and refuses
    /// any other; [`NvmlBackend`] handles every case.
    fn destroy_gpu_instance(&self, index: u32, gpu_instance_id: u32) -> Result<()> {
        let instances = self.gpu_instances(index)?;
        let Some(gi) = instances.iter().find(|g| g.id == gpu_instance_id) else {
            return Ok(());
        };
        match gi.compute_instances.as_slice() {
            [ci] => self.destroy_mig_device(index, gpu_instance_id, ci.id),
            _ => Err(Error::Invalid(format!(
                "GPU {index}: this backend cannot destroy GPU instance {gpu_instance_id} \
                 with {} compute instances",
                gi.compute_instances.len()
            ))),
        }
    }
}
