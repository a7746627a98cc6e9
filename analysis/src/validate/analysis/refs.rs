//! What a selector reads of the device, resolved against the schema: the
//! references the type pass finds and the per-kind pass evaluates.

use cel::common::ast::{Expr, IdedExpr, SelectExpr, operators};

use super::super::unparse::{self, call, node, quote};
use gpu_dra_api::schema::{self, Entry, STANDARD_DOMAIN, Section};

/// The domain of a `device.attributes[...]` / `device.capacity[...]` map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Dom {
    /// This driver's domain.
    Ours,
    /// A misspelling of this driver's domain (already reported): names are
    /// checked as if it were ours.
    OursMisspelt,
    /// `resource.kubernetes.io`.
    Standard,
    /// Any other domain.
    Foreign(String),
    /// Not a literal.
    Unknown,
}

/// How a read is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// `.x` or `[x]`: fails when absent.
    Value,
    /// `.?x` or `[?x]`: an optional.
    Optional,
    /// `has(….x)` or `'x' in …`: a bool.
    Presence,
}

/// A resolved read of the device.
#[derive(Debug, Clone)]
pub(super) enum Ref {
    /// `device.driver`.
    Driver,
    /// An attribute or capacity.
    Read(Read),
}

/// An attribute or capacity read.
#[derive(Debug, Clone)]
pub(super) struct Read {
    pub section: Section,
    pub domain: Dom,
    /// The domain's name as written (the driver's for [`Dom::Ours`]).
    pub domain_name: String,
    pub name: String,
    /// The schema entry, for this driver's and the standard domain.
    pub entry: Option<&'static Entry>,
    pub access: Access,
    /// Already reported by the type pass: the per-kind pass stays quiet.
    pub flagged: bool,
}

impl Read {
    /// The key of a presence fact about this read.
    pub fn fact(&self) -> Fact {
        (self.section, self.domain_name.clone(), self.name.clone())
    }
}

/// "This attribute is present", learnt from a `has()` guard.
pub(super) type Fact = (Section, String, String);

/// `attributes` or `capacity`.
pub(super) fn field(section: Section) -> &'static str {
    match section {
        Section::Attribute => "attributes",
        Section::Capacity => "capacity",
    }
}

/// `device.attributes['domain'].name` as text.
pub(super) fn read_text(section: Section, domain: &str, name: &str) -> String {
    format!("device.{}[{}].{name}", field(section), quote(domain))
}

/// The same read written canonically, for corrected expressions.
pub(super) fn read_node(section: Section, domain: &str, name: &str, access: Access) -> IdedExpr {
    let map = node(Expr::Select(SelectExpr {
        operand: Box::new(node(Expr::Ident("device".to_owned()))),
        field: field(section).to_owned(),
        test: false,
    }));
    let domain_map = call(None, operators::INDEX, vec![map, unparse::string(domain)]);
    match access {
        Access::Optional => call(
            None,
            operators::OPT_SELECT,
            vec![domain_map, unparse::string(name)],
        ),
        Access::Value | Access::Presence => node(Expr::Select(SelectExpr {
            operand: Box::new(domain_map),
            field: name.to_owned(),
            test: access == Access::Presence,
        })),
    }
}

/// The schema entries visible in a domain, with their CEL ids.
pub(super) fn domain_entries<'a>(
    driver: &'a str,
    domain: &'a str,
) -> impl Iterator<Item = (&'static Entry, &'static str)> + 'a {
    schema::SCHEMA.iter().filter_map(move |e| {
        let (d, id) = e.cel_key(driver);
        // cel_key borrows `driver` for unqualified names; the id is always
        // part of the static name
        let id = &e.name[e.name.len() - id.len()..];
        (d == domain).then_some((e, id))
    })
}

/// The entry `name` of `section` in `domain` (ours or the standard one).
pub(super) fn lookup(
    driver: &str,
    domain: &str,
    section: Section,
    name: &str,
) -> Option<&'static Entry> {
    domain_entries(driver, domain)
        .find(|(e, id)| e.section == section && *id == name)
        .map(|(e, _)| e)
}

/// Every (entry, domain, id) of this driver's and the standard domain.
pub(super) fn all_entries(driver: &str) -> Vec<(&'static Entry, String, &'static str)> {
    let mut out = Vec::new();
    for domain in [driver, STANDARD_DOMAIN] {
        for (e, id) in domain_entries(driver, domain) {
            out.push((e, domain.to_owned(), id));
        }
    }
    out
}
