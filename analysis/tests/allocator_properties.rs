//! Property tests: random pools (counters, multi-allocatable devices with
//! request policies, taints) and random claims (counts, `All`,
//! `firstAvailable`, capacity requests, admin access, constraints).
//!
//! An independent checker written here from the rules (not from the
//! allocator's code) validates every allocation the simulation returns, and
//! a brute-force search over all device choices decides small cases: the
//! simulation must agree with it both ways.

mod allocator_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;

use allocator_support::{DRIVER, allocated};
use gpu_dra_analysis::allocator::{AllocError, Allocator, Outcome, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use proptest::prelude::*;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum PolicySpec {
    /// `validValues` 2, 4, 8 with default 2.
    Values,
    /// `validRange` min 1, step 2, max 7, no default.
    Range,
}

#[derive(Debug, Clone)]
struct DevSpec {
    color: Option<i64>,
    kind: &'static str,
    mem: i64,
    multi: bool,
    policy: Option<PolicySpec>,
    /// (counter set, counter, amount)
    consumes: Vec<(usize, &'static str, i64)>,
    tainted: bool,
}

#[derive(Debug, Clone)]
struct PoolSpec {
    /// `None`: available on all nodes.
    node: Option<&'static str>,
    /// Counter sets: (mem, slots) totals.
    sets: Vec<(i64, i64)>,
    devices: Vec<DevSpec>,
    /// Counters in a slice of their own (1.35 style) or next to devices.
    separate_counters: bool,
}

#[derive(Debug, Clone, Copy)]
enum Sel {
    ColorAtLeast(i64),
    KindIs(&'static str),
    MemAtLeast(i64),
}

impl Sel {
    fn expression(self) -> String {
        match self {
            Sel::ColorAtLeast(n) => {
                format!("device.attributes['{DRIVER}'].?color.orValue(-1) >= {n}")
            }
            Sel::KindIs(k) => format!("device.attributes['{DRIVER}'].kind == '{k}'"),
            Sel::MemAtLeast(n) => {
                format!("device.capacity['{DRIVER}'].mem.compareTo(quantity('{n}')) >= 0")
            }
        }
    }

    fn eval(self, d: &DevSpec) -> bool {
        match self {
            Sel::ColorAtLeast(n) => d.color.unwrap_or(-1) >= n,
            Sel::KindIs(k) => d.kind == k,
            Sel::MemAtLeast(n) => d.mem >= n,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Gpu,
    KindA,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Gpu => "gpu",
            Class::KindA => "kind-a",
        }
    }

    fn eval(self, d: &DevSpec) -> bool {
        match self {
            Class::Gpu => true,
            Class::KindA => d.kind == "a",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ModeSpec {
    Count(usize),
    All,
}

#[derive(Debug, Clone)]
struct VarSpec {
    class: Class,
    sel: Option<Sel>,
    mode: ModeSpec,
    admin: bool,
    mem_request: Option<i64>,
    tolerate: bool,
}

#[derive(Debug, Clone)]
struct ReqSpec {
    variants: Vec<VarSpec>,
}

#[derive(Debug, Clone)]
struct ConstraintSpec {
    distinct: bool,
    /// Only the first request, or all.
    first_only: bool,
}

#[derive(Debug, Clone)]
struct ClaimSpec {
    requests: Vec<ReqSpec>,
    constraints: Vec<ConstraintSpec>,
}

// ---------------------------------------------------------------------------
// To Kubernetes objects
// ---------------------------------------------------------------------------

fn pool_name(p: usize) -> String {
    format!("pool-{p}")
}

fn dev_name(i: usize) -> String {
    format!("dev-{i}")
}

fn slices(pools: &[PoolSpec]) -> Vec<ResourceSlice> {
    let mut out = Vec::new();
    for (p, pool) in pools.iter().enumerate() {
        let devices: Vec<Value> = pool
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut attributes = json!({"type": {"string": "gpu"}, "kind": {"string": d.kind}});
                if let Some(c) = d.color {
                    attributes["color"] = json!({"int": c});
                }
                let mut mem = json!({"value": d.mem.to_string()});
                match &d.policy {
                    Some(PolicySpec::Values) => {
                        mem["requestPolicy"] = json!({"default": "2", "validValues": ["2", "4", "8"]});
                    }
                    Some(PolicySpec::Range) => {
                        mem["requestPolicy"] = json!({"validRange": {"min": "1", "step": "2", "max": "7"}});
                    }
                    None => {}
                }
                let mut device = json!({"name": dev_name(i), "attributes": attributes, "capacity": {"mem": mem}});
                if d.multi {
                    device["allowMultipleAllocations"] = json!(true);
                }
                if !d.consumes.is_empty() {
                    let mut sums: BTreeMap<usize, BTreeMap<&str, i64>> = BTreeMap::new();
                    for (set, counter, amount) in &d.consumes {
                        *sums.entry(*set).or_default().entry(counter).or_default() += amount;
                    }
                    let by_set: BTreeMap<usize, serde_json::Map<String, Value>> = sums
                        .into_iter()
                        .map(|(set, counters)| {
                            let map = counters
                                .into_iter()
                                .map(|(c, a)| (c.to_owned(), json!({"value": a.to_string()})))
                                .collect();
                            (set, map)
                        })
                        .collect();
                    device["consumesCounters"] = Value::Array(
                        by_set
                            .into_iter()
                            .map(|(set, counters)| json!({"counterSet": format!("set-{set}"), "counters": counters}))
                            .collect(),
                    );
                }
                if d.tainted {
                    device["taints"] = json!([{"key": "t", "effect": "NoSchedule"}]);
                }
                device
            })
            .collect();
        let sets: Vec<Value> = pool
            .sets
            .iter()
            .enumerate()
            .map(|(s, (mem, slots))| {
                json!({"name": format!("set-{s}"), "counters": {
                    "mem": {"value": mem.to_string()}, "slots": {"value": slots.to_string()}}})
            })
            .collect();
        let name = pool_name(p);
        let two = pool.separate_counters && !sets.is_empty();
        let count = if two { 2 } else { 1 };
        let counters_here = if two || sets.is_empty() {
            Value::Null
        } else {
            json!(sets)
        };
        out.push(allocator_support::slice_with(
            &format!("{name}-devices"),
            &name,
            pool.node,
            1,
            count,
            json!(devices),
            counters_here,
        ));
        if two {
            out.push(allocator_support::slice_with(
                &format!("{name}-counters"),
                &name,
                pool.node,
                1,
                count,
                Value::Null,
                json!(sets),
            ));
        }
    }
    out
}

fn classes() -> Vec<DeviceClass> {
    vec![
        allocator_support::class(
            "gpu",
            &[&format!("device.attributes['{DRIVER}'].type == 'gpu'")],
        ),
        allocator_support::class(
            "kind-a",
            &[&format!("device.attributes['{DRIVER}'].kind == 'a'")],
        ),
    ]
}

fn req_name(r: usize) -> String {
    format!("r{r}")
}

fn variant_name(claim: &ClaimSpec, r: usize, v: usize) -> String {
    if claim.requests[r].variants.len() == 1 {
        req_name(r)
    } else {
        format!("r{r}/s{v}")
    }
}

fn to_claim(name: &str, c: &ClaimSpec) -> ResourceClaim {
    let fields = |v: &VarSpec| {
        let mut f = json!({"deviceClassName": v.class.name()});
        if let Some(s) = v.sel {
            f["selectors"] = json!([{"cel": {"expression": s.expression()}}]);
        }
        match v.mode {
            ModeSpec::Count(n) => f["count"] = json!(n),
            ModeSpec::All => f["allocationMode"] = json!("All"),
        }
        if let Some(m) = v.mem_request {
            f["capacity"] = json!({"requests": {"mem": m.to_string()}});
        }
        if v.tolerate {
            f["tolerations"] = json!([{"key": "t", "operator": "Exists"}]);
        }
        f
    };
    let requests: Vec<Value> = c
        .requests
        .iter()
        .enumerate()
        .map(|(r, req)| {
            if let [v] = req.variants.as_slice() {
                let mut f = fields(v);
                if v.admin {
                    f["adminAccess"] = json!(true);
                }
                json!({"name": req_name(r), "exactly": f})
            } else {
                let subs: Vec<Value> = req
                    .variants
                    .iter()
                    .enumerate()
                    .map(|(s, v)| {
                        let mut f = fields(v);
                        f["name"] = json!(format!("s{s}"));
                        f
                    })
                    .collect();
                json!({"name": req_name(r), "firstAvailable": subs})
            }
        })
        .collect();
    let constraints: Vec<Value> = c
        .constraints
        .iter()
        .map(|k| {
            let key = if k.distinct {
                "distinctAttribute"
            } else {
                "matchAttribute"
            };
            let mut v = json!({key: format!("{DRIVER}/color")});
            if k.first_only {
                v["requests"] = json!([req_name(0)]);
            }
            v
        })
        .collect();
    allocator_support::claim(name, json!(requests), json!(constraints))
}

// ---------------------------------------------------------------------------
// The independent checker
// ---------------------------------------------------------------------------

/// What allocated claims use: (pool, device) → (exclusive, shares, mem consumed).
#[derive(Debug, Default, Clone)]
struct State {
    exclusive: HashSet<(usize, usize)>,
    shares: HashMap<(usize, usize), (usize, i64)>,
}

fn index_of(prefix: &str, name: &str) -> usize {
    name.strip_prefix(prefix)
        .and_then(|n| n.parse().ok())
        .expect("generated name")
}

fn state(claims: &[ResourceClaim]) -> State {
    let mut s = State::default();
    for c in claims {
        let results = c
            .status
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
            .unwrap();
        for r in results {
            if r.admin_access == Some(true) {
                continue;
            }
            let key = (index_of("pool-", &r.pool), index_of("dev-", &r.device));
            if r.share_id.is_some() {
                let mem: i64 = r
                    .consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get("mem"))
                    .map_or(0, |q| q.0.parse().unwrap());
                let e = s.shares.entry(key).or_default();
                e.0 += 1;
                e.1 += mem;
            } else {
                assert!(
                    s.exclusive.insert(key),
                    "device {key:?} allocated exclusively twice"
                );
            }
        }
    }
    s
}

/// What one allocation of a device consumes of `mem`, or `None` when the
/// policy forbids it.
fn consumed(d: &DevSpec, request: Option<i64>) -> Option<i64> {
    match (&d.policy, request) {
        (None, None) => Some(d.mem),
        (None, Some(r)) => Some(r),
        (Some(PolicySpec::Values), None) => Some(2),
        (Some(PolicySpec::Values), Some(r)) => [2, 4, 8].into_iter().find(|v| *v >= r),
        (Some(PolicySpec::Range), None) => Some(d.mem).filter(|m| *m <= 7 && (m - 1) % 2 == 0),
        (Some(PolicySpec::Range), Some(r)) => {
            let c = if r < 1 { 1 } else { 1 + (r / 2) * 2 };
            Some(c).filter(|c| *c <= 7)
        }
    }
}

fn on_node(pool: &PoolSpec, node: Option<&str>) -> bool {
    pool.node.is_none() || pool.node == node
}

fn selected(v: &VarSpec, d: &DevSpec) -> bool {
    v.class.eval(d) && v.sel.is_none_or(|s| s.eval(d))
}

/// Devices a request for all devices takes on `node`.
fn all_list(
    pools: &[PoolSpec],
    st: &State,
    node: Option<&str>,
    v: &VarSpec,
) -> Vec<(usize, usize)> {
    let mut list = Vec::new();
    for (p, pool) in pools.iter().enumerate() {
        if !on_node(pool, node) {
            continue;
        }
        for (i, d) in pool.devices.iter().enumerate() {
            if !selected(v, d) {
                continue;
            }
            if !v.admin {
                let Some(c) = consumed(d, v.mem_request) else {
                    continue;
                };
                let used = st.shares.get(&(p, i)).map_or(0, |s| s.1);
                if used + c > d.mem {
                    continue;
                }
            }
            list.push((p, i));
        }
    }
    list
}

/// A candidate: per request, (variant, devices).
type Assignment = Vec<(usize, Vec<(usize, usize)>)>;

/// Whether `assignment` is a valid allocation of `claim` on `node`; what
/// each device consumes of `mem` (multi-allocatable, non-admin only).
fn check(
    pools: &[PoolSpec],
    st: &State,
    node: Option<&str>,
    claim: &ClaimSpec,
    assignment: &Assignment,
) -> Result<Vec<Option<i64>>, String> {
    let mut taken: HashSet<(usize, usize)> = HashSet::new();
    let mut active: HashSet<(usize, usize)> = st
        .exclusive
        .iter()
        .chain(st.shares.keys())
        .copied()
        .collect();
    let mut mem_used: HashMap<(usize, usize), i64> =
        st.shares.iter().map(|(k, v)| (*k, v.1)).collect();
    let mut counters: Vec<Vec<(i64, i64)>> = pools.iter().map(|p| p.sets.clone()).collect();
    for &(p, i) in &active {
        for (set, counter, amount) in &pools[p].devices[i].consumes {
            let c = &mut counters[p][*set];
            if *counter == "mem" {
                c.0 -= amount;
            } else {
                c.1 -= amount;
            }
        }
    }
    let mut consumption = Vec::new();
    let mut total = 0;
    for (r, (v, devices)) in assignment.iter().enumerate() {
        let var = &claim.requests[r].variants[*v];
        match var.mode {
            ModeSpec::Count(n) if devices.len() != n => {
                return Err(format!("request {r}: {} devices, want {n}", devices.len()));
            }
            ModeSpec::All => {
                let want = all_list(pools, st, node, var);
                if want.is_empty() || *devices != want {
                    return Err(format!(
                        "request {r}: all devices are {want:?}, got {devices:?}"
                    ));
                }
            }
            ModeSpec::Count(_) => {}
        }
        total += devices.len();
        // a request gets a device once, also one that allows multiple
        // allocations (kube-scheduler looks for its next device after it)
        let mut in_request = HashSet::new();
        for &(p, i) in devices {
            if !in_request.insert((p, i)) {
                return Err(format!("{p}/{i} twice in request {r}"));
            }
            let pool = &pools[p];
            let d = &pool.devices[i];
            if !on_node(pool, node) {
                return Err(format!("{p}/{i} is not on the node"));
            }
            if !selected(var, d) {
                return Err(format!("{p}/{i} does not match request {r}"));
            }
            if !var.admin && st.exclusive.contains(&(p, i)) {
                return Err(format!("{p}/{i} is in use"));
            }
            if !d.multi && !taken.insert((p, i)) {
                return Err(format!("{p}/{i} twice in the claim"));
            }
            if d.tainted && !var.tolerate {
                return Err(format!("{p}/{i} is tainted"));
            }
            if var.admin {
                consumption.push(None);
                continue;
            }
            let c = consumed(d, var.mem_request)
                .ok_or(format!("{p}/{i}: policy forbids the request"))?;
            let used = mem_used.entry((p, i)).or_default();
            if *used + c > d.mem {
                return Err(format!("{p}/{i}: capacity exhausted"));
            }
            if d.multi {
                *used += c;
            }
            consumption.push(d.multi.then_some(c));
            if active.insert((p, i)) {
                for (set, counter, amount) in &d.consumes {
                    let c = &mut counters[p][*set];
                    let left = if *counter == "mem" {
                        &mut c.0
                    } else {
                        &mut c.1
                    };
                    *left -= amount;
                    if *left < 0 {
                        return Err(format!("{p}/{i}: counter {set}/{counter} exhausted"));
                    }
                }
            }
        }
    }
    if total > 32 {
        return Err("more than 32 devices".into());
    }
    for (k, constraint) in claim.constraints.iter().enumerate() {
        let mut colors = Vec::new();
        for (r, (_, devices)) in assignment.iter().enumerate() {
            if constraint.first_only && r != 0 {
                continue;
            }
            for &(p, i) in devices {
                colors.push(
                    pools[p].devices[i]
                        .color
                        .ok_or(format!("constraint {k}: {p}/{i} has no color"))?,
                );
            }
        }
        let ok = if constraint.distinct {
            colors.iter().collect::<HashSet<_>>().len() == colors.len()
        } else {
            colors.windows(2).all(|w| w[0] == w[1])
        };
        if !ok {
            return Err(format!("constraint {k} violated by {colors:?}"));
        }
    }
    Ok(consumption)
}

/// The nodes the simulation visits, in its order.
fn nodes(pools: &[PoolSpec]) -> Vec<Option<&'static str>> {
    let mut named: Vec<&'static str> = pools
        .iter()
        .filter(|p| !p.devices.is_empty())
        .filter_map(|p| p.node)
        .collect();
    named.sort_unstable();
    named.dedup();
    if named.is_empty() {
        return if pools
            .iter()
            .any(|p| p.node.is_none() && !p.devices.is_empty())
        {
            vec![None]
        } else {
            vec![]
        };
    }
    named.into_iter().map(Some).collect()
}

/// Whether some assignment is valid (exhaustive).
fn brute_force(pools: &[PoolSpec], st: &State, claim: &ClaimSpec) -> bool {
    /// The `n`-device subsets of `devices` (a request takes a device once).
    fn subsets(
        devices: &[(usize, usize)],
        n: usize,
        start: usize,
        acc: &mut Vec<(usize, usize)>,
        out: &mut Vec<Vec<(usize, usize)>>,
    ) {
        if acc.len() == n {
            out.push(acc.clone());
            return;
        }
        for k in start..devices.len() {
            acc.push(devices[k]);
            subsets(devices, n, k + 1, acc, out);
            acc.pop();
        }
    }
    fn go(
        pools: &[PoolSpec],
        st: &State,
        node: Option<&str>,
        claim: &ClaimSpec,
        r: usize,
        acc: &mut Assignment,
    ) -> bool {
        if r == claim.requests.len() {
            return check(pools, st, node, claim, acc).is_ok();
        }
        for (v, var) in claim.requests[r].variants.iter().enumerate() {
            let choices = match var.mode {
                ModeSpec::All => vec![all_list(pools, st, node, var)],
                ModeSpec::Count(n) => {
                    let devices: Vec<(usize, usize)> = pools
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| on_node(p, node))
                        .flat_map(|(p, pool)| (0..pool.devices.len()).map(move |i| (p, i)))
                        .collect();
                    let mut out = Vec::new();
                    subsets(&devices, n, 0, &mut Vec::new(), &mut out);
                    out
                }
            };
            for choice in choices {
                acc.push((v, choice));
                let ok = go(pools, st, node, claim, r + 1, acc);
                acc.pop();
                if ok {
                    return true;
                }
            }
        }
        false
    }
    nodes(pools)
        .into_iter()
        .any(|node| go(pools, st, node, claim, 0, &mut Vec::new()))
}

/// The assignment a simulation result describes, checked with `check`.
fn check_outcome(
    pools: &[PoolSpec],
    st: &State,
    claim: &ClaimSpec,
    outcome: &Outcome,
) -> Result<(), String> {
    let Some(allocations) = outcome.allocations() else {
        return Ok(());
    };
    let a = &allocations[0];
    let mut assignment: Assignment = Vec::new();
    for (r, req) in claim.requests.iter().enumerate() {
        let mut chosen = None;
        let mut devices = Vec::new();
        for res in &a.results {
            for v in 0..req.variants.len() {
                if res.request == variant_name(claim, r, v) {
                    if chosen.is_some_and(|c| c != v) {
                        return Err(format!("request {r} got two alternatives"));
                    }
                    chosen = Some(v);
                    devices.push((index_of("pool-", &res.pool), index_of("dev-", &res.device)));
                }
            }
        }
        assignment.push((chosen.ok_or(format!("request {r} got nothing"))?, devices));
    }
    let node = a.node.as_deref();
    let consumption = check(pools, st, node, claim, &assignment)?;
    for (res, expected) in a.results.iter().zip(consumption) {
        let got = res
            .consumed_capacity
            .get("mem")
            .map(|q| q.to_string().parse::<i64>().unwrap());
        if got != expected {
            return Err(format!(
                "{}: consumed {got:?}, expected {expected:?}",
                res.device
            ));
        }
        if res.share_id.is_some()
            != pools[index_of("pool-", &res.pool)].devices[index_of("dev-", &res.device)].multi
        {
            return Err(format!("{}: share ID iff multi-allocatable", res.device));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn dev_strategy(sets: usize) -> impl Strategy<Value = DevSpec> {
    (
        prop::option::weighted(0.8, 0i64..3),
        prop_oneof![Just("a"), Just("b")],
        1i64..8,
        prop::bool::weighted(0.3),
        prop_oneof![3 => Just(None), 1 => Just(Some(PolicySpec::Values)), 1 => Just(Some(PolicySpec::Range))],
        prop::collection::vec((0..sets.max(1), prop_oneof![Just("mem"), Just("slots")], 0i64..4), 0..3),
        prop::bool::weighted(0.15),
    )
        .prop_map(move |(color, kind, mem, multi, policy, consumes, tainted)| DevSpec {
            color,
            kind,
            mem,
            multi,
            policy: if multi { policy } else { None },
            consumes: if sets == 0 { Vec::new() } else { consumes },
            tainted,
        })
}

fn pool_strategy(
    node: Option<&'static str>,
    max_devices: usize,
) -> impl Strategy<Value = PoolSpec> {
    (0usize..3, any::<bool>()).prop_flat_map(move |(sets, separate)| {
        (
            prop::collection::vec((1i64..8, 1i64..4), sets),
            prop::collection::vec(dev_strategy(sets), 0..=max_devices),
        )
            .prop_map(move |(sets, devices)| PoolSpec {
                node,
                sets,
                devices,
                separate_counters: separate,
            })
    })
}

fn cluster_strategy(max_devices: usize) -> impl Strategy<Value = Vec<PoolSpec>> {
    prop_oneof![
        pool_strategy(Some("node-a"), max_devices).prop_map(|p| vec![p]),
        (
            pool_strategy(Some("node-a"), max_devices),
            pool_strategy(Some("node-b"), max_devices)
        )
            .prop_map(|(a, b)| vec![a, b]),
        (
            pool_strategy(Some("node-a"), max_devices),
            pool_strategy(None, 2)
        )
            .prop_map(|(a, b)| vec![a, b]),
    ]
}

/// Nodes of the wide clusters.
const NODES: [&str; 8] = [
    "node-a", "node-b", "node-c", "node-d", "node-e", "node-f", "node-g", "node-h",
];

/// Up to eight nodes with a pool each, and maybe a cluster-wide pool: long
/// enough scans for helper threads to take part.
fn wide_cluster_strategy(max_devices: usize) -> impl Strategy<Value = Vec<PoolSpec>> {
    (2usize..=NODES.len(), any::<bool>()).prop_flat_map(move |(n, shared)| {
        let local: Vec<_> = NODES[..n]
            .iter()
            .map(|node| pool_strategy(Some(*node), max_devices))
            .collect();
        let shared = if shared { 0..=1usize } else { 0..=0 };
        (local, prop::collection::vec(pool_strategy(None, 2), shared)).prop_map(
            |(mut pools, shared)| {
                pools.extend(shared);
                pools
            },
        )
    })
}

fn sel_strategy() -> impl Strategy<Value = Option<Sel>> {
    prop_oneof![
        2 => Just(None),
        1 => (0i64..3).prop_map(|n| Some(Sel::ColorAtLeast(n))),
        1 => prop_oneof![Just("a"), Just("b")].prop_map(|k| Some(Sel::KindIs(k))),
        1 => (1i64..8).prop_map(|n| Some(Sel::MemAtLeast(n))),
    ]
}

fn var_strategy(max_count: usize, sub: bool) -> impl Strategy<Value = VarSpec> {
    (
        prop_oneof![3 => Just(Class::Gpu), 1 => Just(Class::KindA)],
        sel_strategy(),
        prop_oneof![6 => (1..=max_count).prop_map(ModeSpec::Count), 1 => Just(ModeSpec::All)],
        prop::bool::weighted(if sub { 0.0 } else { 0.1 }),
        prop::option::weighted(0.3, 0i64..7),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(class, sel, mode, admin, mem_request, tolerate)| VarSpec {
            class,
            sel,
            mode,
            admin,
            mem_request,
            tolerate,
        })
}

fn claim_strategy(max_count: usize) -> impl Strategy<Value = ClaimSpec> {
    let request = prop_oneof![
        4 => var_strategy(max_count, false).prop_map(|v| ReqSpec { variants: vec![v] }),
        1 => prop::collection::vec(var_strategy(max_count, true), 2..=2).prop_map(|variants| ReqSpec { variants }),
    ];
    (
        prop::collection::vec(request, 1..=2),
        prop::collection::vec(
            (any::<bool>(), any::<bool>()).prop_map(|(distinct, first_only)| ConstraintSpec {
                distinct,
                first_only,
            }),
            0..=1,
        ),
    )
        .prop_map(|(requests, constraints)| ClaimSpec {
            requests,
            constraints,
        })
}

fn allocator() -> &'static Allocator {
    static ALLOCATOR: OnceLock<Allocator> = OnceLock::new();
    ALLOCATOR.get_or_init(Allocator::new)
}

/// The simulation's full answer (allocations, explanation or error) with
/// `threads` threads.
fn answer(
    snapshot: &Snapshot<'_>,
    claim: &ResourceClaim,
    threads: usize,
    all_fitting_nodes: bool,
) -> Result<Outcome, AllocError> {
    let options = SimulateOptions {
        threads,
        all_fitting_nodes,
        ..SimulateOptions::default()
    };
    allocator().simulate(snapshot, claim, &options)
}

fn simulate(pools: &[PoolSpec], allocated: &[ResourceClaim], claim: &ResourceClaim) -> Outcome {
    let slices = slices(pools);
    let classes = classes();
    let snapshot = Snapshot::new(&slices, &classes, allocated);
    allocator()
        .simulate(&snapshot, claim, &SimulateOptions::default())
        .unwrap_or_else(|e| panic!("no verdict: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(192),
        ..ProptestConfig::default()
    })]

    /// Allocating claim after claim never breaks a rule: no counter below
    /// zero, no capacity over-consumed, no exclusive device twice, every
    /// constraint, count, selector and taint respected.
    #[test]
    fn sequences_of_allocations_keep_every_invariant(
        pools in cluster_strategy(6),
        claims in prop::collection::vec(claim_strategy(3), 1..6),
    ) {
        let mut allocated_claims: Vec<ResourceClaim> = Vec::new();
        for (k, spec) in claims.iter().enumerate() {
            let st = state(&allocated_claims);
            let claim = to_claim(&format!("c{k}"), spec);
            let outcome = simulate(&pools, &allocated_claims, &claim);
            if let Err(e) = check_outcome(&pools, &st, spec, &outcome) {
                prop_assert!(false, "claim {k} {spec:?}: invalid allocation {outcome:?}: {e}");
            }
            if let Some([first, ..]) = outcome.allocations() {
                allocated_claims.push(allocated(claim, first));
                // the union must still be consistent (panics inside on a
                // device allocated exclusively twice)
                let after = state(&allocated_claims);
                for ((p, i), (_, mem)) in &after.shares {
                    prop_assert!(*mem <= pools[*p].devices[*i].mem, "capacity of {p}/{i} over-consumed");
                }
            } else {
                prop_assert!(!outcome.explanation().unwrap().summary.is_empty());
            }
        }
    }

    /// Helper threads (preparing pools ahead of the search, explaining in
    /// parallel) never change the answer: allocations, explanations and
    /// errors are those of the calling thread alone, on fresh snapshots
    /// (helpers fill the caches) and on snapshots another simulation
    /// warmed.
    #[test]
    fn threads_never_change_the_answer(
        pools in wide_cluster_strategy(5),
        before in prop::collection::vec(claim_strategy(2), 0..4),
        spec in claim_strategy(3),
        all_fitting_nodes in any::<bool>(),
    ) {
        let slices = slices(&pools);
        let classes = classes();
        let mut allocated_claims: Vec<ResourceClaim> = Vec::new();
        for (k, b) in before.iter().enumerate() {
            let claim = to_claim(&format!("b{k}"), b);
            if let Some([first, ..]) = simulate(&pools, &allocated_claims, &claim).allocations() {
                allocated_claims.push(allocated(claim, first));
            }
        }
        let claim = to_claim("c", &spec);
        let alone = answer(
            &Snapshot::new(&slices, &classes, &allocated_claims),
            &claim,
            1,
            all_fitting_nodes,
        );
        let warmed = Snapshot::new(&slices, &classes, &allocated_claims);
        for threads in [2, 3, 8] {
            let fresh = Snapshot::new(&slices, &classes, &allocated_claims);
            prop_assert_eq!(&answer(&fresh, &claim, threads, all_fitting_nodes), &alone, "{} threads, fresh snapshot", threads);
            prop_assert_eq!(&answer(&warmed, &claim, threads, all_fitting_nodes), &alone, "{} threads, warm snapshot", threads);
        }
    }

    /// On small clusters the verdict matches an exhaustive search: never
    /// "unsatisfiable" when some choice of devices works, never
    /// "satisfiable" when none does.
    #[test]
    fn verdicts_match_brute_force(
        pools in cluster_strategy(5),
        before in prop::collection::vec(claim_strategy(2), 0..3),
        spec in claim_strategy(2),
    ) {
        let mut allocated_claims: Vec<ResourceClaim> = Vec::new();
        for (k, b) in before.iter().enumerate() {
            let claim = to_claim(&format!("b{k}"), b);
            if let Some([first, ..]) = simulate(&pools, &allocated_claims, &claim).allocations() {
                allocated_claims.push(allocated(claim, first));
            }
        }
        let st = state(&allocated_claims);
        let claim = to_claim("c", &spec);
        let outcome = simulate(&pools, &allocated_claims, &claim);
        let expected = brute_force(&pools, &st, &spec);
        prop_assert_eq!(outcome.is_satisfiable(), expected, "claim {:?} on {:?} (state {:?}): {:?}", spec, pools, st, outcome);
        if let Err(e) = check_outcome(&pools, &st, &spec, &outcome) {
            prop_assert!(false, "invalid allocation {outcome:?}: {e}");
        }
    }
}
