//! ResourceClaim and DeviceClass validation and ResourceClaim defaulting.
//!
//! CEL expressions are checked for size only, and an empty one fails like the real server's
//! compiler fails it: the test API server does not compile them (the real server does, and the
//! controller's admission webhook checks them against the driver's attributes).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::event::timestamp;
use super::names;
use super::slice::{
    validate_device_name, validate_driver_name, validate_pool_name, validate_qualified_name,
};
use super::{Errors, Path};

const MAX_REQUESTS: usize = 32;
const MAX_SUBREQUESTS: usize = 8;
const MAX_SELECTORS: usize = 32;
const MAX_CONSTRAINTS: usize = 32;
const MAX_CONFIGS: usize = 32;
const MAX_TOLERATIONS: usize = 16;
const MAX_CEL_LEN: usize = 10 * 1024;
const MAX_OPAQUE_PARAMETERS: usize = 10 * 1024;
const MAX_RESERVED_FOR: usize = 256;
const MAX_RESULTS: usize = 32;
const MAX_DEVICE_CONDITIONS: usize = 8;
const MAX_DEVICE_DATA: usize = 10 * 1024;
/// Longest condition reason and message (`metav1.Condition`).
const MAX_CONDITION_REASON: usize = 1024;
const MAX_CONDITION_MESSAGE: usize = 32 * 1024;
/// What the real server's CEL compiler says about an empty expression.
const EMPTY_CEL: &str = "compilation failed: ERROR: <input>:1:0: Syntax error: mismatched input \
     '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, \
     NUM_UINT, STRING, BYTES, IDENTIFIER}";

fn default_request(request: &mut Value) {
    let Some(map) = request.as_object_mut() else {
        return;
    };
    let mode = map
        .entry("allocationMode")
        .or_insert_with(|| json!("ExactCount"));
    // A count of 0 is the Go zero value: unset, so defaulted too.
    if mode == "ExactCount"
        && map
            .get("count")
            .is_none_or(|c| c.is_null() || *c == json!(0))
    {
        map.insert("count".into(), json!(1));
    }
    if let Some(tolerations) = map.get_mut("tolerations").and_then(Value::as_array_mut) {
        for toleration in tolerations.iter_mut().filter_map(Value::as_object_mut) {
            toleration
                .entry("operator")
                .or_insert_with(|| json!("Equal"));
        }
    }
}

/// Defaults of a ResourceClaim's requests.
pub(super) fn default_claim(obj: &mut Value) {
    let Some(requests) = obj
        .pointer_mut("/spec/devices/requests")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for request in requests {
        if let Some(exactly) = request.get_mut("exactly").filter(|e| e.is_object()) {
            default_request(exactly);
        }
        if let Some(subs) = request
            .get_mut("firstAvailable")
            .and_then(Value::as_array_mut)
        {
            subs.iter_mut().for_each(default_request);
        }
    }
}

pub(super) fn validate_claim(errs: &mut Errors, obj: &Map<String, Value>, old: Option<&Value>) {
    let path = Path::root("spec");
    if let Some(old) = old {
        let new_spec = obj.get("spec").unwrap_or(&Value::Null);
        let old_spec = old.get("spec").unwrap_or(&Value::Null);
        if new_spec != old_spec {
            errs.invalid(&path, new_spec, "field is immutable");
        }
        return;
    }
    let Some(spec) = errs.object(obj, "spec", &Path::root("")) else {
        return;
    };
    let Some(devices) = errs.object(spec, "devices", &path) else {
        return;
    };
    let dpath = path.child("devices");
    let mut request_names = BTreeSet::new();
    if let Some(requests) = errs.array(devices, "requests", &dpath) {
        let rpath = dpath.child("requests");
        if requests.len() > MAX_REQUESTS {
            errs.too_many(&rpath, requests.len(), MAX_REQUESTS);
        } else {
            for (i, request) in errs.objects(requests, &rpath) {
                let Some(request) = request else { continue };
                let name = validate_request(errs, request, &rpath.index(i), &mut request_names);
                if !request_names.insert(name.clone()) {
                    errs.duplicate(&rpath.index(i), &name);
                }
            }
        }
    }
    if let Some(constraints) = errs.array(devices, "constraints", &dpath) {
        let cpath = dpath.child("constraints");
        if constraints.len() > MAX_CONSTRAINTS {
            errs.too_many(&cpath, constraints.len(), MAX_CONSTRAINTS);
        } else {
            for (i, constraint) in errs.objects(constraints, &cpath) {
                let Some(constraint) = constraint else {
                    continue;
                };
                validate_request_refs(errs, constraint, &cpath.index(i), &request_names);
                let mut one = false;
                for field in ["matchAttribute", "distinctAttribute"] {
                    if let Some(name) = errs.string(constraint, field, &cpath.index(i)) {
                        one = true;
                        validate_fully_qualified_name(errs, name, &cpath.index(i).child(field));
                    }
                }
                if !one {
                    errs.required(&cpath.index(i).child("matchAttribute"), "");
                }
            }
        }
    }
    if let Some(configs) = errs.array(devices, "config", &dpath) {
        let cpath = dpath.child("config");
        if configs.len() > MAX_CONFIGS {
            errs.too_many(&cpath, configs.len(), MAX_CONFIGS);
        } else {
            for (i, config) in errs.objects(configs, &cpath) {
                let Some(config) = config else { continue };
                validate_request_refs(errs, config, &cpath.index(i), &request_names);
                validate_opaque(errs, config, &cpath.index(i));
            }
        }
    }
}

/// Validates one request; returns its name. Subrequest names are added as `request/sub`.
fn validate_request(
    errs: &mut Errors,
    request: &Map<String, Value>,
    path: &Path,
    names_out: &mut BTreeSet<String>,
) -> String {
    let name = errs.string(request, "name", path).unwrap_or("").to_owned();
    validate_dns_label(errs, &name, &path.child("name"));
    let exactly = errs.object(request, "exactly", path);
    let first = errs
        .array(request, "firstAvailable", path)
        .filter(|f| !f.is_empty());
    match (exactly, first) {
        (None, None) => errs.required(
            path,
            "exactly one of `exactly` or `firstAvailable` is required",
        ),
        (Some(_), Some(_)) => errs.invalid(
            path,
            &Value::Null,
            "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
        ),
        (Some(exactly), None) => validate_exact(errs, exactly, &path.child("exactly")),
        (None, Some(subs)) => {
            let spath = path.child("firstAvailable");
            if subs.len() > MAX_SUBREQUESTS {
                errs.too_many(&spath, subs.len(), MAX_SUBREQUESTS);
                return name;
            }
            let mut seen = BTreeSet::new();
            for (i, sub) in errs.objects(subs, &spath) {
                let Some(sub) = sub else { continue };
                let sub_name = errs
                    .string(sub, "name", &spath.index(i))
                    .unwrap_or("")
                    .to_owned();
                validate_dns_label(errs, &sub_name, &spath.index(i).child("name"));
                validate_exact(errs, sub, &spath.index(i));
                if !seen.insert(sub_name.clone()) {
                    errs.duplicate(&spath.index(i), &sub_name);
                }
                names_out.insert(format!("{name}/{sub_name}"));
            }
        }
    }
    name
}

/// An attribute name with its domain (`gpu.nvidia.com/nvlinkDomain`), as constraints name them.
fn validate_fully_qualified_name(errs: &mut Errors, name: &str, path: &Path) {
    if name.contains('/') {
        validate_qualified_name(errs, name, path);
    } else {
        errs.invalid_str(
            path,
            name,
            "a fully qualified name must be a domain and a name separated by a slash",
        );
    }
}

/// Quantities of a map (capacity requests, consumed capacity): an unparsable one is a decode
/// error.
fn validate_quantities(errs: &mut Errors, parent: &Map<String, Value>, name: &str, path: &Path) {
    if let Some(map) = errs.object(parent, name, path) {
        let mpath = path.child(name);
        for key in map.keys() {
            let _ = errs.quantity(map, key, &mpath);
        }
    }
}

/// `metav1.Condition`s (`ValidateConditions`): a label-name type, unique; status `True`,
/// `False` or `Unknown`; a transition time; a reason in CamelCase-like form; bounded lengths.
fn validate_conditions(errs: &mut Errors, conditions: &[Value], path: &Path) {
    let mut types = BTreeSet::new();
    for (i, condition) in errs.objects(conditions, path) {
        let Some(condition) = condition else { continue };
        let cp = path.index(i);
        let kind = errs.string(condition, "type", &cp).unwrap_or("");
        if !types.insert(kind.to_owned()) {
            errs.duplicate(&cp.child("type"), kind);
        }
        if kind.is_empty() {
            errs.required(&cp.child("type"), "");
        } else {
            errs.invalid_each(&cp.child("type"), kind, names::qualified_name(kind));
        }
        let status = errs.string(condition, "status", &cp).unwrap_or("");
        if !matches!(status, "True" | "False" | "Unknown") {
            errs.not_supported(&cp.child("status"), status, &["False", "True", "Unknown"]);
        }
        if let Some(generation) = errs.int(condition, "observedGeneration", &cp)
            && generation < 0
        {
            errs.invalid(
                &cp.child("observedGeneration"),
                &json!(generation),
                "must be greater than or equal to zero",
            );
        }
        if condition
            .get("lastTransitionTime")
            .is_none_or(Value::is_null)
        {
            errs.required(&cp.child("lastTransitionTime"), "must be set");
        } else {
            let _ = timestamp(errs, condition, "lastTransitionTime", &cp);
        }
        let reason = errs.string(condition, "reason", &cp).unwrap_or("");
        if reason.is_empty() {
            errs.required(&cp.child("reason"), "must be set");
        } else {
            if !is_condition_reason(reason) {
                errs.invalid_str(
                    &cp.child("reason"),
                    reason,
                    "a condition reason must start with alphabetic character, optionally followed \
                     by a string of alphanumeric characters or '_,:', and must end with an \
                     alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  \
                     or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is \
                     '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
                );
            }
            if reason.len() > MAX_CONDITION_REASON {
                errs.too_long(&cp.child("reason"), MAX_CONDITION_REASON);
            }
        }
        if errs
            .string(condition, "message", &cp)
            .is_some_and(|m| m.len() > MAX_CONDITION_MESSAGE)
        {
            errs.too_long(&cp.child("message"), MAX_CONDITION_MESSAGE);
        }
    }
}

/// `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`
fn is_condition_reason(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    let last = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    match b {
        [] => false,
        [first] => first.is_ascii_alphabetic(),
        [first, middle @ .., end] => {
            first.is_ascii_alphabetic() && middle.iter().all(inner) && last(end)
        }
    }
}

fn validate_dns_label(errs: &mut Errors, name: &str, path: &Path) {
    if name.is_empty() {
        errs.required(path, "");
    } else {
        errs.invalid_each(path, name, names::dns1123_label(name));
    }
}

fn validate_exact(errs: &mut Errors, request: &Map<String, Value>, path: &Path) {
    let class = errs.string(request, "deviceClassName", path).unwrap_or("");
    if class.is_empty() {
        errs.required(&path.child("deviceClassName"), "");
    } else {
        errs.invalid_each(
            &path.child("deviceClassName"),
            class,
            names::dns1123_subdomain(class),
        );
    }
    validate_selectors(errs, request, path);
    if let Some(capacity) = errs.object(request, "capacity", path) {
        validate_quantities(errs, capacity, "requests", &path.child("capacity"));
    }
    let count = errs.int(request, "count", path);
    match errs.string(request, "allocationMode", path).unwrap_or("") {
        "ExactCount" => {
            if count.unwrap_or(0) <= 0 {
                errs.invalid(
                    &path.child("count"),
                    &json!(count.unwrap_or(0)),
                    "must be greater than zero",
                );
            }
        }
        "All" => {
            if let Some(count) = count.filter(|c| *c != 0) {
                errs.invalid(
                    &path.child("count"),
                    &json!(count),
                    "must not be specified when allocationMode is 'All'",
                );
            }
        }
        other => errs.not_supported(&path.child("allocationMode"), other, &["All", "ExactCount"]),
    }
    let _ = errs.boolean(request, "adminAccess", path);
    if let Some(tolerations) = errs.array(request, "tolerations", path) {
        let tpath = path.child("tolerations");
        if tolerations.len() > MAX_TOLERATIONS {
            errs.too_many(&tpath, tolerations.len(), MAX_TOLERATIONS);
            return;
        }
        for (i, toleration) in errs.objects(tolerations, &tpath) {
            let Some(toleration) = toleration else {
                continue;
            };
            let tp = tpath.index(i);
            if let Some(key) = errs
                .string(toleration, "key", &tp)
                .filter(|k| !k.is_empty())
            {
                errs.invalid_each(&tp.child("key"), key, names::qualified_name(key));
            }
            let value = errs.string(toleration, "value", &tp).unwrap_or("");
            match errs.string(toleration, "operator", &tp).unwrap_or("") {
                "Exists" => {
                    if !value.is_empty() {
                        errs.invalid_str(
                            &tp.child("value"),
                            value,
                            "must be empty for operator `Exists`",
                        );
                    }
                }
                "Equal" => errs.invalid_each(&tp.child("value"), value, names::label_value(value)),
                "" => errs.required(&tp.child("operator"), ""),
                other => errs.not_supported(&tp.child("operator"), other, &["Equal", "Exists"]),
            }
        }
    }
}

fn validate_selectors(errs: &mut Errors, obj: &Map<String, Value>, path: &Path) {
    let Some(selectors) = errs.array(obj, "selectors", path) else {
        return;
    };
    let spath = path.child("selectors");
    if selectors.len() > MAX_SELECTORS {
        errs.too_many(&spath, selectors.len(), MAX_SELECTORS);
        return;
    }
    for (i, selector) in errs.objects(selectors, &spath) {
        let sp = spath.index(i);
        let Some(cel) = selector.and_then(|s| errs.object(s, "cel", &sp)) else {
            errs.required(&sp.child("cel"), "");
            continue;
        };
        let cp = sp.child("cel");
        match errs.string(cel, "expression", &cp) {
            None | Some("") => errs.invalid_str(&cp.child("expression"), "", EMPTY_CEL),
            Some(expr) if expr.len() > MAX_CEL_LEN => {
                errs.too_long(&cp.child("expression"), MAX_CEL_LEN);
            }
            Some(_) => {}
        }
    }
}

fn validate_request_refs(
    errs: &mut Errors,
    obj: &Map<String, Value>,
    path: &Path,
    known: &BTreeSet<String>,
) {
    let Some(requests) = errs.array(obj, "requests", path) else {
        return;
    };
    let rpath = path.child("requests");
    for (i, request) in errs.strings(requests, &rpath).into_iter().enumerate() {
        if !known.contains(request) {
            errs.invalid_str(
                &rpath.index(i),
                request,
                "must be the name of a request in the claim or the name of a request and a \
                 subrequest separated by '/'",
            );
        }
    }
}

fn validate_opaque(errs: &mut Errors, config: &Map<String, Value>, path: &Path) {
    let Some(opaque) = errs.object(config, "opaque", path) else {
        errs.required(&path.child("opaque"), "");
        return;
    };
    let opath = path.child("opaque");
    let driver = errs.string(opaque, "driver", &opath).unwrap_or("");
    validate_driver_name(errs, driver, &opath.child("driver"));
    validate_raw_object(
        errs,
        opaque.get("parameters"),
        &opath.child("parameters"),
        MAX_OPAQUE_PARAMETERS,
    );
}

fn validate_raw_object(errs: &mut Errors, value: Option<&Value>, path: &Path, max: usize) {
    match value {
        None | Some(Value::Null) => errs.required(path, ""),
        Some(Value::Object(_)) => {
            let len = value.map_or(0, |v| v.to_string().len());
            if len > max {
                errs.too_long(path, max);
            }
        }
        Some(_) => errs.invalid_str(path, "<value omitted>", "must be a valid JSON object"),
    }
}

pub(super) fn validate_device_class(errs: &mut Errors, obj: &Map<String, Value>) {
    let path = Path::root("spec");
    let Some(spec) = errs.object(obj, "spec", &Path::root("")) else {
        return;
    };
    validate_selectors(errs, spec, &path);
    if let Some(configs) = errs.array(spec, "config", &path) {
        let cpath = path.child("config");
        if configs.len() > MAX_CONFIGS {
            errs.too_many(&cpath, configs.len(), MAX_CONFIGS);
        } else {
            for (i, config) in errs.objects(configs, &cpath) {
                let Some(config) = config else { continue };
                validate_opaque(errs, config, &cpath.index(i));
            }
        }
    }
    let _ = errs.string(spec, "extendedResourceName", &path);
}

/// Key of an allocated device: driver, pool, device and optional share ID.
fn device_key(obj: &Map<String, Value>) -> String {
    let field = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or("");
    let mut key = format!("{}/{}/{}", field("driver"), field("pool"), field("device"));
    if !field("shareID").is_empty() {
        key = format!("{key}/{}", field("shareID"));
    }
    key
}

pub(super) fn validate_claim_status(
    errs: &mut Errors,
    obj: &Map<String, Value>,
    old: Option<&Value>,
) {
    let path = Path::root("status");
    let empty = Map::new();
    let status = errs
        .object(obj, "status", &Path::root(""))
        .unwrap_or(&empty);
    let allocation = errs.object(status, "allocation", &path);
    let old_allocation = old
        .and_then(|o| o.pointer("/status/allocation"))
        .filter(|a| !a.is_null());

    if let Some(reserved) = errs.array(status, "reservedFor", &path) {
        let rpath = path.child("reservedFor");
        if reserved.len() > MAX_RESERVED_FOR {
            errs.too_many(&rpath, reserved.len(), MAX_RESERVED_FOR);
        } else {
            let mut uids = BTreeSet::new();
            for (i, consumer) in errs.objects(reserved, &rpath) {
                let Some(consumer) = consumer else { continue };
                let cp = rpath.index(i);
                for field in ["resource", "name", "uid"] {
                    if errs.string(consumer, field, &cp).unwrap_or("").is_empty() {
                        errs.required(&cp.child(field), "");
                    }
                }
                let uid = consumer.get("uid").and_then(Value::as_str).unwrap_or("");
                if !uid.is_empty() && !uids.insert(uid) {
                    errs.duplicate(&cp, uid);
                }
            }
        }
        if !reserved.is_empty() && allocation.is_none() {
            errs.forbidden(&rpath, "may not be specified when `allocated` is not set");
        }
    }

    let apath = path.child("allocation");
    let mut allocated = BTreeSet::new();
    if let Some(allocation) = allocation {
        if let Some(old_allocation) = old_allocation
            && *old_allocation != Value::Object(allocation.clone())
        {
            errs.invalid(
                &apath,
                &Value::Object(allocation.clone()),
                "field is immutable",
            );
        }
        if let Some(devices) = errs.object(allocation, "devices", &apath) {
            let dpath = apath.child("devices");
            if let Some(results) = errs.array(devices, "results", &dpath) {
                let rpath = dpath.child("results");
                if results.len() > MAX_RESULTS {
                    errs.too_many(&rpath, results.len(), MAX_RESULTS);
                }
                for (i, result) in errs.objects(results, &rpath) {
                    let Some(result) = result else { continue };
                    let rp = rpath.index(i);
                    if errs.string(result, "request", &rp).unwrap_or("").is_empty() {
                        errs.required(&rp.child("request"), "");
                    }
                    let driver = errs.string(result, "driver", &rp).unwrap_or("");
                    validate_driver_name(errs, driver, &rp.child("driver"));
                    let pool = errs.string(result, "pool", &rp).unwrap_or("");
                    validate_pool_name(errs, pool, &rp.child("pool"));
                    let device = errs.string(result, "device", &rp).unwrap_or("");
                    validate_device_name(errs, device, &rp.child("device"));
                    validate_quantities(errs, result, "consumedCapacity", &rp);
                    allocated.insert(device_key(result));
                }
            }
        }
    }

    if let Some(devices) = errs.array(status, "devices", &path) {
        let dpath = path.child("devices");
        let mut seen = BTreeSet::new();
        for (i, device) in errs.objects(devices, &dpath) {
            let Some(device) = device else { continue };
            let dp = dpath.index(i);
            let driver = errs.string(device, "driver", &dp).unwrap_or("");
            validate_driver_name(errs, driver, &dp.child("driver"));
            let pool = errs.string(device, "pool", &dp).unwrap_or("");
            validate_pool_name(errs, pool, &dp.child("pool"));
            let name = errs.string(device, "device", &dp).unwrap_or("");
            validate_device_name(errs, name, &dp.child("device"));
            let key = device_key(device);
            if !allocated.contains(&key) {
                errs.invalid_str(&dp, &key, "must be an allocated device in the claim");
            }
            if !seen.insert(key.clone()) {
                errs.duplicate(&dp, &key);
            }
            if let Some(conditions) = errs.array(device, "conditions", &dp) {
                if conditions.len() > MAX_DEVICE_CONDITIONS {
                    errs.too_many(
                        &dp.child("conditions"),
                        conditions.len(),
                        MAX_DEVICE_CONDITIONS,
                    );
                }
                validate_conditions(errs, conditions, &dp.child("conditions"));
            }
            if device.get("data").is_some_and(|d| !d.is_null()) {
                validate_raw_object(errs, device.get("data"), &dp.child("data"), MAX_DEVICE_DATA);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::Resource;

    fn claim_errors(obj: &Value, old: Option<&Value>, status: bool) -> Vec<String> {
        let mut errs = Errors::new(Resource::ResourceClaims);
        let map = obj.as_object().unwrap();
        if status {
            validate_claim_status(&mut errs, map, old);
        } else {
            validate_claim(&mut errs, map, old);
        }
        errs.fields.iter().map(ToString::to_string).collect()
    }

    fn claim() -> Value {
        let mut claim = json!({"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}]
        }}});
        default_claim(&mut claim);
        claim
    }

    #[test]
    fn defaults_are_applied() {
        let c = claim();
        assert_eq!(
            c["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"],
            "ExactCount"
        );
        assert_eq!(c["spec"]["devices"]["requests"][0]["exactly"]["count"], 1);
        let mut all = json!({"spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "c", "allocationMode": "All"}}]}}});
        default_claim(&mut all);
        assert!(
            all["spec"]["devices"]["requests"][0]["exactly"]
                .get("count")
                .is_none()
        );
    }

    #[test]
    fn valid_claim_passes_and_spec_is_immutable() {
        let c = claim();
        assert!(claim_errors(&c, None, false).is_empty());
        let mut changed = c.clone();
        changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(2);
        let errs = claim_errors(&changed, Some(&c), false);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("spec: Invalid value: "), "{errs:?}");
        assert!(errs[0].ends_with("field is immutable"), "{errs:?}");
    }

    #[test]
    fn bad_requests() {
        let mut c = json!({"spec": {"devices": {"requests": [
            {"name": "Bad_Name"},
            {"name": "b", "exactly": {"deviceClassName": "c", "allocationMode": "Some", "selectors": [{"cel": {"expression": ""}}]}},
            {"name": "b", "exactly": {"deviceClassName": "c", "count": -1}}
        ], "config": [{"requests": ["nope"], "opaque": {"driver": "d", "parameters": "x"}}]}}});
        default_claim(&mut c);
        let errs = claim_errors(&c, None, false).join("\n");
        for want in [
            "spec.devices.requests[0].name: Invalid value: \"Bad_Name\"",
            "spec.devices.requests[0]: Required value: exactly one of `exactly` or `firstAvailable` is required",
            "spec.devices.requests[1].exactly.selectors[0].cel.expression: Invalid value: \"\": compilation failed: ERROR: <input>:1:0: Syntax error",
            "spec.devices.requests[1].exactly.allocationMode: Unsupported value: \"Some\"",
            "spec.devices.requests[2].exactly.count: Invalid value: -1: must be greater than zero",
            "spec.devices.requests[2]: Duplicate value: \"b\"",
            "spec.devices.config[0].requests[0]: Invalid value: \"nope\"",
            "spec.devices.config[0].opaque.parameters: Invalid value: \"<value omitted>\": must be a valid JSON object",
        ] {
            assert!(errs.contains(want), "missing {want} in\n{errs}");
        }
    }

    #[test]
    fn a_count_of_zero_is_unset_and_defaulted() {
        let mut c = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "c", "count": 0}},
            {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "c", "count": 0}]}
        ]}}});
        default_claim(&mut c);
        assert_eq!(c["spec"]["devices"]["requests"][0]["exactly"]["count"], 1);
        assert_eq!(
            c["spec"]["devices"]["requests"][1]["firstAvailable"][0]["count"],
            1
        );
        assert!(claim_errors(&c, None, false).is_empty());
    }

    #[test]
    fn constraints_name_attributes_with_their_domain() {
        let c = json!({"spec": {"devices": {
            "requests": [{"name": "a", "exactly": {"deviceClassName": "c", "count": 1, "allocationMode": "ExactCount"}}],
            "constraints": [
                {"matchAttribute": "nvlinkDomain"},
                {"distinctAttribute": "gpu.nvidia.com/uuid"},
                {"matchAttribute": "Bad_Domain/x"}
            ]
        }}});
        let errs = claim_errors(&c, None, false);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(
            errs[0],
            "spec.devices.constraints[0].matchAttribute: Invalid value: \"nvlinkDomain\": a fully qualified name must be a domain and a name separated by a slash"
        );
        assert!(
            errs[1].starts_with(
                "spec.devices.constraints[2].matchAttribute: Invalid value: \"Bad_Domain\""
            ),
            "{errs:?}"
        );
    }

    #[test]
    fn capacity_requests_must_be_quantities() {
        let c = json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "c", "count": 1, "allocationMode": "ExactCount",
                                      "capacity": {"requests": {"memory": "lots", "cores": "2"}}}}
        ]}}});
        let mut errs = Errors::new(Resource::ResourceClaims);
        validate_claim(&mut errs, c.as_object().unwrap(), None);
        let err = errs.into_result("c").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "ResourceClaim in version \"v1\" cannot be handled as a ResourceClaim: quantities must \
             match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
    }

    #[test]
    fn device_conditions_are_metav1_conditions() {
        let claim = |conditions: Value| {
            json!({"status": {
                "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}},
                "devices": [{"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "conditions": conditions}]
            }})
        };
        let good = claim(
            json!([{"type": "Ready", "status": "True", "reason": "Prepared",
                                 "message": "ok", "lastTransitionTime": "2026-01-02T03:04:05Z"}]),
        );
        assert!(claim_errors(&good, None, true).is_empty());
        let bad = claim(json!([
            {"type": "Ready", "status": "Maybe", "reason": "not a reason", "observedGeneration": -1},
            {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2026-01-02T03:04:05Z"}
        ]));
        let errs = claim_errors(&bad, None, true).join("\n");
        for want in [
            "status.devices[0].conditions[0].status: Unsupported value: \"Maybe\": supported values: \"False\", \"True\", \"Unknown\"",
            "status.devices[0].conditions[0].observedGeneration: Invalid value: -1: must be greater than or equal to zero",
            "status.devices[0].conditions[0].lastTransitionTime: Required value: must be set",
            "status.devices[0].conditions[0].reason: Invalid value: \"not a reason\": a condition reason must start",
            "status.devices[0].conditions[1].type: Duplicate value: \"Ready\"",
        ] {
            assert!(errs.contains(want), "missing {want} in\n{errs}");
        }
    }

    #[test]
    fn status_rules() {
        let allocated = json!({"status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
            "devices": [{"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "data": {"a": 1}}]
        }});
        assert!(claim_errors(&allocated, None, true).is_empty());

        let unallocated_reserved = json!({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}, {"resource": "pods", "name": "q", "uid": "u1"}]}});
        let errs = claim_errors(&unallocated_reserved, None, true).join("\n");
        assert!(
            errs.contains(
                "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"
            ),
            "{errs}"
        );
        assert!(
            errs.contains("status.reservedFor[1]: Duplicate value: \"u1\""),
            "{errs}"
        );

        let mut moved = allocated.clone();
        moved["status"]["allocation"]["devices"]["results"][0]["device"] = json!("gpu-1");
        let errs = claim_errors(&moved, Some(&allocated), true).join("\n");
        assert!(errs.contains("status.allocation: Invalid value"), "{errs}");
        assert!(errs.contains("status.devices[0]: Invalid value: \"gpu.nvidia.com/node-a/gpu-0\": must be an allocated device in the claim"), "{errs}");
    }

    #[test]
    fn device_class_rules() {
        let mut errs = Errors::new(Resource::DeviceClasses);
        let class = json!({"spec": {
            "selectors": [{"cel": {"expression": "x".repeat(MAX_CEL_LEN + 1)}}, {}],
            "config": [{"opaque": {"driver": "", "parameters": {}}}]
        }});
        validate_device_class(&mut errs, class.as_object().unwrap());
        let all: Vec<String> = errs.fields.iter().map(ToString::to_string).collect();
        assert_eq!(
            all,
            [
                "spec.selectors[0].cel.expression: Too long: may not be more than 10240 bytes",
                "spec.selectors[1].cel: Required value",
                "spec.config[0].opaque.driver: Required value",
            ]
        );
    }
}
