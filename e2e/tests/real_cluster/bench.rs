//! Benchmarks on the real cluster (not timed tests: they are ignored unless
//! asked for, and report numbers rather than assert goals):
//!
//! ```text
//! GPU_DRA_E2E_USE_RUNNING_CLUSTER=1 cargo test -p gpu-dra-e2e --test real_cluster -- --ignored bench::
//! ```
//!
//! - Pod start: creation (the API server's answer to the create) to phase
//!   Running seen by a watch, for a pod with a whole-GPU claim (its own, from
//!   a ResourceClaimTemplate) against the same pod without a claim, 20 of
//!   each one at a time (each deleted, and its claim gone, before the next).
//! - A burst: 16 pods created at once, each with a `1g.10gb` MIG claim (on a
//!   dynamic-MIG pool the plugin creates each instance), time until all run,
//!   against one such pod alone (5 runs), and 16 pods without claims.
//! - The scheduler's own view: `scheduler_scheduling_attempt_duration_seconds`
//!   (scheduled attempts) and the DynamicResources plugin's
//!   `scheduler_plugin_execution_duration_seconds`, differences of the
//!   histograms' sums and counts over each phase, from the scheduler's
//!   `/metrics` (as the admin).
//!
//! Run it on a quiet cluster: nothing else scheduling or preparing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use libtest_mimic::Failed;

use crate::harness::{BUSYBOX, Cluster, node};

pub const BENCHES: [(&str, crate::Test); 1] =
    [("bench::pod_start_with_and_without_a_gpu_claim", pod_start)];

const NS: &str = "e2e-bench";

fn pod(name: &str, template: Option<&str>) -> Result<Pod, Failed> {
    let claims = match template {
        Some(t) => {
            format!(r#","resourceClaims":[{{"name":"gpu","resourceClaimTemplateName":"{t}"}}]"#)
        }
        None => String::new(),
    };
    let resources = if template.is_some() {
        r#","resources":{"claims":[{"name":"gpu"}]}"#
    } else {
        ""
    };
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},
            "spec":{{"terminationGracePeriodSeconds":0,"restartPolicy":"Never",
            "containers":[{{"name":"c","image":"{BUSYBOX}","imagePullPolicy":"Never",
            "command":["sleep","3600"]{resources}}}]{claims}}}}}"#
    );
    Ok(serde_json::from_str(&json).map_err(|e| format!("pod {name}: {e}"))?)
}

/// Creates the pods at once; returns each one's time from its create call
/// returning to Running, and the time until all run.
async fn start(api: &Api<Pod>, pods: Vec<Pod>) -> Result<(Vec<Duration>, Duration), Failed> {
    let all = Instant::now();
    let mut tasks = Vec::new();
    for p in pods {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let name = p.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &p)
                .await
                .map_err(|e| format!("create {name}: {e}"))?;
            let t0 = Instant::now();
            tokio::time::timeout(
                Duration::from_secs(180),
                await_condition(api.clone(), &name, conditions::is_pod_running()),
            )
            .await
            .map_err(|_| format!("{name} not Running within 180 s"))?
            .map_err(|e| format!("watch {name}: {e}"))?;
            Ok::<Duration, String>(t0.elapsed())
        }));
    }
    let mut each = Vec::new();
    for t in tasks {
        each.push(t.await.map_err(|e| e.to_string())??);
    }
    Ok((each, all.elapsed()))
}

/// Deletes every pod of the namespace and waits until they (and the claims
/// made for them) are gone.
async fn clear(c: &Cluster, api: &Api<Pod>) -> Result<(), Failed> {
    let names: Vec<String> = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    for n in &names {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
    for n in &names {
        tokio::time::timeout(
            Duration::from_secs(120),
            await_condition(api.clone(), n, conditions::is_deleted("")),
        )
        .await
        .map_err(|_| format!("{n} not deleted within 120 s"))?
        .map_err(|e| e.to_string())?;
    }
    c.wait_jsonpath(
        NS,
        "resourceclaims",
        "{.items[*].metadata.name}",
        "",
        Duration::from_secs(120),
    )?;
    // And the node has unprepared them: kubelet may unprepare a claim after
    // the API has deleted it, and the scheduler may meanwhile give its device
    // to the next claim, whose prepare the plugin then refuses until the
    // unprepare came (kubelet retries with a back-off; seen here: 80 s). The
    // benchmark measures a start on a free device, not that race.
    let start = Instant::now();
    while !node::claim_cdi_specs().is_empty() {
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "claims still prepared on the node: {:?}",
                node::claim_cdi_specs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(what: &str, mut d: Vec<Duration>) -> String {
    d.sort();
    format!(
        "{what}: n={} p50 {:.1} ms, p95 {:.1} ms, min {:.1} ms, max {:.1} ms",
        d.len(),
        percentile(&d, 50.0).as_secs_f64() * 1e3,
        percentile(&d, 95.0).as_secs_f64() * 1e3,
        d.first().copied().unwrap_or_default().as_secs_f64() * 1e3,
        d.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    )
}

/// `(sum, count)` of the scheduler's histograms we report, by series.
fn scheduler_metrics(c: &Cluster) -> Result<BTreeMap<String, f64>, Failed> {
    let pki = c
        .kubeconfig
        .parent()
        .ok_or("kubeconfig has no folder")?
        .join("pki");
    let out = std::process::Command::new("curl")
        .args(["-sf", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg("-k")
        .arg("https://127.0.0.1:10259/metrics")
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(format!("scheduler metrics: curl exited {}", out.status).into());
    }
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let keep = (line.starts_with("scheduler_scheduling_attempt_duration_seconds_")
            && line.contains("result=\"scheduled\""))
            || (line.starts_with("scheduler_plugin_execution_duration_seconds_")
                && line.contains("plugin=\"DynamicResources\""));
        if keep
            && (line.contains("_sum{") || line.contains("_count{"))
            && let Some((k, v)) = line.rsplit_once(' ')
        {
            m.insert(k.to_owned(), v.parse().unwrap_or(0.0));
        }
    }
    Ok(m)
}

fn metric_delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in after {
        if k.contains("_sum{") {
            let sum_key = k.as_str();
            let count_key = sum_key.replace("_sum{", "_count{");
            let dn = after.get(&count_key).copied().unwrap_or(0.0)
                - before.get(&count_key).copied().unwrap_or(0.0);
            let ds = v - before.get(sum_key).copied().unwrap_or(0.0);
            if dn > 0.0 {
                out.push(format!(
                    "{sum_key}: {dn} observations, mean {:.2} ms",
                    ds / dn * 1e3
                ));
            }
        }
    }
    out
}

fn pod_start(c: &Cluster) -> Result<(), Failed> {
    c.fresh_namespace(NS)?;
    c.apply(
        NS,
        &(crate::claims::whole_gpu_template("whole-gpu")
            + "---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: 1g.10gb.mig.nvidia.com
"),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = c.client().await?;
        let api: Api<Pod> = Api::namespaced(client, NS);
        let mut report = Vec::new();
        // Warm-up: images and caches.
        start(&api, vec![pod("warm", None)?, pod("warm-gpu", Some("whole-gpu"))?]).await?;
        clear(c, &api).await?;

        let m0 = scheduler_metrics(c)?;
        let mut plain = Vec::new();
        for i in 0..20 {
            plain.extend(start(&api, vec![pod(&format!("plain-{i}"), None)?]).await?.0);
            clear(c, &api).await?;
        }
        let m1 = scheduler_metrics(c)?;
        let mut gpu = Vec::new();
        for i in 0..20 {
            gpu.extend(start(&api, vec![pod(&format!("gpu-{i}"), Some("whole-gpu"))?]).await?.0);
            clear(c, &api).await?;
        }
        let m2 = scheduler_metrics(c)?;
        report.push(summary("pod without a claim, one at a time", plain));
        report.push(summary("pod with a whole-GPU claim, one at a time", gpu));
        report.push(format!("scheduler, pods without claims: {:?}", metric_delta(&m0, &m1)));
        report.push(format!("scheduler, whole-GPU pods: {:?}", metric_delta(&m1, &m2)));

        let mut one_mig = Vec::new();
        for i in 0..5 {
            one_mig.push(start(&api, vec![pod(&format!("mig-one-{i}"), Some("mig"))?]).await?.1);
            clear(c, &api).await?;
        }
        let m3 = scheduler_metrics(c)?;
        let burst: Vec<Pod> = (0..16).map(|i| pod(&format!("mig-burst-{i}"), Some("mig"))).collect::<Result<_, _>>()?;
        let (each, all) = start(&api, burst).await?;
        let m4 = scheduler_metrics(c)?;
        clear(c, &api).await?;
        let plain_burst: Vec<Pod> = (0..16).map(|i| pod(&format!("plain-burst-{i}"), None)).collect::<Result<_, _>>()?;
        let (_, plain_all) = start(&api, plain_burst).await?;
        clear(c, &api).await?;
        report.push(summary("one pod with a 1g.10gb MIG claim, alone", one_mig));
        report.push(summary("16 pods with 1g.10gb MIG claims at once, each", each));
        report.push(format!(
            "16 pods with MIG claims at once: all Running after {:.1} ms; 16 pods without claims: {:.1} ms",
            all.as_secs_f64() * 1e3,
            plain_all.as_secs_f64() * 1e3
        ));
        report.push(format!("scheduler, MIG burst: {:?}", metric_delta(&m3, &m4)));
        eprintln!("\n== real-cluster benchmark\n{}\n", report.join("\n"));
        Ok::<(), Failed>(())
    })
}
