//! Validation of objects as the API server does it before storing them: first decoding (a value
//! of the wrong JSON type or an unparsable quantity is a 400 `BadRequest`, like a failed decode),
//! then field validation (a 422 `Invalid` Status whose causes name each field, and whose message
//! is `Kind.group "name" is invalid: <errors>`).
//!
//! ResourceSlice rules come in two sets ([`ValidationRules`]): the 1.34 rules and the 1.35+ rules.

mod claim;
mod event;
mod lease;
mod meta;
pub(crate) mod names;
mod slice;

use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

use super::resources::Resource;
use super::status::{ApiError, StatusCause};

/// Which Kubernetes version's ResourceSlice validation rules the server enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValidationRules {
    /// Kubernetes 1.34: 128 devices per slice; shared counters may coexist with devices (at most
    /// 32 counters over all sets); devices consume at most 32 counters each and 1024 per slice,
    /// only from counter sets of the same slice; at most 4 taints per device.
    V1_34,
    /// Kubernetes 1.35 and later: 128 devices per slice, 64 when any device has taints or
    /// consumes counters; a slice holds either devices or shared counters; at most 8 counter
    /// sets of at most 32 counters; at most 2 counter consumptions per device, 32 counters each;
    /// at most 16 taints per device, effect `None` allowed.
    #[default]
    V1_35,
}

impl ValidationRules {
    /// The Kubernetes minor version the server reports in `/version`.
    pub fn minor(self) -> u32 {
        match self {
            ValidationRules::V1_34 => 34,
            ValidationRules::V1_35 => 35,
        }
    }
}

impl fmt::Display for ValidationRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

impl FromStr for ValidationRules {
    type Err = String;

    /// Accepts `1.34`, `1.35`, `1.35+` and later minors (`1.36`, ...), with or without a leading
    /// `v`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim().trim_start_matches('v').trim_end_matches('+');
        let minor = trimmed
            .strip_prefix("1.")
            .and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(34) => Ok(ValidationRules::V1_34),
            Some(m) if m >= 35 => Ok(ValidationRules::V1_35),
            _ => Err(format!(
                "unsupported validation rules \"{s}\": expected 1.34 or 1.35 (1.35+)"
            )),
        }
    }
}

/// A path to a field, rendered like the API server does: `spec.devices[3].attributes[key]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path(String);

impl Path {
    pub(crate) fn root(name: &str) -> Self {
        Path(name.to_owned())
    }

    pub(crate) fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Path(name.to_owned())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub(crate) fn index(&self, i: usize) -> Self {
        Path(format!("{}[{i}]", self.0))
    }

    /// A map key; keys longer than `truncate` (at least 16) are shortened in the middle like the
    /// API server does for attribute names.
    pub(crate) fn key(&self, key: &str, truncate: usize) -> Self {
        let max = truncate.max(16);
        let key = if key.len() <= max || !key.is_ascii() {
            key.to_owned()
        } else {
            let remaining = max - 3;
            format!(
                "{}...{}",
                &key[..remaining.div_ceil(2)],
                &key[key.len() - remaining / 2..]
            )
        };
        Path(format!("{}[{key}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind of a field error (the `FieldValue...` cause reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
}

/// One field validation error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub kind: ErrorKind,
    pub field: String,
    /// The body after the field, e.g. `Invalid value: "x": must be ...`.
    pub body: String,
}

impl FieldError {
    fn reason(&self) -> &'static str {
        match self.kind {
            ErrorKind::Required => "FieldValueRequired",
            ErrorKind::Invalid => "FieldValueInvalid",
            ErrorKind::Duplicate => "FieldValueDuplicate",
            ErrorKind::NotSupported => "FieldValueNotSupported",
            ErrorKind::Forbidden => "FieldValueForbidden",
            ErrorKind::TooLong => "FieldValueTooLong",
            ErrorKind::TooMany => "FieldValueTooMany",
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body)
    }
}

fn with_detail(head: String, detail: &str) -> String {
    if detail.is_empty() {
        head
    } else {
        format!("{head}: {detail}")
    }
}

/// Renders a value the way field errors print it: strings quoted, numbers and booleans bare.
pub(crate) fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// Collects field errors and decode errors while walking an object.
#[derive(Debug)]
pub(crate) struct Errors {
    resource: Resource,
    pub(crate) fields: Vec<FieldError>,
    decode: Vec<String>,
}

impl Errors {
    pub(crate) fn new(resource: Resource) -> Self {
        Self {
            resource,
            fields: Vec::new(),
            decode: Vec::new(),
        }
    }

    fn push(&mut self, kind: ErrorKind, path: &Path, body: String) {
        self.fields.push(FieldError {
            kind,
            field: path.0.clone(),
            body,
        });
    }

    pub(crate) fn required(&mut self, path: &Path, detail: &str) {
        self.push(
            ErrorKind::Required,
            path,
            with_detail("Required value".into(), detail),
        );
    }

    pub(crate) fn invalid(&mut self, path: &Path, value: &Value, detail: &str) {
        self.push(
            ErrorKind::Invalid,
            path,
            with_detail(format!("Invalid value: {}", render(value)), detail),
        );
    }

    pub(crate) fn invalid_str(&mut self, path: &Path, value: &str, detail: &str) {
        self.invalid(path, &Value::String(value.to_owned()), detail);
    }

    pub(crate) fn duplicate(&mut self, path: &Path, value: &str) {
        self.push(
            ErrorKind::Duplicate,
            path,
            format!("Duplicate value: {value:?}"),
        );
    }

    pub(crate) fn not_supported(&mut self, path: &Path, value: &str, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        self.push(
            ErrorKind::NotSupported,
            path,
            format!(
                "Unsupported value: {value:?}: supported values: {}",
                list.join(", ")
            ),
        );
    }

    pub(crate) fn forbidden(&mut self, path: &Path, detail: &str) {
        self.push(
            ErrorKind::Forbidden,
            path,
            with_detail("Forbidden".into(), detail),
        );
    }

    pub(crate) fn too_long(&mut self, path: &Path, max: usize) {
        self.push(
            ErrorKind::TooLong,
            path,
            format!("Too long: may not be more than {max} bytes"),
        );
    }

    pub(crate) fn too_many(&mut self, path: &Path, actual: usize, max: usize) {
        self.push(
            ErrorKind::TooMany,
            path,
            format!("Too many: {actual}: must have at most {max} items"),
        );
    }

    /// Adds one `Invalid` error per message.
    pub(crate) fn invalid_each(&mut self, path: &Path, value: &str, msgs: Vec<String>) {
        for msg in msgs {
            self.invalid_str(path, value, &msg);
        }
    }

    /// Records a decode (type) error.
    pub(crate) fn decode(&mut self, path: &Path, want: &str, got: &Value) {
        let got = match got {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        self.decode.push(format!(
            "json: cannot unmarshal {got} into Go struct field {} of type {want}",
            path.0
        ));
    }

    /// Records an unparsable quantity (the real server's message names no field).
    pub(crate) fn bad_quantity(&mut self, _path: &Path) {
        self.decode.push(
            "quantities must match the regular expression \
             '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
                .to_owned(),
        );
    }

    // ----- typed access; a value of the wrong type is a decode error -----

    /// A child object (absent or `null` gives `None`).
    pub(crate) fn object<'v>(
        &mut self,
        parent: &'v Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<&'v Map<String, Value>> {
        match parent.get(name)? {
            Value::Null => None,
            Value::Object(m) => Some(m),
            other => {
                self.decode(&path.child(name), "object", other);
                None
            }
        }
    }

    /// A child array.
    pub(crate) fn array<'v>(
        &mut self,
        parent: &'v Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<&'v Vec<Value>> {
        match parent.get(name)? {
            Value::Null => None,
            Value::Array(a) => Some(a),
            other => {
                self.decode(&path.child(name), "array", other);
                None
            }
        }
    }

    /// A child string.
    pub(crate) fn string<'v>(
        &mut self,
        parent: &'v Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<&'v str> {
        match parent.get(name)? {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => {
                self.decode(&path.child(name), "string", other);
                None
            }
        }
    }

    /// A child int64.
    pub(crate) fn int(
        &mut self,
        parent: &Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<i64> {
        match parent.get(name)? {
            Value::Null => None,
            Value::Number(n) if n.as_i64().is_some() => n.as_i64(),
            other => {
                self.decode(&path.child(name), "int64", other);
                None
            }
        }
    }

    /// A child bool.
    pub(crate) fn boolean(
        &mut self,
        parent: &Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<bool> {
        match parent.get(name)? {
            Value::Null => None,
            Value::Bool(b) => Some(*b),
            other => {
                self.decode(&path.child(name), "bool", other);
                None
            }
        }
    }

    /// Elements of an array that must all be objects (others are decode errors and skipped).
    pub(crate) fn objects<'v>(
        &mut self,
        items: &'v [Value],
        path: &Path,
    ) -> Vec<(usize, Option<&'v Map<String, Value>>)> {
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(m) => (i, Some(m)),
                Value::Null => (i, None),
                other => {
                    self.decode(&path.index(i), "object", other);
                    (i, None)
                }
            })
            .collect()
    }

    /// Elements of an array that must all be strings.
    pub(crate) fn strings<'v>(&mut self, items: &'v [Value], path: &Path) -> Vec<&'v str> {
        items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Value::String(s) => Some(s.as_str()),
                other => {
                    self.decode(&path.index(i), "string", other);
                    None
                }
            })
            .collect()
    }

    /// A quantity (string or number); `None` when absent.
    pub(crate) fn quantity(
        &mut self,
        parent: &Map<String, Value>,
        name: &str,
        path: &Path,
    ) -> Option<()> {
        match parent.get(name)? {
            Value::Null => None,
            Value::String(s) => {
                if !names::is_quantity(s) {
                    self.bad_quantity(&path.child(name));
                }
                Some(())
            }
            Value::Number(_) => Some(()),
            other => {
                self.decode(&path.child(name), "Quantity", other);
                None
            }
        }
    }

    /// Converts the collected errors into the API error the server answers with, if any.
    pub(crate) fn into_result(self, name: &str) -> Result<(), ApiError> {
        let info = self.resource.info();
        if let Some(first) = self.decode.first() {
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {first}",
                kind = info.kind,
                version = info.version,
            )));
        }
        if self.fields.is_empty() {
            return Ok(());
        }
        let summary = if self.fields.len() == 1 {
            self.fields[0].to_string()
        } else {
            let all: Vec<String> = self.fields.iter().map(ToString::to_string).collect();
            format!("[{}]", all.join(", "))
        };
        let causes = self
            .fields
            .iter()
            .map(|e| StatusCause {
                reason: e.reason().to_owned(),
                message: e.body.clone(),
                field: e.field.clone(),
            })
            .collect();
        Err(ApiError::invalid(self.resource, name, causes, &summary))
    }
}

/// Validates an object about to be created.
pub(crate) fn validate_create(
    resource: Resource,
    obj: &Value,
    rules: ValidationRules,
) -> Result<(), ApiError> {
    validate(resource, obj, None, false, rules)
}

/// Validates an update of `old` to `new`; `status` is true for writes to the status subresource.
pub(crate) fn validate_update(
    resource: Resource,
    new: &Value,
    old: &Value,
    status: bool,
    rules: ValidationRules,
) -> Result<(), ApiError> {
    validate(resource, new, Some(old), status, rules)
}

fn validate(
    resource: Resource,
    obj: &Value,
    old: Option<&Value>,
    status: bool,
    rules: ValidationRules,
) -> Result<(), ApiError> {
    let mut errs = Errors::new(resource);
    let Some(map) = obj.as_object() else {
        errs.decode(&Path::root(""), "object", obj);
        return errs.into_result("");
    };
    let name = super::meta::name(obj).to_owned();
    meta::validate_object_meta(&mut errs, resource, map, old);
    match resource {
        Resource::ResourceSlices => slice::validate(&mut errs, map, old, rules),
        Resource::ResourceClaims => {
            if status {
                claim::validate_claim_status(&mut errs, map, old);
            } else {
                claim::validate_claim(&mut errs, map, old);
            }
        }
        Resource::DeviceClasses => claim::validate_device_class(&mut errs, map),
        Resource::Nodes => {}
        Resource::Events => {
            let namespace = super::meta::namespace(obj).to_owned();
            event::validate(&mut errs, map, &namespace, old);
        }
        Resource::Leases => lease::validate(&mut errs, map),
    }
    errs.into_result(&name)
}

/// Applies the defaults the API server sets on create (ResourceClaim request `allocationMode`
/// `ExactCount` with `count: 1`, toleration operator `Equal`).
pub(crate) fn apply_defaults(resource: Resource, obj: &mut Value) {
    if resource == Resource::ResourceClaims {
        claim::default_claim(obj);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_parse() {
        assert_eq!("1.34".parse(), Ok(ValidationRules::V1_34));
        assert_eq!("1.35".parse(), Ok(ValidationRules::V1_35));
        assert_eq!("1.35+".parse(), Ok(ValidationRules::V1_35));
        assert_eq!("v1.37".parse(), Ok(ValidationRules::V1_35));
        assert!("1.33".parse::<ValidationRules>().is_err());
        assert!("banana".parse::<ValidationRules>().is_err());
        assert_eq!(ValidationRules::default(), ValidationRules::V1_35);
        assert_eq!(ValidationRules::V1_34.to_string(), "1.34");
    }

    #[test]
    fn paths_render_like_the_api_server() {
        let p = Path::root("spec")
            .child("devices")
            .index(3)
            .child("attributes");
        assert_eq!(
            p.key("gpu.nvidia.com/uuid", 96).to_string(),
            "spec.devices[3].attributes[gpu.nvidia.com/uuid]"
        );
        let long = format!("{}/{}", "x".repeat(64), "y".repeat(33));
        let truncated = p.key(&long, 96).to_string();
        assert!(truncated.contains("..."), "{truncated}");
        assert_eq!(truncated.len(), "spec.devices[3].attributes[]".len() + 96);
    }

    #[test]
    fn single_and_multiple_errors_render() {
        let mut errs = Errors::new(Resource::ResourceSlices);
        errs.required(&Path::root("spec").child("driver"), "");
        let err = errs.into_result("s").unwrap_err();
        assert_eq!(
            err.message,
            "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.driver: Required value"
        );
        let mut errs = Errors::new(Resource::ResourceSlices);
        errs.too_many(&Path::root("spec").child("devices"), 129, 128);
        errs.invalid(
            &Path::root("spec").child("pool").child("generation"),
            &json!(-1),
            "must be greater than or equal to zero",
        );
        let err = errs.into_result("s").unwrap_err();
        assert_eq!(
            err.message,
            "ResourceSlice.resource.k8s.io \"s\" is invalid: [spec.devices: Too many: 129: must have at most 128 items, \
             spec.pool.generation: Invalid value: -1: must be greater than or equal to zero]"
        );
        assert_eq!(err.details.causes[0].reason, "FieldValueTooMany");
        assert_eq!(
            err.details.causes[1].message,
            "Invalid value: -1: must be greater than or equal to zero"
        );
    }

    #[test]
    fn decode_errors_win_and_are_bad_requests() {
        let mut errs = Errors::new(Resource::ResourceSlices);
        errs.required(&Path::root("spec").child("driver"), "");
        errs.decode(
            &Path::root("spec").child("devices"),
            "[]v1.Device",
            &json!("x"),
        );
        let err = errs.into_result("s").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(
            err.message
                .contains("cannot unmarshal string into Go struct field spec.devices"),
            "{}",
            err.message
        );
    }
}
