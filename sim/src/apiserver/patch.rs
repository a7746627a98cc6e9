//! Patch formats other than server-side apply: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902) and strategic merge patch.
//!
//! Strategic merge is modelled as a JSON merge patch in which lists declared as map-lists in
//! [`super::resources::list_type`] merge item by item on their keys and sets merge as unions
//! (every other list is replaced, which is what the `resource.k8s.io` lists declare). The
//! directives `$patch: delete` / `$patch: replace` are honoured on maps and map-list items and
//! `$setElementOrder/...` keys are ignored; any other `$` directive is rejected with 400.

use serde_json::{Map, Value};

use super::resources::{ListType, Resource, list_type};
use super::status::ApiError;

/// A patch body, by content type.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchBody {
    /// `application/merge-patch+json`.
    Merge(Value),
    /// `application/strategic-merge-patch+json`.
    Strategic(Value),
    /// `application/json-patch+json`.
    Json(Value),
    /// `application/apply-patch+yaml` (server-side apply; JSON or YAML body).
    Apply(Value),
}

/// Applies an RFC 7386 merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target_map = target.as_object_mut().expect("object ensured above");
    for (k, v) in patch_map {
        if v.is_null() {
            target_map.remove(k);
        } else {
            merge_patch(target_map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Applies a strategic merge patch (see the module documentation for the model).
pub(crate) fn strategic_merge(
    resource: Resource,
    target: &mut Value,
    patch: &Value,
) -> Result<(), ApiError> {
    strategic(resource, target, patch, &mut Vec::new())
}

fn strategic<'a>(
    resource: Resource,
    target: &mut Value,
    patch: &'a Value,
    schema: &mut Vec<&'a str>,
) -> Result<(), ApiError> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replacement = patch_map.clone();
            replacement.remove("$patch");
            *target = Value::Object(replacement);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other} in strategic merge patch"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target_map = target.as_object_mut().expect("object ensured above");
    for (k, v) in patch_map {
        if k.starts_with("$setElementOrder/") || k == "$patch" {
            continue;
        }
        if k.starts_with('$') {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch directive {k} is not supported by the test API server"
            )));
        }
        if v.is_null() {
            target_map.remove(k);
            continue;
        }
        schema.push(k);
        let slot = target_map.entry(k.clone()).or_insert(Value::Null);
        match v {
            Value::Array(items) => merge_list(resource, slot, items, schema)?,
            _ => strategic(resource, slot, v, schema)?,
        }
        if slot.is_null() {
            target_map.remove(k);
        }
        schema.pop();
    }
    Ok(())
}

fn merge_list<'a>(
    resource: Resource,
    slot: &mut Value,
    items: &'a [Value],
    schema: &mut Vec<&'a str>,
) -> Result<(), ApiError> {
    let list_type = list_type(resource, schema);
    let Value::Array(existing) = slot else {
        *slot = Value::Array(strip_directives(items));
        return Ok(());
    };
    match list_type {
        ListType::Map(keys) => {
            for item in items {
                let Some(obj) = item.as_object() else {
                    return Err(ApiError::bad_request(format!(
                        "strategic merge patch: items of {} must be objects",
                        schema.join(".")
                    )));
                };
                let matches = |candidate: &Value| {
                    keys.iter()
                        .all(|k| candidate.get(*k).filter(|v| !v.is_null()) == obj.get(*k))
                };
                let delete = obj.get("$patch").and_then(Value::as_str) == Some("delete");
                if delete {
                    existing.retain(|candidate| !matches(candidate));
                } else if let Some(current) = existing.iter_mut().find(|c| matches(c)) {
                    strategic(resource, current, item, schema)?;
                } else {
                    existing.push(strip_directives(std::slice::from_ref(item)).remove(0));
                }
            }
        }
        ListType::Set => {
            for item in items {
                if !existing.contains(item) {
                    existing.push(item.clone());
                }
            }
        }
        ListType::Atomic => *existing = strip_directives(items),
    }
    Ok(())
}

fn strip_directives(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .map(|item| match item {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| !k.starts_with('$'))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            other => other.clone(),
        })
        .collect()
}

/// Applies an RFC 6902 JSON patch. A malformed patch document is a 400; an operation that does
/// not apply (missing path, failed `test`) is a 422 like the real server answers.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Some(ops) = patch.as_array() else {
        return Err(ApiError::bad_request(
            "json patch must be a JSON array of operations",
        ));
    };
    let mut doc = target.clone();
    for (i, op) in ops.iter().enumerate() {
        let bad = |why: &str| ApiError::bad_request(format!("json patch operation {i}: {why}"));
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing \"op\""))?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing \"path\""))?;
        let path = parse_pointer(path).map_err(|e| bad(&e))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| bad("missing \"value\""))
        };
        let from = || -> Result<Vec<String>, ApiError> {
            let from = op
                .get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("missing \"from\""))?;
            parse_pointer(from).map_err(|e| bad(&e))
        };
        let unapplicable = |why: String| {
            ApiError::unprocessable(format!(
                "the server rejected our request due to an error in our request: json patch \
                 operation {i} ({kind}): {why}"
            ))
        };
        match kind {
            "add" => add(&mut doc, &path, value()?).map_err(unapplicable)?,
            "remove" => {
                remove(&mut doc, &path).map_err(unapplicable)?;
            }
            "replace" => {
                remove(&mut doc, &path).map_err(unapplicable)?;
                add(&mut doc, &path, value()?).map_err(unapplicable)?;
            }
            "move" => {
                let from = from()?;
                if path.len() > from.len() && path.starts_with(&from) {
                    return Err(unapplicable("cannot move a value into itself".into()));
                }
                let moved = remove(&mut doc, &from).map_err(unapplicable)?;
                add(&mut doc, &path, moved).map_err(unapplicable)?;
            }
            "copy" => {
                let copied = get(&doc, &from()?).cloned().map_err(unapplicable)?;
                add(&mut doc, &path, copied).map_err(unapplicable)?;
            }
            "test" => {
                let want = value()?;
                let have = get(&doc, &path).map_err(unapplicable)?;
                if *have != want {
                    return Err(unapplicable(format!(
                        "testing value {} failed",
                        render_pointer(&path)
                    )));
                }
            }
            other => return Err(bad(&format!("unknown operation \"{other}\""))),
        }
    }
    *target = doc;
    Ok(())
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer \"{pointer}\""));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn render_pointer(path: &[String]) -> String {
    path.iter().fold(String::new(), |mut out, t| {
        out.push('/');
        out.push_str(&t.replace('~', "~0").replace('/', "~1"));
        out
    })
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let index: usize = if valid {
        token
            .parse()
            .map_err(|_| format!("invalid index {token}"))?
    } else {
        return Err(format!("invalid array index \"{token}\""));
    };
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if index > max || (!allow_end && len == 0) {
        return Err(format!("array index {index} out of bounds"));
    }
    Ok(index)
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Result<&'a Value, String> {
    let mut current = doc;
    for token in path {
        current = match current {
            Value::Object(map) => map.get(token),
            Value::Array(items) => items.get(array_index(token, items.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| format!("doc is missing path: {}", render_pointer(path)))?;
    }
    Ok(current)
}

fn parent_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut current = doc;
    for token in &path[..path.len() - 1] {
        current = match current {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let len = items.len();
                items.get_mut(array_index(token, len, false)?)
            }
            _ => None,
        }
        .ok_or_else(|| format!("doc is missing path: {}", render_pointer(path)))?;
    }
    Ok(current)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some(last) = path.last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, path)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let index = array_index(last, items.len(), true)?;
            items.insert(index, value);
            Ok(())
        }
        _ => Err(format!(
            "doc is missing path: {}: parent is not a container",
            render_pointer(path)
        )),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let Some(last) = path.last() else {
        return Err("cannot remove the whole document".into());
    };
    let missing = || format!("doc is missing path: {}", render_pointer(path));
    match parent_mut(doc, path)? {
        Value::Object(map) => map.remove(last).ok_or_else(missing),
        Value::Array(items) => {
            let index = array_index(last, items.len(), false)?;
            Ok(items.remove(index))
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut doc,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            doc,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
        merge_patch(&mut doc, &json!("scalar"));
        assert_eq!(doc, json!("scalar"));
    }

    #[test]
    fn strategic_merges_map_lists_by_key() {
        let mut claim = json!({"status": {"reservedFor": [{"uid": "1", "name": "a"}, {"uid": "2", "name": "b"}]}});
        strategic_merge(
            Resource::ResourceClaims,
            &mut claim,
            &json!({"status": {"reservedFor": [
                {"uid": "2", "name": "b2"}, {"uid": "3", "name": "c"}, {"uid": "1", "$patch": "delete"}
            ], "$setElementOrder/reservedFor": [{"uid": "2"}]}}),
        )
        .unwrap();
        assert_eq!(
            claim["status"]["reservedFor"],
            json!([{"uid": "2", "name": "b2"}, {"uid": "3", "name": "c"}])
        );
        // Atomic lists are replaced.
        let mut slice = json!({"spec": {"devices": [{"name": "a"}]}});
        strategic_merge(
            Resource::ResourceSlices,
            &mut slice,
            &json!({"spec": {"devices": [{"name": "b"}]}}),
        )
        .unwrap();
        assert_eq!(slice["spec"]["devices"], json!([{"name": "b"}]));
    }

    #[test]
    fn strategic_directives() {
        let mut doc = json!({"spec": {"a": 1, "b": 2}});
        strategic_merge(
            Resource::DeviceClasses,
            &mut doc,
            &json!({"spec": {"$patch": "replace", "c": 3}}),
        )
        .unwrap();
        assert_eq!(doc, json!({"spec": {"c": 3}}));
        strategic_merge(
            Resource::DeviceClasses,
            &mut doc,
            &json!({"spec": {"$patch": "delete"}}),
        )
        .unwrap();
        assert_eq!(doc, json!({}));
        let err = strategic_merge(
            Resource::DeviceClasses,
            &mut doc,
            &json!({"$retainKeys": ["a"]}),
        )
        .unwrap_err();
        assert_eq!(err.code, 400);
    }

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"a": {"b": [1, 2]}, "x~y": 1});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/a/b/-", "value": 3},
                {"op": "add", "path": "/a/b/0", "value": 0},
                {"op": "replace", "path": "/x~0y", "value": 2},
                {"op": "copy", "from": "/a/b", "path": "/c"},
                {"op": "move", "from": "/c", "path": "/d"},
                {"op": "remove", "path": "/a/b/1"},
                {"op": "test", "path": "/d/3", "value": 3}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"a": {"b": [0, 2, 3]}, "x~y": 2, "d": [0, 1, 2, 3]})
        );
    }

    #[test]
    fn json_patch_failures_leave_the_document_alone() {
        let original = json!({"a": 1});
        let mut doc = original.clone();
        let err = json_patch(
            &mut doc,
            &json!([{"op": "add", "path": "/b", "value": 2}, {"op": "test", "path": "/a", "value": 5}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(doc, original);
        for (patch, code) in [
            (json!({"op": "add"}), 400),
            (json!([{"op": "frobnicate", "path": "/a"}]), 400),
            (json!([{"op": "add", "path": "a", "value": 1}]), 400),
            (json!([{"op": "add", "path": "/a"}]), 400),
            (json!([{"op": "remove", "path": "/missing"}]), 422),
            (json!([{"op": "add", "path": "/a/b/c", "value": 1}]), 422),
            (json!([{"op": "move", "from": "/a", "path": "/a/x"}]), 422),
            (json!([{"op": "remove", "path": ""}]), 422),
        ] {
            let err = json_patch(&mut doc, &patch).unwrap_err();
            assert_eq!(err.code, code, "{patch}");
            assert_eq!(doc, original);
        }
    }

    #[test]
    fn json_patch_array_indices() {
        let mut doc = json!({"l": [1]});
        for bad in ["/l/01", "/l/5", "/l/-1", "/l/x"] {
            assert!(
                json_patch(&mut doc, &json!([{"op": "remove", "path": bad}])).is_err(),
                "{bad}"
            );
        }
    }
}
