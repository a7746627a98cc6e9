//! The cost bounds of CEL evaluation (the model is described in the
//! [module header](super)): the limits, the static estimate, the
//! thread-local runtime meter, and the instrumentation that makes the
//! interpreter charge the meter.

use std::cell::Cell;

use cel::ExecutionError;
use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr,
    StructExpr, operators,
};
use cel::common::types::{CelBytes, CelInt, CelString, Kind};
use cel::common::value::{CowVal, Val};

/// The name of the instrumentation function. Not a valid CEL identifier, so
/// expressions cannot call it.
pub(crate) const COST_FN: &str = "@cost";

/// Size assumed for anything read from the device: Kubernetes caps strings
/// at 64 characters and a device at 32 attributes and capacities.
const DEVICE_VALUE_SIZE: u64 = 64;
/// Sizes are clamped here so estimates cannot overflow.
const MAX_SIZE: u64 = 1 << 40;

/// The limits of compiling and evaluating selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest expression, in bytes (Kubernetes: 10 KiB).
    pub max_expression_bytes: usize,
    /// Deepest nesting of the parsed expression tree.
    pub max_depth: usize,
    /// Limit of the static cost estimate, checked at compile time
    /// (Kubernetes: 1,000,000).
    pub estimated_cost_limit: u64,
    /// Budget of one evaluation, checked at run time (Kubernetes: 1,000,000).
    pub runtime_cost_limit: u64,
    /// How many compiled selectors the cache keeps.
    pub cache_capacity: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_expression_bytes: 10 * 1024,
            max_depth: 48,
            estimated_cost_limit: 1_000_000,
            runtime_cost_limit: 1_000_000,
            cache_capacity: 1024,
        }
    }
}

// ---------------------------------------------------------------------------
// Runtime meter
// ---------------------------------------------------------------------------

thread_local! {
    /// Units left in the current evaluation; `None` once exceeded.
    static BUDGET: Cell<Option<u64>> = const { Cell::new(Some(0)) };
}

/// Starts an evaluation with `budget` units.
pub(crate) fn start(budget: u64) {
    BUDGET.with(|b| b.set(Some(budget)));
}

/// Whether the current evaluation ran out of budget.
pub(crate) fn exceeded() -> bool {
    BUDGET.with(|b| b.get().is_none())
}

/// Units left in the current evaluation.
pub(crate) fn remaining() -> u64 {
    BUDGET.with(|b| b.get().unwrap_or(0))
}

/// Charges `units`; fails once the budget is spent.
pub(crate) fn charge(units: u64) -> Result<(), ExecutionError> {
    BUDGET.with(|b| {
        if let Some(left) = b.get().and_then(|left| left.checked_sub(units)) {
            b.set(Some(left));
            Ok(())
        } else {
            b.set(None);
            Err(ExecutionError::function_error(
                "cost",
                "evaluation exceeded its cost budget",
            ))
        }
    })
}

/// Units for reading or writing `bytes` bytes of a string.
pub(crate) fn bytes_cost(bytes: usize) -> u64 {
    1 + bytes as u64 / 16
}

/// The size of a value in cost units: one per element or entry, one per 16
/// bytes of string; counting stops at `cap`.
pub(crate) fn size_of(value: &dyn Val, cap: u64) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        if total > cap {
            break;
        }
        match v.get_type().kind() {
            Kind::String => {
                total += v
                    .downcast_ref::<CelString>()
                    .map_or(1, |s| bytes_cost(s.len()));
            }
            Kind::Bytes => {
                total += v
                    .downcast_ref::<CelBytes>()
                    .map_or(1, |s| bytes_cost(s.len()));
            }
            Kind::List | Kind::Map => {
                total += 1;
                let indexer = v.as_indexer();
                if let Some(iterable) = v.as_iterable() {
                    let mut items = iterable.iter();
                    while let Some(item) = items.next() {
                        if total > cap {
                            break;
                        }
                        stack.push(item);
                        if v.get_type().kind() == Kind::Map
                            && let Some(Ok(CowVal::Borrowed(value))) = indexer.map(|i| i.get(item))
                        {
                            stack.push(value);
                        }
                    }
                }
            }
            _ => total += 1,
        }
    }
    total
}

/// `@cost(value, weight)`: charges `weight` plus the size of `value`, and
/// returns `value`.
pub(crate) fn cost_fn<'b, 'v>(
    mut args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    if args.len() != 2 {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    }
    let weight = args[1]
        .downcast_ref::<CelInt>()
        .map_or(0, |w| u64::try_from(*w.inner()).unwrap_or(0));
    let value = args.swap_remove(0);
    let size = size_of(value.as_ref(), remaining().saturating_add(1));
    charge(weight.saturating_add(size))?;
    Ok(value)
}

// ---------------------------------------------------------------------------
// Tree shape
// ---------------------------------------------------------------------------

/// The direct children of a node.
pub(crate) fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The depth of the tree, computed without recursion.
pub(crate) fn depth(e: &IdedExpr) -> usize {
    let mut max = 0;
    let mut stack = vec![(e, 1usize)];
    while let Some((node, d)) = stack.pop() {
        max = max.max(d);
        stack.extend(children(node).into_iter().map(|c| (c, d + 1)));
    }
    max
}

/// The number of nodes, computed without recursion.
pub(crate) fn node_count(e: &IdedExpr) -> u64 {
    let mut count = 0;
    let mut stack = vec![e];
    while let Some(node) = stack.pop() {
        count += 1;
        stack.extend(children(node));
    }
    count
}

/// A `cel.bind`: a comprehension over an empty list that never loops.
pub(crate) fn is_bind(c: &ComprehensionExpr) -> bool {
    matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty())
        && matches!(&c.loop_cond.expr, Expr::Literal(LiteralValue::Boolean(b)) if !*b.inner())
}

// ---------------------------------------------------------------------------
// Static estimate
// ---------------------------------------------------------------------------

/// Estimated cost and value sizes of a node.
#[derive(Debug, Clone, Copy)]
struct Est {
    /// Cost units to evaluate it.
    cost: u64,
    /// Largest size of its value: string bytes, list or map entries.
    size: u64,
    /// Largest size of one element, for lists and maps.
    elem: u64,
}

impl Est {
    fn scalar(cost: u64) -> Self {
        Est {
            cost,
            size: 1,
            elem: 1,
        }
    }
}

/// The static cost estimate of a (macro-expanded) expression.
pub(crate) fn estimate(e: &IdedExpr) -> u64 {
    estimate_node(e, &mut Vec::new()).cost
}

fn estimate_node(e: &IdedExpr, scope: &mut Vec<(String, Est)>) -> Est {
    let clamp = |v: u64| v.min(MAX_SIZE);
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Est {
            cost: 1,
            size: s.len() as u64,
            elem: 1,
        },
        Expr::Literal(LiteralValue::Bytes(b)) => Est {
            cost: 1,
            size: b.len() as u64,
            elem: 1,
        },
        Expr::Literal(_) | Expr::Unspecified => Est::scalar(1),
        Expr::Ident(name) => match scope.iter().rev().find(|(n, _)| n == name) {
            Some((_, est)) => Est { cost: 1, ..*est },
            None => Est {
                cost: 1,
                size: DEVICE_VALUE_SIZE,
                elem: DEVICE_VALUE_SIZE,
            },
        },
        Expr::Select(select) => {
            let operand = estimate_node(&select.operand, scope);
            let size = operand.elem.max(DEVICE_VALUE_SIZE);
            Est {
                cost: operand.cost.saturating_add(1),
                size,
                elem: size,
            }
        }
        Expr::List(list) => {
            let items: Vec<Est> = list
                .elements
                .iter()
                .map(|i| estimate_node(i, scope))
                .collect();
            Est {
                cost: items.iter().fold(1u64, |c, i| c.saturating_add(i.cost)),
                size: list.elements.len() as u64,
                elem: items.iter().map(|i| i.size).max().unwrap_or(1),
            }
        }
        Expr::Map(_) | Expr::Struct(_) => {
            let items: Vec<Est> = children(e)
                .into_iter()
                .map(|i| estimate_node(i, scope))
                .collect();
            Est {
                cost: items.iter().fold(1u64, |c, i| c.saturating_add(i.cost)),
                size: items.len() as u64 / 2 + 1,
                elem: items.iter().map(|i| i.size).max().unwrap_or(1),
            }
        }
        Expr::Call(call) => estimate_call(call, scope),
        Expr::Comprehension(c) => {
            let range = estimate_node(&c.iter_range, scope);
            let init = estimate_node(&c.accu_init, scope);
            let bind = is_bind(c);
            let iterations = if bind { 0 } else { range.size };
            let accu = if bind {
                init
            } else {
                Est {
                    cost: 1,
                    size: clamp(init.size.max(iterations)),
                    elem: range.elem.max(init.elem),
                }
            };
            scope.push((c.accu_var.clone(), accu));
            let element = Est {
                cost: 1,
                size: range.elem,
                elem: range.elem,
            };
            scope.push((c.iter_var.clone(), element));
            if let Some(v2) = &c.iter_var2 {
                scope.push((v2.clone(), element));
            }
            let cond = estimate_node(&c.loop_cond, scope);
            let step = estimate_node(&c.loop_step, scope);
            scope.truncate(scope.len() - 1 - usize::from(c.iter_var2.is_some()));
            let result = estimate_node(&c.result, scope);
            scope.pop();
            let per_iteration = cond.cost.saturating_add(step.cost).saturating_add(1);
            Est {
                cost: range
                    .cost
                    .saturating_add(init.cost)
                    .saturating_add(iterations.saturating_mul(per_iteration))
                    .saturating_add(result.cost),
                size: result.size,
                elem: result.elem,
            }
        }
    }
}

fn estimate_call(call: &CallExpr, scope: &mut Vec<(String, Est)>) -> Est {
    let target = call.target.as_deref().map(|t| estimate_node(t, scope));
    let args: Vec<Est> = call.args.iter().map(|a| estimate_node(a, scope)).collect();
    let all = || target.iter().chain(&args);
    let cost = all().fold(1u64, |c, a| c.saturating_add(a.cost));
    let read = all().fold(0u64, |s, a| s.saturating_add(a.size));
    let name = call.func_name.as_str();
    let this = target
        .or_else(|| args.first().copied())
        .unwrap_or(Est::scalar(1));
    let clamp = |v: u64| v.min(MAX_SIZE);
    let (size, elem) = match name {
        operators::ADD => {
            let size = clamp(args.iter().fold(0u64, |s, a| s.saturating_add(a.size)));
            (size, args.iter().map(|a| a.elem).max().unwrap_or(1))
        }
        operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT => {
            let size = this.elem.max(DEVICE_VALUE_SIZE);
            (size, size)
        }
        "split" => (clamp(this.size.saturating_add(1)), this.size),
        "replace" => {
            let new = args.get(1).map_or(1, |a| a.size.max(1));
            let size = clamp(this.size.saturating_add(1).saturating_mul(new));
            (size, size)
        }
        "join" => {
            let size = clamp(
                this.size
                    .saturating_mul(this.elem.saturating_add(args.first().map_or(0, |a| a.size))),
            );
            (size, size)
        }
        "findAll" => (this.size, this.size),
        _ => {
            let size = all().map(|a| a.size).max().unwrap_or(1);
            (size, all().map(|a| a.elem).max().unwrap_or(1))
        }
    };
    Est {
        cost: cost.saturating_add(read / 10),
        size,
        elem,
    }
}

// ---------------------------------------------------------------------------
// Instrumentation
// ---------------------------------------------------------------------------

/// Rewrites a checked expression so that evaluating it charges the meter.
pub(crate) struct Instrumenter {
    next_id: u64,
}

impl Instrumenter {
    pub(crate) fn new(e: &IdedExpr) -> Self {
        let mut max = 0;
        let mut stack = vec![e];
        while let Some(node) = stack.pop() {
            max = max.max(node.id);
            stack.extend(children(node));
        }
        Instrumenter { next_id: max + 1 }
    }

    fn wrap(&mut self, inner: IdedExpr, weight: u64) -> IdedExpr {
        let id = self.next_id;
        self.next_id += 2;
        IdedExpr {
            id,
            expr: Expr::Call(CallExpr {
                func_name: COST_FN.to_owned(),
                target: None,
                args: vec![
                    inner,
                    IdedExpr {
                        id: id + 1,
                        expr: Expr::Literal(LiteralValue::Int(CelInt::from(
                            i64::try_from(weight).unwrap_or(i64::MAX),
                        ))),
                    },
                ],
            }),
        }
    }

    /// The instrumented copy of `e`; `locals` are the comprehension and
    /// `cel.bind` variables in scope.
    pub(crate) fn instrument(&mut self, e: &IdedExpr, locals: &mut Vec<String>) -> IdedExpr {
        match &e.expr {
            Expr::Ident(name) if locals.iter().any(|l| l == name) => self.wrap(e.clone(), 0),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => e.clone(),
            Expr::Select(select) => {
                let mut select = select.clone();
                *select.operand = self.instrument(&select.operand, locals);
                IdedExpr {
                    id: e.id,
                    expr: Expr::Select(select),
                }
            }
            Expr::List(list) => IdedExpr {
                id: e.id,
                expr: Expr::List(ListExpr {
                    elements: list
                        .elements
                        .iter()
                        .map(|i| self.instrument(i, locals))
                        .collect(),
                    optional_indices: list.optional_indices.clone(),
                }),
            },
            Expr::Map(_) | Expr::Struct(_) => {
                let mut copy = e.clone();
                let entries = match &mut copy.expr {
                    Expr::Map(m) => &mut m.entries,
                    Expr::Struct(s) => &mut s.entries,
                    _ => unreachable!("matched above"),
                };
                for entry in entries {
                    match &mut entry.expr {
                        EntryExpr::MapEntry(m) => {
                            m.key = self.instrument(&m.key, locals);
                            m.value = self.instrument(&m.value, locals);
                        }
                        EntryExpr::StructField(f) => f.value = self.instrument(&f.value, locals),
                    }
                }
                copy
            }
            Expr::Call(call) => {
                let accumulator_append = call.func_name == operators::ADD
                    && matches!(call.args.first().map(|a| &a.expr), Some(Expr::Ident(n)) if n.starts_with('@'));
                let copy = IdedExpr {
                    id: e.id,
                    expr: Expr::Call(CallExpr {
                        func_name: call.func_name.clone(),
                        target: call
                            .target
                            .as_deref()
                            .map(|t| Box::new(self.instrument(t, locals))),
                        args: call
                            .args
                            .iter()
                            .map(|a| self.instrument(a, locals))
                            .collect(),
                    }),
                };
                if call.func_name == operators::ADD && !accumulator_append {
                    self.wrap(copy, 0)
                } else {
                    copy
                }
            }
            Expr::Comprehension(c) => self.comprehension(e.id, c, locals),
        }
    }

    fn comprehension(
        &mut self,
        id: u64,
        c: &ComprehensionExpr,
        locals: &mut Vec<String>,
    ) -> IdedExpr {
        let bind = is_bind(c);
        let weight = 1 + node_count(&c.loop_cond) + node_count(&c.loop_step);
        let iter_range = self.instrument(&c.iter_range, locals);
        let accu_init = self.instrument(&c.accu_init, locals);
        let pushed = 1 + usize::from(c.iter_var2.is_some());
        locals.push(c.iter_var.clone());
        locals.extend(c.iter_var2.clone());
        let mut loop_cond = self.instrument(&c.loop_cond, locals);
        let mut loop_step = self.instrument(&c.loop_step, locals);
        locals.truncate(locals.len() - pushed);
        if bind {
            locals.push(c.accu_var.clone());
        }
        let result = self.instrument(&c.result, locals);
        if bind {
            locals.pop();
        }
        if !bind {
            if !matches!(loop_cond.expr, Expr::Literal(_)) {
                loop_cond = self.wrap(loop_cond, weight);
            } else if !self.charge_append_step(&mut loop_step, &c.accu_var, weight) {
                loop_step = self.wrap(loop_step, weight);
            }
        }
        IdedExpr {
            id,
            expr: Expr::Comprehension(Box::new(ComprehensionExpr {
                iter_range,
                iter_var: c.iter_var.clone(),
                iter_var2: c.iter_var2.clone(),
                accu_var: c.accu_var.clone(),
                accu_init,
                loop_cond,
                loop_step,
                result,
            })),
        }
    }

    /// For the `map`/`filter` shapes (`accu + [e]`, optionally guarded by
    /// `cond ? accu + [e] : accu`), which the interpreter runs without
    /// copying the accumulator, charges the iteration inside the shape so
    /// the interpreter still recognizes it. Returns whether it did.
    fn charge_append_step(&mut self, step: &mut IdedExpr, accu: &str, weight: u64) -> bool {
        let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if n == accu);
        let Expr::Call(call) = &mut step.expr else {
            return false;
        };
        if call.func_name == operators::CONDITIONAL
            && call.args.len() == 3
            && is_accu(&call.args[2])
        {
            let guard = std::mem::take(&mut call.args[0]);
            call.args[0] = self.wrap(guard, weight);
            return true;
        }
        if call.func_name == operators::ADD
            && call.args.len() == 2
            && is_accu(&call.args[0])
            && let Expr::List(list) = &mut call.args[1].expr
            && let Some(first) = list.elements.first_mut()
        {
            let item = std::mem::take(first);
            *first = self.wrap(item, weight);
            return true;
        }
        false
    }
}
