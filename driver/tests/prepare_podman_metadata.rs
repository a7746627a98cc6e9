//! A real container runtime mounts the KEP-5304 device metadata file: the
//! plugin binary prepares a whole-GPU claim through the kubelet simulator,
//! writing its CDI spec into `/var/run/cdi` (the only place Debian's
//! podman 4.3 reads), and podman starts busybox with exactly the CDI ids
//! the plugin returned. Inside, the file is at the KEP's path, read-only,
//! and names the claim and the GPU's PCI address.
//!
//! The plugin runs under a driver name of its own, so its startup sweep of
//! unreferenced specs only ever sees this test's files. Skipped with a loud
//! message where podman cannot run (CI sets GPU_DRA_E2E_REQUIRE_PODMAN=1 to
//! make that a failure).

mod common;

use common::prepare::allocated_claim;
use common::{NODE, Plugin, podman, short_dir};
use gpu_dra_e2e::podman::Podman;
use serde_json::json;

#[tokio::test]
async fn podman_sees_the_metadata_file_read_only_at_the_keps_path() {
    let Some(podman) = Podman::detect_or_skip("prepare_podman_metadata").unwrap() else {
        return;
    };
    let dir = short_dir();
    let driver = podman::driver_name("metadata");
    let env = podman::env(dir.path(), "dgx-h100");
    let plugin = Plugin::launch(&env, dir.path(), "run", &["--driver-name", &driver]);
    let (kubelet, client) = podman::connect(&plugin, &driver).await;
    let results = json!([{"request": "gpu", "driver": driver, "pool": NODE, "device": "gpu-3"}]);
    let claim = allocated_claim(&client, "meta", results, json!([])).await;
    let answers = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let _spec = podman::spec_of(&driver, &claim);
    let ids = podman::cdi_ids(&answers, &claim, &plugin);

    let path = format!(
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/meta/gpu/{driver}-metadata.json"
    );
    let script = format!("cat {path}; echo; echo x >> {path} 2>/dev/null && echo WRITABLE; true");
    let out = podman.run(&ids, &["sh", "-c", &script]).unwrap();
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(!out.stdout.contains("WRITABLE"), "{}", out.stdout);
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(out.stdout.trim())
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(docs.len(), 2, "{}", out.stdout);
    assert_eq!(docs[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(docs[0]["metadata"]["uid"], claim.uid.as_str());
    let device = &docs[0]["requests"][0]["devices"][0];
    assert_eq!(device["name"], "gpu-3");
    assert_eq!(device["driver"], driver.as_str());
    assert!(
        device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
            .as_str()
            .is_some_and(|b| b.starts_with("0000:")),
        "{device}"
    );

    let gone = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(gone.values().all(|r| r.error.is_none()), "{gone:?}");
    let root = plugin.plugins_dir.join(&driver).join("dra-device-metadata");
    let left: Vec<_> = std::fs::read_dir(&root)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}
