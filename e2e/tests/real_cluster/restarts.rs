//! The plugin restarted under running GPU pods, as DaemonSets do it: its pod
//! deleted (the DaemonSet starts a new one), and a rolling update to a new
//! image tag. Running pods keep their devices; the new plugin serves new
//! claims and cleans up after the old pods.

use std::time::{Duration, Instant};

use libtest_mimic::Failed;

use crate::claims::{
    NOT_SHARED, PLUGIN_DAEMONSET, claim_yaml, delete_and_check_clean, helm_upgrade, pod_on_claim,
    wait_plugin_rollout,
};
use crate::harness::{Cluster, DRIVER_NS};

pub const TESTS: [(&str, crate::Test); 2] = [
    (
        "restarts::the_plugin_pod_deleted_under_running_gpu_pods",
        plugin_pod_deleted,
    ),
    (
        "restarts::a_rolling_update_to_a_new_image_tag_loses_nothing",
        rolling_update,
    ),
];

const PLUGIN_SELECTOR: &str = "app.kubernetes.io/component=kubelet-plugin";

/// The names of the plugin's pods.
fn plugin_pods(c: &Cluster) -> Result<Vec<String>, Failed> {
    let out = c.kubectl(&[
        "get",
        "pods",
        "-n",
        DRIVER_NS,
        "-l",
        PLUGIN_SELECTOR,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    Ok(out.split_whitespace().map(str::to_owned).collect())
}

/// Waits until the DaemonSet has rolled out and exactly one plugin pod,
/// other than `old`, is ready.
fn wait_new_plugin(c: &Cluster, old: &str) -> Result<String, Failed> {
    wait_plugin_rollout(c)?;
    let start = Instant::now();
    loop {
        let pods = plugin_pods(c)?;
        if pods.len() == 1 && pods[0] != old {
            let ready = c.kubectl(&[
                "get",
                "pod",
                "-n",
                DRIVER_NS,
                &pods[0],
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])?;
            if ready.trim() == "True" {
                return Ok(pods[0].clone());
            }
        }
        if start.elapsed() > Duration::from_secs(180) {
            return Err(format!("no new ready plugin pod replacing {old}: {pods:?}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A running GPU pod on its own claim: `(pod, claim uid, GPU nodes seen)`.
fn gpu_pod(c: &Cluster, ns: &str, name: &str) -> Result<(String, String, Vec<String>), Failed> {
    c.apply(
        ns,
        &claim_yaml(name, "gpu.nvidia.com", &[NOT_SHARED], "", ""),
    )?;
    let (seen, _, uid) = pod_on_claim(c, ns, name)?;
    Ok((
        format!("check-{name}"),
        uid,
        seen.gpus().iter().map(ToString::to_string).collect(),
    ))
}

/// The pod is still running, with the same GPU nodes as before (read again
/// from inside the container).
fn still_has(c: &Cluster, ns: &str, pod: &str, gpus: &[String]) -> Result<(), Failed> {
    let phase = c.kubectl(&[
        "get",
        "pod",
        "-n",
        ns,
        pod,
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    if phase.trim() != "Running" {
        return Err(format!("{pod} is {phase} after the plugin restart").into());
    }
    let now = c.kubectl(&[
        "exec",
        "-n",
        ns,
        pod,
        "--",
        "sh",
        "-c",
        "ls /dev/nvidia[0-9]*",
    ])?;
    let now: Vec<String> = now.split_whitespace().map(str::to_owned).collect();
    if now != gpus {
        return Err(format!("{pod} had {gpus:?}, has {now:?} after the plugin restart").into());
    }
    Ok(())
}

fn plugin_pod_deleted(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-restart";
    c.fresh_namespace(ns)?;
    let (pod, uid, gpus) = gpu_pod(c, ns, "before")?;
    let old = plugin_pods(c)?.pop().ok_or("no plugin pod")?;
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        DRIVER_NS,
        &old,
        "--wait=true",
        "--timeout=120s",
    ])?;
    let new = wait_new_plugin(c, &old)?;
    still_has(c, ns, &pod, &gpus)?;
    // The new plugin prepares new claims...
    let (pod2, uid2, _) = gpu_pod(c, ns, "after")?;
    // ...and unprepares what the old one prepared.
    delete_and_check_clean(c, ns, &[&pod, &pod2], &[uid, uid2])?;
    eprintln!("plugin pod {old} replaced by {new}; the running pod kept {gpus:?}");
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}

fn rolling_update(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-rollout";
    c.fresh_namespace(ns)?;
    let (pod, uid, gpus) = gpu_pod(c, ns, "rollout")?;
    let image = c.kubectl(&[
        "get",
        "-n",
        DRIVER_NS,
        PLUGIN_DAEMONSET,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ])?;
    let image = image.trim();
    let (repo, tag) = image
        .rsplit_once(':')
        .ok_or_else(|| format!("image {image} has no tag"))?;
    // A new tag of the same binaries: kubelet sees a new image, as in an upgrade.
    // (The digest tag plus the time: every run rolls to a tag not seen yet.)
    let base = tag.split("-r").next().unwrap_or(tag);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let new_tag = format!("{base}-r{now}");
    let ctr = c.bin.join("ctr");
    let out = std::process::Command::new(&ctr)
        .args([
            "--address",
            "/run/gpu-dra-containerd/containerd.sock",
            "--namespace",
            "k8s.io",
            "images",
            "tag",
            "--force",
            image,
        ])
        .arg(format!("{repo}:{new_tag}"))
        .output()
        .map_err(|e| format!("{}: {e}", ctr.display()))?;
    if !out.status.success() {
        return Err(format!("ctr images tag: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let old = plugin_pods(c)?.pop().ok_or("no plugin pod")?;
    helm_upgrade(
        c,
        &[
            "--set-string",
            &format!("kubeletPlugin.image.tag={new_tag}"),
        ],
    )?;
    let new = wait_new_plugin(c, &old)?;
    let running = c.kubectl(&[
        "get",
        "pod",
        "-n",
        DRIVER_NS,
        &new,
        "-o",
        "jsonpath={.spec.containers[0].image}",
    ])?;
    if !running.trim().ends_with(&new_tag) {
        return Err(format!("the new plugin pod runs {running}, want tag {new_tag}").into());
    }
    still_has(c, ns, &pod, &gpus)?;
    let (pod2, uid2, _) = gpu_pod(c, ns, "rollout-after")?;
    delete_and_check_clean(c, ns, &[&pod, &pod2], &[uid, uid2])?;
    eprintln!("rolled {old} ({tag}) to {new} ({new_tag}); the running pod kept {gpus:?}");
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}
