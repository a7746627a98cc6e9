//! A simulation of kube-scheduler's structured-parameters allocator: given
//! the ResourceSlices, DeviceClasses and already allocated ResourceClaims of
//! a cluster, can a claim be allocated, on which node, with which devices,
//! and if not, why not.
//!
//! It answers the controller's "why is this claim pending" Events and the
//! CLI's `simulate`, so it must never call a claim satisfiable that the
//! scheduler's rules forbid. It follows the scheduler (Kubernetes 1.34 to
//! 1.36 with all DRA features on):
//!
//! - **Pools**: only slices of a pool's highest generation count, and only
//!   when all `resourceSliceCount` slices are there (an incomplete pool
//!   offers no devices; a request with `allocationMode: All` that would see
//!   one is an error). Counter sets are pool-wide, wherever they are
//!   published (1.35+ puts them in slices of their own; 1.34 next to the
//!   devices). Duplicate device or counter-set names, or consumption of an
//!   unknown counter, make a pool invalid: reaching it is an error, as in
//!   the scheduler. Pools are visited ordered by driver and name, slices by
//!   name, devices in slice order.
//! - **Nodes**: a node sees the node-local slices naming it plus the slices
//!   for `allNodes`; **simplification**: slices and devices with a
//!   `nodeSelector` are treated as available on every node (node labels are
//!   not part of the snapshot).
//! - **Requests**: the DeviceClass's selectors, then the request's, all must
//!   be true; a CEL runtime error aborts the simulation with an error (the
//!   scheduler fails its Filter), it is never "no match". Selectors are
//!   evaluated lazily in the scheduler's order (never on a device already in
//!   use), so an error surfaces exactly when the scheduler would meet it.
//!   `ExactCount` takes `count` devices (default 1), `All` takes every
//!   matching device of the node and fails if any of them cannot be
//!   allocated or if there is none. `firstAvailable` tries its sub-requests
//!   in order. At most 32 devices per claim.
//! - **Search**: first fit in the scheduler's order with full backtracking
//!   over requests, sub-requests and devices, so a combination that
//!   satisfies the constraints is found whenever one exists. Devices of one
//!   request are chosen in ascending order, each at most once, also one
//!   that allows multiple allocations: the scheduler resumes the search for
//!   a request's next device after the one it took (another request of the
//!   claim may take another share of it). A step budget per node stands in
//!   for the scheduler's Filter timeout: running out is an error, never a
//!   verdict.
//! - **Constraints**: `matchAttribute` (all chosen devices of the listed
//!   requests, or of all requests when none are listed, have the same
//!   value; a device without the attribute fails) and `distinctAttribute`
//!   (pairwise different values); values compare as published (versions as
//!   text). An `All` request whose devices break a constraint does not fit
//!   (the scheduler reports that as an error).
//! - **Availability**: a device allocated to another claim without a share
//!   ID is in use. Devices that consume counters draw them from their pool's
//!   counter sets, never below zero, counting what allocated devices
//!   already consume; a device's counters are consumed once while it has
//!   any (non-admin) allocation, also several shares of a multi-allocatable
//!   device (the scheduler's code is inconsistent there; this is the
//!   physical reading). Multi-allocatable devices (`allowMultipleAllocations`)
//!   are shared by claims, each allocation consuming every capacity of the
//!   device per the capacity's request policy (the request rounded up to
//!   the next valid value or range step; an unrequested capacity consumes
//!   the policy's default, or all of it when there is none); the sum stays
//!   within the capacity. Capacity arithmetic is exact (nano-units). Devices
//!   with a `NoSchedule`/`NoExecute` taint need a matching toleration.
//! - **Admin access** requests may take devices that are in use and consume
//!   neither counters nor capacity; allocated admin-access results do not
//!   make a device busy.
//!
//! Speed: everything derived from the slices is computed lazily and kept in
//! the [`Snapshot`] (shared by [`Snapshot::with_allocated`] when only
//! claims change): pools are validated and indexed on first visit, a
//! device is parsed only when the search needs its capacities or counters
//! and converted for CEL only when a selector must really be evaluated, and
//! the values each selector reads are kept per pool in columns of interned
//! ids (filled for a whole pool at once for the first selector of a
//! request, which sees every device). Selector results are memoised by
//! those ids (1,000 nodes of identical GPUs cost a handful of CEL
//! evaluations), and the search stops at the first node that fits unless
//! all are asked for. Before searching a node, a precheck counts the
//! devices that could serve each request; a device short of counters next
//! to the allocated claims is remembered as such by the snapshot (not by
//! the slices' part: other claims, other counters), so that later
//! simulations drop it without reading it again.
//!
//! A cold full scan is bound by memory latency, not by computation: every
//! device's name and consumed counters (validation) and the attributes its
//! selectors read are scattered small allocations of the Kubernetes
//! objects. A pool's first visit therefore reads one byte of each of those
//! strings in a loop of independent reads, so that the processor overlaps
//! the cache misses, before validating it. Once the first node does not
//! fit, helper threads ([`SimulateOptions::threads`]) prepare the pools of
//! the last nodes while the search walks from the first, and the nodes
//! that do not fit are explained in parallel; the answer never depends on
//! them. The benchmark in `analysis/benches/allocator.rs` measures one
//! claim against 1,000 nodes with 8 dynamically partitioned GPUs each.
//!
//! The modules, each using only those listed before it: `intern` (value
//! ids, the fast hasher), `parallel`, `device`, `selectors` (compiled
//! selectors, the memo), `snapshot`, `capacity`, `claim` (the plan of a
//! claim), `state` (a node's search: its types), `search` (running one
//! node), `explain` and `output` (reading a finished search), and `run`
//! (one simulation over the nodes, calling the three before it).

mod capacity;
mod claim;
mod device;
mod explain;
mod intern;
mod output;
mod parallel;
mod run;
mod search;
mod selectors;
mod snapshot;
mod state;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cel::{CompileError, Compiler, EvalError};

pub use capacity::CapacityError;
pub use device::Malformed;
pub use explain::{
    ClosestDevice, Explanation, FailureReason, Needed, NodeExplanation, RequestReport,
    SelectorSource, StageReport, VariantReport,
};
pub use output::{AllocatedDevice, NodeAllocation};
pub use snapshot::{PoolIssue, Snapshot};

/// The most devices one claim can get (`AllocationResultsMaxSize`).
pub const MAX_RESULTS_PER_CLAIM: usize = 32;

/// Default of [`SimulateOptions::max_search_steps`].
pub const DEFAULT_MAX_SEARCH_STEPS: u64 = 1_000_000;

/// Which nodes to simulate for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodeFilter {
    /// Every node named by a slice or device, in name order; when none is
    /// named but cluster-wide devices exist, one anonymous node.
    #[default]
    All,
    /// One node, whether or not a slice names it (it always sees the
    /// cluster-wide devices).
    Node(String),
    /// These nodes, in the given order.
    Nodes(Vec<String>),
}

/// How to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulateOptions {
    /// The nodes to try.
    pub nodes: NodeFilter,
    /// Report every node that fits instead of stopping at the first.
    pub all_fitting_nodes: bool,
    /// Devices tried per node before giving up with
    /// [`AllocError::SearchBudgetExhausted`].
    pub max_search_steps: u64,
    /// Threads that may work on one simulation: once the first node does
    /// not fit, the calling thread searches the nodes in order while the
    /// others prepare the pools of the last ones, and the nodes that do not
    /// fit are explained in parallel. `0` (the default): as many as the
    /// machine offers, at most 8, for scans of 32 nodes or more; `1`: the
    /// calling thread only; `n`: up to `n` (at most one per node). The
    /// answer is the same for every value.
    pub threads: usize,
}

impl Default for SimulateOptions {
    fn default() -> Self {
        SimulateOptions {
            nodes: NodeFilter::All,
            all_fitting_nodes: false,
            max_search_steps: DEFAULT_MAX_SEARCH_STEPS,
            threads: 0,
        }
    }
}

/// The answer of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The claim can be allocated: the first node that fits, or all of them
    /// with [`SimulateOptions::all_fitting_nodes`].
    Satisfiable(Vec<NodeAllocation>),
    /// No node fits; why.
    Unsatisfiable(Explanation),
}

impl Outcome {
    /// Whether the claim can be allocated.
    pub fn is_satisfiable(&self) -> bool {
        matches!(self, Outcome::Satisfiable(_))
    }

    /// The allocations, if satisfiable.
    pub fn allocations(&self) -> Option<&[NodeAllocation]> {
        match self {
            Outcome::Satisfiable(a) => Some(a),
            Outcome::Unsatisfiable(_) => None,
        }
    }

    /// The explanation, if unsatisfiable.
    pub fn explanation(&self) -> Option<&Explanation> {
        match self {
            Outcome::Satisfiable(_) => None,
            Outcome::Unsatisfiable(e) => Some(e),
        }
    }
}

/// Why a simulation could not give a verdict. Input errors name the field;
/// errors met during the search name the node (like a scheduler Filter
/// error, they abort the attempt rather than meaning "does not fit").
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The claim is malformed (a field the API server would have rejected,
    /// or a combination the scheduler refuses).
    #[error("invalid claim: {field}: {reason}")]
    InvalidClaim {
        /// The field path, e.g. `spec.devices.requests[0].exactly.count`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error("request `{request}`: device class `{class}` not found")]
    UnknownDeviceClass {
        /// The request (`main/sub` for a sub-request).
        request: String,
        /// The class name.
        class: String,
    },
    /// A selector has no CEL expression (an unknown selector type).
    #[error("{location}: selector has no CEL expression (unsupported selector type)")]
    EmptySelector {
        /// Which selector, e.g. "device class `gpu` selector #0".
        location: String,
    },
    /// A selector does not compile.
    #[error("{location}: CEL compile error: {source}")]
    Compile {
        /// Which selector, e.g. "request `gpu` selector #1".
        location: String,
        /// The compiler's error.
        source: CompileError,
    },
    /// A selector failed at run time on a device (missing attribute,
    /// wrong types, cost limit): the scheduler aborts the attempt.
    #[error("{location}: CEL runtime error on device {device} of node {node}: {source}")]
    CelRuntime {
        /// Which selector.
        location: String,
        /// `<driver>/<pool>/<device>`.
        device: String,
        /// The node simulated.
        node: String,
        /// The evaluator's error.
        source: EvalError,
    },
    /// The search reached a pool that is invalid.
    #[error("node {node}: resource pool {pool} is invalid: {reason}")]
    InvalidPool {
        /// The node simulated.
        node: String,
        /// `<driver>/<pool>`.
        pool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request for all devices sees a pool whose slices are not all
    /// published yet.
    #[error(
        "node {node}: request `{request}` asks for all devices, but resource pool {pool} is incomplete ({reason})"
    )]
    IncompletePool {
        /// The node simulated.
        node: String,
        /// The request.
        request: String,
        /// `<driver>/<pool>`.
        pool: String,
        /// Slices seen and expected.
        reason: String,
    },
    /// A device that the search needed could not be read (a malformed
    /// attribute, capacity, counter or taint).
    #[error("device {device}: {reason}")]
    MalformedDevice {
        /// `<driver>/<pool>/<device>`.
        device: String,
        /// What is wrong.
        reason: Malformed,
    },
    /// A capacity request cannot be applied to a device (names the same
    /// capacity twice, or the rounded value is out of range).
    #[error("request `{request}` on device {device}: {reason}")]
    CapacityRequest {
        /// The request.
        request: String,
        /// `<driver>/<pool>/<device>`.
        device: String,
        /// What is wrong.
        reason: CapacityError,
    },
    /// The claim asks for more devices than a claim can hold.
    #[error("claim asks for at least {requested} devices, more than the {max} a claim can hold")]
    TooManyDevices {
        /// Devices asked for (a lower bound with sub-requests).
        requested: u64,
        /// [`MAX_RESULTS_PER_CLAIM`].
        max: usize,
    },
    /// The search tried more devices than allowed on one node.
    #[error("node {node}: search gave up after {steps} steps without a verdict")]
    SearchBudgetExhausted {
        /// The node simulated.
        node: String,
        /// Steps taken.
        steps: u64,
    },
}

/// Simulates allocations. Holds the CEL compiler (and so its cache of
/// compiled selectors); cheap to share.
#[derive(Debug, Clone)]
pub struct Allocator {
    compiler: Arc<Compiler>,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::new()
    }
}

impl Allocator {
    /// An allocator with its own CEL compiler (Kubernetes' limits).
    pub fn new() -> Self {
        Allocator::with_compiler(Arc::new(Compiler::new()))
    }

    /// An allocator using a shared compiler.
    pub fn with_compiler(compiler: Arc<Compiler>) -> Self {
        Allocator { compiler }
    }

    /// The compiler in use.
    pub fn compiler(&self) -> &Arc<Compiler> {
        &self.compiler
    }

    /// Simulates allocating `claim` against `snapshot`. The claim's own
    /// `status.allocation` is ignored; an allocated copy of it among the
    /// snapshot's claims counts like any other allocated claim.
    pub fn simulate(
        &self,
        snapshot: &Snapshot<'_>,
        claim: &ResourceClaim,
        options: &SimulateOptions,
    ) -> Result<Outcome, AllocError> {
        run::simulate(&self.compiler, snapshot, claim, options)
    }
}
