//! The CEL environment of DRA device selectors, evaluated as kube-scheduler
//! evaluates them, with hard limits on what a hostile expression can cost.
//!
//! # Crate choice
//!
//! Built on **`cel` 0.15** (cel-rust), with Kubernetes' `Quantity` and
//! `Semver` types and the extension libraries written here. kube-cel 0.8
//! (kube-rs) was checked first: it carries the Kubernetes libraries, but it
//! is built on `cel` 0.13, whose interpreter still panics on unfinished
//! paths (struct literals, unspecified nodes) and has no typed overloads or
//! custom macros; its `KubeQuantity` type is private, so device capacities
//! cannot be handed to expressions as quantities, and its scale arithmetic
//! (`10i128.pow(diff)`) overflows on exponents such as `1e30` vs `1e-30`
//! (a panic in debug builds). `cel` 0.15 has an `Env` with typed overloads
//! for our own value types, custom macros (used for `cel.bind`), optional
//! types, and a fast interpreter: measured with the `cel`
//! benchmark (release build, 2 shared cores), the five real selectors
//! evaluate at 1.5 to 1.8 million evaluations per second each against a
//! converted device; converting a device takes about 2 µs, compiling an
//! expression about 130 µs (cached afterwards). Regex, strings, quantity and
//! semver code is ours, so every function charges the cost meter (see
//! below); the `regex` and `chrono` features of `cel` are off (no
//! timestamps or durations in device selectors).
//!
//! # Environment
//!
//! One variable, `device`: `driver` (string), `attributes` and `capacity`
//! (domain → id → value maps; an unknown domain is an empty map, an unknown
//! id a runtime "no such key" error), `allowMultipleAllocations` (bool).
//! Attribute values are int, bool, string or semver. Functions: the CEL
//! standard library with optional types (`.?x`, `[?k]`, `orValue`, ...),
//! `cel.bind`, `matches`/`find`/`findAll` (RE2 syntax), the strings
//! extension (cel-go `ext.Strings` v2: `charAt`, `indexOf`, `lastIndexOf`,
//! `lowerAscii`, `upperAscii`, `replace`, `split`, `substring`, `trim`,
//! `join`, `format`, `strings.quote`), `sets.contains/equivalent/intersects`,
//! and Kubernetes' quantity (`quantity`, `isQuantity`, `sign`, `isInteger`,
//! `asInteger`, `asApproximateFloat`, `add`, `sub`, `compareTo`,
//! `isGreaterThan`, `isLessThan`) and semver libraries (`semver(s[, normalize])`,
//! `isSemver`, `major`, `minor`, `patch`, `compareTo`, `isGreaterThan`,
//! `isLessThan`). Not provided (a compile error names the function): the
//! Kubernetes URL, IP/CIDR, format-validation and list libraries, `ext.Lists`,
//! two-variable comprehensions, timestamps and durations.
//!
//! # Cost model
//!
//! Compile time ([`Compiler::compile`]): an expression longer than 10 KiB is
//! rejected before parsing; parsing runs on a dedicated thread with a large
//! stack (the ANTLR parser recurses deeply) and is bounded by its own
//! recursion limit; the parsed tree may nest at most [`Limits::max_depth`]
//! levels; undeclared variables and functions are errors; and a static cost
//! estimate must stay within [`Limits::estimated_cost_limit`] (1,000,000,
//! Kubernetes' limit). The estimate charges one unit per node, a tenth of a unit per
//! byte of the strings a function reads, and, for a comprehension, the cost
//! of its body times the largest size its range can have: the length of a
//! list literal, the length of the string for `split`, and 64 for anything
//! read from the device (Kubernetes caps a device at 32 attributes and
//! capacities and strings at 64 characters).
//!
//! Run time ([`Evaluator`]): every evaluation gets a budget of
//! [`Limits::runtime_cost_limit`] units on a thread-local meter, and the compiled
//! tree is instrumented so that everything whose cost is not bounded by the
//! size of the expression is charged before or as it happens: each
//! comprehension iteration (one unit plus the size of the loop body), each
//! read of a comprehension or `cel.bind` variable (the size of its value:
//! one unit per element, a sixteenth per byte), the result of `+` (which is
//! how strings and lists grow), and every function of this module (regex
//! compilation and matching, string functions, set operations) by the sizes
//! it reads and writes, checked before it allocates. When the budget is
//! spent the evaluation stops with [`EvalError::CostLimitExceeded`]. So one
//! evaluation does at most about `runtime_cost_limit` units of work; nested
//! comprehensions, exponential `cel.bind` doubling or `replace` chains hit
//! the limit instead of the CPU or memory. (The estimate alone already
//! rejects most such expressions at admission; the meter is the guarantee.)
//!
//! Evaluation recurses over the tree; a program deeper than a threshold
//! is evaluated on a thread with a large stack, so that no expression can
//! overflow a small (e.g. 2 MiB tokio worker) stack.

mod compile;
mod cost;
mod device;
mod eval;
mod library;
mod values;

pub(crate) use cost::children;
pub(crate) use library::function_names;

#[cfg(test)]
mod tests;

use std::fmt;

pub use compile::{CacheStats, Compiler, Selector};
pub use cost::Limits;
pub use device::{AttrValue, CelDevice, DeviceError, split_qualified_name};
pub use eval::Evaluator;

/// A position in the expression, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

/// `line` of a source with a caret under `column` (1-based): the snippet
/// that errors and findings show.
pub(crate) fn caret_snippet(line: &str, column: usize) -> String {
    format!("\n | {line}\n | {}^", ".".repeat(column.saturating_sub(1)))
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Why an expression does not compile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// Longer than [`Limits::max_expression_bytes`]; rejected before parsing.
    #[error("expression is {len} bytes long, more than the {max} bytes allowed")]
    TooLong {
        /// The expression's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not valid CEL. `rendered` shows each error with a caret under its
    /// position.
    #[error("syntax error: {rendered}")]
    Syntax {
        /// Position and message of each error.
        errors: Vec<(Position, String)>,
        /// The errors with their source line and a caret.
        rendered: String,
    },
    /// Nested deeper than [`Limits::max_depth`] (or than the parser allows).
    #[error("expression nests more than {max} levels deep")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// A name that is neither `device` nor a comprehension variable.
    #[error(
        "undeclared reference to {name:?} at {position}: the only variable is `device`{snippet}"
    )]
    UndeclaredVariable {
        /// The name.
        name: String,
        /// Where it is.
        position: Position,
        /// The source line with a caret.
        snippet: String,
    },
    /// A function this environment does not have.
    #[error("undeclared function {name:?} at {position}{snippet}")]
    UndeclaredFunction {
        /// The function's name.
        name: String,
        /// Where it is called.
        position: Position,
        /// The source line with a caret.
        snippet: String,
    },
    /// A construct the environment does not support (message literals).
    #[error("{what} is not supported, at {position}{snippet}")]
    Unsupported {
        /// What it is.
        what: &'static str,
        /// Where it is.
        position: Position,
        /// The source line with a caret.
        snippet: String,
    },
    /// The static cost estimate exceeds [`Limits::estimated_cost_limit`].
    #[error(
        "estimated cost {estimated} exceeds the limit of {limit}: reduce the size of lists iterated over or the nesting of comprehensions"
    )]
    CostTooHigh {
        /// The estimate.
        estimated: u64,
        /// The limit.
        limit: u64,
    },
    /// The CEL library failed unexpectedly (a panic in the parser, caught).
    #[error("internal error while compiling: {0}")]
    Internal(String),
}

/// Why evaluating a selector against a device failed. Kubernetes treats all
/// of these as errors of the allocation attempt, never as "no match".
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// A map has no such key: typically a device attribute or capacity that
    /// the device does not have (guard with `has()` or `.?`).
    #[error("no such key: {0} (guard optional attributes with has() or the .? operator)")]
    NoSuchKey(String),
    /// Any other runtime error: no matching overload (wrong types), division
    /// by zero, overflow, a function's own error (bad quantity or semver).
    #[error("{0}")]
    Runtime(String),
    /// The expression evaluated to something other than a bool.
    #[error("expression must evaluate to a bool, got {0}")]
    NotBool(String),
    /// The evaluation used up its cost budget.
    #[error("evaluation exceeded the cost limit of {limit}")]
    CostLimitExceeded {
        /// The budget.
        limit: u64,
    },
    /// The CEL library failed unexpectedly (a panic, caught).
    #[error("internal error while evaluating: {0}")]
    Internal(String),
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}
