//! The search of one node: its devices in the scheduler's order, cached
//! selector results, the tentative allocation state (devices taken,
//! counters and capacity consumed, constraint values), and the
//! backtracking first-fit over requests, sub-requests and devices. The
//! state it works on is [`super::state`]'s; [`super::run`] drives it over
//! the nodes.

use std::sync::atomic::{AtomicBool, Ordering};

use super::capacity::{self, Fit};
use super::claim::{ConstraintKind, Mode, Plan};
use super::device::{Details, Malformed, RawValue, Scope, lookup, raw_attribute, tolerates};
use super::intern::FastMap;
use super::selectors::{Memo, Read, Recall, SelectorTable};
use super::snapshot::{CountersLeft, Snapshot};
use super::state::{
    ConstraintState, Context, Dev, Failure, Match, NodePool, NodeSearch, NodeVerdicts, Pick,
    Scratch, Slot,
};
use super::{AllocError, MAX_RESULTS_PER_CLAIM};
use crate::cel::{Compiler, EvalError};

impl<'r, 'a> Context<'r, 'a> {
    pub(crate) fn new(
        compiler: &'r Compiler,
        snapshot: &'r Snapshot<'a>,
        plan: &'r Plan,
        table: &'r SelectorTable,
        budget: u64,
    ) -> Self {
        let reads: Vec<Vec<usize>> = table
            .entries
            .iter()
            .map(|e| {
                e.projection
                    .iter()
                    .flatten()
                    .map(|r| snapshot.index.read_number(r))
                    .collect()
            })
            .collect();
        let mut first = vec![false; table.entries.len()];
        let mut eager: Vec<(usize, &'r Read)> = Vec::new();
        for sel in plan.first_selectors() {
            first[sel] = true;
            let projection = table.entries[sel].projection.iter().flatten();
            for (&number, read) in reads[sel].iter().zip(projection) {
                if !eager.iter().any(|(n, _)| *n == number) {
                    eager.push((number, read));
                }
            }
        }
        Context {
            compiler,
            snapshot,
            plan,
            table,
            reads,
            first,
            eager,
            budget,
            parsing: AtomicBool::new(false),
        }
    }
}
impl<'r, 'a> NodeSearch<'r, 'a> {
    /// A search of `node`, with the memo of the simulation so far and
    /// buffers to fill (see [`finish`](Self::finish)).
    pub(crate) fn new(
        ctx: &'r Context<'r, 'a>,
        node: Option<&'r str>,
        memo: Memo,
        scratch: Scratch<'r, 'a>,
    ) -> Self {
        Self::build(ctx, node, memo, scratch, None)
    }

    /// A search of `node` that knows the selector verdicts of an earlier
    /// one (of the same simulation).
    pub(crate) fn with_verdicts(
        ctx: &'r Context<'r, 'a>,
        node: Option<&'r str>,
        memo: Memo,
        scratch: Scratch<'r, 'a>,
        verdicts: NodeVerdicts,
    ) -> Self {
        Self::build(ctx, node, memo, scratch, Some(verdicts))
    }

    /// The selector verdicts gathered (to seed an explanation), the memo
    /// and the buffers, for the next node.
    pub(crate) fn finish(self) -> (NodeVerdicts, Memo, Scratch<'r, 'a>) {
        let scratch = Scratch {
            pools: self.pools,
            devs: self.devs,
            order: self.order,
            columns: self.columns,
            taken: self.taken,
            active: self.active,
            counters: self.counters,
        };
        (self.matches, self.memo, scratch)
    }

    fn build(
        ctx: &'r Context<'r, 'a>,
        node: Option<&'r str>,
        memo: Memo,
        scratch: Scratch<'r, 'a>,
        verdicts: Option<NodeVerdicts>,
    ) -> Self {
        let Scratch {
            mut pools,
            mut devs,
            mut order,
            mut columns,
            taken,
            active,
            counters,
        } = scratch;
        pools.clear();
        devs.clear();
        order.clear();
        let snapshot = ctx.snapshot;
        let known = snapshot.known_node(node);
        for &index in snapshot.pools_for(node).iter() {
            let pool = &snapshot.pools()[index];
            if !pool.complete() {
                pools.push(NodePool {
                    pool,
                    prepared: None,
                    invalid: None,
                    base: &[],
                    uses: None,
                });
                continue;
            }
            let prepared = pool.prepared_reading(ctx.eager.iter().map(|(_, r)| *r));
            let p = pools.len();
            let pool_use = match (prepared.invalid.as_ref(), snapshot.pool_use(index)) {
                (Some(reason), _) | (None, Err(reason)) => {
                    pools.push(NodePool {
                        pool,
                        prepared: Some(prepared),
                        invalid: Some(reason),
                        base: &[],
                        uses: None,
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
                uses: Some(pool_use),
            });
            // devices come in ascending index, like the uses
            let mut existing = pool_use.existing.iter().peekable();
            devs.reserve(prepared.devices.len());
            order.reserve(prepared.devices.len());
            for run in &prepared.runs {
                let included = match run.scope {
                    // a slice's scope names the node as `known` does: at
                    // the same address, or it is another node
                    Scope::Node(n) if run.known => known.is_some_and(|k| std::ptr::eq(k, n)),
                    scope => scope.includes(node),
                };
                if !included {
                    continue;
                }
                for (i, device) in prepared.devices[run.first..run.end].iter().enumerate() {
                    let i = run.first + i;
                    order.push(Slot::Device(devs.len()));
                    while existing.next_if(|(e, _)| *e < i).is_some() {}
                    devs.push(Dev {
                        pool: p,
                        index: i,
                        device,
                        existing: existing.next_if(|(e, _)| *e == i).map(|(_, e)| e),
                    });
                }
            }
        }
        let variants = ctx.plan.variants.len();
        columns.clear();
        columns.resize(pools.len() * ctx.table.entries.len(), None);
        NodeSearch {
            ctx,
            snapshot,
            plan: ctx.plan,
            table: ctx.table,
            memo,
            node,
            matches: verdicts.unwrap_or_else(|| {
                (0..variants)
                    .map(|_| {
                        let mut m = Vec::with_capacity(devs.len());
                        m.resize_with(devs.len(), || Match::Unknown);
                        m
                    })
                    .collect()
            }),
            pools,
            devs,
            order,
            evaluators: FastMap::default(),
            unmemoised: FastMap::default(),
            columns,
            prechecked: vec![None; variants],
            all_lists: vec![None; variants],
            // the tentative state is sized by `reset`, when a search runs
            taken,
            active,
            counters,
            cap_used: FastMap::default(),
            constraints: Vec::new(),
            picks: Vec::new(),
            disabled: 0,
            steps: 0,
        }
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

    /// Where device `d` can be used.
    pub(crate) fn scope(&self, d: usize) -> Scope<'a> {
        let dev = self.devs[d];
        self.pools[dev.pool]
            .prepared
            .map_or(Scope::Nowhere, |p| p.scope(dev.index))
    }

    /// The parsed device.
    pub(crate) fn details(&self, d: usize) -> Result<&'r Details<'a>, &'r Malformed> {
        let dev = self.devs[d];
        let pool = &self.pools[dev.pool];
        let prepared = pool.prepared.expect("devices come from prepared pools");
        prepared.details(dev.index, pool.pool.driver)
    }

    fn malformed(&self, d: usize, reason: &Malformed) -> AllocError {
        AllocError::MalformedDevice {
            device: self.device_id(d),
            reason: reason.clone(),
        }
    }

    /// Resets the tentative state (for another search on the same node).
    pub(crate) fn reset(&mut self) {
        let n = self.devs.len();
        self.taken.clear();
        self.taken.resize(n, false);
        self.active.clear();
        self.active.resize(n, 0);
        self.counters.resize_with(self.pools.len(), Vec::new);
        for (counters, pool) in self.counters.iter_mut().zip(&self.pools) {
            counters.clear();
            counters.extend_from_slice(pool.base);
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
        if self.steps > self.ctx.budget {
            return Err(AllocError::SearchBudgetExhausted {
                node: self.node_label(),
                steps: self.ctx.budget,
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
            // devices of one request in ascending order, each at most
            // once: the scheduler resumes the next slot's search after the
            // device it just took, so a device that allows multiple
            // allocations serves one slot of a request too (another request
            // of the claim may take another share of it)
            let next = position + 1;
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
            reason: pool.invalid.map(ToString::to_string).unwrap_or_default(),
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
    pub(crate) fn verdict(&mut self, v: usize, d: usize) -> &Match {
        if !matches!(self.matches[v][d], Match::Unknown) {
            return &self.matches[v][d];
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
                    verdict = Match::Failed(Box::new(Failure::Error(stage, e)));
                    break;
                }
                Err(reason) => {
                    verdict = Match::Failed(Box::new(Failure::Malformed(reason)));
                    break;
                }
            }
        }
        self.matches[v][d] = verdict;
        &self.matches[v][d]
    }

    /// Whether the device passes the variant's selectors; errors abort.
    fn selected(&mut self, v: usize, d: usize) -> Result<bool, AllocError> {
        match self.verdict(v, d) {
            Match::Yes => Ok(true),
            Match::No(_) | Match::Unknown => Ok(false),
            Match::Failed(failure) => match (**failure).clone() {
                Failure::Error(stage, source) => {
                    let sel = self.plan.variants[v].selectors[stage];
                    Err(AllocError::CelRuntime {
                        location: self.table.entries[sel].source.location(),
                        device: self.device_id(d),
                        node: self.node_label(),
                        source,
                    })
                }
                Failure::Malformed(reason) => Err(self.malformed(d, &reason)),
            },
        }
    }

    /// Gathers the columns of the values selector `sel` reads, for node
    /// pool `p`. A first selector's are filled for all the pool's devices
    /// at once (reading a value has no effect but its cost, and a pool's
    /// values are cheapest read together); the others' device by device.
    fn ensure_columns(&mut self, p: usize, sel: usize) -> usize {
        let slot = p * self.table.entries.len() + sel;
        if self.columns[slot].is_none() {
            let pool = &self.pools[p];
            let prepared = pool.prepared.expect("devices come from prepared pools");
            let index = &self.snapshot.index;
            let eager = self.ctx.first[sel];
            let numbers = &self.ctx.reads[sel];
            let columns = self.table.entries[sel]
                .projection
                .iter()
                .flatten()
                .zip(numbers)
                .map(|(read, &number)| {
                    let column = index.numbered_column(pool.pool, prepared, number, read);
                    if eager {
                        index.fill_column(pool.pool, prepared, &column);
                    }
                    column
                })
                .collect();
            self.columns[slot] = Some(columns);
        }
        slot
    }

    /// The id of the value that read `k` of selector `sel`'s projection
    /// takes on device `d`.
    pub(crate) fn value_id(&mut self, sel: usize, k: usize, d: usize) -> Option<u32> {
        let dev = self.devs[d];
        let slot = self.ensure_columns(dev.pool, sel);
        let column = self.columns[slot].as_deref()?.get(k)?;
        let pool = &self.pools[dev.pool];
        let prepared = pool.prepared?;
        Some(
            self.snapshot
                .index
                .value_id(pool.pool, prepared, column, dev.index),
        )
    }

    /// The value behind a column id.
    pub(crate) fn snapshot_value(&self, id: u32) -> Option<RawValue<'a>> {
        self.snapshot.index.value(id)
    }

    /// One selector on one device: memoised by the values it reads.
    fn evaluate(&mut self, sel: usize, d: usize) -> Result<Result<bool, EvalError>, Malformed> {
        let table = self.table;
        let entry = &table.entries[sel];
        let dev = self.devs[d];
        let memoised = entry.projection.is_some();
        if memoised {
            let slot = self.ensure_columns(dev.pool, sel);
            let columns = self.columns[slot].as_deref().unwrap_or_default();
            let pool = &self.pools[dev.pool];
            let prepared = pool.prepared.expect("devices come from prepared pools");
            let index = &self.snapshot.index;
            let ids = columns.iter().map(|c| {
                c.id(dev.index)
                    .unwrap_or_else(|| index.value_id(pool.pool, prepared, c, dev.index))
            });
            if let Recall::Hit(result) = self.memo.recall(sel, ids) {
                return Ok(result);
            }
        } else if let Some(r) = self.unmemoised.get(&(sel, d)) {
            return Ok(r.clone());
        }
        if !self.evaluators.contains_key(&d) {
            let prepared = self.pools[dev.pool]
                .prepared
                .expect("devices come from prepared pools");
            let cel = prepared
                .cel(dev.index, self.driver(d))
                .map_err(Malformed::clone)?;
            self.evaluators.insert(d, self.ctx.compiler.evaluator(cel));
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

    /// What the snapshot knows of device `d`'s counters next to the
    /// allocated claims.
    fn known_counters_left(&self, d: usize) -> CountersLeft {
        let dev = self.devs[d];
        self.pools[dev.pool]
            .uses
            .map_or(CountersLeft::Unknown, |u| u.counters_left(dev.index))
    }

    /// Whether device `d` (parsed: `details`) is short of counters next to
    /// the allocated claims (not the tentative allocation: the answer is
    /// kept in the snapshot for later searches).
    fn learn_counters_left(&self, d: usize, details: &Details<'_>) -> CountersLeft {
        let dev = self.devs[d];
        let pool = &self.pools[dev.pool];
        let left = if !dev.counters_consumed()
            && !details.consumes.is_empty()
            && !Self::counters_fit(details, pool.base)
        {
            CountersLeft::Short
        } else {
            CountersLeft::Enough
        };
        if let Some(uses) = pool.uses {
            uses.learn_counters_left(dev.index, left);
        }
        left
    }

    /// Reads what parsing the devices from `from` on that
    /// [`precheck`](Self::precheck) may parse for variant `v` reads, in a
    /// loop of independent reads (see `touch` in the snapshot), so that a
    /// first search of a pool pays for their cache misses together rather
    /// than one after the other.
    fn prefetch_details(&mut self, v: usize, admin: bool, from: usize) {
        let mut acc = 0usize;
        for d in from..self.devs.len() {
            let dev = self.devs[d];
            if (!admin && dev.in_use()) || !matches!(self.verdict(v, d), Match::Yes) {
                continue;
            }
            if !admin && self.known_counters_left(d) == CountersLeft::Short {
                continue;
            }
            if let Some(prepared) = self.pools[dev.pool].prepared
                && !prepared.parsed_details(dev.index)
            {
                acc = acc.wrapping_add(prepared.touch_details(dev.index));
            }
        }
        std::hint::black_box(acc);
    }

    /// Runs the precheck of every variant (a helper thread's preparation
    /// of a node: what it parses and learns is kept in the snapshot).
    pub(crate) fn precheck_all(&mut self) {
        for v in 0..self.plan.variants.len() {
            self.precheck(v);
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
        // once a device must be parsed, what the devices after it need is
        // brought in together, when verdicts are cheap (memoised)
        let mut prefetched = !self.plan.variants[v]
            .selectors
            .iter()
            .all(|&sel| self.table.entries[sel].projection.is_some());
        let mut found = 0;
        for d in 0..self.devs.len() {
            let dev = self.devs[d];
            if !admin && dev.in_use() {
                continue;
            }
            let selected = match self.verdict(v, d) {
                Match::No(_) | Match::Unknown => continue,
                Match::Failed(_) => false,
                Match::Yes => true,
            };
            if !selected {
                // a selector error: the search meets it itself
                found += 1;
            } else if !admin && self.known_counters_left(d) == CountersLeft::Short {
                // short of counters (known from an earlier search of this
                // snapshot): dropped without reading the device
                continue;
            } else {
                if let Some(prepared) = self.pools[dev.pool].prepared
                    && !prepared.parsed_details(dev.index)
                {
                    self.ctx.parsing.store(true, Ordering::Relaxed);
                    if !prefetched {
                        prefetched = true;
                        self.prefetch_details(v, admin, d);
                    }
                }
                match self.details(d) {
                    // the search meets the error itself
                    Err(_) => found += 1,
                    Ok(details) => {
                        // all of these must hold, in any order (a capacity
                        // error counts as a candidate): the counters, which
                        // the snapshot remembers, first
                        if !admin
                            && (self.learn_counters_left(d, details) == CountersLeft::Short
                                || matches!(
                                    self.fit(v, d, details, false),
                                    Ok(Fit::Missing(_)
                                        | Fit::Policy(_)
                                        | Fit::TooLarge(_)
                                        | Fit::Exhausted(_))
                                ))
                        {
                            continue;
                        }
                        if !self.tolerated(v, details) {
                            continue;
                        }
                        // a shared device too serves one slot only
                        found += 1;
                    }
                }
            }
            if found >= needed {
                return true;
            }
        }
        false
    }
}
