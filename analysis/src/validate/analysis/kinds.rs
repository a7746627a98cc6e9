//! The per-kind pass: the selector is evaluated abstractly once per kind
//! of device it can see (full GPU, static MIG, dynamic MIG, a device of
//! another driver), with what the schema knows about that kind: which
//! entries it carries, which only under a condition, and the value of
//! `type` and `device.driver`. CEL's logic is followed exactly: `&&` and
//! `||` short-circuit and absorb errors (`error && false` is `false`), a
//! failed read is an error, not `false`, and `has()` guards make reads in
//! their scope safe. The result per kind says whether the selector can be
//! true and which reads can fail on that kind.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, LiteralValue, operators};

use super::refs::{Access, Dom, Fact, Read, Ref, field, read_text};
use super::types::{is_bind, literal_str};
use super::{Analysis, Hint, Pending};
use crate::cel::Selector;
use crate::validate::devices::{DeviceSet, Kind};
use crate::validate::unparse::{quote, unparse};
use crate::validate::{Check, Severity};
use gpu_dra_api::schema::{DeviceKind, Presence, ValueType, device_types};

/// Functions whose result is a bool.
const BOOL_FUNCTIONS: &[&str] = &[
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "isGreaterThan",
    "isLessThan",
    "isSemver",
    "isQuantity",
    "isInteger",
    "hasValue",
    "bool",
];

/// An abstract non-bool value.
#[derive(Debug, Clone, PartialEq)]
enum Av {
    /// A string, known or not.
    Str(Option<String>),
    /// A string known to differ from this one (`device.driver` of another
    /// driver's device).
    NotStr(String),
    /// An optional: whether it has a value (if known), and the value.
    Opt(Option<bool>, Box<Av>),
    /// Anything, possibly a bool.
    Other,
}

/// What an expression can evaluate to on one kind of device.
#[derive(Debug, Clone, Default)]
struct Out {
    /// Can be `true`.
    t: bool,
    /// Can be `false`.
    f: bool,
    /// Can be this non-bool value.
    v: Option<Av>,
    /// Can fail, for these causes (indices into the cause list; 0 is a
    /// problem the type pass reported already).
    errs: Vec<usize>,
}

impl Out {
    fn known(b: bool) -> Out {
        Out {
            t: b,
            f: !b,
            ..Out::default()
        }
    }

    fn unknown() -> Out {
        Out {
            t: true,
            f: true,
            ..Out::default()
        }
    }

    fn value(v: Av) -> Out {
        Out {
            v: Some(v),
            ..Out::default()
        }
    }

    /// Whether it can be true / false when used as a bool.
    fn bools(&self) -> (bool, bool) {
        let other = self.v == Some(Av::Other);
        (self.t || other, self.f || other)
    }

    /// The errors of using it as a bool (a non-bool value is one).
    fn bool_errors(&self) -> Vec<usize> {
        let mut errs = self.errs.clone();
        if matches!(&self.v, Some(v) if *v != Av::Other) {
            errs.push(SILENT);
        }
        errs
    }

    fn is_bad(&self) -> bool {
        !self.bool_errors().is_empty()
    }

    /// A known bool, if it is one.
    fn known_bool(&self) -> Option<bool> {
        match (self.t, self.f, &self.v, self.errs.is_empty()) {
            (true, false, None, true) => Some(true),
            (false, true, None, true) => Some(false),
            _ => None,
        }
    }

    fn merge(mut self, other: Out) -> Out {
        self.t |= other.t;
        self.f |= other.f;
        self.v = match (self.v, other.v) {
            (None, v) | (v, None) => v,
            (Some(a), Some(b)) if a == b => Some(a),
            (Some(Av::Str(_)), Some(Av::Str(_))) => Some(Av::Str(None)),
            _ => Some(Av::Other),
        };
        self.errs.extend(other.errs);
        self
    }
}

/// Index of the "already reported" cause.
const SILENT: usize = 0;

/// Why a read fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CauseKind {
    /// Reported by the type pass.
    Silent,
    /// The kind does not carry the entry.
    Missing,
    /// The entry is present only under a condition.
    Conditional,
    /// Another domain, on this driver's devices.
    ForeignDomain,
    /// This driver's domain, on another driver's device.
    OtherDriver,
}

/// A read that can fail, and on which kinds it does.
#[derive(Debug, Clone)]
struct Cause {
    id: u64,
    kind: CauseKind,
    offset: Option<usize>,
    read: Option<Read>,
    kinds: DeviceSet,
}

/// Whether an entry is there on the kind being evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Present {
    Yes,
    No,
    /// Only under a condition.
    Conditional,
    /// Cannot be told (another driver's device).
    Unknown,
}

/// The evaluation for one kind.
struct Pass<'p> {
    refs: &'p HashMap<u64, Ref>,
    flagged: &'p HashSet<u64>,
    selector: &'p Selector,
    driver: &'p str,
    kind: Kind,
    causes: &'p mut Vec<Cause>,
    scope: Vec<(String, Out)>,
    /// Nodes known to be false (without error) on this kind.
    false_nodes: HashSet<u64>,
}

impl Analysis<'_> {
    /// Runs the per-kind pass over the kinds of `reach`, reports what it
    /// finds, and returns the kinds for which the selector can be true.
    pub(super) fn kind_pass(&mut self, root: &IdedExpr, reach: DeviceSet) -> DeviceSet {
        let mut causes = vec![Cause {
            id: 0,
            kind: CauseKind::Silent,
            offset: None,
            read: None,
            kinds: DeviceSet::NONE,
        }];
        let mut matches = DeviceSet::NONE;
        let mut false_because: Vec<(String, DeviceSet)> = Vec::new();
        for kind in reach.members() {
            let mut pass = Pass {
                refs: &self.refs,
                flagged: &self.flagged,
                selector: self.selector,
                driver: self.driver,
                kind,
                causes: &mut causes,
                scope: Vec::new(),
                false_nodes: HashSet::new(),
            };
            let out = pass.eval(root, &[]);
            let (can_be_true, _) = out.bools();
            if can_be_true {
                matches.insert(kind);
            }
            if !can_be_true && out.errs.is_empty() && kind != Kind::Other {
                let atom = pass.explain(root);
                let text = unparse(atom).unwrap_or_else(|| "the selector".to_owned());
                if let Some((_, set)) = false_because.iter_mut().find(|(t, _)| *t == text) {
                    set.insert(kind);
                } else {
                    let mut set = DeviceSet::NONE;
                    set.insert(kind);
                    false_because.push((text, set));
                }
            }
            for &i in &out.errs {
                causes[i].kinds.insert(kind);
            }
        }
        for cause in causes.into_iter().skip(1) {
            if !cause.kinds.is_empty() {
                self.report_cause(cause);
            }
        }
        let ours = reach.intersection(DeviceSet::OURS);
        let impossible = std::mem::take(&mut self.impossible_types);
        let has_errors = self.pending.iter().any(|p| p.severity == Severity::Error);
        if !ours.is_empty() && matches.intersection(DeviceSet::OURS).is_empty() && !has_errors {
            let mut message = format!(
                "this selector is false for every device of {} it is evaluated on ({})",
                self.driver,
                ours.describe()
            );
            for (text, set) in &false_because {
                let _ = write!(message, "; on {}, `{text}` is false", set.describe());
            }
            if let Some((_, note)) = impossible.first() {
                message.push_str(": ");
                message.push_str(note);
            }
            self.pending.push(Pending {
                check: Check::NeverMatches,
                severity: Severity::Warning,
                offset: None,
                message,
                hint: Hint::None,
            });
        } else {
            for (id, note) in impossible {
                self.pending.push(Pending {
                    check: Check::NeverMatches,
                    severity: Severity::Warning,
                    offset: self.selector.offset(id),
                    message: format!("this comparison is never true: {note}"),
                    hint: Hint::None,
                });
            }
        }
        matches
    }

    fn report_cause(&mut self, cause: Cause) {
        let Some(read) = cause.read else {
            return;
        };
        let text = read_text(read.section, &read.domain_name, &read.name);
        let name = &read.name;
        let no_such_key = "fails with \"no such key\" at scheduling time, an error of the allocation attempt rather than a non-match";
        let (check, severity, message, guard) = match cause.kind {
            CauseKind::Silent => return,
            CauseKind::Missing => {
                let carried = read
                    .entry
                    .map_or(DeviceSet::NONE, |e| DeviceSet::of_kinds(e.kinds));
                let severity = if cause.kinds.contains(DeviceKind::Gpu)
                    || cause.kinds.contains(DeviceKind::MigStatic)
                {
                    Severity::Error
                } else {
                    Severity::Warning
                };
                let type_guard = |value: &str| {
                    format!(
                        "device.attributes[{}].type == '{value}'",
                        quote(self.driver)
                    )
                };
                let guard = if carried == DeviceSet::of(DeviceKind::Gpu) {
                    type_guard(device_types::GPU)
                } else if carried
                    == DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic])
                {
                    type_guard(device_types::MIG)
                } else if carried == DeviceSet::of(DeviceKind::Vfio) {
                    type_guard(device_types::VFIO)
                } else {
                    format!("has({text})")
                };
                let message = format!(
                    "`{name}` is not published on {} (only on {}): on them `{text}` {no_such_key}; check the device type first or guard the read",
                    cause.kinds.describe(),
                    carried.describe()
                );
                (Check::MissingAttribute, severity, message, guard)
            }
            CauseKind::Conditional => {
                let condition = match read.entry.map(|e| e.presence) {
                    Some(Presence::When(condition)) => condition,
                    _ => "under some conditions",
                };
                let message = format!(
                    "`{name}` is published only {condition}: on a device without it `{text}` {no_such_key}; guard it with has() or read it with `.?{name}`"
                );
                (
                    Check::ConditionalAttribute,
                    Severity::Warning,
                    message,
                    format!("has({text})"),
                )
            }
            CauseKind::ForeignDomain => {
                let message = format!(
                    "the devices of {} have no {} in the domain `{}`: on {}, `{text}` {no_such_key}",
                    self.driver,
                    field(read.section),
                    read.domain_name,
                    cause.kinds.describe()
                );
                (
                    Check::ForeignDomain,
                    Severity::Error,
                    message,
                    format!("has({text})"),
                )
            }
            CauseKind::OtherDriver => {
                let which = if matches!(read.domain, Dom::Ours | Dom::OursMisspelt) {
                    "on devices of other drivers"
                } else {
                    "on devices of other drivers that lack it"
                };
                let message = format!(
                    "this selector also sees the devices of other drivers (nothing before it restricts `device.driver`): {which} `{text}` {no_such_key}; test `device.driver` first"
                );
                (
                    Check::OtherDriverDevice,
                    Severity::Warning,
                    message,
                    format!("device.driver == {}", quote(self.driver)),
                )
            }
        };
        self.pending.push(Pending {
            check,
            severity,
            offset: cause.offset,
            message,
            hint: Hint::Guard(guard),
        });
    }
}

impl Pass<'_> {
    fn eval(&mut self, e: &IdedExpr, facts: &[Fact]) -> Out {
        let out = self.eval_node(e, facts);
        if out.known_bool() == Some(false) {
            self.false_nodes.insert(e.id);
        }
        out
    }

    /// The sub-expression that makes `e` false: the false conjunct of an
    /// `&&`, followed down.
    fn explain<'e>(&self, e: &'e IdedExpr) -> &'e IdedExpr {
        if let Expr::Call(c) = &e.expr
            && c.func_name == operators::LOGICAL_AND
            && let Some(conjunct) = c.args.iter().find(|a| self.false_nodes.contains(&a.id))
        {
            return self.explain(conjunct);
        }
        e
    }

    fn eval_node(&mut self, e: &IdedExpr, facts: &[Fact]) -> Out {
        if let Some(r) = self.refs.get(&e.id) {
            return self.eval_ref(e, r, facts);
        }
        match &e.expr {
            Expr::Literal(LiteralValue::Boolean(b)) => Out::known(*b.inner()),
            Expr::Literal(LiteralValue::String(s)) => {
                Out::value(Av::Str(Some(s.inner().to_owned())))
            }
            Expr::Literal(_) => Out::value(Av::Other),
            Expr::Ident(name) => self
                .scope
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map_or_else(|| Out::value(Av::Other), |(_, o)| o.clone()),
            Expr::Select(select) => {
                let operand = self.eval(&select.operand, facts);
                let mut out = if select.test {
                    Out::unknown()
                } else {
                    Out::value(Av::Other)
                };
                out.errs = operand.errs;
                self.silent_if_flagged(e, &mut out);
                out
            }
            Expr::Call(call) => self.call(e, call, facts),
            Expr::Comprehension(c) => self.comprehension(c, facts),
            Expr::List(_) | Expr::Map(_) | Expr::Struct(_) | Expr::Unspecified => {
                let mut out = Out::value(Av::Other);
                for child in children(e) {
                    out.errs.extend(self.eval(child, facts).errs);
                }
                out
            }
        }
    }

    fn silent_if_flagged(&self, e: &IdedExpr, out: &mut Out) {
        if self.flagged.contains(&e.id) {
            out.errs.push(SILENT);
        }
    }

    fn call(&mut self, node: &IdedExpr, call: &CallExpr, facts: &[Fact]) -> Out {
        let name = call.func_name.as_str();
        match (name, call.target.as_deref(), call.args.as_slice()) {
            (operators::LOGICAL_AND, None, [a, b]) => self.and_or(a, b, true, facts),
            (operators::LOGICAL_OR, None, [a, b]) => self.and_or(a, b, false, facts),
            (operators::LOGICAL_NOT, None, [a]) => {
                let o = self.eval(a, facts);
                let (t, f) = o.bools();
                Out {
                    t: f,
                    f: t,
                    v: None,
                    errs: o.bool_errors(),
                }
            }
            (operators::NOT_STRICTLY_FALSE, None, [a]) => {
                let o = self.eval(a, facts);
                let (t, f) = o.bools();
                Out {
                    t: t || o.is_bad(),
                    f,
                    v: None,
                    errs: Vec::new(),
                }
            }
            (operators::CONDITIONAL, None, [condition, then, otherwise]) => {
                let tested = self.eval(condition, facts);
                let (ct, cf) = tested.bools();
                let mut out = Out::default();
                if ct {
                    let mut assumed = facts.to_vec();
                    self.assume(condition, true, &mut assumed);
                    out = out.merge(self.eval(then, &assumed));
                }
                if cf {
                    let mut assumed = facts.to_vec();
                    self.assume(condition, false, &mut assumed);
                    out = out.merge(self.eval(otherwise, &assumed));
                }
                out.errs.extend(tested.bool_errors());
                out
            }
            (operators::EQUALS | operators::NOT_EQUALS, None, [a, b]) => {
                let l = self.eval(a, facts);
                let r = self.eval(b, facts);
                let mut out = match equal(&l, &r) {
                    Some(eq) => Out::known(eq),
                    None => Out::unknown(),
                };
                if name == operators::NOT_EQUALS {
                    std::mem::swap(&mut out.t, &mut out.f);
                }
                out.errs = l.errs;
                out.errs.extend(r.errs);
                out
            }
            (operators::IN, None, [item, collection]) => {
                let l = self.eval(item, facts);
                let r = self.eval(collection, facts);
                let listed = match (&l.v, &collection.expr) {
                    (Some(Av::Str(Some(s))), Expr::List(list)) => list
                        .elements
                        .iter()
                        .map(literal_str)
                        .collect::<Option<Vec<&str>>>()
                        .map(|items| items.contains(&s.as_str())),
                    _ => None,
                };
                let mut out = listed.map_or_else(Out::unknown, Out::known);
                out.errs = l.errs;
                out.errs.extend(r.errs);
                out
            }
            ("orValue" | "hasValue", Some(target), args) => {
                let t = self.eval(target, facts);
                let mut out = match (name, &t.v, args.first()) {
                    ("hasValue", Some(Av::Opt(Some(present), _)), _) => Out::known(*present),
                    ("hasValue", _, _) => Out::unknown(),
                    (_, Some(Av::Opt(Some(true), inner)), Some(default)) => {
                        let _ = self.eval(default, facts);
                        Out::value((**inner).clone())
                    }
                    (_, Some(Av::Opt(Some(false), _)), Some(default)) => {
                        let mut d = self.eval(default, facts);
                        d.errs.clear();
                        d
                    }
                    (_, Some(Av::Opt(None, inner)), Some(default)) => {
                        let mut d = self.eval(default, facts);
                        d.errs.clear();
                        d.merge(Out::value((**inner).clone()))
                    }
                    _ => Out::value(Av::Other),
                };
                out.errs.extend(t.errs);
                for arg in args {
                    out.errs.extend(self.eval(arg, facts).errs);
                }
                self.silent_if_flagged(node, &mut out);
                out
            }
            (
                operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT,
                None,
                [operand, key],
            ) => {
                let mut out = if name == operators::INDEX {
                    Out::value(Av::Other)
                } else {
                    Out::value(Av::Opt(None, Box::new(Av::Other)))
                };
                out.errs = self.eval(operand, facts).errs;
                out.errs.extend(self.eval(key, facts).errs);
                self.silent_if_flagged(node, &mut out);
                out
            }
            _ => {
                let mut out = if BOOL_FUNCTIONS.contains(&name)
                    || matches!(
                        name,
                        operators::LESS
                            | operators::LESS_EQUALS
                            | operators::GREATER
                            | operators::GREATER_EQUALS
                    )
                    || call
                        .target
                        .as_deref()
                        .is_some_and(|t| matches!(&t.expr, Expr::Ident(ns) if ns == "sets"))
                {
                    Out::unknown()
                } else {
                    Out::value(Av::Other)
                };
                if let Some(target) = &call.target {
                    out.errs.extend(self.eval(target, facts).errs);
                }
                for arg in &call.args {
                    out.errs.extend(self.eval(arg, facts).errs);
                }
                self.silent_if_flagged(node, &mut out);
                out
            }
        }
    }

    /// `a && b` (`and`) or `a || b`, as CEL evaluates them: the right side
    /// is skipped when the left decides, and a deciding right side absorbs
    /// an error of the left.
    fn and_or(&mut self, a: &IdedExpr, b: &IdedExpr, and: bool, facts: &[Fact]) -> Out {
        let left = self.eval(a, facts);
        let (lt, lf) = left.bools();
        let left_bad = left.is_bad();
        // the value that decides: false for &&, true for ||
        let (l_decides, l_other) = if and { (lf, lt) } else { (lt, lf) };
        if !l_other && !left_bad {
            return Out::known(!and);
        }
        let mut assumed = facts.to_vec();
        self.assume(a, and, &mut assumed);
        let right = self.eval(b, &assumed);
        let (rt, rf) = right.bools();
        let right_bad = right.is_bad();
        let (r_decides, r_other) = if and { (rf, rt) } else { (rt, rf) };
        let mut out = Out::default();
        let (decides, other) = (l_decides || r_decides, l_other && r_other);
        if and {
            out.f = decides;
            out.t = other;
        } else {
            out.t = decides;
            out.f = other;
        }
        if left_bad && (r_other || right_bad) {
            out.errs.extend(left.bool_errors());
        }
        if (l_other || left_bad) && right_bad {
            out.errs.extend(right.bool_errors());
        }
        out
    }

    fn comprehension(&mut self, c: &ComprehensionExpr, facts: &[Fact]) -> Out {
        let range = self.eval(&c.iter_range, facts);
        let init = self.eval(&c.accu_init, facts);
        let base = self.scope.len();
        if is_bind(c) {
            let bound = Out {
                errs: Vec::new(),
                ..init.clone()
            };
            self.scope.push((c.accu_var.clone(), bound));
            let mut out = self.eval(&c.result, facts);
            self.scope.truncate(base);
            out.errs.extend(init.errs);
            out.errs.extend(range.errs);
            return out;
        }
        self.scope.push((c.iter_var.clone(), Out::value(Av::Other)));
        if let Some(second) = &c.iter_var2 {
            self.scope.push((second.clone(), Out::value(Av::Other)));
        }
        self.scope.push((c.accu_var.clone(), Out::value(Av::Other)));
        let mut out = Out::value(Av::Other);
        out.t = true;
        out.f = true;
        out.errs = range.errs;
        out.errs.extend(init.errs);
        for part in [&c.loop_cond, &c.loop_step, &c.result] {
            out.errs.extend(self.eval(part, facts).errs);
        }
        self.scope.truncate(base);
        out
    }

    /// Adds what `e` being `truth` implies about presence.
    fn assume(&self, e: &IdedExpr, truth: bool, out: &mut Vec<Fact>) {
        if let Some(Ref::Read(read)) = self.refs.get(&e.id)
            && read.access == Access::Presence
            && truth
        {
            out.push(read.fact());
        }
        if let Expr::Call(c) = &e.expr {
            match (c.func_name.as_str(), c.args.as_slice()) {
                (operators::LOGICAL_AND, [a, b]) if truth => {
                    self.assume(a, true, out);
                    self.assume(b, true, out);
                }
                (operators::LOGICAL_OR, [a, b]) if !truth => {
                    self.assume(a, false, out);
                    self.assume(b, false, out);
                }
                (operators::LOGICAL_NOT, [a]) => self.assume(a, !truth, out),
                _ => {}
            }
        }
    }

    fn eval_ref(&mut self, e: &IdedExpr, r: &Ref, facts: &[Fact]) -> Out {
        let read = match r {
            Ref::Driver => {
                return Out::value(match self.kind {
                    Kind::Ours(_) => Av::Str(Some(self.driver.to_owned())),
                    Kind::Other => Av::NotStr(self.driver.to_owned()),
                });
            }
            Ref::Read(read) => read,
        };
        if read.flagged {
            return match read.access {
                Access::Value => Out {
                    v: Some(Av::Other),
                    errs: vec![SILENT],
                    ..Out::default()
                },
                Access::Optional => Out::value(Av::Opt(None, Box::new(Av::Other))),
                Access::Presence => Out::unknown(),
            };
        }
        let present = self.present(read, facts);
        let value = self.value_of(read);
        match read.access {
            Access::Presence => match present {
                Present::Yes => Out::known(true),
                Present::No => Out::known(false),
                Present::Conditional | Present::Unknown => Out::unknown(),
            },
            Access::Optional => {
                let has = match present {
                    Present::Yes => Some(true),
                    Present::No => Some(false),
                    Present::Conditional | Present::Unknown => None,
                };
                let inner = value.v.clone().unwrap_or(Av::Other);
                Out::value(Av::Opt(has, Box::new(inner)))
            }
            Access::Value => match present {
                // another driver's device may lack it
                Present::Unknown if self.kind == Kind::Other => {
                    let mut out = value;
                    out.errs.push(self.cause(e, read, CauseKind::OtherDriver));
                    out
                }
                Present::Yes | Present::Unknown => value,
                Present::No => {
                    let kind = match (self.kind, &read.domain) {
                        (Kind::Other, _) => CauseKind::OtherDriver,
                        (Kind::Ours(_), Dom::Foreign(_)) => CauseKind::ForeignDomain,
                        (Kind::Ours(_), _) => CauseKind::Missing,
                    };
                    Out {
                        errs: vec![self.cause(e, read, kind)],
                        ..Out::default()
                    }
                }
                Present::Conditional => {
                    let mut out = value;
                    out.errs.push(self.cause(e, read, CauseKind::Conditional));
                    out
                }
            },
        }
    }

    fn present(&self, read: &Read, facts: &[Fact]) -> Present {
        if facts.contains(&read.fact()) {
            return Present::Yes;
        }
        match (self.kind, &read.domain) {
            (Kind::Other, Dom::Ours | Dom::OursMisspelt) | (Kind::Ours(_), Dom::Foreign(_)) => {
                Present::No
            }
            (Kind::Other, _) | (Kind::Ours(_), Dom::Unknown) => Present::Unknown,
            (Kind::Ours(kind), _) => match read.entry {
                Some(entry) if entry.carried_by(kind) => match entry.presence {
                    Presence::Always => Present::Yes,
                    Presence::When(_) => Present::Conditional,
                },
                _ => Present::No,
            },
        }
    }

    /// The value of a present entry on this kind.
    fn value_of(&self, read: &Read) -> Out {
        let Some(entry) = read.entry else {
            return Out::value(Av::Other);
        };
        match (self.kind, entry.value_type) {
            (Kind::Ours(kind), _) if entry.name == gpu_dra_api::schema::names::TYPE => {
                Out::value(Av::Str(Some(kind.type_value().to_owned())))
            }
            (_, ValueType::String) => Out::value(Av::Str(None)),
            (_, ValueType::Bool) => Out::unknown(),
            _ => Out::value(Av::Other),
        }
    }

    /// The index of the cause of a failing read (one per node and kind of
    /// cause).
    fn cause(&mut self, e: &IdedExpr, read: &Read, kind: CauseKind) -> usize {
        if let Some(i) = self
            .causes
            .iter()
            .position(|c| c.id == e.id && c.kind == kind)
        {
            return i;
        }
        let shift = match &e.expr {
            Expr::Select(s) if !s.test => 1,
            _ => 0,
        };
        self.causes.push(Cause {
            id: e.id,
            kind,
            offset: self.selector.offset(e.id).map(|o| o + shift),
            read: Some(read.clone()),
            kinds: DeviceSet::NONE,
        });
        self.causes.len() - 1
    }
}

/// The elements of a list or the keys and values of a map.
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::List(_) | Expr::Map(_) => crate::cel::children(e),
        _ => Vec::new(),
    }
}

/// Whether two values are equal, when it can be told.
fn equal(l: &Out, r: &Out) -> Option<bool> {
    if let (Some(a), Some(b)) = (l.known_bool(), r.known_bool()) {
        return Some(a == b);
    }
    if l.t || l.f || r.t || r.f {
        return None;
    }
    match (l.v.as_ref()?, r.v.as_ref()?) {
        (Av::Str(Some(a)), Av::Str(Some(b))) => Some(a == b),
        (Av::Str(Some(a)), Av::NotStr(b)) | (Av::NotStr(b), Av::Str(Some(a))) if a == b => {
            Some(false)
        }
        _ => None,
    }
}
