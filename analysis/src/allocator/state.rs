//! The state of a node's search, shared by the modules that work on it:
//! what every node's search of one simulation shares ([`Context`]), the
//! node's devices and pools, the selector verdicts, and the tentative
//! allocation ([`NodeSearch`]). [`super::search`] builds and runs it,
//! [`super::explain`] explains a node from it and [`super::output`] turns a
//! fitting one into an allocation; [`super::run`] calls all three. A leaf:
//! only types, so none of those modules depends on another through it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::claim::Plan;
use super::device::{Malformed, PoolDevice, RawValue};
use super::intern::FastMap;
use super::selectors::{Memo, Read, SelectorTable};
use super::snapshot::{Column, Existing, Pool, PoolError, PoolUse, PreparedPool, Snapshot};
use crate::cel::{Compiler, EvalError, Evaluator};

/// What the searches of every node of one simulation share.
pub(crate) struct Context<'r, 'a> {
    pub(super) compiler: &'r Compiler,
    pub(super) snapshot: &'r Snapshot<'a>,
    pub(super) plan: &'r Plan,
    pub(super) table: &'r SelectorTable,
    /// Per selector: the numbers of the reads of its projection (see
    /// [`SliceIndex::read_number`](super::snapshot::SliceIndex::read_number)).
    pub(super) reads: Vec<Vec<usize>>,
    /// Per selector: whether it is the first of a variant (it sees every
    /// device the variant considers, so its columns are filled for whole
    /// pools at once).
    pub(super) first: Vec<bool>,
    /// What the first selectors read, with the reads' numbers: what is
    /// read of every device.
    pub(super) eager: Vec<(usize, &'r Read)>,
    pub(super) budget: u64,
    /// Set once a precheck parses a device: from then on helper threads
    /// run the prechecks of the nodes they prepare, so that the parsing
    /// (kept in the snapshot) is shared between cores.
    pub(super) parsing: AtomicBool,
}
/// The selector verdicts of one node: per variant, per device.
pub(crate) type NodeVerdicts = Vec<Vec<Match>>;
/// The buffers of a node's search, handed from one node to the next so
/// that a scan allocates them once.
#[derive(Default)]
pub(crate) struct Scratch<'r, 'a> {
    pub(super) pools: Vec<NodePool<'r, 'a>>,
    pub(super) devs: Vec<Dev<'r, 'a>>,
    pub(super) order: Vec<Slot>,
    pub(super) columns: Vec<Option<Vec<Arc<Column>>>>,
    pub(super) taken: Vec<bool>,
    pub(super) active: Vec<u32>,
    pub(super) counters: Vec<Vec<i128>>,
}

/// A relevant pool of the node.
pub(crate) struct NodePool<'r, 'a> {
    pub pool: &'r Pool<'a>,
    /// `None` for an incomplete pool.
    pub prepared: Option<&'r PreparedPool<'a>>,
    /// Why the pool cannot be used.
    pub invalid: Option<&'r PoolError>,
    /// Counters left by the allocated claims.
    pub base: &'r [i128],
    /// What the allocated claims use of the pool (complete, valid pools).
    pub uses: Option<&'r PoolUse>,
}

/// A device of the node.
#[derive(Clone, Copy)]
pub(crate) struct Dev<'r, 'a> {
    /// Index into `NodeSearch::pools`.
    pub pool: usize,
    /// Index into the pool's devices.
    pub index: usize,
    pub device: &'r PoolDevice<'a>,
    pub existing: Option<&'r Existing>,
}

impl Dev<'_, '_> {
    pub(crate) fn in_use(&self) -> bool {
        self.existing.is_some_and(|e| e.exclusive)
    }

    pub(crate) fn counters_consumed(&self) -> bool {
        self.existing.is_some_and(Existing::active)
    }
}

/// The node's devices in allocation order; reaching an invalid pool is an
/// error.
#[derive(Clone, Copy)]
pub(crate) enum Slot {
    Device(usize),
    InvalidPool(usize),
}

/// Cached selector verdict of a variant for a device (two words: a node
/// keeps one per device and variant).
#[derive(Debug, Clone)]
pub(crate) enum Match {
    Unknown,
    Yes,
    /// Failed selector (index into the variant's selectors).
    No(usize),
    /// The selectors could not judge the device (rare, so boxed).
    Failed(Box<Failure>),
}

/// Why selectors could not judge a device.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// Selector `stage` (index into the variant's selectors) failed at run
    /// time.
    Error(usize, EvalError),
    /// The device could not be converted for CEL.
    Malformed(Malformed),
}

/// A device tentatively allocated.
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub dev: usize,
    pub variant: usize,
    /// Whether this pick consumed the device's counters.
    pub(super) counters: bool,
    /// An admin-access pick (consumes nothing).
    pub(super) admin: bool,
    /// Capacity consumed (multi-allocatable devices only).
    pub capacity: Option<Vec<i128>>,
    /// Constraints that counted this device.
    pub(super) constrained: u64,
}

/// The tentative state of one constraint (`matchAttribute`: the value
/// agreed on and how many devices share it; `distinctAttribute`: the values
/// taken).
pub(crate) enum ConstraintState<'a> {
    Match {
        value: Option<RawValue<'a>>,
        count: usize,
    },
    Distinct(Vec<RawValue<'a>>),
}

/// The search of one node: its devices in the scheduler's order, the
/// selector verdicts and caches, and the tentative allocation. Built, run
/// and finished by [`super::search`]; read by [`super::explain`] and
/// [`super::output`].
pub(crate) struct NodeSearch<'r, 'a> {
    pub(super) ctx: &'r Context<'r, 'a>,
    pub(super) snapshot: &'r Snapshot<'a>,
    pub plan: &'r Plan,
    pub table: &'r SelectorTable,
    pub(super) memo: Memo,
    pub node: Option<&'r str>,
    pub pools: Vec<NodePool<'r, 'a>>,
    pub devs: Vec<Dev<'r, 'a>>,
    pub order: Vec<Slot>,
    /// Selector verdicts per variant and device.
    pub matches: Vec<Vec<Match>>,
    pub(super) evaluators: FastMap<usize, Evaluator>,
    pub(super) unmemoised: FastMap<(usize, usize), Result<bool, EvalError>>,
    /// Per node pool and selector (`pool * selectors + selector`): the
    /// columns of the values it reads.
    pub(super) columns: Vec<Option<Vec<Arc<Column>>>>,
    pub(super) prechecked: Vec<Option<bool>>,
    pub(super) all_lists: Vec<Option<Vec<usize>>>,
    // tentative state
    /// Non-shareable devices allocated in this attempt.
    pub(super) taken: Vec<bool>,
    /// Non-admin allocations per device in this attempt (counters are
    /// consumed by the first).
    pub(super) active: Vec<u32>,
    pub(super) counters: Vec<Vec<i128>>,
    pub(super) cap_used: FastMap<usize, Vec<i128>>,
    pub(super) constraints: Vec<ConstraintState<'a>>,
    pub picks: Vec<Pick>,
    /// Constraints ignored (bit per constraint), for diagnosis.
    pub disabled: u64,
    pub(super) steps: u64,
}
