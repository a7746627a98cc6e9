//! Memory-fraction sharing from publication to allocation: the real plugin
//! (`gpu-kubelet-plugin`, started in-process from its command line, as
//! `gpu-dra-demo` starts it) publishes a pool with `--memory-sharing` to the
//! test API server (which validates every slice), and the project's allocator
//! (`gpu_dra_analysis::allocator`, the scheduler's rules) allocates claims asking
//! for `capacity.requests.memory` on the slices as stored: several claims
//! share one GPU, each consuming its request rounded up to the policy's
//! step, until its memory is used up.
//!
//! Here and not among the plugin's tests: the plugin does not depend on the
//! analysis crate, not even as a dev-dependency (no CEL in its build).

mod common;

use common::{DRIVER, Node, gpu_class, mig_class, published_on};
use gpu_dra_analysis::allocator::{Allocator, NodeAllocation, Outcome, SimulateOptions, Snapshot};
use gpu_kubelet_plugin::plugin::kube_client;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

/// A claim `name` with one request `gpu` for `exactly` (a JSON object).
fn request_claim(name: &str, exactly: &Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .unwrap()
}

/// A claim for one GPU with `memory` of its memory (none: no capacity
/// request), optionally restricted to multi-allocatable devices.
fn claim(name: &str, memory: Option<&str>, shared_only: bool) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": "gpu.nvidia.com"});
    if let Some(memory) = memory {
        exactly["capacity"] = json!({"requests": {"memory": memory}});
    }
    if shared_only {
        exactly["selectors"] = json!([{"cel": {"expression": "device.allowMultipleAllocations"}}]);
    }
    request_claim(name, &exactly)
}

/// `claim` with `allocation` recorded in its status.
fn allocated(mut claim: ResourceClaim, allocation: &NodeAllocation) -> ResourceClaim {
    claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(allocation.allocation_result()),
        ..Default::default()
    });
    claim
}

fn simulate(slices: &[ResourceSlice], allocated: &[ResourceClaim], c: &ResourceClaim) -> Outcome {
    let classes = [gpu_class()];
    let snapshot = Snapshot::new(slices, &classes, allocated);
    Allocator::new()
        .simulate(&snapshot, c, &SimulateOptions::default())
        .expect("the allocator gives a verdict")
}

/// Starts the plugin on t4-inference with `flags` and returns the stored
/// slices of its (complete) pool.
async fn published(flags: &[&str]) -> (Node, Vec<ResourceSlice>) {
    published_on("t4-inference", flags).await
}

const MIB: i128 = 1 << 20;

/// The first (and only) result of a satisfiable outcome: (device, share id,
/// consumed memory in MiB).
fn result(outcome: &Outcome) -> (String, Option<String>, Option<i128>) {
    let Some(allocations) = outcome.allocations() else {
        panic!("not allocated: {outcome:#?}");
    };
    let r = &allocations[0].results[0];
    (
        r.device.clone(),
        r.share_id.clone(),
        r.consumed_capacity.get("memory").map(|q| {
            gpu_kubelet_plugin::devices::k8s::quantity_nanos(&q.canonical()).unwrap()
                / 1_000_000_000
                / MIB
        }),
    )
}

#[tokio::test]
async fn claims_share_a_published_gpu_by_memory() {
    // T4: 15360 MiB; GPU 2 is shared.
    let (_node, slices) = published(&["--memory-sharing", "2"]).await;

    let mut taken: Vec<ResourceClaim> = Vec::new();
    let mut shares = Vec::new();
    // 7000Mi rounds up to 7168Mi (28 x 256Mi): two fit in 15360Mi.
    for name in ["a", "b"] {
        let c = claim(name, Some("7000Mi"), true);
        let out = simulate(&slices, &taken, &c);
        let (device, share, consumed) = result(&out);
        assert_eq!(device, "gpu-2");
        assert_eq!(consumed, Some(7168));
        shares.push(share.expect("a share id for a multi-allocatable device"));
        taken.push(allocated(c, &out.allocations().unwrap()[0]));
    }
    assert_ne!(shares[0], shares[1], "each allocation is its own share");

    // 1024Mi more fits (15360 - 2 x 7168 = 1024); then nothing is left.
    let c = claim("c", Some("1Gi"), true);
    let out = simulate(&slices, &taken, &c);
    assert_eq!(result(&out).2, Some(1024));
    taken.push(allocated(c, &out.allocations().unwrap()[0]));
    let out = simulate(&slices, &taken, &claim("d", Some("256Mi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");

    // A claim that names no memory on a fresh copy consumes the default 1Gi.
    let out = simulate(&slices, &[], &claim("e", None, true));
    assert_eq!(result(&out).2, Some(1024));

    // More than the GPU: the policy's max refuses it.
    let out = simulate(&slices, &[], &claim("f", Some("15361Mi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");

    // Unshared GPUs are still allocated whole, without a share.
    let out = simulate(&slices, &taken, &claim("g", None, false));
    let (device, share, consumed) = result(&out);
    assert_eq!(device, "gpu-0");
    assert_eq!((share, consumed), (None, None));
}

#[tokio::test]
async fn a_memory_request_on_an_unshared_pool_is_refused() {
    let (_node, slices) = published(&[]).await;
    let out = simulate(&slices, &[], &claim("a", Some("1Gi"), true));
    assert!(!out.is_satisfiable(), "{out:#?}");
    // Without the selector, a whole GPU is still allocated.
    let out = simulate(&slices, &[], &claim("b", None, false));
    assert_eq!(result(&out).0, "gpu-0");
}

/// A claim from `class` (`gpu.nvidia.com` or `mig.nvidia.com`) with
/// `requests` as its capacity requests (none: none named).
fn claim_of(name: &str, class: &str, requests: Option<Value>) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": class});
    if let Some(requests) = requests {
        exactly["capacity"] = json!({"requests": requests});
    }
    request_claim(name, &exactly)
}

/// Allocates `claims` one after the other on `slices`, each seeing the
/// ones before it; the outcomes, in order.
fn allocate_in_turn(slices: &[ResourceSlice], claims: Vec<ResourceClaim>) -> Vec<Outcome> {
    let classes = [gpu_class(), mig_class()];
    let mut taken: Vec<ResourceClaim> = Vec::new();
    let mut outcomes = Vec::new();
    for c in claims {
        let snapshot = Snapshot::new(slices, &classes, &taken);
        let out = Allocator::new()
            .simulate(&snapshot, &c, &SimulateOptions::default())
            .expect("the allocator gives a verdict");
        if let Some([first, ..]) = out.allocations() {
            taken.push(allocated(c, first));
        }
        outcomes.push(out);
    }
    outcomes
}

/// The devices the satisfiable outcomes were given, in order; `-` for an
/// unsatisfiable one.
fn devices_of(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| {
            o.allocations()
                .map_or("-".to_owned(), |a| a[0].results[0].device.clone())
        })
        .collect()
}

/// `--consumable-shares=memory`: NVIDIA's policy. A claim that names no
/// memory takes a whole GPU; named amounts share one GPU until its memory
/// is used up (steps of 1Mi, no rounding to 256Mi).
#[tokio::test]
async fn consumable_shares_memory_packs_by_memory_and_a_plain_claim_takes_it_all() {
    let (_node, slices) = published(&["--consumable-shares=memory"]).await;
    // T4: 15360 MiB each, four GPUs.
    let claims = vec![
        claim_of("a", "gpu.nvidia.com", Some(json!({"memory": "7000Mi"}))),
        claim_of("b", "gpu.nvidia.com", Some(json!({"memory": "8360Mi"}))),
        claim_of("c", "gpu.nvidia.com", Some(json!({"memory": "1Mi"}))),
    ];
    let out = allocate_in_turn(&slices, claims);
    // a and b fill gpu-0 exactly (7000 + 8360 = 15360); c goes elsewhere.
    assert_eq!(devices_of(&out), ["gpu-0", "gpu-0", "gpu-1"]);
    assert_eq!(result(&out[0]).2, Some(7000));
    assert!(result(&out[0]).1.is_some(), "a share id");
    // Plain claims take whole GPUs: four fit, the fifth does not.
    let plain: Vec<ResourceClaim> = (0..5)
        .map(|i| claim_of(&format!("p{i}"), "gpu.nvidia.com", None))
        .collect();
    let out = allocate_in_turn(&slices, plain);
    assert_eq!(devices_of(&out), ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "-"]);
    assert_eq!(result(&out[0]).2, Some(15360));
    // More than a GPU's memory is refused.
    let out = allocate_in_turn(
        &slices,
        vec![claim_of(
            "big",
            "gpu.nvidia.com",
            Some(json!({"memory": "15361Mi"})),
        )],
    );
    assert!(!out[0].is_satisfiable(), "{:#?}", out[0]);
}

/// `--consumable-shares=unlimited`: claims that name no memory consume none,
/// so any number share a GPU (oversubscription, as in NVIDIA's driver);
/// memory requests still add up to at most the GPU's memory.
#[tokio::test]
async fn consumable_shares_unlimited_oversubscribes_but_memory_still_adds_up() {
    let (_node, slices) = published(&["--consumable-shares=unlimited"]).await;
    let plain: Vec<ResourceClaim> = (0..20)
        .map(|i| claim_of(&format!("p{i}"), "gpu.nvidia.com", None))
        .collect();
    let out = allocate_in_turn(&slices, plain);
    assert!(out.iter().all(Outcome::is_satisfiable));
    assert_eq!(result(&out[0]).2, Some(0));
    let sized: Vec<ResourceClaim> = (0..5)
        .map(|i| {
            claim_of(
                &format!("s{i}"),
                "gpu.nvidia.com",
                Some(json!({"memory": "15Gi"})),
            )
        })
        .collect();
    let out = allocate_in_turn(&slices, sized);
    assert_eq!(devices_of(&out), ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "-"]);
}

/// `--consumable-shares=<N>`: at most N claims per device, each taking one
/// share unless it asks for more; on the mixed node also the static MIG
/// device.
#[tokio::test]
async fn consumable_shares_n_caps_the_claims_per_device() {
    let (_node, slices) = published_on("mixed", &["--consumable-shares=2"]).await;
    // mixed: gpu-0 (H100), gpu-2 and gpu-3 (L4) whole; one 3g.40gb on gpu-1.
    let claims: Vec<ResourceClaim> = (0..7)
        .map(|i| claim_of(&format!("g{i}"), "gpu.nvidia.com", None))
        .collect();
    let out = allocate_in_turn(&slices, claims);
    let mut got = devices_of(&out);
    assert_eq!(got.pop().as_deref(), Some("-"), "three GPUs x 2 shares");
    got.sort();
    assert_eq!(got, ["gpu-0", "gpu-0", "gpu-2", "gpu-2", "gpu-3", "gpu-3"]);
    // A claim asking for both shares has a device alone.
    let out = allocate_in_turn(
        &slices,
        vec![
            claim_of("two", "gpu.nvidia.com", Some(json!({"shares": "2"}))),
            claim_of("three", "gpu.nvidia.com", Some(json!({"shares": "3"}))),
        ],
    );
    assert!(out[0].is_satisfiable(), "{:#?}", out[0]);
    assert!(
        !out[1].is_satisfiable(),
        "more shares than N: {:#?}",
        out[1]
    );
    // The MIG device: two shares, not three.
    let claims: Vec<ResourceClaim> = (0..3)
        .map(|i| claim_of(&format!("m{i}"), "mig.nvidia.com", None))
        .collect();
    let out = allocate_in_turn(&slices, claims);
    assert_eq!(
        devices_of(&out),
        ["gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-0", "-"]
    );
}

/// The full path of two shares of one GPU in `--consumable-shares=memory`
/// mode: the allocator puts both on one published GPU, the claims with
/// those allocations go to the API server, and the kubelet simulator has
/// the real plugin prepare them: one MPS daemon, each claim with the limits
/// of its own share; unprepare stops the daemon after the last.
#[tokio::test]
async fn two_allocated_shares_are_prepared_with_the_limits_of_their_share() {
    use gpu_dra_sim::kubelet::{Claim, KubeletSim};
    use kube::api::{Api, Patch, PatchParams, PostParams};

    let (node, slices) = published(&["--consumable-shares=memory"]).await;
    let claims = vec![
        claim_of("share-a", "gpu.nvidia.com", Some(json!({"memory": "4Gi"}))),
        claim_of("share-b", "gpu.nvidia.com", Some(json!({"memory": "6Gi"}))),
    ];
    let outcomes = allocate_in_turn(&slices, claims.clone());
    assert_eq!(devices_of(&outcomes), ["gpu-0", "gpu-0"]);

    let root = node.dir.path();
    let client = kube_client(Some(&root.join("kubeconfig"))).await.unwrap();
    let api: Api<ResourceClaim> = Api::namespaced(client, "default");
    let mut refs = Vec::new();
    for (mut c, out) in claims.into_iter().zip(&outcomes) {
        let name = c.metadata.name.clone().unwrap();
        c.metadata.uid = None;
        let created = api.create(&PostParams::default(), &c).await.unwrap();
        let allocation = out.allocations().unwrap()[0].allocation_result();
        let status = json!({"status": {"allocation": allocation}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
        refs.push(Claim::new("default", name, created.metadata.uid.unwrap()));
    }
    let socket = root.join("reg").join(format!("{DRIVER}-reg.sock"));
    let kubelet = KubeletSim::new().register(&socket).await.unwrap();
    let prepared = kubelet.prepare(&refs).await.unwrap();
    let mps = root.join("plugins").join(DRIVER).join("mps");
    let daemons = || std::fs::read_dir(&mps).map_or(0, Iterator::count);
    assert_eq!(daemons(), 1, "one MPS daemon for the GPU");
    for (c, (limit, percent)) in refs.iter().zip([("4096M", 26), ("6144M", 40)]) {
        let r = &prepared[&c.uid];
        assert_eq!(r.error, None, "{r:?}");
        assert_eq!(r.devices[0].device_name, "gpu-0");
        assert!(r.devices[0].share_id.is_some(), "{r:?}");
        let spec: Value = serde_json::from_slice(
            &std::fs::read(
                root.join("cdi")
                    .join(format!("k8s.{DRIVER}-claim_{}.json", c.uid)),
            )
            .unwrap(),
        )
        .unwrap();
        let env: Vec<&str> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| d["containerEdits"]["env"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        assert!(
            env.contains(&format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limit}").as_str()),
            "{env:?}"
        );
        assert!(
            env.contains(&format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}").as_str()),
            "{env:?}"
        );
    }
    let done = kubelet.unprepare(&refs[..1]).await.unwrap();
    assert_eq!(done[&refs[0].uid].error, None);
    assert_eq!(daemons(), 1, "share-b still uses the daemon");
    let done = kubelet.unprepare(&refs[1..]).await.unwrap();
    assert_eq!(done[&refs[1].uid].error, None);
    assert_eq!(daemons(), 0, "stopped after the last share");
}
