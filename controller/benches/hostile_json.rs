//! Rejection time of deeply nested JSON (not a test): AdmissionReview
//! bodies whose `request` nests 20k to 200k levels, through
//! [`Reviewer::review_json`], with the cost of the first pass as it was
//! before (a derived struct, whose unknown fields serde_json skips without
//! a depth limit) timed alongside; and opaque device configs through
//! [`gpu_dra_api::config::decode_bytes`]. Prints a Markdown table of
//! medians.
//!
//! ```text
//! cargo bench -p gpu-dra-controller --bench hostile_json -- [runs]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra_analysis::validate::{StaticClasses, Validator};
use gpu_dra_controller::webhook::review::Reviewer;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;

/// The first pass as it was before: a derived struct.
#[derive(serde::Deserialize)]
#[allow(dead_code)] // only read to be timed
struct OldHead {
    #[serde(rename = "apiVersion")]
    api_version: Option<serde_json::Value>,
    kind: Option<serde_json::Value>,
}

/// Median wall time of `runs` calls of `f`.
fn median<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map_or(5, |a| a.parse().expect("runs: a number"));
    let reviewer = Reviewer::new(
        Validator::new("gpu.nvidia.com"),
        Arc::new(StaticClasses::default()),
    );
    let head = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"#;
    println!("| input | levels | bytes | before | after |");
    println!("|---|---|---|---|---|");
    for (name, open, close) in [
        ("AdmissionReview, `request` nested `[`", "[", "]"),
        (
            "AdmissionReview, `request` nested `{\"a\":`",
            "{\"a\":",
            "}",
        ),
    ] {
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            // Well-formed: the old first pass reads it all and passes it.
            let body = head.to_owned() + &open.repeat(n) + "1" + &close.repeat(n) + "}";
            let body = body.as_bytes();
            assert!(reviewer.review_json(body).is_err());
            let after = median(runs, || reviewer.review_json(std::hint::black_box(body)));
            let old_head = median(runs, || {
                serde_json::from_slice::<OldHead>(std::hint::black_box(body)).is_ok()
            });
            // Before: the old first pass, then the full decode, which
            // refused the body.
            let full = median(runs, || {
                serde_json::from_slice::<AdmissionReview<DynamicObject>>(std::hint::black_box(body))
                    .is_err()
            });
            println!(
                "| {name} | {n} | {} | {} | {} |",
                body.len(),
                show(old_head + full),
                show(after)
            );
        }
    }
    for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
        let raw = "[".repeat(n);
        assert!(gpu_dra_api::config::decode_bytes(raw.as_bytes()).is_err());
        let t = median(runs, || {
            gpu_dra_api::config::decode_bytes(std::hint::black_box(raw.as_bytes())).is_err()
        });
        println!(
            "| opaque config (`decode_bytes`), nested `[` | {n} | {n} | {} | {} |",
            show(t),
            show(t)
        );
    }
}
