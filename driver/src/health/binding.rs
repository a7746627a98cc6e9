//! Which kernel driver holds each GPU, read from sysfs under
//! `--passthrough`. A GPU that a VFIO claim rebound to `vfio-pci` (or one
//! between two drivers during the rebind) cannot be reached by NVML: the
//! monitor does not probe it, does not believe NVML's errors and events
//! about it, and reports its devices Unknown ("not probed") instead of lost
//! (docs/health-conditions.md).
//!
//! Only a GPU whose `driver` link names another driver, or whose link is
//! missing in a sysfs that shows drivers at all (`bus/pci/drivers`), counts
//! as held elsewhere; a link that cannot be read leaves the GPU probed as
//! usual, so a wrong `--sysfs-root` never hides a fault.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::discovery::Inventory;
use crate::vfio::{self, NVIDIA_DRIVER};

/// What [`Bindings::elsewhere`] says of a GPU bound to no driver.
pub const NO_DRIVER: &str = "no driver";

/// Where each GPU's driver link is read.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// The sysfs root; `None`: never read (every GPU counts as on `nvidia`).
    root: Option<PathBuf>,
    /// PCI bus id by NVML index.
    buses: BTreeMap<u32, String>,
}

impl Bindings {
    /// The bindings of `inventory`'s GPUs under `root` (`None`: not read).
    pub fn new(root: Option<PathBuf>, inventory: &Inventory) -> Self {
        let buses = inventory
            .gpus
            .iter()
            .map(|g| (g.info.index, g.info.pci_bus_id.clone()))
            .collect();
        Self { root, buses }
    }

    /// The driver holding GPU `index` when it is not `nvidia` (its name, or
    /// [`NO_DRIVER`]); `None` when the GPU is on `nvidia`, when its link
    /// cannot be read (logged; the GPU is probed as usual), when the sysfs
    /// shows no drivers, or when bindings are not read.
    pub fn elsewhere(&self, index: u32) -> Option<String> {
        let root = self.root.as_deref()?;
        let bus = self.buses.get(&index)?;
        match vfio::current_driver(root, bus) {
            Ok(Some(driver)) if driver == NVIDIA_DRIVER => None,
            Ok(Some(driver)) => Some(driver),
            Ok(None) => root
                .join("bus/pci/drivers")
                .is_dir()
                .then(|| NO_DRIVER.to_owned()),
            Err(error) => {
                tracing::debug!(gpu = index, pci_bus_id = %bus, %error, "cannot read the GPU's driver: probed as usual");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use super::*;

    const BUS: &str = "0000:18:00.0";

    /// Bindings of one GPU (index 0, [`BUS`]) under `root`.
    fn one(root: &Path, bus: &str) -> Bindings {
        Bindings {
            root: Some(root.to_owned()),
            buses: BTreeMap::from([(0, bus.to_owned())]),
        }
    }

    /// A sysfs with the drivers `nvidia` and `vfio-pci` and the GPU's
    /// directory, bound to `driver`.
    fn sysfs(root: &Path, driver: Option<&str>) {
        for d in ["nvidia", "vfio-pci"] {
            std::fs::create_dir_all(root.join("bus/pci/drivers").join(d)).unwrap();
        }
        let dir = root.join("bus/pci/devices").join(BUS);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("driver");
        let _ = std::fs::remove_file(&link);
        if let Some(d) = driver {
            symlink(root.join("bus/pci/drivers").join(d), link).unwrap();
        }
    }

    #[test]
    fn a_gpu_on_another_driver_or_none_is_elsewhere_and_on_nvidia_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let b = one(dir.path(), BUS);
        sysfs(dir.path(), Some("nvidia"));
        assert_eq!(b.elsewhere(0), None);
        sysfs(dir.path(), Some("vfio-pci"));
        assert_eq!(b.elsewhere(0).as_deref(), Some("vfio-pci"));
        sysfs(dir.path(), None);
        assert_eq!(b.elsewhere(0).as_deref(), Some(NO_DRIVER));
        // A GPU the bindings do not know is probed.
        assert_eq!(b.elsewhere(7), None);
    }

    #[test]
    fn what_cannot_be_judged_is_probed_as_usual() {
        let dir = tempfile::tempdir().unwrap();
        // A sysfs without drivers (mock NVML's tree): no link says nothing.
        std::fs::create_dir_all(dir.path().join("bus/pci/devices").join(BUS)).unwrap();
        assert_eq!(one(dir.path(), BUS).elsewhere(0), None);
        // A wrong root: nothing there at all.
        assert_eq!(one(&dir.path().join("missing"), BUS).elsewhere(0), None);
        // Not read at all.
        assert_eq!(Bindings::default().elsewhere(0), None);
        // A hostile bus id never leaves the devices directory.
        sysfs(dir.path(), Some("vfio-pci"));
        for bus in ["../../drivers/vfio-pci", "", "0000:18:00.0/../x", "a\nb"] {
            assert_eq!(one(dir.path(), bus).elsewhere(0), None, "{bus:?}");
        }
        // A `driver` that is a plain file, not a link: unreadable, probed.
        let link = dir.path().join("bus/pci/devices").join(BUS).join("driver");
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&link, "vfio-pci").unwrap();
        assert_eq!(one(dir.path(), BUS).elsewhere(0), None);
    }
}
