//! The published pool over the plugin binary's life: restarts on the same
//! fake-NVML state, repair of slices deleted or changed behind its back, a GPU
//! failing in NVML, API server errors and outages, and what happens to the
//! slices on SIGTERM.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{DRIVER, NODE, Plugin, TestEnv, complete_pool, pool_of, short_dir};
use gpu_dra_sim::apiserver::{DeleteOptions, Resource, WriteOptions};
use gpu_dra_sim::kubelet::KubeletSim;
use gpu_nvml::{GpuBackend, MigPlacement};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);
/// Generous bound on repairs; the measured time goes to BENCHMARKS.md.
const REPAIR_BOUND: Duration = Duration::from_secs(10);

fn device_names(pool: &[Value]) -> Vec<String> {
    pool.iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

fn name(slice: &Value) -> &str {
    slice["metadata"]["name"].as_str().unwrap()
}

/// Waits until the pool of NODE has `count` slices, complete at
/// `generation`; returns how long that took.
async fn wait_restored(env: &TestEnv, count: usize, generation: i64) -> Duration {
    let start = Instant::now();
    env.wait_slices(REPAIR_BOUND, |all| {
        let pool = pool_of(all, NODE);
        pool.len() == count && complete_pool(&pool) == Some(generation)
    })
    .await;
    start.elapsed()
}

#[tokio::test]
async fn a_restart_on_the_same_nvml_state_republishes_the_identical_pool_and_repairs_it() {
    let dir = short_dir();
    let state = dir.path().join("nvml-state.json");
    let env = Arc::new(
        TestEnv::builder(dir.path())
            .bundled("dgx-a100")
            .state(&state)
            .build(),
    );
    // Change the machine before the plugin runs: a 1g.10gb MIG device on
    // GPU 3 (MIG on, empty in the profile), kept only in the state file.
    let created = {
        let nvml = gpu_nvml::NvmlBackend::open(Some(&env.library)).unwrap();
        nvml.create_mig_device(3, 19, MigPlacement { start: 0, size: 1 })
            .unwrap()
    };
    assert!(state.is_file());

    let mut first = Plugin::launch(&env, dir.path(), "first", &["--dynamic-mig=false"]);
    let pool = env.wait_pool(NODE, WAIT).await;
    let generation = complete_pool(&pool).unwrap();
    let mig = pool
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .find(|d| d["attributes"]["uuid"]["string"] == created.uuid.as_str())
        .unwrap_or_else(|| panic!("the MIG device from the state file is not published"));
    assert_eq!(mig["name"], "gpu-3-mig-1g10gb-19-0");
    first.wait_log("ResourceSlice pool in sync").await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let version = env.api.store().resource_version();

    // Same state file, same library copy: the identical pool, adopted at its
    // generation without a single write.
    let second = Plugin::launch(&env, dir.path(), "second", &[]);
    second.wait_log("ResourceSlice pool in sync").await;
    assert_eq!(env.slices(NODE), pool, "the pool changed on restart");
    assert_eq!(
        env.api.store().resource_version(),
        version,
        "the restarted plugin wrote to the API server"
    );
    assert!(!second.stderr().contains("publishing ResourceSlices"));

    // A slice deleted behind the plugin's back comes back, same content,
    // same generation.
    let victim = name(&pool[0]).to_owned();
    env.api
        .store()
        .delete(
            Resource::ResourceSlices,
            None,
            &victim,
            &DeleteOptions::default(),
        )
        .unwrap();
    let took = wait_restored(&env, pool.len(), generation).await;
    eprintln!("repair of a deleted slice took {took:?}");
    let repaired = env.slices(NODE);
    for (before, after) in pool.iter().zip(&repaired) {
        assert_eq!(before["spec"], after["spec"], "{}", name(before));
    }

    // A slice changed behind its back is put back too.
    let mut drifted = repaired[0].clone();
    drifted["spec"]["devices"][0]["attributes"]["productName"]["string"] = Value::from("tampered");
    env.api
        .store()
        .update(
            Resource::ResourceSlices,
            None,
            name(&drifted),
            drifted.clone(),
            false,
            &WriteOptions::default(),
        )
        .unwrap();
    let start = Instant::now();
    env.wait_slices(REPAIR_BOUND, |all| {
        let now = pool_of(all, NODE);
        now.len() == pool.len() && now.iter().zip(&pool).all(|(a, b)| a["spec"] == b["spec"])
    })
    .await;
    eprintln!("repair of a changed slice took {:?}", start.elapsed());
    assert!(!second.stderr().contains("panicked"));
}

/// The shipped dgx-h100 profile with `fail` injected into GPU `minor`.
fn with_failure(minor: u32, fail: &str) -> String {
    let yaml = std::fs::read_to_string(nvidia_ml::fixture::bundled_profile("dgx-h100")).unwrap();
    let line = format!("    minor: {minor}\n");
    assert!(yaml.contains(&line));
    yaml.replacen(&line, &format!("{line}    fail: {fail}\n"), 1)
}

#[tokio::test]
async fn a_gpu_failing_in_nvml_is_left_out_and_logged_the_others_are_published() {
    let dir = short_dir();
    let yaml = with_failure(5, "{nvmlDeviceGetMemoryInfo: GPU_IS_LOST}");
    let env = Arc::new(TestEnv::builder(dir.path()).yaml(&yaml).build());
    let plugin = Plugin::launch(&env, dir.path(), "run", &[]);
    let pool = env.wait_pool(NODE, WAIT).await;
    let names = device_names(&pool);
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-6", "gpu-7"
        ]
    );
    let lost = &nvidia_ml::Profile::load(&env.profile).unwrap().gpus[5].uuid;
    assert!(
        !serde_json::to_string(&pool)
            .unwrap()
            .contains(lost.as_str())
    );
    let log = plugin.stderr();
    let warning = log
        .lines()
        .find(|l| l.contains("GPU skipped"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(
        warning.contains("WARN") && warning.contains("gpu=5"),
        "{warning}"
    );
    assert!(warning.contains("nvmlDeviceGetMemoryInfo"), "{warning}");
}

#[tokio::test]
async fn api_errors_are_retried_with_backoff_and_logged_once() {
    let dir = short_dir();
    // No Node object yet: every reconcile fails with 404.
    let env = Arc::new(TestEnv::builder(dir.path()).without_node().build());
    let plugin = Plugin::launch_with(
        &env,
        dir.path(),
        "run",
        &[],
        &[("RUST_LOG", "info,gpu_kubelet_plugin::slices=debug")],
    );
    plugin.wait_log("still failing").await;
    plugin.wait_log("repeats=2").await;
    let log = plugin.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed, will retry with backoff"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("get Node node-a"), "{}", warnings[0]);
    assert!(warnings[0].contains("404"), "{}", warnings[0]);
    assert!(env.slices(NODE).is_empty());
    // The kubelet side is served meanwhile.
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    p.unprepare(&[]).await.unwrap();

    env.api.create_node(NODE);
    let pool = env.wait_pool(NODE, Duration::from_secs(40)).await;
    assert_eq!(device_names(&pool).len(), 4);
    plugin.wait_log("recovered").await;
    assert_eq!(
        plugin
            .stderr()
            .matches("failed, will retry with backoff")
            .count(),
        1
    );
}

/// A kubeconfig for a local port nothing listens on.
fn unreachable_kubeconfig(env: &TestEnv) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &env.kubeconfig,
        gpu_dra_sim::apiserver::kubeconfig_yaml(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
}

// Multi-threaded: the kubelet simulator's connection must stay responsive
// while the test blocks on the plugin's exit (the drain waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_blocks_neither_serving_nor_shutdown() {
    let dir = short_dir();
    let env = Arc::new(TestEnv::new(dir.path()));
    unreachable_kubeconfig(&env);
    let mut plugin = Plugin::launch(&env, dir.path(), "run", &[]);
    let p = KubeletSim::new()
        .register(&plugin.reg_socket())
        .await
        .unwrap();
    p.unprepare(&[]).await.unwrap();
    plugin.wait_log("failed, will retry with backoff").await;

    let start = Instant::now();
    plugin.signal("TERM");
    let status = tokio::task::block_in_place(|| plugin.wait_exit(WAIT));
    assert!(status.success(), "{status}: {}", plugin.stderr());
    // Well under the 20 s drain and the 30 s backoff this guards against,
    // with room for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(12),
        "{:?}",
        start.elapsed()
    );
    assert!(!plugin.reg_socket().exists());
}

#[tokio::test]
async fn deleting_slices_on_exit_without_an_api_server_is_a_bounded_error() {
    let dir = short_dir();
    let env = Arc::new(TestEnv::new(dir.path()));
    unreachable_kubeconfig(&env);
    let mut plugin = Plugin::launch(&env, dir.path(), "run", &["--delete-slices-on-exit"]);
    plugin.wait_log("failed, will retry with backoff").await;
    plugin.signal("TERM");
    let status = plugin.wait_exit(WAIT);
    let log = plugin.stderr();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(!plugin.reg_socket().exists());
    let last = log.lines().last().unwrap();
    assert!(last.starts_with("error: "), "{log}");
    assert!(last.contains("ResourceSlices"), "{last}");
}

async fn sigterm(delete_on_exit: bool) {
    let dir = short_dir();
    let env = Arc::new(TestEnv::new(dir.path()));
    let flags: &[&str] = if delete_on_exit {
        &["--delete-slices-on-exit"]
    } else {
        &[]
    };
    let mut plugin = Plugin::launch(&env, dir.path(), "run", flags);
    let pool = env.wait_pool(NODE, WAIT).await;
    plugin.wait_log("ResourceSlice pool in sync").await;
    plugin.signal("TERM");
    let status = plugin.wait_exit(WAIT);
    assert!(status.success(), "{status}: {}", plugin.stderr());
    let log = plugin.stderr();
    let dereg = log.find("removing the registration socket").expect(&log);
    let drained = log.find("kubelet plugin sockets closed").expect(&log);
    assert!(dereg < drained, "{log}");
    if delete_on_exit {
        assert!(env.slices(NODE).is_empty(), "slices left behind");
        let deleted = log.find("deleted ResourceSlices on exit").expect(&log);
        assert!(drained < deleted, "deleted before deregistering: {log}");
    } else {
        assert_eq!(env.slices(NODE), pool, "slices changed on exit");
        assert!(!log.contains("deleted ResourceSlices on exit"));
    }
    for slice in &pool {
        assert_eq!(slice["spec"]["driver"], DRIVER);
    }
}

#[tokio::test]
async fn sigterm_keeps_the_slices_by_default() {
    sigterm(false).await;
}

#[tokio::test]
async fn sigterm_with_delete_slices_on_exit_deletes_them_after_deregistering() {
    sigterm(true).await;
}
