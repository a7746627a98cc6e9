//! One device of a pool as the allocator sees it: where it is available,
//! cheap lookups into its published attributes and capacities (used for
//! memo keys and constraints), and its parsed forms (CEL value; capacities
//! with request policies, counter consumption, taints), parsed once, on
//! first need, and kept apart from the device list so that it stays small.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};

use crate::cel::{AttrValue, CelDevice, DeviceError, split_qualified_name};
use gpu_dra_api::quantity::{Quantity, QuantityError};

/// Where a device can be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope<'a> {
    /// Only on this node.
    Node(&'a str),
    /// On every node (`allNodes`, and, simplified, any `nodeSelector`).
    AnyNode,
    /// No node selection this allocator knows: never used.
    Nowhere,
}

impl Scope<'_> {
    /// The very same scope (the same name in memory, for a node): cheaper
    /// than comparing names.
    pub(crate) fn same(&self, other: &Scope<'_>) -> bool {
        match (self, other) {
            (Scope::Node(a), Scope::Node(b)) => std::ptr::eq(*a, *b),
            (Scope::AnyNode, Scope::AnyNode) | (Scope::Nowhere, Scope::Nowhere) => true,
            _ => false,
        }
    }

    pub(crate) fn includes(&self, node: Option<&str>) -> bool {
        match self {
            Scope::Node(n) => node == Some(*n),
            Scope::AnyNode => true,
            Scope::Nowhere => false,
        }
    }
}

/// A raw attribute or capacity value, as a memo key: equal keys give equal
/// CEL values (the key is finer than CEL equality: `1Gi` and `1024Mi` are
/// different keys).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawValue<'a> {
    /// Not published.
    Missing,
    /// A string (also the driver name).
    Str(&'a str),
    /// An int.
    Int(i64),
    /// A bool (also `allowMultipleAllocations`).
    Bool(bool),
    /// A version, as text.
    Version(&'a str),
    /// A quantity, as text.
    Quantity(&'a str),
    /// Not exactly one value set: converting the device will fail.
    Malformed,
}

impl PartialEq for RawValue<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (RawValue::Str(a), RawValue::Str(b))
            | (RawValue::Version(a), RawValue::Version(b))
            | (RawValue::Quantity(a), RawValue::Quantity(b)) => same(a.as_bytes(), b.as_bytes()),
            (RawValue::Int(a), RawValue::Int(b)) => a == b,
            (RawValue::Bool(a), RawValue::Bool(b)) => a == b,
            (RawValue::Missing, RawValue::Missing) | (RawValue::Malformed, RawValue::Malformed) => {
                true
            }
            _ => false,
        }
    }
}

impl Eq for RawValue<'_> {}

impl Hash for RawValue<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            RawValue::Str(s) | RawValue::Version(s) | RawValue::Quantity(s) => s.hash(state),
            RawValue::Int(i) => i.hash(state),
            RawValue::Bool(b) => b.hash(state),
            RawValue::Missing | RawValue::Malformed => {}
        }
    }
}

/// Whether two short byte strings (names, values) are equal, compared in
/// place: a call to `memcmp` for every compared name costs more than the
/// comparison itself.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    };
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    // the first and the last eight bytes cover up to 16; longer names
    // compare the middle too
    word(a, 0) == word(b, 0)
        && word(a, n - 8) == word(b, n - 8)
        && (n <= 16 || a[8..n - 8] == b[8..n - 8])
}

/// Looks up a published attribute or capacity by domain and id: a name
/// qualified with the driver's domain wins over the bare id, as in
/// Kubernetes. One pass comparing lengths first: a device has at most 32
/// entries, and this is the allocator's hottest loop.
pub(crate) fn lookup<'a, T>(
    map: Option<&'a BTreeMap<String, T>>,
    driver: &str,
    domain: &str,
    id: &str,
    qualified: &str,
) -> Option<&'a T> {
    let bare = same(domain.as_bytes(), driver.as_bytes());
    let mut found = None;
    for (key, value) in map? {
        if same(key.as_bytes(), qualified.as_bytes()) {
            return Some(value);
        }
        // keys are unique: once the bare id is found, only the qualified
        // name can still come
        if bare && found.is_none() && same(key.as_bytes(), id.as_bytes()) {
            found = Some(value);
        }
    }
    found
}

pub(crate) fn raw_attribute(attr: Option<&DeviceAttribute>) -> RawValue<'_> {
    let Some(a) = attr else {
        return RawValue::Missing;
    };
    match (&a.int, &a.bool, &a.string, &a.version) {
        (Some(i), None, None, None) => RawValue::Int(*i),
        (None, Some(b), None, None) => RawValue::Bool(*b),
        (None, None, Some(s), None) => RawValue::Str(s),
        (None, None, None, Some(v)) => RawValue::Version(v),
        // no scalar value: a list attribute (1.36+), invisible to CEL here
        (None, None, None, None) => RawValue::Missing,
        _ => RawValue::Malformed,
    }
}

pub(crate) fn raw_capacity(cap: Option<&DeviceCapacity>) -> RawValue<'_> {
    cap.map_or(RawValue::Missing, |c| RawValue::Quantity(&c.value.0))
}

/// A capacity's request policy, in nano-units.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Policy {
    pub default: Option<i128>,
    pub valid_values: Vec<i128>,
    pub range: Option<Range>,
}

/// `validRange`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub min: i128,
    pub max: Option<i128>,
    /// Greater than zero.
    pub step: Option<i128>,
}

/// A capacity of a device.
#[derive(Debug, Clone)]
pub(crate) struct Capacity<'a> {
    /// The name as published (used in `consumedCapacity`).
    pub published: &'a str,
    pub domain: &'a str,
    pub id: &'a str,
    /// The value, with the format it was written in.
    pub quantity: Quantity,
    /// Boxed: most capacities have none, and a device's capacities are
    /// kept for every device parsed.
    pub policy: Option<Box<Policy>>,
}

impl Capacity<'_> {
    pub(crate) fn value(&self) -> i128 {
        self.quantity.nanos()
    }
}

/// A taint that keeps devices from being allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taint<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub effect: &'a str,
}

/// What allocating a device involves: its capacities, the counters it
/// consumes, its taints.
#[derive(Debug)]
pub(crate) struct Details<'a> {
    pub capacities: Vec<Capacity<'a>>,
    /// (index into the pool's counters, amount in nano-units)
    pub consumes: Vec<(usize, i128)>,
    pub taints: Vec<Taint<'a>>,
}

/// A device of a prepared pool: the published object. (Its parsed forms
/// are kept apart, in [`Parsed`], so that a pool's device list stays small:
/// most devices are never parsed.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolDevice<'a> {
    pub raw: &'a Device,
}

impl<'a> PoolDevice<'a> {
    pub(crate) fn name(self) -> &'a str {
        &self.raw.name
    }

    pub(crate) fn multi(self) -> bool {
        self.raw.allow_multiple_allocations.unwrap_or(false)
    }
}

/// A device's parsed forms, made on first need.
#[derive(Debug, Default)]
pub(crate) struct Parsed<'a> {
    // boxed: most stay empty
    details: OnceLock<Box<Result<Details<'a>, Malformed>>>,
    cel: OnceLock<Box<Result<CelDevice, Malformed>>>,
}

impl<'a> Parsed<'a> {
    /// The device as CEL selectors see it (converted on first need).
    pub(crate) fn cel(&self, raw: &Device, driver: &str) -> Result<&CelDevice, &Malformed> {
        let cel: &Result<CelDevice, Malformed> =
            self.cel.get_or_init(|| Box::new(parse_cel(raw, driver)));
        cel.as_ref()
    }

    /// Whether [`details`](Self::details) has been called.
    pub(crate) fn has_details(&self) -> bool {
        self.details.get().is_some()
    }

    /// The parsed device; `counters` resolves `(counter set, counter)` to
    /// the pool's counter index.
    pub(crate) fn details(
        &self,
        raw: &'a Device,
        driver: &'a str,
        counters: &dyn Fn(&str, &str) -> Option<usize>,
    ) -> Result<&Details<'a>, &Malformed> {
        let details: &Result<Details<'a>, Malformed> = self
            .details
            .get_or_init(|| Box::new(parse_details(raw, driver, counters)));
        details.as_ref()
    }
}

/// Why a published device cannot be read: an attribute, capacity, request
/// policy or counter consumption the API server would have refused. The
/// allocator treats such a device like the scheduler does: reaching it
/// aborts the attempt ([`AllocError::MalformedDevice`](super::AllocError)),
/// and an explanation counts it as malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// An attribute sets more than one of its value fields.
    #[error("attribute {name}: more than one of int, bool, string, version is set")]
    AmbiguousAttribute {
        /// The attribute as published.
        name: String,
    },
    /// A `version` attribute that is not a semantic version.
    #[error("attribute {name}: {source}")]
    Version {
        /// The attribute as published.
        name: String,
        /// The CEL environment's error.
        source: DeviceError,
    },
    /// A name that is not a (qualified) attribute or capacity name, or two
    /// names for the same attribute or capacity.
    #[error(transparent)]
    Name(#[from] DeviceError),
    /// A capacity whose value is not a quantity.
    #[error("capacity {name}: {source}")]
    CapacityQuantity {
        /// The capacity as published.
        name: String,
        /// The parser's error.
        source: QuantityError,
    },
    /// A negative capacity.
    #[error("capacity {name} is negative ({value})")]
    NegativeCapacity {
        /// The capacity as published.
        name: String,
        /// Its value as published.
        value: String,
    },
    /// A value of a capacity's request policy that is not a quantity.
    #[error("capacity {name} request policy {field}: {source}")]
    PolicyQuantity {
        /// The capacity as published.
        name: String,
        /// The policy's field: `default`, `validValues`, `validRange.min`, ...
        field: &'static str,
        /// The parser's error.
        source: QuantityError,
    },
    /// A negative value in a capacity's request policy.
    #[error("capacity {name} request policy {field} is negative ({value})")]
    NegativePolicyValue {
        /// The capacity as published.
        name: String,
        /// The policy's field.
        field: &'static str,
        /// The value as published.
        value: String,
    },
    /// `validValues` of a request policy out of order or repeated.
    #[error("capacity {name} request policy validValues are not strictly ascending")]
    PolicyValuesNotAscending {
        /// The capacity as published.
        name: String,
    },
    /// A request policy's `validRange.step` of zero.
    #[error("capacity {name} request policy validRange.step is zero")]
    PolicyZeroStep {
        /// The capacity as published.
        name: String,
    },
    /// A request policy's `validRange.max` below its `min`.
    #[error("capacity {name} request policy validRange.max is below min")]
    PolicyMaxBelowMin {
        /// The capacity as published.
        name: String,
    },
    /// A counter consumed from a counter set the pool does not have.
    #[error("consumes counter {counter} of unknown counter set {set}")]
    UnknownCounterSet {
        /// The counter.
        counter: String,
        /// The counter set named.
        set: String,
    },
    /// A consumed amount that is not a quantity.
    #[error("counter {set}/{counter}: {source}")]
    CounterQuantity {
        /// The counter set.
        set: String,
        /// The counter.
        counter: String,
        /// The parser's error.
        source: QuantityError,
    },
    /// A negative consumed amount.
    #[error("consumes a negative amount of counter {set}/{counter} ({value})")]
    NegativeCounter {
        /// The counter set.
        set: String,
        /// The counter.
        counter: String,
        /// The amount as published.
        value: String,
    },
}

fn parse_cel(raw: &Device, driver: &str) -> Result<CelDevice, Malformed> {
    let mut cel = CelDevice::new(driver);
    cel.allow_multiple_allocations = raw.allow_multiple_allocations.unwrap_or(false);
    if let Some(attributes) = &raw.attributes {
        // names qualified with the driver's domain first: they win over the
        // bare id
        let (qualified, bare): (Vec<_>, Vec<_>) =
            attributes.iter().partition(|(name, _)| name.contains('/'));
        for (name, attr) in qualified.into_iter().chain(bare) {
            let value = match raw_attribute(Some(attr)) {
                RawValue::Int(i) => AttrValue::Int(i),
                RawValue::Bool(b) => AttrValue::Bool(b),
                RawValue::Str(s) => AttrValue::String(s.to_owned()),
                RawValue::Version(v) => {
                    AttrValue::version(v).map_err(|source| Malformed::Version {
                        name: name.clone(),
                        source,
                    })?
                }
                RawValue::Missing => continue,
                _ => {
                    return Err(Malformed::AmbiguousAttribute { name: name.clone() });
                }
            };
            let (domain, id) = split_qualified_name(driver, name)?;
            if cel
                .attributes
                .get(domain)
                .is_some_and(|m| m.contains_key(id))
            {
                continue;
            }
            cel.add_attribute(name, value)?;
        }
    }
    for cap in parse_capacities(raw, driver)? {
        cel.add_capacity(cap.published, cap.quantity)?;
    }
    Ok(cel)
}

fn parse_capacities<'a>(raw: &'a Device, driver: &'a str) -> Result<Vec<Capacity<'a>>, Malformed> {
    let Some(caps) = &raw.capacity else {
        return Ok(Vec::new());
    };
    let mut capacities: Vec<Capacity<'a>> = Vec::with_capacity(caps.len());
    // names qualified with a domain first: one with the driver's domain
    // wins over the bare id (bare ids cannot repeat each other, nor can
    // qualified names)
    let mut driver_domain = 0usize;
    for qualified in [true, false] {
        for (name, cap) in caps {
            if name.contains('/') != qualified {
                continue;
            }
            let (domain, id) = split_qualified_name(driver, name)?;
            if qualified {
                driver_domain += usize::from(domain == driver);
            } else if driver_domain > 0
                && capacities.iter().any(|c| c.domain == domain && c.id == id)
            {
                continue;
            }
            let value =
                Quantity::parse(&cap.value.0).map_err(|source| Malformed::CapacityQuantity {
                    name: name.clone(),
                    source,
                })?;
            if value.signum() < 0 {
                return Err(Malformed::NegativeCapacity {
                    name: name.clone(),
                    value: cap.value.0.clone(),
                });
            }
            let policy = cap
                .request_policy
                .as_ref()
                .map(|p| parse_policy(p, name).map(Box::new))
                .transpose()?;
            capacities.push(Capacity {
                published: name,
                domain,
                id,
                quantity: value,
                policy,
            });
        }
    }
    Ok(capacities)
}

fn parse_details<'a>(
    raw: &'a Device,
    driver: &'a str,
    counters: &dyn Fn(&str, &str) -> Option<usize>,
) -> Result<Details<'a>, Malformed> {
    let capacities = parse_capacities(raw, driver)?;
    let mut consumes: Vec<(usize, i128)> = Vec::with_capacity(
        raw.consumes_counters
            .iter()
            .flatten()
            .map(|c| c.counters.len())
            .sum(),
    );
    for consumption in raw.consumes_counters.iter().flatten() {
        for (name, counter) in &consumption.counters {
            let index = counters(&consumption.counter_set, name).ok_or_else(|| {
                Malformed::UnknownCounterSet {
                    counter: name.clone(),
                    set: consumption.counter_set.clone(),
                }
            })?;
            let amount = Quantity::parse(&counter.value.0)
                .map_err(|source| Malformed::CounterQuantity {
                    set: consumption.counter_set.clone(),
                    counter: name.clone(),
                    source,
                })?
                .nanos();
            if amount < 0 {
                return Err(Malformed::NegativeCounter {
                    set: consumption.counter_set.clone(),
                    counter: name.clone(),
                    value: counter.value.0.clone(),
                });
            }
            match consumes.iter_mut().find(|(i, _)| *i == index) {
                Some((_, a)) => *a = a.saturating_add(amount),
                None => consumes.push((index, amount)),
            }
        }
    }
    let taints = raw
        .taints
        .iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .map(|t| Taint {
            key: &t.key,
            value: t.value.as_deref().unwrap_or(""),
            effect: &t.effect,
        })
        .collect();
    Ok(Details {
        capacities,
        consumes,
        taints,
    })
}

fn parse_policy(
    p: &k8s_openapi::api::resource::v1::CapacityRequestPolicy,
    name: &str,
) -> Result<Policy, Malformed> {
    let q = |text: &str, field: &'static str| -> Result<i128, Malformed> {
        let v = Quantity::parse(text)
            .map_err(|source| Malformed::PolicyQuantity {
                name: name.to_owned(),
                field,
                source,
            })?
            .nanos();
        if v < 0 {
            return Err(Malformed::NegativePolicyValue {
                name: name.to_owned(),
                field,
                value: text.to_owned(),
            });
        }
        Ok(v)
    };
    let default = p.default.as_ref().map(|d| q(&d.0, "default")).transpose()?;
    let valid_values = p
        .valid_values
        .iter()
        .flatten()
        .map(|v| q(&v.0, "validValues"))
        .collect::<Result<Vec<_>, _>>()?;
    if valid_values.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Malformed::PolicyValuesNotAscending {
            name: name.to_owned(),
        });
    }
    let range = match &p.valid_range {
        None => None,
        Some(r) => {
            let min = q(&r.min.0, "validRange.min")?;
            let max = r
                .max
                .as_ref()
                .map(|m| q(&m.0, "validRange.max"))
                .transpose()?;
            let step = r
                .step
                .as_ref()
                .map(|s| q(&s.0, "validRange.step"))
                .transpose()?;
            if step == Some(0) {
                return Err(Malformed::PolicyZeroStep {
                    name: name.to_owned(),
                });
            }
            if max.is_some_and(|m| m < min) {
                return Err(Malformed::PolicyMaxBelowMin {
                    name: name.to_owned(),
                });
            }
            Some(Range { min, max, step })
        }
    };
    Ok(Policy {
        default,
        valid_values,
        range,
    })
}

/// Whether `toleration` tolerates `taint` (Kubernetes' rules: an empty
/// effect matches every effect, `Exists` with an empty key every taint,
/// `Equal` (the default) compares values).
pub(crate) fn tolerates(
    toleration: &k8s_openapi::api::resource::v1::DeviceToleration,
    taint: &Taint<'_>,
) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match operator {
        "Exists" => true,
        "Equal" | "" => toleration.value.as_deref().unwrap_or("") == taint.value,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_compares_every_byte_of_every_length() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(same(&a, &a.clone()), "{n}");
            for k in 0..n {
                let mut b = a.clone();
                b[k] ^= 1;
                assert!(!same(&a, &b), "length {n}, byte {k}");
            }
            assert!(!same(&a, &a[..n.saturating_sub(1)]) || n == 0);
        }
    }

    #[test]
    fn raw_values_compare_by_kind_and_text() {
        let gpu = String::from("gpu");
        assert_eq!(RawValue::Str("gpu"), RawValue::Str(&gpu));
        assert_ne!(RawValue::Str("gpu"), RawValue::Version("gpu"));
        assert_ne!(RawValue::Str("gpu"), RawValue::Str("mig"));
        assert_eq!(RawValue::Int(3), RawValue::Int(3));
        assert_ne!(RawValue::Missing, RawValue::Malformed);
        let build = std::hash::BuildHasherDefault::<super::super::intern::FastHasher>::default();
        use std::hash::BuildHasher;
        assert_eq!(
            build.hash_one(RawValue::Str("gpu")),
            build.hash_one(RawValue::Str(&gpu))
        );
    }
}
