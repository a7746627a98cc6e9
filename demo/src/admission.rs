//! The admission webhook in the demo: every object the demo stores (the
//! shipped DeviceClasses, the example claims) is first judged by the
//! webhook's own review code ([`gpu_dra_controller::webhook::Reviewer`],
//! on the shared validation engine), from an AdmissionReview as the API
//! server would send it, so a denial carries the webhook's very message.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use gpu_dra_analysis::validate::{StaticClasses, Validator};
use gpu_dra_controller::webhook::Reviewer;
use serde_json::{Value, json};

/// The webhook's verdict on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Admitted (possibly with warnings).
    pub allowed: bool,
    /// HTTP code of a denial (422).
    pub code: Option<u64>,
    /// The denial's `status.message`.
    pub message: Option<String>,
    /// `response.warnings`.
    pub warnings: Vec<String>,
}

/// The webhook, knowing the DeviceClasses given.
pub struct Webhook {
    reviewer: Reviewer,
}

impl Webhook {
    /// A webhook for `driver` that resolves class names among `classes`.
    pub fn new(driver: &str, classes: Vec<Value>) -> Self {
        Self {
            reviewer: Reviewer::new(
                Validator::new(driver),
                Arc::new(StaticClasses::new(classes)),
            ),
        }
    }

    /// Judges a CREATE of `object` (a `resource.k8s.io/v1` object).
    pub fn review_create(&self, object: &Value) -> anyhow::Result<Admission> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let resource = match kind {
            "DeviceClass" => "deviceclasses",
            "ResourceClaim" => "resourceclaims",
            "ResourceClaimTemplate" => "resourceclaimtemplates",
            other => bail!("the demo does not send {other:?} objects to the webhook"),
        };
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let mut request = json!({
            "uid": review_uid(kind, name),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource},
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "gpu-dra-demo"},
            "object": object,
            "dryRun": false,
        });
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            request["namespace"] = Value::from(ns);
        }
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        });
        let body = serde_json::to_vec(&review)?;
        let verdict = self
            .reviewer
            .review_json(&body)
            .map_err(|e| anyhow::anyhow!("the webhook refused the review: {e}"))?;
        let answer = serde_json::to_value(&verdict.review).context("read the webhook's answer")?;
        let response = &answer["response"];
        let allowed = response["allowed"]
            .as_bool()
            .context("the webhook's answer has no response.allowed")?;
        let warnings = response["warnings"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let status = &response["status"];
        Ok(Admission {
            allowed,
            code: if allowed {
                None
            } else {
                status["code"].as_u64()
            },
            message: if allowed {
                None
            } else {
                status["message"].as_str().map(str::to_owned)
            },
            warnings,
        })
    }
}

/// A stable request UID for a review (the webhook echoes it back).
fn review_uid(kind: &str, name: &str) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (kind, name).hash(&mut h);
    let v = h.finish();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        v >> 32,
        (v >> 16) & 0xffff,
        v & 0xfff,
        (v >> 4) & 0xfff,
        v & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook() -> Webhook {
        Webhook::new("gpu.nvidia.com", crate::shipped::classes().unwrap())
    }

    fn claim(selector: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": selector}}]}}]}}
        })
    }

    #[test]
    fn a_good_claim_and_the_shipped_classes_are_admitted() {
        let hook = webhook();
        let verdict = hook
            .review_create(&claim("device.attributes['gpu.nvidia.com'].index == 0"))
            .unwrap();
        assert!(verdict.allowed, "{verdict:?}");
        assert_eq!(verdict.message, None);
        for class in crate::shipped::classes().unwrap() {
            let verdict = hook.review_create(&class).unwrap();
            assert!(verdict.allowed, "{class}: {verdict:?}");
        }
    }

    #[test]
    fn a_typo_is_denied_with_the_webhooks_message() {
        let verdict = webhook()
            .review_create(&claim(
                "device.attributes['gpu.nvidia.com'].productname == 'x'",
            ))
            .unwrap();
        assert!(!verdict.allowed);
        assert_eq!(verdict.code, Some(422));
        let message = verdict.message.unwrap();
        assert!(
            message.starts_with("ResourceClaim \"c\" is invalid for driver gpu.nvidia.com"),
            "{message}"
        );
        assert!(message.contains("productName"), "{message}");
    }

    #[test]
    fn objects_the_demo_never_sends_are_errors() {
        let err = webhook()
            .review_create(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}))
            .unwrap_err();
        assert!(err.to_string().contains("\"Pod\""), "{err}");
        let err = webhook().review_create(&json!(null)).unwrap_err();
        assert!(err.to_string().contains("does not send"), "{err}");
    }

    #[test]
    fn review_uids_are_uuid_shaped_and_distinct() {
        let a = review_uid("ResourceClaim", "a");
        let b = review_uid("ResourceClaim", "b");
        assert_ne!(a, b);
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(a.matches('-').count(), 4, "{a}");
    }
}
