//! Micro benchmark: `cargo test -p gpu-dra-analysis --release -- --ignored
//! --nocapture cel_eval_rate`. Prints rates, asserts nothing about time.

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::*;

const SELECTORS: [&str; 5] = [
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'",
    "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity(\"40Gi\"))",
    "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
    "device.attributes[\"gpu.nvidia.com\"].driverVersion.compareTo(semver(\"550.54.15\")) >= 0",
];

/// Runs `f` repeatedly for about `time`; returns calls per second.
fn rate(time: Duration, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < time {
        for _ in 0..100 {
            f();
        }
        calls += 100;
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn cel_eval_rate() {
    let compiler = Compiler::new();
    let device = a100();
    let selectors: Vec<_> = SELECTORS
        .iter()
        .map(|s| compiler.compile(s).unwrap())
        .collect();
    let evaluator = compiler.evaluator(&device);
    let time = Duration::from_millis(700);
    for (i, selector) in selectors.iter().enumerate() {
        let r = rate(time, || {
            black_box(evaluator.matches(selector).unwrap());
        });
        println!("selector {}: {r:>12.0} evaluations/s", i + 1);
    }
    let all = rate(time, || {
        for selector in &selectors {
            black_box(evaluator.matches(selector).unwrap());
        }
    });
    println!("all five:   {:>12.0} evaluations/s", all * 5.0);
    let convert = rate(time, || {
        black_box(compiler.evaluator(black_box(&device)));
    });
    println!("device conversion (Evaluator::new): {convert:>12.0}/s");
    let cached = rate(time, || {
        black_box(compiler.compile(SELECTORS[0]).unwrap());
    });
    println!("compile, cache hit: {cached:>12.0}/s");
    let uncached = Compiler::with_limits(Limits {
        cache_capacity: 0,
        ..Limits::default()
    });
    let miss = rate(time, || {
        black_box(uncached.compile(SELECTORS[1]).unwrap());
    });
    println!("compile, cache miss: {miss:>12.0}/s");
}
