//! The patch formats the driver's programs send: JSON merge patch (RFC 7386; the demo's and
//! the tests' writes of a claim's allocation) and server-side apply (the plugin's slices and
//! claim status; applied in [`super::fields`]). Strategic merge and JSON patch (RFC 6902) are
//! not served: nothing of the driver sends them, and a request with either content type is
//! answered `415 UnsupportedMediaType`.

use serde_json::{Map, Value};

/// A patch body, by content type.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchBody {
    /// `application/merge-patch+json`.
    Merge(Value),
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
}
