//! What the webhook decides, over real HTTPS with real AdmissionReview JSON:
//! NVIDIA's own objects pass, broken ones of ours are denied with every
//! error listed, suspicious ones pass with warnings, and objects of other
//! drivers pass untouched whatever they contain.

mod common;

use common::{Harness, metric, nvidia_example_template, review, review_with_old};
use serde_json::{Value, json};

fn class(name: &str, expressions: &[&str]) -> Value {
    let selectors: Vec<Value> = expressions
        .iter()
        .map(|e| json!({"cel": {"expression": e}}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": selectors}
    })
}

fn assert_allowed_clean(response: &Value) {
    assert_eq!(response["allowed"], true, "{response:#}");
    assert!(response.get("warnings").is_none(), "{response:#}");
}

#[tokio::test]
async fn nvidia_classes_and_example_template_are_allowed_without_warnings() {
    let h = Harness::start().await;
    let mut objects = common::nvidia_classes();
    objects.push(nvidia_example_template());
    let mut conn = h.client.connect().await;
    for object in objects {
        let response = conn.validate(&review("CREATE", &object)).await.response();
        assert_allowed_clean(&response);
    }
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="DeviceClass",result="allowed"}"#
        ),
        Some(3.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="ResourceClaimTemplate",result="allowed"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_broken_class_is_denied_with_every_error_path_and_hint() {
    let h = Harness::start().await;
    let broken = class(
        "broken.nvidia.com",
        &[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname == 'x'",
            "device.driver == 'gpu.nvidia.com' && (",
            "device.driver == 'gpu.nvidia.com' && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40GB')) > 0",
        ],
    );
    let sent = review("CREATE", &broken);
    let response = h.client.validate(&sent).await.response();
    assert_eq!(response["uid"], sent["request"]["uid"]);
    assert_eq!(response["allowed"], false);
    let status = &response["status"];
    assert_eq!(status["code"], 422);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["status"], "Failure");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "DeviceClass \"broken.nvidia.com\" is invalid for driver gpu.nvidia.com (3 errors):"
        ),
        "{message}"
    );
    for (i, needle) in ["productName", "syntax error", "40Gi"].iter().enumerate() {
        assert!(
            message.contains(&format!("\n- spec.selectors[{i}].cel.expression: ")),
            "{message}"
        );
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // The corrected expression is offered.
    assert!(
        message.contains(
            "hint: device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'x'"
        ),
        "{message}"
    );
    let causes = status["details"]["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 3);
    assert_eq!(causes[2]["field"], "spec.selectors[2].cel.expression");
    assert_eq!(causes[0]["reason"], "FieldValueInvalid");
    assert_eq!(status["details"]["kind"], "DeviceClass");
    assert_eq!(status["details"]["name"], "broken.nvidia.com");
}

#[tokio::test]
async fn dry_run_requests_are_judged_the_same() {
    let h = Harness::start().await;
    let broken = class(
        "broken.nvidia.com",
        &[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname == 'x'",
        ],
    );
    let mut sent = review("CREATE", &broken);
    sent["request"]["dryRun"] = json!(true);
    let response = h.client.validate(&sent).await.response();
    assert_eq!(response["allowed"], false);
}

#[tokio::test]
async fn suspicious_but_legal_selectors_are_allowed_with_one_line_warnings() {
    let h = Harness::start().await;
    let suspicious = class(
        "newer-drivers.nvidia.com",
        &[
            // Unguarded read of an attribute only some devices carry.
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'",
            // Cannot match any device of ours.
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        ],
    );
    let response = h
        .client
        .validate(&review("CREATE", &suspicious))
        .await
        .response();
    assert_eq!(response["allowed"], true, "{response:#}");
    let warnings: Vec<&str> = response["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    // The first selector's read: conditional on GPUs and MIG devices,
    // missing on VFIO passthrough GPUs (`--passthrough`).
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    assert!(warnings[0].starts_with("spec.selectors[0].cel.expression: "));
    assert!(warnings[0].contains("addressingMode"));
    assert!(
        warnings[1].starts_with("spec.selectors[0].cel.expression: ")
            && warnings[1].contains("`addressingMode` is not published on VFIO passthrough GPUs")
    );
    assert!(warnings[2].starts_with("spec.selectors[1].cel.expression: "));
    for w in &warnings {
        assert!(w.chars().count() <= 256, "{w}");
        assert!(!w.chars().any(char::is_control), "{w:?}");
    }
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="DeviceClass",result="warned"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn claims_with_bad_configs_are_denied_and_templates_too() {
    let h = Harness::start().await;
    let mut template = nvidia_example_template();
    template["spec"]["spec"]["devices"]["config"][1]["opaque"]["parameters"]["sharing"]["mpsConfig"]
        ["defaultActiveThreadPercentage"] = json!(250);
    let response = h
        .client
        .validate(&review("CREATE", &template))
        .await
        .response();
    assert_eq!(response["allowed"], false, "{response:#}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.spec.devices.config[1].opaque.parameters"),
        "{message}"
    );

    // The same devices as a plain claim in v1beta1 shape (no `exactly`).
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
        "metadata": {"name": "old-shape", "namespace": "team-a"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}}}}]
        }}
    });
    let sent = review("CREATE", &claim);
    assert_eq!(sent["request"]["kind"]["version"], "v1beta1");
    let response = h.client.validate(&sent).await.response();
    assert_eq!(response["allowed"], false, "{response:#}");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("Forever")
    );
    let mut fixed = claim.clone();
    fixed["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["timeSlicingConfig"]
        ["interval"] = json!("Short");
    assert_allowed_clean(
        &h.client
            .validate(&review("CREATE", &fixed))
            .await
            .response(),
    );
}

#[tokio::test]
async fn objects_of_other_drivers_pass_untouched_whatever_they_contain() {
    let h = Harness::start().await;
    let broken_other_class = class(
        "fpga.example.com",
        &["device.driver == 'fpga.example.com' && device.attributes['fpga.example.com'].x == ("],
    );
    let other_claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "fpga", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "f", "exactly": {"deviceClassName": "fpga.example.com",
                "selectors": [{"cel": {"expression": "device.attributes['fpga.example.com'].lanes >"}}]}}],
            "config": [{"opaque": {"driver": "fpga.example.com", "parameters": {"anything": [1, "two"]}}}]
        }}
    });
    let other_template = json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fpga", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "f", "exactly": {
            "deviceClassName": "fpga.example.com"}}]}}}
    });
    for object in [broken_other_class, other_claim, other_template] {
        for op in ["CREATE", "UPDATE"] {
            let sent = if op == "UPDATE" {
                let mut old = object.clone();
                old["spec"] = json!({});
                review_with_old(op, Some(&object), Some(&old))
            } else {
                review(op, &object)
            };
            let response = h.client.validate(&sent).await.response();
            assert_allowed_clean(&response);
            assert_eq!(response["uid"], sent["request"]["uid"]);
        }
    }
    let metrics = h.client.get("/metrics").await.text();
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_reviews_total{kind="ResourceClaim",result="not_ours"}"#
        ),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn updates_are_judged_only_when_the_spec_changes_and_deletes_never() {
    let h = Harness::start().await;
    let bad = class(
        "stored.nvidia.com",
        &[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productname == 'x'",
        ],
    );
    // A stored object that today's rules reject: metadata-only updates
    // (finalizer removal) and deletes pass.
    let mut relabelled = bad.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let response = h
        .client
        .validate(&review_with_old("UPDATE", Some(&relabelled), Some(&bad)))
        .await
        .response();
    assert_allowed_clean(&response);
    let response = h
        .client
        .validate(&review_with_old("DELETE", None, Some(&bad)))
        .await
        .response();
    assert_allowed_clean(&response);

    // Changing the spec to something still broken is denied.
    let mut still_bad = bad.clone();
    still_bad["spec"]["selectors"][0]["cel"]["expression"] = json!(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].typ == 'gpu'"
    );
    let response = h
        .client
        .validate(&review_with_old("UPDATE", Some(&still_bad), Some(&bad)))
        .await
        .response();
    assert_eq!(response["allowed"], false);
}

#[tokio::test]
async fn oversized_and_deeply_nested_selectors_get_a_clean_denial() {
    let h = Harness::start().await;
    let long = format!(
        "device.driver == 'gpu.nvidia.com' && {}",
        vec!["1 == 1"; 20_000].join(" && ")
    );
    let deep = format!(
        "device.driver == 'gpu.nvidia.com' && {}true{}",
        "(".repeat(2_000),
        ")".repeat(2_000)
    );
    let many: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].x{i} == 1"
            )
        })
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for (object, needle) in [
        (class("long.nvidia.com", &[&long]), "bytes"),
        (class("deep.nvidia.com", &[&deep]), "deep"),
        (class("many.nvidia.com", &many), "spec.selectors"),
    ] {
        let response = h
            .client
            .validate(&review("CREATE", &object))
            .await
            .response();
        assert_eq!(response["allowed"], false, "{needle}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{needle}: {message}");
        assert!(message.len() < 64 * 1024);
    }
    // And the server is still fine.
    assert_eq!(h.client.get("/healthz").await.text(), "ok\n");
}

/// The DRA objects of `docs/examples/consumable-shares.yaml`, as JSON.
fn consumable_shares_examples(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|doc| yaml_serde::from_str::<Value>(doc).unwrap())
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("resource.k8s.io/"))
        })
        .collect()
}

/// Claims for consumable shares (capacity requests on `memory` and
/// `shares`), an MPS config on a share and MPS `multiUser` are allowed
/// without warnings; `multiUser` of another type is denied at its path.
#[tokio::test]
async fn consumable_shares_and_mps_multi_user_examples_are_allowed() {
    let h = Harness::start().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/examples/consumable-shares.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let objects = consumable_shares_examples(&text);
    assert_eq!(objects.len(), 5);
    let mut conn = h.client.connect().await;
    for object in &objects {
        let response = conn.validate(&review("CREATE", object)).await.response();
        assert_allowed_clean(&response);
    }
    let bad = consumable_shares_examples(&text.replace("multiUser: true", "multiUser: \"yes\""));
    let denied = bad
        .iter()
        .find(|o| o["metadata"]["name"] == "mps-multi-user")
        .unwrap();
    let response = conn.validate(&review("CREATE", denied)).await.response();
    assert_eq!(response["allowed"], false, "{response:#}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "sharing.mpsConfig.multiUser: invalid type: string \"yes\", expected a boolean"
        ),
        "{message}"
    );
}

/// NVIDIA's VFIO passthrough claim (`docs/examples/vfio-passthrough.yaml`,
/// a `VfioDeviceConfig` on the `vfio.gpu.nvidia.com` class) is allowed
/// without warnings (NVIDIA's own webhook rejects it); a bad backend policy
/// and a VFIO config on full GPUs are denied at their paths.
#[tokio::test]
async fn nvidia_vfio_claims_are_allowed_and_bad_vfio_configs_denied() {
    let h = Harness::start().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/examples/vfio-passthrough.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let template: Value = yaml_serde::from_str(&text).unwrap();
    let mut conn = h.client.connect().await;
    assert_allowed_clean(&conn.validate(&review("CREATE", &template)).await.response());

    let mut bad = template.clone();
    bad["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["iommu"]["backendPolicy"] =
        json!("RequireIommuFD");
    let response = conn.validate(&review("CREATE", &bad)).await.response();
    assert_eq!(response["allowed"], false, "{response:#}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "spec.spec.devices.config[0].opaque.parameters.iommu.backendPolicy: unknown variant `RequireIommuFD`, expected `LegacyOnly` or `PreferIommuFD`"
        ),
        "{message}"
    );

    let mut on_gpus = template.clone();
    on_gpus["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] =
        json!("gpu.nvidia.com");
    let response = conn.validate(&review("CREATE", &on_gpus)).await.response();
    assert_eq!(response["allowed"], false, "{response:#}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("a VfioDeviceConfig cannot be applied to full GPUs"),
        "{message}"
    );
}
