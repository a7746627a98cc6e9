//! The GPU DRA kubelet plugin as a library: the binary in `main.rs` only
//! parses flags and calls `run`-style entry points from these modules, so
//! the demo and the tests can run the very same code in-process.
//!
//! Module ownership (one job each):
//! - [`flags`]: the command line, one flattened group per module;
//! - [`grpc`]: registration, DRAPlugin v1/v1beta1 and health services, sockets;
//! - [`discovery`]: the node's GPUs through the NVML backend, plus sysfs topology;
//! - [`devices`]: the device model (GPUs, MIG devices, dynamic MIG placements);
//! - [`slices`]: building and publishing ResourceSlices;
//! - [`plugin`]: the whole plugin wired together (start, orderly shutdown);
//! - [`supervise`]: `--supervise`, the plugin as a restarted child process.

pub mod devices;
pub mod discovery;
pub mod flags;
pub mod grpc;
pub mod plugin;
pub mod prepare;
pub mod slices;
pub mod supervise;

/// Microseconds since `t`, for the timing fields (`..._us`) of log lines.
pub(crate) fn micros(t: std::time::Instant) -> u64 {
    u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)
}
