//! The cluster state a simulation runs against: ResourceSlices grouped into
//! pools (highest generation only, completeness checked), the nodes they
//! name, the DeviceClasses, and what allocated claims already use.
//!
//! The slice-derived part is shared (behind an `Arc`) by every snapshot made
//! with [`Snapshot::with_allocated`], and everything in it is computed
//! lazily and kept, safely from several threads: a pool is validated and
//! indexed on first visit, and the values a selector reads are gathered
//! per pool into columns of interned ids on first use. So a controller that
//! keeps one snapshot per set of slices pays for each device once, not once
//! per claim. A first visit is bound by memory latency: it first reads the
//! strings it will compare in a loop of independent reads (`touch`), which
//! lets the processor overlap their cache misses.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};

use super::device::{Details, Malformed, Parsed, PoolDevice, RawValue, Scope, same};
use super::intern::{FastHasher, FastMap, OVERFLOW_ID, UNKNOWN_ID};
use super::parallel::{self, Ahead, StopOnDrop};
use super::selectors::Read;
use crate::cel::CelDevice;
use gpu_dra_api::quantity::{Quantity, QuantityError};

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
    uses: Vec<OnceLock<Result<PoolUse, PoolError>>>,
    allocation_issues: Vec<String>,
}

/// Everything derived from the slices and classes.
#[derive(Debug)]
pub(crate) struct SliceIndex<'a> {
    pub pools: Vec<Pool<'a>>,
    pub classes: HashMap<&'a str, &'a DeviceClass>,
    nodes: Vec<&'a str>,
    node_pools: FastMap<&'a str, Vec<usize>>,
    any_node_pools: Vec<usize>,
    /// Value ids of the columns.
    values: Mutex<Interner<'a>>,
    /// The reads columns are kept for, numbered (the index of a pool's
    /// column).
    reads: Mutex<Vec<Read>>,
}

/// The values of the columns, numbered: equal values, equal ids.
#[derive(Debug, Default)]
struct Interner<'a> {
    ids: FastMap<RawValue<'a>, u32>,
    /// Id → value.
    values: Vec<RawValue<'a>>,
}

impl<'a> Interner<'a> {
    fn intern(&mut self, value: RawValue<'a>) -> u32 {
        if let Some(&id) = self.ids.get(&value) {
            return id;
        }
        // past `OVERFLOW_ID` values share it, and the memo ignores it
        let id = u32::try_from(self.values.len()).unwrap_or(OVERFLOW_ID);
        if id >= OVERFLOW_ID {
            return OVERFLOW_ID;
        }
        self.values.push(value);
        self.ids.insert(value, id);
        id
    }
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

/// Why a complete pool is invalid: what the scheduler refuses in its slices
/// (duplicate names, counters that do not add up), or an allocated device
/// of it that cannot be read. Reaching such a pool aborts a search
/// ([`AllocError::InvalidPool`](super::AllocError)); the snapshot lists it
/// in [`Snapshot::pool_issues`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PoolError {
    /// Two counter sets of the pool have the same name.
    #[error("duplicate counter set name {set}")]
    DuplicateCounterSet {
        /// The name.
        set: String,
    },
    /// A shared counter whose value is not a quantity.
    #[error("counter {set}/{counter}: {source}")]
    CounterQuantity {
        /// The counter set.
        set: String,
        /// The counter.
        counter: String,
        /// The parser's error.
        source: QuantityError,
    },
    /// A negative shared counter.
    #[error("counter {set}/{counter} is negative ({value})")]
    NegativeCounter {
        /// The counter set.
        set: String,
        /// The counter.
        counter: String,
        /// Its value as published.
        value: String,
    },
    /// Two devices of the pool have the same name.
    #[error("duplicate device name {device}")]
    DuplicateDevice {
        /// The name.
        device: String,
    },
    /// A device consumes counters of a set the pool does not have.
    #[error("device {device} consumes counters of unknown counter set {set}")]
    UnknownCounterSet {
        /// The device.
        device: String,
        /// The counter set named.
        set: String,
    },
    /// A device consumes a counter its counter set does not have.
    #[error("device {device} consumes unknown counter {counter} of counter set {set}")]
    UnknownCounter {
        /// The device.
        device: String,
        /// The counter named.
        counter: String,
        /// The counter set.
        set: String,
    },
    /// A device an allocated claim uses cannot be read, so what the
    /// allocated claims leave of the pool is unknown.
    #[error("device {device}: {source}")]
    UsedDevice {
        /// The device.
        device: String,
        /// Why it cannot be read.
        source: Malformed,
    },
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
    /// Per slice: the scope of its devices (unless they have their own),
    /// with the node's name as in [`Snapshot::nodes`].
    scopes: Vec<Scope<'a>>,
    pub expected: i64,
    prepared: OnceLock<PreparedPool<'a>>,
}

impl<'a> Pool<'a> {
    /// The pool validated and indexed (on first call).
    pub(crate) fn prepared(&self) -> &PreparedPool<'a> {
        self.prepared_reading(std::iter::empty())
    }

    /// [`prepared`](Self::prepared), when `reads` will be read of every
    /// device next: a first call brings those values into the cache along
    /// with what validation reads.
    pub(crate) fn prepared_reading<'r>(
        &self,
        reads: impl Iterator<Item = &'r Read> + Clone,
    ) -> &PreparedPool<'a> {
        self.prepared.get_or_init(|| {
            for slice in &self.slices {
                std::hint::black_box(touch(slice, reads.clone()));
            }
            prepare(self).unwrap_or_else(PreparedPool::invalid)
        })
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

/// Devices `first..end` of a pool, all with the same scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run<'a> {
    pub first: usize,
    pub end: usize,
    pub scope: Scope<'a>,
    /// The scope of a slice: a node is named as in [`Snapshot::nodes`]
    /// (the same address).
    pub known: bool,
}

/// A counter of one of the pool's counter sets.
#[derive(Debug, Clone)]
pub(crate) struct Counter<'a> {
    pub set: &'a str,
    pub name: &'a str,
    pub total: i128,
}

/// A counter set of a pool: its counters are `counters[first..first + len]`
/// of the pool, in name order.
#[derive(Debug)]
struct CounterSet {
    first: usize,
    len: usize,
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
    /// (device index, use), by index.
    pub existing: Vec<(usize, Existing)>,
    /// Counters left (may be negative).
    pub base_available: Vec<i128>,
    /// Per device, whether it is short of counters next to the allocated
    /// claims alone ([`CountersLeft`], as a byte), learnt on first need:
    /// it depends only on the device and on this snapshot's claims, so a
    /// search of the same snapshot needs no more than this byte to drop a
    /// device whose counters are used up.
    counters_left: Box<[AtomicU8]>,
}

/// What [`PoolUse`] knows of a device's counters next to the allocated
/// claims (the counters a search starts from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountersLeft {
    /// Not known yet.
    Unknown = 0,
    /// The device can be parsed and the counters left cover it (or it
    /// consumes none, or its counters are already consumed by its own
    /// allocations).
    Enough = 1,
    /// The device can be parsed, consumes counters not consumed by its own
    /// allocations, and the counters left do not cover them: no allocation
    /// of this snapshot can get them (a search only consumes more).
    Short = 2,
}

impl PoolUse {
    /// What is known of device `i`'s counters.
    pub(crate) fn counters_left(&self, i: usize) -> CountersLeft {
        match self
            .counters_left
            .get(i)
            .map(|b| b.load(AtomicOrdering::Relaxed))
        {
            Some(1) => CountersLeft::Enough,
            Some(2) => CountersLeft::Short,
            _ => CountersLeft::Unknown,
        }
    }

    /// Records what was learnt of device `i`'s counters.
    pub(crate) fn learn_counters_left(&self, i: usize, left: CountersLeft) {
        if let Some(b) = self.counters_left.get(i) {
            b.store(left as u8, AtomicOrdering::Relaxed);
        }
    }
}

/// A validated, indexed pool.
#[derive(Debug)]
pub(crate) struct PreparedPool<'a> {
    pub invalid: Option<PoolError>,
    pub devices: Vec<PoolDevice<'a>>,
    /// The devices in runs of one scope (a slice's devices share theirs),
    /// so that finding a node's devices reads no device.
    pub runs: Vec<Run<'a>>,
    pub counters: Vec<Counter<'a>>,
    sets: Vec<CounterSet>,
    set_index: FastMap<&'a str, usize>,
    /// The devices' names as (hash, index), sorted: finds a device by name
    /// without reading the other names (made by validation, which looks
    /// for duplicates this way).
    by_hash: Box<[u64]>,
    /// Per device, its parsed forms; made when a first device is parsed.
    parsed: OnceLock<Box<[Parsed<'a>]>>,
    /// What selectors read, per device, as value ids; by read number.
    columns: Mutex<Vec<Option<Arc<Column>>>>,
}

impl<'a> PreparedPool<'a> {
    pub(crate) fn counter(&self, set: &str, name: &str) -> Option<usize> {
        let set = &self.sets[*self.set_index.get(set)?];
        let offset = self.counters[set.first..set.first + set.len]
            .iter()
            .position(|c| c.name == name)?;
        Some(set.first + offset)
    }

    /// The index of the device named `name`.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        let hash = name_hash(name);
        let from = self.by_hash.partition_point(|&e| e & HASH_BITS < hash);
        self.by_hash[from..]
            .iter()
            .take_while(|&&e| e & HASH_BITS == hash)
            .map(|&e| (e & !HASH_BITS) as usize)
            .find(|&i| same(self.devices[i].name().as_bytes(), name.as_bytes()))
    }

    /// Where device `i` can be used.
    pub(crate) fn scope(&self, i: usize) -> Scope<'a> {
        let run = self.runs.partition_point(|r| r.end <= i);
        self.runs.get(run).map_or(Scope::Nowhere, |r| r.scope)
    }

    fn parsed(&self, i: usize) -> &Parsed<'a> {
        &self
            .parsed
            .get_or_init(|| self.devices.iter().map(|_| Parsed::default()).collect())[i]
    }

    /// Device `i` parsed (on first need).
    pub(crate) fn details(&self, i: usize, driver: &'a str) -> Result<&Details<'a>, &Malformed> {
        let counters = |set: &str, name: &str| self.counter(set, name);
        self.parsed(i)
            .details(self.devices[i].raw, driver, &counters)
    }

    /// Whether device `i` has been parsed (see [`details`](Self::details)).
    pub(crate) fn parsed_details(&self, i: usize) -> bool {
        self.parsed.get().is_some_and(|p| p[i].has_details())
    }

    /// Reads one byte of each string that parsing device `i` reads, so
    /// that a loop over devices about to be parsed overlaps their cache
    /// misses (see [`touch`]); the result is meaningless.
    pub(crate) fn touch_details(&self, i: usize) -> usize {
        touch_details(self.devices[i].raw)
    }

    /// Device `i` as CEL selectors see it (converted on first need).
    pub(crate) fn cel(&self, i: usize, driver: &str) -> Result<&CelDevice, &Malformed> {
        self.parsed(i).cel(self.devices[i].raw, driver)
    }

    fn invalid(reason: PoolError) -> Self {
        PreparedPool {
            invalid: Some(reason),
            devices: Vec::new(),
            runs: Vec::new(),
            counters: Vec::new(),
            sets: Vec::new(),
            set_index: FastMap::default(),
            by_hash: Box::default(),
            parsed: OnceLock::new(),
            columns: Mutex::new(Vec::new()),
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
        let slices: Vec<&'a ResourceSlice> = slices.into_iter().collect();
        // the names grouping and sorting compare, with overlapping misses
        // (see `touch`)
        let mut acc = 0usize;
        for slice in &slices {
            let spec = &slice.spec;
            acc = acc.wrapping_add(
                first_byte(&spec.driver)
                    ^ first_byte(&spec.pool.name)
                    ^ spec.node_name.as_deref().map_or(0, first_byte)
                    ^ slice.metadata.name.as_deref().map_or(0, first_byte),
            );
        }
        std::hint::black_box(acc);
        let mut groups: FastMap<(&'a str, &'a str), Vec<&'a ResourceSlice>> = FastMap::default();
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
        let mut node_pools: FastMap<&'a str, Vec<usize>> = FastMap::default();
        let mut any_node_pools = Vec::new();
        for (index, key) in keys.into_iter().enumerate() {
            let mut slices = groups.remove(&key).unwrap_or_default();
            slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            // registers where devices are; returns the scope with the
            // node's name as first seen (the node's key), so that scopes
            // compare by address
            let mut add = |s: Scope<'a>| match s {
                Scope::Node(n) => match node_pools.entry(n) {
                    Entry::Occupied(mut e) => {
                        let key = *e.key();
                        if e.get().last() != Some(&index) {
                            e.get_mut().push(index);
                        }
                        Scope::Node(key)
                    }
                    Entry::Vacant(e) => {
                        e.insert(vec![index]);
                        s
                    }
                },
                Scope::AnyNode => {
                    if any_node_pools.last() != Some(&index) {
                        any_node_pools.push(index);
                    }
                    s
                }
                Scope::Nowhere => s,
            };
            let mut scopes = Vec::with_capacity(slices.len());
            for slice in &slices {
                let mut shared = Scope::Nowhere;
                if per_device(slice) {
                    for d in slice.spec.devices.iter().flatten() {
                        add(scope(
                            d.node_name.as_deref(),
                            d.all_nodes,
                            d.node_selector.is_some(),
                        ));
                    }
                } else if slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()) {
                    shared = add(slice_scope(slice));
                }
                scopes.push(shared);
            }
            pools.push(Pool {
                driver: key.0,
                name: key.1,
                expected: slices
                    .first()
                    .map_or(0, |s| s.spec.pool.resource_slice_count),
                slices,
                scopes,
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
            values: Mutex::new(Interner::default()),
            reads: Mutex::new(Vec::new()),
        }
    }

    /// The number of `read` among the reads columns are kept for.
    pub(crate) fn read_number(&self, read: &Read) -> usize {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = reads.iter().position(|r| r == read) {
            return n;
        }
        reads.push(read.clone());
        reads.len() - 1
    }

    /// The column of the values `read` takes on the devices of a prepared
    /// pool, as ids (equal ids, equal values), made once per pool and
    /// read; its ids are filled by [`fill_column`](Self::fill_column) or,
    /// one device at a time, by [`value_id`](Self::value_id).
    #[cfg(test)]
    pub(crate) fn column(
        &self,
        pool: &Pool<'a>,
        prepared: &PreparedPool<'a>,
        read: &Read,
    ) -> Arc<Column> {
        self.numbered_column(pool, prepared, self.read_number(read), read)
    }

    /// [`column`](Self::column) for a read by its
    /// [number](Self::read_number).
    pub(crate) fn numbered_column(
        &self,
        pool: &Pool<'a>,
        prepared: &PreparedPool<'a>,
        number: usize,
        read: &Read,
    ) -> Arc<Column> {
        let mut columns = prepared
            .columns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(Some(c)) = columns.get(number) {
            return Arc::clone(c);
        }
        // the driver is the pool's: one value for all devices
        let (fill, complete) = match read {
            Read::Driver => (self.intern(RawValue::Str(pool.driver)), true),
            _ => (UNKNOWN_ID, prepared.devices.is_empty()),
        };
        let column = Arc::new(Column {
            read: read.clone(),
            ids: prepared
                .devices
                .iter()
                .map(|_| AtomicU32::new(fill))
                .collect(),
            complete: AtomicBool::new(complete),
        });
        if columns.len() <= number {
            columns.resize(number + 1, None);
        }
        columns[number] = Some(Arc::clone(&column));
        column
    }

    /// Fills every id of `column` still unknown: the values are read
    /// without holding a lock, then numbered under one.
    pub(crate) fn fill_column(
        &self,
        pool: &Pool<'a>,
        prepared: &PreparedPool<'a>,
        column: &Column,
    ) {
        if column.complete.load(AtomicOrdering::Acquire) {
            return;
        }
        // the values, numbered locally (a pool has few distinct values,
        // often in runs), without holding the lock
        let mut distinct = Distinct::default();
        let local: Vec<u32> = prepared
            .devices
            .iter()
            .zip(&column.ids)
            .map(|(device, id)| {
                if id.load(AtomicOrdering::Relaxed) == UNKNOWN_ID {
                    distinct.number(column.read.raw(device.raw, pool.driver))
                } else {
                    UNKNOWN_ID
                }
            })
            .collect();
        let global: Vec<u32> = {
            let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
            distinct.values.iter().map(|v| values.intern(*v)).collect()
        };
        for (n, id) in local.into_iter().zip(&column.ids) {
            if let Some(&g) = global.get(n as usize) {
                id.store(g, AtomicOrdering::Relaxed);
            }
        }
        column.complete.store(true, AtomicOrdering::Release);
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

    /// The value behind an id.
    pub(crate) fn value(&self, id: u32) -> Option<RawValue<'a>> {
        let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        values.values.get(id as usize).copied()
    }

    fn intern(&self, value: RawValue<'a>) -> u32 {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .intern(value)
    }
}

/// The distinct values of a column, numbered in order of appearance.
#[derive(Default)]
struct Distinct<'a> {
    values: Vec<RawValue<'a>>,
    /// Value → number, once there are too many for a linear search.
    index: FastMap<RawValue<'a>, u32>,
    last: Option<(RawValue<'a>, u32)>,
}

impl<'a> Distinct<'a> {
    /// Values searched linearly before an index is built.
    const LINEAR: usize = 16;

    fn number(&mut self, value: RawValue<'a>) -> u32 {
        if let Some((v, n)) = self.last
            && v == value
        {
            return n;
        }
        let found = if self.values.len() <= Self::LINEAR {
            self.values.iter().position(|v| *v == value)
        } else {
            self.index.get(&value).map(|&n| n as usize)
        };
        let n = found.unwrap_or_else(|| {
            self.values.push(value);
            if self.values.len() == Self::LINEAR + 1 {
                self.index = self
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (*v, index_u32(i)))
                    .collect();
            } else if self.values.len() > Self::LINEAR + 1 {
                self.index.insert(value, index_u32(self.values.len() - 1));
            }
            self.values.len() - 1
        });
        let n = index_u32(n);
        self.last = Some((value, n));
        n
    }
}

/// A pool's device index as `u32` (pools hold far fewer devices).
fn index_u32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(UNKNOWN_ID)
}

/// What a selector reads of the devices of one pool, as value ids, filled
/// on first need.
#[derive(Debug)]
pub(crate) struct Column {
    read: Read,
    ids: Box<[AtomicU32]>,
    /// Whether every id is known.
    complete: AtomicBool,
}

impl Column {
    /// Devices in the pool.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The id of device `i`, if known.
    pub(crate) fn id(&self, i: usize) -> Option<u32> {
        let id = self.ids[i].load(AtomicOrdering::Relaxed);
        (id != UNKNOWN_ID).then_some(id)
    }
}

/// Validates and indexes a pool (slices only). Every device of the pool is
/// touched here, so this is the cold cost of a full scan: it allocates
/// little and compares names by merging sorted maps rather than hashing.
fn prepare<'a>(pool: &Pool<'a>) -> Result<PreparedPool<'a>, PoolError> {
    let shared = || {
        pool.slices
            .iter()
            .flat_map(|s| s.spec.shared_counters.iter().flatten())
    };
    let mut counters = Vec::with_capacity(shared().map(|set| set.counters.len()).sum());
    let mut sets: Vec<CounterSet> = Vec::with_capacity(shared().count());
    let mut set_index: FastMap<&'a str, usize> = FastMap::default();
    set_index.reserve(sets.capacity());
    // counter sets repeat a few values ("1", the memory size): parse each
    // distinct text once
    let mut parsed: Vec<(&'a str, i128)> = Vec::new();
    for slice in &pool.slices {
        for set in slice.spec.shared_counters.iter().flatten() {
            if set_index.insert(set.name.as_str(), sets.len()).is_some() {
                return Err(PoolError::DuplicateCounterSet {
                    set: set.name.clone(),
                });
            }
            sets.push(CounterSet {
                first: counters.len(),
                len: set.counters.len(),
            });
            for (name, counter) in &set.counters {
                let text = counter.value.0.as_str();
                let total = if let Some(&(_, total)) = parsed.iter().find(|(t, _)| *t == text) {
                    total
                } else {
                    let total = Quantity::parse(text)
                        .map_err(|source| PoolError::CounterQuantity {
                            set: set.name.clone(),
                            counter: name.clone(),
                            source,
                        })?
                        .nanos();
                    if parsed.len() < 8 {
                        parsed.push((text, total));
                    }
                    total
                };
                if total < 0 {
                    return Err(PoolError::NegativeCounter {
                        set: set.name.clone(),
                        counter: name.clone(),
                        value: counter.value.0.clone(),
                    });
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
    devices.extend(
        pool.slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|raw| PoolDevice { raw }),
    );
    let mut runs: Vec<Run<'a>> = Vec::new();
    let by_hash = name_hashes(devices.len(), |i| devices[i].name());
    let duplicate = first_repeat(&by_hash, |i| devices[i].name());
    // the index of the device below
    let mut index = 0;
    // the set of the previous consumption: devices consume from the same
    // set in runs
    let mut last_set: Option<(&'a str, usize)> = None;
    for (slice, &slice_scope) in pool.slices.iter().zip(&pool.scopes) {
        let per_device = per_device(slice);
        for d in slice.spec.devices.iter().flatten() {
            if duplicate == Some(index) {
                return Err(PoolError::DuplicateDevice {
                    device: d.name.clone(),
                });
            }
            for consumption in d.consumes_counters.iter().flatten() {
                let wanted = consumption.counter_set.as_str();
                let set = match last_set {
                    Some((name, i)) if same(name.as_bytes(), wanted.as_bytes()) => i,
                    _ => {
                        let Some(&i) = set_index.get(wanted) else {
                            return Err(PoolError::UnknownCounterSet {
                                device: d.name.clone(),
                                set: consumption.counter_set.clone(),
                            });
                        };
                        last_set = Some((&consumption.counter_set, i));
                        i
                    }
                };
                let known = &counters[sets[set].first..sets[set].first + sets[set].len];
                if let Some(name) = first_unknown(consumption.counters.keys(), known) {
                    return Err(PoolError::UnknownCounter {
                        device: d.name.clone(),
                        counter: name.clone(),
                        set: consumption.counter_set.clone(),
                    });
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
            match runs.last_mut() {
                Some(run) if run.known != per_device && run.scope.same(&s) => run.end += 1,
                _ => runs.push(Run {
                    first: index,
                    end: index + 1,
                    scope: s,
                    known: !per_device,
                }),
            }
            index += 1;
        }
    }
    Ok(PreparedPool {
        invalid: None,
        devices,
        runs,
        counters,
        sets,
        set_index,
        by_hash: by_hash.into_boxed_slice(),
        parsed: OnceLock::new(),
        columns: Mutex::new(Vec::new()),
    })
}

/// The index of the first of `count` names (`name(i)`) that an earlier one
/// repeats: names numbered by hash, sorted, and compared only where hashes
/// are equal.
#[cfg(test)]
pub(crate) fn first_duplicate<'n>(count: usize, name: impl Fn(usize) -> &'n str) -> Option<usize> {
    first_repeat(&name_hashes(count, &name), name)
}

/// The high half of an entry of [`name_hashes`]: the name's hash.
const HASH_BITS: u64 = !(u32::MAX as u64);

/// The hash of a name, in [`HASH_BITS`].
fn name_hash(name: &str) -> u64 {
    BuildHasherDefault::<FastHasher>::default().hash_one(name) & HASH_BITS
}

/// The `count` names (`name(i)`, fewer than 2^32) as their hash (high
/// half) and index (low half), sorted: one word per name.
fn name_hashes<'n>(count: usize, name: impl Fn(usize) -> &'n str) -> Vec<u64> {
    let mut hashes: Vec<u64> = (0..count)
        .map(|i| name_hash(name(i)) | (i as u64 & !HASH_BITS))
        .collect();
    hashes.sort_unstable();
    hashes
}

/// [`first_duplicate`] on the names' [hashes](name_hashes).
fn first_repeat<'n>(hashes: &[u64], name: impl Fn(usize) -> &'n str) -> Option<usize> {
    let index = |e: u64| (e & !HASH_BITS) as usize;
    let mut first: Option<usize> = None;
    // within a run of equal hashes, indices ascend: the first name there
    // that an earlier one of the run equals is the run's first repeat
    for run in hashes.chunk_by(|a, b| a & HASH_BITS == b & HASH_BITS) {
        let repeat = run.iter().enumerate().skip(1).find_map(|(k, &e)| {
            let j = index(e);
            run[..k]
                .iter()
                .any(|&i| name(index(i)) == name(j))
                .then_some(j)
        });
        if let Some(j) = repeat {
            first = Some(first.map_or(j, |f| f.min(j)));
        }
    }
    first
}

/// The first byte of `s` (0 for an empty string).
fn first_byte(s: &str) -> usize {
    s.as_bytes().first().map_or(0, |b| usize::from(*b))
}

/// Reads one byte of each string that validating a slice's counter sets and
/// devices and then reading `reads` of the devices will compare: counter
/// sets (names, counter names and values), device names, counter set
/// names, consumed counter names, and the attributes and capacities (names
/// and values) whose names are as long as those read. Nothing depends on these
/// reads, so the processor overlaps their cache misses across devices,
/// which the validation's chains of dependent reads cannot: a pool's first
/// visit, bound by memory latency, costs a fraction. The result is
/// meaningless (keep it from being optimised away).
fn touch<'r>(slice: &ResourceSlice, reads: impl Iterator<Item = &'r Read> + Clone) -> usize {
    // the lengths of the names to look for, bare and qualified
    let mut attributes: Vec<usize> = Vec::new();
    let mut capacities: Vec<usize> = Vec::new();
    for read in reads {
        match read {
            Read::Attribute(k) => attributes.extend([k.id.len(), k.qualified.len()]),
            Read::Capacity(k) => capacities.extend([k.id.len(), k.qualified.len()]),
            Read::Driver | Read::AllowMultiple => {}
        }
    }
    let mut acc = 0usize;
    for set in slice.spec.shared_counters.iter().flatten() {
        acc = acc.wrapping_add(first_byte(&set.name));
        for (k, v) in &set.counters {
            acc = acc.wrapping_add(first_byte(k) ^ first_byte(&v.value.0));
        }
    }
    for d in slice.spec.devices.iter().flatten() {
        acc = acc.wrapping_add(first_byte(&d.name));
        for c in d.consumes_counters.iter().flatten() {
            acc = acc.wrapping_add(first_byte(&c.counter_set));
            for k in c.counters.keys() {
                acc = acc.wrapping_add(first_byte(k));
            }
        }
        if !attributes.is_empty() {
            for (k, v) in d.attributes.iter().flatten() {
                if attributes.contains(&k.len()) {
                    let value = v.string.as_deref().or(v.version.as_deref()).unwrap_or("");
                    acc = acc.wrapping_add(first_byte(k) ^ first_byte(value));
                }
            }
        }
        if !capacities.is_empty() {
            for (k, v) in d.capacity.iter().flatten() {
                if capacities.contains(&k.len()) {
                    acc = acc.wrapping_add(first_byte(k) ^ first_byte(&v.value.0));
                }
            }
        }
    }
    acc
}

/// Like [`touch`], for what parsing a device's details reads: its
/// capacities, the amounts of counters it consumes, its taints.
fn touch_details(d: &Device) -> usize {
    let mut acc = 0usize;
    for (k, v) in d.capacity.iter().flatten() {
        acc = acc.wrapping_add(first_byte(k) ^ first_byte(&v.value.0));
    }
    for c in d.consumes_counters.iter().flatten() {
        for (k, v) in &c.counters {
            acc = acc.wrapping_add(first_byte(k) ^ first_byte(&v.value.0));
        }
    }
    for t in d.taints.iter().flatten() {
        acc = acc.wrapping_add(first_byte(&t.key) ^ first_byte(&t.effect));
    }
    acc
}

/// The first of `names` (sorted) that is not the name of one of `known`
/// (a counter set's counters, sorted as well: both come from `BTreeMap`
/// keys, so each name can only be at or after the previous one's place):
/// one forward pass that compares lengths and last bytes before whole
/// names (counter names tend to differ only at the end: `memory-slice-0`,
/// `memory-slice-1`, ...).
fn first_unknown<'n>(
    names: impl Iterator<Item = &'n String>,
    known: &[Counter<'_>],
) -> Option<&'n String> {
    let mut known = known.iter().map(|c| c.name.as_bytes());
    'names: for name in names {
        let name_bytes = name.as_bytes();
        for k in known.by_ref() {
            if k.len() == name_bytes.len() && k.last() == name_bytes.last() && same(k, name_bytes) {
                continue 'names;
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
    let results_of = |claim: &'a ResourceClaim| {
        claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
    };
    let claims: Vec<&'a ResourceClaim> = allocated.into_iter().collect();
    // the names the index below hashes, brought into the cache first with
    // overlapping misses (see `touch`)
    let mut acc = 0usize;
    for r in claims.iter().filter_map(|c| results_of(c)).flatten() {
        acc = acc.wrapping_add(first_byte(&r.driver) ^ first_byte(&r.pool) ^ first_byte(&r.device));
    }
    std::hint::black_box(acc);
    for claim in claims {
        let Some(results) = results_of(claim) else {
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
    /// simulations otherwise do only for the pools they visit), on every
    /// core the machine offers when there are many.
    pub fn pool_issues(&self) -> Vec<PoolIssue> {
        let pools = &self.index.pools;
        let ahead = Ahead::new(pools.len());
        // helpers only for pools still to prepare
        let unprepared = pools.iter().filter(|p| p.prepared.get().is_none()).count();
        let threads = parallel::threads(0, unprepared);
        let prepare = |i: usize| {
            if pools[i].complete() {
                let _ = self.pool_use(i);
            }
        };
        std::thread::scope(|scope| {
            let _stop = StopOnDrop(&ahead);
            if threads > 1 {
                parallel::spawn_helpers(scope, &ahead, threads - 1, &prepare);
            }
            self.collect_issues(&ahead)
        })
    }

    fn collect_issues(&self, ahead: &Ahead) -> Vec<PoolIssue> {
        let mut issues = Vec::new();
        for (i, pool) in self.index.pools.iter().enumerate() {
            ahead.reached(i);
            let reason = if pool.complete() {
                match (pool.prepared().invalid.as_ref(), self.pool_use(i)) {
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

    /// `node` as named in [`nodes`](Self::nodes) (the same address), if
    /// a slice or device names it: scopes of slices compare by address.
    pub(crate) fn known_node(&self, node: Option<&str>) -> Option<&'a str> {
        self.index.node_pools.get_key_value(node?).map(|(k, _)| *k)
    }

    /// The pools a node sees, in allocation order (ascending index).
    pub(crate) fn pools_for(&self, node: Option<&str>) -> Cow<'_, [usize]> {
        let local = node
            .and_then(|n| self.index.node_pools.get(n))
            .map_or(&[][..], Vec::as_slice);
        // both lists ascend: only a mix needs sorting
        if self.index.any_node_pools.is_empty() {
            return Cow::Borrowed(local);
        }
        let mut all: Vec<usize> = local
            .iter()
            .chain(&self.index.any_node_pools)
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        Cow::Owned(all)
    }

    /// Prepares what a search of `node` reads: its pools validated and
    /// indexed, what the allocated claims use of them, and the columns of
    /// `reads` (with their numbers). Helper threads run it ahead of the search; it raises no
    /// errors (the search meets them itself).
    pub(crate) fn warm(&self, node: Option<&str>, reads: &[(usize, &Read)]) {
        for &i in self.pools_for(node).iter() {
            let pool = &self.index.pools[i];
            if !pool.complete() {
                continue;
            }
            let prepared = pool.prepared_reading(reads.iter().map(|(_, r)| *r));
            if prepared.invalid.is_some() || self.pool_use(i).is_err() {
                continue;
            }
            for &(number, read) in reads {
                let column = self.index.numbered_column(pool, prepared, number, read);
                self.index.fill_column(pool, prepared, &column);
            }
        }
    }

    /// What the allocated claims use of pool `i` (complete and valid);
    /// an error when a used device cannot be read.
    pub(crate) fn pool_use(&self, i: usize) -> Result<&PoolUse, &PoolError> {
        self.uses[i].get_or_init(|| self.compute_use(i)).as_ref()
    }

    fn compute_use(&self, i: usize) -> Result<PoolUse, PoolError> {
        let pool = &self.index.pools[i];
        let prepared = pool.prepared();
        let mut result = PoolUse {
            existing: Vec::new(),
            base_available: prepared.counters.iter().map(|c| c.total).collect(),
            counters_left: prepared
                .devices
                .iter()
                .map(|_| AtomicU8::new(CountersLeft::Unknown as u8))
                .collect(),
        };
        let Some(used) = self.allocated.get(&(pool.driver, pool.name)) else {
            return Ok(result);
        };
        // what parsing the used devices reads, with overlapping misses
        let mut acc = 0usize;
        for name in used.keys() {
            if let Some(index) = prepared.index_of(name) {
                acc = acc.wrapping_add(touch_details(prepared.devices[index].raw));
            }
        }
        std::hint::black_box(acc);
        for (name, u) in used {
            let Some(index) = prepared.index_of(name) else {
                continue;
            };
            let details =
                prepared
                    .details(index, pool.driver)
                    .map_err(|e| PoolError::UsedDevice {
                        device: (*name).to_owned(),
                        source: e.clone(),
                    })?;
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
            result.existing.push((index, e));
        }
        result.existing.sort_unstable_by_key(|&(i, _)| i);
        Ok(result)
    }
}
