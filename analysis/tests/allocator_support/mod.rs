//! Builders for the allocator tests: Kubernetes objects from JSON, as they
//! would come from the API server.
#![allow(dead_code)]

use gpu_dra_analysis::allocator::{Allocator, NodeAllocation, Outcome, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

pub const DRIVER: &str = "gpu.example.com";

/// A ResourceSlice of `pool` local to `node` (or for all nodes when `None`).
pub fn slice(name: &str, pool: &str, node: Option<&str>, devices: Value) -> ResourceSlice {
    slice_with(name, pool, node, 0, 1, devices, Value::Null)
}

/// A ResourceSlice with every pool field given; `counters` is the
/// `sharedCounters` list (or null).
pub fn slice_with(
    name: &str,
    pool: &str,
    node: Option<&str>,
    generation: i64,
    count: i64,
    devices: Value,
    counters: Value,
) -> ResourceSlice {
    let mut spec = json!({
        "driver": DRIVER,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
    });
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    if !devices.is_null() {
        spec["devices"] = devices;
    }
    if !counters.is_null() {
        spec["sharedCounters"] = counters;
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
        .expect("valid ResourceSlice")
}

/// A GPU with attributes `type: gpu`, `index`, `model` and capacity
/// `memory`.
pub fn gpu(name: &str, index: i64, memory: &str) -> Value {
    json!({
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": index},
            "model": {"string": "A100"},
        },
        "capacity": {"memory": {"value": memory}},
    })
}

/// A DeviceClass with these selectors.
pub fn class(name: &str, selectors: &[&str]) -> DeviceClass {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": selectors}}))
        .expect("valid DeviceClass")
}

/// The class `gpu`: every device of the test driver with `type == "gpu"`.
pub fn gpu_class() -> DeviceClass {
    class(
        "gpu",
        &[
            "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].type == 'gpu'",
        ],
    )
}

/// A claim with these requests and constraints (JSON lists).
pub fn claim(name: &str, requests: Value, constraints: Value) -> ResourceClaim {
    let mut devices = json!({"requests": requests});
    if !constraints.is_null() {
        devices["constraints"] = constraints;
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": devices},
    }))
    .expect("valid ResourceClaim")
}

/// A request for `count` devices of `class`.
pub fn exact(name: &str, class: &str, count: i64) -> Value {
    json!({"name": name, "exactly": {"deviceClassName": class, "count": count}})
}

/// `claim` as allocated with `allocation`.
pub fn allocated(mut claim: ResourceClaim, allocation: &NodeAllocation) -> ResourceClaim {
    claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(allocation.allocation_result()),
        ..Default::default()
    });
    claim
}

/// A claim allocated with these `(pool, device)` results for `request`.
pub fn allocated_raw(name: &str, results: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .expect("valid ResourceClaim")
}

/// Simulates with default options.
pub fn simulate(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claim: &ResourceClaim,
) -> Outcome {
    let snapshot = Snapshot::new(slices, classes, allocated);
    Allocator::new()
        .simulate(&snapshot, claim, &SimulateOptions::default())
        .expect("simulation gives a verdict")
}

/// The devices of the first allocation, as `(request, device)`.
pub fn picked(outcome: &Outcome) -> Vec<(String, String)> {
    let Some(allocations) = outcome.allocations() else {
        panic!("expected an allocation, got {outcome:#?}");
    };
    allocations[0]
        .results
        .iter()
        .map(|r| (r.request.clone(), r.device.clone()))
        .collect()
}

/// The device names of the first allocation.
pub fn devices(outcome: &Outcome) -> Vec<String> {
    picked(outcome).into_iter().map(|(_, d)| d).collect()
}

/// The summary of an unsatisfiable outcome.
pub fn summary(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Unsatisfiable(e) => e.summary.clone(),
        Outcome::Satisfiable(a) => panic!("expected no fit, got {a:#?}"),
    }
}
