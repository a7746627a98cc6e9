//! The cluster state a simulation runs against: ResourceSlices grouped into
//! pools (highest generation only, completeness checked), the nodes they
//! name, the DeviceClasses, and what allocated claims already use.
//!
//! The slice-derived part is shared (behind an `Arc`) by every snapshot made
//! with [`Snapshot::with_allocated`], and everything in it is computed
//! lazily and kept: a pool is validated and indexed on first visit, and the
//! values a selector reads are gathered per pool into columns of interned
//! ids on first use. So a controller that keeps one snapshot per set of
//! slices pays for each device once, not once per claim.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use super::device::{PoolDevice, RawValue, Scope};
use super::selectors::{FastMap, Read};
use crate::quantity::Quantity;

/// Devices of one pool used by allocated claims: `(driver, pool)` → device
/// name → use.
type AllocatedByPool<'a> = FastMap<(&'a str, &'a str), FastMap<&'a str, AllocatedUse<'a>>>;

/// A snapshot of the cluster for simulations. Borrows the objects it was
/// made from.
#[derive(Debug)]
pub struct Snapshot<'a> {
    pub(crate) index: Arc<SliceIndex<'a>>,
    allocated: AllocatedByPool<'a>,
    /// Per pool: what the allocated claims use of it, computed on first
    /// visit.
    uses: Vec<OnceLock<Result<PoolUse, String>>>,
    allocation_issues: Vec<String>,
}

/// Everything derived from the slices and classes.
#[derive(Debug)]
pub(crate) struct SliceIndex<'a> {
    pub pools: Vec<Pool<'a>>,
    pub classes: HashMap<&'a str, &'a DeviceClass>,
    nodes: Vec<&'a str>,
    node_pools: HashMap<&'a str, Vec<usize>>,
    any_node_pools: Vec<usize>,
    /// Value ids of the columns.
    values: Mutex<FastMap<RawValue<'a>, u32>>,
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
    /// The pool validated and indexed (on first call).
    pub(crate) fn prepared(&self) -> &PreparedPool<'a> {
        self.prepared
            .get_or_init(|| prepare(self).unwrap_or_else(PreparedPool::invalid))
    }

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

/// A counter set of a pool: its counters are `counters[first..]` of the
/// pool, in the order of this map.
#[derive(Debug)]
struct CounterSet<'a> {
    counters: &'a BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
    first: usize,
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

/// What the allocated claims use of a pool.
#[derive(Debug, Default)]
pub(crate) struct PoolUse {
    /// Device index → use.
    pub existing: FastMap<usize, Existing>,
    /// Counters left (may be negative).
    pub base_available: Vec<i128>,
}

/// A validated, indexed pool.
#[derive(Debug)]
pub(crate) struct PreparedPool<'a> {
    pub invalid: Option<String>,
    pub devices: Vec<PoolDevice<'a>>,
    pub counters: Vec<Counter<'a>>,
    sets: Vec<CounterSet<'a>>,
    set_index: FastMap<&'a str, usize>,
    by_name: FastMap<&'a str, usize>,
    /// What selectors read, per device, as value ids.
    columns: Mutex<FastMap<Read, Arc<Column>>>,
}

impl PreparedPool<'_> {
    pub(crate) fn counter(&self, set: &str, name: &str) -> Option<usize> {
        let set = &self.sets[*self.set_index.get(set)?];
        let offset = set.counters.keys().position(|k| k == name)?;
        Some(set.first + offset)
    }

    fn invalid(reason: String) -> Self {
        PreparedPool {
            invalid: Some(reason),
            devices: Vec::new(),
            counters: Vec::new(),
            sets: Vec::new(),
            set_index: FastMap::default(),
            by_name: FastMap::default(),
            columns: Mutex::new(FastMap::default()),
        }
    }
}

fn slice_scope(slice: &ResourceSlice) -> Scope<'_> {
    let spec = &slice.spec;
    scope(
        spec.node_name.as_deref(),
        spec.all_nodes,
        spec.node_selector.is_some(),
    )
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

impl<'a> SliceIndex<'a> {
    fn new(
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
        classes: impl IntoIterator<Item = &'a DeviceClass>,
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
                        add(scope(
                            d.node_name.as_deref(),
                            d.all_nodes,
                            d.node_selector.is_some(),
                        ));
                    }
                } else if slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()) {
                    add(slice_scope(slice));
                }
            }
            pools.push(Pool {
                driver: key.0,
                name: key.1,
                expected: slices
                    .first()
                    .map_or(0, |s| s.spec.pool.resource_slice_count),
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
        SliceIndex {
            pools,
            classes,
            nodes,
            node_pools,
            any_node_pools,
            values: Mutex::new(FastMap::default()),
        }
    }

    /// The column of the values `read` takes on the devices of a prepared
    /// pool, as ids (equal ids, equal values), made once per pool and
    /// read; its ids are filled on first need (see
    /// [`value_id`](Self::value_id)), so a selector evaluated on a few
    /// devices of a pool reads only those.
    pub(crate) fn column(
        &self,
        pool: &Pool<'a>,
        prepared: &PreparedPool<'a>,
        read: &Read,
    ) -> Arc<Column> {
        let mut columns = prepared
            .columns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = columns.get(read) {
            return Arc::clone(c);
        }
        // the driver is the pool's: one value for all devices
        let fill = match read {
            Read::Driver => self.intern(RawValue::Str(pool.driver)),
            _ => UNKNOWN_ID,
        };
        let column = Arc::new(Column {
            read: read.clone(),
            ids: prepared
                .devices
                .iter()
                .map(|_| AtomicU32::new(fill))
                .collect(),
        });
        columns.insert(read.clone(), Arc::clone(&column));
        column
    }

    /// The id of the value of `column` on device `i` of the pool.
    pub(crate) fn value_id(
        &self,
        pool: &Pool<'a>,
        prepared: &PreparedPool<'a>,
        column: &Column,
        i: usize,
    ) -> u32 {
        let id = column.ids[i].load(AtomicOrdering::Relaxed);
        if id != UNKNOWN_ID {
            return id;
        }
        let id = self.intern(column.read.raw(prepared.devices[i].raw, pool.driver));
        column.ids[i].store(id, AtomicOrdering::Relaxed);
        id
    }

    fn intern(&self, value: RawValue<'a>) -> u32 {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let next = u32::try_from(values.len()).map_or(UNKNOWN_ID - 1, |n| n.min(UNKNOWN_ID - 1));
        *values.entry(value).or_insert(next)
    }
}

/// A column id not computed yet.
const UNKNOWN_ID: u32 = u32::MAX;

/// What a selector reads of the devices of one pool, as value ids, filled
/// on first need.
#[derive(Debug)]
pub(crate) struct Column {
    read: Read,
    ids: Box<[AtomicU32]>,
}

impl Column {
    /// Devices in the pool.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Validates and indexes a pool (slices only). Every device of the pool is
/// touched here, so this is the cold cost of a full scan: it allocates
/// little and compares names by merging sorted maps rather than hashing.
fn prepare<'a>(pool: &Pool<'a>) -> Result<PreparedPool<'a>, String> {
    let mut counters = Vec::new();
    let mut sets: Vec<CounterSet<'a>> = Vec::new();
    let mut set_index: FastMap<&'a str, usize> = FastMap::default();
    // counter sets repeat a few values ("1", the memory size): parse each
    // distinct text once
    let mut parsed: Vec<(&'a str, i128)> = Vec::new();
    for slice in &pool.slices {
        for set in slice.spec.shared_counters.iter().flatten() {
            if set_index.insert(set.name.as_str(), sets.len()).is_some() {
                return Err(format!("duplicate counter set name {}", set.name));
            }
            sets.push(CounterSet {
                counters: &set.counters,
                first: counters.len(),
            });
            for (name, counter) in &set.counters {
                let text = counter.value.0.as_str();
                let total = if let Some(&(_, total)) = parsed.iter().find(|(t, _)| *t == text) {
                    total
                } else {
                    let total = Quantity::parse(text)
                        .map_err(|e| format!("counter {}/{name}: {e}", set.name))?
                        .nanos();
                    if parsed.len() < 8 {
                        parsed.push((text, total));
                    }
                    total
                };
                if total < 0 {
                    return Err(format!(
                        "counter {}/{name} is negative ({})",
                        set.name, counter.value.0
                    ));
                }
                counters.push(Counter {
                    set: &set.name,
                    name,
                    total,
                });
            }
        }
    }
    let total: usize = pool
        .slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let mut devices = Vec::with_capacity(total);
    let mut by_name: FastMap<&'a str, usize> = FastMap::default();
    by_name.reserve(total);
    // the set of the previous consumption: devices consume from the same
    // set in runs
    let mut last_set: Option<(&'a str, usize)> = None;
    for slice in &pool.slices {
        let per_device = per_device(slice);
        let slice_scope = slice_scope(slice);
        for d in slice.spec.devices.iter().flatten() {
            if by_name.insert(d.name.as_str(), devices.len()).is_some() {
                return Err(format!("duplicate device name {}", d.name));
            }
            for consumption in d.consumes_counters.iter().flatten() {
                let wanted = consumption.counter_set.as_str();
                let set = match last_set {
                    Some((name, i)) if name == wanted => i,
                    _ => {
                        let Some(&i) = set_index.get(wanted) else {
                            return Err(format!(
                                "device {} consumes counters of unknown counter set {}",
                                d.name, consumption.counter_set
                            ));
                        };
                        last_set = Some((&consumption.counter_set, i));
                        i
                    }
                };
                if let Some(name) = first_unknown(consumption.counters.keys(), sets[set].counters) {
                    return Err(format!(
                        "device {} consumes unknown counter {name} of counter set {}",
                        d.name, consumption.counter_set
                    ));
                }
            }
            let s = if per_device {
                scope(
                    d.node_name.as_deref(),
                    d.all_nodes,
                    d.node_selector.is_some(),
                )
            } else {
                slice_scope
            };
            devices.push(PoolDevice::new(d, s));
        }
    }
    Ok(PreparedPool {
        invalid: None,
        devices,
        counters,
        sets,
        set_index,
        by_name,
        columns: Mutex::new(FastMap::default()),
    })
}

/// The first of `names` (sorted) that is not a key of `known` (sorted as
/// well: both are `BTreeMap` keys): one merging pass.
fn first_unknown<'n, V>(
    names: impl Iterator<Item = &'n String>,
    known: &BTreeMap<String, V>,
) -> Option<&'n String> {
    let mut known = known.keys().peekable();
    'names: for name in names {
        while let Some(k) = known.peek() {
            match k.as_str().cmp(name.as_str()) {
                Ordering::Less => {
                    known.next();
                }
                Ordering::Equal => {
                    known.next();
                    continue 'names;
                }
                Ordering::Greater => return Some(name),
            }
        }
        return Some(name);
    }
    None
}

fn read_allocated<'a>(
    allocated: impl IntoIterator<Item = &'a ResourceClaim>,
) -> (AllocatedByPool<'a>, Vec<String>) {
    let mut by_pool: AllocatedByPool<'a> = FastMap::default();
    let mut issues = Vec::new();
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
            let entry = by_pool
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
                        issues.push(format!(
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
    (by_pool, issues)
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
        Snapshot::from_index(Arc::new(SliceIndex::new(slices, classes)), allocated)
    }

    /// The same slices and classes with other allocated claims. Shares
    /// everything computed from the slices so far (and from now on).
    #[must_use]
    pub fn with_allocated(
        &self,
        allocated: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Snapshot<'a> {
        Snapshot::from_index(Arc::clone(&self.index), allocated)
    }

    fn from_index(
        index: Arc<SliceIndex<'a>>,
        allocated: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Self {
        let (allocated, allocation_issues) = read_allocated(allocated);
        Snapshot {
            uses: (0..index.pools.len()).map(|_| OnceLock::new()).collect(),
            index,
            allocated,
            allocation_issues,
        }
    }

    /// The nodes named by node-local slices or devices, sorted.
    pub fn nodes(&self) -> &[&'a str] {
        &self.index.nodes
    }

    /// Whether some devices are available on every node.
    pub fn has_cluster_wide_devices(&self) -> bool {
        !self.index.any_node_pools.is_empty()
    }

    /// Allocation results of the allocated claims that could not be read.
    pub fn allocation_issues(&self) -> &[String] {
        &self.allocation_issues
    }

    /// Incomplete and invalid pools. Validates every pool (work that
    /// simulations otherwise do only for the pools they visit).
    pub fn pool_issues(&self) -> Vec<PoolIssue> {
        let mut issues = Vec::new();
        for (i, pool) in self.index.pools.iter().enumerate() {
            let reason = if pool.complete() {
                match (pool.prepared().invalid.as_deref(), self.pool_use(i)) {
                    (Some(reason), _) | (None, Err(reason)) => format!("invalid: {reason}"),
                    (None, Ok(_)) => continue,
                }
            } else {
                format!("incomplete: {}", pool.incomplete_reason())
            };
            issues.push(PoolIssue {
                pool: pool.id(),
                reason,
            });
        }
        issues
    }

    pub(crate) fn pools(&self) -> &[Pool<'a>] {
        &self.index.pools
    }

    pub(crate) fn classes(&self) -> &HashMap<&'a str, &'a DeviceClass> {
        &self.index.classes
    }

    /// The pools a node sees, in allocation order (ascending index).
    pub(crate) fn pools_for(&self, node: Option<&str>) -> Vec<usize> {
        let local = node
            .and_then(|n| self.index.node_pools.get(n))
            .map_or(&[][..], Vec::as_slice);
        let mut all: Vec<usize> = local
            .iter()
            .chain(&self.index.any_node_pools)
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// What the allocated claims use of pool `i` (complete and valid);
    /// an error when a used device cannot be read.
    pub(crate) fn pool_use(&self, i: usize) -> Result<&PoolUse, &str> {
        self.uses[i]
            .get_or_init(|| self.compute_use(i))
            .as_ref()
            .map_err(String::as_str)
    }

    fn compute_use(&self, i: usize) -> Result<PoolUse, String> {
        let pool = &self.index.pools[i];
        let prepared = pool.prepared();
        let mut result = PoolUse {
            existing: FastMap::default(),
            base_available: prepared.counters.iter().map(|c| c.total).collect(),
        };
        let Some(used) = self.allocated.get(&(pool.driver, pool.name)) else {
            return Ok(result);
        };
        let lookup = |set: &str, counter: &str| prepared.counter(set, counter);
        for (name, u) in used {
            let Some(&index) = prepared.by_name.get(name) else {
                continue;
            };
            let details = prepared.devices[index]
                .details(pool.driver, &lookup)
                .map_err(|e| format!("device {name}: {e}"))?;
            let mut capacity = vec![0i128; details.capacities.len()];
            for (cname, q) in &u.consumed {
                let Ok((domain, id)) = crate::cel::split_qualified_name(pool.driver, cname) else {
                    continue;
                };
                if let Some(c) = details
                    .capacities
                    .iter()
                    .position(|c| c.domain == domain && c.id == id)
                {
                    capacity[c] = capacity[c].saturating_add(q.nanos());
                }
            }
            let e = Existing {
                exclusive: u.exclusive,
                shares: u.shares,
                capacity,
            };
            if e.active() {
                for &(counter, amount) in &details.consumes {
                    result.base_available[counter] =
                        result.base_available[counter].saturating_sub(amount);
                }
            }
            result.existing.insert(index, e);
        }
        Ok(result)
    }
}
