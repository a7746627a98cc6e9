//! Prometheus metrics of the GPU health monitor, registered without the
//! plugin's `gpu_kubelet_plugin_` prefix under the names of issue #43:
//! `gpu_health_state{device,uuid,state}`, `gpu_xid_events_total{uuid,xid}`,
//! `gpu_recovery_action{uuid}`, `gpu_health_taint{device,key,effect}`,
//! `gpu_health_monitor_last_success_timestamp` and
//! `gpu_health_publish_failures_total`.
//!
//! The per-device families are rebuilt as a whole on every change of the
//! monitor's view ([`HealthMetrics::set_devices`]), so a device that
//! recovered loses its old series instead of keeping a stale 1.
//!
//! `gpu_xid_events_total` keeps at most [`MAX_XID_LABELS_PER_GPU`] XID
//! numbers of one GPU under their own label; events of further numbers
//! (a driver gone wrong) count under `xid="other"`, so the total stays
//! right and the series stay bounded.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `gpu_health_state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Device name in the pool.
    pub device: String,
    /// UUID of the physical GPU it sits on.
    pub uuid: String,
    /// `Healthy`, `Unhealthy` or `Unknown`.
    pub state: String,
}

/// Most XID numbers of one GPU counted under their own label.
pub const MAX_XID_LABELS_PER_GPU: usize = 256;

/// The `xid` label of events past [`MAX_XID_LABELS_PER_GPU`] numbers.
pub const OTHER_XID: &str = "other";

/// Labels of `gpu_xid_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XidLabels {
    /// GPU UUID.
    pub uuid: String,
    /// The XID number, or [`OTHER_XID`].
    pub xid: String,
}

/// Labels of `gpu_recovery_action`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    /// GPU UUID.
    pub uuid: String,
}

/// Labels of `gpu_health_taint`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaintLabels {
    /// Device name in the pool.
    pub device: String,
    /// Taint key.
    pub key: String,
    /// `None`, `NoSchedule` or `NoExecute`.
    pub effect: String,
}

/// One device as the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceView {
    /// Device name.
    pub device: String,
    /// UUID of its physical GPU.
    pub uuid: String,
    /// Its KEP-4680 health (`Healthy`, `Unhealthy`, `Unknown`).
    pub state: String,
    /// Its taints as (key, effect).
    pub taints: Vec<(String, String)>,
}

/// The health monitor's metrics. Cloning shares them; the default is a set
/// registered nowhere (for tests and callers without an endpoint).
#[derive(Clone, Debug, Default)]
pub struct HealthMetrics {
    state: Family<StateLabels, Gauge>,
    xids: Family<XidLabels, Counter>,
    /// The XID numbers with a label of their own, per GPU UUID.
    xid_numbers: Arc<Mutex<HashMap<String, BTreeSet<u64>>>>,
    recovery: Family<GpuLabels, Gauge>,
    taints: Family<TaintLabels, Gauge>,
    last_success: Gauge<f64, AtomicU64>,
    publish_failures: Counter,
}

impl HealthMetrics {
    /// Creates the metrics and registers them in `registry` (the root
    /// registry: the names carry no prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "gpu_health_state",
            "1 for each device's current health (Healthy, Unhealthy, Unknown)",
            m.state.clone(),
        );
        registry.register(
            "gpu_xid_events",
            "XID events NVML delivered, by GPU UUID and XID",
            m.xids.clone(),
        );
        registry.register(
            "gpu_recovery_action",
            "NVML's recovery action of each GPU at the last poll (0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P, 4 DRAIN_AND_RESET; -1 unknown)",
            m.recovery.clone(),
        );
        registry.register(
            "gpu_health_taint",
            "1 for each health taint on a published device, by device, key and effect",
            m.taints.clone(),
        );
        registry.register(
            "gpu_health_monitor_last_success_timestamp",
            "Unix time of the health monitor's last poll that reached NVML",
            m.last_success.clone(),
        );
        registry.register(
            "gpu_health_publish_failures",
            "ResourceSlice publications that failed (retried with backoff)",
            m.publish_failures.clone(),
        );
        m
    }

    /// Replaces the per-device state and taint series with `devices`.
    pub fn set_devices(&self, devices: &[DeviceView]) {
        self.state.clear();
        self.taints.clear();
        for d in devices {
            self.state
                .get_or_create(&StateLabels {
                    device: d.device.clone(),
                    uuid: d.uuid.clone(),
                    state: d.state.clone(),
                })
                .set(1);
            for (key, effect) in &d.taints {
                self.taints
                    .get_or_create(&TaintLabels {
                        device: d.device.clone(),
                        key: key.clone(),
                        effect: effect.clone(),
                    })
                    .set(1);
            }
        }
    }

    /// Counts one XID event of GPU `uuid`.
    pub fn xid(&self, uuid: &str, xid: u64) {
        let own_label = {
            let mut numbers = self
                .xid_numbers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let seen = numbers.entry(uuid.to_owned()).or_default();
            seen.contains(&xid) || (seen.len() < MAX_XID_LABELS_PER_GPU && seen.insert(xid))
        };
        let label = if own_label {
            xid.to_string()
        } else {
            OTHER_XID.to_owned()
        };
        self.xids
            .get_or_create(&XidLabels {
                uuid: uuid.to_owned(),
                xid: label,
            })
            .inc();
    }

    /// Records GPU `uuid`'s recovery action (`None`: unknown, -1).
    pub fn recovery_action(&self, uuid: &str, raw: Option<u32>) {
        self.recovery
            .get_or_create(&GpuLabels {
                uuid: uuid.to_owned(),
            })
            .set(raw.map_or(-1, i64::from));
    }

    /// Records a poll that reached NVML at `at`.
    pub fn success(&self, at: SystemTime) {
        let secs = at
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_success.set(secs);
    }

    /// Counts `n` failed publications.
    pub fn publish_failures(&self, n: u64) {
        self.publish_failures.inc_by(n);
    }

    /// The count of one GPU's `xid` label (an XID number or
    /// [`OTHER_XID`]); 0 for a series not there (tests, diagnostics).
    pub fn xid_count(&self, uuid: &str, xid: &str) -> u64 {
        self.xids
            .get(&XidLabels {
                uuid: uuid.to_owned(),
                xid: xid.to_owned(),
            })
            .map_or(0, |c| c.get())
    }
}

/// NVML's number of a recovery action.
pub fn recovery_raw(action: gpu_nvml::RecoveryAction) -> u32 {
    use gpu_nvml::RecoveryAction as A;
    match action {
        A::None => 0,
        A::GpuReset => 1,
        A::NodeReboot => 2,
        A::DrainP2p => 3,
        A::DrainAndReset => 4,
        A::Other(n) => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn xid_numbers_past_the_cap_count_under_other() {
        let m = HealthMetrics::default();
        for xid in 0..MAX_XID_LABELS_PER_GPU as u64 + 10 {
            m.xid("GPU-a", xid);
        }
        // A number with its own label keeps it; a new one goes to "other".
        m.xid("GPU-a", 0);
        m.xid("GPU-a", u64::MAX);
        assert_eq!(m.xid_count("GPU-a", "0"), 2);
        assert_eq!(
            m.xid_count("GPU-a", &(MAX_XID_LABELS_PER_GPU - 1).to_string()),
            1
        );
        assert_eq!(m.xid_count("GPU-a", &MAX_XID_LABELS_PER_GPU.to_string()), 0);
        assert_eq!(m.xid_count("GPU-a", OTHER_XID), 11);
        // Each GPU has its own numbers.
        m.xid("GPU-b", 9999);
        assert_eq!(m.xid_count("GPU-b", "9999"), 1);
        assert_eq!(m.xid_count("GPU-b", OTHER_XID), 0);
    }

    #[test]
    fn metrics_carry_the_issue_names_and_drop_recovered_series() {
        let mut registry = Registry::default();
        let m = HealthMetrics::register(&mut registry);
        m.set_devices(&[DeviceView {
            device: "gpu-0".into(),
            uuid: "GPU-a".into(),
            state: "Unhealthy".into(),
            taints: vec![("gpu.nvidia.com/gpu-lost".into(), "NoSchedule".into())],
        }]);
        m.xid("GPU-a", 79);
        m.xid("GPU-a", 79);
        m.recovery_action(
            "GPU-a",
            Some(recovery_raw(gpu_nvml::RecoveryAction::NodeReboot)),
        );
        m.success(UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000));
        m.publish_failures(3);
        let text = encode(&registry);
        for needle in [
            r#"gpu_health_state{device="gpu-0",uuid="GPU-a",state="Unhealthy"} 1"#,
            r#"gpu_xid_events_total{uuid="GPU-a",xid="79"} 2"#,
            r#"gpu_recovery_action{uuid="GPU-a"} 2"#,
            r#"gpu_health_taint{device="gpu-0",key="gpu.nvidia.com/gpu-lost",effect="NoSchedule"} 1"#,
            "gpu_health_monitor_last_success_timestamp 1800000000",
            "gpu_health_publish_failures_total 3",
        ] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
        assert_eq!(m.xid_count("GPU-a", "79"), 2);
        // Recovered: the old series go.
        m.set_devices(&[DeviceView {
            device: "gpu-0".into(),
            uuid: "GPU-a".into(),
            state: "Healthy".into(),
            taints: Vec::new(),
        }]);
        m.recovery_action("GPU-a", None);
        let text = encode(&registry);
        assert!(!text.contains(r#"state="Unhealthy""#), "{text}");
        assert!(!text.contains("gpu_health_taint{"), "{text}");
        assert!(
            text.contains(r#"gpu_recovery_action{uuid="GPU-a"} -1"#),
            "{text}"
        );
    }
}
