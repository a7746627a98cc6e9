//! The fields of each served kind, as the real API server's Go types (Kubernetes 1.37) declare
//! them, and what the server does with a body because of them:
//!
//! - **unknown fields** ([`unknown_fields`], [`prune`]): a field the type does not declare is
//!   dropped (with a `Warning` per field under `fieldValidation=Warn`, the default; refused under
//!   `Strict`, see [`strict_error`]); in a server-side apply it fails the request
//!   ([`apply_error`]);
//! - **round trip through the Go types** ([`normalize`]): `null` values are dropped, empty maps
//!   and lists of `omitempty` fields disappear, and struct-valued fields (not pointers) are
//!   always there, as `{}` at least (a claim's `status`, an Event's `deprecatedSource`);
//! - **atomic structs** ([`is_atomic`]): `+structType=atomic` structs (a `NodeSelector`, an
//!   Event's `regarding`) and raw JSON (`data`, opaque `parameters`) are owned and replaced as a
//!   whole by server-side apply, like atomic lists.
//!
//! A Node's `spec` and `status` are kept as sent (their types are large and nothing here writes
//! them but the demo's node registration).

use serde_json::{Map, Value};

use super::resources::Resource;
use super::status::ApiError;

/// The shape of a value.
#[derive(Debug)]
pub(crate) enum Shape {
    /// A scalar, or a value kept as sent (quantities, times).
    Leaf,
    /// Any JSON, kept as sent and owned as a whole (RawExtension, FieldsV1).
    Any,
    /// A struct: its fields; `atomic` for `+structType=atomic`.
    Struct {
        fields: &'static [Field],
        atomic: bool,
    },
    /// A list of items.
    List(&'static Shape),
    /// A map from strings to values.
    Map(&'static Shape),
}

/// Whether a field is there when a body leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// Absent (a pointer, or an `omitempty` value).
    Optional,
    /// A struct value (not a pointer): always present, `{}` at least.
    Struct,
    /// A time value without `omitempty`: always present, `null` when unset.
    Null,
}

/// One field of a struct.
#[derive(Debug)]
pub(crate) struct Field {
    name: &'static str,
    shape: &'static Shape,
    presence: Presence,
}

const fn f(name: &'static str, shape: &'static Shape) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Optional,
    }
}

/// A struct-valued field (always present).
const fn v(name: &'static str, shape: &'static Shape) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Struct,
    }
}

/// A time field without `omitempty` (always present, `null` when unset).
const fn n(name: &'static str) -> Field {
    Field {
        name,
        shape: &LEAF,
        presence: Presence::Null,
    }
}

const fn s(fields: &'static [Field]) -> Shape {
    Shape::Struct {
        fields,
        atomic: false,
    }
}

const LEAF: Shape = Shape::Leaf;
const ANY: Shape = Shape::Any;
const STRINGS: Shape = Shape::List(&LEAF);
const STRING_MAP: Shape = Shape::Map(&LEAF);

const OWNER_REFERENCE: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    f("name", &LEAF),
    f("uid", &LEAF),
    f("controller", &LEAF),
    f("blockOwnerDeletion", &LEAF),
]);
const MANAGED_FIELDS_ENTRY: Shape = s(&[
    f("manager", &LEAF),
    f("operation", &LEAF),
    f("apiVersion", &LEAF),
    f("time", &LEAF),
    f("fieldsType", &LEAF),
    f("fieldsV1", &ANY),
    f("subresource", &LEAF),
]);
const OBJECT_META: Shape = s(&[
    f("name", &LEAF),
    f("generateName", &LEAF),
    f("namespace", &LEAF),
    f("selfLink", &LEAF),
    f("uid", &LEAF),
    f("resourceVersion", &LEAF),
    f("generation", &LEAF),
    f("creationTimestamp", &LEAF),
    f("deletionTimestamp", &LEAF),
    f("deletionGracePeriodSeconds", &LEAF),
    f("labels", &STRING_MAP),
    f("annotations", &STRING_MAP),
    f("ownerReferences", &Shape::List(&OWNER_REFERENCE)),
    f("finalizers", &STRINGS),
    f("managedFields", &Shape::List(&MANAGED_FIELDS_ENTRY)),
]);

const SELECTOR_REQUIREMENT: Shape =
    s(&[f("key", &LEAF), f("operator", &LEAF), f("values", &STRINGS)]);
const NODE_SELECTOR_TERM: Shape = s(&[
    f("matchExpressions", &Shape::List(&SELECTOR_REQUIREMENT)),
    f("matchFields", &Shape::List(&SELECTOR_REQUIREMENT)),
]);
const NODE_SELECTOR: Shape = Shape::Struct {
    fields: &[f("nodeSelectorTerms", &Shape::List(&NODE_SELECTOR_TERM))],
    atomic: true,
};

// ---- ResourceSlice

const COUNTER: Shape = s(&[f("value", &LEAF)]);
const COUNTER_SET: Shape = s(&[f("name", &LEAF), f("counters", &Shape::Map(&COUNTER))]);
const DEVICE_ATTRIBUTE: Shape = s(&[
    f("int", &LEAF),
    f("bool", &LEAF),
    f("string", &LEAF),
    f("version", &LEAF),
    f("ints", &STRINGS),
    f("bools", &STRINGS),
    f("strings", &STRINGS),
    f("versions", &STRINGS),
]);
const REQUEST_POLICY_RANGE: Shape = s(&[f("min", &LEAF), f("max", &LEAF), f("step", &LEAF)]);
const REQUEST_POLICY: Shape = s(&[
    f("default", &LEAF),
    f("validValues", &STRINGS),
    f("validRange", &REQUEST_POLICY_RANGE),
]);
const DEVICE_CAPACITY: Shape = s(&[f("value", &LEAF), f("requestPolicy", &REQUEST_POLICY)]);
const COUNTER_CONSUMPTION: Shape =
    s(&[f("counterSet", &LEAF), f("counters", &Shape::Map(&COUNTER))]);
const DEVICE_TAINT: Shape = s(&[
    f("key", &LEAF),
    f("value", &LEAF),
    f("effect", &LEAF),
    f("timeAdded", &LEAF),
]);
const DEVICE: Shape = s(&[
    f("name", &LEAF),
    f("attributes", &Shape::Map(&DEVICE_ATTRIBUTE)),
    f("capacity", &Shape::Map(&DEVICE_CAPACITY)),
    f("consumesCounters", &Shape::List(&COUNTER_CONSUMPTION)),
    f("nodeName", &LEAF),
    f("nodeSelector", &NODE_SELECTOR),
    f("allNodes", &LEAF),
    f("taints", &Shape::List(&DEVICE_TAINT)),
    f("bindsToNode", &LEAF),
    f("bindingConditions", &STRINGS),
    f("bindingFailureConditions", &STRINGS),
    f("allowMultipleAllocations", &LEAF),
    f("nodeAllocatableResources", &Shape::Map(&ANY)),
]);
const RESOURCE_POOL: Shape = s(&[
    f("name", &LEAF),
    f("generation", &LEAF),
    f("resourceSliceCount", &LEAF),
]);
const RESOURCE_SLICE_SPEC: Shape = s(&[
    f("driver", &LEAF),
    v("pool", &RESOURCE_POOL),
    f("nodeName", &LEAF),
    f("nodeSelector", &NODE_SELECTOR),
    f("allNodes", &LEAF),
    f("devices", &Shape::List(&DEVICE)),
    f("perDeviceNodeSelection", &LEAF),
    f("sharedCounters", &Shape::List(&COUNTER_SET)),
    f("partitionTypeAttribute", &LEAF),
    f("skipNodeOperations", &STRINGS),
]);
const RESOURCE_SLICE: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    v("spec", &RESOURCE_SLICE_SPEC),
]);

// ---- ResourceClaim, DeviceClass

const CEL_SELECTOR: Shape = s(&[f("expression", &LEAF)]);
const DEVICE_SELECTOR: Shape = s(&[f("cel", &CEL_SELECTOR)]);
const TOLERATION: Shape = s(&[
    f("key", &LEAF),
    f("operator", &LEAF),
    f("value", &LEAF),
    f("effect", &LEAF),
    f("tolerationSeconds", &LEAF),
]);
const CAPACITY_REQUIREMENTS: Shape = s(&[f("requests", &STRING_MAP)]);
const DERIVED_ATTRIBUTE: Shape = s(&[f("name", &LEAF), f("expression", &LEAF)]);
const EXACT_REQUEST: Shape = s(&[
    f("deviceClassName", &LEAF),
    f("selectors", &Shape::List(&DEVICE_SELECTOR)),
    f("allocationMode", &LEAF),
    f("count", &LEAF),
    f("adminAccess", &LEAF),
    f("tolerations", &Shape::List(&TOLERATION)),
    f("capacity", &CAPACITY_REQUIREMENTS),
    f("derivedAttributes", &Shape::List(&DERIVED_ATTRIBUTE)),
]);
const SUB_REQUEST: Shape = s(&[
    f("name", &LEAF),
    f("deviceClassName", &LEAF),
    f("selectors", &Shape::List(&DEVICE_SELECTOR)),
    f("allocationMode", &LEAF),
    f("count", &LEAF),
    f("tolerations", &Shape::List(&TOLERATION)),
    f("capacity", &CAPACITY_REQUIREMENTS),
    f("derivedAttributes", &Shape::List(&DERIVED_ATTRIBUTE)),
]);
const DEVICE_REQUEST: Shape = s(&[
    f("name", &LEAF),
    f("exactly", &EXACT_REQUEST),
    f("firstAvailable", &Shape::List(&SUB_REQUEST)),
]);
const DEVICE_CONSTRAINT: Shape = s(&[
    f("requests", &STRINGS),
    f("matchAttribute", &LEAF),
    f("distinctAttribute", &LEAF),
]);
const OPAQUE_CONFIG: Shape = s(&[f("driver", &LEAF), f("parameters", &ANY)]);
const CLAIM_CONFIG: Shape = s(&[f("requests", &STRINGS), f("opaque", &OPAQUE_CONFIG)]);
const DEVICE_CLAIM: Shape = s(&[
    f("requests", &Shape::List(&DEVICE_REQUEST)),
    f("constraints", &Shape::List(&DEVICE_CONSTRAINT)),
    f("config", &Shape::List(&CLAIM_CONFIG)),
]);
const CLAIM_SPEC: Shape = s(&[v("devices", &DEVICE_CLAIM)]);
const ALLOCATION_RESULT_DEVICE: Shape = s(&[
    f("request", &LEAF),
    f("driver", &LEAF),
    f("pool", &LEAF),
    f("device", &LEAF),
    f("adminAccess", &LEAF),
    f("tolerations", &Shape::List(&TOLERATION)),
    f("bindingConditions", &STRINGS),
    f("bindingFailureConditions", &STRINGS),
    f("shareID", &LEAF),
    f("consumedCapacity", &STRING_MAP),
    f("skipNodeOperations", &STRINGS),
]);
const ALLOCATION_CONFIG: Shape = s(&[
    f("source", &LEAF),
    f("requests", &STRINGS),
    f("opaque", &OPAQUE_CONFIG),
]);
const DEVICE_ALLOCATION: Shape = s(&[
    f("results", &Shape::List(&ALLOCATION_RESULT_DEVICE)),
    f("config", &Shape::List(&ALLOCATION_CONFIG)),
]);
const ALLOCATION: Shape = s(&[
    v("devices", &DEVICE_ALLOCATION),
    f("nodeSelector", &NODE_SELECTOR),
    f("allocationTimestamp", &LEAF),
]);
const CONSUMER: Shape = s(&[
    f("apiGroup", &LEAF),
    f("resource", &LEAF),
    f("name", &LEAF),
    f("uid", &LEAF),
]);
const CONDITION: Shape = s(&[
    f("type", &LEAF),
    f("status", &LEAF),
    f("observedGeneration", &LEAF),
    f("lastTransitionTime", &LEAF),
    f("reason", &LEAF),
    f("message", &LEAF),
]);
const NETWORK_DATA: Shape = s(&[
    f("interfaceName", &LEAF),
    f("ips", &STRINGS),
    f("hardwareAddress", &LEAF),
]);
const DEVICE_STATUS: Shape = s(&[
    f("driver", &LEAF),
    f("pool", &LEAF),
    f("device", &LEAF),
    f("shareID", &LEAF),
    f("conditions", &Shape::List(&CONDITION)),
    f("data", &ANY),
    f("networkData", &NETWORK_DATA),
]);
const CLAIM_STATUS: Shape = s(&[
    f("allocation", &ALLOCATION),
    f("reservedFor", &Shape::List(&CONSUMER)),
    f("devices", &Shape::List(&DEVICE_STATUS)),
]);
const RESOURCE_CLAIM: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    v("spec", &CLAIM_SPEC),
    v("status", &CLAIM_STATUS),
]);
const CLASS_CONFIG: Shape = s(&[f("opaque", &OPAQUE_CONFIG)]);
const DEVICE_CLASS_SPEC: Shape = s(&[
    f("selectors", &Shape::List(&DEVICE_SELECTOR)),
    f("config", &Shape::List(&CLASS_CONFIG)),
    f("extendedResourceName", &LEAF),
]);
const DEVICE_CLASS: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    v("spec", &DEVICE_CLASS_SPEC),
]);

// ---- Node, Event, Lease

const NODE: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    f("spec", &ANY),
    f("status", &ANY),
]);
const OBJECT_REFERENCE: Shape = Shape::Struct {
    fields: &[
        f("kind", &LEAF),
        f("namespace", &LEAF),
        f("name", &LEAF),
        f("uid", &LEAF),
        f("apiVersion", &LEAF),
        f("resourceVersion", &LEAF),
        f("fieldPath", &LEAF),
    ],
    atomic: true,
};
const EVENT_SERIES: Shape = s(&[f("count", &LEAF), f("lastObservedTime", &LEAF)]);
const EVENT_SOURCE: Shape = s(&[f("component", &LEAF), f("host", &LEAF)]);
const EVENT: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    f("eventTime", &LEAF),
    f("series", &EVENT_SERIES),
    f("reportingController", &LEAF),
    f("reportingInstance", &LEAF),
    f("action", &LEAF),
    f("reason", &LEAF),
    v("regarding", &OBJECT_REFERENCE),
    f("related", &OBJECT_REFERENCE),
    f("note", &LEAF),
    f("type", &LEAF),
    v("deprecatedSource", &EVENT_SOURCE),
    n("deprecatedFirstTimestamp"),
    n("deprecatedLastTimestamp"),
    f("deprecatedCount", &LEAF),
]);
const LEASE_SPEC: Shape = s(&[
    f("holderIdentity", &LEAF),
    f("leaseDurationSeconds", &LEAF),
    f("acquireTime", &LEAF),
    f("renewTime", &LEAF),
    f("leaseTransitions", &LEAF),
    f("strategy", &LEAF),
    f("preferredHolder", &LEAF),
]);
const LEASE: Shape = s(&[
    f("apiVersion", &LEAF),
    f("kind", &LEAF),
    v("metadata", &OBJECT_META),
    v("spec", &LEASE_SPEC),
]);

/// The shape of a whole object of `resource`.
pub(crate) fn of(resource: Resource) -> &'static Shape {
    match resource {
        Resource::ResourceSlices => &RESOURCE_SLICE,
        Resource::ResourceClaims => &RESOURCE_CLAIM,
        Resource::DeviceClasses => &DEVICE_CLASS,
        Resource::Nodes => &NODE,
        Resource::Events => &EVENT,
        Resource::Leases => &LEASE,
    }
}

impl Shape {
    fn field(&self, name: &str) -> Option<&'static Field> {
        match self {
            Shape::Struct { fields, .. } => fields.iter().find(|f| f.name == name),
            _ => None,
        }
    }
}

/// The shape at `path` (field names and map keys; list items take no element), if the schema
/// declares it.
pub(crate) fn shape_at(resource: Resource, path: &[&str]) -> Option<&'static Shape> {
    let mut shape = of(resource);
    for name in path {
        while let Shape::List(item) = shape {
            shape = item;
        }
        shape = match shape {
            Shape::Struct { .. } => shape.field(name)?.shape,
            Shape::Map(value) => value,
            Shape::Any => return Some(&ANY),
            Shape::Leaf | Shape::List(_) => return None,
        };
    }
    Some(shape)
}

/// Whether the object value at `path` is owned and replaced as a whole (an atomic struct or raw
/// JSON).
pub(crate) fn is_atomic(resource: Resource, path: &[&str]) -> bool {
    matches!(
        shape_at(resource, path),
        Some(Shape::Any | Shape::Struct { atomic: true, .. })
    )
}

/// Whether the schema knows `path` as a struct or map whose members are owned one by one.
pub(crate) fn is_granular(resource: Resource, path: &[&str]) -> bool {
    matches!(
        shape_at(resource, path),
        Some(Shape::Map(_) | Shape::Struct { atomic: false, .. })
    )
}

/// Whether the struct at `path` exists in an object the server builds from nothing (a chain of
/// struct values from the root: `spec`, a slice's `spec.pool`, a claim's `status`).
pub(crate) fn always_present(resource: Resource, path: &[&str]) -> bool {
    let mut shape = of(resource);
    for name in path {
        let Some(field) = shape.field(name) else {
            return false;
        };
        if field.presence != Presence::Struct {
            return false;
        }
        shape = field.shape;
    }
    !path.is_empty()
}

/// One step of a path to a value: a field or map key, or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A struct field or map key.
    Key(String),
    /// A list item.
    Index(usize),
}

fn render(path: &[Step], leading_dot: bool) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if leading_dot || !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

fn visit_unknown(value: &Value, shape: &Shape, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match (shape, value) {
        (Shape::Struct { fields, .. }, Value::Object(map)) => {
            for (k, child) in map {
                path.push(Step::Key(k.clone()));
                match fields.iter().find(|f| f.name == k) {
                    Some(field) => visit_unknown(child, field.shape, path, out),
                    None => out.push(path.clone()),
                }
                path.pop();
            }
        }
        (Shape::Map(item), Value::Object(map)) => {
            for (k, child) in map {
                path.push(Step::Key(k.clone()));
                visit_unknown(child, item, path, out);
                path.pop();
            }
        }
        (Shape::List(item), Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                path.push(Step::Index(i));
                visit_unknown(child, item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn unknown_paths(resource: Resource, obj: &Value) -> Vec<Vec<Step>> {
    let mut out = Vec::new();
    visit_unknown(obj, of(resource), &mut Vec::new(), &mut out);
    out
}

/// The fields of `obj` that `resource`'s type does not declare, as the API server names them in
/// warnings and strict decoding errors (`spec.devices[0].foo`).
pub(crate) fn unknown_fields(resource: Resource, obj: &Value) -> Vec<String> {
    unknown_paths(resource, obj)
        .iter()
        .map(|p| render(p, false))
        .collect()
}

/// The `400 BadRequest` of a body with unknown fields under `fieldValidation=Strict`.
pub(crate) fn strict_error(resource: Resource, unknown: &[String]) -> ApiError {
    let info = resource.info();
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", "),
        kind = info.kind,
        version = info.version,
    ))
}

/// The error of a server-side apply whose configuration has fields the type does not declare
/// (the real server answers 500, whatever `fieldValidation` says), if it has any.
pub(crate) fn apply_error(
    resource: Resource,
    namespace: Option<&str>,
    name: &str,
    config: &Value,
) -> Option<ApiError> {
    let unknown = unknown_paths(resource, config);
    if unknown.is_empty() {
        return None;
    }
    let info = resource.info();
    let group_version = resource.api_version();
    let errors: Vec<String> = unknown
        .iter()
        .map(|p| format!("{}: field not declared in schema", render(p, true)))
        .collect();
    let errors = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("errors:\n  {}", errors.join("\n  "))
    };
    Some(ApiError::internal_without_reason(format!(
        "failed to create typed patch object ({}/{name}; {group_version}, Kind={}): {errors}",
        namespace.unwrap_or(""),
        info.kind
    )))
}

fn drop_unknown(value: &mut Value, shape: &Shape) {
    match (shape, value) {
        (Shape::Struct { fields, .. }, Value::Object(map)) => {
            map.retain(|k, _| fields.iter().any(|f| f.name == k));
            for field in *fields {
                if let Some(child) = map.get_mut(field.name) {
                    drop_unknown(child, field.shape);
                }
            }
        }
        (Shape::Map(item), Value::Object(map)) => {
            for child in map.values_mut() {
                drop_unknown(child, item);
            }
        }
        (Shape::List(item), Value::Array(items)) => {
            for child in items {
                drop_unknown(child, item);
            }
        }
        _ => {}
    }
}

/// Removes the fields `resource`'s type does not declare (what decoding into the Go type does).
pub(crate) fn prune(resource: Resource, obj: &mut Value) {
    drop_unknown(obj, of(resource));
}

fn normalize_value(value: &mut Value, shape: &Shape) {
    match (shape, value) {
        (Shape::Struct { fields, .. }, Value::Object(map)) => {
            map.retain(|_, v| !v.is_null());
            for field in *fields {
                match field.presence {
                    Presence::Struct if !map.contains_key(field.name) => {
                        map.insert(field.name.to_owned(), Value::Object(Map::new()));
                    }
                    Presence::Null if !map.contains_key(field.name) => {
                        map.insert(field.name.to_owned(), Value::Null);
                    }
                    _ => {}
                }
                let Some(child) = map.get_mut(field.name) else {
                    continue;
                };
                normalize_value(child, field.shape);
                let empty_collection = match (field.shape, &*child) {
                    (Shape::Map(_), Value::Object(m)) => m.is_empty(),
                    (Shape::List(_), Value::Array(a)) => a.is_empty(),
                    _ => false,
                };
                if empty_collection {
                    map.remove(field.name);
                }
            }
        }
        (Shape::Map(item), Value::Object(map)) => {
            map.retain(|_, v| !v.is_null());
            for child in map.values_mut() {
                normalize_value(child, item);
            }
        }
        (Shape::List(item), Value::Array(items)) => {
            for child in items {
                normalize_value(child, item);
            }
        }
        _ => {}
    }
}

/// The object as the real server stores and returns it after decoding it into its Go type:
/// `null` values dropped, empty maps and lists gone, struct values present (and time values
/// without `omitempty` as `null`: an Event's `deprecatedFirstTimestamp`).
pub(crate) fn normalize(resource: Resource, obj: &mut Value) {
    normalize_value(obj, of(resource));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_are_named_and_pruned() {
        let mut slice = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s", "colour": "red"},
            "spec": {"driver": "d", "unknownField": 1,
                     "devices": [{"name": "a", "alsoUnknown": true,
                                  "attributes": {"x": {"int": 1, "float": 2.5}}}]}
        });
        assert_eq!(
            unknown_fields(Resource::ResourceSlices, &slice),
            [
                "metadata.colour",
                "spec.devices[0].alsoUnknown",
                "spec.devices[0].attributes.x.float",
                "spec.unknownField"
            ]
        );
        prune(Resource::ResourceSlices, &mut slice);
        assert!(unknown_fields(Resource::ResourceSlices, &slice).is_empty());
        assert_eq!(
            slice["spec"]["devices"][0]["attributes"]["x"],
            json!({"int": 1})
        );
        // Raw JSON is never pruned.
        let claim = json!({"status": {"devices": [{"data": {"anything": {"goes": 1}}}]},
                           "spec": {"devices": {"config": [{"opaque": {"parameters": {"a": 1}}}]}}});
        assert!(unknown_fields(Resource::ResourceClaims, &claim).is_empty());
    }

    #[test]
    fn apply_errors_name_the_fields_like_the_api_server() {
        let config = json!({"spec": {"foo": 1}});
        let err = apply_error(Resource::ResourceSlices, None, "s", &config).unwrap();
        assert_eq!(err.code, 500);
        assert_eq!(
            err.message,
            "failed to create typed patch object (/s; resource.k8s.io/v1, Kind=ResourceSlice): \
             .spec.foo: field not declared in schema"
        );
        let two = json!({"spec": {"foo": 1, "devices": [{"bar": 2}]}});
        let err = apply_error(Resource::ResourceSlices, None, "s", &two).unwrap();
        assert!(
            err.message.ends_with(
                "errors:\n  .spec.devices[0].bar: field not declared in schema\n  .spec.foo: field not declared in schema"
            ),
            "{}",
            err.message
        );
        assert!(apply_error(Resource::ResourceSlices, None, "s", &json!({"spec": {}})).is_none());
    }

    #[test]
    fn normalize_drops_nulls_and_empty_collections_and_adds_struct_values() {
        let mut claim = json!({
            "metadata": {"name": "c", "labels": {}},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "shareID": null, "consumedCapacity": {}}
            ]}}}
        });
        normalize(Resource::ResourceClaims, &mut claim);
        assert_eq!(
            claim["status"]["allocation"]["devices"]["results"][0],
            json!({"request": "r"})
        );
        assert!(claim["metadata"].get("labels").is_none());
        let mut created = json!({"metadata": {"name": "c"}, "spec": {}});
        normalize(Resource::ResourceClaims, &mut created);
        assert_eq!(created["status"], json!({}));
        assert_eq!(created["spec"], json!({"devices": {}}));
        let mut event = json!({"metadata": {"name": "e"}, "note": null});
        normalize(Resource::Events, &mut event);
        assert_eq!(
            event,
            json!({"metadata": {"name": "e"}, "regarding": {}, "deprecatedSource": {},
                   "deprecatedFirstTimestamp": null, "deprecatedLastTimestamp": null})
        );
    }

    #[test]
    fn atomic_and_always_present_structs() {
        let r = Resource::ResourceClaims;
        assert!(is_atomic(r, &["status", "allocation", "nodeSelector"]));
        assert!(is_atomic(r, &["status", "devices", "data"]));
        assert!(!is_atomic(r, &["status", "devices", "conditions"]));
        assert!(is_atomic(Resource::Events, &["regarding"]));
        assert!(is_granular(
            Resource::ResourceSlices,
            &["metadata", "labels"]
        ));
        assert!(is_granular(
            Resource::ResourceSlices,
            &["spec", "devices", "attributes"]
        ));
        assert!(always_present(r, &["status"]));
        assert!(always_present(r, &["spec", "devices"]));
        assert!(!always_present(r, &["status", "allocation"]));
        assert!(always_present(Resource::ResourceSlices, &["spec", "pool"]));
        assert!(!always_present(
            Resource::ResourceSlices,
            &["metadata", "labels"]
        ));
    }
}
