//! KEP-5304 device metadata end to end, with the real plugin binary: the
//! file of each request (golden, for a whole GPU, a static MIG device and a
//! VFIO passthrough GPU), its read-only mount in the claim's CDI spec, the
//! path under `resourceclaimtemplates/` for a claim made from a template,
//! removal at unprepare, `--device-metadata=false`, and a crash between the
//! write and the checkpoint: after the restart nothing is left. The podman
//! test (`prepare_podman_metadata`) shows a real runtime mounting it.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::DRIVER;
use common::prepare::{Node, node, node_with, result};
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
const MIG: &str = "gpu-1-mig-3g40gb-9-0";

fn metadata_root(n: &Node) -> PathBuf {
    n.state_dir().join("dra-device-metadata")
}

fn metadata_file(n: &Node, claim: &str, request: &str) -> PathBuf {
    metadata_root(n)
        .join(format!("default_{claim}"))
        .join(request)
        .join("metadata.json")
}

/// Every path under the metadata directory, relative to it.
fn leftovers(n: &Node) -> Vec<String> {
    let root = metadata_root(n);
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(&root).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The file's text with the claim's UID (made up by the API server)
/// replaced, for the snapshot.
fn redacted(path: &Path, claim: &Claim) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.replace(&claim.uid, "[claim-uid]")
}

/// The documents of a metadata file, in order.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::Deserializer::from_str(&text)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn mounts(device: &Value) -> Vec<Value> {
    device["containerEdits"]["mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The metadata mounts (those into the KEP's directory) of a CDI device.
fn metadata_mounts(device: &Value) -> Vec<Value> {
    mounts(device)
        .into_iter()
        .filter(|m| {
            m["containerPath"]
                .as_str()
                .is_some_and(|p| p.starts_with(CONTAINER_DIR))
        })
        .collect()
}

/// The published attributes of device `name`.
async fn published_attributes(n: &Node, name: &str) -> Value {
    n.published_device(name).await["attributes"].clone()
}

#[tokio::test]
async fn a_whole_gpu_and_a_mig_device_get_their_files_mounted_and_removed() {
    let n = node("mixed", &[], DraVersion::V1).await;
    let claim = n
        .claim(
            "train",
            json!([result("gpu", "gpu-0"), result("mig/small", MIG)]),
            json!([]),
        )
        .await;
    n.prepare_ok(&claim).await;

    let gpu_file = metadata_file(&n, "train", "gpu");
    let mig_file = metadata_file(&n, "train", "mig");
    insta::assert_snapshot!("metadata_whole_gpu", redacted(&gpu_file, &claim));
    insta::assert_snapshot!("metadata_mig", redacted(&mig_file, &claim));
    // Exactly what is published, the standard PCI attributes among them.
    for (file, device) in [(&gpu_file, "gpu-0"), (&mig_file, MIG)] {
        let published = published_attributes(&n, device).await;
        assert!(
            published["resource.kubernetes.io/pciBusID"]["string"].is_string(),
            "{published}"
        );
        let docs = documents(file);
        assert_eq!(docs.len(), 2, "v1beta1 and v1alpha1");
        for doc in &docs {
            assert_eq!(doc["metadata"]["uid"], claim.uid.as_str());
            assert_eq!(doc["requests"][0]["devices"][0]["name"], device);
            assert_eq!(doc["requests"][0]["devices"][0]["attributes"], published);
        }
    }
    assert_eq!(
        documents(&mig_file)[0]["requests"][0]["name"],
        "mig/small",
        "the request as allocated; its base name in the path"
    );

    // Each request's file is mounted read-only on its device, and only there.
    let gpu = n.spec_device(&claim, "gpu-0");
    let mig = n.spec_device(&claim, MIG);
    assert_eq!(
        metadata_mounts(&gpu),
        [json!({
            "hostPath": gpu_file.to_str().unwrap(),
            "containerPath": format!("{CONTAINER_DIR}/resourceclaims/train/gpu/{DRIVER}-metadata.json"),
            "options": ["ro", "bind"]
        })]
    );
    assert_eq!(
        metadata_mounts(&mig),
        [json!({
            "hostPath": mig_file.to_str().unwrap(),
            "containerPath": format!("{CONTAINER_DIR}/resourceclaims/train/mig/{DRIVER}-metadata.json"),
            "options": ["ro", "bind"]
        })]
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&gpu_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o644);

    n.unprepare_ok(&claim).await;
    assert!(leftovers(&n).is_empty(), "{:?}", leftovers(&n));
}

#[tokio::test]
async fn a_template_claim_is_mounted_under_its_pod_claim_name() {
    let n = node("mixed", &[], DraVersion::V1).await;
    let claim = n
        .claim("pod-gpus-x7k2p", json!([result("gpu", "gpu-2")]), json!([]))
        .await;
    let api: Api<ResourceClaim> = Api::namespaced(n.client.clone(), "default");
    api.patch(
        "pod-gpus-x7k2p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "resource.kubernetes.io/pod-claim-name": "gpus"}}})),
    )
    .await
    .unwrap();
    n.prepare_ok(&claim).await;
    let file = metadata_file(&n, "pod-gpus-x7k2p", "gpu");
    for doc in documents(&file) {
        assert_eq!(doc["podClaimName"], "gpus", "{doc}");
        assert_eq!(doc["metadata"]["name"], "pod-gpus-x7k2p");
    }
    assert_eq!(
        metadata_mounts(&n.spec_device(&claim, "gpu-2"))[0]["containerPath"],
        format!("{CONTAINER_DIR}/resourceclaimtemplates/gpus/gpu/{DRIVER}-metadata.json")
    );
    n.unprepare_ok(&claim).await;
    assert!(leftovers(&n).is_empty(), "{:?}", leftovers(&n));
}

#[tokio::test]
async fn turned_off_nothing_is_written_or_mounted() {
    let n = node("mixed", &["--device-metadata=false"], DraVersion::V1).await;
    let claim = n
        .claim("train", json!([result("gpu", "gpu-0")]), json!([]))
        .await;
    n.prepare_ok(&claim).await;
    assert!(!metadata_root(&n).exists());
    assert!(metadata_mounts(&n.spec_device(&claim, "gpu-0")).is_empty());
    n.unprepare_ok(&claim).await;
}

#[tokio::test]
async fn a_crash_between_the_write_and_the_checkpoint_leaves_nothing_after_the_restart() {
    let mut n = node_with(
        "mixed",
        &[],
        DraVersion::V1,
        &[("GPU_DRA_FAILPOINT", "prepare-after-cdi")],
    )
    .await;
    let claim = n
        .claim(
            "train",
            json!([result("gpu", "gpu-0"), result("mig", MIG)]),
            json!([]),
        )
        .await;
    let answer = n.kubelet.prepare(std::slice::from_ref(&claim)).await;
    assert!(answer.is_err(), "answered: {answer:?}\n{}", n.logs());
    let status = n.plugin.wait_exit(Duration::from_secs(10));
    assert_eq!(status.signal(), Some(6), "{status}\n{}", n.logs());
    // Written before the crash, and the checkpoint never heard of it.
    assert!(
        metadata_file(&n, "train", "gpu").is_file(),
        "{:?}",
        leftovers(&n)
    );
    assert!(n.checkpoint_claims().is_empty());
    // Debris of an interrupted write of another claim's file too.
    let debris = metadata_root(&n).join("default_other/gpu");
    std::fs::create_dir_all(&debris).unwrap();
    std::fs::write(debris.join(".metadata.json.1-0.tmp"), "{").unwrap();

    n.restart(&[]).await;
    assert!(
        leftovers(&n).is_empty(),
        "{:?}\n{}",
        leftovers(&n),
        n.logs()
    );
    // Prepared afresh: the files are back, and go with the unprepare.
    n.prepare_ok(&claim).await;
    assert!(metadata_file(&n, "train", "mig").is_file());
    // A restart keeps the files of a prepared claim.
    n.restart(&[]).await;
    assert!(metadata_file(&n, "train", "gpu").is_file(), "{}", n.logs());
    n.unprepare_ok(&claim).await;
    assert!(leftovers(&n).is_empty(), "{:?}", leftovers(&n));
}

/// KubeVirt's case: a passthrough GPU's file carries its PCI address.
#[tokio::test]
async fn a_vfio_passthrough_gpu_gets_its_file_with_the_pci_address() {
    use common::prepare::vfio_of;
    let n = node("pcie-a100-bridged", &["--passthrough"], DraVersion::V1).await;
    // The stand-in kernel rebinds GPUs as the plugin writes sysfs.
    let _vfio = vfio_of(&n, false);
    let claim = n.vfio_claim("vm", "gpu-vfio-0").await;
    n.prepare_ok(&claim).await;
    let file = metadata_file(&n, "vm", "vm");
    insta::assert_snapshot!("metadata_vfio", redacted(&file, &claim));
    let published = published_attributes(&n, "gpu-vfio-0").await;
    let bus = &published["resource.kubernetes.io/pciBusID"]["string"];
    assert!(bus.is_string(), "{published}");
    for doc in documents(&file) {
        let device = &doc["requests"][0]["devices"][0];
        assert_eq!(
            device["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            *bus
        );
        assert_eq!(device["attributes"]["type"]["string"], "vfio");
    }
    assert_eq!(
        metadata_mounts(&n.spec_device(&claim, "gpu-vfio-0"))[0]["containerPath"],
        format!("{CONTAINER_DIR}/resourceclaims/vm/vm/{DRIVER}-metadata.json")
    );
    n.unprepare_ok(&claim).await;
    assert!(leftovers(&n).is_empty(), "{:?}", leftovers(&n));
}

/// Memory shares of one GPU: each claim gets its own file, naming the
/// shared GPU; one claim's unprepare leaves the other's.
#[tokio::test]
async fn memory_shares_of_one_gpu_each_get_their_claims_file() {
    use common::prepare::shared_claim;
    let n = node("dgx-h100", &["--memory-sharing=all"], DraVersion::V1).await;
    let a = shared_claim(&n, 'a', "10Gi").await;
    let b = shared_claim(&n, 'b', "20Gi").await;
    n.prepare_ok(&a).await;
    n.prepare_ok(&b).await;
    for (claim, name) in [(&a, "share-a"), (&b, "share-b")] {
        let file = metadata_file(&n, name, name);
        for doc in documents(&file) {
            assert_eq!(doc["metadata"]["uid"], claim.uid.as_str());
            assert_eq!(doc["requests"][0]["devices"][0]["name"], "gpu-3");
        }
        assert_eq!(
            metadata_mounts(&n.spec_device(claim, "gpu-3"))[0]["hostPath"],
            file.to_str().unwrap()
        );
    }
    n.unprepare_ok(&a).await;
    assert_eq!(
        leftovers(&n),
        [
            "default_share-b",
            "default_share-b/share-b",
            "default_share-b/share-b/metadata.json"
        ]
    );
    n.unprepare_ok(&b).await;
    assert!(leftovers(&n).is_empty(), "{:?}", leftovers(&n));
}
