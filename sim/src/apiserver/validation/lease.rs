//! `coordination.k8s.io/v1` Lease validation: a positive `leaseDurationSeconds`, a non-negative
//! `leaseTransitions`, well-formed times, and a `preferredHolder` only with a known `strategy`.

use serde_json::{Map, Value};

use super::event::timestamp;
use super::{Errors, Path};

/// The coordinated leader election strategies.
const STRATEGIES: [&str; 1] = ["OldestEmulationVersion"];

/// Validates a Lease.
pub(super) fn validate(errs: &mut Errors, obj: &Map<String, Value>) {
    let Some(spec) = errs.object(obj, "spec", &Path::root("")) else {
        return;
    };
    let path = Path::root("spec");
    let _ = errs.string(spec, "holderIdentity", &path);
    if let Some(duration) = errs.int(spec, "leaseDurationSeconds", &path)
        && duration <= 0
    {
        errs.invalid(
            &path.child("leaseDurationSeconds"),
            &Value::from(duration),
            "must be greater than 0",
        );
    }
    if let Some(transitions) = errs.int(spec, "leaseTransitions", &path)
        && transitions < 0
    {
        errs.invalid(
            &path.child("leaseTransitions"),
            &Value::from(transitions),
            "must be greater than or equal to 0",
        );
    }
    let _ = timestamp(errs, spec, "acquireTime", &path);
    let _ = timestamp(errs, spec, "renewTime", &path);
    let strategy = errs.string(spec, "strategy", &path).unwrap_or("");
    if !strategy.is_empty() && !STRATEGIES.contains(&strategy) {
        errs.not_supported(&path.child("strategy"), strategy, &STRATEGIES);
    }
    let preferred = errs.string(spec, "preferredHolder", &path).unwrap_or("");
    if !preferred.is_empty() && strategy.is_empty() {
        errs.forbidden(
            &path.child("preferredHolder"),
            "may only be specified if `strategy` is defined",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::Resource;
    use serde_json::json;

    fn errors(obj: &Value) -> Vec<String> {
        let mut errs = Errors::new(Resource::Leases);
        validate(&mut errs, obj.as_object().unwrap());
        errs.fields
            .iter()
            .map(ToString::to_string)
            .chain(errs.decode.iter().cloned())
            .collect()
    }

    #[test]
    fn a_held_lease_is_valid() {
        let lease = json!({"spec": {
            "holderIdentity": "controller-0",
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-02T03:04:05.000000Z",
            "renewTime": "2026-01-02T03:04:15.000000Z",
            "leaseTransitions": 3
        }});
        assert_eq!(errors(&lease), Vec::<String>::new());
        assert_eq!(errors(&json!({})), Vec::<String>::new());
    }

    #[test]
    fn bad_values_are_rejected() {
        let lease = json!({"spec": {
            "leaseDurationSeconds": 0,
            "leaseTransitions": -1,
            "strategy": "Newest",
            "preferredHolder": "x"
        }});
        assert_eq!(
            errors(&lease),
            [
                "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
                "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0",
                "spec.strategy: Unsupported value: \"Newest\": supported values: \"OldestEmulationVersion\"",
            ]
        );
        let unpreferred = json!({"spec": {"preferredHolder": "x"}});
        assert_eq!(
            errors(&unpreferred),
            ["spec.preferredHolder: Forbidden: may only be specified if `strategy` is defined"]
        );
        let bad_time = json!({"spec": {"renewTime": "soon"}});
        assert!(errors(&bad_time)[0].contains("spec.renewTime: parsing time \"soon\""));
        let wrong_type = json!({"spec": {"leaseDurationSeconds": "15"}});
        assert!(errors(&wrong_type)[0].contains("cannot unmarshal string"));
    }
}
