//! Explanations of unsatisfiable claims: the funnel counts and the one-line
//! summaries used for Events.

mod allocator_support;

use allocator_support::*;
use gpu_dra_analysis::allocator::{FailureReason, Needed, SelectorSource};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};

const BIG: &str = "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0";

fn sixteen_gpus() -> Vec<ResourceSlice> {
    let gpus: Vec<Value> = (0..16)
        .map(|i| gpu(&format!("gpu-{i}"), i, if i == 3 { "40Gi" } else { "24Gi" }))
        .collect();
    vec![slice("s", "node-a", Some("node-a"), json!(gpus))]
}

fn with_selectors(name: &str, count: i64, selectors: &[&str]) -> Value {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect();
    json!({"name": name, "exactly": {"deviceClassName": "gpu", "count": count, "selectors": selectors}})
}

#[test]
fn failing_request_selector_names_the_closest_device_and_its_value() {
    let c = claim(
        "c",
        json!([with_selectors(
            "gpu",
            1,
            &["device.attributes['gpu.example.com'].model == 'A100'", BIG]
        )]),
        json!(null),
    );
    let out = simulate(&sixteen_gpus(), &[gpu_class()], &[], &c);
    let e = out.explanation().unwrap();
    assert_eq!(
        e.summary,
        "node `node-a`: 0 of 16 devices match selector 2 of request `gpu`: \
         device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0; closest device `gpu-3` has memory 40Gi"
    );
    let n = &e.nodes[0];
    assert_eq!(
        n.reason,
        FailureReason::Request {
            request: "gpu".into()
        }
    );
    let v = &n.requests[0].variants[0];
    let passed: Vec<usize> = v.stages.iter().map(|s| s.passed).collect();
    assert_eq!(passed, [16, 16, 0]);
    assert_eq!(
        v.stages[0].source,
        SelectorSource::DeviceClass {
            class: "gpu".into(),
            index: 0
        }
    );
    assert_eq!(v.needed, Needed::Count(1));
    let closest = v.closest.as_ref().unwrap();
    assert_eq!(
        (closest.device.as_str(), closest.failed_stage),
        ("gpu-3", 2)
    );
    assert_eq!(
        closest.values,
        [("memory".to_owned(), Some("40Gi".to_owned()))]
    );
}

#[test]
fn failing_class_selector_is_attributed_to_the_class() {
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "1Gi"), {"name": "mig-0", "attributes": {"type": {"string": "mig"}}}]),
    )];
    let classes = [class(
        "mig-1g",
        &[
            "device.attributes['gpu.example.com'].type == 'mig'",
            "device.attributes['gpu.example.com'].?profile.orValue('') == '1g.10gb'",
        ],
    )];
    let c = claim("c", json!([exact("small", "mig-1g", 1)]), json!(null));
    let out = simulate(&slices, &classes, &[], &c);
    assert_eq!(
        summary(&out),
        "node `node-a`: 0 of 2 devices match selector 2 of device class `mig-1g` (request `small`): \
         device.attributes['gpu.example.com'].?profile.orValue('') == '1g.10gb'; closest device `mig-0` has no profile"
    );
}

#[test]
fn matching_but_unavailable_devices_are_counted_by_reason() {
    let busy = allocated_raw(
        "other",
        json!([
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-2"},
        ]),
    );
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([
            gpu("gpu-0", 0, "1Gi"),
            gpu("gpu-1", 1, "1Gi"),
            gpu("gpu-2", 2, "1Gi"),
            gpu("gpu-3", 3, "1Gi")
        ]),
    )];
    let c = claim("c", json!([exact("gpu", "gpu", 2)]), json!(null));
    let out = simulate(&slices, &[gpu_class()], std::slice::from_ref(&busy), &c);
    assert_eq!(
        summary(&out),
        "node `node-a`: request `gpu` needs 2 devices: 4 of 4 devices match its selectors, \
         but only 1 is available (3 in use by other claims)"
    );
    let v = &out.explanation().unwrap().nodes[0].requests[0].variants[0];
    assert_eq!(
        (v.matching, v.in_use, v.available, v.fits_alone),
        (4, 3, 1, false)
    );

    let all = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[busy], &all);
    assert_eq!(
        summary(&out),
        "node `node-a`: request `gpu` asks for all 4 matching devices, but 3 cannot be allocated (3 in use by other claims)"
    );
}

#[test]
fn exhausted_counters_are_named() {
    let dev = |name: &str, slice: &str| {
        json!({"name": name, "attributes": {"type": {"string": "gpu"}},
               "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {slice: {"value": "1"}}}]})
    };
    let slices = [slice_with(
        "s",
        "node-a",
        Some("node-a"),
        0,
        1,
        json!([
            dev("part-a", "memory-slice-0"),
            dev("part-b", "memory-slice-0")
        ]),
        json!([{"name": "gpu-0-counters", "counters": {"memory-slice-0": {"value": "1"}}}]),
    )];
    let busy = allocated_raw(
        "other",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "part-a"}]),
    );
    let c = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&slices, &[gpu_class()], &[busy], &c);
    assert_eq!(
        summary(&out),
        "node `node-a`: request `gpu` needs 1 device: 2 of 2 devices match its selectors, but none is available \
         (1 in use by other claims, 1 without enough free shared counters; short of counter gpu-0-counters/memory-slice-0)"
    );
}

#[test]
fn blocking_constraints_are_described() {
    let dev = |name: &str, numa: i64| json!({"name": name, "attributes": {"type": {"string": "gpu"}, "numa": {"int": numa}}});
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([dev("gpu-0", 0), dev("gpu-1", 1)]),
    )];
    let c = claim(
        "c",
        json!([exact("a", "gpu", 1), exact("b", "gpu", 1)]),
        json!([
            {"distinctAttribute": "gpu.example.com/type"},
            {"matchAttribute": "gpu.example.com/numa", "requests": ["a", "b"]},
        ]),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    let e = out.explanation().unwrap();
    // each alone rules out every pair: both are blamed
    assert_eq!(
        e.summary,
        "node `node-a`: every request fits on its own, but no combination of devices satisfies \
         distinctAttribute `gpu.example.com/type` (constraint 1, all requests) together with \
         matchAttribute `gpu.example.com/numa` (constraint 2, requests `a`, `b`)"
    );
    // only the match constraint is at fault when the other is satisfiable
    let c = claim(
        "c",
        json!([exact("a", "gpu", 1), exact("b", "gpu", 1)]),
        json!([
            {"distinctAttribute": "gpu.example.com/numa"},
            {"matchAttribute": "gpu.example.com/numa", "requests": ["a", "b"]},
        ]),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    match &out.explanation().unwrap().nodes[0].reason {
        FailureReason::Constraints { constraints, .. } => assert_eq!(constraints, &[1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn requests_competing_for_the_same_devices() {
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "1Gi"), gpu("gpu-1", 1, "1Gi")]),
    )];
    let c = claim(
        "c",
        json!([exact("a", "gpu", 1), exact("b", "gpu", 2)]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    assert_eq!(
        summary(&out),
        "node `node-a`: every request fits on its own, but not together: they compete for the same devices, shared counters or capacity"
    );
}

#[test]
fn first_available_explains_every_alternative() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "selectors": [{"cel": {"expression": BIG}}]},
            {"name": "many", "deviceClassName": "gpu", "count": 20},
        ]}]),
        json!(null),
    );
    let out = simulate(&sixteen_gpus(), &[gpu_class()], &[], &c);
    assert_eq!(
        summary(&out),
        format!(
            "node `node-a`: no alternative of request `gpu` fits: `gpu/big`: 0 of 16 devices match selector 1 of request `gpu/big`: {BIG}; \
             closest device `gpu-3` has memory 40Gi; `gpu/many`: request `gpu/many` needs 20 devices, but the node has only 16 devices \
             (16 match its selectors)"
        )
    );
}

#[test]
fn many_nodes_failing_alike_are_summed_up() {
    let slices: Vec<ResourceSlice> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| {
            slice(
                n,
                n,
                Some(n),
                json!([gpu("gpu-0", 0, "24Gi"), gpu("gpu-1", 1, "40Gi")]),
            )
        })
        .collect();
    let c = claim("c", json!([with_selectors("gpu", 1, &[BIG])]), json!(null));
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    let e = out.explanation().unwrap();
    assert_eq!(e.nodes_checked, 3);
    assert_eq!(
        e.summary,
        format!(
            "0 of 6 devices on 3 nodes match selector 1 of request `gpu`: {BIG}; closest device `gpu-1` has memory 40Gi (node `node-a`)"
        )
    );
}

#[test]
fn many_nodes_failing_differently_report_the_closest_node() {
    let slices = [
        slice(
            "a",
            "node-a",
            Some("node-a"),
            json!([gpu("gpu-0", 0, "24Gi")]),
        ),
        slice(
            "b",
            "node-b",
            Some("node-b"),
            json!([gpu("gpu-0", 0, "80Gi")]),
        ),
    ];
    let busy = allocated_raw(
        "other",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}]),
    );
    let c = claim("c", json!([with_selectors("gpu", 1, &[BIG])]), json!(null));
    let out = simulate(&slices, &[gpu_class()], &[busy], &c);
    assert_eq!(
        summary(&out),
        "no node fits (2 nodes checked); closest is node `node-b`: request `gpu` needs 1 device: \
         1 of 1 device matches its selectors, but none is available (1 in use by other claims)"
    );
}

#[test]
fn selector_errors_beyond_the_search_are_reported_not_raised() {
    // request `a` cannot be satisfied, so (like the scheduler) the search
    // never evaluates `b`, whose selector fails on gpu-0; the explanation
    // evaluates it and reports the error
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([gpu("gpu-0", 0, "1Gi")]),
    )];
    let c = claim(
        "c",
        json!([
            with_selectors("a", 2, &[]),
            with_selectors("b", 1, &["device.attributes['gpu.example.com'].numa == 1"]),
        ]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    let e = out.explanation().unwrap();
    let b = &e.nodes[0].requests[1].variants[0];
    assert_eq!(b.selector_errors, 1);
    let err = b.first_error.as_deref().unwrap();
    assert!(
        err.starts_with("selector 1 of request `b` on device `gpu-0`: no such key"),
        "{err}"
    );
}

#[test]
fn no_device_on_the_node() {
    let slices = [slice("s", "node-a", Some("node-a"), json!([]))];
    let c = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let classes = [gpu_class()];
    let snapshot = gpu_dra_analysis::allocator::Snapshot::new(&slices, &classes, &[]);
    let options = gpu_dra_analysis::allocator::SimulateOptions {
        nodes: gpu_dra_analysis::allocator::NodeFilter::Node("node-x".into()),
        ..Default::default()
    };
    let out = gpu_dra_analysis::allocator::Allocator::new()
        .simulate(&snapshot, &c, &options)
        .unwrap();
    let e = out.explanation().unwrap();
    assert_eq!(e.nodes[0].reason, FailureReason::NoDevices);
    assert_eq!(e.summary, "node `node-x`: no devices are available");
}

#[test]
fn event_notes_are_bounded() {
    let long = format!(
        "device.attributes['gpu.example.com'].model == '{}'",
        "é".repeat(3000)
    );
    let c = claim(
        "c",
        json!([with_selectors("gpu", 1, &[&long])]),
        json!(null),
    );
    let out = simulate(&sixteen_gpus(), &[gpu_class()], &[], &c);
    let e = out.explanation().unwrap();
    assert!(e.summary.len() > 6000);
    let note = e.event_note(1024);
    assert!(
        note.len() <= 1024 && note.ends_with("..."),
        "{}",
        note.len()
    );
    assert!(note.starts_with("node `node-a`: 0 of 16 devices match selector 1 of request `gpu`"));
    assert_eq!(e.event_note(100_000), e.summary);
    assert_eq!(e.event_note(2), "...");
}
