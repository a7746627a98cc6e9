//! Benchmark: one claim against 1,000 nodes x 8 A100 GPUs with dynamic MIG
//! (per GPU the full GPU and 18 MIG placements, all consuming the GPU's
//! shared counters: 152 devices and 8 counter sets per node, in 4 slices).
//! Prints timings, asserts only the verdicts:
//!
//! `cargo bench -p gpu-dra-analysis --bench allocator`
//!
//! "Cold" means everything from the slices as Kubernetes objects (already
//! deserialized, as a controller's watch cache holds them) to the answer:
//! making the [`Snapshot`] (grouping the slices, reading the allocated
//! claims) is inside the timing, so every pool is validated and every
//! device read during the run. Only dropping the snapshot is left out.

#[path = "../tests/allocator_support/mod.rs"]
mod allocator_support;

use std::time::{Duration, Instant};

use allocator_support::{allocated_raw, claim, class, exact};
use gpu_dra_analysis::allocator::{Allocator, Outcome, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const NODES: usize = 1000;
const GPUS: usize = 8;
const DRIVER: &str = "gpu.nvidia.com";
/// Runs of each cold measurement (each on a fresh snapshot).
const COLD_RUNS: usize = 9;

/// (profile, memory slices, multiprocessors, placements)
const PROFILES: [(&str, usize, i64, &[usize]); 6] = [
    ("1g.10gb", 1, 14, &[0, 1, 2, 3, 4, 5, 6]),
    ("1g.20gb", 2, 14, &[0, 2, 4, 6]),
    ("2g.20gb", 2, 28, &[0, 2, 4]),
    ("3g.40gb", 4, 42, &[0, 4]),
    ("4g.40gb", 4, 56, &[0]),
    ("7g.80gb", 8, 98, &[0]),
];

fn consumes(gpu: usize, start: usize, slices: usize, memory_gi: usize, sms: i64) -> Value {
    let mut counters = serde_json::Map::new();
    counters.insert("memory".into(), json!({"value": format!("{memory_gi}Gi")}));
    counters.insert("multiprocessors".into(), json!({"value": sms.to_string()}));
    for s in start..start + slices {
        counters.insert(format!("memory-slice-{s}"), json!({"value": "1"}));
    }
    json!([{"counterSet": format!("gpu-{gpu}-counters"), "counters": counters}])
}

fn capacity(memory_gi: usize, sms: i64) -> Value {
    json!({
        "memory": {"value": format!("{memory_gi}Gi")},
        "multiprocessors": {"value": sms.to_string()},
        "copyEngines": {"value": "7"},
        "decoders": {"value": "5"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "1"},
        "ofaEngines": {"value": "1"},
    })
}

fn node_slices(n: usize) -> Vec<ResourceSlice> {
    let node = format!("node-{n:04}");
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for g in 0..GPUS {
        let uuid = format!("GPU-{n:04}{g:02}00-0000-0000-0000-000000000000");
        devices.push(json!({
            "name": format!("gpu-{g}"),
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": uuid},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": "Ampere"},
                "index": {"int": g},
                "driverVersion": {"version": "550.54.15"},
                "cudaComputeCapability": {"version": "8.0.0"},
                "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", g + 7)},
            },
            "capacity": capacity(80, 98),
            "consumesCounters": consumes(g, 0, 8, 80, 98),
        }));
        for (profile, slices, sms, starts) in PROFILES {
            for &start in starts {
                devices.push(json!({
                    "name": format!("gpu-{g}-mig-{profile}-{start}").replace('.', "-"),
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": profile},
                        "parentUUID": {"string": uuid},
                        "index": {"int": g},
                        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                        "driverVersion": {"version": "550.54.15"},
                        "placement": {"int": start},
                    },
                    "capacity": capacity(slices * 10, sms),
                    "consumesCounters": consumes(g, start, slices, slices * 10, sms),
                }));
            }
        }
        let mut counters = serde_json::Map::new();
        counters.insert("memory".into(), json!({"value": "80Gi"}));
        counters.insert("multiprocessors".into(), json!({"value": "98"}));
        for s in 0..8 {
            counters.insert(format!("memory-slice-{s}"), json!({"value": "1"}));
        }
        sets.push(json!({"name": format!("gpu-{g}-counters"), "counters": counters}));
    }
    let chunks: Vec<Vec<Value>> = devices.chunks(64).map(<[Value]>::to_vec).collect();
    let count = chunks.len() as i64 + 1;
    let spec = |extra: Value| {
        let mut spec = json!({
            "driver": DRIVER,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            "nodeName": node,
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let mut slices: Vec<ResourceSlice> = chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-{DRIVER}-{i}")},
                "spec": spec(json!({"devices": chunk})),
            }))
            .unwrap()
        })
        .collect();
    slices.push(
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{DRIVER}-counters")},
            "spec": spec(json!({"sharedCounters": sets})),
        }))
        .unwrap(),
    );
    slices
}

fn classes() -> Vec<DeviceClass> {
    vec![
        class(
            "gpu.nvidia.com",
            &[
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
            ],
        ),
        class(
            "mig-1g.10gb",
            &[
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
            ],
        ),
    ]
}

fn time<T>(label: &str, runs: u32, mut f: impl FnMut() -> T) -> T {
    let mut best = Duration::MAX;
    let mut total = Duration::ZERO;
    let mut out = None;
    for _ in 0..runs {
        let start = Instant::now();
        let r = f();
        let took = start.elapsed();
        best = best.min(took);
        total += took;
        out = Some(r);
    }
    println!(
        "{label:<72} best {:>9.3} ms  mean {:>9.3} ms  ({runs} runs)",
        best.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3 / f64::from(runs)
    );
    out.expect("at least one run")
}

/// Times making a fresh snapshot and running `f` on it, so every run pays
/// for grouping the slices, validating pools and reading devices: a truly
/// cold answer. (Only dropping the snapshot is left out.) Reports the
/// median, the best and the worst.
fn time_cold<'a, T>(
    label: &str,
    runs: usize,
    mut fresh: impl FnMut() -> Snapshot<'a>,
    mut f: impl FnMut(&Snapshot<'a>) -> T,
) -> T {
    let mut took = Vec::with_capacity(runs);
    let mut out = None;
    for _ in 0..runs {
        let start = Instant::now();
        let snapshot = fresh();
        let r = f(&snapshot);
        took.push(start.elapsed());
        drop(snapshot);
        out = Some(r);
    }
    took.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label:<72} p50 {:>9.3} ms  best {:>9.3} ms  worst {:>9.3} ms  ({runs} cold runs)",
        ms(took[runs / 2]),
        ms(took[0]),
        ms(took[runs - 1])
    );
    out.expect("at least one run")
}

fn first_byte(s: &str) -> usize {
    s.as_bytes().first().map_or(0, |b| usize::from(*b))
}

/// A reference, not the allocator: reads one byte of each string a cold
/// full scan cannot avoid comparing (device names, counter set names and
/// consumed counter names, which validation checks, and the class
/// selector's `type` attribute, name and value), in one tight loop. What
/// memory latency costs on this machine before any work is done.
fn read_floor(slices: &[ResourceSlice]) -> usize {
    let mut acc = 0usize;
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        acc = acc.wrapping_add(first_byte(&d.name));
        for c in d.consumes_counters.iter().flatten() {
            acc = acc.wrapping_add(first_byte(&c.counter_set));
            for k in c.counters.keys() {
                acc = acc.wrapping_add(first_byte(k));
            }
        }
        for (k, v) in d.attributes.iter().flatten() {
            if k == "type" {
                acc = acc.wrapping_add(v.string.as_deref().map_or(0, first_byte));
            }
        }
    }
    acc
}

fn simulate(snapshot: &Snapshot<'_>, allocator: &Allocator, c: &ResourceClaim) -> Outcome {
    allocator
        .simulate(snapshot, c, &SimulateOptions::default())
        .unwrap()
}

/// [`simulate`] on the calling thread alone.
fn simulate_alone(snapshot: &Snapshot<'_>, allocator: &Allocator, c: &ResourceClaim) -> Outcome {
    let options = SimulateOptions {
        threads: 1,
        ..SimulateOptions::default()
    };
    allocator.simulate(snapshot, c, &options).unwrap()
}

fn main() {
    let slices: Vec<ResourceSlice> = (0..NODES).flat_map(node_slices).collect();
    let classes = classes();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    println!(
        "{NODES} nodes, {devices} devices, {} slices; {} threads available",
        slices.len(),
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    );
    let allocator = Allocator::new();
    // compile the selectors once (the compiler caches them, as it would in
    // the controller)
    simulate(
        &Snapshot::new(&slices, &classes, &[]),
        &allocator,
        &claim(
            "warm",
            json!([exact("gpu", "gpu.nvidia.com", 1)]),
            Value::Null,
        ),
    );

    let one_gpu = claim(
        "one-gpu",
        json!([exact("gpu", "gpu.nvidia.com", 1)]),
        Value::Null,
    );
    let linked = claim(
        "two-migs",
        json!([exact("mig", "mig-1g.10gb", 2)]),
        json!([{"matchAttribute": "gpu.nvidia.com/parentUUID"}]),
    );
    let too_big = claim(
        "too-big",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [
            {"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('160Gi')) >= 0"}}]}}]),
        Value::Null,
    );

    let snapshot = time("Snapshot::new (group slices into pools)", 5, || {
        Snapshot::new(&slices, &classes, &[])
    });
    let fresh_snapshot = || Snapshot::new(&slices, &classes, &[]);
    time_cold(
        "Snapshot::pool_issues, cold (prepare and validate all 1000 pools)",
        COLD_RUNS,
        fresh_snapshot,
        |s| s.pool_issues().len(),
    );
    let out = time_cold(
        "1 GPU, cold snapshot (first node fits)",
        COLD_RUNS,
        fresh_snapshot,
        |s| simulate(s, &allocator, &one_gpu),
    );
    assert!(out.is_satisfiable());
    simulate(&snapshot, &allocator, &one_gpu);
    time("1 GPU, warm snapshot", 20, || {
        simulate(&snapshot, &allocator, &one_gpu)
    });
    let out = time(
        "2 MIG 1g.10gb on one parent GPU (matchAttribute)",
        20,
        || simulate(&snapshot, &allocator, &linked),
    );
    assert!(out.is_satisfiable());

    let mut took: Vec<Duration> = (0..COLD_RUNS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(read_floor(&slices));
            start.elapsed()
        })
        .collect();
    took.sort_unstable();
    // not an answer: worded so that the bench table does not take it for
    // one
    println!(
        "reference, not the allocator: only reading the strings a cold full scan must compare, one thread: median {:.3} ms, fastest {:.3} ms ({COLD_RUNS} runs)",
        took[COLD_RUNS / 2].as_secs_f64() * 1e3,
        took[0].as_secs_f64() * 1e3
    );
    let out = time_cold(
        "unsatisfiable (memory >= 160Gi), cold snapshot: 1000 nodes + explanation",
        COLD_RUNS,
        fresh_snapshot,
        |s| simulate(s, &allocator, &too_big),
    );
    let alone = time_cold(
        "unsatisfiable, cold snapshot, calling thread only (threads: 1)",
        COLD_RUNS,
        fresh_snapshot,
        |s| simulate_alone(s, &allocator, &too_big),
    );
    assert_eq!(alone, out, "threads change nothing");
    let fresh = fresh_snapshot();
    simulate(&fresh, &allocator, &too_big);
    println!("    summary: {}", out.explanation().unwrap().summary);
    time("unsatisfiable (memory >= 160Gi), warm snapshot", 5, || {
        simulate(&fresh, &allocator, &too_big)
    });
    time(
        "unsatisfiable, warm snapshot, calling thread only",
        5,
        || simulate_alone(&fresh, &allocator, &too_big),
    );
    time(
        "Snapshot::pool_issues (validate every pool, warm)",
        3,
        || fresh.pool_issues().len(),
    );

    // every GPU of every node but the last in use: the scan must reach the
    // last node
    let busy: Vec<ResourceClaim> = (0..NODES - 1)
        .map(|n| {
            let results: Vec<Value> = (0..GPUS)
                .map(|g| json!({"request": "gpu", "driver": DRIVER, "pool": format!("node-{n:04}"), "device": format!("gpu-{g}")}))
                .collect();
            allocated_raw(&format!("busy-{n}"), json!(results))
        })
        .collect();
    let crowded = time("Snapshot::new with 999 allocated claims", 3, || {
        Snapshot::new(&slices, &classes, &busy)
    });
    // what a controller does when only claims changed: keep the slice
    // caches of an earlier snapshot (`fresh`, warmed above)
    let reused = time(
        "Snapshot::with_allocated (999 claims, slice caches kept)",
        3,
        || fresh.with_allocated(&busy),
    );
    let out = time(
        "1 GPU, only the last node free, after with_allocated",
        1,
        || simulate(&reused, &allocator, &one_gpu),
    );
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some("node-0999")
    );
    let out = time_cold(
        "1 GPU, only the last node free, cold snapshot",
        COLD_RUNS,
        || Snapshot::new(&slices, &classes, &busy),
        |s| simulate(s, &allocator, &one_gpu),
    );
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some("node-0999")
    );
    simulate(&crowded, &allocator, &one_gpu);
    time("1 GPU, only the last node free, warm snapshot", 5, || {
        simulate(&crowded, &allocator, &one_gpu)
    });
    let out = time(
        "1 MIG, only the last node free (counters exhausted elsewhere), warm",
        5,
        || {
            simulate(
                &crowded,
                &allocator,
                &claim("mig", json!([exact("mig", "mig-1g.10gb", 1)]), Value::Null),
            )
        },
    );
    assert_eq!(
        out.allocations().unwrap()[0].node.as_deref(),
        Some("node-0999")
    );
}
