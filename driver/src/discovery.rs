//! Discovery of the node's GPUs through the NVML backend, plus sysfs topology.
//!
//! [`discover`] asks the backend for the driver-wide facts and every GPU on a
//! blocking thread (NVML calls can take long), skips and logs GPUs whose
//! queries fail, and adds each GPU's PCIe root and NUMA node from sysfs. The
//! result, an [`Inventory`], is plain data for the device model.

mod sysfs;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_nvml::{GpuBackend, GpuInfo, NvmlBackend, SystemInfo};

pub use sysfs::{PciTopology, SysfsError, is_device_name, pci_topology};

/// Flags of GPU discovery.
#[derive(Debug, Clone, clap::Args)]
pub struct Flags {
    /// Path of libnvidia-ml. Default: `libnvidia-ml.so.1` in the library
    /// directories of the (container) driver root when that is not `/`,
    /// else the system library.
    #[arg(long, env = "NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,

    /// Root of sysfs, where each GPU's PCIe root and NUMA node are read.
    #[arg(long, env = "SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
}

/// What discovery found on the node: the input of the device model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Driver-wide facts.
    pub system: SystemInfo,
    /// GPUs that answered every query, in NVML index order. GPUs whose queries
    /// failed are left out (and logged).
    pub gpus: Vec<DiscoveredGpu>,
}

/// One GPU with the topology facts read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredGpu {
    /// What NVML reported.
    pub info: GpuInfo,
    /// PCIe root complex, e.g. `pci0000:10`; `None` when sysfs has no entry.
    pub pcie_root: Option<String>,
    /// NUMA node; `None` when sysfs has no entry or reports -1.
    pub numa_node: Option<i64>,
}

/// Errors that stop discovery as a whole (a failing GPU does not).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NVML could not be loaded, or a node-wide query (driver version, GPU
    /// count) failed.
    #[error(transparent)]
    Backend(#[from] gpu_nvml::Error),
    /// The blocking discovery task panicked or was cancelled.
    #[error("GPU discovery task failed: {0}")]
    Task(String),
}

/// Opens the production NVML backend from `--nvml-lib` (or the system
/// library). Without NVML this is a clear [`Error::Backend`] naming the
/// library, never a panic.
pub fn open_backend(flags: &Flags) -> Result<Arc<dyn GpuBackend>, Error> {
    let backend = NvmlBackend::open(flags.nvml_lib.as_deref())?;
    Ok(Arc::new(backend))
}

/// Discovers the node's GPUs on a blocking thread; see [`discover_blocking`].
pub async fn discover(backend: Arc<dyn GpuBackend>, sysfs_root: &Path) -> Result<Inventory, Error> {
    let sysfs_root = sysfs_root.to_owned();
    tokio::task::spawn_blocking(move || discover_blocking(backend.as_ref(), &sysfs_root))
        .await
        .map_err(|e| Error::Task(e.to_string()))?
}

/// Discovers the node's GPUs. A GPU whose NVML query fails, or that repeats
/// the UUID or PCI bus id of a GPU already seen, is skipped with a warning;
/// the others are returned. Missing sysfs facts leave the attribute out.
pub fn discover_blocking(backend: &dyn GpuBackend, sysfs_root: &Path) -> Result<Inventory, Error> {
    let system = backend.system()?;
    let count = backend.gpu_count()?;
    let mut gpus = Vec::new();
    let mut uuids = HashSet::new();
    let mut bus_ids = HashSet::new();
    for index in 0..count {
        let info = match backend.gpu(index) {
            Ok(info) => info,
            Err(error) => {
                tracing::warn!(gpu = index, error = %error, "GPU skipped: NVML query failed");
                continue;
            }
        };
        if !uuids.insert(info.uuid.clone()) || !bus_ids.insert(info.pci_bus_id.clone()) {
            tracing::warn!(
                gpu = index,
                uuid = %info.uuid,
                pci_bus_id = %info.pci_bus_id,
                "GPU skipped: UUID or PCI bus id already seen on another GPU"
            );
            continue;
        }
        let topology = pci_topology(sysfs_root, &info.pci_bus_id, index);
        gpus.push(DiscoveredGpu {
            info,
            pcie_root: topology.pcie_root,
            numa_node: topology.numa_node,
        });
    }
    tracing::info!(
        driver_version = %system.driver_version,
        gpus = gpus.len(),
        skipped = count as usize - gpus.len(),
        "GPU discovery finished"
    );
    Ok(Inventory { system, gpus })
}
