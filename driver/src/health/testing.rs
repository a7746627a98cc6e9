//! Test helpers shared by the health modules' unit tests: the fake clock
//! and the events NVML would deliver.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpu_nvml::health::{EventKind, HealthEvent};

/// `secs` seconds after the tests' fixed epoch.
pub fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_795_953_785 + secs)
}

/// XID `xid` on GPU `gpu` at `at`, on GPU instance `gi` (compute instance
/// 0) when given.
pub fn xid_at(gpu: u32, xid: u64, gi: Option<u32>, at: SystemTime) -> HealthEvent {
    HealthEvent {
        gpu_index: gpu,
        kind: EventKind::Xid(xid),
        gpu_instance_id: gi,
        compute_instance_id: gi.map(|_| 0),
        at,
    }
}

/// A GPU-wide event `kind` on GPU `gpu` at `at`.
pub fn event_at(gpu: u32, kind: EventKind, at: SystemTime) -> HealthEvent {
    HealthEvent {
        gpu_index: gpu,
        kind,
        gpu_instance_id: None,
        compute_instance_id: None,
        at,
    }
}
