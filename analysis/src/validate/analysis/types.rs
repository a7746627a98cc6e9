//! The type pass: resolves every read of the device against the schema
//! (unknown names with did-you-mean, attributes read as capacities,
//! lookups not keyed by domain, misspelt domains) and infers the type of
//! every node; operators and functions whose operand types cannot work are
//! checked in [`super::operators`] and [`super::functions`]. A selector
//! whose result is not a bool is reported here.

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::common::ast::{SelectExpr, operators};

use super::Analysis;
use super::refs::{
    Access, Dom, Read, Ref, all_entries, domain_entries, field, lookup, read_node, read_text,
};
use crate::validate::Check;
use crate::validate::suggest::closest;
use crate::validate::unparse::{node, quote, string};
use gpu_dra_api::schema::{Entry, STANDARD_DOMAIN, Section, ValueType};

/// The fields of `device`.
const DEVICE_FIELDS: [&str; 4] = [
    "driver",
    "attributes",
    "capacity",
    "allowMultipleAllocations",
];

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
pub(super) enum Cat {
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
    pub(super) fn of(value_type: ValueType) -> Ty {
        match value_type {
            ValueType::Int => Ty::Int,
            ValueType::Bool => Ty::Bool,
            ValueType::String => Ty::String,
            ValueType::Version => Ty::Version,
            ValueType::Quantity => Ty::Quantity,
        }
    }

    pub(super) fn describe(&self) -> &'static str {
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

    pub(super) fn cat(&self) -> Option<Cat> {
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

/// The operator as written.
pub(super) fn symbol(op: &str) -> &str {
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

/// A version string as `semver()` accepts it without normalisation: a
/// leading `v` dropped, missing parts zero, leading zeros removed.
pub(super) fn normalize_version(text: &str) -> Option<String> {
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

    pub(super) fn local(&self, name: &str) -> Option<&Ty> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    pub(super) fn ty(&mut self, e: &IdedExpr) -> Ty {
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
        self.member(
            e,
            &select.operand,
            operand,
            &select.field,
            Access::Value,
            None,
        )
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
                Some(key) => {
                    self.error_with_fix(Check::UnknownDomain, key, message, string(driver));
                }
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
            "`{written}` looks up the domain `{key}`, which no device has: attributes and capacities are keyed by domain first, so this reads an empty map (an error at scheduling time, or never true)"
        );
        if let Some((entry, d, id)) = exact {
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
            format!(
                "`{name}` is not {here}: devices of this driver have no {section_name} in {domain}",
                section_name = field(section)
            )
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
            (Ty::Domains(section), None) => wrap(Ty::Domain(section, Dom::Unknown, String::new())),
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
    pub(super) fn bool_operand(&mut self, a: &IdedExpr, op: &str) {
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
    pub(super) fn entry_of(&self, e: &IdedExpr) -> Option<&'static Entry> {
        match self.refs.get(&e.id) {
            Some(Ref::Read(read)) if read.access == Access::Value => read.entry,
            _ => None,
        }
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
}

/// `an attribute` or `a capacity`.
pub(super) fn article_section(section: Section) -> &'static str {
    match section {
        Section::Attribute => "an attribute",
        Section::Capacity => "a capacity",
    }
}
