//! Objects: which parts of a DeviceClass, ResourceClaim or
//! ResourceClaimTemplate concern this driver, and their checks. A class is
//! ours when its selectors test `device.driver` against the driver or read
//! its domain, or when it carries an opaque config for the driver; a
//! request is ours when its class is. Selectors are checked on the devices
//! that reach them (a request's on what its class lets through), opaque
//! configs of the driver are decoded and validated with [`gpu_dra_api::config`]
//! and matched against the requests they name, and constraints and
//! capacity requests are checked against the schema. Every list is read up
//! to Kubernetes' limit, so the work per object is bounded.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::selector;
use super::suggest::closest;
use super::{Check, ClassLookup, DeviceSet, Diagnostic, Finding, Report, Severity, Validator};
use gpu_dra_api::config::{self, ConfigError};
use gpu_dra_api::schema::{DeviceKind, SCHEMA, Section};

/// Kubernetes' limits on the lists read here.
const MAX_SELECTORS: usize = 32;
const MAX_REQUESTS: usize = 32;
const MAX_SUBREQUESTS: usize = 8;
const MAX_CONFIGS: usize = 32;
const MAX_CONSTRAINTS: usize = 32;
/// Distinct device classes resolved per object, at most.
const MAX_CLASSES: usize = 64;
/// JSON nodes visited when looking for the driver's name in a malformed
/// object.
const MAX_SCAN: usize = 100_000;

/// What a DeviceClass means for this driver.
#[derive(Debug, Clone, Copy)]
struct ClassInfo {
    ours: bool,
    /// The devices that pass its selectors.
    reach: DeviceSet,
}

/// A request or sub-request of a claim.
#[derive(Debug, Clone)]
struct Request {
    /// `main` or `main/sub`.
    name: String,
    /// The path of its deviceClassName.
    class_path: String,
    class: Option<String>,
    /// `None` when the class could not be resolved.
    info: Option<ClassInfo>,
    /// The devices that pass the class's and the request's selectors.
    reach: DeviceSet,
}

impl Request {
    fn ours(&self) -> bool {
        self.info.is_some_and(|i| i.ours)
    }

    /// Whether `name` names it: its own name, or (for a sub-request) its
    /// main request's.
    fn named(&self, name: &str) -> bool {
        self.name == name
            || self
                .name
                .split_once('/')
                .is_some_and(|(main, _)| main == name)
    }
}

struct Walk<'a> {
    validator: &'a Validator,
    classes: &'a dyn ClassLookup,
    resolved: HashMap<String, Option<ClassInfo>>,
    diagnostics: Vec<Diagnostic>,
    /// Structural problems (count only if the object is ours).
    malformed: bool,
    ours: bool,
}

/// [`Validator::validate`].
pub(crate) fn validate(validator: &Validator, object: &Value, classes: &dyn ClassLookup) -> Report {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let kind = text(object.get("kind"));
    let name = match object.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) => name.to_owned(),
        None => text(object.pointer("/metadata/generateName")),
    };
    let mut report = Report {
        ours: false,
        kind,
        name,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let in_group = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with("resource.k8s.io/"));
    if !in_group {
        return report;
    }
    let mut walk = Walk {
        validator,
        classes,
        resolved: HashMap::new(),
        diagnostics: Vec::new(),
        malformed: false,
        ours: false,
    };
    match report.kind.as_str() {
        "DeviceClass" => walk.device_class(object.get("spec"), "spec"),
        "ResourceClaim" => walk.claim(object.get("spec"), "spec"),
        "ResourceClaimTemplate" => match object.get("spec") {
            Some(spec @ Value::Object(_)) => walk.claim(spec.get("spec"), "spec.spec"),
            Some(_) => walk.structure("spec", "must be an object".to_owned()),
            None => {}
        },
        _ => return report,
    }
    if !walk.ours && walk.malformed {
        walk.ours = mentions(object, validator.driver());
    }
    if !walk.ours {
        return report;
    }
    report.ours = true;
    for diagnostic in walk.diagnostics {
        match diagnostic.severity {
            Severity::Error => report.errors.push(diagnostic.finding),
            Severity::Warning => report.warnings.push(diagnostic.finding),
        }
    }
    report
}

/// The names of the driver's own domain in `section`.
fn own_names(section: Section) -> Vec<&'static str> {
    SCHEMA
        .iter()
        .filter(|e| e.section == section && !e.name.contains('/'))
        .map(|e| e.name)
        .collect()
}

/// Whether a string in `object` names the driver (bounded scan, no
/// recursion).
fn mentions(object: &Value, driver: &str) -> bool {
    let mut stack = vec![object];
    let mut visited = 0;
    while let Some(v) = stack.pop() {
        visited += 1;
        if visited > MAX_SCAN {
            return false;
        }
        match v {
            Value::String(s) if s.contains(driver) => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    false
}

/// The JSON type of a value, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `base.sub`, or `base` when `sub` is empty (`base[0]` for `[0]`).
fn join(base: &str, sub: &str) -> String {
    if sub.is_empty() {
        base.to_owned()
    } else if sub.starts_with('[') {
        format!("{base}{sub}")
    } else {
        format!("{base}.{sub}")
    }
}

impl Walk<'_> {
    fn push(
        &mut self,
        check: Check,
        severity: Severity,
        path: String,
        message: String,
        hint: Option<String>,
    ) {
        self.diagnostics.push(Diagnostic {
            check,
            severity,
            finding: Finding {
                path,
                message,
                hint,
            },
        });
    }

    fn structure(&mut self, path: &str, message: String) {
        self.malformed = true;
        self.push(
            Check::Structure,
            Severity::Error,
            path.to_owned(),
            message,
            None,
        );
    }

    /// The items of the list at `path` (empty if absent), at most `max`.
    fn list<'v>(&mut self, value: Option<&'v Value>, path: &str, max: usize) -> &'v [Value] {
        match value {
            None | Some(Value::Null) => &[],
            Some(Value::Array(items)) => {
                if items.len() > max {
                    self.structure(
                        path,
                        format!(
                            "has {} entries; Kubernetes allows at most {max} (only the first {max} were checked)",
                            items.len()
                        ),
                    );
                    &items[..max]
                } else {
                    items
                }
            }
            Some(other) => {
                self.structure(path, format!("must be a list, not {}", type_name(other)));
                &[]
            }
        }
    }

    /// The object at `path`, if it is one (reported otherwise).
    fn object<'v>(&mut self, value: Option<&'v Value>, path: &str) -> Option<&'v Value> {
        match value {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => {
                self.structure(path, format!("must be an object, not {}", type_name(other)));
                None
            }
        }
    }

    /// The string at `path`, if it is one (reported otherwise).
    fn string<'v>(&mut self, value: Option<&'v Value>, path: &str) -> Option<&'v str> {
        match value {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                self.structure(path, format!("must be a string, not {}", type_name(other)));
                None
            }
        }
    }

    fn device_class(&mut self, spec: Option<&Value>, path: &str) {
        let Some(spec) = self.object(spec, path) else {
            return;
        };
        let info = self.class_spec(spec, path, true);
        self.ours |= info.ours;
    }

    /// Checks a class's selectors and configs; with `report`, keeps what
    /// is found.
    fn class_spec(&mut self, spec: &Value, path: &str, report: bool) -> ClassInfo {
        let before = self.diagnostics.len();
        let malformed = self.malformed;
        let selectors_path = format!("{path}.selectors");
        let (reach, mut ours) =
            self.selectors(spec.get("selectors"), &selectors_path, DeviceSet::ALL);
        let configs_path = format!("{path}.config");
        for (i, entry) in self
            .list(spec.get("config"), &configs_path, MAX_CONFIGS)
            .iter()
            .enumerate()
        {
            let entry_path = format!("{configs_path}[{i}]");
            if let Some((config, parameters_path)) = self.opaque(entry, &entry_path) {
                ours = true;
                if let Some(kind) = config {
                    self.config_kind(kind, &parameters_path, &[("this class", reach)], None);
                }
            }
        }
        if !report {
            self.diagnostics.truncate(before);
            self.malformed = malformed;
        }
        ClassInfo { ours, reach }
    }

    /// Checks a list of selectors evaluated one after the other on the
    /// devices of `reach`; returns the devices that pass them all and
    /// whether one of them concerns the driver.
    fn selectors(
        &mut self,
        list: Option<&Value>,
        path: &str,
        mut reach: DeviceSet,
    ) -> (DeviceSet, bool) {
        let mut mentions = false;
        for (i, item) in self.list(list, path, MAX_SELECTORS).iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(item) = self.object(Some(item), &item_path) else {
                continue;
            };
            let cel_path = format!("{item_path}.cel");
            let Some(cel) = self.object(item.get("cel"), &cel_path) else {
                continue;
            };
            let expression_path = format!("{cel_path}.expression");
            let Some(expression) = self.string(cel.get("expression"), &expression_path) else {
                continue;
            };
            let checked = selector::check_detailed(self.validator, expression, reach);
            mentions |= checked.mentions_driver;
            reach = checked.analysis.matches;
            for mut diagnostic in checked.analysis.diagnostics {
                diagnostic.finding.path.clone_from(&expression_path);
                self.diagnostics.push(diagnostic);
            }
        }
        (reach, mentions)
    }

    /// An opaque config entry: `None` if it is not for this driver, else
    /// the kind of device its parameters say they are for (even if they do
    /// not validate; the errors are reported) and the path of its
    /// parameters.
    fn opaque(
        &mut self,
        entry: &Value,
        path: &str,
    ) -> Option<(Option<config::DeviceKind>, String)> {
        let entry = self.object(Some(entry), path)?;
        let opaque_path = format!("{path}.opaque");
        let opaque = self.object(entry.get("opaque"), &opaque_path)?;
        let driver = self.string(opaque.get("driver"), &format!("{opaque_path}.driver"))?;
        if driver != self.validator.driver() {
            return None;
        }
        let parameters_path = format!("{opaque_path}.parameters");
        let Some(parameters) = opaque.get("parameters") else {
            self.push(
                Check::Config,
                Severity::Error,
                parameters_path.clone(),
                format!(
                    "an opaque config for {driver} needs parameters (apiVersion {} with kind {} or {})",
                    config::NVIDIA_API_VERSION,
                    config::GPU_CONFIG_KIND,
                    config::MIG_DEVICE_CONFIG_KIND
                ),
                None,
            );
            return Some((None, parameters_path));
        };
        if let Err(error) = config::decode_validated(parameters) {
            self.config_error(&parameters_path, error);
        }
        let api_version = parameters.get("apiVersion").and_then(Value::as_str);
        let kind = match parameters.get("kind").and_then(Value::as_str) {
            _ if api_version != Some(config::NVIDIA_API_VERSION) => None,
            Some(config::GPU_CONFIG_KIND) => Some(config::DeviceKind::Gpu),
            Some(config::MIG_DEVICE_CONFIG_KIND) => Some(config::DeviceKind::Mig),
            Some(config::VFIO_DEVICE_CONFIG_KIND) => Some(config::DeviceKind::Vfio),
            _ => None,
        };
        Some((kind, parameters_path))
    }

    fn config_error(&mut self, path: &str, error: ConfigError) {
        match error {
            ConfigError::Decode {
                path: field,
                message,
            } => {
                self.push(
                    Check::Config,
                    Severity::Error,
                    join(path, &field),
                    message,
                    None,
                );
            }
            ConfigError::Invalid(fields) => {
                for field in fields {
                    self.push(
                        Check::Config,
                        Severity::Error,
                        join(path, &field.path),
                        field.message,
                        None,
                    );
                }
            }
            other => self.push(
                Check::Config,
                Severity::Error,
                path.to_owned(),
                other.to_string(),
                None,
            ),
        }
    }

    /// Checks a decoded config against the devices of the requests it
    /// applies to (`(name, devices)` pairs).
    fn config_kind(
        &mut self,
        kind: config::DeviceKind,
        path: &str,
        targets: &[(&str, DeviceSet)],
        class_of: Option<&dyn Fn(&str) -> String>,
    ) {
        let (this_kind, fits) = match kind {
            config::DeviceKind::Gpu => (config::GPU_CONFIG_KIND, DeviceSet::of(DeviceKind::Gpu)),
            config::DeviceKind::Mig => (
                config::MIG_DEVICE_CONFIG_KIND,
                DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]),
            ),
            config::DeviceKind::Vfio => (
                config::VFIO_DEVICE_CONFIG_KIND,
                DeviceSet::of(DeviceKind::Vfio),
            ),
        };
        let wrong_kinds = DeviceSet::OURS.intersection(DeviceSet::of_kinds(
            &DeviceKind::ALL
                .into_iter()
                .filter(|k| !fits.contains(*k))
                .collect::<Vec<_>>(),
        ));
        for (target, reach) in targets {
            let ours = reach.intersection(DeviceSet::OURS);
            if ours.is_empty() || ours.intersection(wrong_kinds).is_empty() {
                continue;
            }
            let wrong_words = families(ours.intersection(wrong_kinds));
            let other_kind = config_for(ours);
            let whose = class_of.map(|f| f(target)).unwrap_or_default();
            if ours.intersection(fits).is_empty() {
                self.push(
                    Check::ConfigDeviceKind,
                    Severity::Error,
                    path.to_owned(),
                    format!(
                        "a {} cannot be applied to {wrong_words}, and {target}{whose} gets only {}: use a {other_kind}",
                        this_kind,
                        ours.describe()
                    ),
                    None,
                );
            } else {
                self.push(
                    Check::ConfigDeviceKind,
                    Severity::Warning,
                    path.to_owned(),
                    format!(
                        "{target}{whose} can get {} as well as {}: this {} fails at prepare if it gets {wrong_words}",
                        ours.intersection(wrong_kinds).describe(),
                        ours.intersection(fits).describe(),
                        this_kind
                    ),
                    None,
                );
            }
        }
    }

    /// The class named `name`, resolved and analysed once per object.
    fn class(&mut self, name: &str) -> Option<ClassInfo> {
        if let Some(info) = self.resolved.get(name) {
            return *info;
        }
        if self.resolved.len() >= MAX_CLASSES {
            return None;
        }
        let info = self
            .classes
            .device_class(name)
            .map(|object| match object.get("spec") {
                Some(spec @ Value::Object(_)) => self.class_spec(spec, "spec", false),
                _ => ClassInfo {
                    ours: false,
                    reach: DeviceSet::ALL,
                },
            });
        self.resolved.insert(name.to_owned(), info);
        info
    }

    fn claim(&mut self, spec: Option<&Value>, path: &str) {
        let Some(spec) = self.object(spec, path) else {
            return;
        };
        let devices_path = format!("{path}.devices");
        let Some(devices) = self.object(spec.get("devices"), &devices_path) else {
            return;
        };
        let requests = self.requests(devices, &devices_path);
        if requests.iter().any(Request::ours) {
            self.ours = true;
        }
        self.configs(devices, &devices_path, &requests);
        if self.ours {
            self.constraints(devices, &devices_path, &requests);
        }
    }

    fn requests(&mut self, devices: &Value, devices_path: &str) -> Vec<Request> {
        let path = format!("{devices_path}.requests");
        let mut out = Vec::new();
        for (i, request) in self
            .list(devices.get("requests"), &path, MAX_REQUESTS)
            .iter()
            .enumerate()
        {
            let request_path = format!("{path}[{i}]");
            let Some(request) = self.object(Some(request), &request_path) else {
                continue;
            };
            let name = self
                .string(request.get("name"), &format!("{request_path}.name"))
                .unwrap_or_default()
                .to_owned();
            if let Some(exactly) = request.get("exactly") {
                let exactly_path = format!("{request_path}.exactly");
                if let Some(exactly) = self.object(Some(exactly), &exactly_path) {
                    out.push(self.request_body(exactly, &exactly_path, name));
                }
            } else if let Some(first) = request.get("firstAvailable") {
                let first_path = format!("{request_path}.firstAvailable");
                for (j, sub) in self
                    .list(Some(first), &first_path, MAX_SUBREQUESTS)
                    .iter()
                    .enumerate()
                {
                    let sub_path = format!("{first_path}[{j}]");
                    let Some(sub) = self.object(Some(sub), &sub_path) else {
                        continue;
                    };
                    let sub_name = self
                        .string(sub.get("name"), &format!("{sub_path}.name"))
                        .unwrap_or_default();
                    let full = format!("{name}/{sub_name}");
                    out.push(self.request_body(sub, &sub_path, full));
                }
            } else {
                // resource.k8s.io/v1beta1: the request itself
                out.push(self.request_body(request, &request_path, name));
            }
        }
        out
    }

    fn request_body(&mut self, body: &Value, path: &str, name: String) -> Request {
        let class_path = format!("{path}.deviceClassName");
        let class = self
            .string(body.get("deviceClassName"), &class_path)
            .map(str::to_owned);
        let info = class.as_deref().and_then(|c| self.class(c));
        let mut request = Request {
            name,
            class_path,
            class,
            info,
            reach: info.map_or(DeviceSet::ALL, |i| i.reach),
        };
        if !request.ours() {
            return request;
        }
        let (reach, _) = self.selectors(
            body.get("selectors"),
            &format!("{path}.selectors"),
            request.reach,
        );
        request.reach = reach;
        let capacity_path = format!("{path}.capacity.requests");
        if let Some(capacity) = body.pointer("/capacity/requests") {
            match capacity {
                Value::Object(map) => {
                    for key in map.keys().take(MAX_SELECTORS) {
                        self.capacity_request(key, &join(&capacity_path, key));
                    }
                }
                other => self.structure(
                    &capacity_path,
                    format!("must be an object, not {}", type_name(other)),
                ),
            }
        }
        request
    }

    /// A capacity request names a capacity of our devices.
    fn capacity_request(&mut self, key: &str, path: &str) {
        let driver = self.validator.driver();
        let name = match key.split_once('/') {
            None => key,
            Some((domain, name)) if domain == driver => name,
            Some(_) => return,
        };
        let capacities = own_names(Section::Capacity);
        if capacities.contains(&name) {
            return;
        }
        let mut message = format!("`{key}` is not a capacity of {driver}");
        if own_names(Section::Attribute).contains(&name) {
            let _ = write!(message, " (`{name}` is an attribute)");
        }
        let _ = write!(
            message,
            "; its devices have the capacities {}",
            capacities.join(", ")
        );
        let hint = closest(name, capacities.iter().copied()).map(str::to_owned);
        self.push(
            Check::Constraint,
            Severity::Error,
            path.to_owned(),
            message,
            hint,
        );
    }

    fn configs(&mut self, devices: &Value, devices_path: &str, requests: &[Request]) {
        let path = format!("{devices_path}.config");
        let our_requests: Vec<&Request> = requests.iter().filter(|r| r.ours()).collect();
        let mut has_ours = false;
        for (i, entry) in self
            .list(devices.get("config"), &path, MAX_CONFIGS)
            .iter()
            .enumerate()
        {
            let entry_path = format!("{path}[{i}]");
            let Some((config, parameters_path)) = self.opaque(entry, &entry_path) else {
                continue;
            };
            has_ours = true;
            self.ours = true;
            let names = self.request_names(
                entry.get("requests"),
                &format!("{entry_path}.requests"),
                requests,
            );
            let Some(kind) = config else {
                continue;
            };
            // the requests it applies to: every request of the driver, or
            // those named (a request name covers its sub-requests)
            let targets: Vec<(String, DeviceSet)> = our_requests
                .iter()
                .filter(|r| names.is_empty() || names.iter().any(|n| r.named(n)))
                .map(|r| (format!("request `{}`", r.name), r.reach))
                .collect();
            let classes: HashMap<String, String> = our_requests
                .iter()
                .map(|r| {
                    (
                        format!("request `{}`", r.name),
                        r.class
                            .as_ref()
                            .map(|c| format!(" (class {c})"))
                            .unwrap_or_default(),
                    )
                })
                .collect();
            let class_of = |target: &str| classes.get(target).cloned().unwrap_or_default();
            let targets: Vec<(&str, DeviceSet)> =
                targets.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            self.config_kind(kind, &parameters_path, &targets, Some(&class_of));
            // named requests that get no device of this driver
            for name in &names {
                let named: Vec<&Request> = requests.iter().filter(|r| r.named(name)).collect();
                if !named.is_empty() && named.iter().all(|r| r.info.is_some_and(|i| !i.ours)) {
                    self.push(
                        Check::RequestReference,
                        Severity::Warning,
                        format!("{entry_path}.requests"),
                        format!(
                            "request `{name}` gets no device of {} (its class is not this driver's), so this config never applies to it",
                            self.validator.driver()
                        ),
                        None,
                    );
                }
            }
        }
        if has_ours {
            for request in requests
                .iter()
                .filter(|r| r.info.is_none() && r.class.is_some())
            {
                let class = request.class.as_deref().unwrap_or_default();
                self.push(
                    Check::UnknownClass,
                    Severity::Warning,
                    request.class_path.clone(),
                    format!(
                        "device class `{class}` was not found: cannot tell whether request `{}` gets devices of {}, so its selectors and the configs naming it were not checked against them",
                        request.name,
                        self.validator.driver()
                    ),
                    None,
                );
            }
        }
    }

    /// The request names of a config or constraint, each checked against
    /// the claim's requests.
    fn request_names(
        &mut self,
        list: Option<&Value>,
        path: &str,
        requests: &[Request],
    ) -> Vec<String> {
        let mut names = Vec::new();
        let known: Vec<&str> = requests
            .iter()
            .flat_map(|r| {
                let main = r.name.split_once('/').map_or(r.name.as_str(), |(m, _)| m);
                [r.name.as_str(), main]
            })
            .collect();
        for (i, item) in self.list(list, path, MAX_REQUESTS).iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(name) = self.string(Some(item), &item_path) else {
                continue;
            };
            if !known.contains(&name) {
                let suggestion = closest(name, known.iter().copied());
                let mut message = format!("`{name}` is not a request of this claim");
                match suggestion {
                    Some(best) => {
                        let _ = write!(message, "; did you mean `{best}`?");
                    }
                    None if !known.is_empty() => {
                        let mut listed: Vec<&str> = known.clone();
                        listed.dedup();
                        let _ = write!(message, " (its requests: {})", listed.join(", "));
                    }
                    None => {}
                }
                self.push(
                    Check::RequestReference,
                    Severity::Error,
                    item_path,
                    message,
                    suggestion.map(str::to_owned),
                );
            }
            names.push(name.to_owned());
        }
        names
    }

    fn constraints(&mut self, devices: &Value, devices_path: &str, requests: &[Request]) {
        let path = format!("{devices_path}.constraints");
        let driver = self.validator.driver().to_owned();
        for (i, entry) in self
            .list(devices.get("constraints"), &path, MAX_CONSTRAINTS)
            .iter()
            .enumerate()
        {
            let entry_path = format!("{path}[{i}]");
            let Some(entry) = self.object(Some(entry), &entry_path) else {
                continue;
            };
            let names = self.request_names(
                entry.get("requests"),
                &format!("{entry_path}.requests"),
                requests,
            );
            let (field, attribute) = if let Some(a) = entry.get("matchAttribute") {
                ("matchAttribute", a)
            } else if let Some(a) = entry.get("distinctAttribute") {
                ("distinctAttribute", a)
            } else {
                continue;
            };
            let attribute_path = format!("{entry_path}.{field}");
            let Some(attribute) = self.string(Some(attribute), &attribute_path) else {
                continue;
            };
            let Some((domain, name)) = attribute.split_once('/') else {
                continue;
            };
            let applies: Vec<&Request> = requests
                .iter()
                .filter(|r| r.ours())
                .filter(|r| names.is_empty() || names.iter().any(|n| r.named(n)))
                .collect();
            if applies.is_empty()
                || (domain != driver && domain != gpu_dra_api::schema::STANDARD_DOMAIN)
            {
                continue;
            }
            let entry = SCHEMA.iter().find(|e| {
                let (d, id) = e.cel_key(&driver);
                d == domain && id == name
            });
            let Some(entry) = entry else {
                let attributes: Vec<String> = SCHEMA
                    .iter()
                    .filter(|e| e.section == Section::Attribute)
                    .filter_map(|e| {
                        let (d, id) = e.cel_key(&driver);
                        (d == domain).then(|| format!("{d}/{id}"))
                    })
                    .collect();
                let hint =
                    closest(attribute, attributes.iter().map(String::as_str)).map(str::to_owned);
                let mut message = format!(
                    "`{attribute}` is not an attribute of {domain}, so no device satisfies the constraint and the claim cannot be allocated"
                );
                if let Some(best) = &hint {
                    let _ = write!(message, "; did you mean `{best}`?");
                }
                self.push(
                    Check::Constraint,
                    Severity::Error,
                    attribute_path,
                    message,
                    hint,
                );
                continue;
            };
            if entry.section == Section::Capacity {
                self.push(
                    Check::Constraint,
                    Severity::Error,
                    attribute_path,
                    format!("`{attribute}` is a capacity, and {field} compares attributes: no device satisfies it"),
                    None,
                );
                continue;
            }
            for request in applies {
                let carried = DeviceSet::of_kinds(entry.kinds);
                let reach = request.reach.intersection(DeviceSet::OURS);
                if !reach.is_empty() && reach.intersection(carried).is_empty() {
                    self.push(
                        Check::Constraint,
                        Severity::Error,
                        attribute_path.clone(),
                        format!(
                            "`{attribute}` is published only on {}, but request `{}` gets only {}: the constraint can never be satisfied",
                            carried.describe(),
                            request.name,
                            reach.describe()
                        ),
                        None,
                    );
                }
            }
        }
    }
}

/// The device families of `set` in words, as config errors name them:
/// "MIG devices", "full GPUs", "VFIO passthrough GPUs".
fn families(set: DeviceSet) -> String {
    let mut parts = Vec::new();
    if set.contains(DeviceKind::Gpu) {
        parts.push("full GPUs");
    }
    if set.contains(DeviceKind::MigStatic) || set.contains(DeviceKind::MigDynamic) {
        parts.push("MIG devices");
    }
    if set.contains(DeviceKind::Vfio) {
        parts.push("VFIO passthrough GPUs");
    }
    parts.join(" or ")
}

/// The config kind for the devices of `set`, when they are of one family.
fn config_for(set: DeviceSet) -> &'static str {
    let mig = DeviceSet::of_kinds(&[DeviceKind::MigStatic, DeviceKind::MigDynamic]);
    if set.intersection(mig) == set {
        config::MIG_DEVICE_CONFIG_KIND
    } else if set == DeviceSet::of(DeviceKind::Gpu) {
        config::GPU_CONFIG_KIND
    } else if set == DeviceSet::of(DeviceKind::Vfio) {
        config::VFIO_DEVICE_CONFIG_KIND
    } else {
        "config of each device's kind"
    }
}
