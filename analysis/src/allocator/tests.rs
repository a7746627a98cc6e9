//! Unit tests of the allocator's internals: the selector memo, the
//! per-pool value columns, pool validation, finding devices by name, the
//! precheck's pruning of devices short of counters, and the search's order
//! within a request (a shared device serves one slot). The rules themselves
//! are tested through the public API in `analysis/tests/allocator_*.rs`.

use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::intern::FastHasher;
use super::selectors::{Memo, Read, SelectorTable};
use super::snapshot::Snapshot;
use super::state::{Context, Match, NodeSearch, Scratch};
use super::{AllocError, Allocator, Outcome, SimulateOptions, claim};
use crate::cel::Compiler;

fn node(n: usize, gpus: usize) -> ResourceSlice {
    let devices: Vec<Value> = (0..gpus)
        .map(|g| {
            json!({"name": format!("gpu-{g}"), "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{n}-{g}")},
                "model": {"string": if g % 2 == 0 { "A100" } else { "H100" }},
            }, "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{n}")},
        "spec": {"driver": "gpu.example.com", "nodeName": format!("node-{n}"),
                 "pool": {"name": format!("node-{n}"), "generation": 0, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap()
}

fn class() -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.attributes['gpu.example.com'].type == 'gpu'"}}]}}))
    .unwrap()
}

fn claim(selector: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [{"cel": {"expression": selector}}]}}]}}}))
    .unwrap()
}

/// Verdicts of every device of every node for the claim's first variant;
/// returns them and the number of CEL evaluations.
fn verdicts(snapshot: &Snapshot<'_>, claim: &ResourceClaim) -> (Vec<bool>, u64) {
    let compiler = Compiler::new();
    let mut table = SelectorTable::default();
    let plan = claim::plan(claim, snapshot.classes(), &mut table, &compiler).unwrap();
    let ctx = Context::new(&compiler, snapshot, &plan, &table, 1000);
    let mut memo = Memo::default();
    let mut out = Vec::new();
    for n in snapshot.nodes() {
        let mut search = NodeSearch::new(&ctx, Some(n), memo, Scratch::default());
        for d in 0..search.devs.len() {
            out.push(matches!(search.verdict(0, d), Match::Yes));
        }
        (_, memo, _) = search.finish();
    }
    (out, memo.evaluations)
}

#[test]
fn projectable_selectors_are_evaluated_once_per_distinct_value() {
    let slices: Vec<ResourceSlice> = (0..50).map(|n| node(n, 8)).collect();
    let classes = [class()];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let (matched, evaluations) = verdicts(
        &snapshot,
        &claim("device.attributes['gpu.example.com'].model == 'A100'"),
    );
    assert_eq!(matched.len(), 400);
    assert_eq!(matched.iter().filter(|m| **m).count(), 200);
    // the class selector (one distinct type) and the request selector
    // (two distinct models)
    assert_eq!(evaluations, 3);
}

#[test]
fn unprojectable_selectors_are_evaluated_per_device_with_the_same_result() {
    let slices: Vec<ResourceSlice> = (0..5).map(|n| node(n, 4)).collect();
    let classes = [class()];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let expr = "device.attributes['gpu.example.com'].exists(k, k == 'model') && device.attributes['gpu.example.com'].model == 'A100'";
    let (matched, evaluations) = verdicts(&snapshot, &claim(expr));
    let (memoised, _) = verdicts(
        &snapshot,
        &claim("device.attributes['gpu.example.com'].model == 'A100'"),
    );
    assert_eq!(matched, memoised);
    // 1 class evaluation, then one per device for the request selector
    assert_eq!(evaluations, 1 + 20);
}

#[test]
fn selectors_reading_unique_values_still_give_per_device_answers() {
    let slices: Vec<ResourceSlice> = (0..3).map(|n| node(n, 4)).collect();
    let classes = [class()];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let (matched, evaluations) = verdicts(
        &snapshot,
        &claim("device.attributes['gpu.example.com'].uuid == 'GPU-1-2'"),
    );
    assert_eq!(matched.iter().filter(|m| **m).count(), 1);
    assert_eq!(evaluations, 1 + 12);
}

#[test]
fn columns_are_shared_by_snapshots_with_other_claims() {
    let slices: Vec<ResourceSlice> = (0..2).map(|n| node(n, 2)).collect();
    let classes = [class()];
    let first = Snapshot::new(&slices, &classes, &[]);
    let second = first.with_allocated(&[]);
    let pool = &first.pools()[0];
    let read = Read::Attribute(super::selectors::Key {
        domain: "gpu.example.com".into(),
        id: "model".into(),
        qualified: "gpu.example.com/model".into(),
    });
    let a = first.index.column(pool, pool.prepared(), &read);
    let b = second
        .index
        .column(&second.pools()[0], second.pools()[0].prepared(), &read);
    assert!(Arc::ptr_eq(&a, &b));
    // equal values, equal ids; different values, different ids
    assert_eq!(a.len(), 2);
    let ids = |s: &Snapshot<'_>, p: usize, c: &super::snapshot::Column| -> Vec<u32> {
        let pool = &s.pools()[p];
        (0..c.len())
            .map(|i| s.index.value_id(pool, pool.prepared(), c, i))
            .collect()
    };
    let a_ids = ids(&first, 0, &a);
    assert_ne!(a_ids[0], a_ids[1]);
    let other = first
        .index
        .column(&first.pools()[1], first.pools()[1].prepared(), &read);
    assert_eq!(a_ids, ids(&first, 1, &other));
    // ids filled through one snapshot are seen through the other
    assert_eq!(a_ids, ids(&second, 0, &b));
}

#[test]
fn fast_hasher_separates_nearby_keys() {
    let build = BuildHasherDefault::<FastHasher>::default();
    let keys = [
        "",
        "a",
        "b",
        "ab",
        "ba",
        "gpu.example.com/type",
        "gpu.example.com/typf",
    ];
    let hashes: std::collections::HashSet<u64> = keys.iter().map(|k| build.hash_one(k)).collect();
    assert_eq!(hashes.len(), keys.len());
    assert_ne!(build.hash_one([1u32, 2]), build.hash_one([2u32, 1]));
}

/// A pool with counter set `cs` (counters `b`, `d`, `f`) and one device
/// consuming `consumed` of it.
fn counter_pool(consumed: &[&str]) -> ResourceSlice {
    let counters: serde_json::Map<String, Value> = consumed
        .iter()
        .map(|c| ((*c).to_owned(), json!({"value": "1"})))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.example.com", "nodeName": "n",
                 "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": "cs", "counters": {
                     "b": {"value": "2"}, "d": {"value": "2Gi"}, "f": {"value": "2"}}}],
                 "devices": [{"name": "dev", "consumesCounters": [
                     {"counterSet": "cs", "counters": counters}]}]}
    }))
    .unwrap()
}

#[test]
fn unknown_counters_are_found_wherever_they_sort() {
    let reason = |consumed: &[&str]| {
        let slices = [counter_pool(consumed)];
        let snapshot = Snapshot::new(&slices, &[], &[]);
        snapshot.pool_issues().into_iter().map(|i| i.reason).next()
    };
    assert_eq!(reason(&[]), None);
    assert_eq!(reason(&["d"]), None);
    assert_eq!(reason(&["b", "d", "f"]), None);
    assert_eq!(reason(&["b", "f"]), None);
    for (consumed, unknown) in [
        (&["a", "b"][..], "a"),
        (&["b", "c", "d"], "c"),
        (&["d", "e"], "e"),
        (&["f", "g"], "g"),
        (&["dd"], "dd"),
    ] {
        assert_eq!(
            reason(consumed),
            Some(format!(
                "invalid: device dev consumes unknown counter {unknown} of counter set cs"
            )),
            "{consumed:?}"
        );
    }
}

/// A pool with one counter set `cs` (counter `c`) and these devices:
/// `(name, consumed counter or none)`.
fn named_pool(devices: &[(&str, Option<&str>)]) -> ResourceSlice {
    let devices: Vec<Value> = devices
        .iter()
        .map(|(name, counter)| match counter {
            Some(c) => json!({"name": name, "consumesCounters": [
                {"counterSet": "cs", "counters": {*c: {"value": "1"}}}]}),
            None => json!({"name": name}),
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.example.com", "nodeName": "n",
                 "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": "cs", "counters": {"c": {"value": "2"}}}],
                 "devices": devices}
    }))
    .unwrap()
}

fn pool_reason(devices: &[(&str, Option<&str>)]) -> Option<String> {
    let slices = [named_pool(devices)];
    let snapshot = Snapshot::new(&slices, &[], &[]);
    snapshot.pool_issues().into_iter().map(|i| i.reason).next()
}

#[test]
fn the_first_repeated_name_in_device_order_is_reported() {
    assert_eq!(pool_reason(&[("a", None), ("b", None), ("c", None)]), None);
    // `b` repeats at index 3, `a` at index 4: `b` comes first
    assert_eq!(
        pool_reason(&[
            ("a", None),
            ("b", None),
            ("c", None),
            ("b", None),
            ("a", None)
        ]),
        Some("invalid: duplicate device name b".to_owned())
    );
    // three of a kind: reported once, at its first repeat
    assert_eq!(
        pool_reason(&[
            ("x", None),
            ("y", None),
            ("x", None),
            ("x", None),
            ("y", None)
        ]),
        Some("invalid: duplicate device name x".to_owned())
    );
}

#[test]
fn pool_errors_are_reported_in_device_order() {
    // a bad consumption before the repeated name wins, and after it loses
    assert_eq!(
        pool_reason(&[("a", Some("nope")), ("b", None), ("b", None)]),
        Some("invalid: device a consumes unknown counter nope of counter set cs".to_owned())
    );
    assert_eq!(
        pool_reason(&[("a", None), ("a", Some("nope"))]),
        Some("invalid: duplicate device name a".to_owned())
    );
    assert_eq!(
        pool_reason(&[("a", None), ("b", Some("c")), ("a", Some("nope"))]),
        Some("invalid: duplicate device name a".to_owned())
    );
}

#[test]
fn first_duplicate_compares_names_where_hashes_meet() {
    use super::snapshot::first_duplicate;
    let names = ["gpu-0", "gpu-1", "gpu-0-mig-1", "gpu-1", "gpu-0"];
    assert_eq!(first_duplicate(names.len(), |i| names[i]), Some(3));
    let many: Vec<String> = (0..500).map(|i| format!("dev-{i}")).collect();
    assert_eq!(first_duplicate(many.len(), |i| &many[i]), None);
    assert_eq!(first_duplicate(0, |_| ""), None);
}

// ---------------------------------------------------------------- counters
// The precheck drops a device short of counters next to the allocated
// claims, and the snapshot remembers it. These show that it drops only
// devices that cannot be allocated: each fails if the pruning went further.

/// Node `node`'s pool: counter set `cs` with `mem: 2`; a GPU `whole`
/// consuming all of it; two `part`s consuming 1 each; `extra` devices
/// (JSON) after them.
fn partitioned(node: &str, extra: &[Value]) -> ResourceSlice {
    let consumes =
        |amount: &str| json!([{"counterSet": "cs", "counters": {"mem": {"value": amount}}}]);
    let mut devices = vec![
        json!({"name": "whole", "attributes": {"type": {"string": "gpu"}}, "consumesCounters": consumes("2")}),
        json!({"name": "part-0", "attributes": {"type": {"string": "part"}}, "consumesCounters": consumes("1")}),
        json!({"name": "part-1", "attributes": {"type": {"string": "part"}}, "consumesCounters": consumes("1")}),
    ];
    devices.extend(extra.iter().cloned());
    serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"driver": "gpu.example.com", "nodeName": node,
                 "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": "cs", "counters": {"mem": {"value": "2"}}}],
                 "devices": devices}
    }))
    .unwrap()
}

fn type_class(name: &str) -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": [
        {"cel": {"expression": format!("device.attributes['gpu.example.com'].type == '{name}'")}}]}}))
    .unwrap()
}

fn request_of(class: &str, admin: bool) -> ResourceClaim {
    serde_json::from_value(
        json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": class, "adminAccess": admin}}]}}}),
    )
    .unwrap()
}

/// A claim allocated `device` of `node` (with a share ID when `shared`).
fn holding(name: &str, node: &str, device: &str, shared: bool) -> ResourceClaim {
    let mut result =
        json!({"request": "r", "driver": "gpu.example.com", "pool": node, "device": device});
    if shared {
        result["shareID"] = json!("7e1b0c4e-0000-4000-8000-000000000001");
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }))
    .unwrap()
}

fn run(snapshot: &Snapshot<'_>, claim: &ResourceClaim, threads: usize) -> Outcome {
    let options = SimulateOptions {
        threads,
        ..SimulateOptions::default()
    };
    Allocator::new()
        .simulate(snapshot, claim, &options)
        .unwrap()
}

/// The devices of the first allocation, as `node/device`.
fn picked(outcome: &Outcome) -> Vec<String> {
    outcome.allocations().map_or_else(Vec::new, |a| {
        a[0].results
            .iter()
            .map(|r| format!("{}/{}", r.pool, r.device))
            .collect()
    })
}

#[test]
fn counters_short_in_one_snapshot_are_not_short_in_another() {
    let slices = [partitioned("node-a", &[])];
    let classes = [type_class("part")];
    let busy = [holding("busy", "node-a", "whole", false)];
    let part = request_of("part", false);
    // the crowded snapshot first: its verdict must not leak into the
    // free one (they share everything derived from the slices)
    let crowded = Snapshot::new(&slices, &classes, &busy);
    let first = run(&crowded, &part, 1);
    assert!(!first.is_satisfiable());
    let free = crowded.with_allocated(&[]);
    assert_eq!(picked(&run(&free, &part, 1)), ["node-a/part-0"]);
    // and the other way round: learnt "enough" in the free one, then the
    // crowded one must still say no, as must a second, remembering run
    let free = Snapshot::new(&slices, &classes, &[]);
    assert_eq!(picked(&run(&free, &part, 1)), ["node-a/part-0"]);
    let crowded = free.with_allocated(&busy);
    assert_eq!(run(&crowded, &part, 1), first);
    assert_eq!(
        run(&crowded, &part, 1),
        first,
        "remembered: the same answer"
    );
}

#[test]
fn a_device_consuming_nothing_of_a_used_up_counter_is_still_a_candidate() {
    let zero = json!({"name": "zero", "attributes": {"type": {"string": "part"}},
        "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "0"}}}]});
    let slices = [partitioned("node-a", &[zero])];
    let classes = [type_class("part")];
    let busy = [holding("busy", "node-a", "whole", false)];
    let snapshot = Snapshot::new(&slices, &classes, &busy);
    for _ in 0..2 {
        assert_eq!(
            picked(&run(&snapshot, &request_of("part", false), 1)),
            ["node-a/zero"]
        );
    }
}

#[test]
fn a_shared_device_already_consuming_its_counters_can_be_shared_again() {
    let shared = json!({"name": "shared", "allowMultipleAllocations": true,
        "attributes": {"type": {"string": "shared"}},
        "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "2"}}}]});
    let slices = [partitioned("node-a", &[shared])];
    let classes = [type_class("shared"), type_class("part")];
    // the share uses up `mem`, but only once for the device
    let busy = [holding("busy", "node-a", "shared", true)];
    let snapshot = Snapshot::new(&slices, &classes, &busy);
    for _ in 0..2 {
        assert_eq!(
            picked(&run(&snapshot, &request_of("shared", false), 1)),
            ["node-a/shared"]
        );
        assert!(!run(&snapshot, &request_of("part", false), 1).is_satisfiable());
    }
}

#[test]
fn admin_access_ignores_used_up_counters() {
    let slices = [partitioned("node-a", &[])];
    let classes = [type_class("part")];
    let busy = [holding("busy", "node-a", "whole", false)];
    let snapshot = Snapshot::new(&slices, &classes, &busy);
    // learn "short" with an ordinary request first, then ask as an admin
    assert!(!run(&snapshot, &request_of("part", false), 1).is_satisfiable());
    assert_eq!(
        picked(&run(&snapshot, &request_of("part", true), 1)),
        ["node-a/part-0"]
    );
}

#[test]
fn an_unparsable_device_is_met_by_the_search_not_skipped() {
    // a negative consumption is only found when the device is parsed: the
    // precheck must leave it to the search, which reports it
    let bad = json!({"name": "bad", "attributes": {"type": {"string": "odd"}},
        "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "-1"}}}]});
    let slices = [partitioned("node-a", &[bad])];
    let classes = [type_class("odd")];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let err = Allocator::new()
        .simulate(
            &snapshot,
            &request_of("odd", false),
            &SimulateOptions::default(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, AllocError::MalformedDevice { device, .. } if device == "gpu.example.com/node-a/bad"),
        "{err}"
    );
}

#[test]
fn helpers_that_precheck_ahead_change_no_answer() {
    // 40 nodes, counters used up on all but the last: the first search
    // parses devices, so helpers precheck the nodes from the back
    let slices: Vec<ResourceSlice> = (0..40)
        .map(|n| partitioned(&format!("node-{n:02}"), &[]))
        .collect();
    let classes = [type_class("part")];
    // the whole device of each of the first `n` nodes taken
    let busy_on = |n: usize| -> Vec<ResourceClaim> {
        (0..n)
            .map(|n| {
                holding(
                    &format!("busy-{n}"),
                    &format!("node-{n:02}"),
                    "whole",
                    false,
                )
            })
            .collect()
    };
    let busy = busy_on(39);
    let part = request_of("part", false);
    let alone = run(&Snapshot::new(&slices, &classes, &busy), &part, 1);
    assert_eq!(picked(&alone), ["node-39/part-0"]);
    for threads in [2, 3, 8] {
        let snapshot = Snapshot::new(&slices, &classes, &busy);
        assert_eq!(run(&snapshot, &part, threads), alone, "{threads} threads");
        assert_eq!(
            run(&snapshot, &part, threads),
            alone,
            "{threads} threads, again"
        );
    }
    // nothing free anywhere: the same explanation either way
    let all = busy_on(40);
    let alone = run(&Snapshot::new(&slices, &classes, &all), &part, 1);
    assert!(!alone.is_satisfiable());
    let snapshot = Snapshot::new(&slices, &classes, &all);
    assert_eq!(run(&snapshot, &part, 3), alone);
    assert_eq!(run(&snapshot, &part, 3), alone);
}

#[test]
fn devices_are_found_by_name_through_their_hashes() {
    let names: Vec<String> = (0..300).map(|i| format!("dev-{i}")).collect();
    let devices: Vec<Value> = names.iter().map(|n| json!({"name": n})).collect();
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.example.com", "nodeName": "n",
                 "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap();
    let slices = [slice];
    let snapshot = Snapshot::new(&slices, &[], &[]);
    let prepared = snapshot.pools()[0].prepared();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(prepared.index_of(name), Some(i), "{name}");
    }
    for missing in ["dev-300", "dev-", "", "dev-01", "DEV-1"] {
        assert_eq!(prepared.index_of(missing), None, "{missing}");
    }
}

/// A node with a GPU that allows multiple allocations (`shared`, memory
/// shares of at least 1Gi) and an exclusive one (`whole`).
fn shared_and_whole() -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "spec": {"driver": "gpu.example.com", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
                 "devices": [
                     {"name": "shared", "allowMultipleAllocations": true,
                      "attributes": {"type": {"string": "gpu"}},
                      "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                          "default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}},
                     {"name": "whole", "attributes": {"type": {"string": "gpu"}},
                      "capacity": {"memory": {"value": "80Gi"}}}
                 ]}
    }))
    .unwrap()
}

fn requests(requests: Value) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": requests}}}))
    .unwrap()
}

#[test]
fn a_request_takes_a_shared_device_once_like_the_scheduler() {
    // kube-scheduler looks for a request's next device after the one it
    // took, so one request never gets two shares of a device: count 2 is
    // the two GPUs, count 3 does not fit (found on the real cluster: a claim
    // for 5 GPUs of 4 was simulated as satisfiable with 2 shares of one)
    let slices = [shared_and_whole()];
    let classes = [type_class("gpu")];
    let snapshot = Snapshot::new(&slices, &classes, &[]);
    let count = |n: u32| {
        requests(json!([{"name": "r", "exactly": {"deviceClassName": "gpu", "count": n}}]))
    };
    for threads in [1, 2] {
        assert_eq!(
            picked(&run(&snapshot, &count(2), threads)),
            ["node-a/shared", "node-a/whole"]
        );
        let three = run(&snapshot, &count(3), threads);
        assert!(!three.is_satisfiable(), "{three:#?}");
        let explanation = three.explanation().unwrap();
        assert!(
            explanation.nodes[0].requests[0]
                .variants
                .iter()
                .all(|v| !v.fits_alone),
            "{explanation:#?}"
        );
    }
    // Two requests of one claim may each take a share of it.
    let shared_only = "device.allowMultipleAllocations";
    let two = requests(json!([
        {"name": "a", "exactly": {"deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": shared_only}}]}},
        {"name": "b", "exactly": {"deviceClassName": "gpu",
            "selectors": [{"cel": {"expression": shared_only}}]}}
    ]));
    assert_eq!(
        picked(&run(&snapshot, &two, 1)),
        ["node-a/shared", "node-a/shared"]
    );
}
