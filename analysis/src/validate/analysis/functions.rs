//! Functions and methods in the type pass: receivers and arguments of the
//! string, quantity, semver and optional functions, and literal arguments
//! (`semver('1.2')`, `quantity('40GB')`, regular expressions) checked by
//! evaluating them with the real engine.

use cel::common::ast::{CallExpr, Expr, IdedExpr};

use super::types::{Cat, Ty, literal_str, normalize_version};
use super::{Analysis, Hint};
use crate::cel::{CelDevice, EvalError};
use crate::validate::unparse::{call, node, quote, string, unparse};
use crate::validate::{Check, Severity};
use gpu_dra_api::quantity::Quantity;

/// Literal arguments checked by evaluation per selector, at most.
const MAX_LITERAL_CHECKS: usize = 16;

impl Analysis<'_> {
    /// Checks the receiver of a method; reports and returns false when its
    /// type cannot work.
    pub(super) fn receiver(
        &mut self,
        e: &IdedExpr,
        target: &IdedExpr,
        t: &Ty,
        method: &str,
        want: &[Cat],
        want_text: &str,
    ) -> bool {
        let Some(cat) = t.cat() else {
            return true;
        };
        if want.contains(&cat) || self.flagged.contains(&target.id) {
            return true;
        }
        let text = self.text(target);
        if let Ty::Optional(_) = t {
            self.error(
                Check::TypeMismatch,
                e,
                format!(
                    "`{text}` is an optional (from `.?`): unwrap it with `.orValue(…)` before calling `{method}()`"
                ),
                None,
            );
            return false;
        }
        let message = format!(
            "`{method}()` needs {want_text}, but `{text}` is {}",
            t.describe()
        );
        if want == [Cat::Str] && matches!(t, Ty::Int | Ty::Uint | Ty::Double | Ty::Bool) {
            // string(x).startsWith(...)
            let Expr::Call(c) = &e.expr else {
                self.error(Check::TypeMismatch, e, message, None);
                return false;
            };
            let fix = node(Expr::Call(CallExpr {
                func_name: c.func_name.clone(),
                target: Some(Box::new(call(None, "string", vec![target.clone()]))),
                args: c.args.clone(),
            }));
            self.error_with_fix(Check::TypeMismatch, e, message, fix);
        } else {
            self.error(Check::TypeMismatch, e, message, None);
        }
        false
    }

    /// Checks that argument `arg` has a type in `want`.
    pub(super) fn argument(
        &mut self,
        e: &IdedExpr,
        method: &str,
        arg: &IdedExpr,
        t: &Ty,
        want: &[Cat],
        want_text: &str,
    ) {
        if t.cat().is_none_or(|c| want.contains(&c)) || self.flagged.contains(&arg.id) {
            return;
        }
        let text = self.text(arg);
        self.error(
            Check::TypeMismatch,
            e,
            format!(
                "`{method}()` takes {want_text}, but `{text}` is {}",
                t.describe()
            ),
            None,
        );
    }

    pub(super) fn function(&mut self, e: &IdedExpr, c: &CallExpr) -> Ty {
        let name = c.func_name.as_str();
        let namespace = match c.target.as_deref().map(|t| &t.expr) {
            Some(Expr::Ident(ns))
                if matches!(ns.as_str(), "strings" | "sets" | "optional")
                    && self.local(ns).is_none() =>
            {
                Some(ns.as_str())
            }
            _ => None,
        };
        let target = match (c.target.as_deref(), namespace) {
            (Some(t), None) => Some((t, self.ty(t))),
            _ => None,
        };
        let args: Vec<Ty> = c.args.iter().map(|a| self.ty(a)).collect();
        if let Some(ns) = namespace {
            return match (ns, name) {
                ("strings", "quote") => Ty::String,
                ("sets", _) => Ty::Bool,
                ("optional", "of" | "ofNonZeroValue") => {
                    Ty::Optional(Box::new(args.first().cloned().unwrap_or(Ty::Dyn)))
                }
                ("optional", _) => Ty::Optional(Box::new(Ty::Dyn)),
                _ => Ty::Dyn,
            };
        }
        const STR: &[Cat] = &[Cat::Str];
        match (name, target) {
            (
                "contains" | "startsWith" | "endsWith" | "matches" | "find" | "findAll" | "charAt"
                | "indexOf" | "lastIndexOf" | "lowerAscii" | "upperAscii" | "replace" | "split"
                | "substring" | "trim" | "format",
                Some((target, t)),
            ) => {
                self.receiver(e, target, &t, name, STR, "a string");
                if matches!(
                    name,
                    "contains"
                        | "startsWith"
                        | "endsWith"
                        | "matches"
                        | "find"
                        | "findAll"
                        | "indexOf"
                        | "lastIndexOf"
                ) && let (Some(arg), Some(t)) = (c.args.first(), args.first())
                {
                    self.argument(e, name, arg, t, STR, "a string");
                }
                if matches!(name, "matches" | "find" | "findAll")
                    && let Some(pattern) = c.args.first().and_then(literal_str)
                {
                    self.check_regex(e, pattern);
                }
                match name {
                    "contains" | "startsWith" | "endsWith" | "matches" => Ty::Bool,
                    "findAll" | "split" => Ty::List,
                    "indexOf" | "lastIndexOf" => Ty::Int,
                    _ => Ty::String,
                }
            }
            ("matches", None) => {
                if let (Some(arg), Some(t)) = (c.args.first(), args.first()) {
                    self.argument(e, name, arg, t, STR, "a string");
                }
                if let Some(pattern) = c.args.get(1).and_then(literal_str) {
                    self.check_regex(e, pattern);
                }
                Ty::Bool
            }
            ("size", target) => {
                let (subject, t) = match (target, c.args.first(), args.first()) {
                    (Some((target, t)), _, _) => (target, t),
                    (None, Some(arg), Some(t)) => (arg, t.clone()),
                    _ => return Ty::Int,
                };
                self.receiver(
                    e,
                    subject,
                    &t,
                    name,
                    &[Cat::Str, Cat::Bytes, Cat::List, Cat::Map],
                    "a string, bytes, a list or a map",
                );
                Ty::Int
            }
            (
                "sign" | "isInteger" | "asInteger" | "asApproximateFloat" | "add" | "sub",
                Some((target, t)),
            ) => {
                self.receiver(e, target, &t, name, &[Cat::Quantity], "a quantity");
                if matches!(name, "add" | "sub")
                    && let (Some(arg), Some(t)) = (c.args.first(), args.first())
                {
                    self.argument(
                        e,
                        name,
                        arg,
                        t,
                        &[Cat::Quantity, Cat::Num],
                        "a quantity or an int",
                    );
                }
                match name {
                    "isInteger" => Ty::Bool,
                    "asApproximateFloat" => Ty::Double,
                    "add" | "sub" => Ty::Quantity,
                    _ => Ty::Int,
                }
            }
            ("major" | "minor" | "patch", Some((target, t))) => {
                self.receiver(e, target, &t, name, &[Cat::Version], "a version");
                Ty::Int
            }
            ("compareTo" | "isGreaterThan" | "isLessThan", Some((target, t))) => {
                if self.receiver(
                    e,
                    target,
                    &t,
                    name,
                    &[Cat::Version, Cat::Quantity],
                    "a version or a quantity",
                ) && matches!(t, Ty::Version | Ty::Quantity)
                    && let (Some(arg), Some(at)) = (c.args.first(), args.first())
                    && at.cat().is_some_and(|c| Some(c) != t.cat())
                    && !self.flagged.contains(&arg.id)
                {
                    let text = self.text(arg);
                    let mut message = format!(
                        "`{name}()` of {} takes {}, but `{text}` is {}",
                        t.describe(),
                        t.describe(),
                        at.describe()
                    );
                    match self.convert(target, arg, &t, at, &mut message) {
                        Some(converted) => {
                            self.flagged.insert(e.id);
                            self.fixes.insert(arg.id, converted);
                            self.report(
                                Check::TypeMismatch,
                                Severity::Error,
                                e,
                                message,
                                Hint::Corrected(arg.id),
                            );
                        }
                        None => self.error(Check::TypeMismatch, e, message, None),
                    }
                }
                if name == "compareTo" {
                    Ty::Int
                } else {
                    Ty::Bool
                }
            }
            ("semver" | "isSemver" | "quantity" | "isQuantity", None) => {
                self.constructor(e, c, &args);
                match name {
                    "semver" => Ty::Version,
                    "quantity" => Ty::Quantity,
                    _ => Ty::Bool,
                }
            }
            ("orValue" | "value" | "hasValue" | "or", Some((target, t))) => {
                let inner = match &t {
                    Ty::Optional(inner) => (**inner).clone(),
                    Ty::Dyn => Ty::Dyn,
                    other => {
                        if !self.flagged.contains(&target.id) {
                            let text = self.text(target);
                            self.error(
                                Check::TypeMismatch,
                                e,
                                format!(
                                    "`{name}()` is a function of optionals (from `.?x` or `[?k]`), but `{text}` is {}",
                                    other.describe()
                                ),
                                None,
                            );
                        }
                        return Ty::Dyn;
                    }
                };
                match name {
                    "hasValue" => Ty::Bool,
                    "or" => t,
                    "orValue" => match args.first() {
                        Some(a) if *a == inner || inner == Ty::Dyn => a.clone(),
                        _ if inner != Ty::Dyn => inner,
                        _ => Ty::Dyn,
                    },
                    _ => inner,
                }
            }
            ("join", Some(_)) | ("string", None) => Ty::String,
            ("int", None) => Ty::Int,
            ("uint", None) => Ty::Uint,
            ("double", None) => Ty::Double,
            ("bool", None) => Ty::Bool,
            ("bytes", None) => Ty::Bytes,
            ("type", None) => Ty::Type,
            _ => Ty::Dyn,
        }
    }

    /// `semver(s[, normalize])`, `isSemver`, `quantity(s)`, `isQuantity`.
    pub(super) fn constructor(&mut self, e: &IdedExpr, c: &CallExpr, args: &[Ty]) {
        let name = c.func_name.as_str();
        let (Some(arg), Some(t)) = (c.args.first(), args.first()) else {
            return;
        };
        if matches!(t, Ty::Version | Ty::Quantity) && !self.flagged.contains(&arg.id) {
            let text = self.text(arg);
            let message = format!(
                "`{name}()` takes a string, but `{text}` is already {}",
                t.describe()
            );
            if matches!(name, "semver" | "quantity") {
                self.error_with_fix(Check::TypeMismatch, e, message, arg.clone());
            } else {
                self.error(Check::TypeMismatch, e, message, None);
            }
            return;
        }
        self.argument(e, name, arg, t, &[Cat::Str], "a string");
        let Some(text) = literal_str(arg) else {
            return;
        };
        if !matches!(name, "semver" | "quantity") {
            return;
        }
        let literal_args = c.args.iter().all(|a| matches!(a.expr, Expr::Literal(_)));
        let Some(written) = unparse(e).filter(|_| literal_args) else {
            return;
        };
        let Some(failure) = self.evaluate_literal(&format!("{written} == {written}")) else {
            return;
        };
        let message = format!("`{written}` fails on every device: {failure}");
        let fix = if name == "semver" {
            normalize_version(text)
                .filter(|v| v != text)
                .map(|v| call(None, "semver", vec![string(&v)]))
        } else {
            binary_suffix(text).map(|q| call(None, "quantity", vec![string(&q)]))
        };
        match fix {
            Some(fix) => self.error_with_fix(Check::InvalidLiteral, e, message, fix),
            None => self.error(Check::InvalidLiteral, e, message, None),
        }
    }

    pub(super) fn check_regex(&mut self, e: &IdedExpr, pattern: &str) {
        if let Some(failure) = self.evaluate_literal(&format!("''.matches({})", quote(pattern))) {
            self.error(
                Check::InvalidLiteral,
                e,
                format!(
                    "the regular expression {} fails on every device: {failure}",
                    quote(pattern)
                ),
                None,
            );
        }
    }

    /// Evaluates a device-independent probe with the real engine; the
    /// runtime error it fails with, if any.
    pub(super) fn evaluate_literal(&mut self, probe: &str) -> Option<String> {
        if self.literal_checks >= MAX_LITERAL_CHECKS {
            return None;
        }
        self.literal_checks += 1;
        let selector = self.compiler.compile(probe).ok()?;
        let device = CelDevice::new(self.driver);
        match self.compiler.evaluator(&device).matches(&selector) {
            Err(EvalError::Runtime(message)) => Some(message),
            _ => None,
        }
    }
}

/// `40GB` → `40Gi` (a unit written the way memory sizes are usually
/// written, which quantities do not accept).
fn binary_suffix(text: &str) -> Option<String> {
    let stripped = text.strip_suffix(['B', 'b'])?;
    let unit = stripped.chars().last()?;
    if !"kKmMgGtTpPeE".contains(unit) {
        return None;
    }
    let candidate = format!(
        "{}{}i",
        &stripped[..stripped.len() - unit.len_utf8()],
        unit.to_ascii_uppercase()
    );
    Quantity::parse(&candidate).ok().map(|_| candidate)
}
