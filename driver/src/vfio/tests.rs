use std::cell::RefCell;
use std::path::Path;

use fake_driver_root::sysfs::{FakeSysfs, SysfsGpu};

use super::*;

const BUS: &str = "0000:18:00.0";

fn sysfs(dir: &Path) -> FakeSysfs {
    FakeSysfs::create(
        &dir.join("sys"),
        &[SysfsGpu {
            bus: BUS.to_owned(),
            vendor: "0x10de".to_owned(),
            device: "0x2330".to_owned(),
            iommu_group: 42,
        }],
    )
    .unwrap()
}

#[test]
fn a_gpu_goes_to_vfio_pci_and_back_through_the_kernels_interface() {
    let dir = tempfile::tempdir().unwrap();
    let fake = sysfs(dir.path());
    let _kernel = fake.start_kernel().unwrap();
    let root = fake.path();
    assert_eq!(
        read_pci_ids(root, BUS).unwrap(),
        PciIds {
            vendor: "0x10de".into(),
            device: "0x2330".into()
        }
    );
    assert_eq!(
        current_driver(root, BUS).unwrap().as_deref(),
        Some("nvidia")
    );
    assert_eq!(driver_override(root, BUS).unwrap(), None);
    assert_eq!(iommufd_cdev(root, BUS).unwrap(), None);
    let steps = RefCell::new(Vec::new());
    let hook = |s: &'static str| steps.borrow_mut().push(s);
    bind(root, BUS, VFIO_DRIVER, false, &hook).unwrap();
    assert_eq!(*steps.borrow(), ["override", "unbind", "probe"]);
    assert_eq!(fake.driver_of(BUS).as_deref(), Some("vfio-pci"));
    assert_eq!(iommu_group(root, BUS).unwrap(), "42");
    assert_eq!(iommufd_cdev(root, BUS).unwrap().as_deref(), Some("vfio42"));
    // Bound already: nothing written.
    steps.borrow_mut().clear();
    bind(root, BUS, VFIO_DRIVER, false, &hook).unwrap();
    assert!(steps.borrow().is_empty());
    bind(root, BUS, NVIDIA_DRIVER, true, &hook).unwrap();
    assert_eq!(fake.driver_of(BUS).as_deref(), Some("nvidia"));
    assert_eq!(fake.override_of(BUS), None, "the override is cleared");
    assert_eq!(iommufd_cdev(root, BUS).unwrap(), None);
    assert_eq!(
        fake.events().unwrap(),
        [
            format!("unbind {BUS} nvidia"),
            format!("bind {BUS} vfio-pci"),
            format!("unbind {BUS} vfio-pci"),
            format!("bind {BUS} nvidia"),
        ]
    );
}

#[test]
fn a_device_left_without_a_driver_is_probed_without_an_unbind() {
    let dir = tempfile::tempdir().unwrap();
    let fake = sysfs(dir.path());
    let _kernel = fake.start_kernel().unwrap();
    fake.force_driver(BUS, None).unwrap();
    let steps = RefCell::new(Vec::new());
    bind(fake.path(), BUS, NVIDIA_DRIVER, true, &|s| {
        steps.borrow_mut().push(s);
    })
    .unwrap();
    assert_eq!(*steps.borrow(), ["override", "probe"]);
    assert_eq!(fake.driver_of(BUS).as_deref(), Some("nvidia"));
}

#[test]
fn a_driver_that_does_not_take_the_device_is_an_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let fake = sysfs(dir.path());
    let _kernel = fake.start_kernel().unwrap();
    fake.refuse(VFIO_DRIVER, true).unwrap();
    let error = bind(fake.path(), BUS, VFIO_DRIVER, false, &|_| {}).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("GPU {BUS} is bound to no driver "))
            && message.ends_with(
                " ms after asking for vfio-pci; is the module loaded (and does it take the device)?"
            ),
        "{message}"
    );
    assert!(matches!(error, VfioError::NotRebound { .. }), "{error:?}");
    // And back: nvidia takes it.
    bind(fake.path(), BUS, NVIDIA_DRIVER, true, &|_| {}).unwrap();
    assert_eq!(fake.driver_of(BUS).as_deref(), Some("nvidia"));
}

#[test]
fn hostile_bus_ids_and_sysfs_content_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let fake = sysfs(dir.path());
    for bad in [
        "",
        "../../etc",
        "0000:18:00.0/../x",
        "zz:zz",
        &"0".repeat(40),
    ] {
        assert!(
            matches!(
                current_driver(fake.path(), bad),
                Err(VfioError::BadBusId(_))
            ),
            "{bad:?}"
        );
    }
    let device = fake.path().join("bus/pci/devices").join(BUS);
    std::fs::write(device.join("vendor"), "nvidia\n").unwrap();
    let error = read_pci_ids(fake.path(), BUS).unwrap_err().to_string();
    assert!(
        error.ends_with("vendor holds \"nvidia\", not a PCI id (0x and four hex digits)"),
        "{error}"
    );
    std::fs::remove_file(device.join("iommu_group")).unwrap();
    let error = iommu_group(fake.path(), BUS).unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("GPU {BUS} has no IOMMU group")),
        "{error}"
    );
    std::os::unix::fs::symlink("/nowhere/abc", device.join("iommu_group")).unwrap();
    let error = iommu_group(fake.path(), BUS).unwrap_err().to_string();
    assert!(
        error.ends_with("holds \"abc\", not a link to an IOMMU group number"),
        "{error}"
    );
}
