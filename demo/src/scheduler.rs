//! kube-scheduler's part in the demo: the allocator simulation of
//! [`gpu_dra_analysis::allocator`] places a claim on the demo node from what the
//! API server holds (ResourceSlices, DeviceClasses, claims already
//! allocated), and the result becomes the claim's `status.allocation` as
//! the scheduler writes it: the devices, a node selector, and the
//! configuration of the classes and of the claim, which the plugin reads at
//! prepare time.

use std::fmt::Write as _;

use anyhow::Context as _;
use gpu_dra_analysis::allocator::{
    Allocator, Explanation, Needed, NodeAllocation, NodeFilter, Outcome, SimulateOptions, Snapshot,
    VariantReport,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceClass, ResourceClaim, ResourceSlice,
};

/// Where the allocator put a claim.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Allocated: what goes into `status.allocation`, and the devices.
    Allocated {
        /// The claim's `status.allocation`.
        allocation: AllocationResult,
        /// The devices, in request order.
        devices: NodeAllocation,
    },
    /// No allocation; why.
    Unsatisfiable(Explanation),
}

/// Places `claim` on `node`, given the cluster's state.
pub fn place(
    slices: &[ResourceSlice],
    classes: &[DeviceClass],
    allocated: &[ResourceClaim],
    claim: &ResourceClaim,
    node: &str,
) -> anyhow::Result<Placement> {
    let snapshot = Snapshot::new(slices, classes, allocated);
    let options = SimulateOptions {
        nodes: NodeFilter::Node(node.to_owned()),
        ..SimulateOptions::default()
    };
    let outcome = Allocator::new()
        .simulate(&snapshot, claim, &options)
        .context("the allocator could not reach a verdict")?;
    Ok(match outcome {
        Outcome::Satisfiable(mut nodes) => {
            let devices = nodes
                .drain(..)
                .next()
                .context("the allocator said satisfiable without an allocation")?;
            let mut allocation = devices.allocation_result();
            if let Some(results) = allocation.devices.as_mut() {
                let config = configs(claim, classes);
                results.config = (!config.is_empty()).then_some(config);
            }
            Placement::Allocated {
                allocation,
                devices,
            }
        }
        Outcome::Unsatisfiable(explanation) => Placement::Unsatisfiable(explanation),
    })
}

/// The configuration the scheduler copies into the allocation: each
/// request's class configs (`FromClass`, for that request), then the
/// claim's own (`FromClaim`), in that order, so the plugin lets the claim's
/// settings win.
fn configs(claim: &ResourceClaim, classes: &[DeviceClass]) -> Vec<DeviceAllocationConfiguration> {
    let mut out = Vec::new();
    let Some(devices) = claim.spec.devices.as_ref() else {
        return out;
    };
    for request in devices.requests.iter().flatten() {
        let class_names: Vec<(String, &str)> = match (&request.exactly, &request.first_available) {
            (Some(exactly), _) => vec![(request.name.clone(), exactly.device_class_name.as_str())],
            (None, Some(subs)) => subs
                .iter()
                .map(|s| {
                    (
                        format!("{}/{}", request.name, s.name),
                        s.device_class_name.as_str(),
                    )
                })
                .collect(),
            (None, None) => Vec::new(),
        };
        for (name, class_name) in class_names {
            let class = classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(class_name));
            for config in class.iter().flat_map(|c| c.spec.config.iter().flatten()) {
                out.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_owned(),
                    requests: Some(vec![name.clone()]),
                    opaque: config.opaque.clone(),
                });
            }
        }
    }
    for config in devices.config.iter().flatten() {
        out.push(DeviceAllocationConfiguration {
            source: "FromClaim".to_owned(),
            requests: config.requests.clone(),
            opaque: config.opaque.clone(),
        });
    }
    out
}

/// One line per request of the explanation's node: how many devices each
/// selector lets through, and what happened to those that matched.
pub fn funnels(explanation: &Explanation) -> Vec<String> {
    let Some(node) = explanation.nodes.first() else {
        return Vec::new();
    };
    node.requests
        .iter()
        .flat_map(|r| r.variants.iter())
        .map(funnel)
        .collect()
}

fn funnel(v: &VariantReport) -> String {
    let needed = match v.needed {
        Needed::Count(1) => "1 device".to_owned(),
        Needed::Count(n) => format!("{n} devices"),
        Needed::All => "all matching devices".to_owned(),
    };
    let mut line = format!(
        "request `{}` ({}, needs {needed}): {} devices",
        v.name, v.device_class, v.considered
    );
    for stage in &v.stages {
        let _ = write!(line, " -> {} pass {}", stage.passed, stage.source);
    }
    let mut busy = Vec::new();
    for (n, what) in [
        (v.in_use, "in use"),
        (v.counters_exhausted, "without free counters"),
        (v.capacity_exhausted, "without free capacity"),
        (v.capacity_unsuitable, "with unsuitable capacity"),
        (v.tainted, "tainted"),
    ] {
        if n > 0 {
            busy.push(format!("{n} {what}"));
        }
    }
    if !busy.is_empty() {
        let _ = write!(line, "; of those {}", busy.join(", "));
    }
    let _ = write!(line, "; {} available", v.available);
    line
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn classes() -> Vec<DeviceClass> {
        let mut classes: Vec<DeviceClass> = crate::shipped::classes()
            .unwrap()
            .into_iter()
            .map(|c| serde_json::from_value(c).unwrap())
            .collect();
        // A class with a config of its own, as an admin may write.
        classes.push(
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "ts.gpu.example.com"},
                "spec": {
                    "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
                    "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"class": true}}}]
                }
            }))
            .unwrap(),
        );
        classes
    }

    fn slice(devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "n-gpu.nvidia.com-0"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                     "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap()
    }

    fn gpu(name: &str, memory: &str) -> serde_json::Value {
        json!({"name": name,
               "attributes": {"type": {"string": "gpu"}},
               "capacity": {"memory": {"value": memory}}})
    }

    fn claim(spec: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn an_allocation_carries_the_node_and_class_then_claim_configs() {
        let slices = [slice(json!([gpu("gpu-0", "80Gi")]))];
        let c = claim(json!({"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "ts.gpu.example.com"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"claim": true}}}]
        }}));
        let Placement::Allocated {
            allocation,
            devices,
        } = place(&slices, &classes(), &[], &c, "n").unwrap()
        else {
            panic!("not allocated")
        };
        assert_eq!(devices.results[0].device, "gpu-0");
        let value = serde_json::to_value(&allocation).unwrap();
        assert_eq!(value["devices"]["results"][0]["device"], "gpu-0");
        assert_eq!(
            value["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            "n"
        );
        let config = value["devices"]["config"].as_array().unwrap();
        assert_eq!(config.len(), 2, "{config:?}");
        assert_eq!(config[0]["source"], "FromClass");
        assert_eq!(config[0]["requests"], json!(["gpu"]));
        assert_eq!(config[0]["opaque"]["parameters"]["class"], true);
        assert_eq!(config[1]["source"], "FromClaim");
        assert_eq!(config[1]["opaque"]["parameters"]["claim"], true);
    }

    #[test]
    fn a_claim_that_does_not_fit_is_explained_request_by_request() {
        let slices = [slice(json!([gpu("gpu-0", "80Gi"), gpu("gpu-1", "80Gi")]))];
        let c = claim(json!({"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression":
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('256Gi')) >= 0"}}]}}]}}));
        let Placement::Unsatisfiable(explanation) =
            place(&slices, &classes(), &[], &c, "n").unwrap()
        else {
            panic!("allocated")
        };
        assert!(explanation.summary.contains("256Gi") || explanation.summary.contains("memory"));
        let lines = funnels(&explanation);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("request `gpu` (gpu.nvidia.com, needs 1 device): 2 devices -> 2 pass"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("-> 0 pass selector 1 of request `gpu`"),
            "{}",
            lines[0]
        );
        assert!(lines[0].ends_with("; 0 available"), "{}", lines[0]);
    }

    #[test]
    fn devices_of_allocated_claims_are_in_use() {
        let slices = [slice(json!([gpu("gpu-0", "80Gi")]))];
        let c = claim(
            json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}),
        );
        let Placement::Allocated { allocation, .. } =
            place(&slices, &classes(), &[], &c, "n").unwrap()
        else {
            panic!("not allocated")
        };
        let mut first = c.clone();
        first.metadata.name = Some("first".into());
        first.metadata.uid = Some("u-0".into());
        first.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
            allocation: Some(allocation),
            ..Default::default()
        });
        let Placement::Unsatisfiable(explanation) =
            place(&slices, &classes(), &[first], &c, "n").unwrap()
        else {
            panic!("the only GPU was given twice")
        };
        let lines = funnels(&explanation);
        assert!(lines[0].contains("of those 1 in use"), "{lines:?}");
    }

    #[test]
    fn an_unknown_class_is_an_error_not_a_verdict() {
        let slices = [slice(json!([gpu("gpu-0", "80Gi")]))];
        let c = claim(
            json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "nope"}}]}}),
        );
        let err = format!(
            "{:#}",
            place(&slices, &classes(), &[], &c, "n").unwrap_err()
        );
        assert!(err.contains("nope"), "{err}");
    }
}
