//! Schema-aware validation of DeviceClasses, ResourceClaims and
//! ResourceClaimTemplates: the one engine behind the admission webhook, the
//! `gpu-dra lint` command and the kubelet plugin, so that all three judge an
//! object the same way.
//!
//! [`Validator::validate`] takes an object as JSON (`resource.k8s.io` v1,
//! v1beta1 or v1beta2), decides whether it concerns this driver at all
//! ([`Report::ours`]; objects that are not ours get no findings) and, if it
//! does, checks its CEL selectors against the attribute schema
//! ([`gpu_dra_api::schema`]) and its opaque configs with [`gpu_dra_api::config`].
//!
//! Selectors are compiled with the shared [`Compiler`] (limits, positions)
//! and their parsed tree is walked twice: once for names and types
//! ([`Check::UnknownAttribute`], [`Check::TypeMismatch`], ...), once per
//! kind of device the selector can be evaluated on (full GPU, static MIG,
//! dynamic MIG, a device of another driver) with the values the schema
//! knows (`type` is `gpu` on a full GPU), following CEL's short-circuit
//! and error-absorbing `&&`/`||`: that finds the reads that fail at
//! scheduling time on some device ([`Check::MissingAttribute`]) and the
//! selectors that can never be true ([`Check::NeverMatches`]). Every check
//! is listed in [`Check`].

mod analysis;
mod devices;
mod object;
mod selector;
mod suggest;
mod unparse;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::cel::Compiler;

pub use devices::DeviceSet;

/// Resolves DeviceClass names to their objects (JSON).
pub trait ClassLookup {
    /// The DeviceClass named `name`, if known.
    fn device_class(&self, name: &str) -> Option<serde_json::Value>;
}

/// A [`ClassLookup`] over a fixed set of DeviceClasses (for the CLI and
/// tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StaticClasses(BTreeMap<String, serde_json::Value>);

impl StaticClasses {
    /// The classes among `objects`, keyed by `metadata.name`; objects that
    /// are not DeviceClasses or have no name are ignored.
    pub fn new(objects: impl IntoIterator<Item = serde_json::Value>) -> Self {
        let mut classes = BTreeMap::new();
        for object in objects {
            if object.get("kind").and_then(serde_json::Value::as_str) != Some("DeviceClass") {
                continue;
            }
            let Some(name) = object
                .pointer("/metadata/name")
                .and_then(serde_json::Value::as_str)
            else {
                continue;
            };
            classes.insert(name.to_owned(), object);
        }
        StaticClasses(classes)
    }
}

impl ClassLookup for StaticClasses {
    fn device_class(&self, name: &str) -> Option<serde_json::Value> {
        self.0.get(name).cloned()
    }
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The object is wrong for this driver: deny it.
    Error,
    /// Worth telling the author; does not block admission.
    Warning,
}

/// The kinds of checks, one per kind of finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Check {
    /// Not valid CEL: a parse error with line, column and caret.
    Syntax,
    /// Longer, deeper or costlier than Kubernetes allows.
    Limit,
    /// A variable or function the selector environment does not have.
    Undeclared,
    /// A construct the environment does not support (message literals).
    Unsupported,
    /// An attribute or capacity that this driver does not publish in the
    /// domain read (a typo, an attribute read as a capacity, ...).
    UnknownAttribute,
    /// A domain that is almost this driver's (`gpu.nvida.com`).
    UnknownDomain,
    /// A field `device` does not have (`device.attribute`).
    UnknownField,
    /// `device.attributes['memory']`: attributes and capacities are keyed
    /// by domain first; this reads an empty domain and fails at scheduling.
    DomainKey,
    /// Operands or receivers of incompatible types: a version compared
    /// with an int, a string method on a quantity, `==` that can never be
    /// true.
    TypeMismatch,
    /// The selector's result is not a bool.
    NotBool,
    /// A literal argument that fails on every device (`semver('1.2')`,
    /// `quantity('40GB')`, an invalid regular expression).
    InvalidLiteral,
    /// An attribute or capacity read without a guard on a device kind that
    /// does not carry it: "no such key" at scheduling time.
    MissingAttribute,
    /// An attribute only present under some condition, read without
    /// `has()` or `.?` (warning: NVIDIA's own selectors read
    /// `driverVersion` unguarded).
    ConditionalAttribute,
    /// A read of another domain that fails on every device of this driver.
    ForeignDomain,
    /// A DeviceClass selector that reads this driver's attributes before
    /// checking `device.driver`, so it fails on devices of other drivers.
    OtherDriverDevice,
    /// A selector that is false for every device this driver publishes.
    NeverMatches,
    /// An opaque config of this driver that does not decode or validate.
    Config,
    /// A `GpuConfig` for MIG devices or a `MigDeviceConfig` for full GPUs.
    ConfigDeviceKind,
    /// A request name in `config[].requests` or `constraints[].requests`
    /// that names no request of the claim.
    RequestReference,
    /// A `deviceClassName` that cannot be resolved.
    UnknownClass,
    /// A constraint (`matchAttribute`) or capacity request naming something
    /// this driver does not publish, or that cannot be satisfied.
    Constraint,
    /// A field of the wrong JSON type, or a list longer than Kubernetes
    /// allows.
    Structure,
    /// The CEL library failed unexpectedly (reported, never a crash).
    Internal,
}

impl Check {
    /// The check's name as serialised (`unknown_attribute`).
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Syntax => "syntax",
            Check::Limit => "limit",
            Check::Undeclared => "undeclared",
            Check::Unsupported => "unsupported",
            Check::UnknownAttribute => "unknown_attribute",
            Check::UnknownDomain => "unknown_domain",
            Check::UnknownField => "unknown_field",
            Check::DomainKey => "domain_key",
            Check::TypeMismatch => "type_mismatch",
            Check::NotBool => "not_bool",
            Check::InvalidLiteral => "invalid_literal",
            Check::MissingAttribute => "missing_attribute",
            Check::ConditionalAttribute => "conditional_attribute",
            Check::ForeignDomain => "foreign_domain",
            Check::OtherDriverDevice => "other_driver_device",
            Check::NeverMatches => "never_matches",
            Check::Config => "config",
            Check::ConfigDeviceKind => "config_device_kind",
            Check::RequestReference => "request_reference",
            Check::UnknownClass => "unknown_class",
            Check::Constraint => "constraint",
            Check::Structure => "structure",
            Check::Internal => "internal",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A finding with its check and severity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Which check found it.
    pub check: Check,
    /// Error or warning.
    pub severity: Severity,
    /// Where and what.
    #[serde(flatten)]
    pub finding: Finding,
}

/// The result of checking one selector on its own
/// ([`Validator::check_selector`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorAnalysis {
    /// Everything found; paths are empty (the caller knows where the
    /// selector is).
    pub diagnostics: Vec<Diagnostic>,
    /// The devices, among those the selector was evaluated on, for which it
    /// can be true. Unknown (all of them) when it does not compile.
    pub matches: DeviceSet,
}

impl SelectorAnalysis {
    /// Whether there are no errors (warnings allowed).
    pub fn is_ok(&self) -> bool {
        !self
            .diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }
}

/// One problem found in an object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// JSON path of the offending field, e.g.
    /// `spec.devices.requests[0].exactly.selectors[1].cel.expression`.
    pub path: String,
    /// One precise sentence (may span lines for a caret snippet).
    pub message: String,
    /// A corrected expression or other fix, when one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The outcome of validating one object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Whether the object concerns this driver at all; objects that are not
    /// ours get no findings and must be admitted untouched.
    pub ours: bool,
    /// `DeviceClass`, `ResourceClaim`, `ResourceClaimTemplate` or whatever
    /// the object says it is.
    pub kind: String,
    /// `metadata.name` (or `metadata.generateName`), empty if absent.
    pub name: String,
    /// Problems that make the object wrong for this driver: deny.
    pub errors: Vec<Finding>,
    /// Problems worth telling the author about that do not block admission.
    pub warnings: Vec<Finding>,
}

impl Report {
    /// Whether there are no errors (warnings allowed).
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Validates objects for one driver. Cheap to share; holds the CEL
/// compiler (and its cache).
#[derive(Debug, Clone)]
pub struct Validator {
    driver: String,
    compiler: Arc<Compiler>,
}

impl Validator {
    /// A validator for the driver named `driver`, with its own compiler.
    pub fn new(driver: &str) -> Self {
        Validator::with_compiler(driver, Arc::new(Compiler::new()))
    }

    /// A validator sharing `compiler` (and its cache) with other users.
    pub fn with_compiler(driver: &str, compiler: Arc<Compiler>) -> Self {
        Validator {
            driver: driver.to_owned(),
            compiler,
        }
    }

    /// The driver name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The compiler used for selectors.
    pub fn compiler(&self) -> &Arc<Compiler> {
        &self.compiler
    }

    /// Validates one Kubernetes object given as JSON (DeviceClass,
    /// ResourceClaim, ResourceClaimTemplate in resource.k8s.io v1, v1beta1
    /// or v1beta2). `classes` resolves deviceClassName references (to decide
    /// which requests are ours).
    pub fn validate(&self, object: &serde_json::Value, classes: &dyn ClassLookup) -> Report {
        object::validate(self, object, classes)
    }

    /// Checks one selector expression as it would be evaluated on the
    /// devices in `reach`: [`DeviceSet::ALL`] for the first selector of a
    /// DeviceClass (every device of every driver), the devices a class lets
    /// through for a request's selectors (e.g. [`DeviceSet::OURS`]).
    pub fn check_selector(&self, expression: &str, reach: DeviceSet) -> SelectorAnalysis {
        selector::check(self, expression, reach)
    }
}
