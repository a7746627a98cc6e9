//! A GPU's place in the machine, read from sysfs: the PCIe root complex it
//! hangs off and its NUMA node. Facts sysfs does not have are left out with a
//! warning, never guessed.
//!
//! `<sysfs>/bus/pci/devices/<bus id>` is a symlink into
//! `<sysfs>/devices/pci<domain>:<bus>/.../<bus id>`; the first directory under
//! `devices` names the root complex (`pci0000:10`), and the device directory
//! holds `numa_node` (`-1` when the platform has no NUMA information).

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// The sysfs facts of one PCI device; `None` where sysfs has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PciTopology {
    /// PCIe root complex, e.g. `pci0000:10`.
    pub pcie_root: Option<String>,
    /// NUMA node of the device.
    pub numa_node: Option<i64>,
}

/// Why a sysfs fact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The bus id cannot name a sysfs entry (empty, or not hex, `:` and `.`).
    #[error("PCI bus id {0:?} is not a sysfs device name")]
    BadBusId(String),
    /// The device's sysfs entry or one of its files is missing or unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The device's entry resolves to a path outside the sysfs root.
    #[error("{path} resolves to {target}, outside {root}")]
    OutsideRoot {
        /// The device's entry.
        path: PathBuf,
        /// Where it resolves to.
        target: PathBuf,
        /// The sysfs root.
        root: PathBuf,
    },
    /// The resolved path has no `devices/pci<domain>:<bus>` component.
    #[error("{target} does not lie under a PCI root complex (devices/pciDDDD:BB)")]
    NoPcieRoot {
        /// Where the device's entry resolves to.
        target: PathBuf,
    },
    /// `numa_node` holds something other than an integer >= -1.
    #[error("{path} holds {content:?}, not a NUMA node number")]
    BadNumaNode {
        /// The `numa_node` file.
        path: PathBuf,
        /// Its content (trimmed, at most 64 bytes).
        content: String,
    },
}

/// Reads both facts for GPU `gpu` (index, for the logs) at `bus_id`, logging a
/// warning for each one that sysfs does not have.
pub fn pci_topology(sysfs_root: &Path, bus_id: &str, gpu: u32) -> PciTopology {
    let pcie_root = pcie_root(sysfs_root, bus_id)
        .inspect_err(|e| {
            tracing::warn!(gpu, pci_bus_id = bus_id, error = %e, "PCIe root unknown; attribute left out");
        })
        .ok();
    let numa_node = numa_node(sysfs_root, bus_id)
        .inspect_err(|e| {
            tracing::warn!(gpu, pci_bus_id = bus_id, error = %e, "NUMA node unknown; attribute left out");
        })
        .ok()
        .flatten();
    PciTopology {
        pcie_root,
        numa_node,
    }
}

/// `<sysfs>/bus/pci/devices/<bus id>`, after checking that the bus id cannot
/// walk out of that directory.
fn device_entry(sysfs_root: &Path, bus_id: &str) -> Result<PathBuf, SysfsError> {
    if !is_device_name(bus_id) {
        return Err(SysfsError::BadBusId(bus_id.to_owned()));
    }
    Ok(sysfs_root.join("bus/pci/devices").join(bus_id))
}

/// Whether `bus_id` can name an entry of `<sysfs>/bus/pci/devices` without
/// walking out of it: hex digits, `:` and `.`, at most 32, never `..`.
pub fn is_device_name(bus_id: &str) -> bool {
    !bus_id.is_empty()
        && bus_id.len() <= 32
        && bus_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        && bus_id.bytes().any(|b| b.is_ascii_hexdigit())
        && !bus_id.contains("..")
}

/// The PCIe root complex of the device, e.g. `pci0000:10`.
pub(super) fn pcie_root(sysfs_root: &Path, bus_id: &str) -> Result<String, SysfsError> {
    let entry = device_entry(sysfs_root, bus_id)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| SysfsError::Io { path, source }
    };
    let target = std::fs::canonicalize(&entry).map_err(io(&entry))?;
    let root = std::fs::canonicalize(sysfs_root).map_err(io(sysfs_root))?;
    let Ok(inside) = target.strip_prefix(&root) else {
        return Err(SysfsError::OutsideRoot {
            path: entry,
            target,
            root,
        });
    };
    let mut parts = inside.components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(devices)), Some(Component::Normal(host)))
            if devices == "devices" =>
        {
            match host.to_str() {
                Some(host) if is_host_bridge(host) => Ok(host.to_owned()),
                _ => Err(SysfsError::NoPcieRoot { target }),
            }
        }
        _ => Err(SysfsError::NoPcieRoot { target }),
    }
}

/// `pci<domain>:<bus>` with a hex domain of at least four digits and a
/// two-digit hex bus, as the kernel names PCI host bridges.
fn is_host_bridge(name: &str) -> bool {
    let Some((domain, bus)) = name
        .strip_prefix("pci")
        .and_then(|rest| rest.split_once(':'))
    else {
        return false;
    };
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    (4..=8).contains(&domain.len()) && hex(domain) && bus.len() == 2 && hex(bus)
}

/// The NUMA node of the device; `Ok(None)` when sysfs says `-1` (no NUMA).
pub(super) fn numa_node(sysfs_root: &Path, bus_id: &str) -> Result<Option<i64>, SysfsError> {
    const LIMIT: u64 = 64;
    let path = device_entry(sysfs_root, bus_id)?.join("numa_node");
    let mut raw = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(LIMIT).read_to_end(&mut raw))
        .map_err(|source| SysfsError::Io {
            path: path.clone(),
            source,
        })?;
    let content = String::from_utf8_lossy(&raw).trim().to_owned();
    match content.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(node) if node >= 0 => Ok(Some(node)),
        _ => Err(SysfsError::BadNumaNode { path, content }),
    }
}
