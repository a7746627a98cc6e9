//! CEL selector evaluations per second on one A100, five selectors of the
//! shipped classes and docs; device conversion and compile (cache hit and
//! miss) rates. Prints rates, asserts nothing about time.
//!
//! `cargo bench -p gpu-dra-analysis --bench cel`; the bench runner
//! (`cargo run --release -p gpu-dra-e2e --bin bench`) runs it and reads
//! the "all five" line back.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_dra_analysis::cel::{AttrValue, CelDevice, Compiler, Limits};
use gpu_dra_api::quantity::Quantity;

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

fn main() {
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

/// An A100 as NVIDIA's driver publishes it.
fn a100() -> CelDevice {
    let text = |s: &str| AttrValue::String(s.to_owned());
    let version = |s: &str| AttrValue::version(s).expect("a version");
    let mut d = CelDevice::new("gpu.nvidia.com");
    for (name, value) in [
        ("type", text("gpu")),
        ("uuid", text("GPU-3f2a9a1c-8d4e-4b6a-9f43-0c1d2e3f4a5b")),
        ("productName", text("NVIDIA A100-SXM4-40GB")),
        ("brand", text("Nvidia")),
        ("architecture", text("Hopper")),
        ("index", AttrValue::Int(0)),
        ("minor", AttrValue::Int(0)),
        ("driverVersion", version("535.161.8")),
        ("cudaDriverVersion", version("12.4.0")),
        ("cudaComputeCapability", version("9.0.0")),
        ("resource.kubernetes.io/pciBusID", text("0000:18:00.0")),
        ("resource.kubernetes.io/pcieRoot", text("pci0000:10")),
    ] {
        d.add_attribute(name, value).expect("an attribute");
    }
    d.add_capacity("memory", Quantity::parse("40Gi").expect("a quantity"))
        .expect("a capacity");
    d
}
