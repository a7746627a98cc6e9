//! The plugin's write of NVIDIA's node label `nvidia.com/gpu.clique`: a JSON
//! merge patch of a Node's labels through the real kube client sets a label,
//! a `null` removes it and leaves the others, a value that is no label value
//! is refused as a real API server refuses it (422, the field named), and a
//! missing Node is a 404.

use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer, ValidationRules};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config, Error};
use serde_json::json;

const LABEL: &str = "nvidia.com/gpu.clique";

async fn start() -> (TestApiServer, Api<Node>) {
    let server = TestApiServer::start(ServerOptions {
        rules: ValidationRules::V1_35,
        ..ServerOptions::default()
    })
    .await
    .expect("server starts");
    server.store().create_node("node-a").unwrap();
    let config = Config::new(server.url().parse().expect("url parses"));
    let client = Client::try_from(config).expect("client builds");
    (server, Api::all(client))
}

fn label_patch(value: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"labels": {LABEL: value, "other": "kept"}}}))
}

/// The patch that removes the label and nothing else.
fn removal() -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"labels": {LABEL: null}}}))
}

#[tokio::test]
async fn node_labels_are_set_and_removed_by_merge_patch() {
    let (_server, nodes) = start().await;
    let pp = PatchParams::default();
    let clique = "09b319a2-e553-400e-b9ab-1ff0bd7d7daf.32766";
    let node = nodes
        .patch("node-a", &pp, &label_patch(json!(clique)))
        .await
        .unwrap();
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels[LABEL], clique);
    assert_eq!(labels["other"], "kept");

    let node = nodes.patch("node-a", &pp, &removal()).await.unwrap();
    let labels = node.metadata.labels.unwrap();
    assert!(!labels.contains_key(LABEL));
    assert_eq!(labels["other"], "kept");
    // Removing what is not there is no error.
    nodes.patch("node-a", &pp, &removal()).await.unwrap();
}

#[tokio::test]
async fn hostile_label_values_and_missing_nodes_are_refused() {
    let (_server, nodes) = start().await;
    let pp = PatchParams::default();
    for bad in [json!("a b"), json!("x/y"), json!("a".repeat(64)), json!(7)] {
        match nodes.patch("node-a", &pp, &label_patch(bad.clone())).await {
            Err(Error::Api(e)) => {
                assert!(matches!(e.code, 422 | 400), "{bad}: {e:?}");
                assert!(e.message.contains("labels"), "{bad}: {}", e.message);
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    // Nothing was half-applied.
    let node = nodes.get("node-a").await.unwrap();
    assert!(
        !node
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("other")
    );
    match nodes.patch("node-b", &pp, &label_patch(json!("v"))).await {
        Err(Error::Api(e)) => assert_eq!(e.code, 404),
        other => panic!("{other:?}"),
    }
}
