//! Conversion of the device model into `resource.k8s.io/v1` types, and the
//! quantity spelling shared with the publisher: integers are written in the
//! canonical form the API server would store (`80G`, not `80000000000`), and
//! quantities are compared by value ([`gpu_dra_api::quantity`]).

use std::collections::BTreeMap;

use gpu_dra_api::quantity::Quantity as ApiQuantity;
use gpu_dra_api::schema::AttributeValue;
use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use gpu_dra_api::schema::names;

use super::{CounterConsumption, CounterSet, Device, MemoryRequestPolicy};

/// The API form of a device.
pub fn device(d: &Device) -> api::Device {
    let attributes: BTreeMap<String, api::DeviceAttribute> = d
        .attributes
        .attributes
        .iter()
        .map(|(name, value)| ((*name).to_owned(), attribute(value)))
        .collect();
    let capacity: BTreeMap<String, api::DeviceCapacity> = d
        .attributes
        .capacity
        .iter()
        .map(|(name, value)| {
            let request_policy = d.memory_sharing.map(|shared| match *name {
                names::MEMORY => request_policy(&shared.memory),
                names::SHARES => shared
                    .shares
                    .map_or_else(none_policy, shares_request_policy),
                _ => none_policy(),
            });
            (
                (*name).to_owned(),
                api::DeviceCapacity {
                    value: quantity(*value),
                    request_policy,
                },
            )
        })
        .collect();
    api::Device {
        name: d.name.clone(),
        attributes: Some(attributes),
        capacity: Some(capacity),
        consumes_counters: d.consumes.as_ref().map(|c| vec![consumption(c)]),
        allow_multiple_allocations: d.memory_sharing.is_some().then_some(true),
        taints: (!d.taints.is_empty()).then(|| {
            d.taints
                .iter()
                .map(|t| api::DeviceTaint {
                    key: t.key.clone(),
                    value: t.value.clone(),
                    effect: t.effect.as_str().to_owned(),
                    time_added: None,
                })
                .collect()
        }),
        ..Default::default()
    }
}

/// The API form of a shared GPU's memory request policy: a `validRange`
/// and its default, in binary units (`1Gi`, `256Mi`) as users write them.
pub fn request_policy(p: &MemoryRequestPolicy) -> api::CapacityRequestPolicy {
    api::CapacityRequestPolicy {
        default: Some(binary_quantity(p.default_bytes)),
        valid_range: Some(api::CapacityRequestPolicyRange {
            min: binary_quantity(p.min_bytes),
            max: Some(binary_quantity(p.max_bytes)),
            step: Some(binary_quantity(p.step_bytes)),
        }),
        valid_values: None,
    }
}

/// The request policy of a shared device's other capacities (a MIG
/// device's multiprocessors, engines, memory slices): a share takes none.
/// Kubernetes consumes an unrequested capacity without a policy whole, so
/// without this the first share of a MIG device would take all of them and
/// no second share would fit.
pub fn none_policy() -> api::CapacityRequestPolicy {
    api::CapacityRequestPolicy {
        default: Some(quantity(0)),
        valid_range: None,
        valid_values: Some(vec![quantity(0)]),
    }
}

/// The request policy of the `shares` capacity (`--consumable-shares=<N>`):
/// one share by default, whole shares up to `n` (NVIDIA's policy).
pub fn shares_request_policy(n: u32) -> api::CapacityRequestPolicy {
    api::CapacityRequestPolicy {
        default: Some(quantity(1)),
        valid_range: Some(api::CapacityRequestPolicyRange {
            min: quantity(1),
            max: Some(quantity(u64::from(n))),
            step: Some(quantity(1)),
        }),
        valid_values: None,
    }
}

/// A byte count as the canonical binary-SI quantity the API server would
/// store (`1Gi`, `81408Mi`); [`quantity`] when not a whole number of KiB.
pub fn binary_quantity(bytes: u64) -> Quantity {
    if bytes >= 1024
        && bytes.is_multiple_of(1024)
        && let Ok(q) = ApiQuantity::parse(&format!("{}Ki", bytes / 1024))
    {
        return Quantity(q.canonical());
    }
    quantity(bytes)
}

/// The API form of an attribute value.
pub fn attribute(value: &AttributeValue) -> api::DeviceAttribute {
    let mut a = api::DeviceAttribute::default();
    match value {
        AttributeValue::Int(i) => a.int = Some(*i),
        AttributeValue::Bool(b) => a.bool = Some(*b),
        AttributeValue::String(s) => a.string = Some(s.clone()),
        AttributeValue::Version(v) => a.version = Some(v.clone()),
    }
    a
}

/// The API form of a counter set.
pub fn counter_set(s: &CounterSet) -> api::CounterSet {
    api::CounterSet {
        name: s.name.clone(),
        counters: counters(&s.counters),
    }
}

fn consumption(c: &CounterConsumption) -> api::DeviceCounterConsumption {
    api::DeviceCounterConsumption {
        counter_set: c.counter_set.clone(),
        counters: counters(&c.counters),
    }
}

fn counters(map: &BTreeMap<String, u64>) -> BTreeMap<String, api::Counter> {
    map.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                api::Counter {
                    value: quantity(*v),
                },
            )
        })
        .collect()
}

/// An integer as the canonical quantity the API server stores: trailing
/// groups of three zeros become an SI suffix (`1000` is `1k`, `80000000000` is
/// `80G`, `1500` stays). Values above `i64::MAX` are capped (none occur).
pub fn quantity(value: u64) -> Quantity {
    let units = i64::try_from(value).unwrap_or(i64::MAX);
    Quantity(ApiQuantity::from_units(units).canonical())
}

/// A quantity's value in nano-units, independent of its spelling (`1Gi` and
/// `1073741824` are equal); `None` when the text is not a quantity.
pub fn quantity_nanos(q: &str) -> Option<i128> {
    ApiQuantity::parse(q).ok().map(|q| q.nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_quantities() {
        for (v, s) in [
            (0, "0"),
            (1, "1"),
            (132, "132"),
            (1000, "1k"),
            (1500, "1500"),
            (80_000_000_000, "80G"),
            (85_899_345_920, "85899345920"),
            (1_000_000_000_000_000_000, "1E"),
        ] {
            assert_eq!(quantity(v).0, s, "{v}");
            assert_eq!(
                quantity_nanos(s),
                Some(i128::from(v) * 1_000_000_000),
                "{s}"
            );
        }
    }

    #[test]
    fn binary_quantities() {
        for (v, s) in [
            (1 << 30, "1Gi"),
            (256 << 20, "256Mi"),
            (81_408 << 20, "81408Mi"),
            (1536, "1536"),
            (1024, "1Ki"),
            (1000, "1k"),
            (0, "0"),
        ] {
            assert_eq!(binary_quantity(v).0, s, "{v}");
            assert_eq!(
                quantity_nanos(s),
                Some(i128::from(v) * 1_000_000_000),
                "{s}"
            );
        }
    }

    #[test]
    fn quantity_spellings_compare_by_value() {
        assert_eq!(quantity_nanos("1Gi"), quantity_nanos("1073741824"));
        assert_eq!(quantity_nanos("1e3"), quantity_nanos("1k"));
        assert_ne!(quantity_nanos("1k"), quantity_nanos("1Ki"));
        for bad in ["", "k", "1.2.3", "1X", "1Kb"] {
            assert_eq!(quantity_nanos(bad), None, "{bad}");
        }
    }
}
