//! Tests of the selector environment: realistic devices, the real
//! selectors, the libraries, errors, limits and hostile expressions.

mod hostile;
mod library;
mod selectors;

use super::*;
use gpu_dra_api::quantity::Quantity;

pub(super) const DRIVER: &str = "gpu.nvidia.com";

fn version(text: &str) -> AttrValue {
    AttrValue::version(text).unwrap()
}

fn text(s: &str) -> AttrValue {
    AttrValue::String(s.to_owned())
}

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

/// A full GPU as NVIDIA's driver publishes it.
pub(super) fn gpu(product: &str, memory: &str, driver_version: &str) -> CelDevice {
    let mut d = CelDevice::new(DRIVER);
    for (name, value) in [
        ("type", text("gpu")),
        ("uuid", text("GPU-3f2a9a1c-8d4e-4b6a-9f43-0c1d2e3f4a5b")),
        ("productName", text(product)),
        ("brand", text("Nvidia")),
        ("architecture", text("Hopper")),
        ("index", AttrValue::Int(0)),
        ("minor", AttrValue::Int(0)),
        ("driverVersion", version(driver_version)),
        ("cudaDriverVersion", version("12.4.0")),
        ("cudaComputeCapability", version("9.0.0")),
        ("resource.kubernetes.io/pciBusID", text("0000:18:00.0")),
        ("resource.kubernetes.io/pcieRoot", text("pci0000:10")),
    ] {
        d.add_attribute(name, value).unwrap();
    }
    d.add_capacity("memory", q(memory)).unwrap();
    d
}

/// A MIG device as NVIDIA's driver publishes it.
pub(super) fn mig(profile: &str, memory: &str) -> CelDevice {
    let mut d = CelDevice::new(DRIVER);
    for (name, value) in [
        ("type", text("mig")),
        ("uuid", text("MIG-5c1f0b8e-7a2d-5e3f-8b9c-1d2e3f4a5b6c")),
        (
            "parentUUID",
            text("GPU-3f2a9a1c-8d4e-4b6a-9f43-0c1d2e3f4a5b"),
        ),
        ("profile", text(profile)),
        ("productName", text("NVIDIA H100 NVL")),
        ("brand", text("Nvidia")),
        ("architecture", text("Hopper")),
        ("index", AttrValue::Int(0)),
        ("driverVersion", version("550.54.15")),
        ("cudaDriverVersion", version("12.4.0")),
        ("cudaComputeCapability", version("9.0.0")),
    ] {
        d.add_attribute(name, value).unwrap();
    }
    for (name, value) in [
        ("memory", memory),
        ("multiprocessors", "16"),
        ("copyEngines", "1"),
        ("decoders", "1"),
        ("encoders", "0"),
        ("jpegEngines", "1"),
        ("ofaEngines", "0"),
    ] {
        d.add_capacity(name, q(value)).unwrap();
    }
    d
}

pub(super) fn h100() -> CelDevice {
    gpu("NVIDIA H100 80GB HBM3", "81559Mi", "550.54.15")
}

pub(super) fn a100() -> CelDevice {
    gpu("NVIDIA A100-SXM4-40GB", "40Gi", "535.161.8")
}

/// Compiles and evaluates `expression` against `device`.
pub(super) fn eval(
    compiler: &Compiler,
    device: &CelDevice,
    expression: &str,
) -> Result<bool, EvalError> {
    let selector = compiler
        .compile(expression)
        .unwrap_or_else(|e| panic!("{expression}: {e}"));
    compiler.evaluator(device).matches(&selector)
}

/// Evaluates `expression` against an H100, expecting a bool.
pub(super) fn check(compiler: &Compiler, expression: &str) -> bool {
    eval(compiler, &h100(), expression).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// Compiles with the static estimate switched off, to exercise the runtime
/// meter.
pub(super) fn runtime_only(runtime_cost_limit: u64) -> Compiler {
    Compiler::with_limits(Limits {
        estimated_cost_limit: u64::MAX,
        runtime_cost_limit,
        ..Limits::default()
    })
}
