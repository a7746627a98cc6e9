//! VFIO passthrough in sysfs: the facts `--passthrough` publishes (PCI
//! vendor and device ids, whether the node has iommufd) and the steps that
//! hand a GPU to `vfio-pci` and back (which driver holds it, rebinding
//! through `driver_override` and `drivers_probe`, the IOMMU group, the
//! iommufd cdev). Everything is read and written under a sysfs root (the
//! plugin's `--sysfs-root`), so tests run on a directory tree; see
//! `driver/tests/common/fake_sysfs.rs` for the stand-in kernel.
//!
//! A rebind is three writes, each one the kernel acts on at once:
//! `<dev>/driver_override` (the driver the next probe must pick),
//! `<dev>/driver/unbind` (the bus id; only while a driver holds the
//! device) and `bus/pci/drivers_probe` (the bus id). The device's `driver`
//! link then names the new driver. The override is cleared again once the
//! GPU is back on `nvidia`, so the node is as it was.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::discovery::Inventory;

/// The driver a passthrough GPU is bound to while a claim holds it.
pub const VFIO_DRIVER: &str = "vfio-pci";
/// The driver a GPU is bound back to.
pub const NVIDIA_DRIVER: &str = "nvidia";
/// How long a rebind may take before it is an error. The kernel binds
/// within the `drivers_probe` write; the wait is for stand-ins and slow
/// probes.
pub const REBIND_TIMEOUT: Duration = Duration::from_secs(10);

/// PCI vendor and device id of a GPU, as sysfs writes them (`0x10de`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciIds {
    /// `vendor`, e.g. `0x10de`.
    pub vendor: String,
    /// `device`, e.g. `0x2330`.
    pub device: String,
}

/// What `--passthrough` publishes beside NVML's facts, read once at start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Passthrough {
    /// The node has iommufd (`<dev-root>/dev/iommu`).
    pub iommu_fd: bool,
    /// PCI ids by PCI bus id; a GPU without them is not offered for
    /// passthrough.
    pub pci_ids: BTreeMap<String, PciIds>,
}

impl Passthrough {
    /// Reads the facts of every GPU of `inventory` (a GPU whose ids cannot
    /// be read is left out, with a warning).
    pub fn read(sysfs_root: &Path, dev_root: &Path, inventory: &Inventory) -> Self {
        let mut pci_ids = BTreeMap::new();
        for gpu in &inventory.gpus {
            let bus = &gpu.info.pci_bus_id;
            match read_pci_ids(sysfs_root, bus) {
                Ok(ids) => {
                    pci_ids.insert(bus.clone(), ids);
                }
                Err(error) => tracing::warn!(
                    gpu = %gpu.info.uuid,
                    pci_bus_id = %bus,
                    %error,
                    "GPU not offered for passthrough: its PCI ids cannot be read"
                ),
            }
        }
        Self {
            iommu_fd: dev_root.join("dev/iommu").exists(),
            pci_ids,
        }
    }
}

/// Why a VFIO step failed; the text goes to the user.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// The bus id cannot name a sysfs entry.
    #[error("PCI bus id {0:?} is not a sysfs device name")]
    BadBusId(String),
    /// A sysfs file could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file held something unexpected.
    #[error("{path} holds {content:?}, not {expected}")]
    Unexpected {
        /// The file.
        path: PathBuf,
        /// What it holds (at most 64 bytes).
        content: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// The device did not end up on the driver asked for.
    #[error(
        "GPU {bus} is bound to {found} {waited_ms} ms after asking for {wanted}; is the module loaded (and does it take the device)?"
    )]
    NotRebound {
        /// PCI bus id.
        bus: String,
        /// The driver wanted.
        wanted: String,
        /// What the `driver` link names (`no driver`).
        found: String,
        /// How long it was waited for.
        waited_ms: u128,
    },
    /// The GPU has no IOMMU group: IOMMU is off in the kernel or firmware.
    #[error(
        "GPU {bus} has no IOMMU group ({path} is missing): enable the IOMMU (intel_iommu=on or amd_iommu=on, and VT-d/AMD-Vi in the firmware)"
    )]
    NoIommuGroup {
        /// PCI bus id.
        bus: String,
        /// The missing link.
        path: PathBuf,
    },
}

/// `<sysfs>/bus/pci/devices/<bus>`, after checking the bus id cannot walk
/// out of that directory.
pub fn device_dir(sysfs_root: &Path, bus: &str) -> Result<PathBuf, VfioError> {
    if !crate::discovery::is_device_name(bus) {
        return Err(VfioError::BadBusId(bus.to_owned()));
    }
    Ok(sysfs_root.join("bus/pci/devices").join(bus))
}

/// A short sysfs file, trimmed.
fn read_small(path: &Path) -> Result<String, VfioError> {
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64).read_to_end(&mut raw))
        .map_err(|source| VfioError::Io {
            op: "read",
            path: path.to_owned(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&raw).trim().to_owned())
}

/// `0x` and four hex digits, as sysfs writes PCI ids.
fn pci_id(path: &Path) -> Result<String, VfioError> {
    let content = read_small(path)?;
    let ok = content.len() == 6
        && content.starts_with("0x")
        && content[2..].bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        Ok(content.to_ascii_lowercase())
    } else {
        Err(VfioError::Unexpected {
            path: path.to_owned(),
            content,
            expected: "a PCI id (0x and four hex digits)",
        })
    }
}

/// The GPU's PCI vendor and device ids.
pub fn read_pci_ids(sysfs_root: &Path, bus: &str) -> Result<PciIds, VfioError> {
    let dir = device_dir(sysfs_root, bus)?;
    Ok(PciIds {
        vendor: pci_id(&dir.join("vendor"))?,
        device: pci_id(&dir.join("device"))?,
    })
}

/// The driver holding the device (the last part of its `driver` link), or
/// `None` when none does.
pub fn current_driver(sysfs_root: &Path, bus: &str) -> Result<Option<String>, VfioError> {
    let link = device_dir(sysfs_root, bus)?.join("driver");
    match std::fs::read_link(&link) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(VfioError::Io {
            op: "read link",
            path: link,
            source,
        }),
    }
}

/// The device's `driver_override` (`None` when unset: the kernel shows
/// `(null)`).
pub fn driver_override(sysfs_root: &Path, bus: &str) -> Result<Option<String>, VfioError> {
    let path = device_dir(sysfs_root, bus)?.join("driver_override");
    let content = read_small(&path)?;
    Ok((!content.is_empty() && content != "(null)").then_some(content))
}

fn write(path: &Path, value: &str) -> Result<(), VfioError> {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, value.as_bytes()))
        .map_err(|source| VfioError::Io {
            op: "write",
            path: path.to_owned(),
            source,
        })
}

/// The steps of a rebind, for the crash tests' failpoints: called after
/// each write with its name (`override`, `unbind`, `probe`).
pub type StepHook<'a> = &'a dyn Fn(&'static str);

/// Binds the device to `driver`: sets `driver_override`, unbinds the driver
/// holding it (if any other), asks the kernel to probe, and waits for the
/// `driver` link to name `driver`. Nothing is written when it already
/// does. With `clear_override`, the override is cleared once bound (the
/// way back to `nvidia`).
pub fn bind(
    sysfs_root: &Path,
    bus: &str,
    driver: &str,
    clear_override: bool,
    step: StepHook<'_>,
) -> Result<(), VfioError> {
    let dir = device_dir(sysfs_root, bus)?;
    let current = current_driver(sysfs_root, bus)?;
    if current.as_deref() != Some(driver) {
        write(&dir.join("driver_override"), driver)?;
        step("override");
        if current.is_some() {
            write(&dir.join("driver/unbind"), bus)?;
            step("unbind");
            wait_for(sysfs_root, bus, None)?;
        }
        write(&sysfs_root.join("bus/pci/drivers_probe"), bus)?;
        step("probe");
        wait_for(sysfs_root, bus, Some(driver))?;
    }
    if clear_override && driver_override(sysfs_root, bus)?.is_some() {
        // The kernel clears it on a write of a newline.
        write(&dir.join("driver_override"), "\n")?;
    }
    Ok(())
}

/// Waits for the `driver` link to name `driver` (`None`: to be gone).
fn wait_for(sysfs_root: &Path, bus: &str, driver: Option<&str>) -> Result<(), VfioError> {
    let started = Instant::now();
    loop {
        let found = current_driver(sysfs_root, bus)?;
        if found.as_deref() == driver {
            return Ok(());
        }
        if started.elapsed() >= REBIND_TIMEOUT {
            return Err(VfioError::NotRebound {
                bus: bus.to_owned(),
                wanted: driver.unwrap_or("no driver (unbind)").to_owned(),
                found: found.unwrap_or_else(|| "no driver".to_owned()),
                waited_ms: started.elapsed().as_millis(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The device's IOMMU group (the last part of its `iommu_group` link), a
/// decimal number.
pub fn iommu_group(sysfs_root: &Path, bus: &str) -> Result<String, VfioError> {
    let link = device_dir(sysfs_root, bus)?.join("iommu_group");
    let target = match std::fs::read_link(&link) {
        Ok(target) => target,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VfioError::NoIommuGroup {
                bus: bus.to_owned(),
                path: link,
            });
        }
        Err(source) => {
            return Err(VfioError::Io {
                op: "read link",
                path: link,
                source,
            });
        }
    };
    let group = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if group.is_empty() || group.len() > 10 || !group.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VfioError::Unexpected {
            path: link,
            content: group,
            expected: "a link to an IOMMU group number",
        });
    }
    Ok(group)
}

/// The device's iommufd cdev name (`vfio<N>` in `<dev>/vfio-dev/`), when
/// the kernel made one (`CONFIG_VFIO_DEVICE_CDEV`, while bound to
/// `vfio-pci`).
pub fn iommufd_cdev(sysfs_root: &Path, bus: &str) -> Result<Option<String>, VfioError> {
    let dir = device_dir(sysfs_root, bus)?.join("vfio-dev");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(VfioError::Io {
                op: "list",
                path: dir,
                source,
            });
        }
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| {
            n.strip_prefix("vfio").is_some_and(|rest| {
                !rest.is_empty() && rest.len() <= 10 && rest.bytes().all(|b| b.is_ascii_digit())
            })
        })
        .collect();
    found.sort();
    Ok(found.into_iter().next())
}

#[cfg(test)]
mod tests;
