//! The CEL selector environment (`gpu_dra_analysis::cel`): compile an
//! expression with Kubernetes' limits and evaluate it against a device
//! whose attributes and capacities come from the input too.
//!
//! Input: UTF-8 text. Lines before a line `---` describe the device, one
//! entry a line: `int NAME VALUE`, `bool NAME true|false`, `str NAME TEXT`,
//! `ver NAME SEMVER`, `cap NAME QUANTITY`, `multi` (allow multiple
//! allocations); lines that are none of these are ignored. The text after
//! `---` (or the whole input, with a fixed GPU device, when there is no
//! `---`) is the selector expression.
//!
//! Checked beyond "no panic and no hang": a selector that compiles
//! evaluates to the same answer twice (the runtime meter is reset between
//! evaluations, and the compile cache returns an equivalent program).

#![no_main]

use std::sync::LazyLock;

use gpu_dra_analysis::cel::{AttrValue, CelDevice, Compiler};
use gpu_dra_api::quantity::Quantity;
use libfuzzer_sys::fuzz_target;

const DRIVER: &str = "gpu.nvidia.com";

/// One compiler for the whole run, as the webhook keeps one: its cache is
/// part of what is exercised.
static COMPILER: LazyLock<Compiler> = LazyLock::new(Compiler::new);

/// A device shaped like one the plugin publishes.
fn default_device() -> CelDevice {
    let mut d = CelDevice::new(DRIVER);
    d.add_attribute("type", AttrValue::String("gpu".into()))
        .unwrap();
    d.add_attribute(
        "productName",
        AttrValue::String("NVIDIA H100 80GB HBM3".into()),
    )
    .unwrap();
    d.add_attribute("index", AttrValue::Int(0)).unwrap();
    d.add_attribute(
        "cudaComputeCapability",
        AttrValue::version("9.0.0").unwrap(),
    )
    .unwrap();
    d.add_attribute("driverVersion", AttrValue::version("550.54.15").unwrap())
        .unwrap();
    d.add_attribute("mig", AttrValue::Bool(false)).unwrap();
    d.add_capacity("memory", Quantity::parse("80Gi").unwrap())
        .unwrap();
    d.add_capacity("multiprocessors", Quantity::parse("132").unwrap())
        .unwrap();
    d
}

/// The device the header lines describe; bad entries are skipped, as the
/// conversion from a ResourceSlice refuses them.
fn device_from(header: &str) -> CelDevice {
    let mut d = CelDevice::new(DRIVER);
    for line in header.lines() {
        if line == "multi" {
            d.allow_multiple_allocations = true;
            continue;
        }
        let mut parts = line.splitn(3, ' ');
        let (Some(kind), Some(name), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let _ = match kind {
            "int" => value
                .parse()
                .map_or(Ok(()), |v| d.add_attribute(name, AttrValue::Int(v))),
            "bool" => value
                .parse()
                .map_or(Ok(()), |v| d.add_attribute(name, AttrValue::Bool(v))),
            "str" => d.add_attribute(name, AttrValue::String(value.to_owned())),
            "ver" => AttrValue::version(value).and_then(|v| d.add_attribute(name, v)),
            "cap" => Quantity::parse(value).map_or(Ok(()), |q| d.add_capacity(name, q)),
            _ => Ok(()),
        };
    }
    d
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (device, expression) = match text.split_once("\n---\n") {
        Some((header, expression)) => (device_from(header), expression),
        None => (default_device(), text),
    };
    let Ok(selector) = COMPILER.compile(expression) else {
        return;
    };
    let _ = selector.estimated_cost();
    let evaluator = COMPILER.evaluator(&device);
    let first = evaluator.matches(&selector).map_err(|e| e.to_string());
    let again = COMPILER
        .compile(expression)
        .expect("a selector that compiled once compiles again");
    let second = evaluator.matches(&again).map_err(|e| e.to_string());
    assert_eq!(first, second, "two evaluations of {expression:?} disagree");
});
