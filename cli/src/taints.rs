//! The health view of `gpu-dra health` (and the demo): the ResourceSlices
//! of `gpu.nvidia.com`, read as plain
//! JSON and leniently (a malformed slice, device or taint becomes a
//! [`Problem`] in the report, never the failure of the whole view), grouped
//! per node and per GPU, with every taint explained through
//! [`gpu_dra_api::health`].
//!
//! What a slice is trusted for: its node, pool and generation (only each
//! pool's newest generation is shown; older slices are on their way out),
//! its devices' names, a few attributes (`type`, `uuid`, `parentUUID`,
//! `productName`) and `taints`. Every string shown is cut to
//! [`MAX_TEXT`] characters; a device shows at most [`MAX_TAINTS_SHOWN`]
//! taints (the API allows 16), the rest counted.

use std::collections::{BTreeMap, HashSet};

use gpu_dra_api::health;
use serde::Serialize;
use serde_json::{Map, Value};

pub mod render;

/// The driver whose slices are read.
pub const DRIVER: &str = "gpu.nvidia.com";
/// The most taints listed per device; more are counted in
/// [`DeviceReport::omitted_taints`].
pub const MAX_TAINTS_SHOWN: usize = 64;
/// The most characters of any string from a slice that the report holds.
pub const MAX_TEXT: usize = 256;
/// Taints per device the API allows (Kubernetes 1.35+; 4 on 1.34).
const API_MAX_TAINTS: usize = 16;
/// Devices per slice the API allows.
const API_MAX_DEVICES: usize = 128;

/// One ResourceSlice and where it came from, for messages.
pub struct SliceInput<'a> {
    /// The object (`resource.k8s.io` v1, v1beta2 or v1beta1).
    pub value: &'a Value,
    /// Where it is: `file:line` or `ResourceSlice <name>`.
    pub place: Box<dyn Fn(&str) -> String + 'a>,
}

/// Something wrong in the input, with where it is.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// File and line, or the slice, and the field.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

/// The whole view.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Always [`DRIVER`].
    pub driver: &'static str,
    /// The nodes, by name.
    pub nodes: Vec<NodeReport>,
    /// Counts over all nodes.
    pub summary: Summary,
    /// Malformed input that was skipped or shown as found.
    pub problems: Vec<Problem>,
    /// Remarks about the input (skipped objects, incomplete pools).
    pub notes: Vec<String>,
}

/// Counts over the shown devices.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes shown.
    pub nodes: usize,
    /// GPUs shown.
    pub gpus: usize,
    /// Devices shown.
    pub devices: usize,
    /// Devices with at least one taint.
    pub tainted_devices: usize,
    /// Devices the scheduler will not allocate (a `NoSchedule` or
    /// `NoExecute` taint).
    pub unschedulable_devices: usize,
    /// GPUs per state.
    pub gpus_by_state: BTreeMap<GpuState, usize>,
}

/// One node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// `spec.nodeName` (or `(no nodeName)`).
    pub node: String,
    /// The pools published for it.
    pub pools: Vec<PoolInfo>,
    /// Its GPUs: by minor number, then those found by UUID only, then
    /// devices no GPU could be found for.
    pub gpus: Vec<GpuReport>,
}

/// A pool, at its newest generation.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolInfo {
    /// `spec.pool.name`.
    pub name: String,
    /// The newest `spec.pool.generation`.
    pub generation: i64,
    /// Slices seen at that generation.
    pub slices: usize,
    /// `spec.pool.resourceSliceCount`, when given.
    pub resource_slice_count: Option<i64>,
}

/// What a GPU's taints amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum GpuState {
    /// No device on it has a taint.
    NoTaints,
    /// Only taints that do not stop scheduling (`None`, unknown effects).
    Informational,
    /// Some of its devices (e.g. one MIG device) are not schedulable.
    PartlyUnschedulable,
    /// None of its devices is schedulable.
    Unschedulable,
    /// A `NoExecute` taint: pods using the device are evicted.
    NoExecute,
}

impl GpuState {
    /// For people.
    pub fn text(self) -> &'static str {
        match self {
            Self::NoTaints => "no taints",
            Self::Informational => "informational taints only (schedulable)",
            Self::PartlyUnschedulable => "partly unschedulable",
            Self::Unschedulable => "unschedulable",
            Self::NoExecute => "NoExecute: pods using it are evicted",
        }
    }
}

/// One GPU and the devices on it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// The device minor (from the device names `gpu-<minor>...`).
    pub minor: Option<u32>,
    /// The GPU's UUID (its full device's `uuid`, or its MIG devices'
    /// `parentUUID`).
    pub uuid: Option<String>,
    /// `productName`.
    pub product_name: Option<String>,
    /// What its taints amount to.
    pub state: GpuState,
    /// Its devices, by name.
    pub devices: Vec<DeviceReport>,
}

/// One published device.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    /// The device name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// The `type` attribute (`gpu`, `mig`).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The `uuid` attribute.
    pub uuid: Option<String>,
    /// Whether the scheduler may allocate it (no `NoSchedule` or
    /// `NoExecute` taint).
    pub schedulable: bool,
    /// Its taints, as published (at most [`MAX_TAINTS_SHOWN`]).
    pub taints: Vec<TaintReport>,
    /// Taints not listed beyond [`MAX_TAINTS_SHOWN`].
    pub omitted_taints: usize,
}

/// One taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaintReport {
    /// `key`.
    pub key: String,
    /// `value`, when set.
    pub value: Option<String>,
    /// `effect`.
    pub effect: String,
    /// `timeAdded`, when set.
    pub time_added: Option<String>,
    /// Whether the key is one of the driver's health keys.
    pub known: bool,
    /// What it means.
    pub meaning: String,
}

impl TaintReport {
    /// Whether the scheduler keeps new allocations off the device.
    pub fn blocks(&self) -> bool {
        matches!(self.effect.as_str(), "NoSchedule" | "NoExecute")
    }
}

/// Builds the report of `slices`, limited to `node` when given.
pub fn build(slices: &[SliceInput<'_>], node: Option<&str>) -> Report {
    let mut b = Builder::default();
    for slice in slices {
        b.slice(slice, node);
    }
    b.finish()
}

/// A device on its way into a GPU group.
struct Found {
    device: DeviceReport,
    /// `parentUUID`.
    parent: Option<String>,
    product: Option<String>,
}

/// What is known about a pool so far.
#[derive(Default)]
struct Pool {
    generation: i64,
    slices: usize,
    count: Option<i64>,
    older: usize,
    /// Devices of the newest generation.
    devices: Vec<Found>,
    names: HashSet<String>,
}

#[derive(Default)]
struct Builder {
    /// Node name, pool name → pool.
    pools: BTreeMap<(String, String), Pool>,
    problems: Vec<Problem>,
    notes: Vec<String>,
    other_drivers: usize,
    other_nodes: usize,
    /// The first few other nodes' names, for the note.
    other_node_names: std::collections::BTreeSet<String>,
}

/// How many other nodes the note names.
const OTHER_NODES_NAMED: usize = 10;

/// `s` cut to [`MAX_TEXT`] characters (with `…` when cut).
pub fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_TEXT) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// A string field of `obj`.
fn string<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v str> {
    obj.get(key).and_then(Value::as_str)
}

/// A string attribute of a device (`attributes.<name>.string`).
fn attribute(body: &Map<String, Value>, name: &str) -> Option<String> {
    let attrs = body.get("attributes")?.as_object()?;
    let attr = attrs
        .get(name)
        .or_else(|| attrs.get(&format!("{DRIVER}/{name}")))?;
    attr.get("string").and_then(Value::as_str).map(cut)
}

/// Whether `key` is a valid label name (`[prefix/]name`), as taint keys
/// must be.
fn valid_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(gpu_dra_api::schema::is_dns_subdomain);
    prefix_ok && !name.is_empty() && valid_value(name)
}

/// Whether `value` is a valid label value.
fn valid_value(value: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && alnum(value.chars().next())
            && alnum(value.chars().last()))
}

/// What a taint with `key`, `value` and `effect` means.
fn meaning(key: &str, value: &str, effect: &str) -> (bool, String) {
    let (known, mut text) = match health::explain(key, value, effect) {
        Some(text) => (true, text),
        None if key.starts_with(&format!("{DRIVER}/")) => (
            false,
            format!("not a health key this gpu-dra knows (a newer driver?); {DRIVER}'s own key"),
        ),
        None => (
            false,
            "not a health key of this driver: someone else put it on the slice".to_owned(),
        ),
    };
    if !matches!(effect, "None" | "NoSchedule" | "NoExecute") {
        text.push_str("; unknown effect: the scheduler treats it like None");
    }
    (known, text)
}

impl Builder {
    fn problem(&mut self, at: String, message: impl Into<String>) {
        self.problems.push(Problem {
            at,
            message: message.into(),
        });
    }

    fn slice(&mut self, input: &SliceInput<'_>, only: Option<&str>) {
        let place = &input.place;
        let Some(spec) = input.value.get("spec").and_then(Value::as_object) else {
            self.problem(place("spec"), "no spec object: slice skipped");
            return;
        };
        let Some(driver) = string(spec, "driver") else {
            self.problem(place("spec.driver"), "no driver: slice skipped");
            return;
        };
        if driver != DRIVER {
            self.other_drivers += 1;
            return;
        }
        let node = match spec.get("nodeName") {
            Some(Value::String(n)) => cut(n),
            _ => "(no nodeName)".to_owned(),
        };
        if only.is_some_and(|n| n != node) {
            self.other_nodes += 1;
            if self.other_node_names.len() < OTHER_NODES_NAMED {
                self.other_node_names.insert(node);
            }
            return;
        }
        let pool_obj = spec.get("pool").and_then(Value::as_object);
        let pool_name = if let Some(n) = pool_obj.and_then(|p| string(p, "name")) {
            cut(n)
        } else {
            self.problem(place("spec.pool.name"), "no pool name");
            "(no pool)".to_owned()
        };
        let generation = match pool_obj.and_then(|p| p.get("generation")) {
            Some(g) if g.as_i64().is_some() => g.as_i64().unwrap_or_default(),
            _ => {
                self.problem(
                    place("spec.pool.generation"),
                    "no integer generation: taken as 0",
                );
                0
            }
        };
        let count = pool_obj
            .and_then(|p| p.get("resourceSliceCount"))
            .and_then(Value::as_i64);
        let devices = match spec.get("devices") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(d)) => d.as_slice(),
            Some(_) => {
                self.problem(place("spec.devices"), "not a list: no devices read");
                &[][..]
            }
        };
        if devices.len() > API_MAX_DEVICES {
            self.problem(
                place("spec.devices"),
                format!(
                    "{} devices, more than a slice may hold ({API_MAX_DEVICES})",
                    devices.len()
                ),
            );
        }
        let key = (node, pool_name);
        let mut found = Vec::new();
        for (i, device) in devices.iter().enumerate() {
            if let Some(f) = self.device(device, &format!("spec.devices[{i}]"), &key.1, place) {
                found.push(f);
            }
        }
        let pool = self.pools.entry(key).or_default();
        if pool.slices > 0 && generation < pool.generation {
            pool.older += 1;
            return;
        }
        if pool.slices > 0 && generation > pool.generation {
            pool.older += pool.slices;
            pool.slices = 0;
            pool.devices.clear();
            pool.names.clear();
        }
        pool.generation = generation;
        pool.slices += 1;
        pool.count = count.or(pool.count);
        let mut twice = Vec::new();
        for f in found {
            if pool.names.insert(f.device.name.clone()) {
                pool.devices.push(f);
            } else {
                twice.push(f.device.name);
            }
        }
        for name in twice {
            self.problem(
                place("spec.devices"),
                format!("device {name} is published twice in its pool: the later one is ignored"),
            );
        }
    }

    /// One device, or `None` (and a problem) when it has no name.
    fn device(
        &mut self,
        device: &Value,
        path: &str,
        pool: &str,
        place: &dyn Fn(&str) -> String,
    ) -> Option<Found> {
        let Some(obj) = device.as_object() else {
            self.problem(place(path), "a device that is not an object: skipped");
            return None;
        };
        // v1beta1 wraps a device's fields in `basic`.
        let body = obj.get("basic").and_then(Value::as_object).unwrap_or(obj);
        let Some(name) = string(obj, "name") else {
            self.problem(
                place(&format!("{path}.name")),
                "a device without a name: skipped",
            );
            return None;
        };
        let name = cut(name);
        let taint_path = if obj.contains_key("basic") {
            format!("{path}.basic.taints")
        } else {
            format!("{path}.taints")
        };
        let taints = match body.get("taints") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(t)) => t.as_slice(),
            Some(_) => {
                self.problem(place(&taint_path), "taints is not a list: none read");
                &[][..]
            }
        };
        if taints.len() > API_MAX_TAINTS {
            self.problem(
                place(&taint_path),
                format!(
                    "device {name} has {} taints, more than the API allows ({API_MAX_TAINTS})",
                    taints.len()
                ),
            );
        }
        let mut shown = Vec::new();
        let mut omitted = 0;
        for (j, taint) in taints.iter().enumerate() {
            let at = format!("{taint_path}[{j}]");
            if let Some(t) = self.taint(taint, &at, &name, place) {
                if shown.len() < MAX_TAINTS_SHOWN {
                    shown.push(t);
                } else {
                    omitted += 1;
                }
            }
        }
        Some(Found {
            device: DeviceReport {
                schedulable: !shown.iter().any(TaintReport::blocks),
                name,
                pool: pool.to_owned(),
                kind: attribute(body, "type"),
                uuid: attribute(body, "uuid"),
                taints: shown,
                omitted_taints: omitted,
            },
            parent: attribute(body, "parentUUID"),
            product: attribute(body, "productName"),
        })
    }

    /// One taint, or `None` (and a problem) when it lacks a key or effect.
    fn taint(
        &mut self,
        taint: &Value,
        at: &str,
        device: &str,
        place: &dyn Fn(&str) -> String,
    ) -> Option<TaintReport> {
        let Some(obj) = taint.as_object() else {
            self.problem(
                place(at),
                format!("a taint of device {device} that is not an object: skipped"),
            );
            return None;
        };
        let Some(key) = string(obj, "key").filter(|k| !k.is_empty()) else {
            self.problem(
                place(&format!("{at}.key")),
                format!("a taint of device {device} without a key: skipped"),
            );
            return None;
        };
        let Some(effect) = string(obj, "effect").filter(|e| !e.is_empty()) else {
            self.problem(
                place(&format!("{at}.effect")),
                format!(
                    "taint {} of device {device} without an effect: skipped",
                    cut(key)
                ),
            );
            return None;
        };
        if !valid_key(key) {
            self.problem(
                place(&format!("{at}.key")),
                format!(
                    "taint key {} of device {device} is not a valid label name (the API server would refuse it)",
                    cut(key)
                ),
            );
        }
        let value = match obj.get("value") {
            None | Some(Value::Null) => None,
            Some(Value::String(v)) => Some(v.as_str()),
            Some(_) => {
                self.problem(
                    place(&format!("{at}.value")),
                    format!(
                        "the value of taint {} of device {device} is not a string: ignored",
                        cut(key)
                    ),
                );
                None
            }
        };
        if let Some(v) = value.filter(|v| !valid_value(v)) {
            self.problem(
                place(&format!("{at}.value")),
                format!(
                    "taint value {} of device {device} is not a valid label value",
                    cut(v)
                ),
            );
        }
        let time_added = match obj.get("timeAdded") {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(cut(t)),
            Some(_) => {
                self.problem(
                    place(&format!("{at}.timeAdded")),
                    format!(
                        "timeAdded of taint {} of device {device} is not a string: ignored",
                        cut(key)
                    ),
                );
                None
            }
        };
        if !matches!(effect, "None" | "NoSchedule" | "NoExecute") {
            self.problem(
                place(&format!("{at}.effect")),
                format!(
                    "taint {} of device {device} has the unknown effect {}: the scheduler treats it like None",
                    cut(key),
                    cut(effect)
                ),
            );
        }
        let (known, meaning) = meaning(key, value.unwrap_or(""), effect);
        Some(TaintReport {
            key: cut(key),
            value: value.filter(|v| !v.is_empty()).map(cut),
            effect: cut(effect),
            time_added,
            known,
            meaning,
        })
    }

    fn finish(mut self) -> Report {
        if self.other_drivers > 0 {
            self.notes.push(format!(
                "{} of other drivers skipped",
                plural(self.other_drivers, "ResourceSlice", "ResourceSlices")
            ));
        }
        if self.other_nodes > 0 {
            let names: Vec<&str> = self.other_node_names.iter().map(String::as_str).collect();
            self.notes.push(format!(
                "{} of other nodes skipped ({}{})",
                plural(self.other_nodes, "ResourceSlice", "ResourceSlices"),
                names.join(", "),
                if names.len() == OTHER_NODES_NAMED {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
        let mut nodes: BTreeMap<String, NodeReport> = BTreeMap::new();
        let mut groups: BTreeMap<String, BTreeMap<GpuKey, Vec<Found>>> = BTreeMap::new();
        for ((node, pool_name), pool) in self.pools {
            if pool.older > 0 {
                self.notes.push(format!(
                    "pool {pool_name} of node {node}: {} of generations older than {} ignored (the driver is replacing them)",
                    plural(pool.older, "slice", "slices"),
                    pool.generation
                ));
            }
            if let Some(count) = pool.count
                && i64::try_from(pool.slices).is_ok_and(|seen| seen < count)
            {
                self.notes.push(format!(
                    "pool {pool_name} of node {node}: {} of {count} slices of generation {} seen: the view is incomplete",
                    pool.slices, pool.generation
                ));
            }
            let entry = nodes.entry(node.clone()).or_insert_with(|| NodeReport {
                node: node.clone(),
                pools: Vec::new(),
                gpus: Vec::new(),
            });
            entry.pools.push(PoolInfo {
                name: pool_name,
                generation: pool.generation,
                slices: pool.slices,
                resource_slice_count: pool.count,
            });
            let node_groups = groups.entry(node).or_default();
            for f in pool.devices {
                node_groups.entry(gpu_key(&f)).or_default().push(f);
            }
        }
        let mut summary = Summary::default();
        for (node, node_groups) in groups {
            let Some(report) = nodes.get_mut(&node) else {
                continue;
            };
            for (key, mut found) in node_groups {
                found.sort_by(|a, b| {
                    (&a.device.name, &a.device.pool).cmp(&(&b.device.name, &b.device.pool))
                });
                let gpu = gpu_report(&key, found);
                summary.gpus += 1;
                *summary.gpus_by_state.entry(gpu.state).or_default() += 1;
                for d in &gpu.devices {
                    summary.devices += 1;
                    summary.tainted_devices += usize::from(!d.taints.is_empty());
                    summary.unschedulable_devices += usize::from(!d.schedulable);
                }
                report.gpus.push(gpu);
            }
        }
        summary.nodes = nodes.len();
        Report {
            driver: DRIVER,
            nodes: nodes.into_values().collect(),
            summary,
            problems: self.problems,
            notes: self.notes,
        }
    }
}

/// Which GPU a device sits on: its minor (from the name), else its GPU's
/// UUID, else unknown.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum GpuKey {
    Minor(u32),
    Uuid(String),
    Unknown,
}

/// The minor of `gpu-<minor>` and `gpu-<minor>-...` names.
pub fn name_minor(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("gpu-")?;
    let digits = rest.split('-').next()?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

fn gpu_key(f: &Found) -> GpuKey {
    if let Some(minor) = name_minor(&f.device.name) {
        return GpuKey::Minor(minor);
    }
    let uuid = if f.device.kind.as_deref() == Some("gpu") {
        f.device.uuid.clone()
    } else {
        f.parent.clone()
    };
    uuid.map_or(GpuKey::Unknown, GpuKey::Uuid)
}

fn gpu_report(key: &GpuKey, found: Vec<Found>) -> GpuReport {
    let full = found
        .iter()
        .find(|f| f.device.kind.as_deref() == Some("gpu"))
        .and_then(|f| f.device.uuid.clone());
    let uuid = match key {
        GpuKey::Uuid(u) => Some(u.clone()),
        _ => full.or_else(|| found.iter().find_map(|f| f.parent.clone())),
    };
    let product_name = found.iter().find_map(|f| f.product.clone());
    let devices: Vec<DeviceReport> = found.into_iter().map(|f| f.device).collect();
    let blocked = devices.iter().filter(|d| !d.schedulable).count();
    let state = if devices
        .iter()
        .flat_map(|d| &d.taints)
        .any(|t| t.effect == "NoExecute")
    {
        GpuState::NoExecute
    } else if blocked > 0 && blocked == devices.len() {
        GpuState::Unschedulable
    } else if blocked > 0 {
        GpuState::PartlyUnschedulable
    } else if devices.iter().any(|d| !d.taints.is_empty()) {
        GpuState::Informational
    } else {
        GpuState::NoTaints
    };
    GpuReport {
        minor: match key {
            GpuKey::Minor(m) => Some(*m),
            _ => None,
        },
        uuid,
        product_name,
        state,
        devices,
    }
}

/// `1 slice`, `2 slices`.
pub fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod tests;
