//! The real kube-scheduler against our allocator simulation (`gpu-dra
//! simulate`): each claim of a varied set (whole GPUs, NVLink pairs, MIG
//! profiles and pairs, memory shares of the shared GPU, attribute and
//! capacity selectors, `allocationMode: All`, prioritized lists, and claims
//! no node can satisfy) is first simulated against the live cluster, then
//! given to the scheduler in a pod, one claim at a time (each pod and claim
//! is deleted before the next, so every claim meets the same pool). They
//! must agree both ways:
//!
//! - a claim simulate calls satisfiable is scheduled, and the scheduler's
//!   placement is one our allocator accepts: `simulate` over the node's
//!   slices reduced to the devices the scheduler chose (and no other
//!   claims) must be satisfiable with exactly those devices, for the same
//!   requests, with the same consumed capacity;
//! - a claim simulate calls unsatisfiable stays unschedulable: the pod gets
//!   the `PodScheduled=False/Unschedulable` condition within 30 s and the
//!   claim no allocation.
//!
//! Other engineers' claims share the node, so a verdict can change between
//! the simulation and the scheduling; each apparent disagreement is checked
//! again with a fresh simulation, and only one that persists fails the
//! test (a changed pool retries the claim once). Independent of that
//! traffic, every claim is also simulated on the idle node (the cluster's
//! slices, no allocations), which must give the verdict the case expects.
//!
//! The `gpu-dra` binary is taken from `GPU_DRA_BIN`, else from the target
//! folder (`cargo build -p gpu-dra --bin gpu-dra` makes it); the test does
//! not build it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_dra_api::quantity::Quantity;
use libtest_mimic::Failed;
use serde_json::{Value, json};

use crate::claims::{check_pod, get_json};
use crate::harness::{Cluster, MEMORY_SHARED_GPU};

pub const TESTS: [(&str, crate::Test); 2] = [
    (
        "simulate::placements_of_the_scheduler_are_accepted_by_simulate",
        satisfiable_claims,
    ),
    (
        "simulate::claims_simulate_refuses_stay_unschedulable",
        unsatisfiable_claims,
    ),
];

/// How long a claim simulate calls satisfiable may take to be scheduled.
const SCHEDULE_LIMIT: Duration = Duration::from_secs(90);
/// How long the scheduler has to call a pod unschedulable.
const UNSCHEDULABLE_LIMIT: Duration = Duration::from_secs(30);
/// Deleting a pod (kubelet unprepares its claims) or a claim.
const DELETE_LIMIT: &str = "--timeout=180s";

/// What simulate or the expectation says of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Satisfiable,
    Unsatisfiable,
}

/// One claim of the set: its name and the YAML of its `spec.devices`
/// (indented for it), and what it gives on an idle node.
struct Case {
    name: &'static str,
    devices: String,
    idle: Verdict,
}

/// One allocated device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Placed {
    request: String,
    device: String,
    /// Consumed capacity, in the base unit (bytes, cores).
    consumed: BTreeMap<String, i128>,
}

/// An answer of `gpu-dra simulate`.
#[derive(Debug, Clone)]
struct Simulation {
    verdict: Verdict,
    placed: Vec<Placed>,
    /// The explanation's summary when unsatisfiable.
    why: String,
}

/// What the scheduler did with the pod.
#[derive(Debug, Clone)]
enum Scheduled {
    /// Bound, with the claim's allocation.
    Placed(Vec<Placed>),
    /// `PodScheduled=False`, reason `Unschedulable`; the condition's message.
    Unschedulable(String),
}

/// A quantity in its base unit (`1Gi`, `1073741824`; `500m` is refused: the
/// capacities here are whole), by the project's one quantity parser.
fn quantity(q: &str) -> Option<i128> {
    Quantity::parse(q.trim())
        .ok()
        .filter(Quantity::is_whole)
        .map(|q| q.ceil_units())
}

/// The `(request, device, consumed capacity)` of allocation results
/// (`status.allocation.devices.results`, or simulate's).
fn placed_of(results: &Value) -> Result<Vec<Placed>, String> {
    let mut out = Vec::new();
    for r in results.as_array().into_iter().flatten() {
        let mut consumed = BTreeMap::new();
        for (k, v) in r["consumedCapacity"].as_object().into_iter().flatten() {
            let text = v.as_str().unwrap_or_default();
            let n = quantity(text).ok_or_else(|| format!("consumed {k}: bad quantity {v}"))?;
            consumed.insert(k.clone(), n);
        }
        out.push(Placed {
            request: r["request"].as_str().unwrap_or_default().to_owned(),
            device: r["device"].as_str().unwrap_or_default().to_owned(),
            consumed,
        });
    }
    out.sort();
    Ok(out)
}

fn devices_of(placed: &[Placed]) -> BTreeSet<&str> {
    placed.iter().map(|p| p.device.as_str()).collect()
}

fn shown(placed: &[Placed]) -> String {
    let parts: Vec<String> = placed
        .iter()
        .map(|p| {
            if p.consumed.is_empty() {
                format!("{}={}", p.request, p.device)
            } else {
                format!("{}={} {:?}", p.request, p.device, p.consumed)
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

// ---------------------------------------------------------------- gpu-dra

/// The `gpu-dra` binary ([`gpu_dra_e2e::bins::gpu_dra`]).
fn gpu_dra() -> Result<PathBuf, Failed> {
    gpu_dra_e2e::bins::gpu_dra().map_err(Failed::from)
}

/// Runs `gpu-dra simulate --output json` with `args`; its answer.
fn simulate(bin: &Path, claim: &Path, args: &[&str]) -> Result<Simulation, Failed> {
    let out = Command::new(bin)
        .arg("simulate")
        .arg("--claim")
        .arg(claim)
        .args(args)
        .args(["--output", "json"])
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let code = out.status.code();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !matches!(code, Some(0 | 1)) {
        return Err(format!(
            "gpu-dra simulate --claim {} {args:?} gave no verdict (exit {code:?}):\n{stderr}{stdout}",
            claim.display()
        )
        .into());
    }
    let report: Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("gpu-dra simulate printed no JSON ({e}):\n{stdout}"))?;
    let satisfiable = report["satisfiable"].as_bool() == Some(true);
    if satisfiable != (code == Some(0)) {
        return Err(format!("exit status {code:?} contradicts the report:\n{stdout}").into());
    }
    let results = report["allocations"][0]["results"].clone();
    Ok(Simulation {
        verdict: if satisfiable {
            Verdict::Satisfiable
        } else {
            Verdict::Unsatisfiable
        },
        placed: placed_of(&results)?,
        why: report["explanation"]["summary"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

fn simulate_live(c: &Cluster, bin: &Path, claim: &Path) -> Result<Simulation, Failed> {
    let kubeconfig = c.kubeconfig.to_string_lossy().into_owned();
    simulate(bin, claim, &["--kubeconfig", &kubeconfig])
}

/// The cluster's ResourceSlices and DeviceClasses, as one `List`.
fn cluster_state(c: &Cluster) -> Result<Value, Failed> {
    let slices = get_json(c, "default", &["resourceslices"])?;
    let classes = get_json(c, "default", &["deviceclasses"])?;
    let mut items = slices["items"].as_array().cloned().unwrap_or_default();
    items.extend(classes["items"].as_array().cloned().unwrap_or_default());
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// `state` with only the devices of `keep` (every slice and counter set stays,
/// so that the pools are complete).
fn only_devices(state: &Value, keep: &BTreeSet<&str>) -> Value {
    let mut state = state.clone();
    for item in state["items"].as_array_mut().into_iter().flatten() {
        if item["kind"] != "ResourceSlice" {
            continue;
        }
        if let Some(devices) = item
            .pointer_mut("/spec/devices")
            .and_then(Value::as_array_mut)
        {
            devices.retain(|d| keep.contains(d["name"].as_str().unwrap_or_default()));
        }
    }
    state
}

/// Simulates `claim` offline against `state` written to `file`.
fn simulate_offline(
    bin: &Path,
    claim: &Path,
    state: &Value,
    file: &Path,
) -> Result<Simulation, Failed> {
    std::fs::write(file, serde_json::to_vec(state).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let slices = file.to_string_lossy().into_owned();
    simulate(bin, claim, &["--slices", &slices])
}

// ---------------------------------------------------------------- scheduler

fn claim_yaml(ns: &str, name: &str, devices: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  devices:\n{devices}"
    )
}

/// Waits until the scheduler binds pod `pod` or calls it unschedulable
/// (then, with `settle`, keeps watching for `settle` more in case a retry
/// binds it); `None` when neither happened within `limit`.
fn scheduler_outcome(
    c: &Cluster,
    ns: &str,
    pod: &str,
    claim: &str,
    limit: Duration,
    settle: Duration,
) -> Result<Option<Scheduled>, Failed> {
    let start = Instant::now();
    let mut unschedulable_since: Option<(Instant, String)> = None;
    loop {
        let p = get_json(c, ns, &["pod", pod])?;
        if p["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            // Bound: the claim was allocated before the binding.
            let claim = get_json(c, ns, &["resourceclaim", claim])?;
            let results = &claim["status"]["allocation"]["devices"]["results"];
            return Ok(Some(Scheduled::Placed(placed_of(results)?)));
        }
        let condition = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|k| k["type"] == "PodScheduled")
            .cloned()
            .unwrap_or(Value::Null);
        if condition["status"] == "False" && condition["reason"] == "Unschedulable" {
            let message = condition["message"].as_str().unwrap_or_default().to_owned();
            let since = unschedulable_since
                .get_or_insert_with(|| (Instant::now(), message.clone()))
                .0;
            if since.elapsed() >= settle {
                return Ok(Some(Scheduled::Unschedulable(message)));
            }
        } else if condition["status"] == "False" {
            return Err(format!(
                "pod {ns}/{pod}: the scheduler failed ({}): {}",
                condition["reason"], condition["message"]
            )
            .into());
        }
        if start.elapsed() > limit {
            return Ok(unschedulable_since.map(|(_, m)| Scheduled::Unschedulable(m)));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Deletes pod and claim (waiting for the kubelet to unprepare), so that
/// the next claim meets the same pool.
fn remove(c: &Cluster, ns: &str, pod: &str, claim: &str) -> Result<(), Failed> {
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        ns,
        pod,
        "--ignore-not-found",
        "--wait=true",
        DELETE_LIMIT,
    ])?;
    c.kubectl(&[
        "delete",
        "resourceclaim",
        "-n",
        ns,
        claim,
        "--ignore-not-found",
        "--wait=true",
        DELETE_LIMIT,
    ])?;
    Ok(())
}

// ---------------------------------------------------------------- the check

/// The outcome of one claim.
enum Finding {
    /// Both said the same; what.
    Agree(String),
    /// A disagreement that persisted.
    Disagree(String),
    /// The pool changed under the check (other claims); retried.
    Changed(String),
}

/// Checks that the scheduler's placement is one our allocator accepts: the
/// claim alone on the node reduced to the scheduler's devices.
fn check_placement(
    bin: &Path,
    claim_file: &Path,
    state: &Value,
    dir: &Path,
    placed: &[Placed],
) -> Result<Option<String>, Failed> {
    let reduced = only_devices(state, &devices_of(placed));
    let check = simulate_offline(bin, claim_file, &reduced, &dir.join("reduced.json"))?;
    if check.verdict != Verdict::Satisfiable {
        return Ok(Some(format!(
            "the scheduler allocated {} but our allocator refuses those devices: {}",
            shown(placed),
            check.why
        )));
    }
    if check.placed != placed {
        return Ok(Some(format!(
            "the scheduler allocated {}; on those devices alone our allocator allocates {}",
            shown(placed),
            shown(&check.placed)
        )));
    }
    Ok(None)
}

/// Runs one claim through simulate and the scheduler (one attempt).
fn attempt(
    c: &Cluster,
    bin: &Path,
    ns: &str,
    dir: &Path,
    case: &Case,
    state: &Value,
) -> Result<Finding, Failed> {
    let claim_file = dir.join(format!("{}.yaml", case.name));
    std::fs::write(&claim_file, claim_yaml(ns, case.name, &case.devices))
        .map_err(|e| format!("{}: {e}", claim_file.display()))?;
    let pod = format!("sim-{}", case.name);
    remove(c, ns, &pod, case.name)?;
    let before = simulate_live(c, bin, &claim_file)?;
    c.apply(ns, &claim_yaml(ns, case.name, &case.devices))
        .map_err(|e| format!("claim {}: {e}", case.name))?;
    c.apply(
        ns,
        &check_pod(
            &pod,
            &[("gpus", &format!("resourceClaimName: {}", case.name))],
        ),
    )?;
    let (limit, settle) = match before.verdict {
        Verdict::Satisfiable => (SCHEDULE_LIMIT, SCHEDULE_LIMIT / 2),
        Verdict::Unsatisfiable => (UNSCHEDULABLE_LIMIT, Duration::ZERO),
    };
    let outcome = scheduler_outcome(c, ns, &pod, case.name, limit, settle)?;
    let finding = match (before.verdict, outcome) {
        (_, None) => Finding::Disagree(format!(
            "the scheduler neither bound pod {pod} nor called it unschedulable within {limit:?} \
             (simulate: {:?})",
            before.verdict
        )),
        (Verdict::Satisfiable, Some(Scheduled::Placed(placed))) => {
            if let Some(problem) = check_placement(bin, &claim_file, state, dir, &placed)? {
                Finding::Disagree(problem)
            } else {
                let order = if devices_of(&placed) == devices_of(&before.placed) {
                    String::new()
                } else {
                    format!(" (simulate had picked {})", shown(&before.placed))
                };
                Finding::Agree(format!("scheduled: {}{order}", shown(&placed)))
            }
        }
        (Verdict::Unsatisfiable, Some(Scheduled::Unschedulable(message))) => {
            let claim = get_json(c, ns, &["resourceclaim", case.name])?;
            if claim["status"]["allocation"].is_null() {
                Finding::Agree(format!(
                    "unschedulable: {message}; simulate: {}",
                    before.why
                ))
            } else {
                Finding::Disagree(format!(
                    "pod unschedulable but the claim is allocated: {}",
                    claim["status"]["allocation"]
                ))
            }
        }
        (Verdict::Satisfiable, Some(Scheduled::Unschedulable(message))) => {
            // Simulate again: the claim itself is left out of the pool.
            let now = simulate_live(c, bin, &claim_file)?;
            if now.verdict == Verdict::Satisfiable {
                Finding::Disagree(format!(
                    "simulate says satisfiable ({}) but the scheduler keeps the pod unschedulable: \
                     {message}",
                    shown(&now.placed)
                ))
            } else {
                Finding::Changed(format!(
                    "simulate said satisfiable, then unsatisfiable ({}): the pool changed",
                    now.why
                ))
            }
        }
        (Verdict::Unsatisfiable, Some(Scheduled::Placed(placed))) => {
            let now = simulate_live(c, bin, &claim_file)?;
            let problem = check_placement(bin, &claim_file, state, dir, &placed)?;
            if now.verdict == Verdict::Unsatisfiable {
                Finding::Disagree(format!(
                    "simulate says unsatisfiable ({}) but the scheduler allocated {}{}",
                    now.why,
                    shown(&placed),
                    problem.map(|p| format!("; {p}")).unwrap_or_default()
                ))
            } else {
                Finding::Changed(format!(
                    "simulate said unsatisfiable ({}), then satisfiable: the pool changed",
                    before.why
                ))
            }
        }
    };
    remove(c, ns, &pod, case.name)?;
    Ok(finding)
}

/// Runs every case; fails with each disagreement.
fn run_cases(c: &Cluster, ns: &str, cases: &[Case]) -> Result<(), Failed> {
    let bin = gpu_dra()?;
    c.fresh_namespace(ns)?;
    let result = check_cases(c, &bin, ns, cases);
    // Also after an error: a pod left behind would hold devices.
    let cleaned = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    let (problems, agreed) = result?;
    cleaned?;
    if problems.is_empty() && agreed == cases.len() {
        eprintln!("{agreed} claims: simulate and the scheduler agree");
        Ok(())
    } else {
        Err(format!(
            "simulate and the scheduler disagree ({agreed} of {} claims agree):\n{}",
            cases.len(),
            problems.join("\n")
        )
        .into())
    }
}

/// Checks every case in namespace `ns`; the problems found and how many
/// cases agreed.
fn check_cases(
    c: &Cluster,
    bin: &Path,
    ns: &str,
    cases: &[Case],
) -> Result<(Vec<String>, usize), Failed> {
    let dir = tempfile::tempdir().map_err(|e| format!("temporary folder: {e}"))?;
    let state = cluster_state(c)?;
    let mut problems = Vec::new();
    let mut agreed = 0;
    for case in cases {
        // On the idle node (the slices alone) the verdict is the case's own.
        let claim_file = dir.path().join(format!("{}.yaml", case.name));
        std::fs::write(&claim_file, claim_yaml(ns, case.name, &case.devices))
            .map_err(|e| format!("{}: {e}", claim_file.display()))?;
        let idle = simulate_offline(bin, &claim_file, &state, &dir.path().join("idle.json"))?;
        if idle.verdict != case.idle {
            problems.push(format!(
                "{}: on the idle node simulate says {:?}, the case expects {:?} ({})",
                case.name, idle.verdict, case.idle, idle.why
            ));
        }
        let mut finding = attempt(c, bin, ns, dir.path(), case, &state)?;
        if let Finding::Changed(why) = &finding {
            eprintln!("{}: {why}; once more", case.name);
            finding = attempt(c, bin, ns, dir.path(), case, &state)?;
        }
        match finding {
            Finding::Agree(what) => {
                agreed += 1;
                eprintln!("{}: agree, {what}", case.name);
            }
            Finding::Disagree(what) => problems.push(format!("{}: {what}", case.name)),
            Finding::Changed(what) => problems.push(format!(
                "{}: no verdict, the pool kept changing under the check: {what}",
                case.name
            )),
        }
    }
    Ok((problems, agreed))
}

// ---------------------------------------------------------------- the claims

/// A request `gpu` of `class` with `count`, the CEL `selectors` and `extra`
/// lines (indented for the request).
fn exactly(class: &str, count: Option<u32>, selectors: &[&str], extra: &str) -> String {
    let mut out = format!("    - name: gpu\n      exactly:\n        deviceClassName: {class}\n");
    if let Some(n) = count {
        let _ = writeln!(out, "        count: {n}");
    }
    if !selectors.is_empty() {
        out.push_str("        selectors:\n");
        for s in selectors {
            let _ = writeln!(
                out,
                "        - cel: {{expression: {}}}",
                serde_json::to_string(s).expect("a string")
            );
        }
    }
    out.push_str(extra);
    format!("    requests:\n{out}")
}

const EXCLUSIVE: &str = "!device.allowMultipleAllocations";
const SHARED: &str = "device.allowMultipleAllocations";

fn profile(p: &str) -> String {
    format!("device.attributes['gpu.nvidia.com'].profile == '{p}'")
}

fn satisfiable() -> Vec<Case> {
    use Verdict::Satisfiable as S;
    let case = |name, devices: String| Case {
        name,
        devices,
        idle: S,
    };
    vec![
        case(
            "whole-1",
            exactly("gpu.nvidia.com", None, &[EXCLUSIVE], ""),
        ),
        case(
            "whole-2",
            exactly("gpu.nvidia.com", Some(2), &[EXCLUSIVE], ""),
        ),
        case(
            "whole-3",
            exactly("gpu.nvidia.com", Some(3), &[EXCLUSIVE], ""),
        ),
        // The memory-shared GPU too: a whole-device allocation of it takes
        // the default share.
        case("whole-4", exactly("gpu.nvidia.com", Some(4), &[], "")),
        case(
            "nvlink-pair",
            format!(
                "{}    constraints:\n    - matchAttribute: gpu.nvidia.com/nvlinkDomain\n",
                exactly("nvlink.gpu.nvidia.com", Some(2), &[EXCLUSIVE], "")
            ),
        ),
        case(
            "distinct-pair",
            format!(
                "{}    constraints:\n    - distinctAttribute: gpu.nvidia.com/uuid\n",
                exactly("gpu.nvidia.com", Some(2), &[EXCLUSIVE], "")
            ),
        ),
        case(
            "mig-1g10gb",
            exactly("1g.10gb.mig.nvidia.com", None, &[], ""),
        ),
        case(
            "mig-3g40gb-pair",
            exactly("mig.nvidia.com", Some(2), &[&profile("3g.40gb")], ""),
        ),
        case(
            "mig-7g80gb",
            exactly("mig.nvidia.com", None, &[&profile("7g.80gb")], ""),
        ),
        // Two profiles that fill one GPU: the counters must fit together.
        case(
            "mig-4g-and-3g-same-gpu",
            "    requests:\n\
             \x20   - name: big\n      exactly:\n        deviceClassName: mig.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.attributes['gpu.nvidia.com'].profile == '4g.40gb'\"}\n\
             \x20   - name: small\n      exactly:\n        deviceClassName: mig.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.attributes['gpu.nvidia.com'].profile == '3g.40gb'\"}\n\
             \x20   constraints:\n    - matchAttribute: gpu.nvidia.com/parentUUID\n"
                .to_owned(),
        ),
        case(
            "memory-share-10gi",
            exactly(
                "gpu.nvidia.com",
                None,
                &[SHARED],
                "        capacity: {requests: {memory: 10Gi}}\n",
            ),
        ),
        // Rounded up to the policy's next step (256Mi).
        case(
            "memory-share-1000mi",
            exactly(
                "gpu.nvidia.com",
                None,
                &[SHARED],
                "        capacity: {requests: {memory: 1000Mi}}\n",
            ),
        ),
        case(
            "memory-share-by-index",
            exactly(
                "gpu.nvidia.com",
                None,
                &[&format!(
                    "device.attributes['gpu.nvidia.com'].index == {MEMORY_SHARED_GPU}"
                )],
                "        capacity: {requests: {memory: 40Gi}}\n",
            ),
        ),
        // Two requests of one claim may each take a share of the shared GPU.
        case(
            "two-shares-in-two-requests",
            "    requests:\n\
             \x20   - name: a\n      exactly:\n        deviceClassName: gpu.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.allowMultipleAllocations\"}\n\
             \x20       capacity: {requests: {memory: 10Gi}}\n\
             \x20   - name: b\n      exactly:\n        deviceClassName: gpu.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.allowMultipleAllocations\"}\n\
             \x20       capacity: {requests: {memory: 10Gi}}\n"
                .to_owned(),
        ),
        case(
            "selectors-product-memory-cc",
            exactly(
                "gpu.nvidia.com",
                Some(2),
                &[
                    EXCLUSIVE,
                    "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('a100')",
                    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0",
                    "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.0.0')) >= 0",
                ],
                "",
            ),
        ),
        case(
            "all-of-index-5-and-6",
            exactly(
                "gpu.nvidia.com",
                None,
                &[
                    EXCLUSIVE,
                    "device.attributes['gpu.nvidia.com'].index >= 5",
                ],
                "        allocationMode: All\n",
            ),
        ),
        case(
            "first-available-falls-back-to-mig",
            "    requests:\n    - name: gpu\n      firstAvailable:\n\
             \x20     - name: huge\n        deviceClassName: gpu.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Ti')) >= 0\"}\n\
             \x20     - name: mig\n        deviceClassName: mig.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.attributes['gpu.nvidia.com'].profile == '2g.20gb'\"}\n"
                .to_owned(),
        ),
        case(
            "first-available-fewer-gpus",
            "    requests:\n    - name: gpu\n      firstAvailable:\n\
             \x20     - name: four\n        deviceClassName: gpu.nvidia.com\n        count: 4\n\
             \x20       selectors:\n        - cel: {expression: \"!device.allowMultipleAllocations\"}\n\
             \x20     - name: two\n        deviceClassName: gpu.nvidia.com\n        count: 2\n\
             \x20       selectors:\n        - cel: {expression: \"!device.allowMultipleAllocations\"}\n"
                .to_owned(),
        ),
    ]
}

fn unsatisfiable() -> Vec<Case> {
    use Verdict::Unsatisfiable as U;
    let case = |name, devices: String| Case {
        name,
        devices,
        idle: U,
    };
    vec![
        case(
            "too-much-memory",
            exactly(
                "gpu.nvidia.com",
                None,
                &["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('256Gi')) >= 0"],
                "",
            ),
        ),
        case("count-9", exactly("gpu.nvidia.com", Some(9), &[], "")),
        case("count-5", exactly("gpu.nvidia.com", Some(5), &[], "")),
        case(
            "exclusive-4",
            exactly("gpu.nvidia.com", Some(4), &[EXCLUSIVE], ""),
        ),
        case(
            "mig-profile-the-gpus-lack",
            exactly("mig.nvidia.com", None, &[&profile("1g.12gb")], ""),
        ),
        case(
            "mig-7g80gb-times-5",
            exactly("mig.nvidia.com", Some(5), &[&profile("7g.80gb")], ""),
        ),
        case(
            "mig-two-7g-on-one-gpu",
            format!(
                "{}    constraints:\n    - matchAttribute: gpu.nvidia.com/parentUUID\n",
                exactly("mig.nvidia.com", Some(2), &[&profile("7g.80gb")], "")
            ),
        ),
        case(
            "pair-on-one-pci-bus",
            format!(
                "{}    constraints:\n    - matchAttribute: resource.kubernetes.io/pciBusID\n",
                exactly("gpu.nvidia.com", Some(2), &[], "")
            ),
        ),
        case(
            "pair-in-distinct-nvlink-domains",
            format!(
                "{}    constraints:\n    - distinctAttribute: gpu.nvidia.com/nvlinkDomain\n",
                exactly("gpu.nvidia.com", Some(2), &[], "")
            ),
        ),
        // One request takes a device once, also one that allows multiple
        // allocations: two shares of the one shared GPU need two requests.
        case(
            "two-shares-in-one-request",
            exactly(
                "gpu.nvidia.com",
                Some(2),
                &[SHARED],
                "        capacity: {requests: {memory: 10Gi}}\n",
            ),
        ),
        case(
            "hopper-or-newer",
            exactly("hopper-or-newer.gpu.nvidia.com", None, &[], ""),
        ),
        case(
            "memory-share-over-the-range",
            exactly(
                "gpu.nvidia.com",
                None,
                &[SHARED],
                "        capacity: {requests: {memory: 81Gi}}\n",
            ),
        ),
        case(
            "first-available-none-fits",
            "    requests:\n    - name: gpu\n      firstAvailable:\n\
             \x20     - name: nine\n        deviceClassName: gpu.nvidia.com\n        count: 9\n\
             \x20     - name: odd-mig\n        deviceClassName: mig.nvidia.com\n\
             \x20       selectors:\n        - cel: {expression: \"device.attributes['gpu.nvidia.com'].profile == '1g.12gb'\"}\n"
                .to_owned(),
        ),
    ]
}

// The cases are written for the dynamic-MIG pool (the MIG test switches the
// suite's cluster to it before these run); asked for here too, so that each
// test also runs alone.
fn satisfiable_claims(c: &Cluster) -> Result<(), Failed> {
    crate::claims::set_dynamic_mig(c, true)?;
    run_cases(c, "e2e-sim-fit", &satisfiable())
}

fn unsatisfiable_claims(c: &Cluster) -> Result<(), Failed> {
    crate::claims::set_dynamic_mig(c, true)?;
    run_cases(c, "e2e-sim-unfit", &unsatisfiable())
}
