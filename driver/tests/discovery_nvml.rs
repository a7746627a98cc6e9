//! Discovery end to end on the real NVML path: the production `NvmlBackend`
//! over a private copy of the project's fake libnvidia-ml, with a sysfs tree
//! laid out from the same machine profile.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_kubelet_plugin::discovery::{self, Flags, Inventory};

/// Installs the fake library for `yaml` in `dir`, lays out the matching sysfs
/// tree under `dir/sys`, and runs discovery through the plugin's own entry
/// points (`open_backend` from the flags, then `discover`).
async fn discover(dir: &Path, yaml: &str) -> (Inventory, nvidia_ml::Profile, PathBuf) {
    let library = nvidia_ml::fixture::install_yaml(dir, yaml, None).expect("install fake NVML");
    let profile = nvidia_ml::Profile::parse(yaml).expect("profile parses");
    let sysfs = dir.join("sys");
    nvidia_ml::sysfs::write(&profile, &sysfs).expect("write sysfs");
    let flags = Flags {
        nvml_lib: Some(library),
        sysfs_root: sysfs.clone(),
    };
    let backend = discovery::open_backend(&flags).expect("open NVML");
    let inventory = discovery::discover(backend, &flags.sysfs_root)
        .await
        .expect("discovery");
    (inventory, profile, sysfs)
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(nvidia_ml::fixture::bundled_profile(name)).expect("shipped profile")
}

/// The shipped profile with a failure injected into GPU `minor` (found by
/// its `minor:` line).
fn with_failure(yaml: &str, minor: u32, fail: &str) -> String {
    let line = format!("    minor: {minor}\n");
    assert!(yaml.contains(&line), "profile has a GPU with minor {minor}");
    yaml.replacen(&line, &format!("{line}    fail: {fail}\n"), 1)
}

#[tokio::test]
async fn every_gpu_of_the_dgx_a100_with_its_pcie_root_and_numa_node() {
    let dir = tempfile::tempdir().unwrap();
    let (inventory, profile, _) = discover(dir.path(), &shipped("dgx-a100")).await;
    assert_eq!(inventory.system.driver_version, profile.spec.driver_version);
    assert_eq!(inventory.gpus.len(), profile.gpus.len());
    for (found, expected) in inventory.gpus.iter().zip(&profile.gpus) {
        assert_eq!(found.info.uuid, expected.uuid);
        assert_eq!(found.info.pci_bus_id, expected.pci.sysfs());
        assert_eq!(
            found.pcie_root.as_deref(),
            Some(expected.pcie_root.as_str())
        );
        assert_eq!(found.numa_node, Some(i64::from(expected.numa_node)));
    }
}

#[tokio::test]
async fn a_gpu_failing_in_nvml_is_skipped_and_the_others_are_published() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = with_failure(
        &shipped("dgx-h100"),
        5,
        "{nvmlDeviceGetMemoryInfo: GPU_IS_LOST}",
    );
    let (inventory, profile, _) = discover(dir.path(), &yaml).await;
    let indexes: Vec<u32> = inventory.gpus.iter().map(|g| g.info.index).collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4, 6, 7]);
    let uuids: Vec<&str> = inventory
        .gpus
        .iter()
        .map(|g| g.info.uuid.as_str())
        .collect();
    assert!(!uuids.contains(&profile.gpus[5].uuid.as_str()));
    assert!(
        inventory
            .gpus
            .iter()
            .all(|g| g.pcie_root.is_some() && g.numa_node.is_some())
    );
}

#[tokio::test]
async fn missing_or_unknown_sysfs_facts_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    // GPU 1 of the T4 node reports no NUMA node (-1).
    let yaml = shipped("t4-inference").replacen(
        "    minor: 1\n    numaNode: 0\n",
        "    minor: 1\n    numaNode: -1\n",
        1,
    );
    assert_ne!(yaml, shipped("t4-inference"));
    let library = nvidia_ml::fixture::install_yaml(dir.path(), &yaml, None).unwrap();
    let profile = nvidia_ml::Profile::parse(&yaml).unwrap();
    let sysfs = dir.path().join("sys");
    nvidia_ml::sysfs::write(&profile, &sysfs).unwrap();
    // GPU 2 has no sysfs entry at all.
    std::fs::remove_file(
        sysfs
            .join("bus/pci/devices")
            .join(profile.gpus[2].pci.sysfs()),
    )
    .unwrap();

    let backend = discovery::open_backend(&Flags {
        nvml_lib: Some(library),
        sysfs_root: sysfs.clone(),
    })
    .unwrap();
    let inventory = discovery::discover(Arc::clone(&backend), &sysfs)
        .await
        .unwrap();
    assert_eq!(inventory.gpus.len(), 4);
    let facts: Vec<(Option<&str>, Option<i64>)> = inventory
        .gpus
        .iter()
        .map(|g| (g.pcie_root.as_deref(), g.numa_node))
        .collect();
    assert_eq!(
        facts,
        [
            (Some("pci0000:3a"), Some(0)),
            (Some("pci0000:3a"), None),
            (None, None),
            (Some("pci0000:3a"), Some(0)),
        ]
    );

    // Without any sysfs, every GPU is still published, with no topology.
    let empty = tempfile::tempdir().unwrap();
    let inventory = discovery::discover(backend, empty.path()).await.unwrap();
    assert_eq!(inventory.gpus.len(), 4);
    assert!(
        inventory
            .gpus
            .iter()
            .all(|g| g.pcie_root.is_none() && g.numa_node.is_none())
    );
}

#[tokio::test]
async fn a_machine_without_nvml_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let flags = Flags {
        nvml_lib: Some(dir.path().join("libnvidia-ml.so.1")),
        sysfs_root: dir.path().to_owned(),
    };
    let err = discovery::open_backend(&flags)
        .err()
        .expect("no NVML there")
        .to_string();
    assert!(err.contains("cannot initialise NVML"), "{err}");
    assert!(err.contains("libnvidia-ml.so.1"), "{err}");
}
