//! Prometheus metrics of the kubelet-facing services: calls by service,
//! method and result, claims by operation and result, and whether kubelet
//! has accepted the registration; beside them NVIDIA's `nvidia_dra_*`
//! request metrics ([`nvidia`]).

pub mod nvidia;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which gRPC service answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Service {
    /// `pluginregistration.Registration`.
    registration,
    /// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    dra_v1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`.
    dra_v1beta1,
    /// `v1alpha1.DRAResourceHealth`.
    health_v1alpha1,
    /// `v1.DRAResourceHealth`.
    health_v1,
}

/// Which method was called.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Method {
    /// `GetInfo`.
    get_info,
    /// `NotifyRegistrationStatus`.
    notify_registration_status,
    /// `NodePrepareResources`.
    node_prepare_resources,
    /// `NodeUnprepareResources`.
    node_unprepare_resources,
    /// `NodeWatchResources`.
    node_watch_resources,
}

/// How a call or a claim ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Success.
    ok,
    /// A gRPC error status, or a per-claim error.
    error,
}

/// What was done to a claim.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Operation {
    /// NodePrepareResources.
    prepare,
    /// NodeUnprepareResources.
    unprepare,
}

/// Labels of `requests`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The service.
    pub service: Service,
    /// The method.
    pub method: Method,
    /// The result.
    pub result: Outcome,
}

/// Labels of `claims`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// The operation.
    pub operation: Operation,
    /// The per-claim result.
    pub result: Outcome,
}

/// The metrics of the gRPC layer. Cloning shares the underlying counters.
#[derive(Clone, Debug, Default)]
pub struct GrpcMetrics {
    requests: Family<RequestLabels, Counter>,
    claims: Family<ClaimLabels, Counter>,
    registered: Gauge,
    nvidia: nvidia::NvidiaMetrics,
}

impl GrpcMetrics {
    /// Creates the metrics and registers them in `registry` as
    /// `kubelet_requests`, `kubelet_claims` (both counters, so exposed with
    /// `_total`) and `kubelet_registered`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kubelet_requests",
            "gRPC calls from kubelet, by service, method and result",
            m.requests.clone(),
        );
        registry.register(
            "kubelet_claims",
            "Claims in NodePrepareResources/NodeUnprepareResources calls, by operation and per-claim result",
            m.claims.clone(),
        );
        registry.register(
            "kubelet_registered",
            "1 when kubelet accepted the plugin's registration, else 0",
            m.registered.clone(),
        );
        m
    }

    /// Our metrics under `prefix` in `root` (a registry without a prefix
    /// of its own), and NVIDIA's `nvidia_dra_*` ones for `driver` on
    /// `node` beside them.
    pub fn register_with_nvidia(
        root: &mut Registry,
        prefix: &str,
        driver: &str,
        node: &str,
    ) -> Self {
        let mut m = Self::register(root.sub_registry_with_prefix(prefix));
        m.nvidia = nvidia::NvidiaMetrics::new(driver, node);
        m.nvidia.register(root);
        m
    }

    /// NVIDIA's request metrics (unregistered unless made by
    /// [`Self::register_with_nvidia`]).
    #[must_use]
    pub fn nvidia(&self) -> &nvidia::NvidiaMetrics {
        &self.nvidia
    }

    /// Counts one call.
    pub fn request(&self, service: Service, method: Method, result: Outcome) {
        self.requests
            .get_or_create(&RequestLabels {
                service,
                method,
                result,
            })
            .inc();
    }

    /// Counts one claim.
    pub fn claim(&self, operation: Operation, result: Outcome) {
        self.claims
            .get_or_create(&ClaimLabels { operation, result })
            .inc();
    }

    /// Records kubelet's registration verdict.
    pub fn set_registered(&self, registered: bool) {
        self.registered.set(i64::from(registered));
    }

    /// The current count for one label set (for tests and diagnostics).
    pub fn request_count(&self, service: Service, method: Method, result: Outcome) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                service,
                method,
                result,
            })
            .get()
    }

    /// The current claim count for one label set.
    pub fn claim_count(&self, operation: Operation, result: Outcome) -> u64 {
        self.claims
            .get_or_create(&ClaimLabels { operation, result })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_exposed_in_text_format() {
        let mut registry = Registry::with_prefix("gpu_kubelet_plugin");
        let m = GrpcMetrics::register(&mut registry);
        m.request(Service::dra_v1, Method::node_prepare_resources, Outcome::ok);
        m.request(Service::dra_v1, Method::node_prepare_resources, Outcome::ok);
        m.claim(Operation::unprepare, Outcome::error);
        m.set_registered(true);
        assert_eq!(
            m.request_count(Service::dra_v1, Method::node_prepare_resources, Outcome::ok),
            2
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"gpu_kubelet_plugin_kubelet_requests_total{service="dra_v1",method="node_prepare_resources",result="ok"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpu_kubelet_plugin_kubelet_claims_total{operation="unprepare",result="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("gpu_kubelet_plugin_kubelet_registered 1"),
            "{text}"
        );
    }
}
