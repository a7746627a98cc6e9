//! KEP-5304 device metadata in real pods: containerd mounts the file the
//! plugin wrote through the claim's CDI spec, at the KEP's path for a claim
//! named in the pod and for one made from a template; its device and PCI
//! address are those allocated and published; the files go with the claims.

use std::path::Path;
use std::time::Duration;

use libtest_mimic::Failed;
use serde_json::Value;

use crate::claims::{
    NOT_SHARED, WAIT_UNTIL_STOPPED, allocated, claim_yaml, claims_rest, device_attribute, get_json,
    log_to_end, script_pod, whole_gpu_template,
};
use crate::harness::{Cluster, PLUGIN_DIR};

pub const TESTS: [(&str, crate::Test); 1] = [(
    "metadata::pods_read_their_device_metadata_file",
    pods_read_their_device_metadata_file,
)];

const DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// A pod that prints the file at `path` and waits to be deleted.
fn pod(name: &str, source: &str, path: &str) -> String {
    script_pod(
        name,
        &format!("cat {path} && echo '==END' && {{ {WAIT_UNTIL_STOPPED}; }}"),
        &claims_rest(&[("gpus", source)]),
    )
}

/// The documents the pod printed.
fn read(c: &Cluster, ns: &str, pod: &str) -> Result<Vec<Value>, Failed> {
    c.wait_pod_phase(ns, pod, "Running", Duration::from_secs(120))?;
    let log = log_to_end(c, ns, pod)?;
    let text = log.split("==END").next().unwrap_or_default();
    let docs: Vec<Value> = serde_json::Deserializer::from_str(text)
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("pod {pod} printed no metadata ({e}):\n{log}"))?;
    if docs.len() != 2 {
        return Err(format!(
            "pod {pod}: {} documents, want v1beta1 and v1alpha1:\n{log}",
            docs.len()
        )
        .into());
    }
    Ok(docs)
}

/// Checks the documents against the claim `claim` as the API server has it.
fn check(
    c: &Cluster,
    ns: &str,
    claim: &str,
    docs: &[Value],
    pod_claim: Option<&str>,
) -> Result<(), Failed> {
    let json = get_json(c, ns, &["resourceclaim", claim])?;
    let uid = json["metadata"]["uid"].as_str().unwrap_or_default();
    let device = allocated(&json)
        .first()
        .map(|(_, d)| d.clone())
        .ok_or_else(|| format!("claim {claim} not allocated"))?;
    let bus = device_attribute(c, &device, "resource.kubernetes.io/pciBusID")?;
    for (doc, version) in docs.iter().zip(["v1beta1", "v1alpha1"]) {
        let d = &doc["requests"][0]["devices"][0];
        let ok = doc["apiVersion"] == format!("metadata.resource.k8s.io/{version}")
            && doc["kind"] == "DeviceMetadata"
            && doc["metadata"]["uid"] == uid
            && doc["metadata"]["name"] == claim
            && doc["podClaimName"].as_str() == pod_claim
            && doc["requests"][0]["name"] == "gpu"
            && d["driver"] == "gpu.nvidia.com"
            && d["name"] == device.as_str()
            && d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] == bus.as_str();
        if !ok {
            return Err(
                format!("claim {claim} ({uid}, {device} at {bus}): the file says {doc}").into(),
            );
        }
    }
    Ok(())
}

fn metadata_dirs() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(Path::new(PLUGIN_DIR).join("dra-device-metadata"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn pods_read_their_device_metadata_file(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-metadata";
    c.fresh_namespace(ns)?;
    c.apply(
        ns,
        &claim_yaml("named", "gpu.nvidia.com", &[NOT_SHARED], "", ""),
    )?;
    c.apply(ns, &whole_gpu_template("per-pod"))?;
    c.apply(
        ns,
        &pod(
            "named",
            "resourceClaimName: named",
            &format!("{DIR}/resourceclaims/named/gpu/gpu.nvidia.com-metadata.json"),
        ),
    )?;
    c.apply(
        ns,
        &pod(
            "templated",
            "resourceClaimTemplateName: per-pod",
            &format!("{DIR}/resourceclaimtemplates/gpus/gpu/gpu.nvidia.com-metadata.json"),
        ),
    )?;
    let named = read(c, ns, "named")?;
    check(c, ns, "named", &named, None)?;
    let templated = read(c, ns, "templated")?;
    let generated = crate::claims::pod_claims(c, ns, "templated")?.remove(0);
    check(c, ns, &generated, &templated, Some("gpus"))?;
    let dirs = metadata_dirs();
    for want in [format!("{ns}_named"), format!("{ns}_{generated}")] {
        if !dirs.contains(&want) {
            return Err(format!("no {want} on the node: {dirs:?}").into());
        }
    }
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        ns,
        "named",
        "templated",
        "--wait=true",
    ])?;
    c.kubectl(&["delete", "resourceclaim", "-n", ns, "named", "--wait=true"])?;
    // Unprepared once the pods are gone: the files go too.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<String> = metadata_dirs()
            .into_iter()
            .filter(|d| d.starts_with(ns))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("metadata left on the node after the pods: {left:?}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
