//! Golden tests of the published pool: for every shipped machine profile, the
//! real plugin binary runs on a private fake NVML and its sysfs tree,
//! publishes to the test API server (which validates every slice on write,
//! with the 1.35 or 1.34 rules), and the stored pool is compared with a
//! reviewed snapshot (`tests/snapshots/`) after redacting what the server
//! makes up (uids, resourceVersions, timestamps, managed fields). Each test
//! also checks the pool's structure and its agreement with the profile.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::{DRIVER, NODE, Plugin, TestEnv, complete_pool, short_dir};
use gpu_dra_sim::apiserver::ValidationRules;
use serde_json::{Map, Value};

const WAIT: Duration = Duration::from_secs(30);

/// Runs the plugin on `profile` with `flags` against a server with `rules`,
/// checks the complete pool (with full GPUs falling into NVLink domains of
/// the sizes `nvlink_domains`), and snapshots it as `name`. Returns the pool
/// and the plugin's log so far.
async fn golden(
    name: &str,
    profile: &str,
    rules: ValidationRules,
    flags: &[&str],
    nvlink_domains: &[usize],
) -> (Vec<Value>, String) {
    let dir = short_dir();
    let env = Arc::new(
        TestEnv::builder(dir.path())
            .bundled(profile)
            .rules(rules)
            .build(),
    );
    let plugin = Plugin::launch(&env, dir.path(), "run", flags);
    let pool = env.wait_pool(NODE, WAIT).await;
    check_structure(&env, &pool);
    let machine = nvidia_ml::Profile::load(&env.profile).unwrap();
    check_against_profile(&machine, &pool, flags.contains(&"--dynamic-mig"));
    check_sharing(&pool);
    check_limits(&pool, rules);
    assert_eq!(domain_sizes(&pool), nvlink_domains, "NVLink domains");
    check_nvlink_counts(&machine, &pool);
    let log = plugin.stderr();
    assert!(!log.contains("panicked"), "{log}");
    // Switch links (NVML's sentinel far end) are no malformed bus ids.
    assert!(!log.contains("malformed"), "{log}");
    insta::assert_json_snapshot!(name, redact(&pool));
    (pool, log)
}

fn device_names(pool: &[Value]) -> BTreeSet<&str> {
    devices(pool).filter_map(|d| d["name"].as_str()).collect()
}

/// One pool per node, owned by the Node, complete at one generation.
fn check_structure(env: &TestEnv, pool: &[Value]) {
    assert!(!pool.is_empty());
    let generation = complete_pool(pool).expect("the pool is complete");
    let node_uid = env.node_uid.as_deref().unwrap();
    let mut names = BTreeSet::new();
    for slice in pool {
        let spec = &slice["spec"];
        assert_eq!(spec["driver"], DRIVER);
        assert_eq!(spec["nodeName"], NODE);
        assert_eq!(spec["pool"]["name"], NODE, "pool name = node name");
        assert_eq!(spec["pool"]["generation"], generation);
        assert_eq!(
            spec["pool"]["resourceSliceCount"].as_u64(),
            Some(pool.len() as u64)
        );
        let owners = slice["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0]["apiVersion"], "v1");
        assert_eq!(owners[0]["kind"], "Node");
        assert_eq!(owners[0]["name"], NODE);
        assert_eq!(owners[0]["uid"], node_uid);
        for device in spec["devices"].as_array().into_iter().flatten() {
            let name = device["name"].as_str().unwrap();
            assert!(names.insert(name.to_owned()), "device {name} twice");
        }
    }
}

fn attr<'a>(device: &'a Value, name: &str) -> Option<&'a Value> {
    let a = &device["attributes"][name];
    ["string", "int", "bool", "version"]
        .iter()
        .find_map(|k| a.get(*k))
}

fn devices(pool: &[Value]) -> impl Iterator<Item = &Value> {
    pool.iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
}

/// Every device belongs to a GPU of the profile; every GPU that is usable
/// whole (MIG off, or MIG capable and switchable under dynamic MIG) is
/// published as `gpu-<minor>` with the profile's UUID and PCI address; MIG
/// devices are published for GPUs with MIG on.
fn check_against_profile(machine: &nvidia_ml::Profile, pool: &[Value], dynamic_mig: bool) {
    let by_uuid: BTreeMap<&str, &nvidia_ml::profile::Gpu> =
        machine.gpus.iter().map(|g| (g.uuid.as_str(), g)).collect();
    let mut full = BTreeSet::new();
    let mut mig_parents = BTreeSet::new();
    for device in devices(pool) {
        let name = device["name"].as_str().unwrap();
        match attr(device, "type").and_then(Value::as_str) {
            Some("gpu") => {
                let uuid = attr(device, "uuid").and_then(Value::as_str).unwrap();
                let gpu = by_uuid
                    .get(uuid)
                    .unwrap_or_else(|| panic!("{uuid} not in profile"));
                assert_eq!(name, format!("gpu-{}", gpu.minor));
                assert_eq!(
                    attr(device, "resource.kubernetes.io/pciBusID").and_then(Value::as_str),
                    Some(gpu.pci.sysfs().as_str())
                );
                assert_eq!(
                    attr(device, "resource.kubernetes.io/pcieRoot").and_then(Value::as_str),
                    Some(gpu.pcie_root.as_str())
                );
                full.insert(uuid.to_owned());
            }
            Some("mig") => {
                let parent = attr(device, "parentUUID").and_then(Value::as_str).unwrap();
                let gpu = by_uuid
                    .get(parent)
                    .unwrap_or_else(|| panic!("{parent} not in profile"));
                assert!(
                    name.starts_with(&format!("gpu-{}-mig-", gpu.minor)),
                    "{name} on GPU {}",
                    gpu.minor
                );
                mig_parents.insert(parent.to_owned());
            }
            // --passthrough: the GPU's VFIO sibling, same UUID and address.
            Some("vfio") => {
                let uuid = attr(device, "uuid").and_then(Value::as_str).unwrap();
                let gpu = by_uuid
                    .get(uuid)
                    .unwrap_or_else(|| panic!("{uuid} not in profile"));
                assert!(name.starts_with("gpu-vfio-"), "{name}");
                assert_eq!(
                    attr(device, "resource.kubernetes.io/pciBusID").and_then(Value::as_str),
                    Some(gpu.pci.sysfs().as_str())
                );
            }
            other => panic!("{name}: unexpected type {other:?}"),
        }
    }
    for gpu in &machine.gpus {
        if !gpu.mig_current {
            assert!(
                full.contains(&gpu.uuid),
                "GPU {} (MIG off) missing",
                gpu.minor
            );
        } else if !dynamic_mig && gpu.mig.mig_devices().next().is_some() {
            assert!(
                mig_parents.contains(&gpu.uuid),
                "MIG devices of GPU {} missing",
                gpu.minor
            );
        }
    }
}

/// A multi-allocatable device is a full GPU whose `memory` capacity (and
/// only that) carries a request policy the API accepts: a `validRange` with
/// `min` ≤ `default` ≤ `max` ≤ capacity, all on `step`; devices that are not
/// multi-allocatable carry no policy.
fn check_sharing(pool: &[Value]) {
    let bytes = |v: &Value| -> i128 {
        gpu_kubelet_plugin::devices::k8s::quantity_nanos(v.as_str().unwrap()).unwrap()
            / 1_000_000_000
    };
    for device in devices(pool) {
        let name = device["name"].as_str().unwrap();
        let shared = device["allowMultipleAllocations"] == true;
        for (cap, value) in device["capacity"].as_object().into_iter().flatten() {
            let policy = &value["requestPolicy"];
            if !shared {
                assert!(policy.is_null(), "{name}: {cap} has a request policy");
                continue;
            }
            if !(cap == "memory" || cap == "shares") {
                // A shared MIG device's SMs and engines: no share takes any.
                assert_eq!(policy["default"], "0", "{name}: {cap}");
                assert_eq!(
                    policy["validValues"],
                    serde_json::json!(["0"]),
                    "{name}: {cap}"
                );
                continue;
            }
            // Full GPUs; static MIG devices under consumable shares.
            assert!(
                matches!(
                    attr(device, "type").and_then(Value::as_str),
                    Some("gpu" | "mig")
                ),
                "{name}"
            );
            assert!(device["consumesCounters"].is_null(), "{name}");
            let capacity = bytes(&value["value"]);
            let range = &policy["validRange"];
            let (min, max, step, default) = (
                bytes(&range["min"]),
                bytes(&range["max"]),
                bytes(&range["step"]),
                bytes(&policy["default"]),
            );
            assert!(
                step > 0
                    && min <= default
                    && default <= max
                    && max <= capacity
                    && min + step <= capacity
                    && (max - min) % step == 0
                    && (default - min) % step == 0
                    && max % step == 0
                    && default % step == 0,
                "{name}: {policy}"
            );
        }
    }
}

/// Every full GPU's `nvlinkCount` is the number of active links the profile
/// gives it, whether they end at a GPU or at a switch.
fn check_nvlink_counts(machine: &nvidia_ml::Profile, pool: &[Value]) {
    for device in devices(pool) {
        if attr(device, "type").and_then(Value::as_str) != Some("gpu") {
            continue;
        }
        let uuid = attr(device, "uuid").and_then(Value::as_str).unwrap();
        let gpu = machine.gpus.iter().find(|g| g.uuid == uuid).unwrap();
        assert_eq!(
            attr(device, "nvlinkCount").and_then(Value::as_i64),
            Some(gpu.nvlinks.len() as i64),
            "{}",
            device["name"]
        );
    }
}

/// How many full GPUs share each `nvlinkDomain`, largest first.
fn domain_sizes(pool: &[Value]) -> Vec<usize> {
    let mut domains: BTreeMap<&str, usize> = BTreeMap::new();
    for device in devices(pool) {
        if attr(device, "type").and_then(Value::as_str) == Some("gpu") {
            let domain = attr(device, "nvlinkDomain")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("{} has no nvlinkDomain", device["name"]));
            *domains.entry(domain).or_default() += 1;
        }
    }
    let mut sizes: Vec<usize> = domains.into_values().collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes
}

/// The per-slice limits of the rules the server enforced (the server checks
/// them too; this makes the test fail loudly if the rules were not applied).
fn check_limits(pool: &[Value], rules: ValidationRules) {
    for slice in pool {
        let spec = &slice["spec"];
        let has_devices = spec["devices"].as_array().is_some_and(|d| !d.is_empty());
        let has_counters = spec["sharedCounters"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        if rules == ValidationRules::V1_35 {
            assert!(
                !(has_devices && has_counters),
                "1.35: devices and counters in one slice"
            );
        }
        assert!(spec["devices"].as_array().map_or(0, Vec::len) <= 128);
    }
}

/// The pool with server-made values replaced, keys sorted, slices by name.
fn redact(pool: &[Value]) -> Value {
    let mut slices: Vec<Value> = pool.to_vec();
    slices.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    for slice in &mut slices {
        let meta = slice["metadata"].as_object_mut().unwrap();
        for (key, placeholder) in [
            ("uid", "[uid]"),
            ("resourceVersion", "[resourceVersion]"),
            ("creationTimestamp", "[creationTimestamp]"),
            ("managedFields", "[managedFields]"),
        ] {
            if meta.contains_key(key) {
                meta.insert(key.into(), Value::from(placeholder));
            }
        }
        if let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .map(str::to_owned)
        {
            meta.insert("name".into(), Value::from(format!("{prefix}[suffix]")));
        }
        for owner in meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            owner["uid"] = Value::from("[node uid]");
        }
    }
    sorted(Value::Array(slices))
}

/// `v` with every object's keys in order.
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let ordered: BTreeMap<String, Value> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().collect::<Map<_, _>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[tokio::test]
async fn dgx_h100() {
    golden("dgx-h100", "dgx-h100", ValidationRules::V1_35, &[], &[8]).await;
}

#[tokio::test]
async fn dgx_a100() {
    let (pool, log) = golden("dgx-a100", "dgx-a100", ValidationRules::V1_35, &[], &[4]).await;
    // GPU 2's 3g.40gb GPU instance is split into two compute instances: a
    // device named after the GPU instance cannot stand for either, so it is
    // left out, with one warning. The GPU's whole 2g.20gb is published.
    let names = device_names(&pool);
    assert!(names.contains("gpu-2-mig-2g20gb-14-0"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("gpu-2-mig-3g40gb")),
        "{names:?}"
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("is split into 2 compute instances"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("WARN")
            && warnings[0].contains("on gpu-2 (GPU-8e81973e-0bec-47b0-b898-d190f9ebdacc)")
            && warnings[0].contains("recreating it with one compute instance"),
        "{}",
        warnings[0]
    );
}

#[tokio::test]
async fn pcie_a100_bridged() {
    golden(
        "pcie-a100-bridged",
        "pcie-a100-bridged",
        ValidationRules::V1_35,
        &[],
        &[2, 2],
    )
    .await;
}

/// GB200: every link ends at a switch (the sentinel far end); the fabric
/// clique joins the four GPUs into one domain.
#[tokio::test]
async fn gb200_nvl() {
    golden("gb200-nvl", "gb200-nvl", ValidationRules::V1_35, &[], &[4]).await;
}

#[tokio::test]
async fn t4_inference() {
    golden(
        "t4-inference",
        "t4-inference",
        ValidationRules::V1_35,
        &[],
        &[1, 1, 1, 1],
    )
    .await;
}

#[tokio::test]
async fn mixed() {
    golden("mixed", "mixed", ValidationRules::V1_35, &[], &[1, 1, 1]).await;
}

#[tokio::test]
async fn dgx_h100_dynamic_mig() {
    let (pool, _) = golden(
        "dgx-h100-dynamic-mig",
        "dgx-h100",
        ValidationRules::V1_35,
        &["--dynamic-mig"],
        &[8],
    )
    .await;
    // 1.35: the counter sets' slice was written (and answered) before any
    // slice of devices consuming them.
    let version = |s: &Value| -> u64 {
        s["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("numeric resourceVersion")
    };
    let (counters, with_devices): (Vec<&Value>, Vec<&Value>) =
        pool.iter().partition(|s| s["spec"]["devices"].is_null());
    assert_eq!((counters.len(), with_devices.len()), (1, 4));
    let last_counters = counters.iter().map(|s| version(s)).max().unwrap();
    let first_devices = with_devices.iter().map(|s| version(s)).min().unwrap();
    assert!(
        last_counters < first_devices,
        "{last_counters} >= {first_devices}"
    );
}

#[tokio::test]
async fn dgx_a100_dynamic_mig() {
    golden(
        "dgx-a100-dynamic-mig",
        "dgx-a100",
        ValidationRules::V1_35,
        &["--dynamic-mig"],
        &[4],
    )
    .await;
}

#[tokio::test]
async fn mixed_dynamic_mig() {
    golden(
        "mixed-dynamic-mig",
        "mixed",
        ValidationRules::V1_35,
        &["--dynamic-mig"],
        &[1, 1, 1, 1],
    )
    .await;
}

#[tokio::test]
async fn dgx_h100_dynamic_mig_under_1_34_rules() {
    // MIG-off Hopper GPUs publish every placement; under 1.34 each GPU's
    // counter set shares a slice with the devices consuming it, and the test
    // API server's 1.34 validation accepts every slice.
    let (pool, _) = golden(
        "dgx-h100-dynamic-mig-1.34",
        "dgx-h100",
        ValidationRules::V1_34,
        &["--dynamic-mig", "--slice-rules", "1.34"],
        &[8],
    )
    .await;
    assert_eq!(devices(&pool).count(), 8 * 26);
    for slice in &pool {
        let spec = &slice["spec"];
        let sets: BTreeSet<&str> = spec["sharedCounters"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["name"].as_str())
            .collect();
        assert!(!sets.is_empty(), "every slice holds counter sets");
        for device in spec["devices"].as_array().unwrap() {
            for c in device["consumesCounters"].as_array().unwrap() {
                let set = c["counterSet"].as_str().unwrap();
                assert!(sets.contains(set), "{set} not in the device's slice");
            }
        }
    }
}

/// `--passthrough`: every whole GPU and its `gpu-vfio-<index>` sibling
/// consume all of the GPU's one-counter set, which sits in a slice of its
/// own under 1.35 rules.
#[tokio::test]
async fn pcie_a100_bridged_passthrough() {
    let (pool, _) = golden(
        "pcie-a100-bridged-passthrough",
        "pcie-a100-bridged",
        ValidationRules::V1_35,
        &["--passthrough"],
        &[2, 2],
    )
    .await;
    let names = device_names(&pool);
    for i in 0..4 {
        assert!(
            names.contains(format!("gpu-vfio-{i}").as_str()),
            "{names:?}"
        );
    }
    let consumed: BTreeMap<&str, &Value> = devices(&pool)
        .filter_map(|d| Some((d["name"].as_str()?, &d["consumesCounters"][0])))
        .collect();
    for i in 0..4 {
        assert_eq!(
            consumed[format!("gpu-{i}").as_str()],
            consumed[format!("gpu-vfio-{i}").as_str()]
        );
    }
}

/// `--passthrough` with dynamic MIG: the sibling consumes every counter the
/// full GPU does, so neither it nor any placement is allocated beside it.
#[tokio::test]
async fn dgx_h100_dynamic_mig_passthrough() {
    let (pool, _) = golden(
        "dgx-h100-dynamic-mig-passthrough",
        "dgx-h100",
        ValidationRules::V1_35,
        &["--dynamic-mig", "--passthrough"],
        &[8],
    )
    .await;
    let by_name: BTreeMap<&str, &Value> = devices(&pool)
        .filter_map(|d| Some((d["name"].as_str()?, d)))
        .collect();
    for i in 0..8 {
        let vfio = by_name
            .values()
            .find(|d| {
                d["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("gpu-vfio-"))
                    && d["attributes"]["uuid"]
                        == by_name[format!("gpu-{i}").as_str()]["attributes"]["uuid"]
            })
            .unwrap_or_else(|| panic!("no sibling of gpu-{i}"));
        assert_eq!(
            vfio["consumesCounters"],
            by_name[format!("gpu-{i}").as_str()]["consumesCounters"]
        );
    }
}

#[tokio::test]
async fn dgx_a100_dynamic_mig_under_1_34_rules() {
    golden(
        "dgx-a100-dynamic-mig-1.34",
        "dgx-a100",
        ValidationRules::V1_34,
        &["--dynamic-mig", "--slice-rules", "1.34"],
        &[4],
    )
    .await;
}

#[tokio::test]
async fn dgx_h100_memory_sharing() {
    // GPU 0 by index and GPU 3 by UUID are shared: published whole, without
    // their MIG placements; the other GPUs keep dynamic MIG.
    let (pool, log) = golden(
        "dgx-h100-memory-sharing",
        "dgx-h100",
        ValidationRules::V1_35,
        &[
            "--dynamic-mig",
            "--memory-sharing",
            "0,GPU-36f675cc-81e7-4ef5-a8e2-5d940ed90475,9",
        ],
        &[8],
    )
    .await;
    let shared: BTreeSet<&str> = devices(&pool)
        .filter(|d| d["allowMultipleAllocations"] == true)
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(shared, BTreeSet::from(["gpu-0", "gpu-3"]));
    let names = device_names(&pool);
    for minor in [0, 3] {
        let prefix = format!("gpu-{minor}-mig-");
        assert!(!names.iter().any(|n| n.starts_with(&prefix)), "{names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("gpu-1-mig-")));
    assert_eq!(names.len(), 2 + 6 * 26);
    // Index 9 names no GPU: one warning.
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("--memory-sharing names GPU 9, which this node does not publish"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
}

#[tokio::test]
async fn t4_inference_memory_sharing_under_1_34_rules() {
    let (pool, _) = golden(
        "t4-inference-memory-sharing-1.34",
        "t4-inference",
        ValidationRules::V1_34,
        &["--memory-sharing", "all", "--slice-rules", "1.34"],
        &[1, 1, 1, 1],
    )
    .await;
    assert_eq!(
        devices(&pool)
            .filter(|d| d["allowMultipleAllocations"] == true)
            .count(),
        4
    );
}

/// NVIDIA's consumable shares on the mixed node: every full GPU and the
/// static MIG device multi-allocatable, with NVIDIA's memory policy (steps
/// of 1Mi; default all of it in `memory` mode, none otherwise) and, for
/// `<N>`, a `shares` capacity of N taken 1 at a time.
async fn consumable_shares(mode: &str) -> Vec<Value> {
    let name = format!("mixed-consumable-shares-{mode}");
    let flag = format!("--consumable-shares={mode}");
    let (pool, _) = golden(&name, "mixed", ValidationRules::V1_35, &[&flag], &[1, 1, 1]).await;
    let names = device_names(&pool);
    assert_eq!(
        names,
        BTreeSet::from(["gpu-0", "gpu-1-mig-3g40gb-9-0", "gpu-2", "gpu-3"])
    );
    let q = |v: &Value| -> i128 {
        gpu_kubelet_plugin::devices::k8s::quantity_nanos(v.as_str().unwrap()).unwrap()
            / 1_000_000_000
    };
    for device in devices(&pool) {
        let name = device["name"].as_str().unwrap();
        assert_eq!(device["allowMultipleAllocations"], true, "{name}");
        let memory = &device["capacity"]["memory"];
        let policy = &memory["requestPolicy"];
        assert_eq!(q(&policy["validRange"]["step"]), 1 << 20, "{name}");
        assert_eq!(
            q(&policy["validRange"]["max"]),
            q(&memory["value"]),
            "{name}"
        );
        let default = if mode == "memory" {
            q(&memory["value"])
        } else {
            0
        };
        assert_eq!(q(&policy["default"]), default, "{name}");
        let shares = &device["capacity"]["shares"];
        if let Ok(n) = mode.parse::<i128>() {
            assert_eq!(q(&shares["value"]), n, "{name}");
            assert_eq!(q(&shares["requestPolicy"]["default"]), 1, "{name}");
            assert_eq!(
                q(&shares["requestPolicy"]["validRange"]["max"]),
                n,
                "{name}"
            );
        } else {
            assert!(shares.is_null(), "{name}");
        }
    }
    pool
}

#[tokio::test]
async fn mixed_consumable_shares_memory() {
    consumable_shares("memory").await;
}

#[tokio::test]
async fn mixed_consumable_shares_unlimited() {
    consumable_shares("unlimited").await;
}

#[tokio::test]
async fn mixed_consumable_shares_n() {
    consumable_shares("4").await;
}
