//! Unit tests of the allocator's internals: the selector memo, the
//! per-pool value columns and pool validation. The rules themselves are
//! tested through the public API in `api/tests/allocator_*.rs`.

use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::claim;
use super::search::{Context, Match, NodeSearch, Scratch};
use super::selectors::{FastHasher, Memo, Read, SelectorTable};
use super::snapshot::Snapshot;
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
