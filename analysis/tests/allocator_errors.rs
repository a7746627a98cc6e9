//! Malformed and hostile input: a precise error, never a panic, never a
//! verdict the rules do not support.

mod allocator_support;

use allocator_support::*;
use gpu_dra_analysis::allocator::{AllocError, Allocator, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

fn gpus() -> Vec<ResourceSlice> {
    vec![slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "40Gi"), gpu("gpu-1", 1, "80Gi")]),
    )]
}

fn run(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    claim: &ResourceClaim,
) -> Result<bool, AllocError> {
    let snapshot = Snapshot::new(slices, classes, &[]);
    Allocator::new()
        .simulate(&snapshot, claim, &SimulateOptions::default())
        .map(|o| o.is_satisfiable())
}

fn claim_err(requests: Value, constraints: Value) -> AllocError {
    run(&gpus(), &[gpu_class()], &claim("c", requests, constraints)).expect_err("must be rejected")
}

fn invalid_field(err: &AllocError) -> (&str, &str) {
    match err {
        AllocError::InvalidClaim { field, reason } => (field, reason),
        other => panic!("expected InvalidClaim, got {other:?}"),
    }
}

#[test]
fn count_zero_or_negative() {
    for count in [0, -3] {
        let err = claim_err(json!([exact("gpu", "gpu", count)]), json!(null));
        let (field, reason) = invalid_field(&err);
        assert_eq!(field, "spec.devices.requests[0].exactly.count");
        assert!(
            reason.contains(&format!("greater than zero, got {count}")),
            "{reason}"
        );
    }
}

#[test]
fn count_beyond_a_claim() {
    let err = claim_err(json!([exact("gpu", "gpu", 1_000_000_000_000)]), json!(null));
    assert!(
        matches!(err, AllocError::TooManyDevices { max: 32, .. }),
        "{err}"
    );
}

#[test]
fn mode_all_with_count_and_unknown_modes() {
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "count": 2}}]),
        json!(null),
    );
    assert_eq!(
        invalid_field(&err).0,
        "spec.devices.requests[0].exactly.count"
    );
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "Some"}}]),
        json!(null),
    );
    assert!(
        invalid_field(&err)
            .1
            .contains("unsupported allocation mode \"Some\""),
        "{err}"
    );
}

#[test]
fn unknown_device_class() {
    let err = claim_err(json!([exact("gpu", "tpu", 1)]), json!(null));
    assert_eq!(
        err.to_string(),
        "request `gpu`: device class `tpu` not found"
    );
    let err = claim_err(
        json!([{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}, {"name": "b", "deviceClassName": "nope"}]}]),
        json!(null),
    );
    assert!(
        matches!(&err, AllocError::UnknownDeviceClass { request, class } if request == "gpu/b" && class == "nope")
    );
}

#[test]
fn selectors_that_do_not_compile() {
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": "device.driver == "}}]}}]),
        json!(null),
    );
    assert!(
        matches!(&err, AllocError::Compile { location, .. } if location == "request gpu: selector #0"),
        "{err}"
    );
    let bad_class = class("gpu", &["device.attributes['x'].y ==== 1"]);
    let err = run(
        &gpus(),
        &[bad_class],
        &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
    )
    .unwrap_err();
    assert!(
        matches!(&err, AllocError::Compile { location, .. } if location == "device class gpu: selector #0"),
        "{err}"
    );
    let undeclared = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": "nodes.size() > 0"}}]}}]),
        json!(null),
    );
    assert!(undeclared.to_string().contains("nodes"), "{undeclared}");
}

#[test]
fn selector_without_expression() {
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{}]}}]),
        json!(null),
    );
    assert!(matches!(err, AllocError::EmptySelector { .. }), "{err}");
}

#[test]
fn runtime_errors_abort_instead_of_not_matching() {
    // gpu-0 lacks `numa`: a "no such key" error, as in the scheduler
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.example.com'].numa == 0"}}]}}]),
        json!(null),
    );
    match &err {
        AllocError::CelRuntime {
            location,
            device,
            node,
            ..
        } => {
            assert_eq!(location, "request gpu: selector #0");
            assert_eq!(device, "gpu.example.com/node-a/gpu-0");
            assert_eq!(node, "node-a");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("no such key"), "{err}");
    // a guarded selector is fine
    let ok = run(
        &gpus(),
        &[gpu_class()],
        &claim(
            "c",
            json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
                {"cel": {"expression": "has(device.attributes['gpu.example.com'].numa) && device.attributes['gpu.example.com'].numa == 0"}}]}}]),
            json!(null),
        ),
    );
    assert_eq!(ok, Ok(false));
    // non-bool results are errors too
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": "device.driver"}}]}}]),
        json!(null),
    );
    assert!(err.to_string().contains("must evaluate to a bool"), "{err}");
}

#[test]
fn a_device_in_use_is_not_evaluated_like_in_the_scheduler() {
    // only gpu-0 lacks `numa`, but it is in use: the scheduler never
    // evaluates selectors on it, so neither do we
    let slices = gpus();
    let classes = [gpu_class()];
    let busy = allocated_raw(
        "other",
        json!([{"request": "x", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]),
    );
    let mut with_numa = slices.clone();
    with_numa[0].spec.devices.as_mut().unwrap()[1]
        .attributes
        .as_mut()
        .unwrap()
        .insert(
            "numa".into(),
            serde_json::from_value(json!({"int": 0})).unwrap(),
        );
    let snapshot = Snapshot::new(&with_numa, &classes, std::slice::from_ref(&busy));
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.example.com'].numa == 0"}}]}}]),
        json!(null),
    );
    let out = Allocator::new()
        .simulate(&snapshot, &c, &SimulateOptions::default())
        .unwrap();
    assert_eq!(devices(&out), ["gpu-1"]);
}

#[test]
fn negative_and_malformed_capacity_requests() {
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "-1Gi"}}}}]),
        json!(null),
    );
    let (field, reason) = invalid_field(&err);
    assert_eq!(
        field,
        "spec.devices.requests[0].exactly.capacity.requests[memory]"
    );
    assert!(reason.contains("must not be negative"), "{reason}");
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "lots"}}}}]),
        json!(null),
    );
    assert!(invalid_field(&err).1.contains("invalid quantity"), "{err}");
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"a/b/c": "1"}}}}]),
        json!(null),
    );
    assert!(
        invalid_field(&err).1.contains("not a capacity name"),
        "{err}"
    );
}

#[test]
fn request_shape_errors() {
    let err = claim_err(json!([{"name": "gpu"}]), json!(null));
    assert!(
        invalid_field(&err)
            .1
            .contains("one of exactly and firstAvailable"),
        "{err}"
    );
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu"}, "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}]),
        json!(null),
    );
    assert!(invalid_field(&err).1.contains("not both"), "{err}");
    let err = claim_err(
        json!([exact("gpu", "gpu", 1), exact("gpu", "gpu", 1)]),
        json!(null),
    );
    assert_eq!(invalid_field(&err).0, "spec.devices.requests[1].name");
    let err = claim_err(json!([{"name": "gpu", "firstAvailable": []}]), json!(null));
    assert_eq!(
        invalid_field(&err).0,
        "spec.devices.requests[0].firstAvailable"
    );
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": ""}}]),
        json!(null),
    );
    assert!(
        invalid_field(&err).1.contains("missing device class name"),
        "{err}"
    );
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "tolerations": [{"key": "k", "operator": "Near"}]}}]),
        json!(null),
    );
    assert_eq!(
        invalid_field(&err).0,
        "spec.devices.requests[0].exactly.tolerations[0].operator"
    );
}

#[test]
fn constraint_errors() {
    let err = claim_err(
        json!([exact("gpu", "gpu", 1)]),
        json!([{"matchAttribute": "numa"}]),
    );
    let (field, reason) = invalid_field(&err);
    assert_eq!(field, "spec.devices.constraints[0].matchAttribute");
    assert!(
        reason.contains("not a fully qualified attribute name"),
        "{reason}"
    );
    let err = claim_err(
        json!([exact("gpu", "gpu", 1)]),
        json!([{"matchAttribute": "gpu.example.com/numa", "requests": ["tpu"]}]),
    );
    assert!(
        invalid_field(&err).1.contains("unknown request \"tpu\""),
        "{err}"
    );
    let err = claim_err(json!([exact("gpu", "gpu", 1)]), json!([{}]));
    assert!(
        invalid_field(&err)
            .1
            .contains("one of matchAttribute and distinctAttribute"),
        "{err}"
    );
    // sub-requests can be named
    let ok = run(
        &gpus(),
        &[gpu_class()],
        &claim(
            "c",
            json!([{"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}]),
            json!([{"matchAttribute": "gpu.example.com/model", "requests": ["gpu/a"]}]),
        ),
    );
    assert_eq!(ok, Ok(true));
}

#[test]
fn invalid_pools_are_errors_when_reached() {
    let dup = slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "1Gi"), gpu("gpu-0", 1, "1Gi")]),
    );
    let err = run(
        std::slice::from_ref(&dup),
        &[gpu_class()],
        &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
    )
    .unwrap_err();
    match &err {
        AllocError::InvalidPool { pool, reason, .. } => {
            assert_eq!(pool, "gpu.example.com/node-a");
            assert!(reason.contains("duplicate device name gpu-0"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(std::slice::from_ref(&dup), &classes, &[]);
    assert!(
        snapshot.pool_issues()[0]
            .reason
            .contains("invalid: duplicate device name")
    );

    let unknown_set = slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([{"name": "mig", "attributes": {"type": {"string": "gpu"}},
                "consumesCounters": [{"counterSet": "nowhere", "counters": {"memory": {"value": "1"}}}]}]),
    );
    let err = run(
        &[unknown_set],
        &classes,
        &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("unknown counter set nowhere"),
        "{err}"
    );

    let two_sets = [
        slice_with(
            "a",
            "p",
            Some("node-a"),
            0,
            2,
            json!(null),
            json!([{"name": "cs", "counters": {"m": {"value": "1"}}}]),
        ),
        slice_with(
            "b",
            "p",
            Some("node-a"),
            0,
            2,
            json!([gpu("gpu-0", 0, "1Gi")]),
            json!([{"name": "cs", "counters": {"m": {"value": "1"}}}]),
        ),
    ];
    let err = run(
        &two_sets,
        &classes,
        &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("duplicate counter set name cs"),
        "{err}"
    );
}

#[test]
fn malformed_device_values() {
    let bad = |device: Value| slice("s", "node-a", Some("node-a"), json!([device]));
    let cases = [
        (
            json!({"name": "d", "attributes": {"type": {"string": "gpu"}, "v": {"version": "not-semver"}}}),
            "invalid version",
        ),
        (
            json!({"name": "d", "attributes": {"type": {"string": "gpu", "int": 3}}}),
            "more than one of int, bool, string, version",
        ),
        (
            json!({"name": "d", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "-1"}}}),
            "negative",
        ),
        (
            json!({"name": "d", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi",
                "requestPolicy": {"validRange": {"min": "1Gi", "step": "0"}}}}}),
            "step is zero",
        ),
    ];
    for (device, expected) in cases {
        let err = run(
            &[bad(device)],
            &[gpu_class()],
            &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
        );
        let msg = match err {
            Err(e) => e.to_string(),
            Ok(v) => panic!("expected an error containing {expected:?}, got verdict {v}"),
        };
        assert!(msg.contains(expected), "{msg}");
        assert!(msg.contains("gpu.example.com/node-a/d"), "{msg}");
    }
}

#[test]
fn malformed_counters_make_the_pool_invalid() {
    let s = slice_with(
        "s",
        "p",
        Some("node-a"),
        0,
        1,
        json!([gpu("gpu-0", 0, "1Gi")]),
        json!([{"name": "cs", "counters": {"m": {"value": "-5"}}}]),
    );
    let err = run(
        &[s],
        &[gpu_class()],
        &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("counter cs/m is negative"),
        "{err}"
    );
}

#[test]
fn unreadable_allocation_results_count_the_device_as_used() {
    let shared = slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([{"name": "gpu-0", "allowMultipleAllocations": true, "attributes": {"type": {"string": "gpu"}},
                "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}}}]),
    );
    let weird = allocated_raw(
        "weird",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0",
                "shareID": "7e1b0c4e-0000-4000-8000-000000000001", "consumedCapacity": {"memory": "lots"}}]),
    );
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(
        std::slice::from_ref(&shared),
        &classes,
        std::slice::from_ref(&weird),
    );
    assert_eq!(snapshot.allocation_issues().len(), 1);
    assert!(snapshot.allocation_issues()[0].contains("lots"));
    let out = Allocator::new()
        .simulate(
            &snapshot,
            &claim("c", json!([exact("gpu", "gpu", 1)]), json!(null)),
            &SimulateOptions::default(),
        )
        .unwrap();
    assert!(!out.is_satisfiable());
}

#[test]
fn search_budget_is_an_error_not_a_verdict() {
    // 12 devices, pairwise distinct `group` impossible for 7 of them with
    // 6 groups: an exhaustive search, cut short by a tiny budget
    let devices: Vec<Value> = (0..12)
        .map(|i| json!({"name": format!("d{i}"), "attributes": {"type": {"string": "gpu"}, "group": {"int": i % 6}}}))
        .collect();
    let slices = [slice("s", "node-a", Some("node-a"), json!(devices))];
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let c = claim(
        "c",
        json!([exact("gpu", "gpu", 7)]),
        json!([{"distinctAttribute": "gpu.example.com/group"}]),
    );
    let tight = SimulateOptions {
        max_search_steps: 50,
        ..SimulateOptions::default()
    };
    let err = Allocator::new()
        .simulate(&snapshot, &c, &tight)
        .unwrap_err();
    assert!(
        matches!(err, AllocError::SearchBudgetExhausted { steps: 50, .. }),
        "{err}"
    );
    let out = Allocator::new()
        .simulate(&snapshot, &c, &SimulateOptions::default())
        .unwrap();
    assert!(!out.is_satisfiable());
}

#[test]
fn hostile_selectors_hit_limits_not_the_machine() {
    let expensive = "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, a + b + c + d + e + f > 0))))))";
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": expensive}}]}}]),
        json!(null),
    );
    assert!(matches!(err, AllocError::Compile { .. }), "{err}");
    let long = format!("device.driver == '{}'", "x".repeat(20_000));
    let err = claim_err(
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": long}}]}}]),
        json!(null),
    );
    assert!(err.to_string().contains("bytes"), "{err}");
}
