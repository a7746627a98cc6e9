use std::time::Instant;

use serde_json::{Value, json};

use super::*;

/// A v1 slice of node `node`, pool `node`, generation `generation`.
fn slice(node: &str, generation: i64, devices: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com-{generation}")},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }
    })
}

fn gpu(minor: u32, taints: Value) -> Value {
    json!({
        "name": format!("gpu-{minor}"),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": format!("GPU-{minor}")},
            "productName": {"string": "NVIDIA H100"},
        },
        "taints": taints,
    })
}

fn mig(minor: u32, start: u32, taints: Value) -> Value {
    json!({
        "name": format!("gpu-{minor}-mig-1g10gb-19-{start}"),
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": format!("MIG-{minor}-{start}")},
            "parentUUID": {"string": format!("GPU-{minor}")},
        },
        "taints": taints,
    })
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Value {
    let mut t = json!({"key": key, "effect": effect, "timeAdded": "2026-11-29T06:00:00Z"});
    if let Some(v) = value {
        t["value"] = json!(v);
    }
    t
}

fn build_all(values: &[Value], node: Option<&str>) -> Report {
    let inputs: Vec<SliceInput<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, value)| SliceInput {
            value,
            place: Box::new(move |path: &str| format!("slice {i}: {path}")),
        })
        .collect();
    build(&inputs, node)
}

fn problems(report: &Report) -> Vec<String> {
    report
        .problems
        .iter()
        .map(|p| format!("{}: {}", p.at, p.message))
        .collect()
}

#[test]
fn a_whole_gpu_fault_makes_the_gpu_unschedulable_and_a_mig_fault_only_part() {
    let lost = json!([taint("gpu.nvidia.com/gpu-lost", None, "NoSchedule")]);
    let report = build_all(
        &[slice(
            "node-a",
            1,
            json!([
                mig(0, 0, lost.clone()),
                mig(0, 1, lost),
                mig(
                    1,
                    0,
                    json!([taint("gpu.nvidia.com/xid", Some("94"), "NoSchedule")])
                ),
                mig(1, 1, json!([])),
                gpu(2, json!([taint("gpu.nvidia.com/xid", Some("13"), "None")])),
                gpu(3, json!(null)),
                gpu(
                    4,
                    json!([taint("gpu.nvidia.com/gpu-lost", None, "NoExecute")])
                ),
            ]),
        )],
        None,
    );
    assert!(report.problems.is_empty(), "{:?}", problems(&report));
    let node = &report.nodes[0];
    let states: Vec<(Option<u32>, GpuState)> =
        node.gpus.iter().map(|g| (g.minor, g.state)).collect();
    assert_eq!(
        states,
        [
            (Some(0), GpuState::Unschedulable),
            (Some(1), GpuState::PartlyUnschedulable),
            (Some(2), GpuState::Informational),
            (Some(3), GpuState::NoTaints),
            (Some(4), GpuState::NoExecute),
        ]
    );
    // The UUID of a GPU published only through its MIG devices is their parent's.
    assert_eq!(node.gpus[0].uuid.as_deref(), Some("GPU-0"));
    assert_eq!(node.gpus[2].product_name.as_deref(), Some("NVIDIA H100"));
    assert_eq!(report.summary.devices, 7);
    assert_eq!(report.summary.tainted_devices, 5);
    assert_eq!(report.summary.unschedulable_devices, 4);
    let xid = &node.gpus[1].devices[0].taints[0];
    assert!(xid.known);
    assert!(
        xid.meaning
            .starts_with("XID 94 (NVIDIA's catalog: RESTART_APP): fatal")
    );
    assert_eq!(xid.time_added.as_deref(), Some("2026-11-29T06:00:00Z"));
}

#[test]
fn node_filter_other_drivers_and_unknown_keys() {
    let mut other = slice("node-a", 1, json!([gpu(0, json!([]))]));
    other["spec"]["driver"] = json!("example.com");
    let report = build_all(
        &[
            slice(
                "node-a",
                1,
                json!([gpu(
                    0,
                    json!([
                        taint("gpu.nvidia.com/shiny-new", Some("x"), "None"),
                        taint("example.com/maintenance", None, "NoSchedule"),
                    ])
                )]),
            ),
            slice("node-b", 1, json!([gpu(0, json!([]))])),
            other,
        ],
        Some("node-a"),
    );
    assert_eq!(report.nodes.len(), 1);
    assert_eq!(
        report.notes,
        [
            "1 ResourceSlice of other drivers skipped",
            "1 ResourceSlice of other nodes skipped (node-b)"
        ]
    );
    let taints = &report.nodes[0].gpus[0].devices[0].taints;
    assert!(!taints[0].known && taints[0].meaning.contains("a newer driver?"));
    assert!(!taints[1].known && taints[1].meaning.contains("someone else"));
    // A foreign NoSchedule taint still keeps the device from the scheduler.
    assert_eq!(report.nodes[0].gpus[0].state, GpuState::Unschedulable);
}

#[test]
fn only_the_newest_generation_of_a_pool_counts_and_missing_slices_are_noted() {
    let old = slice(
        "node-a",
        1,
        json!([gpu(
            0,
            json!([taint("gpu.nvidia.com/gpu-lost", None, "NoSchedule")])
        )]),
    );
    let mut new = slice("node-a", 2, json!([gpu(0, json!([]))]));
    new["spec"]["pool"]["resourceSliceCount"] = json!(2);
    for order in [[old.clone(), new.clone()], [new, old]] {
        let report = build_all(&order, None);
        let pool = &report.nodes[0].pools[0];
        assert_eq!((pool.generation, pool.slices), (2, 1));
        assert_eq!(report.nodes[0].gpus[0].state, GpuState::NoTaints);
        assert_eq!(
            report.notes,
            [
                "pool node-a of node node-a: 1 slice of generations older than 2 ignored (the driver is replacing them)",
                "pool node-a of node node-a: 1 of 2 slices of generation 2 seen: the view is incomplete"
            ]
        );
    }
}

#[test]
fn v1beta1_devices_keep_their_taints_in_basic() {
    let mut s = slice("node-a", 1, json!([]));
    s["apiVersion"] = json!("resource.k8s.io/v1beta1");
    s["spec"]["devices"] = json!([{
        "name": "gpu-0",
        "basic": {
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}},
            "taints": [taint("gpu.nvidia.com/reboot-required", None, "NoSchedule")],
        }
    }]);
    let report = build_all(&[s], None);
    let gpu = &report.nodes[0].gpus[0];
    assert_eq!(gpu.uuid.as_deref(), Some("GPU-0"));
    assert_eq!(
        gpu.devices[0].taints[0].key,
        "gpu.nvidia.com/reboot-required"
    );
    assert_eq!(gpu.state, GpuState::Unschedulable);
}

#[test]
fn malformed_parts_become_located_problems_and_the_rest_is_shown() {
    let report = build_all(
        &[
            json!({"kind": "ResourceSlice"}),
            json!({"spec": {"nodeName": "node-a"}}),
            json!({"spec": {"driver": DRIVER, "nodeName": "node-a", "devices": "lots"}}),
            slice(
                "node-a",
                1,
                json!([
                    "not a device",
                    {"attributes": {}},
                    gpu(0, json!({"key": "not a list"})),
                    gpu(1, json!([
                        "not a taint",
                        {"effect": "NoSchedule"},
                        {"key": "gpu.nvidia.com/gpu-lost"},
                        {"key": "gpu.nvidia.com/xid", "value": 79, "effect": "NoSchedule", "timeAdded": 5},
                        {"key": "gpu.nvidia.com/xid", "value": "7 9", "effect": "PreferNoSchedule"},
                        {"key": "not a//key", "effect": "None"},
                    ])),
                    gpu(1, json!([])),
                ]),
            ),
        ],
        None,
    );
    let got = problems(&report);
    let expected = [
        "slice 0: spec: no spec object: slice skipped",
        "slice 1: spec.driver: no driver: slice skipped",
        "slice 2: spec.pool.name: no pool name",
        "slice 2: spec.pool.generation: no integer generation: taken as 0",
        "slice 2: spec.devices: not a list: no devices read",
        "slice 3: spec.devices[0]: a device that is not an object: skipped",
        "slice 3: spec.devices[1].name: a device without a name: skipped",
        "slice 3: spec.devices[2].taints: taints is not a list: none read",
        "slice 3: spec.devices[3].taints[0]: a taint of device gpu-1 that is not an object: skipped",
        "slice 3: spec.devices[3].taints[1].key: a taint of device gpu-1 without a key: skipped",
        "slice 3: spec.devices[3].taints[2].effect: taint gpu.nvidia.com/gpu-lost of device gpu-1 without an effect: skipped",
        "slice 3: spec.devices[3].taints[3].value: the value of taint gpu.nvidia.com/xid of device gpu-1 is not a string: ignored",
        "slice 3: spec.devices[3].taints[3].timeAdded: timeAdded of taint gpu.nvidia.com/xid of device gpu-1 is not a string: ignored",
        "slice 3: spec.devices[3].taints[4].value: taint value 7 9 of device gpu-1 is not a valid label value",
        "slice 3: spec.devices[3].taints[4].effect: taint gpu.nvidia.com/xid of device gpu-1 has the unknown effect PreferNoSchedule: the scheduler treats it like None",
        "slice 3: spec.devices[3].taints[5].key: taint key not a//key of device gpu-1 is not a valid label name (the API server would refuse it)",
        "slice 3: spec.devices: device gpu-1 is published twice in its pool: the later one is ignored",
    ];
    assert_eq!(got, expected);
    // What could be read is shown: gpu-0 without taints, gpu-1 with three.
    let gpus = &report.nodes[0].gpus;
    assert_eq!(gpus.len(), 2);
    let kept: Vec<(&str, Option<&str>, &str)> = gpus[1].devices[0]
        .taints
        .iter()
        .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
        .collect();
    assert_eq!(
        kept,
        [
            ("gpu.nvidia.com/xid", None, "NoSchedule"),
            ("gpu.nvidia.com/xid", Some("7 9"), "PreferNoSchedule"),
            ("not a//key", None, "None"),
        ]
    );
    assert!(
        gpus[1].devices[0].taints[1]
            .meaning
            .ends_with("unknown effect: the scheduler treats it like None")
    );
    assert_eq!(gpus[1].state, GpuState::Unschedulable);
}

#[test]
fn devices_that_name_no_gpu_are_grouped_by_uuid_or_kept_apart() {
    let report = build_all(
        &[slice(
            "node-a",
            1,
            json!([
                {"name": "gpu-01", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-x"}}},
                {"name": "odd-mig", "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": "GPU-x"}}},
                {"name": "stray"},
                {"name": "gpu-99999999999"},
            ]),
        )],
        None,
    );
    let gpus: Vec<(Option<u32>, Option<&str>, Vec<&str>)> = report.nodes[0]
        .gpus
        .iter()
        .map(|g| {
            (
                g.minor,
                g.uuid.as_deref(),
                g.devices.iter().map(|d| d.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        gpus,
        [
            (None, Some("GPU-x"), vec!["gpu-01", "odd-mig"]),
            (None, None, vec!["gpu-99999999999", "stray"]),
        ]
    );
}

#[test]
fn hostile_sizes_are_cut_counted_and_linear() {
    let long = "x".repeat(100_000);
    let many: Vec<Value> = (0..1000)
        .map(|i| taint("gpu.nvidia.com/xid", Some(&i.to_string()), "None"))
        .collect();
    let report = build_all(
        &[slice(
            &long,
            1,
            json!([
                gpu(0, json!(many)),
                gpu(1, json!([taint(&long, Some(&long), &long)])),
            ]),
        )],
        None,
    );
    let node = &report.nodes[0];
    assert_eq!(node.node.chars().count(), MAX_TEXT + 1, "cut, with …");
    let d0 = &node.gpus[0].devices[0];
    assert_eq!(
        (d0.taints.len(), d0.omitted_taints),
        (MAX_TAINTS_SHOWN, 1000 - MAX_TAINTS_SHOWN)
    );
    let d1 = &node.gpus[1].devices[0].taints[0];
    assert!(d1.key.ends_with('…') && d1.key.len() < 300);
    assert!(d1.effect.ends_with('…') && d1.effect.len() < 300);
    let got = problems(&report);
    assert!(
        got[0].ends_with("device gpu-0 has 1000 taints, more than the API allows (16)"),
        "{got:?}"
    );
    assert!(got.iter().all(|p| p.len() < 2000), "every message is cut");

    // 10 000 devices of 16 taints each: linear, not quadratic.
    let devices: Vec<Value> = (0..10_000)
        .map(|i| {
            gpu(
                i,
                json!(
                    (0..16)
                        .map(|x| taint("gpu.nvidia.com/xid", Some(&x.to_string()), "NoSchedule"))
                        .collect::<Vec<_>>()
                ),
            )
        })
        .collect();
    let big = slice("node-a", 1, json!(devices));
    let start = Instant::now();
    let report = build_all(&[big], None);
    let took = start.elapsed();
    assert_eq!(report.summary.devices, 10_000);
    assert_eq!(report.summary.unschedulable_devices, 10_000);
    assert_eq!(
        problems(&report),
        ["slice 0: spec.devices: 10000 devices, more than a slice may hold (128)"]
    );
    assert!(took.as_secs() < 20, "{took:?}");
}

#[test]
fn label_rules() {
    for key in ["gpu.nvidia.com/xid", "xid", "a.b-c/d_e.f", "example.com/A1"] {
        assert!(valid_key(key), "{key}");
    }
    for key in [
        "",
        "/x",
        "x/",
        "Example.com/x",
        "-a.com/x",
        "a..b/x",
        "a/b/c",
        "gpu.nvidia.com/-x",
        &"x".repeat(64),
        &format!("{}/x", "a".repeat(254)),
    ] {
        assert!(!valid_key(key), "{key}");
    }
    for value in ["", "79", "GPU_RESET", "row-remap-failure", &"v".repeat(63)] {
        assert!(valid_value(value), "{value}");
    }
    for value in ["7 9", "-x", "x-", &"v".repeat(64), "é"] {
        assert!(!valid_value(value), "{value}");
    }
    assert_eq!(name_minor("gpu-0"), Some(0));
    assert_eq!(name_minor("gpu-12-mig-1g10gb-19-0"), Some(12));
    for name in [
        "gpu-",
        "gpu-01",
        "gpu-x",
        "gpu--1",
        "gpu-99999999999",
        "cpu-1",
    ] {
        assert_eq!(name_minor(name), None, "{name}");
    }
}
