//! NVIDIA's node label `nvidia.com/gpu.clique` through the real plugin
//! binary against the API server stand-in: set from the GB200 profile's
//! fabric clique with `--gpu-clique-label`, removed on a machine without a
//! clique, left alone without the flag.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{NODE, Plugin, TestEnv, short_dir};
use gpu_dra_sim::apiserver::{PatchBody, Resource, WriteOptions};
use serde_json::{Value, json};

const LABEL: &str = "nvidia.com/gpu.clique";
const GB200_CLIQUE: &str = "09b319a2-e553-400e-b9ab-1ff0bd7d7daf.1";
const WAIT: Duration = Duration::from_secs(30);

fn label(env: &TestEnv) -> Option<String> {
    let node = env.api.store().get(Resource::Nodes, None, NODE).unwrap();
    node["metadata"]["labels"][LABEL]
        .as_str()
        .map(str::to_owned)
}

fn set_label(env: &TestEnv, value: &str) {
    env.api
        .store()
        .patch(
            Resource::Nodes,
            None,
            NODE,
            &PatchBody::Merge(json!({"metadata": {"labels": {LABEL: value, "keep": "me"}}})),
            false,
            &WriteOptions::default(),
        )
        .unwrap();
}

async fn wait_label(env: &TestEnv, want: Option<&str>, plugin: &Plugin) {
    let deadline = Instant::now() + WAIT;
    while label(env).as_deref() != want {
        assert!(
            Instant::now() < deadline,
            "label {:?}, want {want:?}\n{}",
            label(env),
            plugin.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn env(dir: &std::path::Path, profile: &str) -> Arc<TestEnv> {
    Arc::new(TestEnv::builder(dir).bundled(profile).build())
}

#[tokio::test]
async fn gb200_node_gets_its_fabric_clique() {
    let dir = short_dir();
    let env = env(dir.path(), "gb200-nvl");
    let plugin = Plugin::launch(&env, dir.path(), "run", &["--gpu-clique-label"]);
    wait_label(&env, Some(GB200_CLIQUE), &plugin).await;
    env.wait_pool(NODE, WAIT).await;
    let log = plugin.stderr();
    assert!(log.contains("node clique label written"), "{log}");
    assert!(!log.contains("malformed"), "{log}");
}

#[tokio::test]
async fn a_node_without_a_clique_loses_a_stale_label_and_keeps_the_others() {
    let dir = short_dir();
    let env = env(dir.path(), "dgx-h100");
    set_label(&env, "stale.7");
    let plugin = Plugin::launch(&env, dir.path(), "run", &["--gpu-clique-label"]);
    wait_label(&env, None, &plugin).await;
    let node: Value = env.api.store().get(Resource::Nodes, None, NODE).unwrap();
    assert_eq!(node["metadata"]["labels"]["keep"], "me");
}

#[tokio::test]
async fn without_the_flag_the_label_is_left_alone() {
    let dir = short_dir();
    let env = env(dir.path(), "gb200-nvl");
    set_label(&env, "someone-elses.3");
    let plugin = Plugin::launch(&env, dir.path(), "run", &[]);
    env.wait_pool(NODE, WAIT).await;
    assert_eq!(label(&env).as_deref(), Some("someone-elses.3"));
    assert!(!plugin.stderr().contains("clique label"));
}
