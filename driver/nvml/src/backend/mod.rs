//! The production [`GpuBackend`]: nvml-wrapper over the real (or the
//! project's fake) `libnvidia-ml.so`.
//!
//! Handle caching: nvml-wrapper's `Device<'nvml>` borrows the `Nvml`, so it
//! cannot live in the same struct. The backend keeps the `Nvml` and a map of
//! raw device handles (index to handle), filled on first use of each GPU; a
//! `Device` is rebuilt from the cached handle for free on every call. A GPU
//! whose handle lookup fails is not cached and is retried next time.
//!
//! All methods block; NVML is thread-safe, so the backend is `Send + Sync`
//! and may be called from several threads at once (e.g. MIG changes on
//! different GPUs).

mod health;
mod mig;
mod processes;
mod query;
mod raw;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::{
    ComputeMode, Error, GpuBackend, GpuInfo, GpuProcess, MigDevice, MigGpuInstance, MigMode,
    MigPlacement, Result, SystemInfo,
};

use raw::RawDevice;

/// The soname loaded when no library path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// [`GpuBackend`] over nvml-wrapper.
pub struct NvmlBackend {
    /// Shared with the event watches of [`crate::HealthSource::watch`], so
    /// NVML stays initialised while a watch lives.
    nvml: Arc<Nvml>,
    library: String,
    handles: Mutex<HashMap<u32, RawDevice>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads NVML from `lib` (the system's `libnvidia-ml.so.1` when `None`)
    /// and initialises it. A missing library, a library without NVML's entry
    /// points or a failing `nvmlInit` is an [`Error::Init`] naming the library;
    /// when the library explains a failed init itself (the project's fake
    /// NVML exports `mockNvmlLastError`), the explanation is part of it.
    pub fn open(lib: Option<&Path>) -> Result<Self> {
        let library = lib.map_or_else(|| DEFAULT_LIBRARY.to_owned(), |p| p.display().to_string());
        let path: &OsStr = lib.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        // Held across init: nvml-wrapper unloads its copy when init fails,
        // and the explanation lives in the library.
        let loaded = raw::LoadedLibrary::open(path).ok();
        let nvml = Nvml::builder().lib_path(path).init().map_err(|e| {
            let mut reason = init_reason(&e);
            if let Some(why) = loaded.as_ref().and_then(raw::LoadedLibrary::last_error) {
                reason.push_str(": ");
                reason.push_str(&why);
            }
            Error::Init {
                library: library.clone(),
                reason,
            }
        })?;
        drop(loaded);
        tracing::info!(library = %library, "NVML initialised");
        Ok(Self {
            nvml: Arc::new(nvml),
            library,
            handles: Mutex::new(HashMap::new()),
        })
    }

    /// The library this backend loaded (path or soname).
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The cached handle of GPU `index`, looked up on first use.
    fn handle(&self, index: u32) -> Result<RawDevice> {
        self.health_handle(index)
            .map_err(call("nvmlDeviceGetHandleByIndex", index))
    }

    fn lock_handles(&self) -> std::sync::MutexGuard<'_, HashMap<u32, RawDevice>> {
        // The map holds plain handles: a panic while holding the lock cannot
        // leave it half-updated, so a poisoned lock is still usable.
        self.handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Explains an init failure in a way that tells the operator what to do.
fn init_reason(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!(
            "the library cannot be loaded ({inner}); is the NVIDIA driver installed, or is --nvml-lib/NVML_LIB pointing at it?"
        ),
        NvmlError::FailedToLoadSymbol(s) => format!("the library lacks NVML's entry points ({s})"),
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_owned(),
        other => other.to_string(),
    }
}

/// Maps an NVML error of one call on one GPU to [`Error::Call`].
pub(crate) fn call(name: &'static str, gpu: u32) -> impl FnOnce(NvmlError) -> Error {
    move |e| Error::Call {
        call: name,
        gpu: Some(gpu),
        reason: e.to_string(),
    }
}

/// Maps an NVML error of a node-wide call to [`Error::Call`].
fn system_call(name: &'static str) -> impl FnOnce(NvmlError) -> Error {
    move |e| Error::Call {
        call: name,
        gpu: None,
        reason: e.to_string(),
    }
}

impl GpuBackend for NvmlBackend {
    fn system(&self) -> Result<SystemInfo> {
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(system_call("nvmlSystemGetDriverVersion"))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(system_call("nvmlSystemGetCudaDriverVersion_v2"))?;
        let cuda = u32::try_from(cuda).map_err(|_| Error::Call {
            call: "nvmlSystemGetCudaDriverVersion_v2",
            gpu: None,
            reason: format!("negative CUDA driver version {cuda}"),
        })?;
        Ok(SystemInfo {
            driver_version,
            cuda_driver_version: (cuda / 1000, (cuda % 1000) / 10),
        })
    }

    fn gpu_count(&self) -> Result<u32> {
        self.nvml
            .device_count()
            .map_err(system_call("nvmlDeviceGetCount"))
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo> {
        let handle = self.handle(index)?;
        query::gpu_info(&self.nvml, handle, index)
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode> {
        let device = self.handle(index)?.device(&self.nvml);
        query::compute_mode(&device, index)
    }

    fn mig_mode(&self, index: u32) -> Result<Option<MigMode>> {
        let device = self.handle(index)?.device(&self.nvml);
        query::mig_mode(&device, index)
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<()> {
        let device = self.handle(index)?.device(&self.nvml);
        let activation = device
            .set_mig_mode(enabled)
            .map_err(call("nvmlDeviceSetMigMode", index))?;
        if activation != 0 {
            // The mode is pending (e.g. Ampere needs a GPU reset); the caller
            // sees it in MigInfo::current_enabled/pending_enabled.
            tracing::warn!(
                gpu = index,
                enabled,
                activation = %NvmlError::from(activation),
                "MIG mode change is pending"
            );
        }
        Ok(())
    }

    fn create_mig_device(
        &self,
        index: u32,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<MigDevice> {
        let handle = self.handle(index)?;
        mig::create(&self.nvml, handle, index, profile_id, placement)
    }

    fn destroy_mig_device(
        &self,
        index: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<()> {
        let handle = self.handle(index)?;
        mig::destroy(
            &self.nvml,
            handle,
            index,
            gpu_instance_id,
            compute_instance_id,
        )
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<()> {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as Nv;
        let mut device = self.handle(index)?.device(&self.nvml);
        let mode = match mode {
            ComputeMode::Default => Nv::Default,
            ComputeMode::ExclusiveProcess => Nv::ExclusiveProcess,
            ComputeMode::Prohibited => Nv::Prohibited,
        };
        device
            .set_compute_mode(mode)
            .map_err(call("nvmlDeviceSetComputeMode", index))
    }

    fn gpu_instances(&self, index: u32) -> Result<Vec<MigGpuInstance>> {
        let handle = self.handle(index)?;
        mig::list(&self.nvml, handle, index)
    }

    fn destroy_gpu_instance(&self, index: u32, gpu_instance_id: u32) -> Result<()> {
        let handle = self.handle(index)?;
        mig::destroy_gpu_instance(&self.nvml, handle, index, gpu_instance_id)
    }

    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>> {
        // NVML's own error, so that a GPU lost before its first use is
        // `Error::GpuLost` too.
        let device = self
            .health_handle(index)
            .map_err(processes::error("nvmlDeviceGetHandleByIndex", index))?
            .device(&self.nvml);
        processes::processes(&device, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_init_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libnvidia-ml.so.1");
        let err = NvmlBackend::open(Some(&lib)).unwrap_err();
        let Error::Init { library, reason } = &err else {
            panic!("not an init error: {err}")
        };
        assert_eq!(library, &lib.display().to_string());
        assert!(reason.contains("cannot be loaded"), "{reason}");
        assert!(
            err.to_string().starts_with("cannot initialise NVML from "),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_library_is_an_init_error() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&lib, b"not an ELF file").unwrap();
        let err = NvmlBackend::open(Some(&lib)).unwrap_err();
        assert!(matches!(err, Error::Init { .. }), "{err}");
    }

    #[test]
    fn backend_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NvmlBackend>();
    }
}
