//! The webhook manifests under `deployments/webhook/` are valid Kubernetes
//! objects and agree with the server: path, port, resources, versions.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn manifest(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deployments/webhook")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_webhook_configuration_covers_our_kinds_in_every_version() {
    let config: ValidatingWebhookConfiguration =
        yaml_serde::from_str(&manifest("validating-webhook-configuration.yaml")).unwrap();
    let webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), 1);
    let hook = &webhooks[0];
    assert_eq!(hook.admission_review_versions, vec!["v1"]);
    assert_eq!(hook.side_effects, "None");
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert!(hook.timeout_seconds.is_some_and(|t| (1..=5).contains(&t)));
    let service = hook.client_config.service.as_ref().unwrap();
    assert_eq!(service.path.as_deref(), Some("/validate"));

    let rules = hook.rules.as_ref().unwrap();
    let mut covered = Vec::new();
    for rule in rules {
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["resource.k8s.io".to_owned()][..])
        );
        let ops = rule.operations.clone().unwrap();
        assert!(!ops.iter().any(|o| o == "DELETE" || o == "*"), "{ops:?}");
        for v in rule.api_versions.as_ref().unwrap() {
            for r in rule.resources.as_ref().unwrap() {
                for o in &ops {
                    covered.push(format!("{v}/{r}/{o}"));
                }
            }
        }
    }
    for v in ["v1", "v1beta1", "v1beta2"] {
        for r in ["deviceclasses", "resourceclaims", "resourceclaimtemplates"] {
            for o in ["CREATE", "UPDATE"] {
                assert!(covered.contains(&format!("{v}/{r}/{o}")), "{v}/{r}/{o}");
            }
        }
    }
    // Subresources (status) are not sent.
    assert!(covered.iter().all(|c| !c.contains("/status")));
    let conditions = hook.match_conditions.as_ref().unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.expression.contains("oldObject.spec"))
    );
}

#[test]
fn the_service_targets_the_default_webhook_port_in_the_same_namespace() {
    let svc: Service = yaml_serde::from_str(&manifest("service.yaml")).unwrap();
    let config: ValidatingWebhookConfiguration =
        yaml_serde::from_str(&manifest("validating-webhook-configuration.yaml")).unwrap();
    let reference = config.webhooks.unwrap()[0]
        .client_config
        .service
        .clone()
        .unwrap();
    assert_eq!(Some(reference.name), svc.metadata.name);
    assert_eq!(Some(reference.namespace), svc.metadata.namespace);
    let ports = svc.spec.unwrap().ports.unwrap();
    let port = ports
        .iter()
        .find(|p| Some(p.port) == reference.port)
        .unwrap();
    let default_port = gpu_dra_controller::webhook::WebhookConfig::default()
        .addr
        .port();
    assert_eq!(
        port.target_port,
        Some(IntOrString::Int(i32::from(default_port)))
    );
}
