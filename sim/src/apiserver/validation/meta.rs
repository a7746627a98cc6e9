//! `metadata` validation shared by all resources: name and namespace formats, labels,
//! annotations, owner references and finalizers.

use serde_json::{Map, Value};

use super::names;
use super::{Errors, Path};
use crate::apiserver::resources::Resource;

/// Maximum total size of all annotation keys and values.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

pub(super) fn validate_object_meta(
    errs: &mut Errors,
    resource: Resource,
    obj: &Map<String, Value>,
    _old: Option<&Value>,
) {
    let path = Path::root("metadata");
    let Some(meta) = errs.object(obj, "metadata", &Path::root("")) else {
        errs.required(&path.child("name"), "name or generateName is required");
        return;
    };
    let name = errs.string(meta, "name", &path).unwrap_or("");
    let _ = errs.string(meta, "generateName", &path);
    if name.is_empty() {
        errs.required(&path.child("name"), "name or generateName is required");
    } else {
        errs.invalid_each(&path.child("name"), name, names::dns1123_subdomain(name));
    }
    if resource.info().namespaced {
        let namespace = errs.string(meta, "namespace", &path).unwrap_or("");
        if namespace.is_empty() {
            errs.required(&path.child("namespace"), "");
        } else {
            errs.invalid_each(
                &path.child("namespace"),
                namespace,
                names::dns1123_label(namespace),
            );
        }
    }
    validate_labels(errs, meta, &path);
    validate_annotations(errs, meta, &path);
    validate_owner_references(errs, meta, &path);
    if let Some(finalizers) = errs.array(meta, "finalizers", &path) {
        let fpath = path.child("finalizers");
        for finalizer in errs.strings(finalizers, &fpath) {
            errs.invalid_each(&fpath, finalizer, names::qualified_name(finalizer));
        }
    }
}

fn string_map<'v>(
    errs: &mut Errors,
    meta: &'v Map<String, Value>,
    name: &str,
    path: &Path,
) -> Vec<(&'v str, &'v str)> {
    let Some(map) = errs.object(meta, name, path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in map {
        match v {
            Value::String(s) => out.push((k.as_str(), s.as_str())),
            Value::Null => {}
            other => errs.decode(&path.child(name).key(k, 64), "string", other),
        }
    }
    out
}

fn validate_labels(errs: &mut Errors, meta: &Map<String, Value>, path: &Path) {
    let lpath = path.child("labels");
    for (k, v) in string_map(errs, meta, "labels", path) {
        errs.invalid_each(&lpath, k, names::qualified_name(k));
        errs.invalid_each(&lpath, v, names::label_value(v));
    }
}

fn validate_annotations(errs: &mut Errors, meta: &Map<String, Value>, path: &Path) {
    let apath = path.child("annotations");
    let mut total = 0;
    for (k, v) in string_map(errs, meta, "annotations", path) {
        errs.invalid_each(&apath, k, names::qualified_name(&k.to_ascii_lowercase()));
        total += k.len() + v.len();
    }
    if total > ANNOTATIONS_MAX_BYTES {
        errs.too_long(&apath, ANNOTATIONS_MAX_BYTES);
    }
}

fn validate_owner_references(errs: &mut Errors, meta: &Map<String, Value>, path: &Path) {
    let Some(refs) = errs.array(meta, "ownerReferences", path) else {
        return;
    };
    let rpath = path.child("ownerReferences");
    let mut controllers = 0;
    for (i, owner) in errs.objects(refs, &rpath) {
        let Some(owner) = owner else { continue };
        let opath = rpath.index(i);
        for field in ["apiVersion", "kind", "name", "uid"] {
            if errs.string(owner, field, &opath).unwrap_or("").is_empty() {
                errs.required(&opath.child(field), "");
            }
        }
        let _ = errs.boolean(owner, "blockOwnerDeletion", &opath);
        if errs.boolean(owner, "controller", &opath) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        errs.invalid(
            &rpath,
            &Value::Array(refs.clone()),
            "Only one reference can have Controller set to true",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(resource: Resource, obj: &Value) -> Vec<String> {
        let mut errs = Errors::new(resource);
        validate_object_meta(&mut errs, resource, obj.as_object().unwrap(), None);
        errs.fields.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn names_and_namespaces() {
        assert!(check(Resource::Nodes, &json!({"metadata": {"name": "node-a"}})).is_empty());
        let errs = check(Resource::Nodes, &json!({"metadata": {}}));
        assert_eq!(
            errs,
            ["metadata.name: Required value: name or generateName is required"]
        );
        let errs = check(Resource::Nodes, &json!({"metadata": {"name": "Node_A"}}));
        assert!(
            errs[0].starts_with(
                "metadata.name: Invalid value: \"Node_A\": a lowercase RFC 1123 subdomain"
            ),
            "{errs:?}"
        );
        let errs = check(
            Resource::ResourceClaims,
            &json!({"metadata": {"name": "c"}}),
        );
        assert_eq!(errs, ["metadata.namespace: Required value"]);
        let errs = check(
            Resource::ResourceClaims,
            &json!({"metadata": {"name": "c", "namespace": "a.b"}}),
        );
        assert_eq!(errs.len(), 1);
    }

    #[test]
    fn labels_annotations_owners() {
        let obj = json!({"metadata": {
            "name": "n",
            "labels": {"good": "v", "bad key": "v", "k": "-bad"},
            "annotations": {"example.com/ok": "anything goes here"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u", "controller": true},
                {"apiVersion": "v1", "kind": "Node", "name": "m", "controller": true}
            ],
            "finalizers": ["example.com/f", "bad/final/izer"]
        }});
        let errs = check(Resource::Nodes, &obj);
        let joined = errs.join("\n");
        assert!(
            joined.contains("metadata.labels: Invalid value: \"bad key\""),
            "{joined}"
        );
        assert!(
            joined.contains("metadata.labels: Invalid value: \"-bad\""),
            "{joined}"
        );
        assert!(
            joined.contains("metadata.ownerReferences[1].uid: Required value"),
            "{joined}"
        );
        assert!(
            joined.contains("Only one reference can have Controller set to true"),
            "{joined}"
        );
        assert!(
            joined.contains("metadata.finalizers: Invalid value: \"bad/final/izer\""),
            "{joined}"
        );
        assert_eq!(errs.len(), 5, "{joined}");
    }

    #[test]
    fn oversized_annotations() {
        let obj = json!({"metadata": {"name": "n", "annotations": {"a": "x".repeat(ANNOTATIONS_MAX_BYTES)}}});
        let errs = check(Resource::Nodes, &obj);
        assert_eq!(
            errs,
            ["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
    }

    #[test]
    fn wrong_types_are_decode_errors() {
        let mut errs = Errors::new(Resource::Nodes);
        let obj = json!({"metadata": {"name": 5, "labels": {"a": 1}}});
        validate_object_meta(&mut errs, Resource::Nodes, obj.as_object().unwrap(), None);
        let err = errs.into_result("").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("metadata.name"), "{}", err.message);
    }
}
