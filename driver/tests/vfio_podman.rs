//! A real container runtime consumes a VFIO claim: the plugin binary
//! (`--passthrough`) prepares a `gpu-vfio-<index>` claim on a stand-in
//! sysfs (`fake_driver_root::sysfs`, whose stand-in kernel rebinds the GPU
//! to `vfio-pci`), writing its CDI spec into `/var/run/cdi`, and podman
//! starts busybox with the CDI ids the plugin returned. Inside the
//! container: the VFIO group node and `/dev/vfio/vfio` (stand-ins with
//! `/dev/null`'s numbers), none of the NVIDIA nodes or driver files, and
//! `NVIDIA_VISIBLE_DEVICES=void`. Skipped loudly where podman cannot run
//! (CI sets GPU_DRA_E2E_REQUIRE_PODMAN=1 to make that a failure).

mod common;

use common::prepare::allocated_claim;
use common::{NODE, Plugin, podman, short_dir};
use fake_driver_root::sysfs::{FakeSysfs, create_vfio_nodes};
use gpu_dra_e2e::podman::Podman;
use serde_json::json;

#[tokio::test]
async fn podman_gets_the_vfio_nodes_of_a_passthrough_claim() {
    let Some(podman) = Podman::detect_or_skip("vfio_podman").unwrap() else {
        return;
    };
    let dir = short_dir();
    let driver = podman::driver_name("vfio");
    let env = podman::env(dir.path(), "pcie-a100-bridged");
    let sysfs = FakeSysfs::adopt(&env.sysfs).unwrap();
    let groups: Vec<u32> = sysfs.gpus().iter().map(|g| g.iommu_group).collect();
    create_vfio_nodes(&env.dev_root, &groups, false).unwrap();
    let _kernel = sysfs.start_kernel().unwrap();
    let plugin = Plugin::launch(
        &env,
        dir.path(),
        "run",
        &["--driver-name", &driver, "--passthrough"],
    );
    let (kubelet, client) = podman::connect(&plugin, &driver).await;
    let at = json!([{"request": "vm", "driver": driver, "pool": NODE, "device": "gpu-vfio-0"}]);
    let vm = allocated_claim(&client, "vm", at, json!([])).await;
    let answers = kubelet.prepare(std::slice::from_ref(&vm)).await.unwrap();
    let _spec = podman::spec_of(&driver, &vm);
    let ids = podman::cdi_ids(&answers, &vm, &plugin);
    // The GPU's group: the one whose device is now on vfio-pci.
    let bound: Vec<&fake_driver_root::sysfs::SysfsGpu> = sysfs
        .gpus()
        .iter()
        .filter(|g| sysfs.driver_of(&g.bus).as_deref() == Some("vfio-pci"))
        .collect();
    assert_eq!(bound.len(), 1, "{:?}", sysfs.events());
    let group = bound[0].iommu_group;
    let script = format!(
        "test -c /dev/vfio/{group} && echo group-ok; test -c /dev/vfio/vfio && echo container-ok; \
         for f in /dev/nvidia0 /dev/nvidiactl /usr/lib/x86_64-linux-gnu/libcuda.so.1; do \
         test -e $f && echo unexpected $f; done; env"
    );
    let out = podman.run(&ids, &["sh", "-c", &script]).unwrap();
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("group-ok") && out.stdout.contains("container-ok"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("unexpected"), "{}", out.stdout);
    assert!(
        out.stdout.contains("NVIDIA_VISIBLE_DEVICES=void"),
        "{}",
        out.stdout
    );

    let gone = kubelet.unprepare(std::slice::from_ref(&vm)).await.unwrap();
    assert!(gone.values().all(|r| r.error.is_none()), "{gone:?}");
    assert_eq!(sysfs.driver_of(&bound[0].bus).as_deref(), Some("nvidia"));
    let path = format!("/var/run/cdi/k8s.{driver}-claim_{}.json", vm.uid);
    assert!(!std::path::Path::new(&path).exists(), "{path} left behind");
}
