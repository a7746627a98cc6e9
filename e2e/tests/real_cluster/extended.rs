//! The `nvidia.com/gpu` extended resource (KEP-5004, GA in Kubernetes 1.37)
//! through the chart's `deviceClasses.gpuExtendedResourceName`: a pod that
//! asks for `resources.limits: {nvidia.com/gpu: 1}` and names no claim gets
//! a whole GPU of this driver, prepared by the plugin as any claim, and
//! everything is released when the pod goes.

use libtest_mimic::Failed;
use serde_json::Value;

use crate::claims::{
    CHECK_SCRIPT, check_against_spec, delete_and_check_clean, get_json, helm_upgrade, script_pod,
};
use crate::harness::Cluster;

pub const TESTS: [(&str, crate::Test); 1] = [(
    "extended::a_pod_with_an_nvidia_com_gpu_limit_and_no_claim_gets_a_gpu",
    extended_resource_pod,
)];

const RESOURCE: &str = "nvidia.com/gpu";

/// Sets the chart's `deviceClasses.gpuExtendedResourceName` (no plugin
/// restart: only the DeviceClass changes).
fn set_extended(c: &Cluster, name: &str) -> Result<(), Failed> {
    helm_upgrade(
        c,
        &[
            "--set",
            &format!("deviceClasses.gpuExtendedResourceName={name}"),
        ],
    )
}

fn extended_resource_pod(c: &Cluster) -> Result<(), Failed> {
    set_extended(c, RESOURCE)?;
    let outcome = on_the_class(c);
    // The class goes back to the chart's default whatever happened.
    set_extended(c, "")?;
    outcome?;
    let class = gpu_class(c)?;
    if !class["spec"]["extendedResourceName"].is_null() {
        return Err(format!(
            "the value was reset, but the class still has {}",
            class["spec"]
        )
        .into());
    }
    Ok(())
}

/// The `gpu.nvidia.com` DeviceClass.
fn gpu_class(c: &Cluster) -> Result<Value, Failed> {
    let text = c.kubectl(&["get", "deviceclass", "gpu.nvidia.com", "-o", "json"])?;
    Ok(serde_json::from_str(&text).map_err(|e| format!("deviceclass: {e}"))?)
}

fn on_the_class(c: &Cluster) -> Result<(), Failed> {
    let class = gpu_class(c)?;
    if class["spec"]["extendedResourceName"] != RESOURCE {
        return Err(format!(
            "the class's spec is {}, without extendedResourceName",
            class["spec"]
        )
        .into());
    }
    // No device plugin here: the node itself has no such resource, so only
    // DRA can give the pod one.
    let node: Value = serde_json::from_str(&c.kubectl(&["get", "nodes", "-o", "json"])?)
        .map_err(|e| format!("nodes: {e}"))?;
    if node["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|n| !n["status"]["allocatable"][RESOURCE].is_null())
    {
        return Err(format!("a node advertises {RESOURCE} itself (a device plugin?)").into());
    }

    let ns = "e2e-extended";
    c.fresh_namespace(ns)?;
    let pod = "extended-gpu";
    let yaml = script_pod(
        pod,
        CHECK_SCRIPT,
        &format!("    resources:\n      limits: {{{RESOURCE}: 1}}\n"),
    );
    let seen = crate::claims::run_check_pod(c, ns, pod, &yaml)?;
    let gpus = seen.gpus();
    if gpus.len() != 1 {
        return Err(format!("the pod sees GPU nodes {gpus:?}, want exactly one").into());
    }
    let p = get_json(c, ns, &["pod", pod])?;
    let status = &p["status"]["extendedResourceClaimStatus"];
    let claim = status["resourceClaimName"]
        .as_str()
        .ok_or_else(|| {
            format!(
                "no extendedResourceClaimStatus in the pod's status: {}",
                p["status"]
            )
        })?
        .to_owned();
    let mapped = status["requestMappings"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["containerName"] == "check" && m["resourceName"] == RESOURCE);
    if !mapped {
        return Err(
            format!("{RESOURCE} of container check is not mapped to a request: {status}").into(),
        );
    }
    // The claim the scheduler made is allocated by our driver on this
    // node, and the container got exactly what the plugin's CDI spec says.
    check_against_spec(c, ns, &claim, &seen)?;
    let json = get_json(c, ns, &["resourceclaim", &claim])?;
    let results: Vec<&Value> = json["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if results.len() != 1
        || results[0]["driver"] != "gpu.nvidia.com"
        || !results[0]["device"]
            .as_str()
            .is_some_and(|d| d.starts_with("gpu-") && !d.contains("-mig-"))
    {
        return Err(format!(
            "claim {claim} is allocated {results:?}, want one whole GPU of gpu.nvidia.com"
        )
        .into());
    }
    let uid = json["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    delete_and_check_clean(c, ns, &[pod], &[uid])?;
    eprintln!(
        "pod {pod} got {gpus:?} through claim {claim} ({})",
        results[0]["device"]
    );
    Ok(())
}
