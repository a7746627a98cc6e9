//! Operators in the type pass: comparisons (a version or quantity against
//! a literal, an optional against a value, scalars of different types,
//! `type` against a value never published) and arithmetic, each with the
//! corrected expression when one can be written.

use std::fmt::Write as _;

use cel::common::ast::{Expr, IdedExpr, LiteralValue, SelectExpr, operators};

use super::refs::Ref;
use super::types::{Cat, Ty, literal_str, normalize_version, symbol};
use super::{Analysis, Hint};
use crate::validate::unparse::{call, int, node, string};
use crate::validate::{Check, Severity};
use gpu_dra_api::quantity::Quantity;
use gpu_dra_api::schema::{self, device_types};

/// `a OP b` read as `b OP' a`.
fn flip(op: &str) -> &'static str {
    match op {
        operators::LESS => operators::GREATER,
        operators::LESS_EQUALS => operators::GREATER_EQUALS,
        operators::GREATER => operators::LESS,
        operators::GREATER_EQUALS => operators::LESS_EQUALS,
        operators::NOT_EQUALS => operators::NOT_EQUALS,
        _ => operators::EQUALS,
    }
}

impl Analysis<'_> {
    pub(super) fn compare(
        &mut self,
        e: &IdedExpr,
        op: &str,
        a: &IdedExpr,
        b: &IdedExpr,
        ta: &Ty,
        tb: &Ty,
    ) {
        self.note_type_value(e, op, a, b);
        // Only `device.driver == '<driver>'` claims our devices: a class
        // that says `!=` is about other drivers' devices, and is not ours.
        for (driver, literal) in [(a, b), (b, a)] {
            if op == operators::EQUALS
                && matches!(self.refs.get(&driver.id), Some(Ref::Driver))
                && literal_str(literal) == Some(self.driver)
            {
                self.mentions_driver = true;
            }
        }
        let (Some(ca), Some(cb)) = (ta.cat(), tb.cat()) else {
            return;
        };
        let ordering = !matches!(op, operators::EQUALS | operators::NOT_EQUALS);
        let fine = if ordering {
            ca == cb && matches!(ca, Cat::Num | Cat::Str | Cat::Bytes | Cat::Bool)
        } else {
            ca == cb || ca == Cat::Null || cb == Cat::Null
        };
        if fine {
            return;
        }
        let sym = symbol(op);
        let (text_a, text_b) = (self.text(a), self.text(b));
        let outcome = if ordering {
            format!("`{sym}` between them fails at scheduling time (no such overload)")
        } else if op == operators::EQUALS {
            "`==` between them is always false".to_owned()
        } else {
            "`!=` between them is always true".to_owned()
        };
        // a version or quantity on one side: compareTo()
        let typed = if matches!(ta, Ty::Version | Ty::Quantity) {
            Some((a, b, ta, tb, false))
        } else if matches!(tb, Ty::Version | Ty::Quantity) {
            Some((b, a, tb, ta, true))
        } else {
            None
        };
        if let Some((typed, other, tt, ot, flipped)) = typed {
            let plural = if *tt == Ty::Version {
                "versions"
            } else {
                "quantities"
            };
            let mut message = if ca == cb {
                format!(
                    "{plural} cannot be compared with `{sym}` (no such overload at scheduling time); compare them with compareTo()"
                )
            } else {
                let typed_text = if flipped { &text_b } else { &text_a };
                let other_text = if flipped { &text_a } else { &text_b };
                format!(
                    "`{typed_text}` is {} and `{other_text}` {}: {outcome}; compare {plural} with compareTo()",
                    tt.describe(),
                    ot.describe()
                )
            };
            let converted = self.convert(typed, other, tt, ot, &mut message);
            let op = if flipped { flip(op) } else { op };
            match converted {
                Some(converted) => {
                    let fix = call(
                        None,
                        op,
                        vec![
                            call(Some(typed.clone()), "compareTo", vec![converted]),
                            int(0),
                        ],
                    );
                    self.error_with_fix(Check::TypeMismatch, e, message, fix);
                }
                None => self.error(Check::TypeMismatch, e, message, None),
            }
            return;
        }
        // an optional on one side
        let optional = match (ta, tb) {
            (Ty::Optional(_), _) => Some((a, b)),
            (_, Ty::Optional(_)) => Some((b, a)),
            _ => None,
        };
        if let Some((opt, other)) = optional {
            let text = self.text(opt);
            let message = format!(
                "`{text}` is an optional (from `.?`), not a value: {outcome}; test presence and compare the value"
            );
            let fix = Self::unwrap_optional(opt).map(|(has, value)| {
                let compared = call(None, op, vec![value, other.clone()]);
                call(None, operators::LOGICAL_AND, vec![has, compared])
            });
            match fix {
                Some(fix) => self.error_with_fix(Check::TypeMismatch, e, message, fix),
                None => self.error(Check::TypeMismatch, e, message, None),
            }
            return;
        }
        let message = format!(
            "`{text_a}` is {} and `{text_b}` {}: {outcome}",
            ta.describe(),
            tb.describe()
        );
        // a literal of the wrong scalar type
        let fix = match (ta, &b.expr, tb, &a.expr) {
            (Ty::Int, Expr::Literal(LiteralValue::String(s)), _, _) => {
                s.inner().trim().parse::<i64>().ok().map(|n| (b, int(n)))
            }
            (Ty::String, Expr::Literal(LiteralValue::Int(n)), _, _) => {
                Some((b, string(&n.inner().to_string())))
            }
            (_, _, Ty::Int, Expr::Literal(LiteralValue::String(s))) => {
                s.inner().trim().parse::<i64>().ok().map(|n| (a, int(n)))
            }
            (_, _, Ty::String, Expr::Literal(LiteralValue::Int(n))) => {
                Some((a, string(&n.inner().to_string())))
            }
            _ => None,
        };
        match fix {
            Some((literal, replacement)) => {
                self.flagged.insert(e.id);
                self.fixes.insert(literal.id, replacement);
                self.report(
                    Check::TypeMismatch,
                    Severity::Error,
                    e,
                    message,
                    Hint::Corrected(literal.id),
                );
            }
            None => self.error(Check::TypeMismatch, e, message, None),
        }
    }

    /// `has(X.name)` and `X.name` for an optional read `X.?name`.
    pub(super) fn unwrap_optional(opt: &IdedExpr) -> Option<(IdedExpr, IdedExpr)> {
        let Expr::Call(c) = &opt.expr else {
            return None;
        };
        let [operand, key] = c.args.as_slice() else {
            return None;
        };
        let name = literal_str(key)?.to_owned();
        if c.func_name != operators::OPT_SELECT && c.func_name != operators::OPT_INDEX {
            return None;
        }
        let select = |test| {
            node(Expr::Select(SelectExpr {
                operand: Box::new(operand.clone()),
                field: name.clone(),
                test,
            }))
        };
        Some((select(true), select(false)))
    }

    /// `other` turned into the type of `typed` (a version or quantity), for
    /// a compareTo() hint; notes on units go into `message`.
    pub(super) fn convert(
        &self,
        typed: &IdedExpr,
        other: &IdedExpr,
        tt: &Ty,
        ot: &Ty,
        message: &mut String,
    ) -> Option<IdedExpr> {
        if ot == tt {
            return Some(other.clone());
        }
        let text = match &other.expr {
            Expr::Literal(LiteralValue::String(s)) => s.inner().to_owned(),
            Expr::Literal(LiteralValue::Int(i)) => i.inner().to_string(),
            Expr::Literal(LiteralValue::UInt(u)) => u.inner().to_string(),
            Expr::Literal(LiteralValue::Double(d)) => format!("{:?}", d.inner()),
            _ => return None,
        };
        if *tt == Ty::Version {
            let version = normalize_version(&text)?;
            return Some(call(None, "semver", vec![string(&version)]));
        }
        let is_number = matches!(
            other.expr,
            Expr::Literal(LiteralValue::Int(_) | LiteralValue::UInt(_))
        );
        let memory = self
            .entry_of(typed)
            .is_some_and(|entry| entry.name == schema::names::MEMORY);
        let number: Option<u64> = text.parse().ok();
        if memory && is_number {
            let unit = match number {
                Some(n) if n <= 1024 => Some(("Gi", "GiB")),
                Some(n) if n < 1 << 20 => Some(("Mi", "MiB")),
                _ => None,
            };
            if let Some((suffix, words)) = unit {
                let _ = write!(
                    message,
                    " (memory is counted in bytes: {text} would be {text} bytes; the hint reads it as {words})"
                );
                return Some(call(
                    None,
                    "quantity",
                    vec![string(&format!("{text}{suffix}"))],
                ));
            }
        }
        Quantity::parse(&text)
            .ok()
            .map(|_| call(None, "quantity", vec![string(&text)]))
    }

    /// `type == 'vgpu'`: a value this driver never publishes.
    pub(super) fn note_type_value(&mut self, e: &IdedExpr, op: &str, a: &IdedExpr, b: &IdedExpr) {
        if op != operators::EQUALS && op != operators::NOT_EQUALS {
            return;
        }
        for (read, literal) in [(a, b), (b, a)] {
            let is_type = self
                .entry_of(read)
                .is_some_and(|entry| entry.name == schema::names::TYPE);
            if let (true, Some(value)) = (is_type, literal_str(literal))
                && value != device_types::GPU
                && value != device_types::MIG
                && value != device_types::VFIO
            {
                let message = format!(
                    "`type` is '{}', '{}' or '{}' on the devices of {}, never '{value}'",
                    device_types::GPU,
                    device_types::MIG,
                    device_types::VFIO,
                    self.driver
                );
                self.impossible_types.push((e.id, message));
            }
        }
    }

    pub(super) fn arithmetic(&mut self, e: &IdedExpr, op: &str, a: &IdedExpr, b: &IdedExpr) -> Ty {
        let ta = self.ty(a);
        let tb = self.ty(b);
        let sym = symbol(op);
        for (side, t, other) in [(a, &ta, b), (b, &tb, a)] {
            match t {
                Ty::Quantity if !self.flagged.contains(&side.id) => {
                    let text = self.text(side);
                    let method = match op {
                        operators::ADD => Some("add"),
                        operators::SUBSTRACT => Some("sub"),
                        _ => None,
                    };
                    let message = format!(
                        "`{text}` is a quantity: quantities have no `{sym}` (no such overload at scheduling time){}",
                        if method.is_some() {
                            "; use add() and sub()"
                        } else {
                            ""
                        }
                    );
                    match method {
                        Some(method) if std::ptr::eq(side, a) => {
                            let fix = call(Some(a.clone()), method, vec![other.clone()]);
                            self.error_with_fix(Check::TypeMismatch, e, message, fix);
                        }
                        _ => self.error(Check::TypeMismatch, e, message, None),
                    }
                    return Ty::Dyn;
                }
                Ty::Version if !self.flagged.contains(&side.id) => {
                    let text = self.text(side);
                    self.error(
                        Check::TypeMismatch,
                        e,
                        format!(
                            "`{text}` is a version: versions have no `{sym}` (no such overload at scheduling time); use major(), minor(), patch() or compareTo()"
                        ),
                        None,
                    );
                    return Ty::Dyn;
                }
                _ => {}
            }
        }
        let allowed = |t: &Ty| match op {
            operators::ADD => matches!(
                t,
                Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::List | Ty::Dyn
            ),
            operators::MODULO => matches!(t, Ty::Int | Ty::Uint | Ty::Dyn),
            _ => matches!(t, Ty::Int | Ty::Uint | Ty::Double | Ty::Dyn),
        };
        let known = ta != Ty::Dyn && tb != Ty::Dyn;
        if !allowed(&ta) || !allowed(&tb) || (known && ta != tb) {
            if !self.flagged.contains(&a.id) && !self.flagged.contains(&b.id) {
                let (text_a, text_b) = (self.text(a), self.text(b));
                self.error(
                    Check::TypeMismatch,
                    e,
                    format!(
                        "`{text_a}` is {} and `{text_b}` {}: `{sym}` between them fails at scheduling time (no such overload)",
                        ta.describe(),
                        tb.describe()
                    ),
                    None,
                );
            }
            return Ty::Dyn;
        }
        if ta == Ty::Dyn { tb } else { ta }
    }
}
