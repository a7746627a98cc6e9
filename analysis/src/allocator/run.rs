//! One simulation over the nodes: the plan of the claim, then the nodes in
//! order (with helper threads preparing the pools of the nodes ahead), each
//! searched by [`super::search`]; the first nodes that fit become
//! allocations ([`super::output`]), and when none fits, every node is
//! explained ([`super::explain`], in parallel runs of consecutive nodes).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::claim;
use super::explain::{self, NodeExplanation};
use super::output::{self, NodeAllocation};
use super::parallel::{self, Ahead, StopOnDrop};
use super::selectors::{Memo, SelectorTable};
use super::snapshot::Snapshot;
use super::state::{Context, NodeSearch, NodeVerdicts, Scratch};
use super::{AllocError, NodeFilter, Outcome, SimulateOptions};
use crate::cel::Compiler;

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
    let threads = parallel::threads(options.threads, nodes.len());
    let ctx = Context::new(compiler, snapshot, &plan, &table, options.max_search_steps);
    let mut memo = Memo::default();
    let (found, verdicts) = scan(&ctx, &mut memo, &nodes, options, threads)?;
    if !found.is_empty() {
        return Ok(Outcome::Satisfiable(found));
    }
    let reports = explain_nodes(&ctx, &mut memo, &nodes, verdicts, threads);
    Ok(Outcome::Unsatisfiable(explain::explanation(reports, &plan)))
}
/// What a scan found: the nodes that fit, and the selector verdicts of the
/// nodes that do not (in order, until the first fit), for explaining.
type Scan = (Vec<NodeAllocation>, Vec<NodeVerdicts>);

/// Searches the nodes in order. Once the first node does not fit, helper
/// threads prepare the pools of the last nodes, walking back towards the
/// search; once a precheck has had to parse devices, they run the
/// prechecks of those nodes too (what they parse and learn is kept in the
/// snapshot, the answer is the walk's).
fn scan<'r, 'a>(
    ctx: &'r Context<'r, 'a>,
    memo: &mut Memo,
    nodes: &[Option<&'r str>],
    options: &SimulateOptions,
    threads: usize,
) -> Result<Scan, AllocError> {
    let ahead = Ahead::new(nodes.len());
    // a helper's memo and buffers, kept from node to node
    let warm = |state: &mut (Memo, Scratch<'r, 'a>), i: usize| {
        ctx.snapshot.warm(nodes[i], &ctx.eager);
        if ctx.parsing.load(Ordering::Relaxed) {
            let (memo, scratch) = std::mem::take(state);
            let mut search = NodeSearch::new(ctx, nodes[i], memo, scratch);
            search.precheck_all();
            let (_, memo, scratch) = search.finish();
            *state = (memo, scratch);
        }
    };
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&ahead);
        let mut found = Vec::new();
        let mut verdicts = Vec::new();
        let mut scratch = Scratch::default();
        for (i, node) in nodes.iter().enumerate() {
            ahead.reached(i);
            if i == 1 && threads > 1 {
                parallel::spawn_helpers_with(scope, &ahead, threads - 1, warm);
            }
            let mut search = NodeSearch::new(ctx, *node, std::mem::take(memo), scratch);
            let fits = search.run();
            if matches!(fits, Ok(true)) {
                found.push(output::node_allocation(&search));
            }
            let node_verdicts;
            (node_verdicts, *memo, scratch) = search.finish();
            if fits? {
                if !options.all_fitting_nodes {
                    break;
                }
            } else if found.is_empty() {
                verdicts.push(node_verdicts);
            }
        }
        Ok((found, verdicts))
    })
}

/// Explains every node (seeded with its verdicts), in `threads` runs of
/// consecutive nodes, each with its own copy of the memo.
fn explain_nodes(
    ctx: &Context<'_, '_>,
    memo: &mut Memo,
    nodes: &[Option<&str>],
    verdicts: Vec<NodeVerdicts>,
    threads: usize,
) -> Vec<NodeExplanation> {
    let explain_run = |memo: &mut Memo, nodes: &[Option<&str>], verdicts: Vec<NodeVerdicts>| {
        let mut scratch = Scratch::default();
        let mut reports = Vec::with_capacity(verdicts.len());
        for (node, verdicts) in nodes.iter().zip(verdicts) {
            let mut search =
                NodeSearch::with_verdicts(ctx, *node, std::mem::take(memo), scratch, verdicts);
            reports.push(explain::explain_node(&mut search));
            (_, *memo, scratch) = search.finish();
        }
        reports
    };
    let runs = threads.min(verdicts.len());
    if runs <= 1 {
        return explain_run(memo, nodes, verdicts);
    }
    let size = verdicts.len().div_ceil(runs);
    let mut rest = verdicts.into_iter();
    // each run's verdicts, taken by the thread that explains it (or by
    // this one, when a thread cannot be started)
    let slots: Vec<Mutex<Option<Vec<NodeVerdicts>>>> = (0..runs)
        .map(|_| Mutex::new(Some(rest.by_ref().take(size).collect())))
        .collect();
    let take = |k: usize| {
        slots[k]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default()
    };
    std::thread::scope(|scope| {
        let (explain_run, take) = (&explain_run, &take);
        let handles: Vec<_> = (1..runs)
            .map(|k| {
                let mut own = memo.clone();
                std::thread::Builder::new()
                    .name("allocator-explain".to_owned())
                    .spawn_scoped(scope, move || {
                        explain_run(&mut own, &nodes[k * size..], take(k))
                    })
            })
            .collect();
        let mut reports = explain_run(memo, nodes, take(0));
        for (k, handle) in (1..runs).zip(handles) {
            let part = match handle {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(_) => explain_run(memo, &nodes[k * size..], take(k)),
            };
            reports.extend(part);
        }
        reports
    })
}
