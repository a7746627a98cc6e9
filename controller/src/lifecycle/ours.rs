//! Which claims concern this driver: a DeviceClass is ours when one of its
//! CEL selectors tests `device.driver == "<driver>"` or reads the driver's
//! attribute or capacity domain (`device.attributes["<driver>"]`), or when
//! it carries an opaque config for the driver; a claim is ours when one of
//! its requests (or sub-requests) names such a class.
//!
//! This is close to, but deliberately not, `gpu_dra_analysis::validate`'s
//! `Report::ours` (the webhook's notion): that one also counts
//! `device.driver != '<driver>'`, misspelt domains (`gpu.nvida.com`) and
//! claim-level opaque configs as ours, and has no "class not there yet"
//! answer ([`ClaimOwnership::Unknown`], which the lifecycle waits on).
//!
//! The selector test is textual (whitespace-insensitive): it never has to
//! evaluate CEL, and a class that merely mentions another driver is not
//! ours.

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};

/// Whether a CEL expression tests for `driver` or reads its domain.
pub fn expression_is_ours(expression: &str, driver: &str) -> bool {
    let compact: String = expression.chars().filter(|c| !c.is_whitespace()).collect();
    ['"', '\''].into_iter().any(|q| {
        let literal = format!("{q}{driver}{q}");
        compact.contains(&format!("device.driver=={literal}"))
            || compact.contains(&format!("{literal}==device.driver"))
            || compact.contains(&format!("device.attributes[{literal}]"))
            || compact.contains(&format!("device.capacity[{literal}]"))
    })
}

/// Whether one of the class's selectors is ours, or it configures our
/// driver.
pub fn class_is_ours(class: &DeviceClass, driver: &str) -> bool {
    let selects = class.spec.selectors.iter().flatten().any(|selector| {
        selector
            .cel
            .as_ref()
            .is_some_and(|cel| expression_is_ours(&cel.expression, driver))
    });
    let configures = class
        .spec
        .config
        .iter()
        .flatten()
        .any(|config| config.opaque.as_ref().is_some_and(|o| o.driver == driver));
    selects || configures
}

/// The DeviceClass names a claim's requests and sub-requests use, in order
/// (duplicates kept).
pub fn claim_class_names(claim: &ResourceClaim) -> Vec<&str> {
    let mut names = Vec::new();
    for request in claim
        .spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
    {
        if let Some(exactly) = &request.exactly {
            names.push(exactly.device_class_name.as_str());
        }
        for sub in request.first_available.iter().flatten() {
            names.push(sub.device_class_name.as_str());
        }
    }
    names
}

/// How a claim relates to the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOwnership {
    /// At least one request names one of our classes.
    Ours,
    /// Every class it names exists and none is ours (or it names none).
    NotOurs,
    /// None of the classes that exist is ours, but some are missing (they
    /// may be created later): these.
    Unknown(Vec<String>),
}

/// Decides whether `claim` is ours, looking classes up with `lookup`.
pub fn claim_ownership<C>(
    claim: &ResourceClaim,
    driver: &str,
    lookup: impl Fn(&str) -> Option<C>,
) -> ClaimOwnership
where
    C: AsRef<DeviceClass>,
{
    let mut missing: Vec<String> = Vec::new();
    for name in claim_class_names(claim) {
        match lookup(name) {
            Some(class) if class_is_ours(class.as_ref(), driver) => return ClaimOwnership::Ours,
            Some(_) => {}
            None => {
                if !missing.iter().any(|m| m == name) {
                    missing.push(name.to_owned());
                }
            }
        }
    }
    if missing.is_empty() {
        ClaimOwnership::NotOurs
    } else {
        ClaimOwnership::Unknown(missing)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    const DRIVER: &str = "gpu.nvidia.com";

    fn class(name: &str, expressions: &[&str]) -> Arc<DeviceClass> {
        let selectors: Vec<_> = expressions
            .iter()
            .map(|e| json!({"cel": {"expression": e}}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"selectors": selectors}
            }))
            .unwrap(),
        )
    }

    fn claim(classes: &[&str], first_available: &[&str]) -> ResourceClaim {
        let mut requests: Vec<_> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": c}}))
            .collect();
        if !first_available.is_empty() {
            let subs: Vec<_> = first_available
                .iter()
                .enumerate()
                .map(|(i, c)| json!({"name": format!("s{i}"), "deviceClassName": c}))
                .collect();
            requests.push(json!({"name": "alt", "firstAvailable": subs}));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": requests}}
        }))
        .unwrap()
    }

    #[test]
    fn driver_tests_and_domain_reads_are_ours() {
        for expr in [
            "device.driver == 'gpu.nvidia.com'",
            "device.driver==\"gpu.nvidia.com\"",
            "'gpu.nvidia.com' == device.driver && true",
            "device.attributes['gpu.nvidia.com'].type == 'mig'",
            "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity('40Gi')) >= 0",
            "device.attributes[ 'gpu.nvidia.com' ]\n  .productName.startsWith('NVIDIA')",
        ] {
            assert!(expression_is_ours(expr, DRIVER), "{expr}");
        }
    }

    #[test]
    fn other_drivers_and_near_misses_are_not_ours() {
        for expr in [
            "device.driver == 'dra.example.com'",
            "device.driver != 'gpu.nvidia.com'",
            "device.driver == 'gpu.nvidia.com.evil'",
            "device.driver == 'mig.gpu.nvidia.com'",
            "device.attributes['resource.kubernetes.io'].pcieRoot == 'x'",
            "'gpu.nvidia.com' in ['a']",
            "",
        ] {
            assert!(!expression_is_ours(expr, DRIVER), "{expr}");
        }
    }

    #[test]
    fn a_class_is_ours_when_any_selector_is() {
        assert!(class_is_ours(
            &class("gpu", &["true", "device.driver == 'gpu.nvidia.com'"]),
            DRIVER
        ));
        assert!(!class_is_ours(
            &class("other", &["device.driver == 'x.io'"]),
            DRIVER
        ));
        assert!(!class_is_ours(&class("empty", &[]), DRIVER));
        let configured: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": "configured"},
            "spec": {"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]}
        }))
        .unwrap();
        assert!(class_is_ours(&configured, DRIVER));
        assert!(!class_is_ours(&configured, "x.io"));
    }

    #[test]
    fn claims_are_judged_by_their_classes() {
        let classes: HashMap<&str, Arc<DeviceClass>> = HashMap::from([
            ("gpu", class("gpu", &["device.driver == 'gpu.nvidia.com'"])),
            ("nic", class("nic", &["device.driver == 'nic.example.com'"])),
        ]);
        let lookup = |name: &str| classes.get(name).cloned();
        assert_eq!(
            claim_ownership(&claim(&["nic", "gpu"], &[]), DRIVER, lookup),
            ClaimOwnership::Ours
        );
        assert_eq!(
            claim_ownership(&claim(&["nic"], &["nic", "gpu"]), DRIVER, lookup),
            ClaimOwnership::Ours
        );
        assert_eq!(
            claim_ownership(&claim(&["nic"], &[]), DRIVER, lookup),
            ClaimOwnership::NotOurs
        );
        assert_eq!(
            claim_ownership(&claim(&["nic", "later", "later"], &[]), DRIVER, lookup),
            ClaimOwnership::Unknown(vec!["later".into()])
        );
        assert_eq!(
            claim_ownership(&claim(&[], &[]), DRIVER, lookup),
            ClaimOwnership::NotOurs
        );
        assert_eq!(
            claim_class_names(&claim(&["a"], &["b", "c"])),
            ["a", "b", "c"]
        );
    }
}
