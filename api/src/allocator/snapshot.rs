//! The cluster state a simulation runs against: ResourceSlices grouped into
//! pools (highest generation only, completeness checked), the nodes they
//! name, the DeviceClasses, and what allocated claims already use. Pools
//! are validated and their devices indexed lazily, on first use, and the
//! result is kept, so one snapshot serves many simulations cheaply.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use super::device::{PoolDevice, Scope};
use crate::quantity::Quantity;

/// Devices of one pool used by allocated claims: `(driver, pool)` → device
/// name → use.
type AllocatedByPool<'a> = HashMap<(&'a str, &'a str), HashMap<&'a str, AllocatedUse<'a>>>;

/// A snapshot of the cluster for simulations. Borrows the objects it was
/// made from.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub(crate) pools: Vec<Pool<'a>>,
    pub(crate) classes: HashMap<&'a str, &'a DeviceClass>,
    nodes: Vec<&'a str>,
    node_pools: HashMap<&'a str, Vec<usize>>,
    any_node_pools: Vec<usize>,
    allocated: AllocatedByPool<'a>,
    allocation_issues: Vec<String>,
}

/// What an allocated claim uses of a device.
#[derive(Debug, Default)]
struct AllocatedUse<'a> {
    /// Allocated without a share ID: the device is in use.
    exclusive: bool,
    /// Allocations with a share ID.
    shares: usize,
    /// Their consumed capacity, by the name in the result.
    consumed: Vec<(&'a str, Quantity)>,
}

/// A problem with a pool that makes its devices unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolIssue {
    /// `<driver>/<pool>`.
    pub pool: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for PoolIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resource pool {}: {}", self.pool, self.reason)
    }
}

/// The slices of one pool at its highest generation.
#[derive(Debug)]
pub(crate) struct Pool<'a> {
    pub driver: &'a str,
    pub name: &'a str,
    pub slices: Vec<&'a ResourceSlice>,
    pub expected: i64,
    prepared: OnceLock<PreparedPool<'a>>,
}

impl<'a> Pool<'a> {
    pub(crate) fn id(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }

    pub(crate) fn complete(&self) -> bool {
        i64::try_from(self.slices.len()).is_ok_and(|n| n == self.expected)
    }

    pub(crate) fn incomplete_reason(&self) -> String {
        format!(
            "{} of {} slices published at generation {}",
            self.slices.len(),
            self.expected,
            self.slices.first().map_or(0, |s| s.spec.pool.generation)
        )
    }
}

/// A counter of one of the pool's counter sets.
#[derive(Debug, Clone)]
pub(crate) struct Counter<'a> {
    pub set: &'a str,
    pub name: &'a str,
    pub total: i128,
}

/// How allocated claims use a device of the pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct Existing {
    pub exclusive: bool,
    pub shares: usize,
    /// Consumed capacity, indexed like the device's capacities.
    pub capacity: Vec<i128>,
}

impl Existing {
    /// Whether the device's counters are consumed.
    pub(crate) fn active(&self) -> bool {
        self.exclusive || self.shares > 0
    }
}

/// A validated, indexed pool.
#[derive(Debug)]
pub(crate) struct PreparedPool<'a> {
    pub invalid: Option<String>,
    pub devices: Vec<PoolDevice<'a>>,
    pub counters: Vec<Counter<'a>>,
    counter_index: HashMap<&'a str, HashMap<&'a str, usize>>,
    /// Counters left after the allocated devices (may be negative).
    pub base_available: Vec<i128>,
    /// Device index → use by allocated claims.
    pub existing: HashMap<usize, Existing>,
}

impl<'a> PreparedPool<'a> {
    pub(crate) fn counter(&self, set: &str, name: &str) -> Option<usize> {
        self.counter_index.get(set)?.get(name).copied()
    }

    fn invalid(reason: String) -> Self {
        PreparedPool {
            invalid: Some(reason),
            devices: Vec::new(),
            counters: Vec::new(),
            counter_index: HashMap::new(),
            base_available: Vec::new(),
            existing: HashMap::new(),
        }
    }
}

fn slice_scope(slice: &ResourceSlice) -> Scope<'_> {
    let spec = &slice.spec;
    scope(spec.node_name.as_deref(), spec.all_nodes, spec.node_selector.is_some())
}

fn scope(node_name: Option<&str>, all_nodes: Option<bool>, selector: bool) -> Scope<'_> {
    match node_name {
        Some(n) if !n.is_empty() => Scope::Node(n),
        _ if all_nodes == Some(true) || selector => Scope::AnyNode,
        _ => Scope::Nowhere,
    }
}

fn per_device(slice: &ResourceSlice) -> bool {
    slice.spec.per_device_node_selection == Some(true)
}

impl<'a> Snapshot<'a> {
    /// Groups `slices` into pools, indexes `classes` by name and records
    /// what the `allocated` claims' `status.allocation` results use.
    /// Unallocated claims are ignored. Never fails: unusable pools and
    /// unreadable allocation results are reported by
    /// [`pool_issues`](Self::pool_issues) and
    /// [`allocation_issues`](Self::allocation_issues) (a device with an
    /// unreadable result counts as in use).
    pub fn new(
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
        classes: impl IntoIterator<Item = &'a DeviceClass>,
        allocated: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Self {
        let mut groups: HashMap<(&'a str, &'a str), Vec<&'a ResourceSlice>> = HashMap::new();
        for slice in slices {
            let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
            let group = groups.entry(key).or_default();
            match group.first().map(|s| s.spec.pool.generation) {
                Some(g) if slice.spec.pool.generation < g => {}
                Some(g) if slice.spec.pool.generation > g => *group = vec![slice],
                _ => group.push(slice),
            }
        }
        let mut keys: Vec<_> = groups.keys().copied().collect();
        keys.sort_unstable();
        let mut pools = Vec::with_capacity(keys.len());
        let mut node_pools: HashMap<&'a str, Vec<usize>> = HashMap::new();
        let mut any_node_pools = Vec::new();
        for (index, key) in keys.into_iter().enumerate() {
            let mut slices = groups.remove(&key).unwrap_or_default();
            slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let mut add = |s: Scope<'a>| match s {
                Scope::Node(n) => {
                    let list = node_pools.entry(n).or_default();
                    if list.last() != Some(&index) {
                        list.push(index);
                    }
                }
                Scope::AnyNode => {
                    if any_node_pools.last() != Some(&index) {
                        any_node_pools.push(index);
                    }
                }
                Scope::Nowhere => {}
            };
            for slice in &slices {
                if per_device(slice) {
                    for d in slice.spec.devices.iter().flatten() {
                        add(scope(d.node_name.as_deref(), d.all_nodes, d.node_selector.is_some()));
                    }
                } else if slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()) {
                    add(slice_scope(slice));
                }
            }
            pools.push(Pool {
                driver: key.0,
                name: key.1,
                expected: slices.first().map_or(0, |s| s.spec.pool.resource_slice_count),
                slices,
                prepared: OnceLock::new(),
            });
        }
        let mut nodes: Vec<&'a str> = node_pools.keys().copied().collect();
        nodes.sort_unstable();

        let classes = classes
            .into_iter()
            .filter_map(|c| c.metadata.name.as_deref().map(|n| (n, c)))
            .collect();

        let mut allocated_by_pool: AllocatedByPool<'a> = HashMap::new();
        let mut allocation_issues = Vec::new();
        for claim in allocated {
            let Some(results) = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
            else {
                continue;
            };
            for r in results {
                if r.admin_access == Some(true) {
                    continue;
                }
                let entry = allocated_by_pool
                    .entry((r.driver.as_str(), r.pool.as_str()))
                    .or_default()
                    .entry(r.device.as_str())
                    .or_default();
                if r.share_id.is_none() {
                    entry.exclusive = true;
                    continue;
                }
                entry.shares += 1;
                for (name, q) in r.consumed_capacity.iter().flatten() {
                    match Quantity::parse(&q.0) {
                        Ok(v) if v.signum() >= 0 => entry.consumed.push((name.as_str(), v)),
                        _ => {
                            allocation_issues.push(format!(
                                "claim {}/{}: consumed capacity {name} = {:?} of device {}/{}/{} is not a valid quantity; the device counts as in use",
                                claim.metadata.namespace.as_deref().unwrap_or(""),
                                claim.metadata.name.as_deref().unwrap_or(""),
                                q.0,
                                r.driver,
                                r.pool,
                                r.device
                            ));
                            entry.exclusive = true;
                        }
                    }
                }
            }
        }
        Snapshot {
            pools,
            classes,
            nodes,
            node_pools,
            any_node_pools,
            allocated: allocated_by_pool,
            allocation_issues,
        }
    }

    /// The nodes named by node-local slices or devices, sorted.
    pub fn nodes(&self) -> &[&'a str] {
        &self.nodes
    }

    /// Whether some devices are available on every node.
    pub fn has_cluster_wide_devices(&self) -> bool {
        !self.any_node_pools.is_empty()
    }

    /// Allocation results of the allocated claims that could not be read.
    pub fn allocation_issues(&self) -> &[String] {
        &self.allocation_issues
    }

    /// Incomplete and invalid pools. Validates every pool (work that
    /// simulations otherwise do only for the pools they visit).
    pub fn pool_issues(&self) -> Vec<PoolIssue> {
        let mut issues = Vec::new();
        for pool in &self.pools {
            if !pool.complete() {
                issues.push(PoolIssue {
                    pool: pool.id(),
                    reason: format!("incomplete: {}", pool.incomplete_reason()),
                });
            } else if let Some(reason) = &self.prepared(pool).invalid {
                issues.push(PoolIssue {
                    pool: pool.id(),
                    reason: format!("invalid: {reason}"),
                });
            }
        }
        issues
    }

    /// The pools a node sees, in allocation order (ascending index).
    pub(crate) fn pools_for(&self, node: Option<&str>) -> Vec<usize> {
        let local = node.and_then(|n| self.node_pools.get(n)).map_or(&[][..], Vec::as_slice);
        let mut all: Vec<usize> = local.iter().chain(&self.any_node_pools).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    pub(crate) fn prepared<'s>(&'s self, pool: &'s Pool<'a>) -> &'s PreparedPool<'a> {
        pool.prepared.get_or_init(|| self.prepare(pool))
    }

    fn prepare(&self, pool: &Pool<'a>) -> PreparedPool<'a> {
        match self.try_prepare(pool) {
            Ok(p) => p,
            Err(reason) => PreparedPool::invalid(reason),
        }
    }

    fn try_prepare(&self, pool: &Pool<'a>) -> Result<PreparedPool<'a>, String> {
        let mut counters = Vec::new();
        let mut counter_index: HashMap<&'a str, HashMap<&'a str, usize>> = HashMap::new();
        for slice in &pool.slices {
            for set in slice.spec.shared_counters.iter().flatten() {
                if counter_index.contains_key(set.name.as_str()) {
                    return Err(format!("duplicate counter set name {}", set.name));
                }
                let names = counter_index.entry(set.name.as_str()).or_default();
                for (name, counter) in &set.counters {
                    let total = Quantity::parse(&counter.value.0)
                        .map_err(|e| format!("counter {}/{name}: {e}", set.name))?
                        .nanos();
                    if total < 0 {
                        return Err(format!("counter {}/{name} is negative ({})", set.name, counter.value.0));
                    }
                    names.insert(name.as_str(), counters.len());
                    counters.push(Counter {
                        set: &set.name,
                        name,
                        total,
                    });
                }
            }
        }
        let mut devices = Vec::new();
        let mut by_name: HashMap<&'a str, usize> = HashMap::new();
        for slice in &pool.slices {
            let per_device = per_device(slice);
            let slice_scope = slice_scope(slice);
            for d in slice.spec.devices.iter().flatten() {
                if by_name.insert(d.name.as_str(), devices.len()).is_some() {
                    return Err(format!("duplicate device name {}", d.name));
                }
                for consumption in d.consumes_counters.iter().flatten() {
                    let Some(set) = counter_index.get(consumption.counter_set.as_str()) else {
                        return Err(format!(
                            "device {} consumes counters of unknown counter set {}",
                            d.name, consumption.counter_set
                        ));
                    };
                    if let Some(name) = consumption.counters.keys().find(|n| !set.contains_key(n.as_str())) {
                        return Err(format!(
                            "device {} consumes unknown counter {name} of counter set {}",
                            d.name, consumption.counter_set
                        ));
                    }
                }
                let s = if per_device {
                    scope(d.node_name.as_deref(), d.all_nodes, d.node_selector.is_some())
                } else {
                    slice_scope
                };
                devices.push(PoolDevice::new(d, s));
            }
        }
        let mut prepared = PreparedPool {
            invalid: None,
            base_available: counters.iter().map(|c| c.total).collect(),
            devices,
            counters,
            counter_index,
            existing: HashMap::new(),
        };
        let Some(used) = self.allocated.get(&(pool.driver, pool.name)) else {
            return Ok(prepared);
        };
        let mut existing = HashMap::new();
        let mut consumed = Vec::new();
        for (name, u) in used {
            let Some(&index) = by_name.get(name) else {
                continue;
            };
            let device = &prepared.devices[index];
            let lookup = |set: &str, counter: &str| prepared.counter(set, counter);
            let details = device
                .details(pool.driver, &lookup)
                .map_err(|e| format!("device {name}: {e}"))?;
            let mut capacity = vec![0i128; details.capacities.len()];
            for (cname, q) in &u.consumed {
                let Ok((domain, id)) = crate::cel::split_qualified_name(pool.driver, cname) else {
                    continue;
                };
                if let Some(i) = details.capacities.iter().position(|c| c.domain == domain && c.id == id) {
                    capacity[i] = capacity[i].saturating_add(q.nanos());
                }
            }
            let e = Existing {
                exclusive: u.exclusive,
                shares: u.shares,
                capacity,
            };
            if e.active() {
                consumed.extend_from_slice(&details.consumes);
            }
            existing.insert(index, e);
        }
        for (counter, amount) in consumed {
            prepared.base_available[counter] = prepared.base_available[counter].saturating_sub(amount);
        }
        prepared.existing = existing;
        Ok(prepared)
    }
}
