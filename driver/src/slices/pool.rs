//! The node's pool as `ResourceSlice` objects, and the pure decision of which
//! writes bring the API server's copy to the desired state.
//!
//! Generation rules (the pool's consumers use only the highest generation and
//! wait for `resourceSliceCount` slices of it):
//! - new content: generation = max(ours, any seen in the pool) + 1, every
//!   slice rewritten with it, then surplus slices deleted;
//! - new content in the same layout (the same slices, each with the same
//!   devices and counter sets, only what they say of them changed, such as
//!   a health taint): the generation stays and only the slices that changed
//!   are written, in place (KEP-5055: a change confined to slices needs no
//!   generation bump; no device ever appears twice or goes missing, since
//!   none moves between slices);
//! - unchanged content, slices deleted or changed behind our back: they are
//!   restored at the same generation (the content of that generation does
//!   not change), unless something in the pool claims a higher generation, in
//!   which case everything is rewritten above it;
//! - first reconcile after a start: when the API server already holds exactly
//!   the desired pool (a restart with the same GPUs), it is adopted as is, at
//!   its generation, without a write.
//!
//! A slice counts as in sync when it is at the plan's generation and equals
//! the desired one after normalisation (quantity spelling, server-set taint
//! times, empty fields), or when it is still the very object our last write
//! of the same content returned (same `resourceVersion`): so a server that
//! drops fields it does not know (a disabled feature gate) does not make the
//! publisher rewrite forever.
//!
//! Memory: slices are compared by 128-bit digests of their content
//! ([`comparable`]). The API server's slices are reduced to [`Observed`]
//! summaries as they are decoded, the desired ones to [`Wanted`]; between
//! reconciles only digests are kept ([`PoolState`]), never a copy of the
//! pool.

use std::collections::BTreeMap;

use crate::devices::k8s;
use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::digest::{self, Digest};
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

/// Struct fields [`comparable`] leaves out: the pool generation, which
/// [`plan`] compares on its own.
const SKIP: digest::Skip = &[("ResourcePool", "generation")];

/// The digest of what matters of a slice for comparison: the spec
/// (quantities by value, taint times, empty fields and the pool generation
/// left out) and the owners' kind, name and UID. Computed in one pass over
/// the slice, without a copy.
pub fn comparable(slice: &ResourceSlice) -> Digest {
    #[derive(serde::Serialize)]
    struct Comparable<'a> {
        spec: &'a ResourceSliceSpec,
        owners: Vec<(&'a str, &'a str, &'a str)>,
    }
    let mut owners: Vec<(&str, &str, &str)> = slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.as_str(), o.name.as_str(), o.uid.as_str()))
        .collect();
    owners.sort_unstable();
    digest::of(
        &Comparable {
            spec: &slice.spec,
            owners,
        },
        SKIP,
    )
}

/// What the publisher remembers between reconciles: digests, never copies
/// of the pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolState {
    /// The generation being published and the content it stands for (the
    /// [`comparable`] digest of each desired slice, in order).
    pub published: Option<(i64, Vec<Digest>)>,
    /// The layout of that content: each slice's name, devices and counter
    /// sets ([`Wanted::layout`]), in order.
    pub published_layout: Option<Vec<Digest>>,
    /// Per slice name: what our last write of it returned and held.
    pub written: BTreeMap<String, Written>,
}

/// One slice as our last write left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The `resourceVersion` the API server returned.
    pub resource_version: String,
    /// The pool generation written.
    pub generation: i64,
    /// The [`comparable`] digest of what we sent.
    pub content: Digest,
}

/// One write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or update (server-side apply) the desired slice at this index
    /// (as [`plan`] left it, at the plan's generation).
    Apply(usize),
    /// Delete the slice of this name.
    Delete(String),
}

/// The writes of one reconcile, in waves: the writes of one wave do not
/// depend on each other and may run concurrently; a wave starts when the one
/// before it has finished.
///
/// Waves, in order: deletions of slices that must be created anew
/// (immutable fields differ); applies of slices without devices (1.35
/// counter sets, so they exist before the devices that consume them);
/// applies of slices with devices; deletions of slices the pool no longer
/// has. Applies come before deletions, so the pool never lacks the new
/// generation's slices while old ones go away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The pool generation after the writes.
    pub generation: i64,
    /// The writes, wave by wave; no wave is empty.
    pub waves: Vec<Vec<Op>>,
}

impl Plan {
    /// Every write, in order.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.waves.iter().flatten()
    }

    /// The number of writes.
    pub fn len(&self) -> usize {
        self.waves.iter().map(Vec::len).sum()
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.waves.is_empty()
    }
}

/// A slice on the API server, reduced to what [`plan`] compares: no copy
/// of its content, just its digest. Listing the pool decodes each slice
/// straight into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Object name.
    pub name: String,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `spec.driver` (immutable).
    pub driver: String,
    /// `spec.nodeName` (immutable).
    pub node_name: Option<String>,
    /// `spec.pool.name` (immutable).
    pub pool: String,
    /// `spec.pool.generation`.
    pub generation: i64,
    /// [`comparable`] digest.
    pub content: Digest,
}

impl Observed {
    /// The summary of `slice`; `None` when it has no name.
    pub fn of(slice: &ResourceSlice) -> Option<Self> {
        Some(Self {
            name: slice.metadata.name.clone()?,
            resource_version: slice.metadata.resource_version.clone(),
            driver: slice.spec.driver.clone(),
            node_name: slice.spec.node_name.clone(),
            pool: slice.spec.pool.name.clone(),
            generation: slice.spec.pool.generation,
            content: comparable(slice),
        })
    }
}

/// A desired slice, reduced to what [`plan_wanted`] compares. The
/// publisher keeps these for the pool it published, so a reconcile that
/// finds the pool in sync needs no desired slices at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Object name.
    pub name: String,
    /// `spec.driver`.
    pub driver: String,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// `spec.pool.name`.
    pub pool: String,
    /// Whether it holds devices (else counter sets only, or nothing).
    pub has_devices: bool,
    /// [`comparable`] digest.
    pub content: Digest,
    /// Digest of its name, pool size and the names of its devices and
    /// counter sets: what must stay for an in-place update.
    pub layout: Digest,
}

impl Wanted {
    /// The summary of desired slice `slice`.
    pub fn of(slice: &ResourceSlice) -> Self {
        Self {
            name: slice.metadata.name.clone().unwrap_or_default(),
            driver: slice.spec.driver.clone(),
            node_name: slice.spec.node_name.clone(),
            pool: slice.spec.pool.name.clone(),
            has_devices: slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()),
            content: comparable(slice),
            layout: layout(slice),
        }
    }
}

/// The digest of what places devices in `slice`: its name, the pool's
/// slice count, and the names of its devices and counter sets.
fn layout(slice: &ResourceSlice) -> Digest {
    let devices: Vec<&str> = slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .collect();
    let counters: Vec<&str> = slice
        .spec
        .shared_counters
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    digest::of(
        &(
            slice.metadata.name.as_deref().unwrap_or_default(),
            slice.spec.pool.resource_slice_count,
            devices,
            counters,
        ),
        &[],
    )
}

/// Whether `observed` can be kept as `wanted` at `generation`.
fn in_sync(observed: &Observed, wanted: &Wanted, generation: i64, state: &PoolState) -> bool {
    if observed.generation == generation && observed.content == wanted.content {
        return true;
    }
    // Still the very object our last write of this content returned: the
    // server dropped or changed fields it does not know, and rewriting would
    // not help.
    match (state.written.get(&wanted.name), &observed.resource_version) {
        (Some(w), Some(seen)) => {
            w.resource_version == *seen && w.generation == generation && w.content == wanted.content
        }
        _ => false,
    }
}

/// Whether a slice's immutable fields differ from the desired ones, so it
/// must be deleted and created again rather than updated.
fn immutable_differs(observed: &Observed, wanted: &Wanted) -> bool {
    observed.driver != wanted.driver
        || observed.node_name != wanted.node_name
        || observed.pool != wanted.pool
}

/// Decides the writes that turn `observed` (the API server's slices of this
/// node and driver) into `desired` (built by [`build_slices`], generation
/// ignored), sets every desired slice's generation to the plan's, and
/// updates `state` with the generation being published. [`Op::Apply`]
/// indexes `desired`.
pub fn plan(desired: &mut [ResourceSlice], observed: &[Observed], state: &mut PoolState) -> Plan {
    let wanted: Vec<Wanted> = desired.iter().map(Wanted::of).collect();
    let plan = plan_wanted(&wanted, observed, state);
    for d in desired.iter_mut() {
        d.spec.pool.generation = plan.generation;
    }
    plan
}

/// [`plan`] on the summaries of the desired slices ([`Op::Apply`] indexes
/// `desired`).
pub fn plan_wanted(desired: &[Wanted], observed: &[Observed], state: &mut PoolState) -> Plan {
    let pool = desired.first().map(|w| w.pool.as_str()).unwrap_or_default();
    let fp: Vec<Digest> = desired.iter().map(|w| w.content).collect();
    let layout: Vec<Digest> = desired.iter().map(|w| w.layout).collect();
    let same_layout = state.published_layout.as_ref() == Some(&layout);
    let by_name: BTreeMap<&str, &Observed> =
        observed.iter().map(|o| (o.name.as_str(), o)).collect();
    let observed_max = observed
        .iter()
        .filter(|o| o.pool == pool)
        .map(|o| o.generation)
        .max();

    let generation = match &state.published {
        // Unchanged content, or changed in place: the same generation,
        // unless something in the pool claims a higher one.
        Some((g, content)) if *content == fp || same_layout => match observed_max {
            Some(m) if m > *g => m + 1,
            _ => *g,
        },
        Some((g, _)) => (*g).max(observed_max.unwrap_or(0)) + 1,
        None => adoptable(desired, &by_name).unwrap_or_else(|| observed_max.map_or(0, |m| m + 1)),
    };

    let mut recreate = Vec::new();
    let mut counters = Vec::new();
    let mut devices = Vec::new();
    for (i, w) in desired.iter().enumerate() {
        let wave = if w.has_devices {
            &mut devices
        } else {
            &mut counters
        };
        match by_name.get(w.name.as_str()) {
            Some(o) if immutable_differs(o, w) => {
                recreate.push(Op::Delete(w.name.clone()));
                wave.push(Op::Apply(i));
            }
            Some(o) if in_sync(o, w, generation, state) => {}
            _ => wave.push(Op::Apply(i)),
        }
    }
    let surplus: Vec<Op> = by_name
        .keys()
        .filter(|name| !desired.iter().any(|w| w.name == **name))
        .map(|name| Op::Delete((*name).to_owned()))
        .collect();
    state.published = Some((generation, fp));
    state.published_layout = Some(layout);
    Plan {
        generation,
        waves: [recreate, counters, devices, surplus]
            .into_iter()
            .filter(|w| !w.is_empty())
            .collect(),
    }
}

/// The generation at which `observed` already is exactly `desired`, if so.
fn adoptable(desired: &[Wanted], observed: &BTreeMap<&str, &Observed>) -> Option<i64> {
    if desired.len() != observed.len() {
        return None;
    }
    let generation = observed.values().next()?.generation;
    desired
        .iter()
        .all(|w| {
            observed
                .get(w.name.as_str())
                .is_some_and(|o| o.generation == generation && o.content == w.content)
        })
        .then_some(generation)
}

/// Records that applying the desired slice `applied` (its summary; its
/// digest is not computed again) at `generation` returned
/// `resource_version` (`None`: the answer had none, so nothing is
/// remembered).
pub fn record_write(
    state: &mut PoolState,
    applied: &Wanted,
    generation: i64,
    resource_version: Option<String>,
) {
    match resource_version {
        Some(resource_version) => {
            state.written.insert(
                applied.name.clone(),
                Written {
                    resource_version,
                    generation,
                    content: applied.content,
                },
            );
        }
        None => {
            state.written.remove(&applied.name);
        }
    }
}

/// Records that slice `name` was deleted.
pub fn record_delete(state: &mut PoolState, name: &str) {
    state.written.remove(name);
}

#[cfg(test)]
mod tests;
