//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! The model, simplified from the real API server but faithful in what clients observe:
//! - A field set is a set of paths in the `FieldsV1` notation (`f:spec`, `k:{"uid":"..."}` for
//!   items of map-lists, `v:"x"` for items of sets). Maps are owned per key, atomic lists and
//!   scalars as a whole (see [`super::resources::list_type`]).
//! - Every write records ownership in `metadata.managedFields`, one entry per
//!   (manager, operation, subresource). A create, update or non-apply patch (operation `Update`)
//!   gives its manager the fields it changed and takes them from every other manager.
//! - An apply (operation `Apply`) by manager M with configuration C:
//!   1. conflicts: a field in C owned by another manager with a different live value is a
//!      conflict (409 with `FieldManagerConflict` causes) unless `force`, which takes it over;
//!   2. removal: fields M owned before but no longer applies are removed from the object, unless
//!      another manager still owns them (or something below them);
//!   3. merge: C is merged into the object (maps recursively, map-lists by key, sets as unions,
//!      atomic lists and scalars replaced); `null` values in C are ignored;
//!   4. M's apply entry becomes exactly the fields of C.
//! - Not modelled: version conversion of field sets, `metadata.managedFields` reset requests
//!   other than sending a non-empty list, and defaulting of applied configurations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::resources::{ListType, Resource, list_type};
use super::schema;
use super::status::{ApiError, StatusCause};

/// One element of a field path in `FieldsV1` notation (`f:name`, `k:{...}`, `v:...`).
pub(crate) type PathElement = String;
/// A field path.
pub(crate) type FieldPath = Vec<PathElement>;
/// A set of owned field paths.
pub(crate) type FieldSet = BTreeSet<FieldPath>;

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource; `status` is excluded when the resource has a status subresource.
    Main {
        /// Whether `status` belongs to the subresource rather than to the main resource.
        exclude_status: bool,
    },
    /// The `status` subresource: only `status` counts.
    Status,
}

impl Scope {
    /// The scope of a write to `resource` (main or status subresource).
    pub(crate) fn of(resource: Resource, status_subresource: bool) -> Self {
        if status_subresource {
            Scope::Status
        } else {
            Scope::Main {
                exclude_status: resource.info().status_subresource,
            }
        }
    }

    fn subresource(self) -> &'static str {
        match self {
            Scope::Main { .. } => "",
            Scope::Status => "status",
        }
    }

    fn includes_top_level(self, key: &str) -> bool {
        match (self, key) {
            (_, "apiVersion" | "kind") => false,
            (Scope::Status, k) => k == "status",
            (Scope::Main { exclude_status }, "status") => !exclude_status,
            (Scope::Main { .. }, _) => true,
        }
    }
}

/// Metadata fields whose ownership is tracked (everything else in `metadata` is server-managed
/// or identity).
const TRACKED_METADATA: [&str; 4] = ["labels", "annotations", "ownerReferences", "finalizers"];

/// The operation that produced a managed-fields entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Server-side apply.
    Apply,
    /// Create, update or non-apply patch.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManagedEntry {
    pub manager: String,
    pub operation: Operation,
    pub subresource: String,
    pub api_version: String,
    pub time: String,
    pub fields: FieldSet,
}

impl ManagedEntry {
    fn is(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

/// The field set of an object (or applied configuration) within `scope`.
pub(crate) fn field_set(resource: Resource, obj: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (key, value) in map {
        if !scope.includes_top_level(key) {
            continue;
        }
        if key == "metadata" {
            let Some(meta) = value.as_object() else {
                continue;
            };
            for tracked in TRACKED_METADATA {
                if let Some(v) = meta.get(tracked).filter(|v| !v.is_null()) {
                    let mut path = vec!["f:metadata".to_owned(), format!("f:{tracked}")];
                    walk(
                        resource,
                        v,
                        &mut path,
                        &mut vec!["metadata", tracked],
                        &mut out,
                    );
                }
            }
            continue;
        }
        if value.is_null() {
            continue;
        }
        let mut path = vec![format!("f:{key}")];
        walk(
            resource,
            value,
            &mut path,
            &mut vec![key.as_str()],
            &mut out,
        );
    }
    out
}

fn walk<'a>(
    resource: Resource,
    value: &'a Value,
    path: &mut FieldPath,
    schema: &mut Vec<&'a str>,
    out: &mut FieldSet,
) {
    match value {
        Value::Object(_) if schema::is_atomic(resource, schema) => {
            out.insert(path.clone());
        }
        // An empty struct or map owns nothing (the real server compares it equal to absent).
        Value::Object(map) if map.is_empty() && schema::is_granular(resource, schema) => {}
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                if v.is_null() {
                    continue;
                }
                path.push(format!("f:{k}"));
                schema.push(k);
                walk(resource, v, path, schema, out);
                schema.pop();
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match list_type(resource, schema) {
            ListType::Set if items.iter().all(is_scalar) => {
                for item in items {
                    let mut p = path.clone();
                    p.push(format!("v:{item}"));
                    out.insert(p);
                }
            }
            ListType::Map(keys) if items.iter().all(Value::is_object) => {
                for item in items {
                    path.push(format!("k:{}", item_key(item, keys)));
                    out.insert(path.clone());
                    walk(resource, item, path, schema, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

fn is_scalar(v: &Value) -> bool {
    !(v.is_object() || v.is_array())
}

/// The key of a map-list item: a JSON object of its key fields that are present.
fn item_key(item: &Value, keys: &[&str]) -> String {
    let mut key = Map::new();
    for k in keys {
        if let Some(v) = item.get(*k).filter(|v| !v.is_null()) {
            key.insert((*k).to_owned(), v.clone());
        }
    }
    Value::Object(key).to_string()
}

fn item_matches(item: &Value, keys: &[&str], key: &Value) -> bool {
    keys.iter().all(|k| {
        let have = item.get(*k).filter(|v| !v.is_null());
        have == key.get(*k)
    })
}

/// The schema (field names) of a path, for list-type lookups.
fn schema_of(path: &[PathElement]) -> Vec<&str> {
    path.iter().filter_map(|e| e.strip_prefix("f:")).collect()
}

/// The value at `path`, if present.
pub(crate) fn lookup<'a>(
    resource: Resource,
    obj: &'a Value,
    path: &[PathElement],
) -> Option<&'a Value> {
    let mut current = obj;
    for (i, elem) in path.iter().enumerate() {
        if let Some(name) = elem.strip_prefix("f:") {
            current = current.get(name).filter(|v| !v.is_null())?;
        } else if let Some(key) = elem.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).ok()?;
            let ListType::Map(keys) = list_type(resource, &schema_of(&path[..i])) else {
                return None;
            };
            current = current
                .as_array()?
                .iter()
                .find(|item| item_matches(item, keys, &key))?;
        } else if let Some(value) = elem.strip_prefix("v:") {
            let value: Value = serde_json::from_str(value).ok()?;
            current = current.as_array()?.iter().find(|item| **item == value)?;
        } else {
            return None;
        }
    }
    Some(current)
}

/// Removes the value at `path` (a map key, a map-list item or a set item).
fn remove_path(resource: Resource, obj: &mut Value, path: &[PathElement]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut current = obj;
    for (i, elem) in parent_path.iter().enumerate() {
        let next = if let Some(name) = elem.strip_prefix("f:") {
            current.get_mut(name)
        } else if let Some(key) = elem.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Value>(key) else {
                return;
            };
            let ListType::Map(keys) = list_type(resource, &schema_of(&path[..i])) else {
                return;
            };
            current
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|item| item_matches(item, keys, &key)))
        } else {
            None
        };
        match next {
            Some(n) => current = n,
            None => return,
        }
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(map) = current.as_object_mut() {
            map.remove(name);
        }
    } else if let Some(key) = last.strip_prefix("k:") {
        let (Ok(key), ListType::Map(keys)) = (
            serde_json::from_str::<Value>(key),
            list_type(resource, &schema_of(parent_path)),
        ) else {
            return;
        };
        if let Some(items) = current.as_array_mut() {
            items.retain(|item| !item_matches(item, keys, &key));
        }
    } else if let Some(value) = last.strip_prefix("v:")
        && let (Ok(value), Some(items)) =
            (serde_json::from_str::<Value>(value), current.as_array_mut())
    {
        items.retain(|item| *item != value);
    }
}

/// Encodes a field set as a `FieldsV1` tree.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn render(node: &Node) -> Value {
        let mut map = Map::new();
        if node.member && !node.children.is_empty() {
            map.insert(".".into(), json!({}));
        }
        for (k, child) in &node.children {
            map.insert(k.clone(), render(child));
        }
        Value::Object(map)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for elem in path {
            node = node.children.entry(elem.clone()).or_default();
        }
        node.member = true;
    }
    render(&root)
}

/// Decodes a `FieldsV1` tree; malformed parts are ignored.
pub(crate) fn from_fields_v1(tree: &Value) -> FieldSet {
    fn visit(node: &Map<String, Value>, path: &mut FieldPath, out: &mut FieldSet) {
        for (k, child) in node {
            if k == "." {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
                continue;
            }
            let Some(child) = child.as_object() else {
                continue;
            };
            path.push(k.clone());
            if child.is_empty() {
                out.insert(path.clone());
            } else {
                visit(child, path, out);
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(map) = tree.as_object() {
        visit(map, &mut Vec::new(), &mut out);
    }
    out
}

/// Reads `metadata.managedFields`; entries that are not well-formed are dropped.
pub(crate) fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    let Some(entries) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let operation = match e.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            Some(ManagedEntry {
                manager: e.get("manager")?.as_str()?.to_owned(),
                operation,
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                api_version: e
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                time: e
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `metadata.managedFields` (removed when there are no entries), in the real server's
/// order: applies before updates, then by time, manager, subresource and API version.
pub(crate) fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let meta = super::meta::metadata_mut(obj);
    if entries.is_empty() {
        meta.remove("managedFields");
        return;
    }
    let mut sorted: Vec<&ManagedEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| {
        (
            a.operation.as_str(),
            &a.time,
            &a.manager,
            &a.subresource,
            &a.api_version,
        )
            .cmp(&(
                b.operation.as_str(),
                &b.time,
                &b.manager,
                &b.subresource,
                &b.api_version,
            ))
    });
    let list = sorted
        .iter()
        .map(|e| {
            let mut entry = json!({
                "manager": e.manager,
                "operation": e.operation.as_str(),
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                entry["subresource"] = json!(e.subresource);
            }
            entry
        })
        .collect();
    meta.insert("managedFields".into(), Value::Array(list));
}

/// Sets the fields of the entry (manager, operation, scope), creating it if needed; the entry's
/// time only changes when its fields do.
fn upsert_entry(
    entries: &mut Vec<ManagedEntry>,
    resource: Resource,
    manager: &str,
    operation: Operation,
    scope: Scope,
    fields: FieldSet,
    now: &str,
) {
    let sub = scope.subresource();
    if let Some(e) = entries.iter_mut().find(|e| e.is(manager, operation, sub)) {
        if e.fields != fields {
            e.fields = fields;
            now.clone_into(&mut e.time);
        }
    } else {
        entries.push(ManagedEntry {
            manager: manager.to_owned(),
            operation,
            subresource: sub.to_owned(),
            api_version: resource.api_version(),
            time: now.to_owned(),
            fields,
        });
    }
    entries.retain(|e| !e.fields.is_empty());
}

/// Records the ownership change of a create/update/non-apply patch by `manager` and writes it
/// into `new.metadata.managedFields`. `entries` is the starting ownership (the stored object's,
/// or the list the client sent).
pub(crate) fn track_update(
    resource: Resource,
    old: Option<&Value>,
    new: &mut Value,
    mut entries: Vec<ManagedEntry>,
    manager: &str,
    scope: Scope,
    now: &str,
) {
    let new_set = field_set(resource, new, scope);
    let old_set = old
        .map(|o| field_set(resource, o, scope))
        .unwrap_or_default();
    let absent_before = |p: &FieldPath| match old {
        Some(o) => lookup(resource, o, p).is_none(),
        None => !schema::always_present(resource, &schema_of(p)),
    };
    // Leaves whose value changed, items that are new, and (as `.` entries) granular maps and
    // structs that did not exist before: the real server's comparison of old and new.
    let mut changed: FieldSet = new_set
        .iter()
        .filter(|p| match p.last() {
            Some(last) if last.starts_with("k:") => absent_before(p),
            _ => old.is_none_or(|o| lookup(resource, o, p) != lookup(resource, new, p)),
        })
        .cloned()
        .collect();
    let created: Vec<FieldPath> = new_set
        .iter()
        .flat_map(|p| (1..p.len()).map(move |n| p[..n].to_vec()))
        .filter(|prefix| {
            prefix.last().is_some_and(|e| e.starts_with("f:"))
                && !(prefix.len() == 1 && prefix[0] == "f:metadata")
                && schema::is_granular(resource, &schema_of(prefix))
                && absent_before(prefix)
        })
        .collect();
    changed.extend(created);
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    let sub = scope.subresource();
    for e in &mut entries {
        e.fields.retain(|p| !removed.contains(p));
        if !e.is(manager, Operation::Update, sub) {
            e.fields.retain(|p| !changed.contains(p));
        }
    }
    let mut mine = entries
        .iter()
        .find(|e| e.is(manager, Operation::Update, sub))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    mine.extend(changed);
    upsert_entry(
        &mut entries,
        resource,
        manager,
        Operation::Update,
        scope,
        mine,
        now,
    );
    write_managed(new, &entries);
}

/// Server-side apply of `config` by `manager` onto `live` (an empty object for a create).
/// Returns the merged object with its managed fields, or a 409 conflict.
pub(crate) fn apply(
    resource: Resource,
    live: &Value,
    config: &Value,
    manager: &str,
    scope: Scope,
    force: bool,
    now: &str,
) -> Result<Value, ApiError> {
    let config = restrict_to_scope(&strip_nulls(config), scope);
    let applied = field_set(resource, &config, scope);
    let mut entries = read_managed(live);
    let sub = scope.subresource();

    let mut conflicts: BTreeMap<String, Vec<FieldPath>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.manager != manager) {
        for p in e.fields.intersection(&applied) {
            if lookup(resource, live, p) != lookup(resource, &config, p) {
                conflicts
                    .entry(e.manager.clone())
                    .or_default()
                    .push(p.clone());
            }
        }
    }
    if !conflicts.is_empty() {
        if !force {
            return Err(conflict_error(resource, &conflicts));
        }
        for e in entries.iter_mut().filter(|e| e.manager != manager) {
            if let Some(lost) = conflicts.get(&e.manager) {
                e.fields.retain(|p| !lost.contains(p));
            }
        }
    }

    let previously: FieldSet = entries
        .iter()
        .find(|e| e.is(manager, Operation::Apply, sub))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: Vec<&FieldPath> = entries
        .iter()
        .filter(|e| !e.is(manager, Operation::Apply, sub))
        .flat_map(|e| e.fields.iter())
        .collect();
    let mut result = live.clone();
    // What this manager stopped applying and nobody else owns (or owns something below) goes;
    // only the topmost of those paths are removed: removing a map-list item's key field first
    // would leave the rest of the item behind.
    let removable: Vec<&FieldPath> = previously
        .difference(&applied)
        .filter(|p| !others.iter().any(|q| q.starts_with(p)))
        .collect();
    for p in &removable {
        let under_another = removable
            .iter()
            .any(|q| q.len() < p.len() && p.starts_with(q));
        if !under_another {
            remove_path(resource, &mut result, p);
        }
    }

    merge_into(resource, &mut result, &config, &mut Vec::new());
    upsert_entry(
        &mut entries,
        resource,
        manager,
        Operation::Apply,
        scope,
        applied,
        now,
    );
    write_managed(&mut result, &entries);
    Ok(result)
}

fn conflict_error(resource: Resource, conflicts: &BTreeMap<String, Vec<FieldPath>>) -> ApiError {
    let api_version = resource.api_version();
    let total: usize = conflicts.values().map(Vec::len).sum();
    let mut causes = Vec::new();
    let mut parts = Vec::new();
    for (manager, paths) in conflicts {
        let rendered: Vec<String> = paths.iter().map(|p| render_path(p)).collect();
        for field in &rendered {
            causes.push(StatusCause {
                reason: "FieldManagerConflict".into(),
                message: format!("conflict with \"{manager}\" using {api_version}"),
                field: field.clone(),
            });
        }
        if rendered.len() == 1 {
            parts.push(format!(
                "conflict with \"{manager}\" using {api_version}: {}",
                rendered[0]
            ));
        } else {
            parts.push(format!(
                "conflicts with \"{manager}\" using {api_version}:\n- {}",
                rendered.join("\n- ")
            ));
        }
    }
    let noun = if total == 1 { "conflict" } else { "conflicts" };
    ApiError::apply_conflict(
        format!("Apply failed with {total} {noun}: {}", parts.join("\n")),
        causes,
    )
}

/// Renders a path the way conflict messages do: `.spec.nodeName`, `.status.reservedFor[uid="x"]`.
pub(crate) fn render_path(path: &[PathElement]) -> String {
    let mut out = String::new();
    for elem in path {
        if let Some(name) = elem.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = elem.strip_prefix("k:") {
            let rendered = serde_json::from_str::<Map<String, Value>>(key).map_or_else(
                |_| key.to_owned(),
                |m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                },
            );
            let _ = write!(out, "[{rendered}]");
        } else if let Some(value) = elem.strip_prefix("v:") {
            let _ = write!(out, "[={value}]");
        }
    }
    out
}

/// Drops `null` values (an applied `null` means "not specified" in this model).
fn strip_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Keeps only what an apply in `scope` may change: tracked metadata plus the spec-side fields
/// (main) or `status` (status subresource).
fn restrict_to_scope(config: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    let Some(map) = config.as_object() else {
        return Value::Object(out);
    };
    for (key, value) in map {
        if key == "metadata" {
            if let (Scope::Main { .. }, Some(meta)) = (scope, value.as_object()) {
                let kept: Map<String, Value> = meta
                    .iter()
                    .filter(|(k, _)| TRACKED_METADATA.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !kept.is_empty() {
                    out.insert(key.clone(), Value::Object(kept));
                }
            }
        } else if scope.includes_top_level(key) {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

/// Merges an applied configuration into the live object.
fn merge_into<'a>(
    resource: Resource,
    live: &mut Value,
    config: &'a Value,
    schema: &mut Vec<&'a str>,
) {
    match (live, config) {
        (live @ Value::Object(_), Value::Object(_)) if schema::is_atomic(resource, schema) => {
            *live = config.clone();
        }
        (Value::Object(live_map), Value::Object(cfg_map)) => {
            for (k, v) in cfg_map {
                schema.push(k);
                match live_map.get_mut(k) {
                    Some(existing) => merge_into(resource, existing, v, schema),
                    None => {
                        live_map.insert(k.clone(), v.clone());
                    }
                }
                schema.pop();
            }
        }
        (Value::Array(live_items), Value::Array(cfg_items)) => match list_type(resource, schema) {
            ListType::Map(keys)
                if live_items.iter().all(Value::is_object)
                    && cfg_items.iter().all(Value::is_object) =>
            {
                for item in cfg_items {
                    let key: Value =
                        serde_json::from_str(&item_key(item, keys)).unwrap_or_default();
                    match live_items.iter_mut().find(|l| item_matches(l, keys, &key)) {
                        Some(existing) => merge_into(resource, existing, item, schema),
                        None => live_items.push(item.clone()),
                    }
                }
            }
            ListType::Set => {
                for item in cfg_items {
                    if !live_items.contains(item) {
                        live_items.push(item.clone());
                    }
                }
            }
            _ => live_items.clone_from(cfg_items),
        },
        (live, config) => *live = config.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-01-01T00:00:00Z";
    const MAIN: Scope = Scope::Main {
        exclude_status: false,
    };

    fn p(parts: &[&str]) -> FieldPath {
        parts.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn field_set_tracks_leaves_atomic_lists_and_map_items() {
        let obj = json!({
            "apiVersion": "v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "labels": {"a": "1"}, "finalizers": ["x"]},
            "spec": {"devices": {"requests": [{"name": "r"}]}},
            "status": {"reservedFor": [{"uid": "u1", "name": "pod"}]}
        });
        let main = field_set(
            Resource::ResourceClaims,
            &obj,
            Scope::of(Resource::ResourceClaims, false),
        );
        assert!(main.contains(&p(&["f:metadata", "f:labels", "f:a"])));
        assert!(main.contains(&p(&["f:metadata", "f:finalizers", "v:\"x\""])));
        assert!(main.contains(&p(&["f:spec", "f:devices", "f:requests"])));
        assert!(!main.iter().any(|x| x[0] == "f:status"));
        assert!(!main.iter().any(|x| x.contains(&"f:name".to_owned())));
        let status = field_set(Resource::ResourceClaims, &obj, Scope::Status);
        let item = p(&["f:status", "f:reservedFor", "k:{\"uid\":\"u1\"}"]);
        assert!(status.contains(&item));
        let mut name = item.clone();
        name.push("f:name".into());
        assert!(status.contains(&name));
        assert_eq!(status.len(), 3);
    }

    #[test]
    fn fields_v1_round_trip() {
        let obj = json!({"status": {"reservedFor": [{"uid": "u1", "name": "pod"}]},
                         "metadata": {"labels": {"a": "1"}}, "spec": {"x": {}}});
        let set = field_set(Resource::ResourceClaims, &obj, MAIN);
        let tree = to_fields_v1(&set);
        assert_eq!(
            tree["f:status"]["f:reservedFor"]["k:{\"uid\":\"u1\"}"]["."],
            json!({})
        );
        assert_eq!(tree["f:spec"]["f:x"], json!({}));
        assert_eq!(from_fields_v1(&tree), set);
    }

    #[test]
    fn lookup_and_remove_map_items() {
        let mut obj =
            json!({"status": {"reservedFor": [{"uid": "u1"}, {"uid": "u2", "name": "b"}]}});
        let path = p(&["f:status", "f:reservedFor", "k:{\"uid\":\"u2\"}", "f:name"]);
        assert_eq!(
            lookup(Resource::ResourceClaims, &obj, &path),
            Some(&json!("b"))
        );
        remove_path(Resource::ResourceClaims, &mut obj, &path[..3]);
        assert_eq!(obj, json!({"status": {"reservedFor": [{"uid": "u1"}]}}));
    }

    #[test]
    fn apply_creates_then_removes_fields_it_stopped_applying() {
        let r = Resource::ResourceSlices;
        let first = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"driver": "d"}});
        let live = apply(r, &json!({}), &first, "m", MAIN, false, NOW).unwrap();
        assert_eq!(live["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(live["metadata"]["managedFields"][0]["operation"], "Apply");
        let second = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"driver": "d"}});
        let live = apply(r, &live, &second, "m", MAIN, false, NOW).unwrap();
        assert_eq!(live["metadata"]["labels"], json!({"a": "1"}));
    }

    #[test]
    fn apply_conflicts_unless_forced() {
        let r = Resource::ResourceSlices;
        let live = apply(
            r,
            &json!({}),
            &json!({"spec": {"nodeName": "a"}}),
            "one",
            MAIN,
            false,
            NOW,
        )
        .unwrap();
        let err = apply(
            r,
            &live,
            &json!({"spec": {"nodeName": "b"}}),
            "two",
            MAIN,
            false,
            NOW,
        )
        .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(err.details.causes[0].field, ".spec.nodeName");
        assert!(
            err.message
                .starts_with("Apply failed with 1 conflict: conflict with \"one\"")
        );
        // Same value: shared ownership, no conflict.
        let shared = apply(
            r,
            &live,
            &json!({"spec": {"nodeName": "a"}}),
            "two",
            MAIN,
            false,
            NOW,
        );
        assert!(shared.is_ok());
        let forced = apply(
            r,
            &live,
            &json!({"spec": {"nodeName": "b"}}),
            "two",
            MAIN,
            true,
            NOW,
        )
        .unwrap();
        assert_eq!(forced["spec"]["nodeName"], "b");
        let entries = read_managed(&forced);
        assert!(entries.iter().all(|e| e.manager == "two"), "{entries:?}");
    }

    #[test]
    fn removal_keeps_fields_other_managers_own() {
        let r = Resource::ResourceSlices;
        let cfg = json!({"metadata": {"labels": {"a": "1"}}});
        let live = apply(r, &json!({}), &cfg, "one", MAIN, false, NOW).unwrap();
        let live = apply(r, &live, &cfg, "two", MAIN, false, NOW).unwrap();
        let live = apply(r, &live, &json!({}), "one", MAIN, false, NOW).unwrap();
        assert_eq!(live["metadata"]["labels"]["a"], "1");
    }

    #[test]
    fn updates_take_ownership() {
        let r = Resource::ResourceSlices;
        let live = apply(
            r,
            &json!({}),
            &json!({"spec": {"nodeName": "a"}}),
            "one",
            MAIN,
            false,
            NOW,
        )
        .unwrap();
        let mut new = live.clone();
        new["spec"]["nodeName"] = json!("b");
        let entries = read_managed(&live);
        track_update(r, Some(&live), &mut new, entries, "editor", MAIN, NOW);
        let entries = read_managed(&new);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].manager, "editor");
        assert_eq!(entries[0].operation, Operation::Update);
        // Now applying a different value conflicts with the editor.
        let err = apply(
            r,
            &new,
            &json!({"spec": {"nodeName": "c"}}),
            "one",
            MAIN,
            false,
            NOW,
        )
        .unwrap_err();
        assert!(err.message.contains("\"editor\""));
    }

    #[test]
    fn map_lists_merge_by_key() {
        let r = Resource::ResourceClaims;
        let live = json!({"status": {"reservedFor": [{"uid": "u1", "name": "a"}]}});
        let merged = apply(
            r,
            &live,
            &json!({"status": {"reservedFor": [{"uid": "u2", "name": "b"}]}}),
            "m",
            Scope::Status,
            false,
            NOW,
        )
        .unwrap();
        assert_eq!(merged["status"]["reservedFor"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn render_paths() {
        assert_eq!(
            render_path(&p(&["f:status", "f:reservedFor", "k:{\"uid\":\"u\"}"])),
            ".status.reservedFor[uid=\"u\"]"
        );
        assert_eq!(
            render_path(&p(&["f:metadata", "f:finalizers", "v:\"x\""])),
            ".metadata.finalizers[=\"x\"]"
        );
    }

    /// The plugin's `status.devices` entry of one device (driver/src/prepare/status.rs).
    fn device_entry(device: &str) -> Value {
        json!({"driver": "gpu.nvidia.com", "pool": "node-a", "device": device,
               "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                               "lastTransitionTime": NOW}],
               "data": {"uuid": "GPU-1", "cdiDeviceIDs": ["x"]}})
    }

    #[test]
    fn an_apply_that_stops_applying_a_map_list_item_removes_all_of_it() {
        let r = Resource::ResourceClaims;
        let first = json!({"status": {"devices": [device_entry("gpu-0")]}});
        let live = apply(r, &json!({}), &first, "a", Scope::Status, true, NOW).unwrap();
        let other = json!({"status": {"devices": [device_entry("gpu-1")]}});
        let live = apply(r, &live, &other, "b", Scope::Status, true, NOW).unwrap();
        let moved = json!({"status": {"devices": [device_entry("gpu-3")]}});
        let live = apply(r, &live, &moved, "a", Scope::Status, true, NOW).unwrap();
        let devices: Vec<&Value> = live["status"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        let names: Vec<&str> = devices
            .iter()
            .map(|d| d["device"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gpu-1", "gpu-3"], "{devices:?}");
        assert!(
            devices
                .iter()
                .all(|d| d["driver"] == "gpu.nvidia.com" && d["pool"] == "node-a"),
            "no half-removed item is left: {devices:?}"
        );
    }

    #[test]
    fn atomic_structs_and_raw_json_are_owned_whole() {
        let r = Resource::ResourceClaims;
        let config = json!({"status": {
            "allocation": {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": []}]}},
            "devices": [device_entry("gpu-0")]
        }});
        let set = field_set(r, &config, Scope::Status);
        let item = "k:{\"device\":\"gpu-0\",\"driver\":\"gpu.nvidia.com\",\"pool\":\"node-a\"}";
        assert!(set.contains(&p(&["f:status", "f:devices", item, "f:data"])));
        assert!(set.contains(&p(&["f:status", "f:allocation", "f:nodeSelector"])));
        assert!(
            !set.iter().any(|x| x.len() > 4 && x[3] == "f:data"),
            "{set:?}"
        );
        // An applied atomic struct replaces the live one instead of merging into it.
        let live = json!({"status": {"devices": [{"driver": "gpu.nvidia.com", "pool": "node-a",
                                                  "device": "gpu-0", "data": {"old": 1}}]}});
        let merged = apply(r, &live, &config, "a", Scope::Status, true, NOW).unwrap();
        assert_eq!(
            merged["status"]["devices"][0]["data"],
            json!({"uuid": "GPU-1", "cdiDeviceIDs": ["x"]})
        );
    }

    #[test]
    fn updates_own_the_maps_they_create() {
        let r = Resource::ResourceSlices;
        let mut created = json!({"metadata": {"name": "s", "labels": {"a": "1"}},
                                 "spec": {"driver": "d", "pool": {"name": "p"}}});
        track_update(r, None, &mut created, Vec::new(), "m", MAIN, NOW);
        let fields = &created["metadata"]["managedFields"][0]["fieldsV1"];
        // labels did not exist before the create; spec and spec.pool always do.
        assert_eq!(
            fields["f:metadata"]["f:labels"],
            json!({".": {}, "f:a": {}})
        );
        assert_eq!(
            fields["f:spec"],
            json!({"f:driver": {}, "f:pool": {"f:name": {}}})
        );
        // A later update adding an annotation map owns it, but not the existing labels map.
        let mut updated = created.clone();
        updated["metadata"]["annotations"] = json!({"x": "y"});
        updated["metadata"]["labels"]["b"] = json!("2");
        let entries = read_managed(&created);
        track_update(r, Some(&created), &mut updated, entries, "n", MAIN, NOW);
        let n = updated["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "n")
            .unwrap()["fieldsV1"]
            .clone();
        assert_eq!(
            n,
            json!({"f:metadata": {"f:annotations": {".": {}, "f:x": {}}, "f:labels": {"f:b": {}}}})
        );
    }

    #[test]
    fn managed_fields_are_ordered_like_the_api_server() {
        let entry = |manager: &str, operation, subresource: &str, time: &str| ManagedEntry {
            manager: manager.into(),
            operation,
            subresource: subresource.into(),
            api_version: "v1".into(),
            time: time.into(),
            fields: [p(&["f:spec"])].into_iter().collect(),
        };
        let mut obj = json!({});
        write_managed(
            &mut obj,
            &[
                entry(
                    "unknown",
                    Operation::Update,
                    "status",
                    "2026-01-01T00:00:01Z",
                ),
                entry("unknown", Operation::Update, "", "2026-01-01T00:00:01Z"),
                entry("b", Operation::Apply, "status", "2026-01-01T00:00:02Z"),
                entry("a", Operation::Apply, "status", "2026-01-01T00:00:02Z"),
                entry("z", Operation::Update, "", "2026-01-01T00:00:00Z"),
            ],
        );
        let order: Vec<String> = obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{}/{}/{}", e["operation"], e["manager"], e["subresource"]))
            .collect();
        assert_eq!(
            order,
            [
                "\"Apply\"/\"a\"/\"status\"",
                "\"Apply\"/\"b\"/\"status\"",
                "\"Update\"/\"z\"/null",
                "\"Update\"/\"unknown\"/null",
                "\"Update\"/\"unknown\"/\"status\"",
            ]
        );
    }
}
