//! Kubernetes' quantity library (`k8s.io/apiserver/pkg/cel/library/quantity.go`):
//! `quantity`, `isQuantity` and the methods of `Quantity` values.

use cel::common::types::{CelDouble, CelInt, INT_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};

use super::{Out, boolean, int, ordering, quantity_arg, string_arg};
use crate::cel::cost::{bytes_cost, charge};
use crate::cel::values::{CelQuantity, QUANTITY_TYPE};
use gpu_dra_api::quantity::Quantity;

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
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
