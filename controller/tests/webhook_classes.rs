//! The DeviceClass cache over the real kube client against the test API
//! server, and the webhook judging claims with it; an unreachable API
//! server leaves the webhook serving.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Harness, eventually, nvidia_classes, review};
use gpu_dra_analysis::validate::ClassLookup as _;
use gpu_dra_controller::classes::ClusterClasses;
use gpu_dra_controller::webhook::WebhookConfig;
use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

async fn client_for(kubeconfig_yaml: &str, dir: &Path) -> kube::Client {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kubeconfig_yaml).unwrap();
    gpu_dra_controller::client::connect(Some(&path))
        .await
        .unwrap()
        .unwrap()
}

/// A claim asking for a MIG device with a full-GPU config: only wrong if
/// the webhook knows that `mig.nvidia.com` selects MIG devices.
fn gpu_config_on_a_mig_claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mig-claim", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}],
            "config": [{
                "requests": ["mig"],
                "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing"}
                }}
            }]
        }}
    })
}

/// A claim whose config for our driver does not decode: wrong whatever the
/// classes are.
fn misspelled_config_claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "typo-claim", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
            "config": [{
                "requests": ["gpu"],
                "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharng": {"strategy": "TimeSlicing"}
                }}
            }]
        }}
    })
}

#[tokio::test]
async fn claims_are_judged_with_the_classes_of_the_cluster() {
    let server = TestApiServer::start(ServerOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = client_for(&server.kubeconfig_yaml(), dir.path()).await;
    let api: Api<DeviceClass> = Api::all(client.clone());
    let mut classes_json = nvidia_classes();
    let mig = classes_json.pop().unwrap();
    let gpu = classes_json.pop().unwrap();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(gpu).unwrap(),
    )
    .await
    .unwrap();

    let (classes, _watch) = ClusterClasses::start(client);
    tokio::time::timeout(Duration::from_secs(20), classes.wait_synced())
        .await
        .expect("the DeviceClass list never arrived");
    assert!(classes.is_synced());
    assert_eq!(classes.len(), 1);
    let class = classes.device_class("gpu.nvidia.com").unwrap();
    assert_eq!(class["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(class["kind"], "DeviceClass");
    assert!(
        class["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap()
            .contains("'gpu'")
    );
    assert!(classes.device_class("mig.nvidia.com").is_none());

    let h = Harness::start_with(Arc::new(classes.clone()), WebhookConfig::default()).await;
    // Class unknown yet: no class-based check, the claim passes.
    let before = h
        .client
        .validate(&review("CREATE", &gpu_config_on_a_mig_claim()))
        .await
        .response();
    assert_eq!(before["allowed"], true, "{before}");

    // The class appears in the cluster; the watch brings it in.
    api.create(
        &PostParams::default(),
        &serde_json::from_value(mig).unwrap(),
    )
    .await
    .unwrap();
    let arrived = eventually(Duration::from_secs(20), || async {
        classes.device_class("mig.nvidia.com")
    })
    .await;
    assert!(arrived.is_some(), "the new class never reached the cache");
    let after = h
        .client
        .validate(&review("CREATE", &gpu_config_on_a_mig_claim()))
        .await
        .response();
    assert_eq!(after["allowed"], false, "{after}");
    let message = after["status"]["message"].as_str().unwrap();
    assert!(message.contains("spec.devices.config[0]"), "{message}");
}

#[tokio::test]
async fn an_unreachable_api_server_leaves_the_webhook_serving() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let client = client_for(
        &gpu_dra_sim::apiserver::kubeconfig_yaml(&format!("http://127.0.0.1:{port}")),
        dir.path(),
    )
    .await;
    let (classes, _watch) = ClusterClasses::start(client);
    let h = Harness::start_with(Arc::new(classes.clone()), WebhookConfig::default()).await;
    assert!(!classes.is_synced());
    assert!(classes.is_empty());

    // No class information: the class-dependent check is skipped...
    let lenient = h
        .client
        .validate(&review("CREATE", &gpu_config_on_a_mig_claim()))
        .await
        .response();
    assert_eq!(lenient["allowed"], true, "{lenient}");
    // ...but configs for our driver are still validated.
    let denied = h
        .client
        .validate(&review("CREATE", &misspelled_config_claim()))
        .await
        .response();
    assert_eq!(denied["allowed"], false, "{denied}");
    assert!(
        denied["status"]["message"]
            .as_str()
            .unwrap()
            .contains("sharng")
    );
}
