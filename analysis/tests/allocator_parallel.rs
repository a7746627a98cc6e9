//! Simulations with helper threads (pools prepared ahead of the search,
//! nodes explained in parallel) against the same simulations on the
//! calling thread alone: the same allocations, the same explanations, and
//! the same errors at the same node, also when the error sits in a pool a
//! helper prepared first.

mod allocator_support;

use allocator_support::*;
use gpu_dra_analysis::allocator::{
    AllocError, Allocator, NodeFilter, Outcome, SimulateOptions, Snapshot,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const NODES: usize = 48;

fn node(n: usize) -> String {
    format!("node-{n:02}")
}

/// A node's slice: `gpus` GPUs whose memory grows with the node number
/// (so that every node explains itself differently).
fn node_slice(n: usize, gpus: usize) -> ResourceSlice {
    let devices: Vec<Value> = (0..gpus)
        .map(|g| gpu(&format!("gpu-{g}"), g as i64, &format!("{}Gi", 10 + n)))
        .collect();
    slice(&node(n), &node(n), Some(&node(n)), json!(devices))
}

fn cluster() -> Vec<ResourceSlice> {
    (0..NODES).map(|n| node_slice(n, 1 + n % 3)).collect()
}

fn answer(
    snapshot: &Snapshot<'_>,
    claim: &ResourceClaim,
    threads: usize,
    nodes: &NodeFilter,
    all_fitting_nodes: bool,
) -> Result<Outcome, AllocError> {
    let options = SimulateOptions {
        nodes: nodes.clone(),
        all_fitting_nodes,
        threads,
        ..SimulateOptions::default()
    };
    Allocator::new().simulate(snapshot, claim, &options)
}

/// The answer on the calling thread alone, checked to be what 2, 3 and 8
/// threads give on fresh snapshots.
fn same_with_threads(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claim: &ResourceClaim,
    nodes: &NodeFilter,
    all_fitting_nodes: bool,
) -> Result<Outcome, AllocError> {
    let alone = answer(
        &Snapshot::new(slices, classes, allocated),
        claim,
        1,
        nodes,
        all_fitting_nodes,
    );
    for threads in [2, 3, 8] {
        let fresh = Snapshot::new(slices, classes, allocated);
        let parallel = answer(&fresh, claim, threads, nodes, all_fitting_nodes);
        assert_eq!(parallel, alone, "{threads} threads");
    }
    alone
}

fn gpus(count: i64) -> ResourceClaim {
    claim("c", json!([exact("gpu", "gpu", count)]), Value::Null)
}

#[test]
fn explanations_of_many_nodes_are_the_same() {
    let slices = cluster();
    let classes = [gpu_class()];
    // four GPUs: no node has them
    let out = same_with_threads(&slices, &classes, &[], &gpus(4), &NodeFilter::All, false)
        .expect("a verdict");
    let explanation = out.explanation().expect("no node fits");
    assert_eq!(explanation.nodes_checked, NODES);
    let nodes: Vec<_> = explanation
        .nodes
        .iter()
        .map(|n| n.node.clone().unwrap())
        .collect();
    let expected: Vec<_> = (0..NODES).map(node).collect();
    assert_eq!(nodes, expected, "nodes explained in scan order");
    // a selector every node fails differently: the closest device of each
    // node has that node's memory
    let big = claim(
        "big",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('1Ti')) >= 0"}}]}}]),
        Value::Null,
    );
    let out = same_with_threads(&slices, &classes, &[], &big, &NodeFilter::All, false)
        .expect("a verdict");
    let last = out.explanation().unwrap().nodes.last().unwrap();
    let closest = last.requests[0].variants[0].closest.as_ref().unwrap();
    assert_eq!(
        closest.values,
        vec![("memory".to_owned(), Some(format!("{}Gi", 10 + NODES - 1)))]
    );
}

#[test]
fn the_first_fitting_node_and_all_fitting_nodes_are_the_same() {
    let slices = cluster();
    let classes = [gpu_class()];
    // three GPUs: every third node, the first is node-02
    let out = same_with_threads(&slices, &classes, &[], &gpus(3), &NodeFilter::All, false)
        .expect("a verdict");
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some("node-02")
    );
    let out = same_with_threads(&slices, &classes, &[], &gpus(3), &NodeFilter::All, true)
        .expect("a verdict");
    let fitting: Vec<_> = out
        .allocations()
        .unwrap()
        .iter()
        .map(|a| a.node.clone().unwrap())
        .collect();
    let expected: Vec<_> = (0..NODES).filter(|n| n % 3 == 2).map(node).collect();
    assert_eq!(fitting, expected);
    // only the last node free: every other GPU is allocated
    let busy: Vec<ResourceClaim> = (0..NODES - 1)
        .map(|n| {
            let results: Vec<Value> = (0..=n % 3)
                .map(|g| json!({"request": "gpu", "driver": DRIVER, "pool": node(n), "device": format!("gpu-{g}")}))
                .collect();
            allocated_raw(&format!("busy-{n}"), json!(results))
        })
        .collect();
    let out = same_with_threads(&slices, &classes, &busy, &gpus(1), &NodeFilter::All, false)
        .expect("a verdict");
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some(node(NODES - 1).as_str())
    );
}

#[test]
fn an_invalid_pool_ahead_is_met_where_the_search_meets_it() {
    let mut slices = cluster();
    // node-30's pool names a device twice: reaching it is an error
    let dup = json!([gpu("gpu-0", 0, "40Gi"), gpu("gpu-0", 1, "40Gi")]);
    slices[30] = slice(&node(30), &node(30), Some(&node(30)), dup);
    let classes = [gpu_class()];
    let err = same_with_threads(&slices, &classes, &[], &gpus(4), &NodeFilter::All, false)
        .expect_err("the invalid pool is reached");
    match err {
        AllocError::InvalidPool { node, reason, .. } => {
            assert_eq!(node, "node-30");
            assert!(reason.contains("duplicate device name gpu-0"), "{reason}");
        }
        other => panic!("expected InvalidPool, got {other:?}"),
    }
    // a node before it fits: the invalid pool is never reached
    let out = same_with_threads(&slices, &classes, &[], &gpus(3), &NodeFilter::All, false)
        .expect("a verdict");
    assert!(out.is_satisfiable());
    // all fitting nodes: the scan goes on and meets it
    let err = same_with_threads(&slices, &classes, &[], &gpus(3), &NodeFilter::All, true)
        .expect_err("the scan reaches the invalid pool");
    assert!(matches!(err, AllocError::InvalidPool { .. }), "{err}");
}

#[test]
fn a_selector_error_ahead_is_met_where_the_search_meets_it() {
    let mut slices = cluster();
    // node-40's GPU lacks the attribute the request reads: a runtime error
    slices[40] = slice(
        &node(40),
        &node(40),
        Some(&node(40)),
        json!([{"name": "odd", "attributes": {"type": {"string": "gpu"}}}]),
    );
    let classes = [gpu_class()];
    // no node has the model: the search reaches node-40's device
    let model = claim(
        "m",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.example.com'].model == 'H100'"}}]}}]),
        Value::Null,
    );
    let err = same_with_threads(&slices, &classes, &[], &model, &NodeFilter::All, false)
        .map(|o| o.is_satisfiable())
        .expect_err("the device without a model is reached");
    match err {
        AllocError::CelRuntime { node, device, .. } => {
            assert_eq!(node, "node-40");
            assert_eq!(device, "gpu.example.com/node-40/odd");
        }
        other => panic!("expected CelRuntime, got {other:?}"),
    }
}

#[test]
fn a_list_of_nodes_is_searched_in_its_order() {
    let slices = cluster();
    let classes = [gpu_class()];
    let order: Vec<String> = (0..NODES)
        .rev()
        .map(node)
        .chain(["nowhere".to_owned()])
        .collect();
    let nodes = NodeFilter::Nodes(order);
    let out =
        same_with_threads(&slices, &classes, &[], &gpus(3), &nodes, false).expect("a verdict");
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some("node-47")
    );
    let out =
        same_with_threads(&slices, &classes, &[], &gpus(4), &nodes, false).expect("a verdict");
    let explained: Vec<_> = out
        .explanation()
        .unwrap()
        .nodes
        .iter()
        .map(|n| n.node.clone().unwrap())
        .collect();
    assert_eq!(explained.first().map(String::as_str), Some("node-47"));
    assert_eq!(explained.last().map(String::as_str), Some("nowhere"));
}

#[test]
fn helpers_fill_caches_that_later_snapshots_share() {
    let slices = cluster();
    let classes = [gpu_class()];
    let first = Snapshot::new(&slices, &classes, &[]);
    let cold = answer(&first, &gpus(4), 2, &NodeFilter::All, false);
    // the same slices with other claims: the caches the helpers filled
    let busy = [allocated_raw(
        "b",
        json!([{"request": "gpu", "driver": DRIVER, "pool": node(2), "device": "gpu-0"}]),
    )];
    let second = first.with_allocated(&busy);
    let fresh = Snapshot::new(&slices, &classes, &busy);
    for claim in [gpus(3), gpus(4)] {
        assert_eq!(
            answer(&second, &claim, 2, &NodeFilter::All, false),
            answer(&fresh, &claim, 1, &NodeFilter::All, false)
        );
    }
    assert_eq!(
        answer(&first, &gpus(4), 1, &NodeFilter::All, false),
        cold,
        "warm and cold"
    );
    assert!(first.pool_issues().is_empty());
}
