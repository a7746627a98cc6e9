//! Why a claim does not fit: per node and request, how many devices pass
//! each selector, how many of the matching ones are unavailable and why,
//! the "closest" device with the values its failing selector reads, which
//! constraint stands in the way when every request fits on its own, and a
//! one-line summary fit for a Kubernetes Event.

use std::fmt::Write as _;

use super::capacity::Fit;
use super::claim::{Mode, Plan};
use super::device::RawValue;
use super::selectors::Read;
pub use super::selectors::SelectorSource;
use super::state::{Failure, Match, NodeSearch, Slot};

/// Why no node fits.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// Nodes simulated.
    pub nodes_checked: usize,
    /// One per node, in the order simulated.
    pub nodes: Vec<NodeExplanation>,
    /// One line, e.g. "0 of 16 devices match selector 2 of request `gpu`:
    /// ...; closest device `gpu-3` has memory 40Gi".
    pub summary: String,
}

impl Explanation {
    /// The summary cut to at most `max_bytes` bytes (on a character
    /// boundary, ending in `...` when cut), for an Event's note (Kubernetes
    /// allows 1 KiB; selectors can be 10 KiB long).
    pub fn event_note(&self, max_bytes: usize) -> String {
        truncate(&self.summary, max_bytes)
    }
}

fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let keep = max_bytes.saturating_sub(3);
    let end = (0..=keep)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}...", &text[..end])
}

/// Why the claim does not fit one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeExplanation {
    /// The node (`None`: cluster-wide devices only).
    pub node: Option<String>,
    /// Devices the node sees.
    pub devices: usize,
    /// Per request, in claim order.
    pub requests: Vec<RequestReport>,
    /// The verdict.
    pub reason: FailureReason,
    /// One line.
    pub summary: String,
}

/// What keeps the claim off a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureReason {
    /// The node sees no devices at all.
    NoDevices,
    /// This request (none of its alternatives) can be satisfied, even
    /// without the rest of the claim.
    Request {
        /// The request's name.
        request: String,
    },
    /// Every request fits on its own; these constraints (0-based indices
    /// into `spec.devices.constraints`) rule out every combination.
    Constraints {
        /// The constraints.
        constraints: Vec<usize>,
        /// Their descriptions.
        descriptions: Vec<String>,
    },
    /// Every request fits on its own, but not together: they compete for
    /// the same devices, shared counters or capacity.
    Combination,
    /// The diagnosis itself failed (e.g. its search ran out of steps).
    Undetermined {
        /// Why.
        reason: String,
    },
}

/// How each alternative of a request fares on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestReport {
    /// The request.
    pub request: String,
    /// One per alternative: the request itself, or its `firstAvailable`
    /// sub-requests in order.
    pub variants: Vec<VariantReport>,
}

/// How many devices a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// `ExactCount` with this count.
    Count(usize),
    /// `All`.
    All,
}

/// A request (or sub-request) against the devices of a node: a funnel
/// through its selectors, then availability of the matching devices
/// (judged against the already allocated claims only).
#[derive(Debug, Clone, PartialEq)]
pub struct VariantReport {
    /// `req` or `req/sub`.
    pub name: String,
    /// Its DeviceClass.
    pub device_class: String,
    /// Devices needed.
    pub needed: Needed,
    /// An admin-access request.
    pub admin_access: bool,
    /// Devices of the node.
    pub considered: usize,
    /// The class's selectors then the request's, each with the number of
    /// devices that pass it and all before it.
    pub stages: Vec<StageReport>,
    /// Devices on which a selector failed with an error.
    pub selector_errors: usize,
    /// The first such error.
    pub first_error: Option<String>,
    /// Devices that could not be read.
    pub malformed: usize,
    /// Devices passing all selectors.
    pub matching: usize,
    /// Matching devices allocated to other claims.
    pub in_use: usize,
    /// Matching devices whose capacities cannot serve the request (a
    /// requested capacity missing, not allowed by the request policy, or
    /// larger than the device).
    pub capacity_unsuitable: usize,
    /// Matching devices whose capacity other claims have consumed.
    pub capacity_exhausted: usize,
    /// Matching devices whose shared counters allocated devices have
    /// consumed.
    pub counters_exhausted: usize,
    /// The first counter found short, `<counter set>/<counter>`.
    pub counter_shortage: Option<String>,
    /// Matching devices with a taint the request does not tolerate.
    pub tainted: usize,
    /// Matching devices free for this request.
    pub available: usize,
    /// Whether this alternative could be satisfied on its own.
    pub fits_alone: bool,
    /// The non-matching device that passes most selectors (first in
    /// allocation order on ties).
    pub closest: Option<ClosestDevice>,
}

/// One selector of a funnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageReport {
    /// Where it comes from.
    pub source: SelectorSource,
    /// The CEL expression.
    pub expression: String,
    /// Devices passing it and every selector before it.
    pub passed: usize,
}

/// The device that came closest to matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosestDevice {
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// Its node.
    pub node: Option<String>,
    /// Index into the stages of the selector it fails.
    pub failed_stage: usize,
    /// What the failing selector reads of it: (name, value), `None` when
    /// the device does not have it.
    pub values: Vec<(String, Option<String>)>,
}

impl ClosestDevice {
    fn describe(&self) -> String {
        if self.values.is_empty() {
            return format!("closest device `{}`", self.device);
        }
        let values: Vec<String> = self
            .values
            .iter()
            .map(|(name, value)| match value {
                Some(v) => format!("{name} {v}"),
                None => format!("no {name}"),
            })
            .collect();
        format!("closest device `{}` has {}", self.device, values.join(", "))
    }
}

fn show(raw: RawValue<'_>) -> Option<String> {
    match raw {
        RawValue::Missing => None,
        RawValue::Str(s) => Some(format!("{s:?}")),
        RawValue::Int(i) => Some(i.to_string()),
        RawValue::Bool(b) => Some(b.to_string()),
        RawValue::Version(v) | RawValue::Quantity(v) => Some(v.to_owned()),
        RawValue::Malformed => Some("(malformed)".to_owned()),
    }
}

/// The quantity literal of a selector, from its text: the argument of the
/// first `quantity('...')`.
fn quantity_literal(expression: &str) -> Option<i128> {
    let rest = &expression[expression.find("quantity(")? + "quantity(".len()..];
    let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let text = &rest[1..];
    let end = text.find(quote)?;
    gpu_dra_api::quantity::Quantity::parse(&text[..end])
        .ok()
        .map(|q| q.nanos())
}

/// Parses reused by [`quantity_distance`] within one report: the literal
/// of each selector, and the last capacity value parsed (devices of a node
/// mostly repeat their values).
#[derive(Default)]
struct Distances<'a> {
    targets: Vec<(usize, Option<i128>)>,
    last: Option<(RawValue<'a>, Option<i128>)>,
}

/// For a selector reading one capacity and comparing it to a quantity
/// literal: how far the device's capacity is from that literal (smaller is
/// closer). Breaks ties between devices failing the same selector.
fn quantity_distance<'a>(
    search: &mut NodeSearch<'_, 'a>,
    cache: &mut Distances<'a>,
    selector: usize,
    d: usize,
) -> Option<i128> {
    let entry = &search.table.entries[selector];
    let [read @ Read::Capacity(_)] = entry.mentions.as_slice() else {
        return None;
    };
    let target = if let Some(&(_, t)) = cache.targets.iter().find(|(s, _)| *s == selector) {
        t
    } else {
        let t = quantity_literal(entry.selector.expression());
        cache.targets.push((selector, t));
        t
    }?;
    // a memoised selector's only read has a column: its value without
    // going back to the device
    let raw = if entry.projection.as_ref().is_some_and(|p| p.len() == 1) {
        let id = search.value_id(selector, 0, d)?;
        search.snapshot_value(id)?
    } else {
        read.raw(search.devs[d].device.raw, search.driver(d))
    };
    let RawValue::Quantity(text) = raw else {
        return None;
    };
    let value = match cache.last {
        Some((last, value)) if last == raw => value,
        _ => {
            let value = gpu_dra_api::quantity::Quantity::parse(text)
                .ok()
                .map(|q| q.nanos());
            cache.last = Some((raw, value));
            value
        }
    }?;
    Some(value.abs_diff(target).try_into().unwrap_or(i128::MAX))
}

fn variant_report(search: &mut NodeSearch<'_, '_>, v: usize) -> VariantReport {
    let plan = search.plan;
    let variant = &plan.variants[v];
    let selectors = &variant.selectors;
    let mut report = VariantReport {
        name: variant.name.clone(),
        device_class: variant.class.clone(),
        needed: match variant.mode {
            Mode::Count(n) => Needed::Count(n),
            Mode::All => Needed::All,
        },
        admin_access: variant.admin,
        considered: search.devs.len(),
        stages: selectors
            .iter()
            .map(|&s| StageReport {
                source: search.table.entries[s].source.clone(),
                expression: search.table.entries[s].selector.expression().to_owned(),
                passed: 0,
            })
            .collect(),
        selector_errors: 0,
        first_error: None,
        malformed: 0,
        matching: 0,
        in_use: 0,
        capacity_unsuitable: 0,
        capacity_exhausted: 0,
        counters_exhausted: 0,
        counter_shortage: None,
        tainted: 0,
        available: 0,
        fits_alone: false,
        closest: None,
    };
    // (selectors passed, device, distance to the failing selector's quantity)
    let mut best: Option<(usize, usize, Option<i128>)> = None;
    let mut distances = Distances::default();
    for d in 0..search.devs.len() {
        let reached = match search.verdict(v, d) {
            Match::Yes | Match::Unknown => selectors.len(),
            &Match::No(k) => k,
            Match::Failed(failure) => match &**failure {
                Failure::Error(k, e) => {
                    let k = *k;
                    report.selector_errors += 1;
                    if report.first_error.is_none() {
                        let e = e.to_string();
                        let source = &search.table.entries[selectors[k]].source;
                        report.first_error = Some(format!(
                            "{source} on device `{}`: {e}",
                            search.devs[d].device.name()
                        ));
                    }
                    k
                }
                Failure::Malformed(_) => {
                    report.malformed += 1;
                    continue;
                }
            },
        };
        for stage in &mut report.stages[..reached] {
            stage.passed += 1;
        }
        if reached < selectors.len() {
            match best {
                Some((r, _, _)) if reached < r => {}
                Some((r, _, distance)) if reached == r => {
                    let mine = quantity_distance(search, &mut distances, selectors[reached], d);
                    if mine.is_some_and(|m| distance.is_none_or(|b| m < b)) {
                        best = Some((reached, d, mine));
                    }
                }
                _ => {
                    best = Some((
                        reached,
                        d,
                        quantity_distance(search, &mut distances, selectors[reached], d),
                    ));
                }
            }
            continue;
        }
        report.matching += 1;
        let dev = search.devs[d];
        if !variant.admin && dev.in_use() {
            report.in_use += 1;
            continue;
        }
        let Ok(details) = search.details(d) else {
            report.malformed += 1;
            continue;
        };
        if !variant.admin {
            match search.fit(v, d, details, false) {
                Ok(Fit::Fits(_)) => {}
                Ok(Fit::Exhausted(_)) => {
                    report.capacity_exhausted += 1;
                    continue;
                }
                Ok(_) | Err(_) => {
                    report.capacity_unsuitable += 1;
                    continue;
                }
            }
            let node_pool = &search.pools[dev.pool];
            if let Some(pool) = node_pool.prepared
                && !dev.counters_consumed()
                && !NodeSearch::counters_fit(details, node_pool.base)
            {
                report.counters_exhausted += 1;
                if report.counter_shortage.is_none()
                    && let Some(&(c, _)) = details
                        .consumes
                        .iter()
                        .find(|&&(c, amount)| node_pool.base.get(c).is_none_or(|a| *a < amount))
                {
                    let counter = &pool.counters[c];
                    report.counter_shortage = Some(format!("{}/{}", counter.set, counter.name));
                }
                continue;
            }
        }
        if !search.tolerated(v, details) {
            report.tainted += 1;
            continue;
        }
        report.available += 1;
    }
    if let Some((stage, d, _)) = best {
        let dev = search.devs[d];
        let driver = search.driver(d);
        let entry = &search.table.entries[selectors[stage]];
        report.closest = Some(ClosestDevice {
            pool: search.pools[dev.pool].pool.name.to_owned(),
            device: dev.device.name().to_owned(),
            node: search.node.map(str::to_owned),
            failed_stage: stage,
            values: entry
                .mentions
                .iter()
                .map(|r| (r.label(driver), show(r.raw(dev.device.raw, driver))))
                .collect(),
        });
    }
    report.fits_alone = match report.needed {
        // a device serves one slot of a request, shared or not
        Needed::Count(n) => report.available >= n,
        Needed::All => {
            let taken = report.matching - report.capacity_unsuitable - report.capacity_exhausted;
            let blocked =
                report.in_use + report.counters_exhausted + report.tainted + report.malformed;
            taken > 0 && blocked == 0 && taken <= super::MAX_RESULTS_PER_CLAIM
        }
    };
    report
}

/// Which constraints rule out every combination, by searching again
/// without them.
fn diagnose(search: &mut NodeSearch<'_, '_>) -> FailureReason {
    let plan = search.plan;
    let n = plan.constraints.len();
    if n == 0 {
        return FailureReason::Combination;
    }
    let all: u64 = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    let run = |search: &mut NodeSearch<'_, '_>, disabled: u64| {
        search.disabled = disabled;
        let r = search.run();
        search.disabled = 0;
        r
    };
    match run(search, all) {
        Ok(true) => {}
        Ok(false) => return FailureReason::Combination,
        Err(e) => {
            return FailureReason::Undetermined {
                reason: e.to_string(),
            };
        }
    }
    let mut blamed = Vec::new();
    for c in 0..n {
        match run(search, all & !(1 << c)) {
            Ok(true) => {}
            Ok(false) => blamed.push(c),
            Err(e) => {
                return FailureReason::Undetermined {
                    reason: e.to_string(),
                };
            }
        }
    }
    if blamed.is_empty() {
        blamed = (0..n).collect();
    }
    FailureReason::Constraints {
        descriptions: blamed
            .iter()
            .map(|&c| plan.constraints[c].describe(c))
            .collect(),
        constraints: blamed,
    }
}

/// Explains why the search of `search`'s node found nothing.
pub(crate) fn explain_node(search: &mut NodeSearch<'_, '_>) -> NodeExplanation {
    let plan = search.plan;
    let requests: Vec<RequestReport> = plan
        .requests
        .iter()
        .map(|r| RequestReport {
            request: r.name.clone(),
            variants: r
                .variants
                .clone()
                .map(|v| variant_report(search, v))
                .collect(),
        })
        .collect();
    let has_invalid = search
        .order
        .iter()
        .any(|s| matches!(s, Slot::InvalidPool(_)));
    let reason = if search.devs.is_empty() && !has_invalid {
        FailureReason::NoDevices
    } else if let Some(r) = requests
        .iter()
        .find(|r| !r.variants.iter().any(|v| v.fits_alone))
    {
        FailureReason::Request {
            request: r.request.clone(),
        }
    } else {
        diagnose(search)
    };
    let mut explanation = NodeExplanation {
        node: search.node.map(str::to_owned),
        devices: search.devs.len(),
        requests,
        reason,
        summary: String::new(),
    };
    explanation.summary = node_summary(&explanation);
    explanation
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn stage_source(stage: &StageReport, request: &str) -> String {
    match &stage.source {
        SelectorSource::DeviceClass { .. } => format!("{} (request `{request}`)", stage.source),
        SelectorSource::Request { .. } => stage.source.to_string(),
    }
}

/// The first stage at which fewer devices pass than needed.
fn failing_stage(v: &VariantReport) -> Option<usize> {
    let need = match v.needed {
        Needed::Count(n) => n,
        Needed::All => 1,
    };
    v.stages.iter().position(|s| s.passed < need)
}

fn unavailable_reasons(v: &VariantReport) -> String {
    let reasons: Vec<String> = [
        (v.in_use, "in use by other claims"),
        (v.counters_exhausted, "without enough free shared counters"),
        (v.capacity_exhausted, "without enough free capacity"),
        (
            v.capacity_unsuitable,
            "whose capacity cannot serve the request",
        ),
        (v.tainted, "with taints the request does not tolerate"),
        (v.malformed, "malformed"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    let mut text = reasons.join(", ");
    if let Some(c) = &v.counter_shortage {
        let _ = write!(text, "; short of counter {c}");
    }
    text
}

/// One line about an alternative that does not fit.
pub(crate) fn variant_summary(v: &VariantReport) -> String {
    if v.considered == 0 {
        return format!("no devices for request `{}`", v.name);
    }
    if let Needed::Count(n) = v.needed
        && v.considered < n
    {
        return format!(
            "request `{}` needs {}, but the node has only {} ({} match its selectors)",
            v.name,
            plural(n, "device", "devices"),
            plural(v.considered, "device", "devices"),
            v.matching
        );
    }
    if let Some(k) = failing_stage(v) {
        let stage = &v.stages[k];
        let source = stage_source(stage, &v.name);
        let mut text = if stage.passed == 0 {
            format!(
                "0 of {} match {source}",
                plural(v.considered, "device", "devices")
            )
        } else {
            let need = match v.needed {
                Needed::Count(n) => n,
                Needed::All => 1,
            };
            format!(
                "only {} of {} {} {source} ({need} needed)",
                stage.passed,
                plural(v.considered, "device", "devices"),
                if stage.passed == 1 {
                    "matches"
                } else {
                    "match"
                }
            )
        };
        text.push_str(": ");
        text.push_str(&stage.expression);
        if let Some(c) = v.closest.as_ref().filter(|c| c.failed_stage == k) {
            text.push_str("; ");
            text.push_str(&c.describe());
        }
        if let Some(e) = &v.first_error {
            let _ = write!(
                text,
                " ({} failed with an error, first: {e})",
                plural(v.selector_errors, "device", "devices")
            );
        }
        return text;
    }
    let unavailable = v.matching - v.available;
    match v.needed {
        Needed::Count(n) => format!(
            "request `{}` needs {}: {} of {} {} its selectors, but {} available ({})",
            v.name,
            plural(n, "device", "devices"),
            v.matching,
            plural(v.considered, "device", "devices"),
            if v.matching == 1 { "matches" } else { "match" },
            match v.available {
                0 => "none is".to_owned(),
                1 => "only 1 is".to_owned(),
                a => format!("only {a} are"),
            },
            unavailable_reasons(v)
        ),
        Needed::All => format!(
            "request `{}` asks for all {} matching devices, but {} cannot be allocated ({})",
            v.name,
            v.matching,
            unavailable,
            unavailable_reasons(v)
        ),
    }
}

fn request_summary(r: &RequestReport) -> String {
    if let [v] = r.variants.as_slice() {
        return variant_summary(v);
    }
    let parts: Vec<String> = r
        .variants
        .iter()
        .map(|v| format!("`{}`: {}", v.name, variant_summary(v)))
        .collect();
    format!(
        "no alternative of request `{}` fits: {}",
        r.request,
        parts.join("; ")
    )
}

fn node_summary(n: &NodeExplanation) -> String {
    match &n.reason {
        FailureReason::NoDevices => "no devices are available".to_owned(),
        FailureReason::Request { request } => n
            .requests
            .iter()
            .find(|r| r.request == *request)
            .map(request_summary)
            .unwrap_or_default(),
        FailureReason::Constraints { descriptions, .. } => format!(
            "every request fits on its own, but no combination of devices satisfies {}",
            descriptions.join(" together with ")
        ),
        FailureReason::Combination => {
            "every request fits on its own, but not together: they compete for the same devices, shared counters or capacity"
                .to_owned()
        }
        FailureReason::Undetermined { reason } => format!("no fit, and the diagnosis failed: {reason}"),
    }
}

/// How far a node got, for picking the node to report.
fn progress(n: &NodeExplanation, plan: &Plan) -> (u8, usize, usize) {
    match &n.reason {
        FailureReason::NoDevices => (0, 0, 0),
        FailureReason::Request { request } => {
            let index = plan
                .requests
                .iter()
                .position(|r| r.name == *request)
                .unwrap_or(0);
            let best = n
                .requests
                .get(index)
                .into_iter()
                .flat_map(|r| &r.variants)
                .map(|v| failing_stage(v).unwrap_or(v.stages.len() + 1 + v.available))
                .max()
                .unwrap_or(0);
            (1, index, best)
        }
        _ => (2, 0, 0),
    }
}

fn node_name(n: &NodeExplanation) -> String {
    n.node
        .as_deref()
        .map_or_else(|| "(any node)".to_owned(), |x| format!("`{x}`"))
}

/// When every node fails at the same selector of the same single-variant
/// request with no device passing it: totals over all nodes.
fn aggregated(nodes: &[NodeExplanation]) -> Option<String> {
    let FailureReason::Request { request } = &nodes.first()?.reason else {
        return None;
    };
    let mut considered = 0;
    let mut stage_index = None;
    let mut closest: Option<&ClosestDevice> = None;
    let mut first: Option<&VariantReport> = None;
    for n in nodes {
        if n.reason != nodes[0].reason {
            return None;
        }
        let [v] = n
            .requests
            .iter()
            .find(|r| r.request == *request)?
            .variants
            .as_slice()
        else {
            return None;
        };
        let k = failing_stage(v)?;
        if v.stages[k].passed != 0 || stage_index.is_some_and(|s| s != k) || v.selector_errors > 0 {
            return None;
        }
        stage_index = Some(k);
        considered += v.considered;
        first.get_or_insert(v);
        if closest.is_none() {
            closest = v.closest.as_ref().filter(|c| c.failed_stage == k);
        }
    }
    let (v, k) = (first?, stage_index?);
    let stage = &v.stages[k];
    let mut text = format!(
        "0 of {} on {} match {}: {}",
        plural(considered, "device", "devices"),
        plural(nodes.len(), "node", "nodes"),
        stage_source(stage, &v.name),
        stage.expression
    );
    if let Some(c) = closest {
        text.push_str("; ");
        text.push_str(&c.describe());
        if let Some(node) = &c.node {
            let _ = write!(text, " (node `{node}`)");
        }
    }
    Some(text)
}

/// The explanation over all simulated nodes.
pub(crate) fn explanation(nodes: Vec<NodeExplanation>, plan: &Plan) -> Explanation {
    let summary = match nodes.as_slice() {
        [] => "no node to simulate: no ResourceSlice publishes devices for a node or for all nodes"
            .to_owned(),
        [n] => match &n.node {
            Some(node) => format!("node `{node}`: {}", n.summary),
            None => n.summary.clone(),
        },
        many => aggregated(many).unwrap_or_else(|| {
            let mut best = &many[0];
            for n in &many[1..] {
                if progress(n, plan) > progress(best, plan) {
                    best = n;
                }
            }
            format!(
                "no node fits ({} checked); closest is node {}: {}",
                plural(many.len(), "node", "nodes"),
                node_name(best),
                best.summary
            )
        }),
    };
    Explanation {
        nodes_checked: nodes.len(),
        nodes,
        summary,
    }
}
