//! NVLink topology from publication to allocation: the real plugin
//! (started in-process from its command line) publishes the pool of a fake
//! NVSwitch machine, whose every NVLink reports NVML's switch sentinel as
//! its far end, to the test API server, and the project's allocator (the
//! scheduler's rules) allocates claims constrained by
//! `matchAttribute: gpu.nvidia.com/nvlinkDomain` on the slices as stored:
//! all 8 GPUs of an HGX H100 (joined through the switches by P2P status),
//! all 4 of a GB200 tray (joined by their fabric clique), and on a server
//! of bridged pairs only pairs.
//!
//! Here and not among the plugin's tests: the plugin does not depend on the
//! analysis crate (no CEL in its build).

mod common;

use common::{Node, gpu_class, published_on};
use gpu_dra_analysis::allocator::{Allocator, Outcome, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;

/// A claim for `count` GPUs in one NVLink domain.
fn linked_gpus(count: u32) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("linked-{count}"), "namespace": "default", "uid": format!("uid-{count}")},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]
        }}
    }))
    .unwrap()
}

fn simulate(slices: &[ResourceSlice], claim: &ResourceClaim) -> Outcome {
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(slices, &classes, &[]);
    Allocator::new()
        .simulate(&snapshot, claim, &SimulateOptions::default())
        .expect("the allocator gives a verdict")
}

/// The devices of a satisfiable outcome, sorted.
fn allocated(outcome: &Outcome) -> Vec<String> {
    let Some(allocations) = outcome.allocations() else {
        panic!("not allocated: {outcome:#?}");
    };
    let mut devices: Vec<String> = allocations[0]
        .results
        .iter()
        .map(|r| r.device.clone())
        .collect();
    devices.sort();
    devices
}

/// Starts the plugin on `profile` and returns the stored slices of its
/// (complete) pool.
async fn published(profile: &str) -> (Node, Vec<ResourceSlice>) {
    published_on(profile, &[]).await
}

fn gpus(n: u32) -> Vec<String> {
    let mut names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
    names.sort();
    names
}

#[tokio::test]
async fn eight_nvlink_gpus_on_hgx_h100() {
    let (_node, slices) = published("dgx-h100").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(8))), gpus(8));
    // Nine do not exist: refused on the count, not on the constraint.
    assert!(!simulate(&slices, &linked_gpus(9)).is_satisfiable());
}

#[tokio::test]
async fn four_nvlink_gpus_on_a_gb200_tray() {
    let (_node, slices) = published("gb200-nvl").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(4))), gpus(4));
}

#[tokio::test]
async fn bridged_pairs_give_pairs_only() {
    let (_node, slices) = published("pcie-a100-bridged").await;
    assert_eq!(allocated(&simulate(&slices, &linked_gpus(2))).len(), 2);
    assert!(!simulate(&slices, &linked_gpus(3)).is_satisfiable());
}
