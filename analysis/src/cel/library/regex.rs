//! Regular expressions in RE2 syntax: `matches` and Kubernetes' regex
//! library (`find`, `findAll`). Compiled patterns are cached per thread;
//! compiling is charged heavily and bounded by a program-size limit.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use cel::common::types::{CelList, CelString, INT_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{Out, boolean, int_arg, string, string_arg};
use crate::cel::cost::{bytes_cost, charge};

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

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
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
