//! Latency benchmark of the admission webhook (not a test): starts the real
//! server in-process with a test certificate, sends reviews over one
//! kept-alive HTTPS connection the way the API server does, and prints
//! p50/p90/p99/max per kind of review.
//!
//! ```text
//! cargo bench -p gpu-dra-controller --bench webhook -- [reviews] [connections]
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Harness, review};
use serde_json::{Value, json};

fn cases() -> Vec<(&'static str, Value)> {
    let classes = common::nvidia_classes();
    let template = common::nvidia_example_template();
    let claim_with_selector = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "big-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression":
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0 && device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"}}]
        }}]}}
    });
    let bad_class = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "bad.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname == 'x'"}}]}
    });
    let other = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fpga", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "f", "exactly": {"deviceClassName": "fpga.example.com"}}]}}
    });
    vec![
        ("nvidia DeviceClass", classes[0].clone()),
        ("example template", template),
        ("claim with selector", claim_with_selector),
        ("invalid DeviceClass", bad_class),
        ("other driver claim", other),
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn line(name: &str, samples: &mut [Duration]) {
    samples.sort();
    println!(
        "{name:<22} n={:<6} p50={:>8.1?} p90={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        samples.len(),
        percentile(samples, 0.50),
        percentile(samples, 0.90),
        percentile(samples, 0.99),
        samples[samples.len() - 1],
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` adds `--bench` to the arguments.
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let total: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5000);
    let connections: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let harness = Harness::start().await;
    let cases = cases();
    let bodies: Vec<Vec<u8>> = cases
        .iter()
        .map(|(_, o)| serde_json::to_vec(&review("CREATE", o)).unwrap())
        .collect();

    let mut tasks = Vec::new();
    let started = Instant::now();
    for c in 0..connections {
        let client = harness.client.clone();
        let bodies = bodies.clone();
        let per_connection = total / connections;
        tasks.push(tokio::spawn(async move {
            let mut conn = client.connect().await;
            // Warm-up: compiler caches, connection, allocator.
            for body in bodies.iter().cycle().take(200) {
                conn.validate_raw(body.clone()).await;
            }
            let mut samples = vec![Vec::new(); bodies.len()];
            for i in 0..per_connection {
                let k = (i + c) % bodies.len();
                let t = Instant::now();
                let answer = conn.validate_raw(bodies[k].clone()).await;
                samples[k].push(t.elapsed());
                assert_eq!(answer.status, http::StatusCode::OK, "{}", answer.text());
            }
            samples
        }));
    }
    let mut per_kind = vec![Vec::new(); bodies.len()];
    for t in tasks {
        for (k, s) in t.await.unwrap().into_iter().enumerate() {
            per_kind[k].extend(s);
        }
    }
    let elapsed = started.elapsed();
    let mut all: Vec<Duration> = per_kind.iter().flatten().copied().collect();
    println!(
        "{} reviews over {connections} HTTPS connection(s) in {elapsed:.2?} ({:.0}/s), round trip as the client sees it:",
        all.len(),
        all.len() as f64 / elapsed.as_secs_f64()
    );
    for ((name, _), samples) in cases.iter().zip(per_kind.iter_mut()) {
        line(name, samples);
    }
    line("all", &mut all);
}
