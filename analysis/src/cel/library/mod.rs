//! The functions of the selector environment beyond the CEL standard
//! library: Kubernetes' quantity and semver libraries, the strings
//! extension, regular expressions, sets, and `cel.bind`. Every function
//! charges the cost meter for what it reads and writes, before it allocates.

mod bind;
mod quantity;
mod regex;
mod semver;
mod sets;
mod strings;

use std::cmp::Ordering;

use cel::common::types::{CelBool, CelInt, CelString, DYN_TYPE, INT_TYPE, Kind};
use cel::common::value::{CowVal, Val};
use cel::parser::Macro;
use cel::{DeclarationError, Env, ExecutionError};

use super::cost::{self, COST_FN};
use super::values::{CelQuantity, CelSemver};
use gpu_dra_api::quantity::Quantity;

pub(super) type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// Functions of the CEL standard library (without the `chrono` and `regex`
/// features), for the compile-time check of function names.
const STDLIB_FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "bool",
    "type",
    "dyn",
    "hasValue",
    "value",
    "or",
    "orValue",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
];

/// Functions this module adds.
const OWN_FUNCTIONS: &[&str] = &[
    "quantity",
    "isQuantity",
    "sign",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "add",
    "sub",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
    "semver",
    "isSemver",
    "major",
    "minor",
    "patch",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "format",
    "strings.quote",
    "matches",
    "find",
    "findAll",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
];

/// Macros of the environment (expanded by the parser, so never undeclared).
const MACROS: &[&str] = &["has", "all", "exists", "exists_one", "map", "filter"];

/// Every function and macro name of the environment, for "did you mean"
/// suggestions.
pub(crate) fn function_names() -> impl Iterator<Item = &'static str> {
    STDLIB_FUNCTIONS
        .iter()
        .chain(OWN_FUNCTIONS)
        .chain(MACROS)
        .copied()
}

/// Whether `name` (possibly namespace-qualified) is a function of the
/// environment.
pub(crate) fn is_function(name: &str) -> bool {
    STDLIB_FUNCTIONS.contains(&name) || OWN_FUNCTIONS.contains(&name)
}

/// Type names an expression may refer to (`type(x) == int`).
pub(crate) const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
    "optional_type",
];

/// The selector environment.
pub(crate) fn environment() -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_overload(
        COST_FN,
        "cost_dyn_int",
        vec![DYN_TYPE, INT_TYPE],
        cost::cost_fn,
    )?;
    quantity::register(&mut env)?;
    semver::register(&mut env)?;
    strings::register(&mut env)?;
    regex::register(&mut env)?;
    sets::register(&mut env)?;
    env.add_macro(Macro::receiver("bind", 3, bind::expand))?;
    Ok(env)
}

// Arguments and results shared by the libraries.

pub(super) fn wrong(function: &str, index: usize, want: &str) -> ExecutionError {
    ExecutionError::function_error(function, format!("argument {index} must be a {want}"))
}

pub(super) fn string_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a str, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(CelString::inner)
        .ok_or_else(|| wrong(function, i, "string"))
}

pub(super) fn int_arg(
    args: &[CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<i64, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelInt>())
        .map(|v| *v.inner())
        .ok_or_else(|| wrong(function, i, "int"))
}

pub(super) fn bool_arg(
    args: &[CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<bool, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelBool>())
        .map(|v| *v.inner())
        .ok_or_else(|| wrong(function, i, "bool"))
}

pub(super) fn quantity_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a Quantity, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelQuantity>())
        .map(|q| &q.0)
        .ok_or_else(|| wrong(function, i, "quantity"))
}

pub(super) fn semver_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a CelSemver, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelSemver>())
        .ok_or_else(|| wrong(function, i, "semver"))
}

/// The elements of list argument `i`.
pub(super) fn list_arg<'a, 'v>(
    args: &'a [CowVal<'_, 'v>],
    i: usize,
    function: &str,
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let value = args.get(i).ok_or_else(|| wrong(function, i, "list"))?;
    list_items(value.as_ref(), function, i)
}

pub(super) fn list_items<'a, 'v>(
    value: &'a (dyn Val + 'v),
    function: &str,
    index: usize,
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let iterable = value
        .as_iterable()
        .filter(|_| value.get_type().kind() == Kind::List)
        .ok_or_else(|| wrong(function, index, "list"))?;
    let mut items = Vec::new();
    let mut iter = iterable.iter();
    while let Some(item) = iter.next() {
        items.push(item);
    }
    Ok(items)
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the result type of every overload"
)]
pub(super) fn boolean<'b, 'v>(b: bool) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelBool::from(b)))
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the result type of every overload"
)]
pub(super) fn int<'b, 'v>(i: i64) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelInt::from(i)))
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the result type of every overload"
)]
pub(super) fn string<'b, 'v>(s: String) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelString::from(s)))
}

pub(super) fn ordering(o: Ordering) -> i64 {
    match o {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}
