//! Discovery logic against a hand-written trait-level backend, and sysfs
//! parsing against directory trees laid out in temporary directories.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;

use gpu_nvml::{ComputeMode, GpuBackend, GpuInfo, MigDevice, MigPlacement, SystemInfo};

use super::sysfs::{numa_node, pcie_root};
use super::*;

/// A backend that answers from a fixed list; `Err` entries fail that GPU.
struct FakeBackend {
    system: Result<SystemInfo, String>,
    count: Result<u32, String>,
    gpus: Vec<Result<GpuInfo, String>>,
}

fn call_error(call: &'static str, gpu: Option<u32>, reason: &str) -> gpu_nvml::Error {
    gpu_nvml::Error::Call {
        call,
        gpu,
        reason: reason.to_owned(),
    }
}

impl GpuBackend for FakeBackend {
    fn system(&self) -> gpu_nvml::Result<SystemInfo> {
        self.system
            .clone()
            .map_err(|r| call_error("system", None, &r))
    }
    fn gpu_count(&self) -> gpu_nvml::Result<u32> {
        self.count
            .clone()
            .map_err(|r| call_error("count", None, &r))
    }
    fn gpu(&self, index: u32) -> gpu_nvml::Result<GpuInfo> {
        match self.gpus.get(index as usize) {
            Some(Ok(info)) => Ok(info.clone()),
            Some(Err(reason)) => Err(call_error("gpu", Some(index), reason)),
            None => Err(call_error("gpu", Some(index), "no such GPU")),
        }
    }
    fn set_mig_mode(&self, _: u32, _: bool) -> gpu_nvml::Result<()> {
        Err(gpu_nvml::Error::Invalid("read-only fake".into()))
    }
    fn create_mig_device(&self, _: u32, _: u32, _: MigPlacement) -> gpu_nvml::Result<MigDevice> {
        Err(gpu_nvml::Error::Invalid("read-only fake".into()))
    }
    fn destroy_mig_device(&self, _: u32, _: u32, _: u32) -> gpu_nvml::Result<()> {
        Err(gpu_nvml::Error::Invalid("read-only fake".into()))
    }
    fn set_compute_mode(&self, _: u32, _: ComputeMode) -> gpu_nvml::Result<()> {
        Err(gpu_nvml::Error::Invalid("read-only fake".into()))
    }
}

fn system() -> SystemInfo {
    SystemInfo {
        driver_version: "580.159.04".into(),
        cuda_driver_version: (13, 0),
    }
}

fn gpu(index: u32, bus: &str) -> GpuInfo {
    GpuInfo {
        index,
        minor: index,
        uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
        product_name: "NVIDIA H100 80GB HBM3".into(),
        brand: "Nvidia".into(),
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_bytes: 80 << 30,
        pci_bus_id: bus.into(),
        addressing_mode: None,
        compute_mode: ComputeMode::Default,
        mig: None,
        nvlinks: Vec::new(),
        fabric: None,
        nvlink_p2p_peers: Vec::new(),
    }
}

fn backend(gpus: Vec<Result<GpuInfo, String>>) -> FakeBackend {
    FakeBackend {
        system: Ok(system()),
        count: Ok(gpus.len() as u32),
        gpus,
    }
}

/// Lays out `<root>/devices/<path>/<bus>` with a `numa_node` file (when
/// given) and the `<root>/bus/pci/devices/<bus>` symlink to it, relative like
/// the kernel's.
fn add_device(root: &Path, host_path: &str, bus: &str, numa: Option<&str>) {
    let dir = root.join("devices").join(host_path).join(bus);
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(numa) = numa {
        std::fs::write(dir.join("numa_node"), numa).unwrap();
    }
    let links = root.join("bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    symlink(
        format!("../../../devices/{host_path}/{bus}"),
        links.join(bus),
    )
    .unwrap();
}

#[tokio::test]
async fn every_gpu_is_discovered_with_its_sysfs_topology() {
    let sysfs = tempfile::tempdir().unwrap();
    add_device(
        sysfs.path(),
        "pci0000:10/0000:10:01.0",
        "0000:18:00.0",
        Some("0\n"),
    );
    add_device(
        sysfs.path(),
        "pci0000:90/0000:90:01.0/0000:91:00.0",
        "0000:9a:00.0",
        Some("1\n"),
    );
    let backend = backend(vec![Ok(gpu(0, "0000:18:00.0")), Ok(gpu(1, "0000:9a:00.0"))]);
    let inventory = discover(Arc::new(backend), sysfs.path()).await.unwrap();
    assert_eq!(inventory.system, system());
    assert_eq!(
        inventory.gpus,
        vec![
            DiscoveredGpu {
                info: gpu(0, "0000:18:00.0"),
                pcie_root: Some("pci0000:10".into()),
                numa_node: Some(0),
            },
            DiscoveredGpu {
                info: gpu(1, "0000:9a:00.0"),
                pcie_root: Some("pci0000:90".into()),
                numa_node: Some(1),
            },
        ]
    );
}

#[tokio::test]
async fn a_failing_gpu_is_skipped_and_the_others_are_kept() {
    let sysfs = tempfile::tempdir().unwrap();
    let backend = backend(vec![
        Ok(gpu(0, "0000:18:00.0")),
        Err("GPU is lost".into()),
        Ok(gpu(2, "0000:3a:00.0")),
    ]);
    let inventory = discover(Arc::new(backend), sysfs.path()).await.unwrap();
    let indexes: Vec<u32> = inventory.gpus.iter().map(|g| g.info.index).collect();
    assert_eq!(indexes, [0, 2]);
}

#[tokio::test]
async fn a_gpu_count_above_the_answers_skips_the_missing_ones() {
    let sysfs = tempfile::tempdir().unwrap();
    let mut backend = backend(vec![Ok(gpu(0, "0000:18:00.0"))]);
    backend.count = Ok(3);
    let inventory = discover(Arc::new(backend), sysfs.path()).await.unwrap();
    assert_eq!(inventory.gpus.len(), 1);
}

#[tokio::test]
async fn duplicate_uuids_and_bus_ids_are_skipped() {
    let sysfs = tempfile::tempdir().unwrap();
    let mut same_uuid = gpu(1, "0000:3a:00.0");
    same_uuid.uuid = gpu(0, "").uuid;
    let backend = backend(vec![
        Ok(gpu(0, "0000:18:00.0")),
        Ok(same_uuid),
        Ok(gpu(2, "0000:18:00.0")),
        Ok(gpu(3, "0000:5d:00.0")),
    ]);
    let inventory = discover(Arc::new(backend), sysfs.path()).await.unwrap();
    let indexes: Vec<u32> = inventory.gpus.iter().map(|g| g.info.index).collect();
    assert_eq!(indexes, [0, 3]);
}

#[tokio::test]
async fn node_wide_failures_stop_discovery_with_the_nvml_message() {
    let sysfs = tempfile::tempdir().unwrap();
    let mut no_system = backend(vec![Ok(gpu(0, "0000:18:00.0"))]);
    no_system.system = Err("driver not loaded".into());
    let err = discover(Arc::new(no_system), sysfs.path())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("driver not loaded"), "{err}");

    let mut no_count = backend(vec![Ok(gpu(0, "0000:18:00.0"))]);
    no_count.count = Err("unknown error".into());
    let err = discover(Arc::new(no_count), sysfs.path())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err}");
}

#[tokio::test]
async fn gpus_without_sysfs_entries_get_no_topology() {
    let sysfs = tempfile::tempdir().unwrap();
    let backend = backend(vec![Ok(gpu(0, "0000:18:00.0"))]);
    let inventory = discover(Arc::new(backend), sysfs.path()).await.unwrap();
    assert_eq!(inventory.gpus[0].pcie_root, None);
    assert_eq!(inventory.gpus[0].numa_node, None);
}

#[test]
fn numa_minus_one_means_no_numa_node() {
    let sysfs = tempfile::tempdir().unwrap();
    add_device(sysfs.path(), "pci0000:00", "0000:01:00.0", Some("-1\n"));
    assert_eq!(numa_node(sysfs.path(), "0000:01:00.0").unwrap(), None);
    // The PCIe root is still found.
    assert_eq!(
        pcie_root(sysfs.path(), "0000:01:00.0").unwrap(),
        "pci0000:00"
    );
}

#[test]
fn garbage_in_numa_node_is_an_error_naming_the_content() {
    let sysfs = tempfile::tempdir().unwrap();
    for (i, content) in ["abc", "", "-2", "1.5", "99999999999999999999", "0x1", "1 2"]
        .iter()
        .enumerate()
    {
        let bus = format!("0000:{:02x}:00.0", i + 1);
        add_device(sysfs.path(), "pci0000:00", &bus, Some(content));
        let err = numa_node(sysfs.path(), &bus).unwrap_err();
        assert!(
            matches!(err, SysfsError::BadNumaNode { .. }),
            "{content:?}: {err}"
        );
        assert!(err.to_string().contains("numa_node"), "{err}");
    }
}

#[test]
fn a_huge_numa_node_file_is_read_only_in_part() {
    let sysfs = tempfile::tempdir().unwrap();
    add_device(
        sysfs.path(),
        "pci0000:00",
        "0000:01:00.0",
        Some(&"1".repeat(1 << 20)),
    );
    let err = numa_node(sysfs.path(), "0000:01:00.0").unwrap_err();
    let SysfsError::BadNumaNode { content, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(content.len(), 64);
}

#[test]
fn a_missing_numa_node_file_is_an_io_error() {
    let sysfs = tempfile::tempdir().unwrap();
    add_device(sysfs.path(), "pci0000:00", "0000:01:00.0", None);
    let err = numa_node(sysfs.path(), "0000:01:00.0").unwrap_err();
    assert!(matches!(err, SysfsError::Io { .. }), "{err}");
}

#[test]
fn missing_entries_are_errors_not_guesses() {
    let sysfs = tempfile::tempdir().unwrap();
    assert!(matches!(
        pcie_root(sysfs.path(), "0000:18:00.0"),
        Err(SysfsError::Io { .. })
    ));
    assert!(matches!(
        numa_node(sysfs.path(), "0000:18:00.0"),
        Err(SysfsError::Io { .. })
    ));
    let topology = pci_topology(sysfs.path(), "0000:18:00.0", 0);
    assert_eq!(topology, PciTopology::default());
}

#[test]
fn a_device_not_under_a_host_bridge_has_no_pcie_root() {
    let sysfs = tempfile::tempdir().unwrap();
    add_device(sysfs.path(), "platform/soc", "0000:01:00.0", Some("0"));
    let err = pcie_root(sysfs.path(), "0000:01:00.0").unwrap_err();
    assert!(matches!(err, SysfsError::NoPcieRoot { .. }), "{err}");
    // A directory (not a symlink) directly under bus/pci/devices has no root either.
    let plain = sysfs.path().join("bus/pci/devices/0000:02:00.0");
    std::fs::create_dir_all(&plain).unwrap();
    assert!(matches!(
        pcie_root(sysfs.path(), "0000:02:00.0"),
        Err(SysfsError::NoPcieRoot { .. })
    ));
}

#[test]
fn a_symlink_leaving_the_sysfs_root_is_rejected() {
    let sysfs = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("devices/pci0000:00/0000:01:00.0");
    std::fs::create_dir_all(&target).unwrap();
    let links = sysfs.path().join("bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    symlink(&target, links.join("0000:01:00.0")).unwrap();
    let err = pcie_root(sysfs.path(), "0000:01:00.0").unwrap_err();
    assert!(matches!(err, SysfsError::OutsideRoot { .. }), "{err}");
}

#[test]
fn a_symlink_loop_is_an_error_not_a_hang() {
    let sysfs = tempfile::tempdir().unwrap();
    let links = sysfs.path().join("bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    symlink("0000:01:00.0", links.join("0000:01:00.0")).unwrap();
    assert!(matches!(
        pcie_root(sysfs.path(), "0000:01:00.0"),
        Err(SysfsError::Io { .. })
    ));
    assert!(matches!(
        numa_node(sysfs.path(), "0000:01:00.0"),
        Err(SysfsError::Io { .. })
    ));
}

#[test]
fn hostile_bus_ids_never_leave_the_devices_directory() {
    let sysfs = tempfile::tempdir().unwrap();
    // A numa_node file one level up that a traversal would find.
    std::fs::create_dir_all(sysfs.path().join("bus/pci")).unwrap();
    std::fs::write(sysfs.path().join("bus/pci/numa_node"), "0").unwrap();
    for bad in [
        "",
        "..",
        ".",
        "../..",
        "0000:18:00.0/../..",
        "/etc",
        "pci0000:00",
        "0000:18:00.0\n",
    ] {
        assert!(
            matches!(numa_node(sysfs.path(), bad), Err(SysfsError::BadBusId(_))),
            "{bad:?}"
        );
        assert!(
            matches!(pcie_root(sysfs.path(), bad), Err(SysfsError::BadBusId(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn host_bridge_names_are_recognised_strictly() {
    let sysfs = tempfile::tempdir().unwrap();
    for (host, ok) in [
        ("pci0000:00", true),
        ("pci10000:e0", true),
        ("pci0000:0", false),
        ("pcix0000:00", false),
        ("pci:00", false),
        ("pci0000-00", false),
    ] {
        let bus = "0000:01:00.0";
        let _ = std::fs::remove_dir_all(sysfs.path().join("bus"));
        let _ = std::fs::remove_dir_all(sysfs.path().join("devices"));
        add_device(sysfs.path(), host, bus, None);
        assert_eq!(
            pcie_root(sysfs.path(), bus).ok(),
            ok.then(|| host.to_owned()),
            "{host}"
        );
    }
}

#[test]
fn sysfs_root_flag_defaults_to_sys() {
    use clap::Parser;
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        discovery: Flags,
    }
    let cli = Cli::try_parse_from(["x"]).unwrap();
    assert_eq!(cli.discovery.sysfs_root, Path::new("/sys"));
    let cli = Cli::try_parse_from([
        "x",
        "--sysfs-root",
        "/host/sys",
        "--nvml-lib",
        "/x/libnvidia-ml.so.1",
    ])
    .unwrap();
    assert_eq!(cli.discovery.sysfs_root, Path::new("/host/sys"));
    assert_eq!(
        cli.discovery.nvml_lib.as_deref(),
        Some(Path::new("/x/libnvidia-ml.so.1"))
    );
}

#[test]
fn without_nvml_opening_the_backend_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let flags = Flags {
        nvml_lib: Some(dir.path().join("libnvidia-ml.so.1")),
        sysfs_root: "/sys".into(),
    };
    let err = open_backend(&flags).err().expect("no library there");
    let text = err.to_string();
    assert!(text.contains("cannot initialise NVML from"), "{text}");
    assert!(text.contains("libnvidia-ml.so.1"), "{text}");
}
