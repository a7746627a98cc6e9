//! ResourceSlice validation (`resource.k8s.io/v1`), with the limits of Kubernetes 1.34 or 1.35+
//! (see [`ValidationRules`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::names;
use super::{Errors, Path, ValidationRules};

/// Devices per slice.
const MAX_DEVICES: usize = 128;
/// Devices per slice when any device has taints or consumes counters (1.35+).
const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Attributes plus capacities per device.
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Length of string and version attribute values.
const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Length of the identifier part of a qualified name.
const MAX_ID_LEN: usize = 32;
/// Length of the domain part of a qualified name (and of a driver name).
const MAX_DOMAIN_LEN: usize = 63;
/// Length of a pool name.
const MAX_POOL_NAME_LEN: usize = 253;
/// Binding conditions and binding failure conditions per device.
const MAX_BINDING_CONDITIONS: usize = 4;
/// Valid values of `capacity.requestPolicy.validValues`.
const MAX_REQUEST_POLICY_VALUES: usize = 10;

impl ValidationRules {
    fn max_taints(self) -> usize {
        match self {
            ValidationRules::V1_34 => 4,
            ValidationRules::V1_35 => 16,
        }
    }

    fn taint_effects(self) -> &'static [&'static str] {
        match self {
            ValidationRules::V1_34 => &["NoExecute", "NoSchedule"],
            ValidationRules::V1_35 => &["NoExecute", "NoSchedule", "None"],
        }
    }
}

/// 1.34: counters over all shared counter sets of a slice.
const V134_MAX_SHARED_COUNTERS: usize = 32;
/// 1.34: counters consumed by one device.
const V134_MAX_COUNTERS_PER_DEVICE: usize = 32;
/// 1.34: counters consumed by all devices of a slice.
const V134_MAX_DEVICE_COUNTERS_PER_SLICE: usize = 1024;
/// 1.35+: counter sets per slice.
const V135_MAX_COUNTER_SETS: usize = 8;
/// 1.35+: counters per counter set, and per counter consumption.
const V135_MAX_COUNTERS_PER_SET: usize = 32;
/// 1.35+: counter consumptions per device.
const V135_MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;

/// Driver names follow the CSI driver name rules: required, at most 63 characters, a DNS
/// subdomain once lowercased.
pub(super) fn validate_driver_name(errs: &mut Errors, driver: &str, path: &Path) {
    if driver.is_empty() {
        errs.required(path, "");
        return;
    }
    if driver.len() > MAX_DOMAIN_LEN {
        errs.too_long(path, MAX_DOMAIN_LEN);
    }
    errs.invalid_each(
        path,
        driver,
        names::dns1123_subdomain(&driver.to_ascii_lowercase()),
    );
}

pub(super) fn validate_pool_name(errs: &mut Errors, pool: &str, path: &Path) {
    if pool.is_empty() {
        errs.required(path, "");
        return;
    }
    if pool.len() > MAX_POOL_NAME_LEN {
        errs.too_long(path, MAX_POOL_NAME_LEN);
    }
    for part in pool.split('/') {
        errs.invalid_each(path, part, names::dns1123_subdomain(part));
    }
}

pub(super) fn validate_device_name(errs: &mut Errors, device: &str, path: &Path) {
    if device.is_empty() {
        errs.required(path, "");
    } else {
        errs.invalid_each(path, device, names::dns1123_label(device));
    }
}

pub(super) fn validate_node_name(errs: &mut Errors, node: &str, path: &Path) {
    errs.invalid_each(path, node, names::dns1123_subdomain(node));
}

fn validate_counter_name(errs: &mut Errors, name: &str, path: &Path) {
    if name.is_empty() {
        errs.required(path, "");
    } else {
        errs.invalid_each(path, name, names::dns1123_label(name));
    }
}

/// Attribute and capacity names: a C identifier of at most 32 characters, optionally prefixed by
/// a DNS subdomain domain of at most 63 characters and `/`.
pub(super) fn validate_qualified_name(errs: &mut Errors, name: &str, path: &Path) {
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [id] => validate_c_identifier(errs, id, path),
        [domain, id, ..] => {
            if domain.is_empty() {
                errs.required(path, "the domain must not be empty");
            } else {
                validate_driver_name(errs, domain, path);
            }
            if id.is_empty() {
                errs.required(path, "the name must not be empty");
            } else {
                validate_c_identifier(errs, id, path);
            }
        }
        [] => validate_c_identifier(errs, "", path),
    }
}

fn validate_c_identifier(errs: &mut Errors, id: &str, path: &Path) {
    if id.len() > MAX_ID_LEN {
        errs.too_long(path, MAX_ID_LEN);
    }
    errs.invalid_each(path, id, names::c_identifier(id));
}

/// Validates a core NodeSelector (used by `spec.nodeSelector` and per-device `nodeSelector`).
pub(super) fn validate_node_selector(
    errs: &mut Errors,
    selector: &Map<String, Value>,
    path: &Path,
) {
    let Some(terms) = errs.array(selector, "nodeSelectorTerms", path) else {
        errs.required(
            &path.child("nodeSelectorTerms"),
            "must have at least one node selector term",
        );
        return;
    };
    let tpath = path.child("nodeSelectorTerms");
    for (i, term) in errs.objects(terms, &tpath) {
        let Some(term) = term else { continue };
        let term_path = tpath.index(i);
        if let Some(exprs) = errs.array(term, "matchExpressions", &term_path) {
            let epath = term_path.child("matchExpressions");
            for (j, expr) in errs.objects(exprs, &epath) {
                let Some(expr) = expr else { continue };
                validate_node_selector_requirement(errs, expr, &epath.index(j), false);
            }
        }
        if let Some(fields) = errs.array(term, "matchFields", &term_path) {
            let fpath = term_path.child("matchFields");
            for (j, expr) in errs.objects(fields, &fpath) {
                let Some(expr) = expr else { continue };
                validate_node_selector_requirement(errs, expr, &fpath.index(j), true);
            }
        }
    }
}

fn validate_node_selector_requirement(
    errs: &mut Errors,
    req: &Map<String, Value>,
    path: &Path,
    field: bool,
) {
    let key = errs.string(req, "key", path).unwrap_or("");
    if field {
        if key != "metadata.name" {
            errs.invalid_str(&path.child("key"), key, "not a valid field selector key");
        }
    } else {
        errs.invalid_each(&path.child("key"), key, names::qualified_name(key));
    }
    let values: Vec<&str> = match errs.array(req, "values", path) {
        Some(values) => errs.strings(values, &path.child("values")),
        None => Vec::new(),
    };
    let operator = errs.string(req, "operator", path).unwrap_or("");
    match operator {
        "In" | "NotIn" => {
            if values.is_empty() {
                errs.required(
                    &path.child("values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                );
            }
        }
        "Exists" | "DoesNotExist" if !field => {
            if !values.is_empty() {
                errs.forbidden(
                    &path.child("values"),
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                );
            }
        }
        "Gt" | "Lt" if !field => {
            if values.len() != 1 {
                errs.required(
                    &path.child("values"),
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                );
            }
        }
        _ => {
            let supported: &[&str] = if field {
                &["In", "NotIn"]
            } else {
                &["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"]
            };
            errs.not_supported(&path.child("operator"), operator, supported);
        }
    }
    if !field {
        let vpath = path.child("values");
        for (i, value) in values.iter().enumerate() {
            errs.invalid_each(&vpath.index(i), value, names::label_value(value));
        }
    }
}

/// `nodeName` / `nodeSelector` / `allNodes` (and, at slice level, `perDeviceNodeSelection`):
/// returns the names of the fields that are set, in backquotes.
fn node_selection(
    errs: &mut Errors,
    obj: &Map<String, Value>,
    path: &Path,
    device_level: bool,
) -> Vec<&'static str> {
    let mut set = Vec::new();
    if let Some(node) = errs.string(obj, "nodeName", path) {
        if node.is_empty() {
            let detail = if device_level {
                "must not be empty"
            } else {
                "must be either unset or set to a non-empty string"
            };
            errs.invalid_str(&path.child("nodeName"), node, detail);
        } else {
            set.push("`nodeName`");
            validate_node_name(errs, node, &path.child("nodeName"));
        }
    }
    if let Some(selector) = errs.object(obj, "nodeSelector", path) {
        set.push("`nodeSelector`");
        let spath = path.child("nodeSelector");
        validate_node_selector(errs, selector, &spath);
        if !device_level {
            let terms = selector
                .get("nodeSelectorTerms")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            if terms != 1 {
                errs.invalid(
                    &spath.child("nodeSelectorTerms"),
                    selector.get("nodeSelectorTerms").unwrap_or(&Value::Null),
                    "must have exactly one node selector term",
                );
            }
        }
    }
    let mut flags = vec!["allNodes"];
    if !device_level {
        flags.push("perDeviceNodeSelection");
    }
    for flag in flags {
        match errs.boolean(obj, flag, path) {
            Some(true) => set.push(if flag == "allNodes" {
                "`allNodes`"
            } else {
                "`perDeviceNodeSelection`"
            }),
            Some(false) => {
                errs.invalid(
                    &path.child(flag),
                    &json!(false),
                    "must be either unset or set to true",
                );
            }
            None => {}
        }
    }
    set
}

pub(super) fn validate(
    errs: &mut Errors,
    obj: &Map<String, Value>,
    old: Option<&Value>,
    rules: ValidationRules,
) {
    let path = Path::root("spec");
    let Some(spec) = errs.object(obj, "spec", &Path::root("")) else {
        errs.required(&path.child("driver"), "");
        errs.required(&path.child("pool").child("name"), "");
        errs.invalid(
            &path.child("pool").child("resourceSliceCount"),
            &json!(0),
            "must be greater than zero",
        );
        errs.required(
            &path,
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        );
        return;
    };
    let driver = errs.string(spec, "driver", &path).unwrap_or("");
    validate_driver_name(errs, driver, &path.child("driver"));
    let pool = errs.object(spec, "pool", &path);
    let pool_path = path.child("pool");
    let pool_name = pool
        .and_then(|p| errs.string(p, "name", &pool_path))
        .unwrap_or("");
    validate_pool_name(errs, pool_name, &pool_path.child("name"));
    let count = pool
        .and_then(|p| errs.int(p, "resourceSliceCount", &pool_path))
        .unwrap_or(0);
    if count <= 0 {
        errs.invalid(
            &pool_path.child("resourceSliceCount"),
            &json!(count),
            "must be greater than zero",
        );
    }
    let generation = pool
        .and_then(|p| errs.int(p, "generation", &pool_path))
        .unwrap_or(0);
    if generation < 0 {
        errs.invalid(
            &pool_path.child("generation"),
            &json!(generation),
            "must be greater than or equal to zero",
        );
    }

    if let Some(old_spec) = old.and_then(|o| o.get("spec")) {
        for (field, new_value) in [
            ("pool.name", json!(pool_name)),
            ("driver", json!(driver)),
            (
                "nodeName",
                spec.get("nodeName").cloned().unwrap_or(Value::Null),
            ),
        ] {
            let old_value = field
                .split('.')
                .try_fold(old_spec, |v, part| v.get(part))
                .cloned()
                .unwrap_or(Value::Null);
            let normalise = |v: Value| if v == json!("") { Value::Null } else { v };
            if normalise(old_value) != normalise(new_value.clone()) {
                let fpath = field.split('.').fold(path.clone(), |p, part| p.child(part));
                errs.invalid(&fpath, &new_value, "field is immutable");
            }
        }
    }

    let set = node_selection(errs, spec, &path, false);
    match set.len() {
        0 => errs.required(
            &path,
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        ),
        1 => {}
        _ => errs.invalid(
            &path,
            &json!(format!("{{{}}}", set.join(", "))),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set",
        ),
    }
    let per_device = spec.get("perDeviceNodeSelection") == Some(&Value::Bool(true));

    let devices = errs.array(spec, "devices", &path);
    let shared = errs.array(spec, "sharedCounters", &path);
    if rules == ValidationRules::V1_35 && devices.is_some() && shared.is_some() {
        errs.invalid(
            &path,
            &json!(""),
            "only one of `sharedCounters` or `devices` is allowed",
        );
    }

    let shared_sets = match shared {
        Some(sets) => validate_shared_counters(errs, sets, &path.child("sharedCounters"), rules),
        None => BTreeMap::new(),
    };
    if let Some(devices) = devices {
        validate_devices(
            errs,
            devices,
            &path.child("devices"),
            per_device,
            &shared_sets,
            rules,
        );
    }
}

/// Validates `sharedCounters`; returns the counter names of each set (for the 1.34 reference
/// checks).
fn validate_shared_counters(
    errs: &mut Errors,
    sets: &[Value],
    path: &Path,
    rules: ValidationRules,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut known = BTreeMap::new();
    if rules == ValidationRules::V1_35 && sets.len() > V135_MAX_COUNTER_SETS {
        errs.too_many(path, sets.len(), V135_MAX_COUNTER_SETS);
        return known;
    }
    let mut total = 0;
    for (i, set) in errs.objects(sets, path) {
        let Some(set) = set else { continue };
        let spath = path.index(i);
        let name = errs.string(set, "name", &spath).unwrap_or("");
        validate_counter_name(errs, name, &spath.child("name"));
        let counters = errs.object(set, "counters", &spath);
        let cpath = spath.child("counters");
        let mut counter_names = BTreeSet::new();
        match counters {
            Some(counters) if !counters.is_empty() => {
                total += counters.len();
                if rules == ValidationRules::V1_35 && counters.len() > V135_MAX_COUNTERS_PER_SET {
                    errs.too_many(&cpath, counters.len(), V135_MAX_COUNTERS_PER_SET);
                } else {
                    validate_counters(errs, counters, &cpath);
                }
                counter_names.extend(counters.keys().cloned());
            }
            _ => errs.required(&cpath, ""),
        }
        if known.contains_key(name) {
            let dup_path = match rules {
                ValidationRules::V1_34 => spath.child("name"),
                ValidationRules::V1_35 => spath.clone(),
            };
            errs.duplicate(&dup_path, name);
        } else {
            known.insert(name.to_owned(), counter_names);
        }
    }
    if rules == ValidationRules::V1_34 && total > V134_MAX_SHARED_COUNTERS {
        errs.invalid(
            path,
            &json!(total),
            &format!(
                "the total number of shared counters must not exceed {V134_MAX_SHARED_COUNTERS}"
            ),
        );
    }
    known
}

/// Counter maps: names are DNS labels, values carry a quantity.
fn validate_counters(errs: &mut Errors, counters: &Map<String, Value>, path: &Path) {
    for (name, counter) in counters {
        let kpath = path.key(name, names::DNS1123_LABEL_MAX);
        errs.invalid_each(&kpath, name, names::dns1123_label(name));
        match counter {
            Value::Object(c) => {
                let _ = errs.quantity(c, "value", &kpath);
            }
            other => errs.decode(&kpath, "v1.Counter", other),
        }
    }
}

fn device_uses(device: &Value, field: &str) -> bool {
    device
        .get(field)
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn validate_devices(
    errs: &mut Errors,
    devices: &[Value],
    path: &Path,
    per_device: bool,
    shared: &BTreeMap<String, BTreeSet<String>>,
    rules: ValidationRules,
) {
    let max = if rules == ValidationRules::V1_35
        && devices
            .iter()
            .any(|d| device_uses(d, "taints") || device_uses(d, "consumesCounters"))
    {
        MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
    } else {
        MAX_DEVICES
    };
    if devices.len() > max {
        errs.too_many(path, devices.len(), max);
        return;
    }
    let mut seen = BTreeSet::new();
    let mut slice_counters = 0;
    for (i, device) in errs.objects(devices, path) {
        let dpath = path.index(i);
        let Some(device) = device else {
            errs.required(&dpath.child("name"), "");
            continue;
        };
        let name = errs.string(device, "name", &dpath).unwrap_or("");
        slice_counters += validate_device(errs, device, &dpath, per_device, shared, rules);
        if !seen.insert(name.to_owned()) {
            errs.duplicate(&dpath, name);
        }
    }
    if rules == ValidationRules::V1_34 && slice_counters > V134_MAX_DEVICE_COUNTERS_PER_SLICE {
        errs.invalid(
            path,
            &json!(slice_counters),
            &format!(
                "the total number of counters in devices must not exceed {V134_MAX_DEVICE_COUNTERS_PER_SLICE}"
            ),
        );
    }
}

/// Validates one device; returns how many counters it consumes.
fn validate_device(
    errs: &mut Errors,
    device: &Map<String, Value>,
    path: &Path,
    per_device: bool,
    shared: &BTreeMap<String, BTreeSet<String>>,
    rules: ValidationRules,
) -> usize {
    let name = errs.string(device, "name", path).unwrap_or("");
    validate_device_name(errs, name, &path.child("name"));
    let multi = errs.boolean(device, "allowMultipleAllocations", path) == Some(true);
    let attributes = errs.object(device, "attributes", path);
    let capacity = errs.object(device, "capacity", path);
    let combined = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if combined > MAX_ATTRIBUTES_AND_CAPACITIES {
        errs.invalid(
            path,
            &json!(combined),
            &format!(
                "the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
            ),
        );
    }
    let key_len = MAX_DOMAIN_LEN + 1 + MAX_ID_LEN;
    if let Some(attributes) = attributes {
        let apath = path.child("attributes");
        for (key, attribute) in attributes {
            // Name errors name the map, value errors the entry (as the real server does).
            let kpath = apath.key(key, key_len);
            validate_qualified_name(errs, key, &apath);
            match attribute {
                Value::Object(a) => validate_attribute(errs, a, &kpath),
                other => errs.decode(&kpath, "v1.DeviceAttribute", other),
            }
        }
    }
    if let Some(capacity) = capacity {
        let cpath = path.child("capacity");
        for (key, cap) in capacity {
            let kpath = cpath.key(key, key_len);
            validate_qualified_name(errs, key, &cpath);
            match cap {
                Value::Object(c) => validate_capacity(errs, c, &kpath, multi),
                other => errs.decode(&kpath, "v1.DeviceCapacity", other),
            }
        }
    }
    if let Some(taints) = errs.array(device, "taints", path) {
        let tpath = path.child("taints");
        if taints.len() > rules.max_taints() {
            errs.too_many(&tpath, taints.len(), rules.max_taints());
        } else {
            for (i, taint) in errs.objects(taints, &tpath) {
                validate_taint(errs, taint.unwrap_or(&Map::new()), &tpath.index(i), rules);
            }
        }
    }
    let consumed = match errs.array(device, "consumesCounters", path) {
        Some(consumptions) => validate_consumptions(errs, consumptions, path, shared, rules),
        None => 0,
    };

    let selection_fields = ["nodeName", "nodeSelector", "allNodes"];
    if per_device {
        let set = node_selection(errs, device, path, true);
        let detail = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when \
                      `perDeviceNodeSelection` is set to true in the ResourceSlice spec";
        match set.len() {
            0 => errs.required(path, detail),
            1 => {}
            _ => errs.invalid(path, &json!(format!("{{{}}}", set.join(", "))), detail),
        }
    } else if selection_fields.iter().any(|f| device.contains_key(*f)) {
        errs.invalid(
            path,
            &Value::Null,
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` \
             is set to true in the ResourceSlice spec",
        );
    }
    validate_binding_conditions(errs, device, path);
    consumed
}

fn validate_attribute(errs: &mut Errors, attribute: &Map<String, Value>, path: &Path) {
    let mut set = 0;
    if errs.boolean(attribute, "bool", path).is_some() {
        set += 1;
    }
    if errs.int(attribute, "int", path).is_some() {
        set += 1;
    }
    if let Some(s) = errs.string(attribute, "string", path) {
        set += 1;
        if s.len() > MAX_ATTRIBUTE_VALUE_LEN {
            errs.too_long(&path.child("string"), MAX_ATTRIBUTE_VALUE_LEN);
        }
    }
    if let Some(v) = errs.string(attribute, "version", path) {
        set += 1;
        if !names::is_semver(v) {
            errs.invalid_str(
                &path.child("version"),
                v,
                "must be a string compatible with semver.org spec 2.0.0",
            );
        }
        if v.len() > MAX_ATTRIBUTE_VALUE_LEN {
            errs.too_long(&path.child("version"), MAX_ATTRIBUTE_VALUE_LEN);
        }
    }
    match set {
        0 => errs.invalid(path, &json!(""), "exactly one value must be specified"),
        1 => {}
        _ => errs.invalid(
            path,
            &Value::Object(attribute.clone()),
            "exactly one value must be specified",
        ),
    }
}

fn validate_capacity(errs: &mut Errors, capacity: &Map<String, Value>, path: &Path, multi: bool) {
    if errs.quantity(capacity, "value", path).is_none() {
        errs.required(&path.child("value"), "");
    }
    let Some(policy) = errs.object(capacity, "requestPolicy", path) else {
        return;
    };
    let ppath = path.child("requestPolicy");
    if !multi {
        errs.forbidden(&ppath, "allowMultipleAllocations must be true");
        return;
    }
    let has_default = errs.quantity(policy, "default", &ppath).is_some();
    let values = errs.array(policy, "validValues", &ppath);
    let range = errs.object(policy, "validRange", &ppath);
    if let Some(values) = values {
        let vpath = ppath.child("validValues");
        for (i, value) in values.iter().enumerate() {
            match value {
                Value::String(s) if !names::is_quantity(s) => errs.bad_quantity(&vpath.index(i)),
                Value::String(_) | Value::Number(_) => {}
                other => errs.decode(&vpath.index(i), "Quantity", other),
            }
        }
    }
    match (values.filter(|v| !v.is_empty()), range) {
        (Some(_), Some(_)) => errs.forbidden(
            &ppath,
            "exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time",
        ),
        (Some(values), None) => {
            if values.len() > MAX_REQUEST_POLICY_VALUES {
                errs.too_many(&ppath.child("validValues"), values.len(), MAX_REQUEST_POLICY_VALUES);
            }
            if !has_default {
                errs.required(&ppath.child("default"), "required when validValues is defined");
            }
        }
        (None, Some(range)) => {
            let rpath = ppath.child("validRange");
            if !has_default {
                errs.required(&ppath.child("default"), "required when validRange is defined");
            }
            if errs.quantity(range, "min", &rpath).is_none() {
                errs.required(&rpath.child("min"), "required when validRange is defined");
            }
            let _ = errs.quantity(range, "max", &rpath);
            let _ = errs.quantity(range, "step", &rpath);
        }
        (None, None) => {}
    }
}

fn validate_taint(
    errs: &mut Errors,
    taint: &Map<String, Value>,
    path: &Path,
    rules: ValidationRules,
) {
    let key = errs.string(taint, "key", path).unwrap_or("");
    errs.invalid_each(&path.child("key"), key, names::qualified_name(key));
    if let Some(value) = errs.string(taint, "value", path).filter(|v| !v.is_empty()) {
        errs.invalid_each(&path.child("value"), value, names::label_value(value));
    }
    let _ = errs.string(taint, "timeAdded", path);
    match errs.string(taint, "effect", path).unwrap_or("") {
        "" => errs.required(&path.child("effect"), ""),
        effect if !rules.taint_effects().contains(&effect) => {
            errs.not_supported(&path.child("effect"), effect, rules.taint_effects());
        }
        _ => {}
    }
}

/// Validates `consumesCounters`; returns the number of counters consumed.
fn validate_consumptions(
    errs: &mut Errors,
    consumptions: &[Value],
    device_path: &Path,
    shared: &BTreeMap<String, BTreeSet<String>>,
    rules: ValidationRules,
) -> usize {
    let path = device_path.child("consumesCounters");
    if rules == ValidationRules::V1_35 && consumptions.len() > V135_MAX_CONSUMPTIONS_PER_DEVICE {
        errs.too_many(&path, consumptions.len(), V135_MAX_CONSUMPTIONS_PER_DEVICE);
        return 0;
    }
    let mut total = 0;
    let mut seen = BTreeSet::new();
    for (i, consumption) in errs.objects(consumptions, &path) {
        let Some(consumption) = consumption else {
            continue;
        };
        let cpath = path.index(i);
        let set = errs.string(consumption, "counterSet", &cpath).unwrap_or("");
        validate_counter_name(errs, set, &cpath.child("counterSet"));
        let counters_path = cpath.child("counters");
        let counters = errs.object(consumption, "counters", &cpath);
        match counters {
            Some(counters) if !counters.is_empty() => {
                total += counters.len();
                if rules == ValidationRules::V1_35 && counters.len() > V135_MAX_COUNTERS_PER_SET {
                    errs.too_many(&counters_path, counters.len(), V135_MAX_COUNTERS_PER_SET);
                } else {
                    validate_counters(errs, counters, &counters_path);
                }
            }
            _ => errs.required(&counters_path, ""),
        }
        if rules == ValidationRules::V1_34 {
            match shared.get(set) {
                None => errs.invalid_str(
                    &cpath.child("counterSet"),
                    set,
                    "must reference a counterSet defined in the ResourceSlice sharedCounters",
                ),
                Some(known) => {
                    for counter in counters.into_iter().flat_map(Map::keys) {
                        if !known.contains(counter) {
                            errs.invalid_str(
                                &counters_path,
                                counter,
                                "must reference a counter defined in the ResourceSlice sharedCounters",
                            );
                        }
                    }
                }
            }
        } else if !seen.insert(set.to_owned()) {
            errs.duplicate(&cpath, set);
        }
    }
    if rules == ValidationRules::V1_34 && total > V134_MAX_COUNTERS_PER_DEVICE {
        errs.invalid(
            device_path,
            &json!(total),
            &format!("the total number of counters must not exceed {V134_MAX_COUNTERS_PER_DEVICE}"),
        );
    }
    total
}

fn validate_binding_conditions(errs: &mut Errors, device: &Map<String, Value>, path: &Path) {
    let mut lists: Vec<Vec<&str>> = Vec::new();
    for field in ["bindingConditions", "bindingFailureConditions"] {
        let fpath = path.child(field);
        let items = match errs.array(device, field, path) {
            Some(items) => errs.strings(items, &fpath),
            None => Vec::new(),
        };
        if items.len() > MAX_BINDING_CONDITIONS {
            errs.too_many(&fpath, items.len(), MAX_BINDING_CONDITIONS);
        } else {
            let mut seen = BTreeSet::new();
            for (i, item) in items.iter().enumerate() {
                errs.invalid_each(&fpath.index(i), item, names::qualified_name(item));
                if !seen.insert(*item) {
                    errs.duplicate(&fpath.index(i), item);
                }
            }
        }
        lists.push(items);
    }
    let (conditions, failures) = (&lists[0], &lists[1]);
    for (i, failure) in failures.iter().enumerate() {
        if conditions.contains(failure) {
            errs.invalid_str(
                &path.child("bindingFailureConditions").index(i),
                failure,
                "bindingFailureConditions must not overlap with bindingConditions",
            );
        }
    }
    if conditions.is_empty() && !failures.is_empty() {
        errs.invalid(
            &path.child("bindingConditions"),
            &json!([]),
            "bindingConditions are required to use bindingFailureConditions",
        );
    }
    if failures.is_empty() && !conditions.is_empty() {
        errs.invalid(
            &path.child("bindingFailureConditions"),
            &json!([]),
            "bindingFailureConditions are required to use bindingConditions",
        );
    }
}

#[cfg(test)]
mod tests;
