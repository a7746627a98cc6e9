//! The allocation rules, one test per rule, through the public API.

mod allocator_support;

use allocator_support::*;
use gpu_dra_analysis::allocator::{
    AllocError, Allocator, FailureReason, NodeFilter, Outcome, SimulateOptions, Snapshot,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;

fn four_gpus() -> Vec<ResourceSlice> {
    vec![slice(
        "node-a-gpus",
        "node-a",
        Some("node-a"),
        json!([
            gpu("gpu-0", 0, "40Gi"),
            gpu("gpu-1", 1, "40Gi"),
            gpu("gpu-2", 2, "80Gi"),
            gpu("gpu-3", 3, "80Gi")
        ]),
    )]
}

fn taken(name: &str, devices: &[&str]) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": d}))
        .collect();
    allocated_raw(name, json!(results))
}

fn try_simulate(
    slices: &[ResourceSlice],
    allocated: &[ResourceClaim],
    claim: &ResourceClaim,
) -> Result<Outcome, AllocError> {
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(slices, &classes, allocated);
    Allocator::new().simulate(&snapshot, claim, &SimulateOptions::default())
}

#[test]
fn exact_count_takes_the_first_devices_in_order() {
    let c = claim("c", json!([exact("gpu", "gpu", 2)]), json!(null));
    let out = simulate(&four_gpus(), &[gpu_class()], &[], &c);
    assert_eq!(devices(&out), ["gpu-0", "gpu-1"]);
    let a = &out.allocations().unwrap()[0];
    assert_eq!(a.node.as_deref(), Some("node-a"));
    assert!(
        a.results
            .iter()
            .all(|r| r.driver == DRIVER && r.pool == "node-a" && r.share_id.is_none())
    );
}

#[test]
fn count_defaults_to_one() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&four_gpus(), &[gpu_class()], &[], &c)),
        ["gpu-0"]
    );
}

#[test]
fn request_selectors_apply_after_class_selectors() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2, "selectors": [
            {"cel": {"expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0"}}
        ]}}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&four_gpus(), &[gpu_class()], &[], &c)),
        ["gpu-2", "gpu-3"]
    );
}

#[test]
fn devices_of_other_claims_are_skipped() {
    let c = claim("c", json!([exact("gpu", "gpu", 2)]), json!(null));
    let out = simulate(
        &four_gpus(),
        &[gpu_class()],
        &[taken("other", &["gpu-0", "gpu-2"])],
        &c,
    );
    assert_eq!(devices(&out), ["gpu-1", "gpu-3"]);
    let full = simulate(
        &four_gpus(),
        &[gpu_class()],
        &[taken("other", &["gpu-0", "gpu-1", "gpu-2"])],
        &c,
    );
    assert!(!full.is_satisfiable());
}

#[test]
fn admin_access_results_do_not_make_devices_busy() {
    let admin = allocated_raw(
        "monitor",
        json!([{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "adminAccess": true}]),
    );
    let c = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    assert_eq!(
        devices(&simulate(&four_gpus(), &[gpu_class()], &[admin], &c)),
        ["gpu-0"]
    );
}

#[test]
fn admin_access_takes_devices_in_use_but_not_twice_in_one_claim() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 4, "adminAccess": true}}]),
        json!(null),
    );
    let all_taken = taken("other", &["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let out = simulate(&four_gpus(), &[gpu_class()], &[all_taken], &c);
    assert_eq!(devices(&out), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    assert!(
        out.allocations().unwrap()[0]
            .results
            .iter()
            .all(|r| r.admin_access)
    );
    let five = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 5, "adminAccess": true}}]),
        json!(null),
    );
    assert!(!simulate(&four_gpus(), &[gpu_class()], &[], &five).is_satisfiable());
}

#[test]
fn mode_all_takes_every_matching_device_of_the_node() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "selectors": [
            {"cel": {"expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0"}}
        ]}}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&four_gpus(), &[gpu_class()], &[], &c)),
        ["gpu-2", "gpu-3"]
    );
    // one matching device in use: no allocation
    let out = simulate(
        &four_gpus(),
        &[gpu_class()],
        &[taken("other", &["gpu-3"])],
        &c,
    );
    assert!(!out.is_satisfiable());
    // a non-matching device in use does not matter
    let out = simulate(
        &four_gpus(),
        &[gpu_class()],
        &[taken("other", &["gpu-0"])],
        &c,
    );
    assert_eq!(devices(&out), ["gpu-2", "gpu-3"]);
}

#[test]
fn mode_all_with_no_matching_device_does_not_fit() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.example.com'].model == 'H100'"}}
        ]}}]),
        json!(null),
    );
    let out = simulate(&four_gpus(), &[gpu_class()], &[], &c);
    assert!(
        summary(&out).contains("0 of 4 devices match selector 1 of request `gpu`"),
        "{}",
        summary(&out)
    );
}

#[test]
fn first_available_tries_sub_requests_in_order() {
    let c = claim(
        "c",
        json!([{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "count": 3, "selectors": [
                {"cel": {"expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0"}}]},
            {"name": "any", "deviceClassName": "gpu", "count": 3},
        ]}]),
        json!(null),
    );
    let out = simulate(&four_gpus(), &[gpu_class()], &[], &c);
    assert_eq!(
        picked(&out),
        [
            ("gpu/any".into(), "gpu-0".into()),
            ("gpu/any".into(), "gpu-1".into()),
            ("gpu/any".into(), "gpu-2".into())
        ]
    );
    let c = claim(
        "c",
        json!([{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "count": 2, "selectors": [
                {"cel": {"expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0"}}]},
            {"name": "any", "deviceClassName": "gpu", "count": 2},
        ]}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&four_gpus(), &[gpu_class()], &[], &c)),
        ["gpu-2", "gpu-3"]
    );
}

#[test]
fn first_available_backtracks_when_a_later_request_needs_the_devices() {
    // `a` prefers two 80Gi GPUs, but `b` needs both of them: `a` must fall
    // back to its second alternative
    let big = "device.capacity['gpu.example.com'].memory.compareTo(quantity('80Gi')) >= 0";
    let c = claim(
        "c",
        json!([
            {"name": "a", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu", "count": 1, "selectors": [{"cel": {"expression": big}}]},
                {"name": "small", "deviceClassName": "gpu", "count": 1},
            ]},
            {"name": "b", "exactly": {"deviceClassName": "gpu", "count": 2, "selectors": [{"cel": {"expression": big}}]}},
        ]),
        json!(null),
    );
    let out = simulate(&four_gpus(), &[gpu_class()], &[], &c);
    assert_eq!(
        picked(&out),
        [
            ("a/small".into(), "gpu-0".into()),
            ("b".into(), "gpu-2".into()),
            ("b".into(), "gpu-3".into())
        ]
    );
}

#[test]
fn match_attribute_backtracks_to_a_satisfying_combination() {
    let devices_json = json!([
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 0}}},
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 1}}},
        {"name": "gpu-2", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 1}}},
        {"name": "gpu-3", "attributes": {"type": {"string": "gpu"}}},
    ]);
    let slices = [slice("s", "node-a", Some("node-a"), devices_json)];
    let c = claim(
        "c",
        json!([exact("gpu", "gpu", 2)]),
        json!([{"matchAttribute": "gpu.example.com/numa"}]),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)),
        ["gpu-1", "gpu-2"]
    );
    // three: impossible; the device without the attribute never matches
    let c3 = claim(
        "c",
        json!([exact("gpu", "gpu", 3)]),
        json!([{"matchAttribute": "gpu.example.com/numa"}]),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c3);
    let e = out.explanation().unwrap();
    assert!(
        matches!(&e.nodes[0].reason, FailureReason::Constraints { constraints, .. } if constraints == &[0])
    );
    assert!(
        e.summary.contains("matchAttribute `gpu.example.com/numa`"),
        "{}",
        e.summary
    );
}

#[test]
fn match_attribute_applies_across_requests_and_only_to_listed_ones() {
    let devices_json = json!([
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 0}}},
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 1}}},
        {"name": "gpu-2", "attributes": {"type": {"string": "gpu"}, "numa": {"int": 1}}},
    ]);
    let slices = [slice("s", "node-a", Some("node-a"), devices_json)];
    let c = claim(
        "c",
        json!([exact("a", "gpu", 1), exact("b", "gpu", 1)]),
        json!([{"matchAttribute": "gpu.example.com/numa", "requests": ["a", "b"]}]),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)),
        ["gpu-1", "gpu-2"]
    );
    let c = claim(
        "c",
        json!([
            exact("a", "gpu", 1),
            exact("b", "gpu", 1),
            exact("other", "gpu", 1)
        ]),
        json!([{"matchAttribute": "gpu.example.com/numa", "requests": ["b", "other"]}]),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)),
        ["gpu-0", "gpu-1", "gpu-2"]
    );
}

#[test]
fn distinct_attribute_requires_pairwise_different_values() {
    let devices_json = json!([
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "switch": {"string": "s0"}}},
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "switch": {"string": "s0"}}},
        {"name": "gpu-2", "attributes": {"type": {"string": "gpu"}, "switch": {"string": "s1"}}},
    ]);
    let slices = [slice("s", "node-a", Some("node-a"), devices_json)];
    let c = claim(
        "c",
        json!([exact("gpu", "gpu", 2)]),
        json!([{"distinctAttribute": "gpu.example.com/switch"}]),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)),
        ["gpu-0", "gpu-2"]
    );
    let c = claim(
        "c",
        json!([exact("gpu", "gpu", 3)]),
        json!([{"distinctAttribute": "gpu.example.com/switch"}]),
    );
    assert!(!simulate(&slices, &[gpu_class()], &[], &c).is_satisfiable());
}

/// The scenario of the NVLink slice work: GPUs 0 and 1 share NVLink domain
/// A, GPUs 2 and 3 domain B.
mod nvlink {
    use super::*;

    fn node() -> Vec<ResourceSlice> {
        let gpu = |i: i64, domain: &str| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "nvlinkDomain": {"string": domain},
            }})
        };
        vec![
            serde_json::from_value(json!({
                "metadata": {"name": "node-a-gpu.nvidia.com"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                    "nodeName": "node-a",
                    "devices": [gpu(0, "A"), gpu(1, "A"), gpu(2, "B"), gpu(3, "B")],
                }
            }))
            .unwrap(),
        ]
    }

    fn classes() -> Vec<k8s_openapi::api::resource::v1::DeviceClass> {
        vec![class(
            "gpu.nvidia.com",
            &[
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            ],
        )]
    }

    fn two_linked(name: &str) -> ResourceClaim {
        claim(
            name,
            json!([exact("gpus", "gpu.nvidia.com", 2)]),
            json!([{"matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]),
        )
    }

    fn in_use(devices: &[usize]) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|i| json!({"request": "x", "driver": "gpu.nvidia.com", "pool": "node-a", "device": format!("gpu-{i}")}))
            .collect();
        allocated_raw(&format!("other-{devices:?}"), json!(results))
    }

    #[test]
    fn a_fresh_node_gives_gpus_0_and_1() {
        assert_eq!(
            devices(&simulate(&node(), &classes(), &[], &two_linked("c"))),
            ["gpu-0", "gpu-1"]
        );
    }

    #[test]
    fn with_gpu_0_taken_it_gives_2_and_3() {
        let out = simulate(&node(), &classes(), &[in_use(&[0])], &two_linked("c"));
        assert_eq!(devices(&out), ["gpu-2", "gpu-3"]);
    }

    #[test]
    fn every_allocation_stays_within_one_domain() {
        // all 16 subsets of GPUs in use
        for mask in 0u32..16 {
            let busy: Vec<usize> = (0..4).filter(|i| mask & (1 << i) != 0).collect();
            let out = simulate(&node(), &classes(), &[in_use(&busy)], &two_linked("c"));
            let a_free = !busy.contains(&0) && !busy.contains(&1);
            let b_free = !busy.contains(&2) && !busy.contains(&3);
            match out.allocations() {
                Some(a) => {
                    let got: Vec<&str> = a[0].results.iter().map(|r| r.device.as_str()).collect();
                    assert!(
                        got == ["gpu-0", "gpu-1"] && a_free
                            || got == ["gpu-2", "gpu-3"] && b_free && !a_free,
                        "busy {busy:?}: got {got:?}"
                    );
                }
                None => assert!(
                    !a_free && !b_free,
                    "busy {busy:?}: no allocation although a domain is free"
                ),
            }
        }
    }

    #[test]
    fn claims_in_sequence_get_one_domain_each_then_nothing() {
        let slices = node();
        let classes = classes();
        let mut claims: Vec<ResourceClaim> = Vec::new();
        let mut got = Vec::new();
        for i in 0..3 {
            let c = two_linked(&format!("c{i}"));
            let out = simulate(&slices, &classes, &claims, &c);
            if let Some([first, ..]) = out.allocations() {
                got.push(devices(&out));
                claims.push(allocated(c, first));
            } else {
                let e = out.explanation().unwrap();
                assert!(
                    e.summary.contains("4 in use by other claims"),
                    "{}",
                    e.summary
                );
                got.push(Vec::new());
            }
        }
        assert_eq!(
            got,
            [vec!["gpu-0", "gpu-1"], vec!["gpu-2", "gpu-3"], vec![]]
        );
    }

    #[test]
    fn gpus_0_and_2_taken_leaves_no_linked_pair() {
        let out = simulate(&node(), &classes(), &[in_use(&[0, 2])], &two_linked("c"));
        let e = out.explanation().expect("no fit");
        assert!(
            matches!(e.nodes[0].reason, FailureReason::Constraints { .. }),
            "{e:#?}"
        );
    }
}

/// A GPU partitioned dynamically: the whole GPU and two halves consume the
/// counters of one counter set, published in a slice of its own.
fn partitionable(allocated_gpu_memory: &str) -> Vec<ResourceSlice> {
    let consumes = |memory: &str, slices: &[&str]| {
        let mut counters = serde_json::Map::new();
        counters.insert("memory".into(), json!({"value": memory}));
        for s in slices {
            counters.insert((*s).into(), json!({"value": "1"}));
        }
        json!([{"counterSet": "gpu-0", "counters": counters}])
    };
    let dev = |name: &str, kind: &str, memory: &str, slices: &[&str]| {
        json!({"name": name, "attributes": {"type": {"string": kind}}, "capacity": {"memory": {"value": memory}},
               "consumesCounters": consumes(memory, slices)})
    };
    vec![
        slice_with(
            "node-a-counters",
            "node-a",
            Some("node-a"),
            1,
            2,
            json!(null),
            json!([{"name": "gpu-0", "counters": {
                "memory": {"value": allocated_gpu_memory},
                "slice0": {"value": "1"}, "slice1": {"value": "1"}}}]),
        ),
        slice_with(
            "node-a-devices",
            "node-a",
            Some("node-a"),
            1,
            2,
            json!([
                dev("gpu-0", "gpu", "80Gi", &["slice0", "slice1"]),
                dev("gpu-0-mig-0", "mig", "40Gi", &["slice0"]),
                dev("gpu-0-mig-1", "mig", "40Gi", &["slice1"]),
            ]),
            json!(null),
        ),
    ]
}

fn mig_class() -> k8s_openapi::api::resource::v1::DeviceClass {
    class(
        "mig",
        &["device.attributes['gpu.example.com'].type == 'mig'"],
    )
}

#[test]
fn shared_counters_limit_partitions_and_count_allocated_devices() {
    let slices = partitionable("80Gi");
    let classes = [gpu_class(), mig_class()];
    let two_migs = claim("c", json!([exact("mig", "mig", 2)]), json!(null));
    assert_eq!(
        devices(&simulate(&slices, &classes, &[], &two_migs)),
        ["gpu-0-mig-0", "gpu-0-mig-1"]
    );
    // the whole GPU and a half cannot coexist
    let both = claim(
        "c",
        json!([exact("gpu", "gpu", 1), exact("mig", "mig", 1)]),
        json!(null),
    );
    let out = simulate(&slices, &classes, &[], &both);
    assert!(matches!(
        out.explanation().unwrap().nodes[0].reason,
        FailureReason::Combination
    ));
    // a half allocated elsewhere: the whole GPU is out, the other half free
    let half = allocated_raw(
        "other",
        json!([{"request": "mig", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-1"}]),
    );
    let gpu = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&slices, &classes, std::slice::from_ref(&half), &gpu);
    let s = summary(&out);
    assert!(
        s.contains("1 without enough free shared counters") && s.contains("gpu-0/"),
        "{s}"
    );
    let mig = claim("c", json!([exact("mig", "mig", 1)]), json!(null));
    assert_eq!(
        devices(&simulate(&slices, &classes, &[half], &mig)),
        ["gpu-0-mig-0"]
    );
}

#[test]
fn a_counter_smaller_than_the_device_needs_blocks_it() {
    let slices = partitionable("60Gi");
    let classes = [gpu_class(), mig_class()];
    let gpu = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    assert!(!simulate(&slices, &classes, &[], &gpu).is_satisfiable());
    let migs = claim("c", json!([exact("mig", "mig", 2)]), json!(null));
    assert!(!simulate(&slices, &classes, &[], &migs).is_satisfiable());
    let mig = claim("c", json!([exact("mig", "mig", 1)]), json!(null));
    assert!(simulate(&slices, &classes, &[], &mig).is_satisfiable());
}

#[test]
fn incomplete_pools_are_ignored_and_older_generations_too() {
    let mut slices = partitionable("80Gi");
    slices.pop(); // the devices' slice is missing: 1 of 2 published
    let classes = [gpu_class(), mig_class()];
    let mig = claim("c", json!([exact("mig", "mig", 1)]), json!(null));
    let out = simulate(&slices, &classes, &[], &mig);
    assert!(!out.is_satisfiable());
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    assert_eq!(snapshot.pool_issues().len(), 1);
    assert!(
        snapshot.pool_issues()[0].reason.contains("1 of 2 slices"),
        "{:?}",
        snapshot.pool_issues()
    );

    // generation 2 replaces generation 1
    let old = slice_with(
        "old",
        "node-a",
        Some("node-a"),
        1,
        1,
        json!([gpu("gpu-old", 0, "1Gi")]),
        json!(null),
    );
    let new = slice_with(
        "new",
        "node-a",
        Some("node-a"),
        2,
        1,
        json!([gpu("gpu-new", 0, "1Gi")]),
        json!(null),
    );
    let c = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    assert_eq!(
        devices(&simulate(&[old.clone(), new], &[gpu_class()], &[], &c)),
        ["gpu-new"]
    );
    // a newer generation still being published hides the older one
    let newer = slice_with(
        "newer",
        "node-a",
        Some("node-a"),
        3,
        2,
        json!([gpu("gpu-newer", 0, "1Gi")]),
        json!(null),
    );
    assert!(!simulate(&[old, newer], &[gpu_class()], &[], &c).is_satisfiable());
}

#[test]
fn mode_all_with_an_incomplete_pool_is_an_error() {
    let mut slices = four_gpus();
    slices.push(slice_with(
        "partial",
        "node-a-extra",
        Some("node-a"),
        0,
        2,
        json!([gpu("x", 9, "1Gi")]),
        json!(null),
    ));
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]),
        json!(null),
    );
    let err = try_simulate(&slices, &[], &c).unwrap_err();
    assert!(
        matches!(&err, AllocError::IncompletePool { pool, .. } if pool == "gpu.example.com/node-a-extra"),
        "{err}"
    );
}

fn shared_gpu(policy: serde_json::Value) -> Vec<ResourceSlice> {
    vec![slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([{
            "name": "gpu-0",
            "allowMultipleAllocations": true,
            "attributes": {"type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "80Gi", "requestPolicy": policy}, "cores": {"value": "100"}},
        }]),
    )]
}

fn memory_claim(name: &str, memory: &str) -> ResourceClaim {
    claim(
        name,
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu",
            "capacity": {"requests": {"memory": memory, "cores": "10"}}}}]),
        json!(null),
    )
}

#[test]
fn consumable_capacity_is_shared_and_rounded_up_by_policy() {
    let slices = shared_gpu(json!({"default": "8Gi", "validRange": {"min": "8Gi", "step": "8Gi"}}));
    let classes = [gpu_class()];
    let mut claims = Vec::new();
    let mut consumed = Vec::new();
    // 20Gi rounds up to 24Gi: three fit in 80Gi, the fourth does not
    for i in 0..4 {
        let c = memory_claim(&format!("c{i}"), "20Gi");
        let out = simulate(&slices, &classes, &claims, &c);
        let Some(a) = out.allocations() else {
            consumed.push(None);
            continue;
        };
        let r = &a[0].results[0];
        assert!(r.share_id.as_ref().is_some_and(|s| s.len() == 36), "{r:?}");
        consumed.push(Some((
            r.consumed_capacity["memory"].to_string(),
            r.consumed_capacity["cores"].to_string(),
        )));
        claims.push(allocated(c, &a[0]));
    }
    let q = |m: &str, c: &str| Some((m.to_owned(), c.to_owned()));
    assert_eq!(
        consumed,
        [q("24Gi", "10"), q("24Gi", "10"), q("24Gi", "10"), None]
    );
    let ids: std::collections::HashSet<_> = claims
        .iter()
        .map(|c| {
            c.status
                .as_ref()
                .unwrap()
                .allocation
                .as_ref()
                .unwrap()
                .devices
                .as_ref()
                .unwrap()
                .results
                .as_ref()
                .unwrap()[0]
                .share_id
                .clone()
        })
        .collect();
    assert_eq!(ids.len(), 3, "share IDs are unique");
    // 8Gi still fits
    assert!(simulate(&slices, &classes, &claims, &memory_claim("small", "8Gi")).is_satisfiable());
}

#[test]
fn unrequested_capacity_without_default_takes_everything() {
    let slices = shared_gpu(json!({"default": "8Gi", "validValues": ["8Gi", "16Gi", "40Gi"]}));
    let classes = [gpu_class()];
    // no capacity requests: memory takes the default 8Gi, cores (no
    // policy) all 100, so a second share does not fit
    let c = claim("c1", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&slices, &classes, &[], &c);
    let a = out.allocations().unwrap()[0].clone();
    assert_eq!(a.results[0].consumed_capacity["memory"].to_string(), "8Gi");
    assert_eq!(a.results[0].consumed_capacity["cores"].to_string(), "100");
    let c2 = claim("c2", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&slices, &classes, &[allocated(c, &a)], &c2);
    assert!(
        summary(&out).contains("without enough free capacity"),
        "{}",
        summary(&out)
    );
}

#[test]
fn capacity_requests_beyond_the_policy_or_missing_capacity_do_not_fit() {
    let slices = shared_gpu(json!({"validValues": ["8Gi", "16Gi", "40Gi"]}));
    let classes = [gpu_class()];
    assert!(!simulate(&slices, &classes, &[], &memory_claim("c", "41Gi")).is_satisfiable());
    let out = simulate(&slices, &classes, &[], &memory_claim("c", "9Gi"));
    assert_eq!(
        out.allocations().unwrap()[0].results[0].consumed_capacity["memory"].to_string(),
        "16Gi"
    );
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"bandwidth": "1"}}}}]),
        json!(null),
    );
    let out = simulate(&slices, &classes, &[], &c);
    assert!(
        summary(&out).contains("whose capacity cannot serve the request"),
        "{}",
        summary(&out)
    );
}

#[test]
fn one_request_takes_one_share_of_a_device_and_two_requests_two() {
    // kube-scheduler resumes the search for a request's next device after
    // the one it took: a request never gets a device twice, not even one
    // that allows multiple allocations (checked on a real cluster)
    let slices = shared_gpu(json!({"default": "8Gi", "validRange": {"min": "8Gi", "step": "8Gi"}}));
    let c = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2,
            "capacity": {"requests": {"memory": "16Gi", "cores": "10"}}}}]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    assert!(!out.is_satisfiable(), "{out:#?}");
    let two = claim(
        "c",
        json!([
            {"name": "a", "exactly": {"deviceClassName": "gpu",
                "capacity": {"requests": {"memory": "16Gi", "cores": "10"}}}},
            {"name": "b", "exactly": {"deviceClassName": "gpu",
                "capacity": {"requests": {"memory": "16Gi", "cores": "10"}}}}
        ]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &two);
    let a = &out.allocations().unwrap()[0];
    assert_eq!(devices(&out), ["gpu-0", "gpu-0"]);
    assert_ne!(a.results[0].share_id, a.results[1].share_id);
    let too_big = claim(
        "c",
        json!([
            {"name": "a", "exactly": {"deviceClassName": "gpu",
                "capacity": {"requests": {"memory": "16Gi", "cores": "60"}}}},
            {"name": "b", "exactly": {"deviceClassName": "gpu",
                "capacity": {"requests": {"memory": "16Gi", "cores": "60"}}}}
        ]),
        json!(null),
    );
    assert!(!simulate(&slices, &[gpu_class()], &[], &too_big).is_satisfiable());
}

#[test]
fn tainted_devices_need_a_toleration() {
    let slices = [slice(
        "s",
        "node-a",
        Some("node-a"),
        json!([
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
             "taints": [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]},
            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}},
             "taints": [{"key": "degraded", "effect": "NoExecute"}]},
        ]),
    )];
    let plain = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&slices, &[gpu_class()], &[], &plain);
    assert!(
        summary(&out).contains("2 with taints the request does not tolerate"),
        "{}",
        summary(&out)
    );
    let tolerant = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "tolerations": [
            {"key": "degraded", "operator": "Exists"}]}}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &tolerant)),
        ["gpu-1"]
    );
    let wrong_value = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "tolerations": [
            {"key": "maintenance", "value": "false"}]}}]),
        json!(null),
    );
    assert!(!simulate(&slices, &[gpu_class()], &[], &wrong_value).is_satisfiable());
    let everything = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2, "tolerations": [
            {"operator": "Exists"}]}}]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &everything)),
        ["gpu-0", "gpu-1"]
    );
}

#[test]
fn nodes_are_tried_in_name_order_and_see_cluster_wide_pools() {
    let slices = [
        slice(
            "b",
            "node-b",
            Some("node-b"),
            json!([gpu("b-0", 0, "80Gi")]),
        ),
        slice(
            "a",
            "node-a",
            Some("node-a"),
            json!([gpu("a-0", 0, "40Gi")]),
        ),
        slice(
            "shared",
            "network",
            None,
            json!([{"name": "nic-0", "attributes": {"type": {"string": "gpu"}, "index": {"int": 9}}}]),
        ),
    ];
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    assert_eq!(snapshot.nodes(), ["node-a", "node-b"]);
    let allocator = Allocator::new();
    let two = claim("c", json!([exact("gpu", "gpu", 2)]), json!(null));
    let out = allocator
        .simulate(&snapshot, &two, &SimulateOptions::default())
        .unwrap();
    let a = &out.allocations().unwrap()[0];
    assert_eq!(a.node.as_deref(), Some("node-a"));
    // pools in (driver, pool name) order: `network` before `node-a`
    assert_eq!(devices(&out), ["nic-0", "a-0"]);
    assert!(a.allocation_result().node_selector.is_some());

    let all = SimulateOptions {
        all_fitting_nodes: true,
        ..SimulateOptions::default()
    };
    let out = allocator.simulate(&snapshot, &two, &all).unwrap();
    let nodes: Vec<_> = out
        .allocations()
        .unwrap()
        .iter()
        .map(|a| a.node.clone().unwrap())
        .collect();
    assert_eq!(nodes, ["node-a", "node-b"]);

    let only_b = SimulateOptions {
        nodes: NodeFilter::Node("node-b".into()),
        ..SimulateOptions::default()
    };
    assert_eq!(
        devices(&allocator.simulate(&snapshot, &two, &only_b).unwrap()),
        ["nic-0", "b-0"]
    );
    // an unknown node only sees the cluster-wide device
    let elsewhere = SimulateOptions {
        nodes: NodeFilter::Nodes(vec!["node-z".into()]),
        ..SimulateOptions::default()
    };
    let one = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = allocator.simulate(&snapshot, &one, &elsewhere).unwrap();
    assert_eq!(devices(&out), ["nic-0"]);
    assert!(
        out.allocations().unwrap()[0]
            .allocation_result()
            .node_selector
            .is_none()
    );
}

#[test]
fn a_claim_takes_at_most_32_devices() {
    let many: Vec<_> = (0..40)
        .map(|i| gpu(&format!("gpu-{i}"), i, "1Gi"))
        .collect();
    let slices = [slice("s", "node-a", Some("node-a"), json!(many))];
    let c = claim("c", json!([exact("gpu", "gpu", 32)]), json!(null));
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)).len(),
        32
    );
    let all = claim(
        "c",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]),
        json!(null),
    );
    assert!(!simulate(&slices, &[gpu_class()], &[], &all).is_satisfiable());
    let err = try_simulate(
        &slices,
        &[],
        &claim(
            "c",
            json!([exact("a", "gpu", 20), exact("b", "gpu", 20)]),
            json!(null),
        ),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::TooManyDevices {
                requested: 40,
                max: 32
            }
        ),
        "{err}"
    );
}

#[test]
fn a_claim_without_requests_fits_anywhere() {
    let c = claim("c", json!([]), json!(null));
    assert!(simulate(&four_gpus(), &[gpu_class()], &[], &c).is_satisfiable());
}

#[test]
fn no_devices_at_all_is_unsatisfiable_with_a_reason() {
    let c = claim("c", json!([exact("gpu", "gpu", 1)]), json!(null));
    let out = simulate(&[], &[gpu_class()], &[], &c);
    assert_eq!(out.explanation().unwrap().nodes_checked, 0);
    assert!(
        summary(&out).contains("no node to simulate"),
        "{}",
        summary(&out)
    );
}

/// Regression (found by the property tests): an admin-access pick of a
/// shared device must not let a later pick of it skip its counters.
#[test]
fn admin_access_then_normal_pick_of_a_shared_device_still_consumes_counters() {
    let slices = [slice_with(
        "s",
        "node-a",
        Some("node-a"),
        0,
        1,
        json!([
            {"name": "gpu-0", "allowMultipleAllocations": true, "attributes": {"type": {"string": "gpu"}},
             "capacity": {"memory": {"value": "1"}},
             "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "2"}}}]},
            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}},
             "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "2"}}}]},
        ]),
        json!([{"name": "cs", "counters": {"mem": {"value": "2"}}}]),
    )];
    let shared = "device.allowMultipleAllocations";
    let with = |expr: &str, name: &str| json!({"name": name, "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": expr}}]}});
    let c = claim(
        "c",
        json!([
            {"name": "watch", "exactly": {"deviceClassName": "gpu", "adminAccess": true,
                "selectors": [{"cel": {"expression": shared}}]}},
            with("!device.allowMultipleAllocations", "other"),
            with(shared, "use"),
        ]),
        json!(null),
    );
    // `other` takes all of the counter: `use` cannot have gpu-0, although
    // `watch` (admin access, consuming nothing) has it already
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    assert!(!out.is_satisfiable(), "{out:#?}");
    // without `other` it fits
    let c = claim(
        "c",
        json!([
            {"name": "watch", "exactly": {"deviceClassName": "gpu", "adminAccess": true,
                "selectors": [{"cel": {"expression": shared}}]}},
            with(shared, "use"),
        ]),
        json!(null),
    );
    assert_eq!(
        devices(&simulate(&slices, &[gpu_class()], &[], &c)),
        ["gpu-0", "gpu-0"]
    );
}

/// Regression (found by the property tests): whether a request can be
/// satisfied at all must not be judged on the counters another request
/// holds tentatively.
#[test]
fn a_later_request_is_not_ruled_out_by_an_earlier_tentative_choice() {
    let slices = [slice_with(
        "s",
        "node-a",
        Some("node-a"),
        0,
        1,
        json!([
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "color": {"int": 2}},
             "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "1"}}}]},
            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}},
        ]),
        json!([{"name": "cs", "counters": {"mem": {"value": "1"}}}]),
    )];
    let c = claim(
        "c",
        json!([
            exact("any", "gpu", 1),
            {"name": "colored", "exactly": {"deviceClassName": "gpu", "selectors": [
                {"cel": {"expression": "device.attributes['gpu.example.com'].?color.orValue(-1) >= 0"}}]}},
        ]),
        json!(null),
    );
    let out = simulate(&slices, &[gpu_class()], &[], &c);
    assert_eq!(
        picked(&out),
        [
            ("any".into(), "gpu-1".into()),
            ("colored".into(), "gpu-0".into())
        ]
    );
}
