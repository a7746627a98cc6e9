//! The sets extension (cel-go `ext.Sets`): `sets.contains`,
//! `sets.equivalent` and `sets.intersects`, comparing with CEL equality.

use cel::common::types::LIST_TYPE;
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use super::{Out, boolean, list_arg};
use crate::cel::cost::charge;

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
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
    let a = list_arg(args, 0, function)?;
    let b = list_arg(args, 1, function)?;
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
