//! The request metrics of NVIDIA's DRA driver under NVIDIA's names, labels
//! and meaning (`nvidia_dra_*`), beside ours, so that dashboards and alerts
//! written for NVIDIA's `gpu-kubelet-plugin` keep working unchanged.
//!
//! What each series means, as NVIDIA's plugin counts it (v0.5.0):
//! - `nvidia_dra_requests_total{driver,operation}`: claims prepared
//!   (`operation="prepare"`) or unprepared (`"unprepare"`) successfully;
//!   failures count only in the error counters.
//! - `nvidia_dra_request_duration_seconds{driver,operation}`: a histogram of
//!   those successful claims' durations (buckets 0.05 s to 12.8 s, each twice
//!   the last). Kubelet sends several claims in one call and the plugin
//!   answers them together, so each claim of a call observes the call's time.
//! - `nvidia_dra_requests_inflight{driver,operation}`: claims being prepared
//!   or unprepared now. NVIDIA's node-wide lock keeps it at 0 or 1; ours
//!   prepares claims on different GPUs at once, so it can be higher.
//! - `nvidia_dra_prepared_devices{node,driver,device_type}`: devices of the
//!   prepared claims by type (`gpu`, `mig`, `vfio`, `unknown`); a device
//!   shared by two claims counts twice, as in NVIDIA's checkpoint count.
//! - `nvidia_dra_node_prepare_errors_total{driver,error_type}` and
//!   `nvidia_dra_node_unprepare_errors_total{driver,error_type}`: claims that
//!   failed, `error_type="prepare_devices"` / `"unprepare_devices"` (NVIDIA's
//!   `lock_acquire` and `publish_resources` never occur here: there is no
//!   node-wide lock with a timeout, and preparing publishes nothing).
//!
//! The request series of both operations exist from the first scrape (at
//! zero), and the prepared-device gauge has all four types, as NVIDIA
//! pre-creates them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The prefix of every family (NVIDIA's metrics namespace).
pub const PREFIX: &str = "nvidia_dra";

/// NVIDIA's request operations.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Operation {
    /// A claim in NodePrepareResources.
    prepare,
    /// A claim in NodeUnprepareResources.
    unprepare,
}

/// NVIDIA's device types of `prepared_devices`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DeviceType {
    /// A full GPU (`gpu-<minor>`), shared or not.
    gpu,
    /// A MIG device (`gpu-<minor>-mig-...`), static or created at prepare.
    mig,
    /// A GPU passed through with VFIO (`gpu-vfio-<index>`).
    vfio,
    /// A device whose name follows none of those forms.
    unknown,
}

impl DeviceType {
    /// Every type, in NVIDIA's order.
    pub const ALL: [Self; 4] = [Self::gpu, Self::mig, Self::vfio, Self::unknown];

    /// The type of a device of this driver by its name (the names are
    /// NVIDIA's: `gpu-<minor>`, `gpu-<minor>-mig-<profile>-<gi>-<start>`,
    /// `gpu-vfio-<index>`).
    #[must_use]
    pub fn of_device(name: &str) -> Self {
        let Some(rest) = name.strip_prefix("gpu-") else {
            return Self::unknown;
        };
        if let Some(index) = rest.strip_prefix("vfio-") {
            return if is_number(index) {
                Self::vfio
            } else {
                Self::unknown
            };
        }
        match rest.split_once("-mig-") {
            Some((minor, profile)) if is_number(minor) && !profile.is_empty() => Self::mig,
            None if is_number(rest) => Self::gpu,
            Some(_) | None => Self::unknown,
        }
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// NVIDIA's error types that can occur here.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ErrorType {
    /// Preparing a claim's devices failed.
    prepare_devices,
    /// Unpreparing a claim's devices failed.
    unprepare_devices,
}

/// Labels `driver`, `operation`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The driver name.
    pub driver: String,
    /// The operation.
    pub operation: Operation,
}

/// Labels `node`, `driver`, `device_type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// The node name.
    pub node: String,
    /// The driver name.
    pub driver: String,
    /// The device type.
    pub device_type: DeviceType,
}

/// Labels `driver`, `error_type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The driver name.
    pub driver: String,
    /// What failed.
    pub error_type: ErrorType,
}

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 9))
}

/// The `nvidia_dra_*` families. Cloning shares them; the default has empty
/// driver and node names and is registered nowhere (tests, doubles).
#[derive(Clone, Debug)]
pub struct NvidiaMetrics {
    driver: Arc<str>,
    node: Arc<str>,
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    inflight: Family<RequestLabels, Gauge>,
    prepared: Family<DeviceLabels, Gauge>,
    prepare_errors: Family<ErrorLabels, Counter>,
    unprepare_errors: Family<ErrorLabels, Counter>,
    /// The device types of each prepared claim, by claim UID.
    claims: Arc<Mutex<HashMap<String, Vec<DeviceType>>>>,
}

impl Default for NvidiaMetrics {
    fn default() -> Self {
        Self::new("", "")
    }
}

impl NvidiaMetrics {
    /// The families for `driver` on `node`, registered nowhere yet.
    #[must_use]
    pub fn new(driver: &str, node: &str) -> Self {
        Self {
            driver: driver.into(),
            node: node.into(),
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            inflight: Family::default(),
            prepared: Family::default(),
            prepare_errors: Family::default(),
            unprepare_errors: Family::default(),
            claims: Arc::default(),
        }
    }

    /// Registers the families under [`PREFIX`] in `registry` (which must
    /// have no prefix of its own) and creates the series NVIDIA's plugin
    /// shows from its first scrape.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix(PREFIX);
        r.register(
            "requests",
            "Total number of DRA prepare and unprepare requests (claims done successfully)",
            self.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Duration of DRA prepare and unprepare requests",
            self.duration.clone(),
        );
        r.register(
            "requests_inflight",
            "Number of in-flight DRA prepare and unprepare requests",
            self.inflight.clone(),
        );
        r.register(
            "prepared_devices",
            "Current number of prepared devices by device type",
            self.prepared.clone(),
        );
        r.register(
            "node_prepare_errors",
            "Total number of failures during DRA node prepare for kubelet plugins",
            self.prepare_errors.clone(),
        );
        r.register(
            "node_unprepare_errors",
            "Total number of failures during DRA node unprepare for kubelet plugins",
            self.unprepare_errors.clone(),
        );
        for operation in [Operation::prepare, Operation::unprepare] {
            let labels = self.request_labels(operation);
            drop(self.requests.get_or_create(&labels));
            drop(self.duration.get_or_create(&labels));
            drop(self.inflight.get_or_create(&labels));
        }
        self.publish_prepared();
    }

    fn request_labels(&self, operation: Operation) -> RequestLabels {
        RequestLabels {
            driver: self.driver.to_string(),
            operation,
        }
    }

    /// Counts `claims` claims in flight until the guard is dropped (also
    /// when the call is cancelled).
    #[must_use]
    pub fn in_flight(&self, operation: Operation, claims: usize) -> InFlight {
        let gauge = self
            .inflight
            .get_or_create(&self.request_labels(operation))
            .clone();
        let claims = i64::try_from(claims).unwrap_or(i64::MAX);
        gauge.inc_by(claims);
        InFlight { gauge, claims }
    }

    /// Records a claim done successfully in `elapsed`.
    pub fn succeeded(&self, operation: Operation, elapsed: Duration) {
        let labels = self.request_labels(operation);
        self.requests.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Records a claim that failed.
    pub fn failed(&self, operation: Operation) {
        let (family, error_type) = match operation {
            Operation::prepare => (&self.prepare_errors, ErrorType::prepare_devices),
            Operation::unprepare => (&self.unprepare_errors, ErrorType::unprepare_devices),
        };
        family
            .get_or_create(&ErrorLabels {
                driver: self.driver.to_string(),
                error_type,
            })
            .inc();
    }

    /// Claim `uid` is prepared with the devices named `devices`.
    pub fn prepared<'a>(&self, uid: &str, devices: impl IntoIterator<Item = &'a str>) {
        let types = devices.into_iter().map(DeviceType::of_device).collect();
        self.lock_claims().insert(uid.to_owned(), types);
        self.publish_prepared();
    }

    /// Claim `uid` is no longer prepared.
    pub fn unprepared(&self, uid: &str) {
        if self.lock_claims().remove(uid).is_some() {
            self.publish_prepared();
        }
    }

    /// The prepared devices of type `t` (for tests and diagnostics).
    #[must_use]
    pub fn prepared_count(&self, t: DeviceType) -> i64 {
        self.prepared.get_or_create(&self.device_labels(t)).get()
    }

    fn device_labels(&self, device_type: DeviceType) -> DeviceLabels {
        DeviceLabels {
            node: self.node.to_string(),
            driver: self.driver.to_string(),
            device_type,
        }
    }

    fn lock_claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<DeviceType>>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets every type's gauge from the prepared claims (under their lock,
    /// so two updates cannot publish out of order).
    fn publish_prepared(&self) {
        let claims = self.lock_claims();
        let mut counts: HashMap<DeviceType, i64> = HashMap::new();
        for t in claims.values().flatten() {
            *counts.entry(*t).or_default() += 1;
        }
        for t in DeviceType::ALL {
            self.prepared
                .get_or_create(&self.device_labels(t))
                .set(counts.get(&t).copied().unwrap_or(0));
        }
    }
}

/// Claims in flight; dropping it takes them off the gauge.
#[derive(Debug)]
pub struct InFlight {
    gauge: Gauge,
    claims: i64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec_by(self.claims);
    }
}

#[cfg(test)]
mod tests;
