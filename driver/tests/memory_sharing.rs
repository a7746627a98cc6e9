//! Memory-fraction sharing from publication to allocation: the real plugin
//! binary publishes a pool with `--memory-sharing` to the test API server
//! (which validates every slice), and the project's allocator
//! (`gpu_dra_api::allocator`, the scheduler's rules) allocates claims asking
//! for `capacity.requests.memory` on the slices as stored: several claims
//! share one GPU, each consuming its request rounded up to the policy's
//! step, until its memory is used up.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{NODE, Plugin, TestEnv, short_dir};
use gpu_dra_api::allocator::{Allocator, NodeAllocation, Outcome, SimulateOptions, Snapshot};
use gpu_dra_sim::apiserver::ValidationRules;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The shipped `gpu.nvidia.com` class's selector (deviceclasses/).
fn gpu_class() -> DeviceClass {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
    }))
    .unwrap()
}

/// A claim for one GPU with `memory` of its memory (none: no capacity
/// request), optionally restricted to multi-allocatable devices.
fn claim(name: &str, memory: Option<&str>, shared_only: bool) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": "gpu.nvidia.com"});
    if let Some(memory) = memory {
        exactly["capacity"] = json!({"requests": {"memory": memory}});
    }
    if shared_only {
        exactly["selectors"] = json!([{"cel": {"expression": "device.allowMultipleAllocations"}}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .unwrap()
}

/// `claim` with `allocation` recorded in its status.
fn allocated(mut claim: ResourceClaim, allocation: &NodeAllocation) -> ResourceClaim {
    claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(allocation.allocation_result()),
        ..Default::default()
    });
    claim
}

fn simulate(slices: &[ResourceSlice], allocated: &[ResourceClaim], c: &ResourceClaim) -> Outcome {
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(slices, &classes, allocated);
    Allocator::new()
        .simulate(&snapshot, c, &SimulateOptions::default())
        .expect("the allocator gives a verdict")
}

/// Starts the plugin on t4-inference with `flags` and returns the stored
/// slices of its (complete) pool.
async fn published(
    dir: &std::path::Path,
    flags: &[&str],
) -> (Arc<TestEnv>, Plugin, Vec<ResourceSlice>) {
    let env = Arc::new(
        TestEnv::builder(dir)
            .bundled("t4-inference")
            .rules(ValidationRules::V1_35)
            .build(),
    );
    let plugin = Plugin::launch(&env, dir, "run", flags);
    let pool: Vec<Value> = env.wait_pool(NODE, WAIT).await;
    let slices = pool
        .into_iter()
        .map(|s| serde_json::from_value(s).expect("a ResourceSlice"))
        .collect();
    (env, plugin, slices)
}

const MIB: i128 = 1 << 20;

/// The first (and only) result of a satisfiable outcome: (device, share id,
/// consumed memory in MiB).
fn result(outcome: &Outcome) -> (String, Option<String>, Option<i128>) {
    let Some(allocations) = outcome.allocations() else {
        panic!("not allocated: {outcome:#?}");
    };
    let r = &allocations[0].results[0];
    (
        r.device.clone(),
        r.share_id.clone(),
        r.consumed_capacity.get("memory").map(|q| {
            gpu_kubelet_plugin::devices::k8s::quantity_nanos(&q.canonical()).unwrap()
                / 1_000_000_000
                / MIB
        }),
    )
}

#[tokio::test]
async fn claims_share_a_published_gpu_by_memory() {
    let dir = short_dir();
    // T4: 15360 MiB; GPU 2 is shared.
    let (_env, _plugin, slices) = published(dir.path(), &["--memory-sharing", "2"]).await;

    let mut taken: Vec<ResourceClaim> = Vec::new();
    let mut shares = Vec::new();
    // 7000Mi rounds up to 7168Mi (28 x 256Mi): two fit in 15360Mi.
    for name in ["a", "b"] {
        let c = claim(name, Some("7000Mi"), true);
        let out = simulate(&slices, &taken, &c);
        let (device, share, consumed) = result(&out);
        assert_eq!(device, "gpu-2");
        assert_eq!(consumed, Some(7168));
        shares.push(share.expect("a share id for a multi-allocatable device"));
        taken.push(allocated(c, &out.allocations().unwrap()[0]));
    }
    assert_ne!(shares[0], shares[1], "each allocation is its own share");

    // 1024Mi more fits (15360 - 2 x 7168 = 1024); then nothing is left.
    let c = claim("c", Some("1Gi"), true);
    let out = simulate(&slices, &taken, &c);
    assert_eq!(result(&out).2, Some(1024));
    taken.push(allocated(c, &out.allocations().unwrap()[0]));
    let out = simulate(&slices, &taken, &claim("d", Some("256Mi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");

    // A claim that names no memory on a fresh copy consumes the default 1Gi.
    let out = simulate(&slices, &[], &claim("e", None, true));
    assert_eq!(result(&out).2, Some(1024));

    // More than the GPU: the policy's max refuses it.
    let out = simulate(&slices, &[], &claim("f", Some("15361Mi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");

    // Unshared GPUs are still allocated whole, without a share.
    let out = simulate(&slices, &taken, &claim("g", None, false));
    let (device, share, consumed) = result(&out);
    assert_eq!(device, "gpu-0");
    assert_eq!((share, consumed), (None, None));
}

#[tokio::test]
async fn a_memory_request_on_an_unshared_pool_is_refused() {
    let dir = short_dir();
    let (_env, _plugin, slices) = published(dir.path(), &[]).await;
    let out = simulate(&slices, &[], &claim("a", Some("1Gi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");
    // Without the selector, a whole GPU is still allocated.
    let out = simulate(&slices, &[], &claim("b", None, false));
    assert_eq!(result(&out).0, "gpu-0");
}

#[tokio::test]
async fn a_malformed_flag_stops_the_plugin_with_one_line() {
    let dir = short_dir();
    let (status, stderr) = common::run_to_exit(&["--memory-sharing", "0,MIG-1234"], dir.path());
    common::assert_one_line_error(status, &stderr, "--memory-sharing");
    assert!(
        stderr.contains("entry 2: \"MIG-1234\" is a MIG device"),
        "{stderr}"
    );
}
