//! Scheduler-side check of the NVLink topology attributes: the pool the
//! publisher puts on the (test) API server is read back and fed to a small
//! allocator that, like kube-scheduler, takes the devices of the DeviceClass
//! `gpu.nvidia.com` (`type == "gpu"`) and enforces a request's
//! `matchAttribute` constraint. A claim for 2 GPUs with
//! `matchAttribute: gpu.nvidia.com/nvlinkDomain` must only ever get
//! NVLink-connected GPUs.

mod slices_support;

use std::collections::BTreeSet;

use gpu_dra_sim::apiserver::{TestApiServer, ValidationRules};
use gpu_kubelet_plugin::discovery::Inventory;
use gpu_kubelet_plugin::slices::Flags;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use slices_support::*;

const MATCH: &str = "gpu.nvidia.com/nvlinkDomain";

/// The published devices, in pool order.
async fn published(inventory: Inventory) -> (TestApiServer, Vec<Device>) {
    let server = server(ValidationRules::V1_35).await;
    let mut p = Running::start(&server, Flags::default(), inventory);
    p.synced(1).await;
    p.stop().await.unwrap();
    let mut slices = slices(&server);
    slices.sort_by_key(|s| s.metadata.name.clone());
    let devices = slices
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect();
    (server, devices)
}

/// An attribute by fully qualified name: names in the driver's own domain
/// are published unqualified.
fn attribute<'a>(d: &'a Device, qualified: &str) -> Option<&'a DeviceAttribute> {
    let attrs = d.attributes.as_ref()?;
    let short = qualified.strip_prefix(&format!("{DRIVER}/"));
    attrs
        .get(qualified)
        .or_else(|| short.and_then(|s| attrs.get(s)))
}

/// The DeviceClass `gpu.nvidia.com` selector.
fn is_gpu(d: &Device) -> bool {
    attribute(d, "gpu.nvidia.com/type").and_then(|a| a.string.as_deref()) == Some("gpu")
}

/// `matchAttribute`: every device has the attribute, with one value.
fn match_attribute(devices: &[&Device], name: &str) -> bool {
    let values: Vec<Option<&DeviceAttribute>> =
        devices.iter().map(|d| attribute(d, name)).collect();
    values.iter().all(Option::is_some) && values.windows(2).all(|w| w[0] == w[1])
}

/// Every pair of GPUs satisfying the constraint.
fn satisfying_pairs(devices: &[Device]) -> BTreeSet<(String, String)> {
    let gpus: Vec<&Device> = devices.iter().filter(|d| is_gpu(d)).collect();
    let mut pairs = BTreeSet::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            if match_attribute(&[a, b], MATCH) {
                pairs.insert((a.name.clone(), b.name.clone()));
            }
        }
    }
    pairs
}

/// First fit, as the scheduler allocates: the first pair in pool order whose
/// devices are free and satisfy the constraint.
fn first_fit(devices: &[Device], taken: &[&str]) -> Option<(String, String)> {
    let free: Vec<&Device> = devices
        .iter()
        .filter(|d| is_gpu(d) && !taken.contains(&d.name.as_str()))
        .collect();
    for (i, a) in free.iter().enumerate() {
        for b in &free[i + 1..] {
            if match_attribute(&[a, b], MATCH) {
                return Some((a.name.clone(), b.name.clone()));
            }
        }
    }
    None
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

#[tokio::test]
async fn bridged_a100s_pair_only_along_their_bridges() {
    let (_server, devices) = published(pcie_a100_bridged()).await;
    assert_eq!(devices.len(), 4);
    let pairs = satisfying_pairs(&devices);
    assert_eq!(
        pairs,
        BTreeSet::from([pair("gpu-0", "gpu-1"), pair("gpu-2", "gpu-3")])
    );
    // Never 1+2, whatever is taken already.
    assert_eq!(first_fit(&devices, &[]), Some(pair("gpu-0", "gpu-1")));
    assert_eq!(
        first_fit(&devices, &["gpu-0"]),
        Some(pair("gpu-2", "gpu-3"))
    );
    assert_eq!(first_fit(&devices, &["gpu-0", "gpu-3"]), None);
    for d in &devices {
        assert_eq!(
            attribute(d, "gpu.nvidia.com/nvlinkCount").and_then(|a| a.int),
            Some(12)
        );
    }
}

#[tokio::test]
async fn nvswitch_nodes_are_one_domain_and_unlinked_gpus_pair_with_nobody() {
    let mut inv = dgx_h100();
    for g in &mut inv.gpus {
        g.info.mig = None;
    }
    // GPU 7 lost its links: it is on its own.
    inv.gpus[7].info.nvlinks.clear();
    let (_server, devices) = published(inv).await;
    let pairs = satisfying_pairs(&devices);
    assert_eq!(pairs.len(), 7 * 6 / 2);
    assert!(pairs.iter().all(|(a, b)| a != "gpu-7" && b != "gpu-7"));
    let lone = devices.iter().find(|d| d.name == "gpu-7").unwrap();
    assert_eq!(
        attribute(lone, "gpu.nvidia.com/nvlinkCount").and_then(|a| a.int),
        Some(0)
    );
    // It still has a domain (of its own), so selectors can read it without has().
    assert!(
        attribute(lone, MATCH)
            .and_then(|a| a.string.as_ref())
            .is_some()
    );
}
