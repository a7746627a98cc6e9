//! The NVML boundary of the GPU DRA driver.
//!
//! [`GpuBackend`] is everything the rest of the driver may ask of the GPUs.
//! It deals only in owned types ([`types`]), so the device model, the slice
//! publisher and the prepare code never see NVML handles. The production
//! implementation wraps `nvml-wrapper`; this crate is the only one in the
//! workspace allowed to contain `unsafe` code.

mod backend;
pub mod naming;
pub mod types;

pub use backend::{DEFAULT_LIBRARY, NvmlBackend};
pub use types::{
    ComputeMode, ComputeSlices, GpuInfo, MigDevice, MigInfo, MigPlacement, MigProfile, NvLinkInfo,
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
}
