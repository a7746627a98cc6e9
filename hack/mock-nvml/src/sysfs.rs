//! A fake sysfs tree matching a profile, so discovery code that reads
//! `/sys/bus/pci/devices/<address>` can be pointed at a temporary directory.
//!
//! As on a real machine, `<root>/bus/pci/devices/0000:18:00.0` is a relative
//! symlink to `<root>/devices/pci0000:10/<bridges...>/0000:18:00.0`, and the
//! device directory holds `numa_node` (-1 when unknown), `vendor`, `device`,
//! `subsystem_vendor`, `subsystem_device` and `class`.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::profile::{Gpu, Profile};

/// The directory of a GPU relative to the sysfs root:
/// `devices/pci0000:10/<bridges...>/0000:18:00.0`.
pub fn device_path(gpu: &Gpu) -> PathBuf {
    let mut dir = Path::new("devices").join(&gpu.pcie_root);
    for bridge in &gpu.pci_bridges {
        dir.push(bridge.sysfs());
    }
    dir.join(gpu.pci.sysfs())
}

fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|e| Error::io("write sysfs file", path, e))
}

/// Lays out the tree for every GPU of `profile` under `root` (created if
/// needed). Running it twice over the same root is harmless.
pub fn write(profile: &Profile, root: &Path) -> Result<(), Error> {
    let links = root.join("bus/pci/devices");
    std::fs::create_dir_all(&links).map_err(|e| Error::io("create sysfs directory", &links, e))?;
    for gpu in &profile.gpus {
        let relative = device_path(gpu);
        let dir = root.join(&relative);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create sysfs directory", &dir, e))?;
        let (device, vendor) = (
            gpu.model.pci_device_id >> 16,
            gpu.model.pci_device_id & 0xffff,
        );
        let (sub_device, sub_vendor) = (
            gpu.model.pci_subsystem_id >> 16,
            gpu.model.pci_subsystem_id & 0xffff,
        );
        write_file(&dir.join("numa_node"), &format!("{}\n", gpu.numa_node))?;
        write_file(&dir.join("vendor"), &format!("0x{vendor:04x}\n"))?;
        write_file(&dir.join("device"), &format!("0x{device:04x}\n"))?;
        write_file(
            &dir.join("subsystem_vendor"),
            &format!("0x{sub_vendor:04x}\n"),
        )?;
        write_file(
            &dir.join("subsystem_device"),
            &format!("0x{sub_device:04x}\n"),
        )?;
        // 3D controller, as data-center GPUs report.
        write_file(&dir.join("class"), "0x030200\n")?;

        let link = links.join(gpu.pci.sysfs());
        let target = Path::new("../../..").join(&relative);
        match std::fs::symlink_metadata(&link) {
            Ok(_) => std::fs::remove_file(&link)
                .map_err(|e| Error::io("replace sysfs link", &link, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("inspect sysfs link", &link, e)),
        }
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| Error::io("create sysfs link", &link, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILE: &str = r#"
driverVersion: "580.95.05"
cudaDriverVersion: 13000
gpus:
  - model: T4
    uuid: GPU-3f98e277-4cbd-47ad-9c90-a9587403e430
    pciBusId: "0000:18:00.0"
    minor: 0
    numaNode: -1
    pcieRoot: pci0000:10
    pciBridges: ["0000:10:01.0", "0000:11:00.0"]
  - model: L4
    uuid: GPU-c7a2ea20-b2f1-4c94-ae05-319acb5c7427
    pciBusId: "0000:AF:00.0"
    minor: 1
    numaNode: 1
    pcieRoot: pci0000:ae
"#;

    #[test]
    fn lays_out_symlinked_device_directories() {
        let profile = Profile::parse(PROFILE).unwrap();
        let root = tempfile::tempdir().unwrap();
        write(&profile, root.path()).unwrap();
        // twice: replaces the links
        write(&profile, root.path()).unwrap();

        let link = root.path().join("bus/pci/devices/0000:18:00.0");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../../devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:18:00.0")
        );
        let real = std::fs::canonicalize(&link).unwrap();
        assert_eq!(
            real,
            std::fs::canonicalize(root.path())
                .unwrap()
                .join("devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:18:00.0")
        );
        assert_eq!(
            std::fs::read_to_string(link.join("numa_node")).unwrap(),
            "-1\n"
        );
        assert_eq!(
            std::fs::read_to_string(link.join("device")).unwrap(),
            "0x1eb8\n"
        );
        assert_eq!(
            std::fs::read_to_string(link.join("vendor")).unwrap(),
            "0x10de\n"
        );

        let l4 = root.path().join("bus/pci/devices/0000:af:00.0");
        assert_eq!(
            std::fs::read_to_string(l4.join("numa_node")).unwrap(),
            "1\n"
        );
        assert_eq!(
            std::fs::read_link(&l4).unwrap(),
            Path::new("../../../devices/pci0000:ae/0000:af:00.0")
        );
    }

    #[test]
    fn unwritable_root_is_a_clear_error() {
        let profile = Profile::parse(PROFILE).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let err = write(&profile, &file).unwrap_err().to_string();
        assert!(err.contains("cannot create sysfs directory"), "{err}");
        assert!(err.contains("not-a-dir"), "{err}");
    }
}
