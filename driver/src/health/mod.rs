//! The GPU health monitor (issue #43): what NVML reports about each GPU,
//! turned into device taints, KEP-4680 health and a small checkpoint.
//!
//! - [`classify`]: the policy (flags) and what one XID, event or poll means;
//! - [`tracker`]: the per-GPU conditions over time (sticky, expiring,
//!   recovered), pure and clock-injected;
//! - [`taints`]: the conditions as device taints and device health, for every
//!   device that sits on a GPU;
//! - [`store`]: the checkpoint of active conditions (per GPU UUID and boot id).

pub mod classify;
pub mod store;
pub mod taints;
pub mod tracker;
