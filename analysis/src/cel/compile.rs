//! Compiling selectors: limits checked before and after parsing, names
//! checked against the environment, the cost estimate, instrumentation, and
//! a bounded cache of compiled selectors keyed by expression text.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cel::Env;
use cel::common::ast::{EntryExpr, Expr, IdedExpr, SourceInfo};

use super::cost::{self, Instrumenter, Limits};
use super::library::{self, TYPE_NAMES};
use super::{CompileError, Position, caret_snippet, panic_message};

/// Stack of the thread that parses and checks. The generated parser
/// recurses deeply: its deepest accepted input (95 nested parentheses) needs
/// between 8 and 16 MiB in a debug build, much less in release. Only the
/// pages touched are committed.
const COMPILE_STACK: usize = 64 << 20;
/// Programs deeper than this (after instrumentation) are evaluated on a
/// thread of their own with a large stack; shallower ones (every realistic
/// selector) on the caller's.
pub(crate) const INLINE_EVAL_DEPTH: usize = 24;

/// A compiled selector.
#[derive(Debug)]
pub struct Selector {
    expression: String,
    pub(crate) program: IdedExpr,
    pub(crate) inline: bool,
    estimated_cost: u64,
    /// The tree as parsed, before instrumentation.
    parsed: IdedExpr,
    /// Start offset (in characters) of each node of `parsed`.
    offsets: HashMap<u64, usize>,
}

impl Selector {
    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The static cost estimate.
    pub fn estimated_cost(&self) -> u64 {
        self.estimated_cost
    }

    /// The expression as parsed (macros expanded, `has()` as a presence
    /// test, `.?x` and `[?k]` as calls of `_?._` and `_[?_]`), before the
    /// cost instrumentation: for analyses that walk the expression, such as
    /// the schema-aware validation. [`Self::offset`] knows its node ids.
    pub fn parsed(&self) -> &IdedExpr {
        &self.parsed
    }

    /// Where node `id` of [`Self::parsed`] was written, in characters from
    /// the start of the expression (for a field selection, the `.`; for an
    /// operator or index, the operator). `None` for nodes the parser made
    /// up (macro expansions).
    pub fn offset(&self, id: u64) -> Option<usize> {
        self.offsets.get(&id).copied()
    }

    /// The position of character `offset` of the expression, and the
    /// source line it is on with a caret under it.
    pub fn locate(&self, offset: usize) -> (Position, String) {
        locate(&self.expression, offset)
    }
}

/// The position of character `offset` of `source`, and the line it is on
/// with a caret under it.
fn locate(source: &str, offset: usize) -> (Position, String) {
    let mut line = 1;
    let mut column = 1;
    let mut line_text = source.lines().next().unwrap_or("");
    let mut rest = source;
    for (i, c) in source.chars().enumerate() {
        if i == offset {
            break;
        }
        if c == '\n' {
            line += 1;
            column = 1;
            rest = &rest[rest.find('\n').map_or(rest.len(), |n| n + 1)..];
            line_text = rest.lines().next().unwrap_or("");
        } else {
            column += 1;
        }
    }
    (Position { line, column }, caret_snippet(line_text, column))
}

/// Counters of the selector cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Compilations answered from the cache.
    pub hits: u64,
    /// Compilations that parsed the expression.
    pub misses: u64,
    /// Selectors in the cache now.
    pub entries: usize,
}

/// Compiles selectors for the environment, caching them by expression text.
/// Shareable between threads.
pub struct Compiler {
    pub(crate) env: Arc<Env>,
    pub(crate) limits: Limits,
    cache: Mutex<Cache>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("limits", &self.limits)
            .field("cache", &self.cache_stats())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<String, (Arc<Selector>, u64)>,
    clock: u64,
}

impl Default for Compiler {
    fn default() -> Self {
        Compiler::new()
    }
}

impl Compiler {
    /// A compiler with Kubernetes' limits.
    pub fn new() -> Self {
        Compiler::with_limits(Limits::default())
    }

    /// A compiler with other limits.
    pub fn with_limits(limits: Limits) -> Self {
        let env =
            library::environment().expect("the selector environment declares each overload once");
        Compiler {
            env: Arc::new(env),
            limits,
            cache: Mutex::new(Cache::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.lock().entries.len(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Compiles `expression`, or returns the cached selector. Failures are
    /// not cached.
    pub fn compile(&self, expression: &str) -> Result<Arc<Selector>, CompileError> {
        if expression.len() > self.limits.max_expression_bytes {
            return Err(CompileError::TooLong {
                len: expression.len(),
                max: self.limits.max_expression_bytes,
            });
        }
        {
            let mut cache = self.lock();
            cache.clock += 1;
            let now = cache.clock;
            if let Some((selector, used)) = cache.entries.get_mut(expression) {
                *used = now;
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Arc::clone(selector));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let selector = Arc::new(self.compile_uncached(expression)?);
        if self.limits.cache_capacity > 0 {
            let mut cache = self.lock();
            if cache.entries.len() >= self.limits.cache_capacity
                && let Some(oldest) = cache
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone())
            {
                cache.entries.remove(&oldest);
            }
            let now = cache.clock;
            cache
                .entries
                .insert(expression.to_owned(), (Arc::clone(&selector), now));
        }
        Ok(selector)
    }

    fn compile_uncached(&self, expression: &str) -> Result<Selector, CompileError> {
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name("cel-compile".to_owned())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || {
                    catch_unwind(AssertUnwindSafe(|| self.compile_here(expression)))
                        .unwrap_or_else(|p| Err(CompileError::Internal(panic_message(p.as_ref()))))
                })
                .map_err(|e| {
                    CompileError::Internal(format!("cannot start the compile thread: {e}"))
                })?;
            worker
                .join()
                .unwrap_or_else(|p| Err(CompileError::Internal(panic_message(p.as_ref()))))
        })
    }

    /// Parsing and checks; runs on the big-stack thread.
    fn compile_here(&self, expression: &str) -> Result<Selector, CompileError> {
        let program = self.env.compile(expression).map_err(|errors| {
            // an error raised inside the generated parser (its recursion
            // limit) comes as "UNKNOWN" with the real error as its source
            let message = |e: &cel::ParseError| match &e.source {
                Some(source) if e.msg == "UNKNOWN" => source.to_string(),
                _ => e.msg.clone(),
            };
            let depth_error = errors
                .errors
                .iter()
                .any(|e| message(e).contains("Recursion limit"));
            let rendered = errors.to_string();
            if depth_error {
                return CompileError::TooDeep {
                    max: self.limits.max_depth,
                };
            }
            CompileError::Syntax {
                errors: errors
                    .errors
                    .iter()
                    .map(|e| {
                        (
                            Position {
                                line: usize::try_from(e.pos.0).unwrap_or(0),
                                column: usize::try_from(e.pos.1).unwrap_or(0),
                            },
                            message(e),
                        )
                    })
                    .collect(),
                rendered,
            }
        })?;
        let root = program.expression();
        if cost::depth(root) > self.limits.max_depth {
            return Err(CompileError::TooDeep {
                max: self.limits.max_depth,
            });
        }
        Checker {
            info: program.source_info(),
            source: expression,
            locals: Vec::new(),
        }
        .check(root)?;
        let estimated_cost = cost::estimate(root);
        if estimated_cost > self.limits.estimated_cost_limit {
            return Err(CompileError::CostTooHigh {
                estimated: estimated_cost,
                limit: self.limits.estimated_cost_limit,
            });
        }
        let instrumented = Instrumenter::new(root).instrument(root, &mut Vec::new());
        let inline = cost::depth(&instrumented) <= INLINE_EVAL_DEPTH;
        let info = program.source_info();
        let mut offsets = HashMap::new();
        let mut stack = vec![root];
        while let Some(node) = stack.pop() {
            if let Some((start, _)) = info.offset_for(node.id) {
                offsets.insert(node.id, start as usize);
            }
            stack.extend(cost::children(node));
        }
        Ok(Selector {
            expression: expression.to_owned(),
            program: instrumented,
            inline,
            estimated_cost,
            parsed: root.clone(),
            offsets,
        })
    }
}

/// Checks that every name is declared and every construct supported.
struct Checker<'a> {
    info: &'a SourceInfo,
    source: &'a str,
    locals: Vec<String>,
}

impl Checker<'_> {
    fn position(&self, id: u64) -> (Position, String) {
        let offset = self
            .info
            .offset_for(id)
            .map_or(0, |(start, _)| start as usize);
        locate(self.source, offset)
    }

    fn is_local(&self, name: &str) -> bool {
        self.locals.iter().any(|l| l == name)
    }

    fn check(&mut self, e: &IdedExpr) -> Result<(), CompileError> {
        match &e.expr {
            Expr::Ident(name) => {
                if name == "device" || self.is_local(name) || TYPE_NAMES.contains(&name.as_str()) {
                    Ok(())
                } else {
                    let (position, snippet) = self.position(e.id);
                    Err(CompileError::UndeclaredVariable {
                        name: name.clone(),
                        position,
                        snippet,
                    })
                }
            }
            Expr::Literal(_) | Expr::Unspecified => Ok(()),
            Expr::Select(select) => self.check(&select.operand),
            Expr::List(list) => list.elements.iter().try_for_each(|i| self.check(i)),
            Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(m) => {
                    self.check(&m.key)?;
                    self.check(&m.value)
                }
                EntryExpr::StructField(f) => self.check(&f.value),
            }),
            Expr::Struct(_) => {
                let (position, snippet) = self.position(e.id);
                Err(CompileError::Unsupported {
                    what: "message construction",
                    position,
                    snippet,
                })
            }
            Expr::Call(call) => {
                let name = call.func_name.as_str();
                let operator = name.starts_with(['_', '@', '!', '-']);
                // `ns.f(..)`: a namespaced function, unless `ns` is a variable
                let namespaced = match call.target.as_deref().map(|t| &t.expr) {
                    Some(Expr::Ident(ns)) if ns != "device" && !self.is_local(ns) => {
                        library::is_function(&format!("{ns}.{name}"))
                    }
                    _ => false,
                };
                if !operator && !namespaced && !library::is_function(name) {
                    let (position, snippet) = self.position(e.id);
                    return Err(CompileError::UndeclaredFunction {
                        name: name.to_owned(),
                        position,
                        snippet,
                    });
                }
                if !namespaced && let Some(target) = &call.target {
                    self.check(target)?;
                }
                call.args.iter().try_for_each(|a| self.check(a))
            }
            Expr::Comprehension(c) => {
                self.check(&c.iter_range)?;
                self.check(&c.accu_init)?;
                self.locals.push(c.accu_var.clone());
                self.locals.push(c.iter_var.clone());
                self.locals.extend(c.iter_var2.clone());
                let body = self
                    .check(&c.loop_cond)
                    .and_then(|()| self.check(&c.loop_step));
                self.locals
                    .truncate(self.locals.len() - 1 - usize::from(c.iter_var2.is_some()));
                let result = body.and_then(|()| self.check(&c.result));
                self.locals.pop();
                result
            }
        }
    }
}
