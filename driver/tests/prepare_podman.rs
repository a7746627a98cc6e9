//! A real container runtime consumes what the plugin prepared: the plugin
//! binary prepares a whole-GPU claim with MPS and a dynamic MIG claim
//! through the kubelet simulator, writing its CDI specs into
//! `/var/run/cdi` (the only place Debian's podman 4.3 reads), and podman
//! starts busybox with exactly the CDI ids the plugin returned. Inside the
//! container the device nodes, the driver's files and the env are checked.
//!
//! The plugin runs under a driver name of its own, so its startup sweep of
//! unreferenced specs only ever sees this test's files. Skipped with a loud
//! message where podman cannot run (CI sets GPU_DRA_E2E_REQUIRE_PODMAN=1 to
//! make that a failure).

mod common;

use std::time::Duration;

use common::prepare::allocated_claim;
use common::{NODE, Plugin, podman, short_dir};
use gpu_dra_e2e::podman::{CdiSpecFile, Podman};
use gpu_dra_sim::kubelet::Claim;
use kube::Api;
use serde_json::json;

#[tokio::test]
async fn podman_runs_a_container_with_the_cdi_ids_the_plugin_returned() {
    let Some(podman) = Podman::detect_or_skip("prepare_podman").unwrap() else {
        return;
    };
    let dir = short_dir();
    let driver = podman::driver_name("podman");
    let env = podman::env(dir.path(), "dgx-h100");
    let plugin = Plugin::launch(
        &env,
        dir.path(),
        "run",
        &["--driver-name", &driver, "--dynamic-mig"],
    );
    let (kubelet, client) = podman::connect(&plugin, &driver).await;
    // The placement's name as the plugin publishes it.
    let slices_api: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mig = loop {
        let list = slices_api
            .list(&kube::api::ListParams::default())
            .await
            .unwrap();
        let found = list
            .items
            .iter()
            .filter(|s| s.spec.driver == driver)
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| d.name.clone())
            .find(|d| d.starts_with("gpu-1-mig-1g10gb"));
        if let Some(name) = found {
            break name;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no 1g.10gb placement published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mps = json!([{"source": "FromClaim", "opaque": {"driver": driver, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}}}]);
    let at = |device: &str| json!([{"request": "gpu", "driver": driver, "pool": NODE, "device": device}]);
    let whole = allocated_claim(&client, "whole", at("gpu-0"), mps).await;
    let part = allocated_claim(&client, "part", at(&mig), json!([])).await;
    let answers = kubelet
        .prepare(&[whole.clone(), part.clone()])
        .await
        .unwrap();
    // Clean up the specs even if an assertion below fails.
    let _specs: Vec<CdiSpecFile> = [&whole, &part]
        .iter()
        .map(|c| podman::spec_of(&driver, c))
        .collect();
    let ids = |c: &Claim| podman::cdi_ids(&answers, c, &plugin);

    let script = "for f in /dev/nvidia0 /dev/nvidiactl; do test -c $f || echo missing $f; done; \
                  ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 >/dev/null || echo missing libcuda; \
                  test -d /tmp/nvidia-mps || echo missing pipe; env";
    let out = podman.run(&ids(&whole), &["sh", "-c", script]).unwrap();
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("missing"), "{}", out.stdout);
    assert!(
        out.stdout.contains("NVIDIA_VISIBLE_DEVICES=void"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("CUDA_MPS_PIPE_DIRECTORY="),
        "{}",
        out.stdout
    );

    // The fake NVML writes the capability stand-ins as plain files; on a
    // real node they are character devices (made by nvidia-modprobe), and
    // the runtime insists: make them so, with /dev/null's numbers.
    for entry in std::fs::read_dir(env.dev_root.join("dev/nvidia-caps")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mknod")
            .arg(&path)
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        assert!(made.success(), "mknod {}", path.display());
    }
    let out = podman
        .run(
            &ids(&part),
            &[
                "sh",
                "-c",
                "ls /dev/nvidia-caps; test -c /dev/nvidia1 && echo parent-ok",
            ],
        )
        .unwrap();
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("parent-ok"), "{}", out.stdout);
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.starts_with("nvidia-cap"))
            .count(),
        2,
        "GPU and compute instance capability nodes: {}",
        out.stdout
    );

    let gone = kubelet
        .unprepare(&[whole.clone(), part.clone()])
        .await
        .unwrap();
    assert!(gone.values().all(|r| r.error.is_none()), "{gone:?}");
    for c in [&whole, &part] {
        let path = format!("/var/run/cdi/k8s.{driver}-claim_{}.json", c.uid);
        assert!(!std::path::Path::new(&path).exists(), "{path} left behind");
    }
}
