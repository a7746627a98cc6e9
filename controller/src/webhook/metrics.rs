//! Prometheus metrics of the webhook: reviews by kind and result, review
//! latency by kind, and certificate reloads by result. Registered under the
//! `webhook` prefix of the controller's registry, e.g.
//! `gpu_dra_controller_webhook_reviews_total{kind="ResourceClaim",result="denied"}`.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::SharedRegistry;

/// The kind of object a review was about. Only known kinds get their own
/// value, so a client cannot blow up the label set.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Kind {
    /// `resource.k8s.io` DeviceClass.
    DeviceClass,
    /// `resource.k8s.io` ResourceClaim.
    ResourceClaim,
    /// `resource.k8s.io` ResourceClaimTemplate.
    ResourceClaimTemplate,
    /// Any other kind (admitted untouched).
    Other,
    /// The request could not be read far enough to know.
    Unknown,
}

impl Kind {
    /// The label for a `resource.k8s.io` kind named `kind` in `group`.
    pub fn of(group: &str, kind: &str) -> Kind {
        match (group, kind) {
            ("resource.k8s.io", "DeviceClass") => Kind::DeviceClass,
            ("resource.k8s.io", "ResourceClaim") => Kind::ResourceClaim,
            ("resource.k8s.io", "ResourceClaimTemplate") => Kind::ResourceClaimTemplate,
            _ => Kind::Other,
        }
    }
}

/// How a review ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Ours, valid, no warnings.
    allowed,
    /// Ours, valid, with warnings.
    warned,
    /// Ours and invalid: denied.
    denied,
    /// Not about this driver: admitted untouched.
    not_ours,
    /// Nothing to judge (DELETE, CONNECT, a subresource, an UPDATE that left
    /// the spec alone): admitted.
    skipped,
    /// Malformed or wrong-typed AdmissionReview: HTTP 400.
    bad_request,
    /// Body over the limit: HTTP 413.
    too_large,
    /// The review could not be judged (an internal failure): HTTP 500.
    internal_error,
}

/// Labels of `reviews`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    /// What the object was.
    pub kind: Kind,
    /// How the review ended.
    pub result: Outcome,
}

/// Labels of `review_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// What the object was.
    pub kind: Kind,
}

/// Result of a certificate reload.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    /// The new certificate and key are being served.
    success,
    /// The new files were unusable; the previous certificate stays.
    error,
}

/// Labels of `tls_reloads`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// The result.
    pub result: ReloadResult,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~0.8 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 15,
    ))
}

/// The webhook's metrics (cheap to clone; clones share the values).
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    reviews: Family<ReviewLabels, Counter>,
    duration: Family<KindLabels, Histogram, fn() -> Histogram>,
    tls_reloads: Family<ReloadLabels, Counter>,
}

impl WebhookMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &SharedRegistry) -> Self {
        let metrics = WebhookMetrics {
            reviews: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            tls_reloads: Family::default(),
        };
        // Both reload series exist from the start, at 0.
        for result in [ReloadResult::success, ReloadResult::error] {
            let _ = metrics.tls_reloads.get_or_create(&ReloadLabels { result });
        }
        registry.register(|r| {
            let r = r.sub_registry_with_prefix("webhook");
            r.register(
                "reviews",
                "Admission reviews by object kind and result",
                metrics.reviews.clone(),
            );
            r.register(
                "review_duration_seconds",
                "Time from the request's arrival to the answer, by object kind",
                metrics.duration.clone(),
            );
            r.register(
                "tls_reloads",
                "Reloads of the webhook certificate after its files changed, by result",
                metrics.tls_reloads.clone(),
            );
        });
        metrics
    }

    /// Counts one review.
    pub fn review(&self, kind: Kind, result: Outcome, seconds: f64) {
        self.reviews
            .get_or_create(&ReviewLabels { kind, result })
            .inc();
        self.duration
            .get_or_create(&KindLabels { kind })
            .observe(seconds);
    }

    /// Counts one certificate reload.
    pub fn tls_reload(&self, result: ReloadResult) {
        self.tls_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_appear_with_their_labels() {
        let registry = SharedRegistry::new();
        let m = WebhookMetrics::register(&registry);
        m.review(Kind::ResourceClaim, Outcome::denied, 0.001);
        m.review(Kind::ResourceClaim, Outcome::denied, 0.002);
        m.tls_reload(ReloadResult::error);
        let text = registry.encode();
        assert!(
            text.contains(
                r#"gpu_dra_controller_webhook_reviews_total{kind="ResourceClaim",result="denied"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_dra_controller_webhook_tls_reloads_total{result="error"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpu_dra_controller_webhook_review_duration_seconds_count{kind="ResourceClaim"} 2"#
            ),
            "{text}"
        );
    }

    #[test]
    fn only_resource_kinds_get_their_own_label() {
        assert_eq!(
            Kind::of("resource.k8s.io", "DeviceClass"),
            Kind::DeviceClass
        );
        assert_eq!(Kind::of("", "DeviceClass"), Kind::Other);
        assert_eq!(Kind::of("resource.k8s.io", "ResourceSlice"), Kind::Other);
    }
}
