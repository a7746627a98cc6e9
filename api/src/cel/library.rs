//! The functions of the selector environment beyond the CEL standard
//! library: Kubernetes' quantity and semver libraries, the strings
//! extension, regular expressions, sets, and `cel.bind`. Every function
//! charges the cost meter for what it reads and writes, before it allocates.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::rc::Rc;

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{
    BOOL_TYPE, CelBool, CelDouble, CelInt, CelList, CelString, CelUInt, DYN_TYPE, INT_TYPE, Kind,
    LIST_TYPE, STRING_TYPE,
};
use cel::common::value::{CowVal, Val};
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env, ExecutionError};

use super::cost::{self, COST_FN, bytes_cost, charge};
use super::values::{CelQuantity, CelSemver, QUANTITY_TYPE, SEMVER_TYPE};
use crate::quantity::Quantity;

type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

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
    quantity_library(&mut env)?;
    semver_library(&mut env)?;
    strings_library(&mut env)?;
    regex_library(&mut env)?;
    sets_library(&mut env)?;
    env.add_macro(Macro::receiver("bind", 3, bind_macro))?;
    Ok(env)
}

// ---------------------------------------------------------------------------
// Arguments and results
// ---------------------------------------------------------------------------

fn wrong(function: &str, index: usize, want: &str) -> ExecutionError {
    ExecutionError::function_error(function, format!("argument {index} must be a {want}"))
}

fn string_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a str, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelString>())
        .map(CelString::inner)
        .ok_or_else(|| wrong(function, i, "string"))
}

fn int_arg(args: &[CowVal<'_, '_>], i: usize, function: &str) -> Result<i64, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelInt>())
        .map(|v| *v.inner())
        .ok_or_else(|| wrong(function, i, "int"))
}

fn bool_arg(args: &[CowVal<'_, '_>], i: usize, function: &str) -> Result<bool, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelBool>())
        .map(|v| *v.inner())
        .ok_or_else(|| wrong(function, i, "bool"))
}

fn quantity_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a Quantity, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelQuantity>())
        .map(|q| &q.0)
        .ok_or_else(|| wrong(function, i, "quantity"))
}

fn semver_arg<'a>(
    args: &'a [CowVal<'_, '_>],
    i: usize,
    function: &str,
) -> Result<&'a CelSemver, ExecutionError> {
    args.get(i)
        .and_then(|a| a.downcast_ref::<CelSemver>())
        .ok_or_else(|| wrong(function, i, "semver"))
}

fn list_items<'a, 'v>(
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
fn boolean<'b, 'v>(b: bool) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelBool::from(b)))
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the result type of every overload"
)]
fn int<'b, 'v>(i: i64) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelInt::from(i)))
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the result type of every overload"
)]
fn string<'b, 'v>(s: String) -> Out<'b, 'v> {
    Ok(CowVal::owned(CelString::from(s)))
}

fn ordering(o: Ordering) -> i64 {
    match o {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

// ---------------------------------------------------------------------------
// Quantity (k8s.io/apiserver/pkg/cel/library/quantity.go)
// ---------------------------------------------------------------------------

fn quantity_library(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || QUANTITY_TYPE.to_owned();
    env.add_overload(
        "quantity",
        "string_to_quantity",
        vec![STRING_TYPE],
        quantity_fn,
    )?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    env.add_member_overload("sign", "quantity_sign", q(), vec![], quantity_sign)?;
    env.add_member_overload(
        "isInteger",
        "quantity_is_integer",
        q(),
        vec![],
        quantity_is_integer,
    )?;
    env.add_member_overload(
        "asInteger",
        "quantity_as_integer",
        q(),
        vec![],
        quantity_as_integer,
    )?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_as_float",
        q(),
        vec![],
        quantity_as_float,
    )?;
    env.add_member_overload("add", "quantity_add_quantity", q(), vec![q()], quantity_add)?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], quantity_add)?;
    env.add_member_overload("sub", "quantity_sub_quantity", q(), vec![q()], quantity_sub)?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], quantity_sub)?;
    env.add_member_overload(
        "compareTo",
        "quantity_compare_to",
        q(),
        vec![q()],
        quantity_compare,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "quantity_greater",
        q(),
        vec![q()],
        quantity_greater,
    )?;
    env.add_member_overload("isLessThan", "quantity_less", q(), vec![q()], quantity_less)?;
    Ok(())
}

fn parse_quantity(text: &str, function: &str) -> Result<Quantity, ExecutionError> {
    charge(bytes_cost(text.len()))?;
    Quantity::parse(text).map_err(|e| ExecutionError::function_error(function, e))
}

fn quantity_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let q = parse_quantity(string_arg(&args, 0, "quantity")?, "quantity")?;
    Ok(CowVal::owned(CelQuantity(q)))
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let text = string_arg(&args, 0, "isQuantity")?;
    boolean(parse_quantity(text, "isQuantity").is_ok())
}

fn quantity_sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    int(i64::from(quantity_arg(&args, 0, "sign")?.signum()))
}

fn quantity_is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    boolean(
        quantity_arg(&args, 0, "isInteger")?
            .as_i64_exact()
            .is_some(),
    )
}

fn quantity_as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let q = quantity_arg(&args, 0, "asInteger")?;
    match q.as_i64_exact() {
        Some(i) => int(i),
        None if !q.is_whole() => Err(ExecutionError::function_error(
            "asInteger",
            format!("cannot convert value to integer: {q} is not a whole number"),
        )),
        None => Err(ExecutionError::function_error(
            "asInteger",
            format!("cannot convert value to integer: {q} overflows int64"),
        )),
    }
}

fn quantity_as_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let q = quantity_arg(&args, 0, "asApproximateFloat")?;
    Ok(CowVal::owned(CelDouble::from(q.as_f64())))
}

/// The right-hand side of `add`/`sub`: a quantity or an int.
fn operand(args: &[CowVal<'_, '_>], function: &str) -> Result<Quantity, ExecutionError> {
    match args.get(1).and_then(|a| a.downcast_ref::<CelInt>()) {
        Some(i) => Ok(Quantity::from_units(*i.inner())),
        None => quantity_arg(args, 1, function).copied(),
    }
}

fn quantity_add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let sum = quantity_arg(&args, 0, "add")?.checked_add(&operand(&args, "add")?);
    sum.map(|q| CowVal::owned(CelQuantity(q)))
        .ok_or_else(|| ExecutionError::function_error("add", "quantity overflow"))
}

fn quantity_sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let difference = quantity_arg(&args, 0, "sub")?.checked_sub(&operand(&args, "sub")?);
    difference
        .map(|q| CowVal::owned(CelQuantity(q)))
        .ok_or_else(|| ExecutionError::function_error("sub", "quantity overflow"))
}

fn quantity_compare<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        quantity_arg(&args, 0, "compareTo")?,
        quantity_arg(&args, 1, "compareTo")?,
    );
    int(ordering(a.cmp(b)))
}

fn quantity_greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        quantity_arg(&args, 0, "isGreaterThan")?,
        quantity_arg(&args, 1, "isGreaterThan")?,
    );
    boolean(a > b)
}

fn quantity_less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        quantity_arg(&args, 0, "isLessThan")?,
        quantity_arg(&args, 1, "isLessThan")?,
    );
    boolean(a < b)
}

// ---------------------------------------------------------------------------
// Semver (k8s.io/apiserver/pkg/cel/library/semverlib.go)
// ---------------------------------------------------------------------------

fn semver_library(env: &mut Env) -> Result<(), DeclarationError> {
    let s = || SEMVER_TYPE.to_owned();
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], semver_fn)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        semver_fn,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        is_semver,
    )?;
    env.add_member_overload("major", "semver_major", s(), vec![], semver_major)?;
    env.add_member_overload("minor", "semver_minor", s(), vec![], semver_minor)?;
    env.add_member_overload("patch", "semver_patch", s(), vec![], semver_patch)?;
    env.add_member_overload(
        "compareTo",
        "semver_compare_to",
        s(),
        vec![s()],
        semver_compare,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_greater",
        s(),
        vec![s()],
        semver_greater,
    )?;
    env.add_member_overload("isLessThan", "semver_less", s(), vec![s()], semver_less)?;
    Ok(())
}

/// Parses a SemVer 2.0.0 version. With `normalize`, as Kubernetes does: a
/// leading `v` is dropped, missing minor and patch numbers are zero, and
/// leading zeros are removed (`v1.02` is `1.2.0`).
pub(crate) fn parse_semver(text: &str, normalize: bool) -> Result<semver::Version, String> {
    if !normalize {
        return semver::Version::parse(text).map_err(|e| e.to_string());
    }
    let text = text.strip_prefix('v').unwrap_or(text);
    let split = text.find(['-', '+']).unwrap_or(text.len());
    let (core, rest) = text.split_at(split);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() > 3 {
        return Err(format!("{text:?} has more than three version numbers"));
    }
    let mut numbers = Vec::with_capacity(3);
    for part in &parts {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{part:?} is not a version number"));
        }
        let trimmed = part.trim_start_matches('0');
        numbers.push(if trimmed.is_empty() { "0" } else { trimmed });
    }
    while numbers.len() < 3 {
        numbers.push("0");
    }
    semver::Version::parse(&format!("{}{rest}", numbers.join("."))).map_err(|e| e.to_string())
}

fn semver_from_args(
    args: &[CowVal<'_, '_>],
    function: &str,
) -> Result<semver::Version, ExecutionError> {
    let text = string_arg(args, 0, function)?;
    let normalize = if args.len() > 1 {
        bool_arg(args, 1, function)?
    } else {
        false
    };
    charge(bytes_cost(text.len()))?;
    parse_semver(text, normalize).map_err(|e| {
        ExecutionError::function_error(function, format!("invalid semantic version {text:?}: {e}"))
    })
}

fn semver_fn<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    semver_from_args(&args, "semver").map(|v| CowVal::owned(CelSemver(v)))
}

fn is_semver<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    // a wrong argument type is still an error, a bad version is `false`
    string_arg(&args, 0, "isSemver")?;
    boolean(semver_from_args(&args, "isSemver").is_ok())
}

fn version_number<'b, 'v>(n: u64, function: &str) -> Out<'b, 'v> {
    i64::try_from(n)
        .map_err(|_| ExecutionError::function_error(function, "version number overflows int64"))
        .and_then(int)
}

fn semver_major<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "major")?.0.major, "major")
}

fn semver_minor<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "minor")?.0.minor, "minor")
}

fn semver_patch<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    version_number(semver_arg(&args, 0, "patch")?.0.patch, "patch")
}

fn semver_compare<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "compareTo")?,
        semver_arg(&args, 1, "compareTo")?,
    );
    int(ordering(a.compare(b)))
}

fn semver_greater<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "isGreaterThan")?,
        semver_arg(&args, 1, "isGreaterThan")?,
    );
    boolean(a.compare(b) == Ordering::Greater)
}

fn semver_less<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = (
        semver_arg(&args, 0, "isLessThan")?,
        semver_arg(&args, 1, "isLessThan")?,
    );
    boolean(a.compare(b) == Ordering::Less)
}

// ---------------------------------------------------------------------------
// Strings (cel-go ext.Strings, version 2)
// ---------------------------------------------------------------------------

fn strings_library(env: &mut Env) -> Result<(), DeclarationError> {
    let member = |env: &mut Env, name: &str, id: &str, args: Vec<cel::common::types::Type>, f| {
        env.add_member_overload(name, id, STRING_TYPE, args, f)
    };
    member(env, "charAt", "string_char_at_int", vec![INT_TYPE], char_at)?;
    member(
        env,
        "indexOf",
        "string_index_of_string",
        vec![STRING_TYPE],
        index_of,
    )?;
    member(
        env,
        "indexOf",
        "string_index_of_string_int",
        vec![STRING_TYPE, INT_TYPE],
        index_of,
    )?;
    member(
        env,
        "lastIndexOf",
        "string_last_index_of_string",
        vec![STRING_TYPE],
        last_index_of,
    )?;
    member(
        env,
        "lastIndexOf",
        "string_last_index_of_string_int",
        vec![STRING_TYPE, INT_TYPE],
        last_index_of,
    )?;
    member(env, "lowerAscii", "string_lower_ascii", vec![], lower_ascii)?;
    member(env, "upperAscii", "string_upper_ascii", vec![], upper_ascii)?;
    member(
        env,
        "replace",
        "string_replace_string_string",
        vec![STRING_TYPE, STRING_TYPE],
        replace,
    )?;
    member(
        env,
        "replace",
        "string_replace_string_string_int",
        vec![STRING_TYPE, STRING_TYPE, INT_TYPE],
        replace,
    )?;
    member(
        env,
        "split",
        "string_split_string",
        vec![STRING_TYPE],
        split,
    )?;
    member(
        env,
        "split",
        "string_split_string_int",
        vec![STRING_TYPE, INT_TYPE],
        split,
    )?;
    member(
        env,
        "substring",
        "string_substring_int",
        vec![INT_TYPE],
        substring,
    )?;
    member(
        env,
        "substring",
        "string_substring_int_int",
        vec![INT_TYPE, INT_TYPE],
        substring,
    )?;
    member(env, "trim", "string_trim", vec![], trim)?;
    member(env, "format", "string_format_list", vec![LIST_TYPE], format)?;
    env.add_member_overload("join", "list_join", LIST_TYPE, vec![], join)?;
    env.add_member_overload(
        "join",
        "list_join_string",
        LIST_TYPE,
        vec![STRING_TYPE],
        join,
    )?;
    env.add_overload("strings.quote", "strings_quote", vec![STRING_TYPE], quote)?;
    Ok(())
}

fn out_of_range(function: &str, index: i64) -> ExecutionError {
    ExecutionError::function_error(function, format!("index out of range: {index}"))
}

/// The byte offset of code point `index` (`s.len()` for the end).
fn byte_offset(s: &str, index: usize) -> Option<usize> {
    s.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(s.len()))
        .nth(index)
}

fn char_at<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "charAt")?;
    let i = int_arg(&args, 1, "charAt")?;
    charge(bytes_cost(s.len()))?;
    let index = usize::try_from(i).map_err(|_| out_of_range("charAt", i))?;
    let mut chars = s.chars();
    match byte_offset(s, index) {
        Some(_) => string(chars.nth(index).map(String::from).unwrap_or_default()),
        None => Err(out_of_range("charAt", i)),
    }
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "indexOf")?;
    let sub = string_arg(&args, 1, "indexOf")?;
    let offset = if args.len() > 2 {
        int_arg(&args, 2, "indexOf")?
    } else {
        0
    };
    charge(bytes_cost(s.len() + sub.len()))?;
    if sub.is_empty() {
        return int(offset);
    }
    if offset < 0 {
        return Err(out_of_range("indexOf", offset));
    }
    let Some(start) = usize::try_from(offset)
        .ok()
        .and_then(|o| byte_offset(s, o))
        .filter(|&b| b < s.len())
    else {
        return int(-1);
    };
    match s[start..].find(sub) {
        Some(found) => int(s[..start + found].chars().count() as i64),
        None => int(-1),
    }
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "lastIndexOf")?;
    let sub = string_arg(&args, 1, "lastIndexOf")?;
    charge(bytes_cost(s.len() + sub.len()))?;
    let len = s.chars().count() as i64;
    let offset = if args.len() > 2 {
        int_arg(&args, 2, "lastIndexOf")?
    } else if sub.is_empty() {
        return int(len);
    } else {
        len - 1
    };
    if sub.is_empty() {
        return int(offset);
    }
    if offset < 0 {
        return Err(out_of_range("lastIndexOf", offset));
    }
    if offset >= len {
        return int(-1);
    }
    let sub_len = sub.chars().count() as i64;
    let last_start = offset.min(len - sub_len);
    if last_start < 0 {
        return int(-1);
    }
    // occurrences must start at or before `last_start`
    let end = byte_offset(s, (last_start + sub_len) as usize).unwrap_or(s.len());
    match s[..end].rfind(sub) {
        Some(found) => int(s[..found].chars().count() as i64),
        None => int(-1),
    }
}

fn lower_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "lowerAscii")?;
    charge(bytes_cost(s.len()))?;
    string(s.to_ascii_lowercase())
}

fn upper_ascii<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "upperAscii")?;
    charge(bytes_cost(s.len()))?;
    string(s.to_ascii_uppercase())
}

fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "replace")?;
    let old = string_arg(&args, 1, "replace")?;
    let new = string_arg(&args, 2, "replace")?;
    let limit = if args.len() > 3 {
        usize::try_from(int_arg(&args, 3, "replace")?).ok()
    } else {
        None
    };
    charge(bytes_cost(s.len()))?;
    // the size of the result, charged before it is built
    let occurrences = s.matches(old).count().min(limit.unwrap_or(usize::MAX));
    let result_len = (s.len() as u128 + occurrences as u128 * new.len() as u128)
        .saturating_sub(occurrences as u128 * old.len() as u128);
    charge(bytes_cost(
        usize::try_from(result_len).unwrap_or(usize::MAX),
    ))?;
    string(match limit {
        Some(n) => s.replacen(old, new, n),
        None => s.replace(old, new),
    })
}

fn split<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "split")?;
    let sep = string_arg(&args, 1, "split")?;
    let limit = if args.len() > 2 {
        match usize::try_from(int_arg(&args, 2, "split")?) {
            Ok(0) => return Ok(CowVal::owned(CelList::from(Vec::new()))),
            Ok(n) => Some(n),
            Err(_) => None,
        }
    } else {
        None
    };
    charge(bytes_cost(s.len()))?;
    let parts: Vec<&str> = if sep.is_empty() {
        // as Go's strings.SplitN with an empty separator: one part per
        // code point, the last holding the rest
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(c) = rest.chars().next() {
            if limit.is_some_and(|n| parts.len() + 1 == n) {
                break;
            }
            parts.push(&rest[..c.len_utf8()]);
            rest = &rest[c.len_utf8()..];
        }
        if !rest.is_empty() {
            parts.push(rest);
        }
        parts
    } else {
        match limit {
            Some(n) => s.splitn(n, sep).collect(),
            None => s.split(sep).collect(),
        }
    };
    charge(parts.len() as u64)?;
    let items: Vec<Box<dyn Val>> = parts
        .into_iter()
        .map(|p| Box::new(CelString::from(p.to_owned())) as Box<dyn Val>)
        .collect();
    Ok(CowVal::owned(CelList::from(items)))
}

fn substring<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "substring")?;
    let start = int_arg(&args, 1, "substring")?;
    charge(bytes_cost(s.len()))?;
    let len = s.chars().count() as i64;
    let end = if args.len() > 2 {
        int_arg(&args, 2, "substring")?
    } else {
        len
    };
    if args.len() > 2 && start > end {
        return Err(ExecutionError::function_error(
            "substring",
            format!("invalid substring range. start: {start}, end: {end}"),
        ));
    }
    if !(0..=len).contains(&start) {
        return Err(out_of_range("substring", start));
    }
    if !(0..=len).contains(&end) {
        return Err(out_of_range("substring", end));
    }
    let from = byte_offset(s, start as usize).unwrap_or(s.len());
    let to = byte_offset(s, end as usize).unwrap_or(s.len());
    string(s[from..to].to_owned())
}

fn trim<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "trim")?;
    charge(bytes_cost(s.len()))?;
    string(s.trim().to_owned())
}

fn join<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let sep = if args.len() > 1 {
        string_arg(&args, 1, "join")?
    } else {
        ""
    };
    let items = list_items(args[0].as_ref(), "join", 0)?;
    let mut parts = Vec::with_capacity(items.len());
    let mut total = 0usize;
    for item in items {
        let s = item.downcast_ref::<CelString>().ok_or_else(|| {
            ExecutionError::function_error(
                "join",
                format!("invalid input: {} is not a string", item.get_type().name()),
            )
        })?;
        total = total.saturating_add(s.len()).saturating_add(sep.len());
        parts.push(s.inner());
    }
    charge(bytes_cost(total))?;
    string(parts.join(sep))
}

fn quote<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "strings.quote")?;
    charge(bytes_cost(s.len().saturating_mul(2)))?;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
    string(out)
}

/// `'...'.format([args])`: `%s`, `%d`, `%f`, `%e` (with an optional
/// `.precision`), `%b`, `%o`, `%x`, `%X` and `%%`.
fn format<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let fmt = string_arg(&args, 0, "format")?;
    let values = list_items(args[1].as_ref(), "format", 1)?;
    let mut budget = fmt.len();
    for v in &values {
        budget = budget.saturating_add(
            usize::try_from(cost::size_of(*v, u64::MAX)).unwrap_or(usize::MAX) * 16,
        );
    }
    charge(bytes_cost(budget))?;
    let error = |m: String| ExecutionError::function_error("format", m);
    let mut out = String::with_capacity(fmt.len());
    let mut next = values.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut precision: Option<usize> = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut digits = String::new();
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                digits.push(d);
                chars.next();
            }
            precision = Some(
                digits
                    .parse()
                    .map_err(|_| error("invalid precision".to_owned()))?,
            );
            if precision.is_some_and(|p| p > 64) {
                return Err(error("precision above 64".to_owned()));
            }
        }
        let verb = chars
            .next()
            .ok_or_else(|| error("format ends with '%'".to_owned()))?;
        if verb == '%' {
            out.push('%');
            continue;
        }
        let value = *next
            .next()
            .ok_or_else(|| error(format!("too few arguments for %{verb}")))?;
        format_value(&mut out, verb, precision, value).map_err(error)?;
    }
    if next.next().is_some() {
        return Err(error("too many arguments".to_owned()));
    }
    string(out)
}

fn format_value(
    out: &mut String,
    verb: char,
    precision: Option<usize>,
    v: &dyn Val,
) -> Result<(), String> {
    let int_value = v
        .downcast_ref::<CelInt>()
        .map(|i| i128::from(*i.inner()))
        .or_else(|| v.downcast_ref::<CelUInt>().map(|u| i128::from(*u.inner())));
    let float_value = v
        .downcast_ref::<CelDouble>()
        .map(|d| *d.inner())
        .or_else(|| int_value.map(|i| i as f64));
    let type_name = v.get_type().name().to_owned();
    let unsupported = || format!("%{verb} does not format a {type_name}");
    match verb {
        's' => display(out, v),
        'd' => write!(out, "{}", int_value.ok_or_else(unsupported)?).map_err(|e| e.to_string()),
        'f' => write!(
            out,
            "{:.*}",
            precision.unwrap_or(6),
            float_value.ok_or_else(unsupported)?
        )
        .map_err(|e| e.to_string()),
        'e' => {
            // Go's form: a signed exponent of at least two digits (1.5e+03)
            let text = format!(
                "{:.*e}",
                precision.unwrap_or(6),
                float_value.ok_or_else(unsupported)?
            );
            let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
            let (sign, digits) = exponent
                .strip_prefix('-')
                .map_or(("+", exponent), |d| ("-", d));
            write!(out, "{mantissa}e{sign}{digits:0>2}").map_err(|e| e.to_string())
        }
        'b' | 'o' | 'x' | 'X' => {
            if let Some(s) = v
                .downcast_ref::<CelString>()
                .filter(|_| matches!(verb, 'x' | 'X'))
            {
                for b in s.bytes() {
                    let _ = if verb == 'x' {
                        write!(out, "{b:02x}")
                    } else {
                        write!(out, "{b:02X}")
                    };
                }
                return Ok(());
            }
            let i = int_value.ok_or_else(unsupported)?;
            let sign = if i < 0 { "-" } else { "" };
            let a = i.unsigned_abs();
            match verb {
                'b' => write!(out, "{sign}{a:b}"),
                'o' => write!(out, "{sign}{a:o}"),
                'x' => write!(out, "{sign}{a:x}"),
                _ => write!(out, "{sign}{a:X}"),
            }
            .map_err(|e| e.to_string())
        }
        other => Err(format!("unknown verb %{other}")),
    }
}

/// `%s` text of a value.
fn display(out: &mut String, v: &dyn Val) -> Result<(), String> {
    if let Some(s) = v.downcast_ref::<CelString>() {
        out.push_str(s.inner());
    } else if let Some(i) = v.downcast_ref::<CelInt>() {
        let _ = write!(out, "{}", i.inner());
    } else if let Some(u) = v.downcast_ref::<CelUInt>() {
        let _ = write!(out, "{}", u.inner());
    } else if let Some(d) = v.downcast_ref::<CelDouble>() {
        let _ = write!(out, "{}", d.inner());
    } else if let Some(b) = v.downcast_ref::<CelBool>() {
        let _ = write!(out, "{}", b.inner());
    } else if let Some(q) = v.downcast_ref::<CelQuantity>() {
        let _ = write!(out, "{}", q.0);
    } else if let Some(s) = v.downcast_ref::<CelSemver>() {
        let _ = write!(out, "{}", s.0);
    } else if v.get_type().kind() == Kind::NullType {
        out.push_str("null");
    } else if v.get_type().kind() == Kind::List {
        out.push('[');
        for (i, item) in list_items(v, "format", 1)
            .map_err(|e| e.to_string())?
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                out.push_str(", ");
            }
            display(out, item)?;
        }
        out.push(']');
    } else {
        return Err(format!("%s does not format a {}", v.get_type().name()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Regular expressions (RE2 syntax; `matches` and Kubernetes' regex library)
// ---------------------------------------------------------------------------

/// Compiled-program size limit: bounds the work of one compilation.
const REGEX_SIZE_LIMIT: usize = 256 << 10;
/// Charged for compiling a pattern (a cache miss), plus 16 per byte of it.
const REGEX_COMPILE_COST: u64 = 2000;
/// Compiled expressions kept per thread.
const REGEX_CACHE: usize = 64;

thread_local! {
    static REGEXES: RefCell<HashMap<String, Rc<regex::Regex>>> = RefCell::new(HashMap::new());
}

/// The compiled `pattern`, from the per-thread cache; a miss is charged.
fn regex(pattern: &str, function: &str) -> Result<Rc<regex::Regex>, ExecutionError> {
    if let Some(re) = REGEXES.with(|c| c.borrow().get(pattern).cloned()) {
        charge(1)?;
        return Ok(re);
    }
    charge(REGEX_COMPILE_COST + 16 * pattern.len() as u64)?;
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            ExecutionError::function_error(
                function,
                format!("invalid regular expression {pattern:?}: {e}"),
            )
        })?;
    let re = Rc::new(re);
    REGEXES.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= REGEX_CACHE {
            cache.clear();
        }
        cache.insert(pattern.to_owned(), Rc::clone(&re));
    });
    Ok(re)
}

/// Matching is linear in the input, with a factor of the pattern's size.
fn charge_match(input: &str, pattern: &str) -> Result<(), ExecutionError> {
    charge(bytes_cost(input.len()).saturating_mul(1 + pattern.len() as u64 / 32))
}

fn regex_library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(
        "matches",
        "matches_string",
        vec![STRING_TYPE, STRING_TYPE],
        matches,
    )?;
    env.add_member_overload(
        "matches",
        "string_matches_string",
        STRING_TYPE,
        vec![STRING_TYPE],
        matches,
    )?;
    env.add_member_overload(
        "find",
        "string_find_string",
        STRING_TYPE,
        vec![STRING_TYPE],
        find,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string_int",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        find_all,
    )?;
    Ok(())
}

fn matches<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "matches")?;
    let pattern = string_arg(&args, 1, "matches")?;
    let re = regex(pattern, "matches")?;
    charge_match(s, pattern)?;
    boolean(re.is_match(s))
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "find")?;
    let pattern = string_arg(&args, 1, "find")?;
    let re = regex(pattern, "find")?;
    charge_match(s, pattern)?;
    string(
        re.find(s)
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default(),
    )
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let s = string_arg(&args, 0, "findAll")?;
    let pattern = string_arg(&args, 1, "findAll")?;
    let limit = if args.len() > 2 {
        usize::try_from(int_arg(&args, 2, "findAll")?).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    let re = regex(pattern, "findAll")?;
    charge_match(s, pattern)?;
    let found: Vec<Box<dyn Val>> = re
        .find_iter(s)
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val>)
        .collect();
    charge(found.len() as u64)?;
    Ok(CowVal::owned(CelList::from(found)))
}

// ---------------------------------------------------------------------------
// Sets (cel-go ext.Sets)
// ---------------------------------------------------------------------------

fn sets_library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(
        "sets.contains",
        "list_sets_contains_list",
        vec![LIST_TYPE, LIST_TYPE],
        sets_contains,
    )?;
    env.add_overload(
        "sets.equivalent",
        "list_sets_equivalent_list",
        vec![LIST_TYPE, LIST_TYPE],
        sets_equivalent,
    )?;
    env.add_overload(
        "sets.intersects",
        "list_sets_intersects_list",
        vec![LIST_TYPE, LIST_TYPE],
        sets_intersects,
    )?;
    Ok(())
}

/// Both lists, after charging for comparing every pair.
type Pair<'a, 'v> = (Vec<&'a (dyn Val + 'v)>, Vec<&'a (dyn Val + 'v)>);

fn two_lists<'a, 'v>(
    args: &'a [CowVal<'_, 'v>],
    function: &str,
) -> Result<Pair<'a, 'v>, ExecutionError> {
    let a = list_items(args[0].as_ref(), function, 0)?;
    let b = list_items(args[1].as_ref(), function, 1)?;
    charge(1 + (a.len() as u64).saturating_mul(b.len() as u64) / 4)?;
    Ok((a, b))
}

fn contains_all(haystack: &[&dyn Val], needles: &[&dyn Val]) -> bool {
    needles
        .iter()
        .all(|n| haystack.iter().any(|h| h.equals(*n)))
}

fn sets_contains<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = two_lists(&args, "sets.contains")?;
    boolean(contains_all(&a, &b))
}

fn sets_equivalent<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = two_lists(&args, "sets.equivalent")?;
    boolean(contains_all(&a, &b) && contains_all(&b, &a))
}

fn sets_intersects<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Out<'b, 'v> {
    let (a, b) = two_lists(&args, "sets.intersects")?;
    boolean(b.iter().any(|n| a.iter().any(|h| h.equals(*n))))
}

// ---------------------------------------------------------------------------
// cel.bind (cel-go ext.Bindings)
// ---------------------------------------------------------------------------

/// `cel.bind(var, init, body)`: `body` with `var` bound to `init`, expanded
/// as cel-go does into a comprehension over an empty list whose accumulator
/// is the variable.
fn bind_macro(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel") {
        return Ok(None);
    }
    let (Some(body), Some(init), Some(var)) = (args.pop(), args.pop(), args.pop()) else {
        return Ok(None);
    };
    let Expr::Ident(name) = var.expr else {
        return Err(helper.new_error(
            var.id,
            "cel.bind() variable name must be a simple identifier",
        ));
    };
    let bind = ComprehensionExpr {
        iter_range: helper.next_expr(Expr::List(ListExpr::new(Vec::new()))),
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: name.clone(),
        accu_init: init,
        loop_cond: helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into()))),
        loop_step: helper.next_expr(Expr::Ident(name)),
        result: body,
    };
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(bind)))))
}
