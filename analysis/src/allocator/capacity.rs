//! Consumable capacity: how much of each capacity of a device one
//! allocation consumes (the request rounded up per the capacity's request
//! policy, the policy's default for an unrequested capacity, or the whole
//! capacity when there is neither), and whether that still fits next to
//! what other allocations of the device consume. Exact integer arithmetic in
//! nano-units.

use super::device::{Capacity, Policy};
use crate::cel::split_qualified_name;

/// A requested capacity: the name as written in the claim, nano-units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CapacityRequest {
    pub name: String,
    pub amount: i128,
}

/// Whether an allocation of a device fits its capacities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fit {
    /// It fits; what it consumes, indexed like the device's capacities.
    Fits(Vec<i128>),
    /// The device has no capacity of this requested name.
    Missing(String),
    /// The consumed amount is not allowed by the capacity's request policy
    /// (above `validRange.max`, off the step, not a valid value).
    Policy(String),
    /// More than the whole capacity.
    TooLarge(String),
    /// It would fit an unused device, but not next to the allocations the
    /// device already has.
    Exhausted(String),
}

/// Why a claim's capacity request cannot be applied to a device: the
/// scheduler fails the attempt rather than skip the device
/// ([`AllocError::CapacityRequest`](super::AllocError)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// The request names one capacity twice, once with the driver's domain
    /// and once without.
    #[error("capacity {domain}/{id} is requested twice (with and without its domain)")]
    RequestedTwice {
        /// The capacity's domain.
        domain: String,
        /// The capacity's id.
        id: String,
    },
    /// Rounding the request up to the policy's next step overflows.
    #[error("capacity {capacity}: rounding the request up to the next step is out of range")]
    RoundingOutOfRange {
        /// The capacity as published.
        capacity: String,
    },
}

/// Checks `requests` against `caps`, `used(i)` being what other
/// allocations already consume of capacity `i`. Errors (a capacity named
/// twice, a rounded value out of range) abort the allocation attempt.
pub(crate) fn fit(
    requests: &[CapacityRequest],
    driver: &str,
    caps: &[Capacity<'_>],
    used: &dyn Fn(usize) -> i128,
) -> Result<Fit, CapacityError> {
    let mut requested: Vec<Option<i128>> = vec![None; caps.len()];
    for r in requests {
        let Ok((domain, id)) = split_qualified_name(driver, &r.name) else {
            return Ok(Fit::Missing(r.name.clone()));
        };
        let Some(i) = caps.iter().position(|c| c.domain == domain && c.id == id) else {
            return Ok(Fit::Missing(r.name.clone()));
        };
        if requested[i].is_some() {
            return Err(CapacityError::RequestedTwice {
                domain: domain.to_owned(),
                id: id.to_owned(),
            });
        }
        requested[i] = Some(r.amount);
    }
    let consumed = caps
        .iter()
        .zip(&requested)
        .map(|(cap, req)| consumed(*req, cap))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(c) = caps
        .iter()
        .zip(&consumed)
        .find(|(cap, c)| violates(**c, cap.policy.as_deref()))
    {
        return Ok(Fit::Policy(c.0.published.to_owned()));
    }
    if let Some(c) = caps
        .iter()
        .zip(&consumed)
        .find(|(cap, c)| **c > cap.value())
    {
        return Ok(Fit::TooLarge(c.0.published.to_owned()));
    }
    for (i, (cap, c)) in caps.iter().zip(&consumed).enumerate() {
        if used(i).saturating_add(*c) > cap.value() {
            return Ok(Fit::Exhausted(cap.published.to_owned()));
        }
    }
    Ok(Fit::Fits(consumed))
}

/// What one allocation consumes of `cap` for the request `req`.
pub(crate) fn consumed(req: Option<i128>, cap: &Capacity<'_>) -> Result<i128, CapacityError> {
    let policy = cap.policy.as_deref();
    let Some(r) = req else {
        return Ok(policy.and_then(|p| p.default).unwrap_or(cap.value()));
    };
    let Some(p) = policy else {
        return Ok(r);
    };
    if let Some(range) = p.range {
        if r < range.min {
            return Ok(range.min);
        }
        let Some(step) = range.step else {
            return Ok(r);
        };
        let added = r - range.min;
        let steps = added / step + i128::from(added % step != 0);
        return steps
            .checked_mul(step)
            .and_then(|s| s.checked_add(range.min))
            .ok_or_else(|| CapacityError::RoundingOutOfRange {
                capacity: cap.published.to_owned(),
            });
    }
    Ok(p.valid_values
        .iter()
        .copied()
        .find(|v| *v >= r)
        .unwrap_or(r))
}

/// Whether consuming `c` breaks `policy` (the default is always allowed).
pub(crate) fn violates(c: i128, policy: Option<&Policy>) -> bool {
    let Some(p) = policy else {
        return false;
    };
    if p.default == Some(c) {
        return false;
    }
    if let Some(range) = p.range {
        if range.max.is_some_and(|m| c > m) {
            return true;
        }
        return range.step.is_some_and(|step| (c - range.min) % step != 0);
    }
    !p.valid_values.is_empty() && !p.valid_values.contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::device::Range;
    use gpu_dra_api::quantity::Quantity;

    fn q(s: &str) -> i128 {
        Quantity::parse(s).unwrap().nanos()
    }

    fn cap(value: &str, policy: Option<Policy>) -> Capacity<'static> {
        Capacity {
            published: "memory",
            domain: "gpu.example.com",
            id: "memory",
            quantity: Quantity::parse(value).unwrap(),
            policy: policy.map(Box::new),
        }
    }

    fn range(min: &str, max: Option<&str>, step: Option<&str>) -> Policy {
        Policy {
            default: None,
            valid_values: Vec::new(),
            range: Some(Range {
                min: q(min),
                max: max.map(q),
                step: step.map(q),
            }),
        }
    }

    fn req(name: &str, amount: &str) -> CapacityRequest {
        CapacityRequest {
            name: name.to_owned(),
            amount: q(amount),
        }
    }

    #[test]
    fn unrequested_capacity_consumes_default_or_everything() {
        assert_eq!(consumed(None, &cap("80Gi", None)).unwrap(), q("80Gi"));
        let with_default = Policy {
            default: Some(q("10Gi")),
            ..Policy::default()
        };
        assert_eq!(
            consumed(None, &cap("80Gi", Some(with_default))).unwrap(),
            q("10Gi")
        );
    }

    #[test]
    fn range_rounds_up_to_min_and_step() {
        let c = cap("80Gi", Some(range("1Gi", Some("40Gi"), Some("2Gi"))));
        assert_eq!(consumed(Some(q("100Mi")), &c).unwrap(), q("1Gi"));
        assert_eq!(consumed(Some(q("1Gi")), &c).unwrap(), q("1Gi"));
        assert_eq!(consumed(Some(q("2Gi")), &c).unwrap(), q("3Gi"));
        assert_eq!(consumed(Some(q("3Gi")), &c).unwrap(), q("3Gi"));
        assert_eq!(consumed(Some(q("3.5Gi")), &c).unwrap(), q("5Gi"));
        // no step: the request itself
        let c = cap("80Gi", Some(range("1Gi", None, None)));
        assert_eq!(consumed(Some(q("1.5Gi")), &c).unwrap(), q("1.5Gi"));
    }

    #[test]
    fn valid_values_round_up_or_stay() {
        let p = Policy {
            default: Some(q("10Gi")),
            valid_values: vec![q("10Gi"), q("20Gi"), q("40Gi")],
            range: None,
        };
        let c = cap("80Gi", Some(p.clone()));
        assert_eq!(consumed(Some(q("11Gi")), &c).unwrap(), q("20Gi"));
        assert_eq!(consumed(Some(q("40Gi")), &c).unwrap(), q("40Gi"));
        // above the largest: the request stays and then violates the policy
        assert_eq!(consumed(Some(q("50Gi")), &c).unwrap(), q("50Gi"));
        assert!(violates(q("50Gi"), Some(&p)));
        assert!(!violates(q("20Gi"), Some(&p)));
    }

    #[test]
    fn range_violations() {
        let p = range("1Gi", Some("40Gi"), Some("2Gi"));
        assert!(violates(q("41Gi"), Some(&p)));
        assert!(violates(q("2Gi"), Some(&p)));
        assert!(!violates(q("39Gi"), Some(&p)));
        assert!(!violates(q("12Gi"), None));
    }

    #[test]
    fn fit_distinguishes_missing_policy_too_large_exhausted() {
        let caps = [cap("80Gi", Some(range("1Gi", Some("40Gi"), Some("1Gi"))))];
        let none = |_: usize| 0;
        assert_eq!(
            fit(&[req("cores", "1")], "gpu.example.com", &caps, &none).unwrap(),
            Fit::Missing("cores".into())
        );
        assert_eq!(
            fit(&[req("memory", "41Gi")], "gpu.example.com", &caps, &none).unwrap(),
            Fit::Policy("memory".into())
        );
        let half = |_: usize| q("50Gi");
        assert_eq!(
            fit(&[req("memory", "40Gi")], "gpu.example.com", &caps, &half).unwrap(),
            Fit::Exhausted("memory".into())
        );
        assert_eq!(
            fit(
                &[req("gpu.example.com/memory", "30Gi")],
                "gpu.example.com",
                &caps,
                &half
            )
            .unwrap(),
            Fit::Fits(vec![q("30Gi")])
        );
        let plain = [cap("8Gi", None)];
        assert_eq!(
            fit(&[req("memory", "9Gi")], "gpu.example.com", &plain, &none).unwrap(),
            Fit::TooLarge("memory".into())
        );
    }

    #[test]
    fn capacity_named_twice_is_an_error() {
        let caps = [cap("80Gi", None)];
        let none = |_: usize| 0;
        let err = fit(
            &[req("memory", "1Gi"), req("gpu.example.com/memory", "1Gi")],
            "gpu.example.com",
            &caps,
            &none,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("requested twice"), "{err}");
    }

    #[test]
    fn huge_step_rounding_is_an_error_not_a_panic() {
        let big = Policy {
            default: None,
            valid_values: Vec::new(),
            range: Some(Range {
                min: 0,
                max: None,
                step: Some(i128::MAX / 2 + 1),
            }),
        };
        let c = cap("1", Some(big));
        assert!(consumed(Some(i128::MAX / 2 + 2), &c).is_err());
    }
}
