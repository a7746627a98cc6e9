//! The GPU health monitor (issue #43): what NVML reports about each GPU,
//! turned into device taints, KEP-4680 health and a small checkpoint.
//!
//! - [`classify`]: the policy (flags) and what one XID, event or poll means;
//! - [`tracker`]: the per-GPU conditions over time (sticky, expiring,
//!   recovered), pure and clock-injected;
//! - [`taints`]: the conditions as device taints and device health, for every
//!   device that sits on a GPU;
//! - [`store`]: the checkpoint of active conditions (per GPU UUID and boot id);
//! - [`monitor`]: the runtime: event threads, polls, the heartbeat, and the
//!   results sent to the publisher, the health stream, the checkpoint;
//! - [`flags`]: `--health`, `--health-poll-interval` and the policy flags;
//! - [`metrics`]: the `gpu_health_*` Prometheus metrics;
//! - [`events`]: Node Events at transitions;
//! - [`binding`]: which driver holds each GPU (`--passthrough`: a GPU on
//!   `vfio-pci` is not probed).

pub mod binding;
pub mod classify;
pub mod events;
pub mod flags;
pub mod metrics;
pub mod monitor;
pub mod store;
pub mod taints;
pub mod tracker;

#[cfg(test)]
mod testing;

/// The health checkpoint's file name in the plugin's state directory.
pub const CHECKPOINT_FILE: &str = "health.json";
