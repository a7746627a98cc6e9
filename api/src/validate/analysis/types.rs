//! The type pass: resolves every read of the device against the schema
//! (unknown names with did-you-mean, attributes read as capacities,
//! lookups not keyed by domain, misspelt domains), infers types, and
//! reports operations whose operand types cannot work: comparisons of a
//! version or quantity with a literal, string functions on non-strings,
//! non-bool results. Literal arguments of `semver()`, `quantity()` and
//! regular expressions are checked by evaluating them with the real
//! engine.

use std::fmt::Write as _;

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::common::ast::{SelectExpr, operators};

use super::refs::{
    Access, Dom, Read, Ref, all_entries, domain_entries, field, lookup, read_node,
    read_text,
};
use super::{Analysis, Hint};
use crate::cel::{CelDevice, EvalError};
use crate::quantity::Quantity;
use crate::schema::{self, Entry, STANDARD_DOMAIN, Section, ValueType, device_types};
use crate::validate::suggest::closest;
use crate::validate::unparse::{call, int, node, quote, string, unparse};
use crate::validate::{Check, Severity};

/// Literal arguments checked by evaluation per selector, at most.
const MAX_LITERAL_CHECKS: usize = 16;

/// The fields of `device`.
const DEVICE_FIELDS: [&str; 4] = ["driver", "attributes", "capacity", "allowMultipleAllocations"];

/// The type of an expression, as far as it can be told.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Ty {
    /// Unknown.
    Dyn,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    Type,
    /// Kubernetes' `Semver`.
    Version,
    /// Kubernetes' `Quantity`.
    Quantity,
    /// An optional (from `.?x`, `[?k]`, `optional.of`).
    Optional(Box<Ty>),
    /// The variable `device`.
    Device,
    /// `device.attributes` or `device.capacity`.
    Domains(Section),
    /// `device.attributes['<domain>']`: the domain and its name.
    Domain(Section, Dom, String),
}

/// What kinds of values compare and combine with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cat {
    Num,
    Str,
    Bytes,
    Bool,
    Null,
    List,
    Map,
    Type,
    Version,
    Quantity,
    Optional,
}

impl Ty {
    fn of(value_type: ValueType) -> Ty {
        match value_type {
            ValueType::Int => Ty::Int,
            ValueType::Bool => Ty::Bool,
            ValueType::String => Ty::String,
            ValueType::Version => Ty::Version,
            ValueType::Quantity => Ty::Quantity,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Ty::Dyn => "a value",
            Ty::Bool => "a bool",
            Ty::Int => "an int",
            Ty::Uint => "a uint",
            Ty::Double => "a double",
            Ty::String => "a string",
            Ty::Bytes => "bytes",
            Ty::Null => "null",
            Ty::List => "a list",
            Ty::Map => "a map",
            Ty::Type => "a type",
            Ty::Version => "a version",
            Ty::Quantity => "a quantity",
            Ty::Optional(_) => "an optional",
            Ty::Device => "the device",
            Ty::Domains(_) => "a map of domains",
            Ty::Domain(..) => "a map of one domain's entries",
        }
    }

    fn cat(&self) -> Option<Cat> {
        Some(match self {
            Ty::Dyn => return None,
            Ty::Bool => Cat::Bool,
            Ty::Int | Ty::Uint | Ty::Double => Cat::Num,
            Ty::String => Cat::Str,
            Ty::Bytes => Cat::Bytes,
            Ty::Null => Cat::Null,
            Ty::List => Cat::List,
            Ty::Map | Ty::Device | Ty::Domains(_) | Ty::Domain(..) => Cat::Map,
            Ty::Type => Cat::Type,
            Ty::Version => Cat::Version,
            Ty::Quantity => Cat::Quantity,
            Ty::Optional(_) => Cat::Optional,
        })
    }
}

fn literal_ty(literal: &LiteralValue) -> Ty {
    match literal {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::Null => Ty::Null,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) => Ty::Uint,
    }
}

/// The text of a string literal node.
pub(super) fn literal_str(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// Whether a comprehension is the expansion of `cel.bind`.
pub(super) fn is_bind(c: &ComprehensionExpr) -> bool {
    c.iter_var == "#unused" && matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty())
}

fn symbol(op: &str) -> &str {
    match op {
        operators::EQUALS => "==",
        operators::NOT_EQUALS => "!=",
        operators::LESS => "<",
        operators::LESS_EQUALS => "<=",
        operators::GREATER => ">",
        operators::GREATER_EQUALS => ">=",
        operators::ADD => "+",
        operators::SUBSTRACT => "-",
        operators::MULTIPLY => "*",
        operators::DIVIDE => "/",
        operators::MODULO => "%",
        operators::LOGICAL_AND => "&&",
        operators::LOGICAL_OR => "||",
        operators::LOGICAL_NOT => "!",
        operators::CONDITIONAL => "?:",
        other => other,
    }
}

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

/// A version string as `semver()` accepts it without normalisation: a
/// leading `v` dropped, missing parts zero, leading zeros removed.
fn normalize_version(text: &str) -> Option<String> {
    if semver::Version::parse(text).is_ok() {
        return Some(text.to_owned());
    }
    let core = text.strip_prefix('v').unwrap_or(text);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || p.len() > 18 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut numbers: Vec<u64> = parts.iter().filter_map(|p| p.parse().ok()).collect();
    numbers.resize(3, 0);
    Some(format!("{}.{}.{}", numbers[0], numbers[1], numbers[2]))
}

impl Analysis<'_> {
    /// Runs the type pass from the root.
    pub(super) fn type_pass(&mut self, root: &IdedExpr) {
        let t = self.ty(root);
        if t.cat().is_some_and(|c| c != Cat::Bool) && !self.flagged.contains(&root.id) {
            let hint = match t {
                Ty::Optional(_) => Some(format!("{}.orValue(false)", self.text(root))),
                _ => None,
            };
            self.error(
                Check::NotBool,
                root,
                format!(
                    "a selector must evaluate to a bool, but this one evaluates to {}",
                    t.describe()
                ),
                hint,
            );
        }
    }

    fn local(&self, name: &str) -> Option<&Ty> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    fn ty(&mut self, e: &IdedExpr) -> Ty {
        match &e.expr {
            Expr::Ident(name) => match self.local(name) {
                Some(t) => t.clone(),
                None if name == "device" => Ty::Device,
                None => Ty::Dyn,
            },
            Expr::Literal(literal) => literal_ty(literal),
            Expr::List(list) => {
                for element in &list.elements {
                    self.ty(element);
                }
                Ty::List
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) => {
                            self.ty(&m.key);
                            self.ty(&m.value);
                        }
                        EntryExpr::StructField(f) => {
                            self.ty(&f.value);
                        }
                    }
                }
                Ty::Map
            }
            Expr::Struct(_) | Expr::Unspecified => Ty::Dyn,
            Expr::Select(select) => self.select(e, select),
            Expr::Call(c) => self.call(e, c),
            Expr::Comprehension(c) => self.comprehension(c),
        }
    }

    fn select(&mut self, e: &IdedExpr, select: &SelectExpr) -> Ty {
        let operand = self.ty(&select.operand);
        if select.test {
            if let Ty::Domain(section, dom, domain) = operand {
                self.read(e, section, dom, &domain, &select.field, Access::Presence);
            }
            return Ty::Bool;
        }
        self.member(e, &select.operand, operand, &select.field, Access::Value, None)
    }

    /// `operand.name`, `operand['name']`, or their optional forms.
    fn member(
        &mut self,
        e: &IdedExpr,
        operand: &IdedExpr,
        operand_ty: Ty,
        name: &str,
        access: Access,
        key: Option<&IdedExpr>,
    ) -> Ty {
        let wrap = |t: Ty| {
            if access == Access::Optional {
                Ty::Optional(Box::new(t))
            } else {
                t
            }
        };
        match operand_ty {
            Ty::Device => wrap(match name {
                "driver" => {
                    self.refs.insert(e.id, Ref::Driver);
                    Ty::String
                }
                "attributes" => Ty::Domains(Section::Attribute),
                "capacity" => Ty::Domains(Section::Capacity),
                "allowMultipleAllocations" => Ty::Bool,
                _ => {
                    self.unknown_device_field(e, name);
                    Ty::Dyn
                }
            }),
            Ty::Domains(section) => wrap(self.domain(e, key, section, name)),
            Ty::Domain(section, dom, domain) => self.read(e, section, dom, &domain, name, access),
            Ty::Optional(_) => Ty::Optional(Box::new(Ty::Dyn)),
            Ty::Dyn | Ty::Map => wrap(Ty::Dyn),
            other => {
                if !self.flagged.contains(&operand.id) {
                    let text = self.text(operand);
                    self.error(
                        Check::TypeMismatch,
                        e,
                        format!("`{text}` is {}: it has no field `{name}`", other.describe()),
                        None,
                    );
                }
                Ty::Dyn
            }
        }
    }

    fn unknown_device_field(&mut self, e: &IdedExpr, name: &str) {
        match closest(name, DEVICE_FIELDS) {
            Some(best) => {
                let fix = node(Expr::Select(SelectExpr {
                    operand: Box::new(node(Expr::Ident("device".to_owned()))),
                    field: best.to_owned(),
                    test: false,
                }));
                self.error_with_fix(
                    Check::UnknownField,
                    e,
                    format!("`device` has no field `{name}`; did you mean `{best}`?"),
                    fix,
                );
            }
            None => self.error(
                Check::UnknownField,
                e,
                format!(
                    "`device` has no field `{name}`: its fields are driver, attributes, capacity and allowMultipleAllocations"
                ),
                None,
            ),
        }
    }

    /// `device.attributes[key]`: which domain.
    fn domain(&mut self, e: &IdedExpr, key: Option<&IdedExpr>, section: Section, name: &str) -> Ty {
        let driver = self.driver;
        if name == driver {
            self.mentions_driver = true;
            return Ty::Domain(section, Dom::Ours, driver.to_owned());
        }
        if name == STANDARD_DOMAIN {
            return Ty::Domain(section, Dom::Standard, name.to_owned());
        }
        if (name.contains('/') || !name.contains('.'))
            && let Some(t) = self.domain_key(e, section, name)
        {
            return t;
        }
        let near = closest(name, [driver]).is_some()
            || (driver.len() > name.len()
                && driver.ends_with(name)
                && driver[..driver.len() - name.len()].ends_with('.'));
        if near {
            self.mentions_driver = true;
            let message = format!(
                "no device has the domain `{name}`: the attributes and capacities of this driver's devices are in `{driver}`; did you mean `{driver}`?"
            );
            match key {
                Some(key) => self.error_with_fix(Check::UnknownDomain, key, message, string(driver)),
                None => self.error(Check::UnknownDomain, e, message, None),
            }
            return Ty::Domain(section, Dom::OursMisspelt, driver.to_owned());
        }
        Ty::Domain(section, Dom::Foreign(name.to_owned()), name.to_owned())
    }

    /// `device.attributes['memory']` or `device.attributes['gpu.nvidia.com/memory']`:
    /// a name where the domain belongs. Returns the type of what was meant,
    /// or `None` when the key may be a domain after all.
    fn domain_key(&mut self, e: &IdedExpr, section: Section, key: &str) -> Option<Ty> {
        let (domain, name) = match key.split_once('/') {
            Some((d, n)) => (Some(d), n),
            None => (None, key),
        };
        let entries = all_entries(self.driver);
        let matching = |e: &&(&'static Entry, String, &'static str)| {
            e.2 == name && domain.is_none_or(|d| d == e.1)
        };
        let exact = entries
            .iter()
            .filter(matching)
            .min_by_key(|(entry, _, _)| entry.section != section);
        let written = format!("device.{}[{}]", field(section), quote(key));
        let keyed = format!(
            "`{written}` looks up the domain `{key}`, which no device has: attributes and capacities are keyed by domain first, so this is an empty map and the selector fails at scheduling time"
        );
        if let Some((entry, d, id)) = exact {
            if d == self.driver {
                self.mentions_driver = true;
            }
            let message = format!(
                "{keyed}. `{id}` is {} of {d}: `{}`",
                article_section(entry.section),
                read_text(entry.section, d, id)
            );
            self.error_with_fix(
                Check::DomainKey,
                e,
                message,
                read_node(entry.section, d, id, Access::Value),
            );
            self.corrected_read(e, entry, d, id);
            return Some(Ty::of(entry.value_type));
        }
        if let Some((d, n)) = domain.map(|d| (d, name)) {
            // a qualified name of some other domain
            let message = format!(
                "{keyed}; write the domain and the name separately: `{}`",
                read_text(section, d, n)
            );
            self.error_with_fix(
                Check::DomainKey,
                e,
                message,
                read_node(section, d, n, Access::Value),
            );
            return Some(Ty::Dyn);
        }
        let best = closest(name, entries.iter().map(|(_, _, id)| *id))?;
        let (entry, d, id) = entries.iter().find(|(_, _, id)| *id == best)?;
        if d == self.driver {
            self.mentions_driver = true;
        }
        let message = format!(
            "{keyed}; did you mean {} `{}`?",
            article_section(entry.section),
            read_text(entry.section, d, id)
        );
        self.error_with_fix(
            Check::DomainKey,
            e,
            message,
            read_node(entry.section, d, id, Access::Value),
        );
        self.corrected_read(e, entry, d, id);
        Some(Ty::of(entry.value_type))
    }

    /// Records that node `e` was reported and stands for `entry`.
    fn corrected_read(&mut self, e: &IdedExpr, entry: &'static Entry, domain: &str, id: &str) {
        self.refs.insert(
            e.id,
            Ref::Read(Read {
                section: entry.section,
                domain: Dom::Ours,
                domain_name: domain.to_owned(),
                name: id.to_owned(),
                entry: Some(entry),
                access: Access::Value,
                flagged: true,
            }),
        );
    }

    /// A read of `name` in a domain map.
    fn read(
        &mut self,
        e: &IdedExpr,
        section: Section,
        dom: Dom,
        domain: &str,
        name: &str,
        access: Access,
    ) -> Ty {
        let wrap = |t: Ty| match access {
            Access::Value => t,
            Access::Optional => Ty::Optional(Box::new(t)),
            Access::Presence => Ty::Bool,
        };
        let mut read = Read {
            section,
            domain: dom.clone(),
            domain_name: domain.to_owned(),
            name: name.to_owned(),
            entry: None,
            access,
            flagged: false,
        };
        let t = match dom {
            Dom::Unknown => return wrap(Ty::Dyn),
            Dom::Foreign(_) => Ty::Dyn,
            Dom::Ours | Dom::OursMisspelt | Dom::Standard => {
                if dom != Dom::Standard {
                    self.mentions_driver = true;
                }
                read.flagged = dom == Dom::OursMisspelt;
                if let Some(entry) = lookup(self.driver, domain, section, name) {
                    read.entry = Some(entry);
                    Ty::of(entry.value_type)
                } else {
                    read.flagged = true;
                    let (t, entry) = self.unknown_name(e, section, domain, name, access);
                    read.entry = entry;
                    t
                }
            }
        };
        self.refs.insert(e.id, Ref::Read(read));
        wrap(t)
    }

    /// Reports a name the domain does not have; returns the type of the
    /// entry it was probably meant to be.
    fn unknown_name(
        &mut self,
        e: &IdedExpr,
        section: Section,
        domain: &str,
        name: &str,
        access: Access,
    ) -> (Ty, Option<&'static Entry>) {
        let here = format!("{} of {domain}", article_section(section));
        let entries = all_entries(self.driver);
        let elsewhere = entries
            .iter()
            .find(|(entry, d, id)| *id == name && !(entry.section == section && d == domain));
        if let Some((entry, d, id)) = elsewhere {
            let message = format!(
                "`{name}` is not {here}: it is {} of {d}: `{}`",
                article_section(entry.section),
                read_text(entry.section, d, id)
            );
            self.error_with_fix(
                Check::UnknownAttribute,
                e,
                message,
                read_node(entry.section, d, id, access),
            );
            return (Ty::of(entry.value_type), Some(entry));
        }
        if let Some(best) = closest(name, entries.iter().map(|(_, _, id)| *id))
            && let Some((entry, d, id)) = entries
                .iter()
                .filter(|(_, _, id)| *id == best)
                .min_by_key(|(entry, d, _)| {
                    u8::from(entry.section != section) + u8::from(d != domain)
                })
        {
            let message = if entry.section == section && d == domain {
                format!("`{name}` is not {here}; did you mean `{id}`?")
            } else {
                format!(
                    "`{name}` is not {here}; did you mean `{id}`? (it is {} of {d}: `{}`)",
                    article_section(entry.section),
                    read_text(entry.section, d, id)
                )
            };
            self.error_with_fix(
                Check::UnknownAttribute,
                e,
                message,
                read_node(entry.section, d, id, access),
            );
            return (Ty::of(entry.value_type), Some(entry));
        }
        let known: Vec<&str> = domain_entries(self.driver, domain)
            .filter(|(entry, _)| entry.section == section)
            .map(|(_, id)| id)
            .collect();
        let message = if known.is_empty() {
            format!("`{name}` is not {here}: devices of this driver have no {section_name} in {domain}", section_name = field(section))
        } else {
            format!(
                "`{name}` is not {here}: devices of this driver have the {} {} there",
                field(section),
                known.join(", ")
            )
        };
        self.error(Check::UnknownAttribute, e, message, None);
        (Ty::Dyn, None)
    }

    fn call(&mut self, e: &IdedExpr, c: &CallExpr) -> Ty {
        let name = c.func_name.as_str();
        match (name, c.target.as_deref(), c.args.as_slice()) {
            (operators::INDEX | operators::OPT_INDEX, None, [operand, key]) => {
                let access = if name == operators::INDEX {
                    Access::Value
                } else {
                    Access::Optional
                };
                self.index(e, operand, key, access)
            }
            (operators::OPT_SELECT, None, [operand, field]) => {
                let t = self.ty(operand);
                match literal_str(field) {
                    Some(f) => self.member(e, operand, t, f, Access::Optional, None),
                    None => Ty::Optional(Box::new(Ty::Dyn)),
                }
            }
            (operators::LOGICAL_AND | operators::LOGICAL_OR, None, [a, b]) => {
                self.bool_operand(a, name);
                self.bool_operand(b, name);
                Ty::Bool
            }
            (operators::LOGICAL_NOT, None, [a]) => {
                self.bool_operand(a, name);
                Ty::Bool
            }
            (operators::NOT_STRICTLY_FALSE, None, [a]) => {
                self.ty(a);
                Ty::Bool
            }
            (operators::CONDITIONAL, None, [condition, a, b]) => {
                self.bool_operand(condition, name);
                let ta = self.ty(a);
                let tb = self.ty(b);
                if ta == tb { ta } else { Ty::Dyn }
            }
            (
                operators::EQUALS
                | operators::NOT_EQUALS
                | operators::LESS
                | operators::LESS_EQUALS
                | operators::GREATER
                | operators::GREATER_EQUALS,
                None,
                [a, b],
            ) => {
                let ta = self.ty(a);
                let tb = self.ty(b);
                self.compare(e, name, a, b, &ta, &tb);
                Ty::Bool
            }
            (operators::IN, None, [a, b]) => {
                self.ty(a);
                let tb = self.ty(b);
                if let (Ty::Domain(section, dom, domain), Some(key)) = (tb, literal_str(a)) {
                    self.read(e, section, dom, &domain, key, Access::Presence);
                }
                Ty::Bool
            }
            (
                operators::ADD
                | operators::SUBSTRACT
                | operators::MULTIPLY
                | operators::DIVIDE
                | operators::MODULO,
                None,
                [a, b],
            ) => self.arithmetic(e, name, a, b),
            (operators::NEGATE, None, [a]) => {
                let t = self.ty(a);
                if matches!(t, Ty::Version | Ty::Quantity) {
                    let text = self.text(a);
                    self.error(
                        Check::TypeMismatch,
                        e,
                        format!("`{text}` is {}: it cannot be negated", t.describe()),
                        None,
                    );
                    return Ty::Dyn;
                }
                t
            }
            _ => self.function(e, c),
        }
    }

    fn index(&mut self, e: &IdedExpr, operand: &IdedExpr, key: &IdedExpr, access: Access) -> Ty {
        let t = self.ty(operand);
        let literal = literal_str(key);
        if literal.is_none() {
            self.ty(key);
        }
        let wrap = |t: Ty| {
            if access == Access::Optional {
                Ty::Optional(Box::new(t))
            } else {
                t
            }
        };
        match (t, literal) {
            (t @ (Ty::Device | Ty::Domains(_) | Ty::Domain(..)), Some(k)) => {
                self.member(e, operand, t, k, access, Some(key))
            }
            (Ty::Domains(section), None) => {
                wrap(Ty::Domain(section, Dom::Unknown, String::new()))
            }
            (Ty::Optional(_), _) => Ty::Optional(Box::new(Ty::Dyn)),
            (Ty::Device | Ty::Domain(..) | Ty::List | Ty::Map | Ty::Dyn, _) => wrap(Ty::Dyn),
            (other, _) => {
                if !self.flagged.contains(&operand.id) {
                    let text = self.text(operand);
                    self.error(
                        Check::TypeMismatch,
                        e,
                        format!("`{text}` is {}: it cannot be indexed", other.describe()),
                        None,
                    );
                }
                Ty::Dyn
            }
        }
    }

    /// An operand of `&&`, `||`, `!` or a condition.
    fn bool_operand(&mut self, a: &IdedExpr, op: &str) {
        let t = self.ty(a);
        if t.cat().is_some_and(|c| c != Cat::Bool) && !self.flagged.contains(&a.id) {
            let text = self.text(a);
            let hint = match t {
                Ty::Optional(_) => Some(format!("{text}.orValue(false)")),
                _ => None,
            };
            self.error(
                Check::TypeMismatch,
                a,
                format!(
                    "`{}` needs bool operands, but `{text}` is {}",
                    symbol(op),
                    t.describe()
                ),
                hint,
            );
        }
    }

    /// The schema entry read by `e`, if it is a read.
    fn entry_of(&self, e: &IdedExpr) -> Option<&'static Entry> {
        match self.refs.get(&e.id) {
            Some(Ref::Read(read)) if read.access == Access::Value => read.entry,
            _ => None,
        }
    }

    fn compare(&mut self, e: &IdedExpr, op: &str, a: &IdedExpr, b: &IdedExpr, ta: &Ty, tb: &Ty) {
        self.note_type_value(e, op, a, b);
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
    fn unwrap_optional(opt: &IdedExpr) -> Option<(IdedExpr, IdedExpr)> {
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
    fn convert(
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
                return Some(call(None, "quantity", vec![string(&format!("{text}{suffix}"))]));
            }
        }
        Quantity::parse(&text)
            .ok()
            .map(|_| call(None, "quantity", vec![string(&text)]))
    }

    /// `type == 'vfio'`: a value this driver never publishes.
    fn note_type_value(&mut self, e: &IdedExpr, op: &str, a: &IdedExpr, b: &IdedExpr) {
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
            {
                let mut message = format!(
                    "`type` is '{}' or '{}' on the devices of {}, never '{value}'",
                    device_types::GPU,
                    device_types::MIG,
                    self.driver
                );
                if value == "vfio" {
                    message.push_str(" (vfio passthrough devices are not supported by this driver)");
                }
                self.impossible_types.push((e.id, message));
            }
        }
    }

    fn arithmetic(&mut self, e: &IdedExpr, op: &str, a: &IdedExpr, b: &IdedExpr) -> Ty {
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

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Ty {
        self.ty(&c.iter_range);
        let init = self.ty(&c.accu_init);
        let bind = is_bind(c);
        let base = self.scope.len();
        self.scope.push((c.iter_var.clone(), Ty::Dyn));
        if let Some(second) = &c.iter_var2 {
            self.scope.push((second.clone(), Ty::Dyn));
        }
        self.scope
            .push((c.accu_var.clone(), if bind { init } else { Ty::Dyn }));
        self.ty(&c.loop_cond);
        self.ty(&c.loop_step);
        let result = self.ty(&c.result);
        self.scope.truncate(base);
        match result {
            Ty::Bool => Ty::Bool,
            t if bind => t,
            _ => Ty::Dyn,
        }
    }

    /// Checks the receiver of a method; reports and returns false when its
    /// type cannot work.
    fn receiver(
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
    fn argument(&mut self, e: &IdedExpr, method: &str, arg: &IdedExpr, t: &Ty, want: &[Cat], want_text: &str) {
        if t.cat().is_none_or(|c| want.contains(&c)) || self.flagged.contains(&arg.id) {
            return;
        }
        let text = self.text(arg);
        self.error(
            Check::TypeMismatch,
            e,
            format!("`{method}()` takes {want_text}, but `{text}` is {}", t.describe()),
            None,
        );
    }

    fn function(&mut self, e: &IdedExpr, c: &CallExpr) -> Ty {
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
                "contains" | "startsWith" | "endsWith" | "matches" | "find" | "findAll"
                | "charAt" | "indexOf" | "lastIndexOf" | "lowerAscii" | "upperAscii"
                | "replace" | "split" | "substring" | "trim" | "format",
                Some((target, t)),
            ) => {
                self.receiver(e, target, &t, name, STR, "a string");
                if matches!(
                    name,
                    "contains" | "startsWith" | "endsWith" | "matches" | "find" | "findAll"
                        | "indexOf" | "lastIndexOf"
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
            ("sign" | "isInteger" | "asInteger" | "asApproximateFloat" | "add" | "sub", Some((target, t))) => {
                self.receiver(e, target, &t, name, &[Cat::Quantity], "a quantity");
                if matches!(name, "add" | "sub")
                    && let (Some(arg), Some(t)) = (c.args.first(), args.first())
                {
                    self.argument(e, name, arg, t, &[Cat::Quantity, Cat::Num], "a quantity or an int");
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
                if name == "compareTo" { Ty::Int } else { Ty::Bool }
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
    fn constructor(&mut self, e: &IdedExpr, c: &CallExpr, args: &[Ty]) {
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
        let literal_args = c
            .args
            .iter()
            .all(|a| matches!(a.expr, Expr::Literal(_)));
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

    fn check_regex(&mut self, e: &IdedExpr, pattern: &str) {
        if let Some(failure) = self.evaluate_literal(&format!("''.matches({})", quote(pattern))) {
            self.error(
                Check::InvalidLiteral,
                e,
                format!("the regular expression {} fails on every device: {failure}", quote(pattern)),
                None,
            );
        }
    }

    /// Evaluates a device-independent probe with the real engine; the
    /// runtime error it fails with, if any.
    fn evaluate_literal(&mut self, probe: &str) -> Option<String> {
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

/// `an attribute` or `a capacity`.
fn article_section(section: Section) -> &'static str {
    match section {
        Section::Attribute => "an attribute",
        Section::Capacity => "a capacity",
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
