//! The search for one node: the node's devices in the scheduler's order,
//! cached selector results, the tentative allocation state (devices taken,
//! counters and capacity consumed, constraint values), and the
//! backtracking first-fit over requests, sub-requests and devices.

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::capacity::{self, Fit};
use super::claim::{self, ConstraintKind, Mode, Plan};
use super::device::{Details, PoolDevice, RawValue, lookup, raw_attribute, tolerates};
use super::explain;
use super::output::{self, NodeAllocation};
use super::selectors::{FastMap, Memo, Recall, SelectorTable};
use std::sync::Arc;

use super::snapshot::{Column, Existing, Pool, PreparedPool, Snapshot};
use super::{AllocError, MAX_RESULTS_PER_CLAIM, NodeFilter, Outcome, SimulateOptions};
use crate::cel::{Compiler, EvalError, Evaluator};

pub(crate) fn simulate(
    compiler: &Compiler,
    snapshot: &Snapshot<'_>,
    claim: &ResourceClaim,
    options: &SimulateOptions,
) -> Result<Outcome, AllocError> {
    let mut table = SelectorTable::default();
    let plan = claim::plan(claim, snapshot.classes(), &mut table, compiler)?;
    if plan.requests.is_empty() {
        return Ok(Outcome::Satisfiable(vec![NodeAllocation {
            node: None,
            results: Vec::new(),
        }]));
    }
    let nodes: Vec<Option<&str>> = match &options.nodes {
        NodeFilter::All if snapshot.nodes().is_empty() => {
            if snapshot.has_cluster_wide_devices() {
                vec![None]
            } else {
                Vec::new()
            }
        }
        NodeFilter::All => snapshot.nodes().iter().map(|n| Some(*n)).collect(),
        NodeFilter::Node(n) => vec![Some(n.as_str())],
        NodeFilter::Nodes(list) => list.iter().map(|n| Some(n.as_str())).collect(),
    };
    let mut memo = Memo::default();
    let mut found = Vec::new();
    // the selector verdicts of the nodes that do not fit, for explaining
    let mut verdicts = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let mut search = NodeSearch::new(
            compiler,
            snapshot,
            &plan,
            &table,
            &mut memo,
            *node,
            options.max_search_steps,
        );
        if search.run()? {
            found.push(output::node_allocation(&search));
            if !options.all_fitting_nodes {
                break;
            }
        } else if found.is_empty() {
            verdicts.push(search.into_verdicts());
        }
    }
    if !found.is_empty() {
        return Ok(Outcome::Satisfiable(found));
    }
    let mut reports = Vec::with_capacity(nodes.len());
    for (node, verdicts) in nodes.iter().zip(verdicts) {
        let mut search = NodeSearch::new(
            compiler,
            snapshot,
            &plan,
            &table,
            &mut memo,
            *node,
            options.max_search_steps,
        );
        search.matches = verdicts;
        reports.push(explain::explain_node(&mut search));
    }
    Ok(Outcome::Unsatisfiable(explain::explanation(reports, &plan)))
}

/// A relevant pool of the node.
pub(crate) struct NodePool<'r, 'a> {
    pub pool: &'r Pool<'a>,
    /// `None` for an incomplete pool.
    pub prepared: Option<&'r PreparedPool<'a>>,
    /// Why the pool cannot be used.
    pub invalid: Option<String>,
    /// Counters left by the allocated claims.
    pub base: &'r [i128],
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

/// Cached selector verdict of a variant for a device.
#[derive(Debug, Clone)]
pub(crate) enum Match {
    Unknown,
    Yes,
    /// Failed selector (index into the variant's selectors).
    No(usize),
    Error(usize, EvalError),
    Malformed(String),
}

/// A device tentatively allocated.
#[derive(Debug, Clone)]
pub(crate) struct Pick {
    pub dev: usize,
    pub variant: usize,
    /// Whether this pick consumed the device's counters.
    counters: bool,
    /// An admin-access pick (consumes nothing).
    admin: bool,
    /// Capacity consumed (multi-allocatable devices only).
    pub capacity: Option<Vec<i128>>,
    /// Constraints that counted this device.
    constrained: u64,
}

enum ConstraintState<'a> {
    Match {
        value: Option<RawValue<'a>>,
        count: usize,
    },
    Distinct(Vec<RawValue<'a>>),
}

pub(crate) struct NodeSearch<'r, 'a> {
    compiler: &'r Compiler,
    snapshot: &'r Snapshot<'a>,
    pub plan: &'r Plan,
    pub table: &'r SelectorTable,
    memo: &'r mut Memo,
    pub node: Option<&'r str>,
    pub pools: Vec<NodePool<'r, 'a>>,
    pub devs: Vec<Dev<'r, 'a>>,
    pub order: Vec<Slot>,
    /// Selector verdicts per variant and device.
    pub matches: Vec<Vec<Match>>,
    evaluators: FastMap<usize, Evaluator>,
    unmemoised: FastMap<(usize, usize), Result<bool, EvalError>>,
    /// Per (node pool, selector): the columns of the values it reads.
    columns: FastMap<(usize, usize), Vec<Arc<Column>>>,
    prechecked: Vec<Option<bool>>,
    all_lists: Vec<Option<Vec<usize>>>,
    // tentative state
    /// Non-shareable devices allocated in this attempt.
    taken: Vec<bool>,
    /// Non-admin allocations per device in this attempt (counters are
    /// consumed by the first).
    active: Vec<u32>,
    counters: Vec<Vec<i128>>,
    cap_used: FastMap<usize, Vec<i128>>,
    constraints: Vec<ConstraintState<'a>>,
    pub picks: Vec<Pick>,
    /// Constraints ignored (bit per constraint), for diagnosis.
    pub disabled: u64,
    steps: u64,
    budget: u64,
}

impl<'r, 'a> NodeSearch<'r, 'a> {
    pub(crate) fn new(
        compiler: &'r Compiler,
        snapshot: &'r Snapshot<'a>,
        plan: &'r Plan,
        table: &'r SelectorTable,
        memo: &'r mut Memo,
        node: Option<&'r str>,
        budget: u64,
    ) -> Self {
        let mut pools = Vec::new();
        let mut devs = Vec::new();
        let mut order = Vec::new();
        for index in snapshot.pools_for(node) {
            let pool = &snapshot.pools()[index];
            if !pool.complete() {
                pools.push(NodePool {
                    pool,
                    prepared: None,
                    invalid: None,
                    base: &[],
                });
                continue;
            }
            let prepared = pool.prepared();
            let p = pools.len();
            let pool_use = match (prepared.invalid.as_deref(), snapshot.pool_use(index)) {
                (Some(reason), _) | (None, Err(reason)) => {
                    pools.push(NodePool {
                        pool,
                        prepared: Some(prepared),
                        invalid: Some(reason.to_owned()),
                        base: &[],
                    });
                    order.push(Slot::InvalidPool(p));
                    continue;
                }
                (None, Ok(u)) => u,
            };
            pools.push(NodePool {
                pool,
                prepared: Some(prepared),
                invalid: None,
                base: &pool_use.base_available,
            });
            for (i, device) in prepared.devices.iter().enumerate() {
                if device.scope.includes(node) {
                    order.push(Slot::Device(devs.len()));
                    devs.push(Dev {
                        pool: p,
                        index: i,
                        device,
                        existing: pool_use.existing.get(&i),
                    });
                }
            }
        }
        let variants = plan.variants.len();
        let counters = pools.iter().map(|p| p.base.to_vec()).collect();
        NodeSearch {
            compiler,
            snapshot,
            plan,
            table,
            memo,
            node,
            matches: vec![vec![Match::Unknown; devs.len()]; variants],
            taken: vec![false; devs.len()],
            active: vec![0; devs.len()],
            pools,
            devs,
            order,
            evaluators: FastMap::default(),
            unmemoised: FastMap::default(),
            columns: FastMap::default(),
            prechecked: vec![None; variants],
            all_lists: vec![None; variants],
            counters,
            cap_used: FastMap::default(),
            constraints: Vec::new(),
            picks: Vec::new(),
            disabled: 0,
            steps: 0,
            budget,
        }
    }

    /// The selector verdicts gathered (to seed an explanation).
    pub(crate) fn into_verdicts(self) -> Vec<Vec<Match>> {
        self.matches
    }

    pub(crate) fn node_label(&self) -> String {
        self.node.unwrap_or("(any node)").to_owned()
    }

    pub(crate) fn driver(&self, d: usize) -> &'a str {
        self.pools[self.devs[d].pool].pool.driver
    }

    pub(crate) fn device_id(&self, d: usize) -> String {
        let pool = self.pools[self.devs[d].pool].pool;
        format!(
            "{}/{}/{}",
            pool.driver,
            pool.name,
            self.devs[d].device.name()
        )
    }

    /// The parsed device.
    pub(crate) fn details(&self, d: usize) -> Result<&'r Details<'a>, String> {
        let dev = self.devs[d];
        let pool = &self.pools[dev.pool];
        let prepared = pool.prepared.expect("devices come from prepared pools");
        let lookup = |set: &str, name: &str| prepared.counter(set, name);
        dev.device
            .details(pool.pool.driver, &lookup)
            .map_err(str::to_owned)
    }

    fn malformed(&self, d: usize, reason: String) -> AllocError {
        AllocError::MalformedDevice {
            device: self.device_id(d),
            reason,
        }
    }

    /// Resets the tentative state (for another search on the same node).
    pub(crate) fn reset(&mut self) {
        self.taken.iter_mut().for_each(|t| *t = false);
        self.active.iter_mut().for_each(|a| *a = 0);
        for (p, pool) in self.pools.iter().enumerate() {
            self.counters[p] = pool.base.to_vec();
        }
        self.cap_used.clear();
        self.picks.clear();
        self.steps = 0;
        self.constraints = self
            .plan
            .constraints
            .iter()
            .map(|c| match c.kind {
                ConstraintKind::Match => ConstraintState::Match {
                    value: None,
                    count: 0,
                },
                ConstraintKind::Distinct => ConstraintState::Distinct(Vec::new()),
            })
            .collect();
    }

    /// Searches the node. `Ok(true)` leaves the allocation in `picks`.
    pub(crate) fn run(&mut self) -> Result<bool, AllocError> {
        self.reset();
        // like the scheduler, requests for all devices are resolved before
        // the search starts
        for v in 0..self.plan.variants.len() {
            if self.plan.variants[v].mode == Mode::All && self.all_lists[v].is_none() {
                let list = self.all_list(v)?;
                self.all_lists[v] = Some(list);
            }
        }
        self.request(0)
    }

    fn step(&mut self) -> Result<(), AllocError> {
        self.steps += 1;
        if self.steps > self.budget {
            return Err(AllocError::SearchBudgetExhausted {
                node: self.node_label(),
                steps: self.budget,
            });
        }
        Ok(())
    }

    fn request(&mut self, r: usize) -> Result<bool, AllocError> {
        if r == self.plan.requests.len() {
            return Ok(true);
        }
        for v in self.plan.requests[r].variants.clone() {
            if !self.precheck(v) {
                continue;
            }
            let found = match self.plan.variants[v].mode {
                Mode::All => self.all(r, v)?,
                Mode::Count(n) => self.slot(r, v, n, 0, 0)?,
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Fills slot `filled` of `count` of variant `variant` of request
    /// `request`, trying devices from position `start` on.
    fn slot(
        &mut self,
        request: usize,
        variant: usize,
        count: usize,
        filled: usize,
        start: usize,
    ) -> Result<bool, AllocError> {
        if filled == count {
            return self.request(request + 1);
        }
        if self.picks.len() >= MAX_RESULTS_PER_CLAIM {
            return Ok(false);
        }
        for position in start..self.order.len() {
            let device = match self.order[position] {
                Slot::Device(device) => device,
                Slot::InvalidPool(pool) => return Err(self.invalid_pool(pool)),
            };
            self.step()?;
            let Some(pick) = self.try_pick(variant, device)? else {
                continue;
            };
            // devices of one request in ascending order; a shared device
            // may serve the next slot too
            let next = if self.devs[device].device.multi() {
                position
            } else {
                position + 1
            };
            self.apply(pick);
            if self.slot(request, variant, count, filled + 1, next)? {
                return Ok(true);
            }
            self.undo();
        }
        Ok(false)
    }

    fn all(&mut self, r: usize, v: usize) -> Result<bool, AllocError> {
        let list = self.all_lists[v].clone().unwrap_or_default();
        if list.is_empty() || self.picks.len() + list.len() > MAX_RESULTS_PER_CLAIM {
            return Ok(false);
        }
        let mut applied = 0;
        for d in list {
            self.step()?;
            let Some(pick) = self.try_pick(v, d)? else {
                (0..applied).for_each(|_| self.undo());
                return Ok(false);
            };
            self.apply(pick);
            applied += 1;
        }
        if self.request(r + 1)? {
            return Ok(true);
        }
        (0..applied).for_each(|_| self.undo());
        Ok(false)
    }

    pub(crate) fn invalid_pool(&self, p: usize) -> AllocError {
        let pool = &self.pools[p];
        AllocError::InvalidPool {
            node: self.node_label(),
            pool: pool.pool.id(),
            reason: pool.invalid.clone().unwrap_or_default(),
        }
    }

    /// The devices a request for all devices takes on this node.
    fn all_list(&mut self, v: usize) -> Result<Vec<usize>, AllocError> {
        for (i, p) in self.pools.iter().enumerate() {
            match p.prepared {
                None => {
                    return Err(AllocError::IncompletePool {
                        node: self.node_label(),
                        request: self.plan.variants[v].name.clone(),
                        pool: p.pool.id(),
                        reason: p.pool.incomplete_reason(),
                    });
                }
                Some(_) if p.invalid.is_some() => return Err(self.invalid_pool(i)),
                Some(_) => {}
            }
        }
        let mut list = Vec::new();
        for d in 0..self.devs.len() {
            if !self.selected(v, d)? {
                continue;
            }
            if self.plan.variants[v].admin {
                list.push(d);
                continue;
            }
            let details = self.details(d).map_err(|e| self.malformed(d, e))?;
            if matches!(self.fit(v, d, details, false)?, Fit::Fits(_)) {
                list.push(d);
            }
        }
        Ok(list)
    }

    /// The selector verdict of variant `v` for device `d`, evaluated on
    /// first need; errors are kept in the verdict.
    pub(crate) fn verdict(&mut self, v: usize, d: usize) -> Match {
        if !matches!(self.matches[v][d], Match::Unknown) {
            return self.matches[v][d].clone();
        }
        let mut verdict = Match::Yes;
        for (stage, &sel) in self.plan.variants[v].selectors.iter().enumerate() {
            match self.evaluate(sel, d) {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    verdict = Match::No(stage);
                    break;
                }
                Ok(Err(e)) => {
                    verdict = Match::Error(stage, e);
                    break;
                }
                Err(reason) => {
                    verdict = Match::Malformed(reason);
                    break;
                }
            }
        }
        self.matches[v][d] = verdict.clone();
        verdict
    }

    /// Whether the device passes the variant's selectors; errors abort.
    fn selected(&mut self, v: usize, d: usize) -> Result<bool, AllocError> {
        match self.verdict(v, d) {
            Match::Yes => Ok(true),
            Match::No(_) | Match::Unknown => Ok(false),
            Match::Error(stage, source) => {
                let sel = self.plan.variants[v].selectors[stage];
                Err(AllocError::CelRuntime {
                    location: self.table.entries[sel].source.location(),
                    device: self.device_id(d),
                    node: self.node_label(),
                    source,
                })
            }
            Match::Malformed(reason) => Err(self.malformed(d, reason)),
        }
    }

    /// Gathers the columns of the values selector `sel` reads, for node
    /// pool `p`.
    fn ensure_columns(&mut self, p: usize, sel: usize) {
        let snapshot = self.snapshot;
        let table = self.table;
        let pool = &self.pools[p];
        self.columns.entry((p, sel)).or_insert_with(|| {
            let prepared = pool.prepared.expect("devices come from prepared pools");
            table.entries[sel]
                .projection
                .iter()
                .flatten()
                .map(|read| snapshot.index.column(pool.pool, prepared, read))
                .collect()
        });
    }

    /// One selector on one device: memoised by the values it reads.
    fn evaluate(&mut self, sel: usize, d: usize) -> Result<Result<bool, EvalError>, String> {
        let table = self.table;
        let entry = &table.entries[sel];
        let dev = self.devs[d];
        let memoised = entry.projection.is_some();
        if memoised {
            self.ensure_columns(dev.pool, sel);
            let columns = &self.columns[&(dev.pool, sel)];
            let pool = &self.pools[dev.pool];
            let prepared = pool.prepared.expect("devices come from prepared pools");
            let index = &self.snapshot.index;
            let ids = columns
                .iter()
                .map(|c| index.value_id(pool.pool, prepared, c, dev.index));
            if let Recall::Hit(result) = self.memo.recall(sel, ids) {
                return Ok(result);
            }
        } else if let Some(r) = self.unmemoised.get(&(sel, d)) {
            return Ok(r.clone());
        }
        if !self.evaluators.contains_key(&d) {
            let cel = dev.device.cel(self.driver(d)).map_err(str::to_owned)?;
            self.evaluators.insert(d, self.compiler.evaluator(cel));
        }
        let result = self.evaluators[&d].matches(&entry.selector);
        self.memo.evaluations += 1;
        if memoised {
            self.memo.store(sel, result.clone());
        } else {
            self.unmemoised.insert((sel, d), result.clone());
        }
        Ok(result)
    }

    /// Capacity fit of device `d` for variant `v`, next to the allocated
    /// claims and (with `tentative`) the allocation in progress.
    pub(crate) fn fit(
        &self,
        v: usize,
        d: usize,
        details: &Details<'_>,
        tentative: bool,
    ) -> Result<Fit, AllocError> {
        let dev = self.devs[d];
        let used = |i: usize| {
            let existing = dev
                .existing
                .and_then(|e| e.capacity.get(i).copied())
                .unwrap_or(0);
            let now = if tentative {
                self.cap_used
                    .get(&d)
                    .and_then(|c| c.get(i).copied())
                    .unwrap_or(0)
            } else {
                0
            };
            existing.saturating_add(now)
        };
        let variant = &self.plan.variants[v];
        capacity::fit(
            &variant.capacity,
            self.driver(d),
            &details.capacities,
            &used,
        )
        .map_err(|reason| AllocError::CapacityRequest {
            request: variant.name.clone(),
            device: self.device_id(d),
            reason,
        })
    }

    /// Whether the pool has the counters the device consumes, given
    /// `available`.
    pub(crate) fn counters_fit(details: &Details<'_>, available: &[i128]) -> bool {
        details
            .consumes
            .iter()
            .all(|&(c, amount)| available.get(c).is_some_and(|a| *a >= amount))
    }

    pub(crate) fn tolerated(&self, v: usize, details: &Details<'_>) -> bool {
        let tolerations = &self.plan.variants[v].tolerations;
        details
            .taints
            .iter()
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
    }

    /// Whether device `d` can be added for variant `v` now; what adding it
    /// means.
    fn try_pick(&mut self, v: usize, d: usize) -> Result<Option<Pick>, AllocError> {
        let dev = self.devs[d];
        let admin = self.plan.variants[v].admin;
        if self.taken[d] || (!admin && dev.in_use()) {
            return Ok(None);
        }
        if !self.selected(v, d)? {
            return Ok(None);
        }
        let details = self.details(d).map_err(|e| self.malformed(d, e))?;
        let multi = dev.device.multi();
        let mut capacity = None;
        if !admin {
            match self.fit(v, d, details, true)? {
                Fit::Fits(consumed) => capacity = multi.then_some(consumed),
                _ => return Ok(None),
            }
        }
        let counters = !admin
            && !details.consumes.is_empty()
            && !dev.counters_consumed()
            && self.active[d] == 0;
        if counters && !Self::counters_fit(details, &self.counters[dev.pool]) {
            return Ok(None);
        }
        if !self.tolerated(v, details) {
            return Ok(None);
        }
        let mut constrained = 0u64;
        for &c in &self.plan.variants[v].constraints {
            if self.disabled & (1 << c) != 0 {
                continue;
            }
            let Some(value) = self.constraint_value(c, d) else {
                return Ok(None);
            };
            let ok = match &self.constraints[c] {
                ConstraintState::Match { value: Some(x), .. } => *x == value,
                ConstraintState::Match { value: None, .. } => true,
                ConstraintState::Distinct(values) => !values.contains(&value),
            };
            if !ok {
                return Ok(None);
            }
            constrained |= 1 << c;
        }
        Ok(Some(Pick {
            dev: d,
            variant: v,
            counters,
            admin,
            capacity,
            constrained,
        }))
    }

    /// The value of constraint `c`'s attribute on device `d`; `None` when
    /// the device lacks it (or it is malformed). Values compare as
    /// published, versions as text, as in the scheduler.
    fn constraint_value(&self, c: usize, d: usize) -> Option<RawValue<'a>> {
        let constraint = &self.plan.constraints[c];
        let raw = self.devs[d].device.raw;
        match raw_attribute(lookup(
            raw.attributes.as_ref(),
            self.driver(d),
            &constraint.domain,
            &constraint.id,
            &constraint.qualified,
        )) {
            RawValue::Missing | RawValue::Malformed => None,
            value => Some(value),
        }
    }

    fn apply(&mut self, pick: Pick) {
        let d = pick.dev;
        let dev = self.devs[d];
        if !dev.device.multi() {
            self.taken[d] = true;
        }
        if !pick.admin {
            self.active[d] += 1;
        }
        if pick.counters
            && let Ok(details) = self.details(d)
        {
            for &(c, amount) in &details.consumes {
                self.counters[dev.pool][c] -= amount;
            }
        }
        if let Some(consumed) = &pick.capacity {
            let used = self
                .cap_used
                .entry(d)
                .or_insert_with(|| vec![0; consumed.len()]);
            for (u, c) in used.iter_mut().zip(consumed) {
                *u += c;
            }
        }
        if pick.constrained != 0 {
            for c in 0..self.constraints.len() {
                if pick.constrained & (1 << c) == 0 {
                    continue;
                }
                let Some(value) = self.constraint_value(c, d) else {
                    continue;
                };
                match &mut self.constraints[c] {
                    ConstraintState::Match { value: v, count } => {
                        *v = Some(value);
                        *count += 1;
                    }
                    ConstraintState::Distinct(values) => values.push(value),
                }
            }
        }
        self.picks.push(pick);
    }

    fn undo(&mut self) {
        let Some(pick) = self.picks.pop() else {
            return;
        };
        let d = pick.dev;
        let dev = self.devs[d];
        self.taken[d] = false;
        if !pick.admin {
            self.active[d] -= 1;
        }
        if pick.counters
            && let Ok(details) = self.details(d)
        {
            for &(c, amount) in &details.consumes {
                self.counters[dev.pool][c] += amount;
            }
        }
        if let Some(consumed) = &pick.capacity
            && let Some(used) = self.cap_used.get_mut(&d)
        {
            for (u, c) in used.iter_mut().zip(consumed) {
                *u -= c;
            }
        }
        for c in 0..self.constraints.len() {
            if pick.constrained & (1 << c) == 0 {
                continue;
            }
            match &mut self.constraints[c] {
                ConstraintState::Match { value, count } => {
                    *count -= 1;
                    if *count == 0 {
                        *value = None;
                    }
                }
                ConstraintState::Distinct(values) => {
                    values.pop();
                }
            }
        }
    }

    /// Cheap necessary condition for variant `v`: enough devices that could
    /// be available when nothing else of this claim is allocated. Never
    /// raises errors (a device whose selectors fail with an error counts as
    /// a candidate: the search will meet the error itself).
    fn precheck(&mut self, v: usize) -> bool {
        if let Some(ok) = self.prechecked[v] {
            return ok;
        }
        let ok = self.precheck_uncached(v);
        self.prechecked[v] = Some(ok);
        ok
    }

    fn precheck_uncached(&mut self, v: usize) -> bool {
        let Mode::Count(needed) = self.plan.variants[v].mode else {
            return true;
        };
        if self.order.iter().any(|s| matches!(s, Slot::InvalidPool(_))) {
            return true;
        }
        let admin = self.plan.variants[v].admin;
        let mut found = 0;
        for d in 0..self.devs.len() {
            let dev = self.devs[d];
            if !admin && dev.in_use() {
                continue;
            }
            match self.verdict(v, d) {
                Match::No(_) | Match::Unknown => continue,
                Match::Error(..) | Match::Malformed(_) => {
                    found += 1;
                }
                Match::Yes => {
                    let Ok(details) = self.details(d) else {
                        found += 1;
                        continue;
                    };
                    if !admin {
                        match self.fit(v, d, details, false) {
                            Ok(Fit::Fits(_)) | Err(_) => {}
                            Ok(_) => continue,
                        }
                        // the counters left by allocated claims, not the
                        // tentative ones: the verdict is cached
                        let base = self.pools[dev.pool].base;
                        if !dev.counters_consumed()
                            && !details.consumes.is_empty()
                            && !Self::counters_fit(details, base)
                        {
                            continue;
                        }
                    }
                    if !self.tolerated(v, details) {
                        continue;
                    }
                    if dev.device.multi() {
                        return true;
                    }
                    found += 1;
                }
            }
            if found >= needed {
                return true;
            }
        }
        false
    }
}
