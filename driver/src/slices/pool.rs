//! The node's pool as `ResourceSlice` objects, and the pure decision of which
//! writes bring the API server's copy to the desired state.
//!
//! Generation rules (the pool's consumers use only the highest generation and
//! wait for `resourceSliceCount` slices of it):
//! - new content: generation = max(ours, any seen in the pool) + 1, every
//!   slice rewritten with it, then surplus slices deleted;
//! - unchanged content, slices deleted or changed behind our back: they are
//!   restored at the same generation (the content of that generation does
//!   not change), unless something in the pool claims a higher generation, in
//!   which case everything is rewritten above it;
//! - first reconcile after a start: when the API server already holds exactly
//!   the desired pool (a restart with the same GPUs), it is adopted as is, at
//!   its generation, without a write.
//!
//! A slice counts as in sync when it equals the desired one after
//! normalisation (quantity spelling, server-set taint times, empty fields), or
//! when it is still the very object our last write of the same content
//! returned (same `resourceVersion`): so a server that drops fields it does
//! not know (a disabled feature gate) does not make the publisher rewrite
//! forever.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use crate::devices::k8s;

use super::split::SliceContent;

/// Who owns the pool: the node, the driver, and the Node object's UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOwner {
    /// Node name = pool name.
    pub node: String,
    /// Driver name.
    pub driver: String,
    /// UID of the Node object (ownerReference, so slices go with the Node).
    pub node_uid: String,
}

impl PoolOwner {
    /// The field selector matching this pool's slices.
    pub fn field_selector(&self) -> String {
        field_selector(&self.node, &self.driver)
    }
}

/// The field selector of a node's slices of a driver.
pub fn field_selector(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

/// The name of slice `index` of the pool: `<node>-<driver>-<index>`, or a
/// hashed form when that would exceed the 253 characters of an object name.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let plain = format!("{node}-{driver}-{index}");
    if plain.len() <= 253 {
        return plain;
    }
    let id = crate::devices::domain_id(&[node, driver]);
    format!("gpu-dra-{id}-{index}")
}

/// The desired slices for `contents`, at `generation`.
pub fn build_slices(
    owner: &PoolOwner,
    contents: &[SliceContent],
    generation: i64,
) -> Vec<ResourceSlice> {
    let count = contents.len() as i64;
    contents
        .iter()
        .enumerate()
        .map(|(i, c)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&owner.node, &owner.driver, i)),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: owner.node.clone(),
                    uid: owner.node_uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: owner.driver.clone(),
                node_name: Some(owner.node.clone()),
                pool: ResourcePool {
                    name: owner.node.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: (!c.devices.is_empty())
                    .then(|| c.devices.iter().map(k8s::device).collect()),
                shared_counters: (!c.counter_sets.is_empty())
                    .then(|| c.counter_sets.iter().map(k8s::counter_set).collect()),
                ..Default::default()
            },
        })
        .collect()
}

/// A slice reduced to what matters for comparison: the spec (quantities by
/// value, taint times dropped, empty fields dropped) and the owners' UIDs.
pub fn comparable(slice: &ResourceSlice) -> Value {
    let mut spec = slice.spec.clone();
    for device in spec.devices.iter_mut().flatten() {
        for cap in device.capacity.iter_mut().flat_map(|m| m.values_mut()) {
            normalize_quantity(&mut cap.value.0);
        }
        for c in device.consumes_counters.iter_mut().flatten() {
            for counter in c.counters.values_mut() {
                normalize_quantity(&mut counter.value.0);
            }
        }
        for t in device.taints.iter_mut().flatten() {
            t.time_added = None;
        }
    }
    for set in spec.shared_counters.iter_mut().flatten() {
        for counter in set.counters.values_mut() {
            normalize_quantity(&mut counter.value.0);
        }
    }
    let mut owners: Vec<String> = slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| format!("{}/{}/{}", o.kind, o.name, o.uid))
        .collect();
    owners.sort();
    let mut value = serde_json::json!({
        "spec": serde_json::to_value(&spec).unwrap_or(Value::Null),
        "owners": owners,
    });
    strip_empty(&mut value);
    value
}

fn normalize_quantity(q: &mut String) {
    if let Some(nanos) = k8s::quantity_nanos(q) {
        *q = format!("{nanos}n");
    }
}

/// Removes nulls, empty objects and empty arrays, recursively.
fn strip_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for child in map.values_mut() {
                strip_empty(child);
            }
            map.retain(|_, c| !is_empty(c));
        }
        Value::Array(items) => items.iter_mut().for_each(strip_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// What the publisher remembers between reconciles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolState {
    /// The generation being published and the content it stands for.
    pub published: Option<(i64, Vec<Value>)>,
    /// Per slice name: the `resourceVersion` our last write returned and the
    /// comparable form of what we wrote.
    pub written: BTreeMap<String, (String, Value)>,
}

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Create or update (server-side apply) this slice.
    Apply(Box<ResourceSlice>),
    /// Delete the slice of this name.
    Delete(String),
}

/// The writes of one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pool generation after the writes.
    pub generation: i64,
    /// Writes in order: applies first, deletions last, so the pool never
    /// lacks the new generation's slices while old ones go away.
    pub ops: Vec<Op>,
}

/// The content fingerprint of desired slices (generation left out).
fn fingerprint(desired: &[ResourceSlice]) -> Vec<Value> {
    desired
        .iter()
        .map(|s| comparable(&with_generation(s, 0)))
        .collect()
}

fn with_generation(slice: &ResourceSlice, generation: i64) -> ResourceSlice {
    let mut s = slice.clone();
    s.spec.pool.generation = generation;
    s
}

/// Whether `observed` can be kept as `expected`.
fn in_sync(observed: &ResourceSlice, expected: &ResourceSlice, state: &PoolState) -> bool {
    let want = comparable(expected);
    if comparable(observed) == want {
        return true;
    }
    let name = expected.metadata.name.as_deref().unwrap_or_default();
    match (state.written.get(name), &observed.metadata.resource_version) {
        (Some((rv, wrote)), Some(seen)) => rv == seen && *wrote == want,
        _ => false,
    }
}

/// Whether a slice's immutable fields differ from the desired ones, so it
/// must be deleted and created again rather than updated.
fn immutable_differs(observed: &ResourceSlice, expected: &ResourceSlice) -> bool {
    observed.spec.driver != expected.spec.driver
        || observed.spec.node_name != expected.spec.node_name
        || observed.spec.pool.name != expected.spec.pool.name
}

/// Decides the writes that turn `observed` (the API server's slices of this
/// node and driver) into `desired` (built by [`build_slices`], generation
/// ignored), and updates `state` with the generation being published.
pub fn plan(desired: &[ResourceSlice], observed: &[ResourceSlice], state: &mut PoolState) -> Plan {
    let pool = desired
        .first()
        .map(|s| s.spec.pool.name.clone())
        .unwrap_or_default();
    let fp = fingerprint(desired);
    let by_name: BTreeMap<&str, &ResourceSlice> = observed
        .iter()
        .filter_map(|s| s.metadata.name.as_deref().map(|n| (n, s)))
        .collect();
    let observed_max = observed
        .iter()
        .filter(|s| s.spec.pool.name == pool)
        .map(|s| s.spec.pool.generation)
        .max();

    let generation = match &state.published {
        Some((g, content)) if *content == fp => match observed_max {
            Some(m) if m > *g => m + 1,
            _ => *g,
        },
        Some((g, _)) => (*g).max(observed_max.unwrap_or(0)) + 1,
        None => adoptable(desired, observed).unwrap_or_else(|| observed_max.map_or(0, |m| m + 1)),
    };
    state.published = Some((generation, fp));

    let mut ops = Vec::new();
    let mut recreate = Vec::new();
    for d in desired {
        let expected = with_generation(d, generation);
        let name = expected.metadata.name.as_deref().unwrap_or_default();
        match by_name.get(name) {
            Some(o) if immutable_differs(o, &expected) => recreate.push(expected),
            Some(o) if in_sync(o, &expected, state) => {}
            _ => ops.push(Op::Apply(Box::new(expected))),
        }
    }
    for r in recreate {
        let name = r.metadata.name.clone().unwrap_or_default();
        ops.push(Op::Delete(name));
        ops.push(Op::Apply(Box::new(r)));
    }
    let wanted: Vec<&str> = desired
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    for name in by_name.keys() {
        if !wanted.contains(name) {
            ops.push(Op::Delete((*name).to_owned()));
        }
    }
    Plan { generation, ops }
}

/// The generation at which `observed` already is exactly `desired`, if so.
fn adoptable(desired: &[ResourceSlice], observed: &[ResourceSlice]) -> Option<i64> {
    if desired.len() != observed.len() {
        return None;
    }
    let generation = observed.first()?.spec.pool.generation;
    let by_name: BTreeMap<&str, &ResourceSlice> = observed
        .iter()
        .filter_map(|s| s.metadata.name.as_deref().map(|n| (n, s)))
        .collect();
    desired
        .iter()
        .all(|d| {
            let name = d.metadata.name.as_deref().unwrap_or_default();
            by_name
                .get(name)
                .is_some_and(|o| comparable(o) == comparable(&with_generation(d, generation)))
        })
        .then_some(generation)
}

/// Records that applying slice `name` returned `resource_version`.
pub fn record_write(
    state: &mut PoolState,
    applied: &ResourceSlice,
    resource_version: Option<String>,
) {
    let Some(name) = applied.metadata.name.clone() else {
        return;
    };
    match resource_version {
        Some(rv) => {
            state.written.insert(name, (rv, comparable(applied)));
        }
        None => {
            state.written.remove(&name);
        }
    }
}

/// Records that slice `name` was deleted.
pub fn record_delete(state: &mut PoolState, name: &str) {
    state.written.remove(name);
}

#[cfg(test)]
mod tests;
