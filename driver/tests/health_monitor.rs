//! The GPU health monitor through the real plugin binary and the fake NVML:
//! faults injected through the fake's control file (`MOCK_NVML_CONTROL`)
//! show up as device taints in the published ResourceSlices, as health
//! stream messages, as metrics and as Node Events within two poll periods;
//! recovery clears them; a restart keeps an active fault (checkpoint); a GPU
//! whose event registration fails is unmonitored while the others are
//! still watched; the stream repeats every device at least every 10 s.
//! Uncorrected ECC errors need a reset only where the driver has no
//! recovery action (before R565) or its action asks for one; PCIe replays
//! over 8 a minute degrade a GPU until `--health-info-ttl`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::health::{health_of, health_stream, is, wait_health};
use common::{DRIVER, NODE, Plugin, TestEnv, http_get, inject, pool_of, short_dir, taints_of};
use gpu_dra_sim::apiserver::{Resource, Selectors};
use serde_json::Value;

/// How long a fault may take to reach the API server: two poll periods,
/// the debounce and the publisher's write (with room for a loaded machine).
const FAULT_WAIT: Duration = Duration::from_secs(5);
/// How long recovery may take: the quiet period (1 s) plus the above.
const RECOVERY_WAIT: Duration = Duration::from_secs(8);

const GPU0_UUID: &str = "GPU-3f98e277-4cbd-47ad-9c90-a9587403e430";

/// A plugin on the small profile with the control file `dir/control`
/// (holding `initial` lines before the start) and fast health timing.
fn start(dir: &Path, initial: &[&str], extra: &[&str]) -> (Plugin, PathBuf) {
    start_on(dir, common::SMALL_PROFILE, initial, extra)
}

/// [`start`] on the bundled machine profile `profile`.
fn start_on(dir: &Path, profile: &str, initial: &[&str], extra: &[&str]) -> (Plugin, PathBuf) {
    start_with(dir, TestEnv::builder(dir).bundled(profile), initial, extra)
}

/// [`start`] on the machine profile given as YAML text.
fn start_yaml(dir: &Path, yaml: &str, initial: &[&str], extra: &[&str]) -> (Plugin, PathBuf) {
    start_with(dir, TestEnv::builder(dir).yaml(yaml), initial, extra)
}

fn start_with(
    dir: &Path,
    builder: common::EnvBuilder,
    initial: &[&str],
    extra: &[&str],
) -> (Plugin, PathBuf) {
    let control = dir.join("control");
    let mut text = String::new();
    for line in initial {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&control, text).unwrap();
    let env = Arc::new(builder.control(&control).build());
    let plugin = launch(&env, dir, "run", extra);
    (plugin, control)
}

fn launch(env: &Arc<TestEnv>, dir: &Path, name: &str, extra: &[&str]) -> Plugin {
    // The poll period and quiet period of these tests, unless `extra`
    // sets them.
    let mut args: Vec<&str> = [
        "--health-poll-interval=300ms",
        "--health-quiet-period=1s",
        "--metrics-addr=127.0.0.1:0",
    ]
    .into_iter()
    .filter(|d| {
        let flag = d.split('=').next().unwrap_or_default();
        !extra.iter().any(|e| e.starts_with(flag))
    })
    .collect();
    args.extend_from_slice(extra);
    Plugin::launch(env, dir, name, &args)
}

fn has_taint(slices: &[Value], device: &str, key: &str, effect: &str) -> bool {
    taints_of(slices, device)
        .iter()
        .any(|(k, _, e)| k == key && e == effect)
}

/// Waits until `device` has (or, with `present` false, no longer has) a
/// taint `key` with `effect` in the API server; returns the time taken.
async fn wait_taint(
    env: &TestEnv,
    device: &str,
    key: &str,
    effect: &str,
    present: bool,
    timeout: Duration,
) -> Duration {
    let started = Instant::now();
    env.wait_slices(timeout, |slices| {
        has_taint(slices, device, key, effect) == present
    })
    .await;
    started.elapsed()
}

/// [`wait_taint`] for a taint to appear within [`FAULT_WAIT`].
async fn wait_tainted(env: &TestEnv, device: &str, key: &str, effect: &str) -> Duration {
    wait_taint(env, device, key, effect, true, FAULT_WAIT).await
}

/// [`wait_taint`] for a taint to go within [`RECOVERY_WAIT`].
async fn wait_cleared(env: &TestEnv, device: &str, key: &str, effect: &str) -> Duration {
    wait_taint(env, device, key, effect, false, RECOVERY_WAIT).await
}

/// Asserts that `device` has a taint `key` with `effect` now.
fn assert_tainted(env: &TestEnv, device: &str, key: &str, effect: &str) {
    let slices = env.slices(NODE);
    assert!(
        has_taint(&slices, device, key, effect),
        "no {key}:{effect} on {device}: {:?}",
        taints_of(&slices, device)
    );
}

/// Asserts that `device` has a taint `key` whose value is `value`.
fn assert_taint_value(env: &TestEnv, device: &str, key: &str, value: &str) {
    let taints = taints_of(&env.slices(NODE), device);
    assert!(
        taints.iter().any(|(k, v, _)| k == key && v == value),
        "no {key}={value} on {device}: {taints:?}"
    );
}

async fn metrics(plugin: &Plugin) -> String {
    let addr = plugin.metrics_addr().await;
    http_get(&addr, "/metrics").await
}

/// Whether a line of the metrics text starts with `start` (the metric
/// names carry no prefix).
fn has_line(text: &str, start: &str) -> bool {
    text.lines().any(|l| l.starts_with(start))
}

/// The reasons of the Node Events in the API server.
fn node_event_reasons(env: &TestEnv) -> Vec<String> {
    let (items, _) = env
        .api
        .store()
        .list(Resource::Events, Some("default"), &Selectors::default());
    items
        .iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == NODE)
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn wait_event(env: &TestEnv, reason: &str) {
    let deadline = Instant::now() + FAULT_WAIT;
    while !node_event_reasons(env).iter().any(|r| r == reason) {
        assert!(
            Instant::now() < deadline,
            "no {reason} Event: {:?}",
            node_event_reasons(env)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_xid_79_taints_reports_and_counts_then_recovers() {
    let dir = short_dir();
    let (plugin, control) = start(dir.path(), &[], &[]);
    let env = plugin.env.clone();
    let pool = env.wait_pool(NODE, Duration::from_secs(10)).await;
    let generation = common::complete_pool(&pool);
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, Duration::from_secs(5), |_| true).await;
    assert_eq!(first.len(), 4, "{first:#?}");
    assert!(first.iter().all(|d| d.health == "Healthy"), "{first:#?}");
    assert!(first.iter().all(|d| d.pool_name == NODE));
    assert!(taints_of(&env.slices(NODE), "gpu-0").is_empty());

    inject(&control, "xid 0 79");
    let took = wait_tainted(&env, "gpu-0", "gpu.nvidia.com/gpu-lost", "NoSchedule").await;
    eprintln!("XID 79 to the gpu-lost taint in the API server: {took:?}");
    let slices = env.slices(NODE);
    assert!(
        taints_of(&slices, "gpu-0")
            .iter()
            .any(|(k, v, _)| k == "gpu.nvidia.com/xid" && v == "79"),
        "{:?}",
        taints_of(&slices, "gpu-0")
    );
    // Written in place: the pool keeps its generation.
    assert_eq!(common::complete_pool(&pool_of(&slices, NODE)), generation);
    // The other GPUs are untouched.
    for other in ["gpu-1", "gpu-2", "gpu-3"] {
        assert!(taints_of(&slices, other).is_empty(), "{other}");
    }
    let list = wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-0", "Unhealthy")).await;
    let gpu0 = health_of(&list, "gpu-0").unwrap();
    assert!(gpu0.message.contains("79"), "{gpu0:?}");
    assert!(gpu0.message.len() <= 1024);
    assert_eq!(gpu0.health_check_timeout_seconds, 30);
    assert!(is(&list, "gpu-1", "Healthy"), "{list:#?}");
    let text = metrics(&plugin).await;
    for needle in [
        format!(r#"gpu_health_state{{device="gpu-0",uuid="{GPU0_UUID}",state="Unhealthy"}} 1"#),
        format!(r#"gpu_xid_events_total{{uuid="{GPU0_UUID}",xid="79"}} 1"#),
        r#"gpu_health_taint{device="gpu-0",key="gpu.nvidia.com/gpu-lost",effect="NoSchedule"} 1"#
            .to_owned(),
        format!(r#"gpu_recovery_action{{uuid="{GPU0_UUID}"}} 0"#),
        "gpu_health_monitor_last_success_timestamp ".to_owned(),
        "gpu_health_publish_failures_total 0".to_owned(),
    ] {
        assert!(has_line(&text, &needle), "{needle} not in {text}");
    }
    wait_event(&env, "GpuUnhealthy").await;

    // The GPU answers, its recovery action is NONE: after the quiet period
    // the fatal taint goes; the informational XID stays until its TTL.
    let took = wait_cleared(&env, "gpu-0", "gpu.nvidia.com/gpu-lost", "NoSchedule").await;
    eprintln!("gpu-lost cleared after {took:?}");
    assert!(
        taints_of(&env.slices(NODE), "gpu-0")
            .iter()
            .all(|(_, _, e)| e == "None"),
        "{:?}",
        taints_of(&env.slices(NODE), "gpu-0")
    );
    wait_health(&mut stream, RECOVERY_WAIT, |l| is(l, "gpu-0", "Healthy")).await;
    wait_event(&env, "GpuRecovered").await;
    let text = metrics(&plugin).await;
    assert!(
        has_line(
            &text,
            &format!(r#"gpu_health_state{{device="gpu-0",uuid="{GPU0_UUID}",state="Healthy"}} 1"#)
        ),
        "{text}"
    );
    assert!(!text.contains(r#"key="gpu.nvidia.com/gpu-lost""#), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn polled_faults_taint_within_two_polls_and_clear() {
    let dir = short_dir();
    let (plugin, control) = start(dir.path(), &[], &[]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    let mut stream = health_stream(&plugin).await;

    // Lost and back.
    inject(&control, "lose 1");
    let took = wait_tainted(&env, "gpu-1", "gpu.nvidia.com/gpu-lost", "NoSchedule").await;
    eprintln!("GPU lost (polled every 300 ms) to the gpu-lost taint in the API server: {took:?}");
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-1", "Unhealthy")).await;
    inject(&control, "restore 1");
    wait_cleared(&env, "gpu-1", "gpu.nvidia.com/gpu-lost", "NoSchedule").await;
    wait_health(&mut stream, RECOVERY_WAIT, |l| is(l, "gpu-1", "Healthy")).await;

    // A recovery action asking for a reset, then none again.
    inject(&control, "recovery 2 reset");
    wait_tainted(&env, "gpu-2", "gpu.nvidia.com/reset-required", "NoSchedule").await;
    assert_taint_value(&env, "gpu-2", "gpu.nvidia.com/reset-required", "GPU_RESET");
    let text = metrics(&plugin).await;
    assert!(
        has_line(
            &text,
            r#"gpu_recovery_action{uuid="GPU-4cdd2055-930d-4eaf-94f4-733f3e7d1bfb"} 1"#
        ),
        "{text}"
    );
    inject(&control, "recovery 2 none");
    wait_cleared(&env, "gpu-2", "gpu.nvidia.com/reset-required", "NoSchedule").await;

    // A recovery action asking for a reboot.
    inject(&control, "recovery 3 reboot");
    wait_tainted(
        &env,
        "gpu-3",
        "gpu.nvidia.com/reboot-required",
        "NoSchedule",
    )
    .await;
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-3", "Unhealthy")).await;

    // Informational conditions: tainted `None`, the device stays Healthy.
    for (line, device, value) in [
        ("slowdown 0 thermal", "gpu-0", "thermal"),
        ("recovery 1 drain", "gpu-1", "p2p"),
    ] {
        inject(&control, line);
        env.wait_slices(FAULT_WAIT, |s| {
            taints_of(s, device)
                .iter()
                .any(|(k, v, e)| k == "gpu.nvidia.com/degraded" && v == value && e == "None")
        })
        .await;
    }
    let list = wait_health(&mut stream, FAULT_WAIT, |_| true).await;
    assert!(is(&list, "gpu-0", "Healthy"), "{list:#?}");
    let gpu0 = health_of(&list, "gpu-0").unwrap();
    assert!(gpu0.message.contains("slowdown"), "{gpu0:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_keeps_an_active_fault() {
    let dir = short_dir();
    // A quiet period longer than the test: the restored fault must not
    // clear while it is looked at.
    let flags = ["--xids-fatal=48", "--health-quiet-period=1h"];
    let (mut plugin, control) = start(dir.path(), &[], &flags);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    inject(&control, "xid 0 48");
    wait_tainted(&env, "gpu-0", "gpu.nvidia.com/xid", "NoSchedule").await;

    plugin.signal("TERM");
    tokio::task::block_in_place(|| plugin.wait_exit(Duration::from_secs(10)));
    // NVML does not replay the XID (nor does the fake, whose XIDs are
    // events only): only the checkpoint brings it back. The control file
    // is read from its start again: empty it.
    std::fs::write(&control, "").unwrap();
    let plugin = launch(&env, dir.path(), "run2", &flags);
    assert!(
        plugin.stderr().contains("health checkpoint read"),
        "{}",
        plugin.stderr()
    );
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, Duration::from_secs(5), |_| true).await;
    assert!(is(&first, "gpu-0", "Unhealthy"), "{first:#?}");
    assert!(health_of(&first, "gpu-0").unwrap().message.contains("48"));
    // Still tainted after the new instance's first publication.
    let status_logged = "ResourceSlice pool in sync";
    plugin.wait_log(status_logged).await;
    assert_tainted(&env, "gpu-0", "gpu.nvidia.com/xid", "NoSchedule");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_refusing_events_is_unmonitored_while_the_others_are_watched() {
    let dir = short_dir();
    let (plugin, control) = start(dir.path(), &["refuse-events 1"], &[]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    wait_tainted(&env, "gpu-1", "gpu.nvidia.com/unmonitored", "None").await;
    let mut stream = health_stream(&plugin).await;
    let list = wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-1", "Unknown")).await;
    assert!(is(&list, "gpu-0", "Healthy"), "{list:#?}");

    // The others still deliver events.
    inject(&control, "xid 0 79");
    wait_tainted(&env, "gpu-0", "gpu.nvidia.com/gpu-lost", "NoSchedule").await;

    // Registration works again: monitored after the next retry.
    inject(&control, "accept-events 1");
    wait_taint(
        &env,
        "gpu-1",
        "gpu.nvidia.com/unmonitored",
        "None",
        false,
        FAULT_WAIT,
    )
    .await;
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-1", "Healthy")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stream_repeats_every_device_at_least_every_10_s() {
    let dir = short_dir();
    let (plugin, _control) = start(dir.path(), &[], &[]);
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, Duration::from_secs(5), |_| true).await;
    assert_eq!(first.len(), 4);
    // Nothing changes; the monitor re-sends anyway.
    for _ in 0..2 {
        let started = Instant::now();
        let next = wait_health(&mut stream, Duration::from_millis(10_500), |_| true).await;
        assert!(started.elapsed() <= Duration::from_millis(10_500));
        assert_eq!(next.len(), 4, "{next:#?}");
        assert!(next.iter().all(|d| d.health == "Healthy"), "{next:#?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn health_off_publishes_no_taints_and_an_empty_list() {
    let dir = short_dir();
    let (plugin, control) = start(dir.path(), &[], &["--health=off"]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, Duration::from_secs(5), |_| true).await;
    assert!(first.is_empty(), "{first:#?}");
    inject(&control, "xid 0 79");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(taints_of(&env.slices(NODE), "gpu-0").is_empty());
    let text = metrics(&plugin).await;
    assert!(!text.contains("gpu_health_state{"), "{text}");
}

/// `nvlinkCount` of `device` in the node's slices.
fn nvlink_count(slices: &[Value], device: &str) -> Option<i64> {
    pool_of(slices, NODE)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == device)
        .and_then(|d| d["attributes"]["nvlinkCount"]["int"].as_i64())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hardware_failure_stays_until_an_admin_clears_it_and_a_link_down_republishes() {
    let dir = short_dir();
    let (plugin, control) = start_on(dir.path(), "pcie-a100-bridged", &[], &[]);
    let env = plugin.env.clone();
    let slices = env.wait_pool(NODE, Duration::from_secs(10)).await;
    assert_eq!(nvlink_count(&slices, "gpu-0"), Some(12));
    let mut stream = health_stream(&plugin).await;

    // A remap waits for a reset: informational.
    inject(&control, "remap 0 1 0");
    wait_tainted(&env, "gpu-0", "gpu.nvidia.com/remap-pending", "None").await;
    // It failed: the memory is beyond repair.
    inject(&control, "remap 0 0 1");
    wait_tainted(
        &env,
        "gpu-0",
        "gpu.nvidia.com/hardware-failure",
        "NoSchedule",
    )
    .await;
    assert_taint_value(
        &env,
        "gpu-0",
        "gpu.nvidia.com/hardware-failure",
        "row-remap-failure",
    );
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-0", "Unhealthy")).await;
    // The GPU no longer reports it (repaired): the taint stays, well past
    // the quiet period.
    inject(&control, "remap 0 0 0");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_tainted(
        &env,
        "gpu-0",
        "gpu.nvidia.com/hardware-failure",
        "NoSchedule",
    );
    // The admin's request clears it, and is taken away.
    let clear = plugin.plugins_dir.join(DRIVER).join("health-clear");
    std::fs::write(
        &clear,
        "# repaired\nGPU-907a70c3-1012-4037-b64c-e4228c38fb29\n",
    )
    .unwrap();
    wait_taint(
        &env,
        "gpu-0",
        "gpu.nvidia.com/hardware-failure",
        "NoSchedule",
        false,
        FAULT_WAIT,
    )
    .await;
    assert!(!clear.exists());
    // A malformed request is reported and removed, nothing else happens.
    std::fs::write(&clear, "not-a-uuid\n").unwrap();
    let deadline = Instant::now() + FAULT_WAIT;
    while clear.exists() {
        assert!(Instant::now() < deadline, "the malformed request stays");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plugin
        .wait_log("the request to clear hardware failures was not used")
        .await;

    // An NVLink goes down: the inventory is republished with one link less.
    inject(&control, "nvlink 0 0 down");
    env.wait_slices(FAULT_WAIT, |s| nvlink_count(s, "gpu-0") == Some(11))
        .await;
    inject(&control, "nvlink 0 0 up");
    env.wait_slices(FAULT_WAIT, |s| nvlink_count(s, "gpu-0") == Some(12))
        .await;
}

/// CPU time (user + system, in clock ticks of 1/100 s) and resident KiB of
/// process `pid`.
fn cpu_and_rss(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name in parentheses; utime and stime are
    // the 14th and 15th fields of the line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    (ticks, rss)
}

/// The idle cost of the monitor on 8 GPUs (BENCHMARKS.md, "GPU health
/// monitor"): the plugin's CPU over 60 s and its resident memory, with the
/// monitor on (default 10 s poll) and off. Run by hand:
/// `cargo test -p gpu-kubelet-plugin --test health_monitor -- --ignored --nocapture idle_cost`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement, 2 minutes"]
async fn idle_cost_on_8_gpus() {
    for mode in ["on", "off"] {
        let dir = short_dir();
        let env = Arc::new(TestEnv::builder(dir.path()).bundled("dgx-h100").build());
        let plugin = Plugin::launch(&env, dir.path(), "run", &[&format!("--health={mode}")]);
        env.wait_pool(NODE, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let pid = plugin.child.id();
        let (before, _) = cpu_and_rss(pid);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let (after, rss) = cpu_and_rss(pid);
        let percent = (after - before) as f64 / 60.0;
        eprintln!(
            "health={mode}: CPU {} ticks in 60 s ({percent:.3}% of a core), VmRSS {rss} KiB",
            after - before
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_taint_refused_by_the_api_server_is_retried_and_the_failures_counted() {
    use gpu_dra_sim::apiserver::WriteFault;
    let dir = short_dir();
    let (plugin, control) = start(dir.path(), &[], &[]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    let mut stream = health_stream(&plugin).await;
    env.api.faults().set_writes(WriteFault::Status(500));
    inject(&control, "xid 0 79");
    // The health stream does not wait for the API server.
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-0", "Unhealthy")).await;
    let deadline = Instant::now() + FAULT_WAIT;
    loop {
        let text = metrics(&plugin).await;
        let failures = text
            .lines()
            .find_map(|l| l.strip_prefix("gpu_health_publish_failures_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if failures >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no publish failures counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!has_taint(
        &env.slices(NODE),
        "gpu-0",
        "gpu.nvidia.com/gpu-lost",
        "NoSchedule"
    ));
    // Writes work again: the backoff retry publishes the taint.
    env.api.faults().set_writes(WriteFault::None);
    wait_taint(
        &env,
        "gpu-0",
        "gpu.nvidia.com/gpu-lost",
        "NoSchedule",
        true,
        Duration::from_secs(35),
    )
    .await;
}

/// The names of the devices in the node's slices.
fn device_names(slices: &[Value]) -> Vec<String> {
    pool_of(slices, NODE)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect()
}

/// Whether device `name` sits on the GPU with device minor `minor` (the
/// GPU itself or one of its MIG devices).
fn on_gpu(name: &str, minor: u32) -> bool {
    let gpu = format!("gpu-{minor}");
    name == gpu || name.starts_with(&format!("{gpu}-"))
}

/// A bundled profile with its driver version replaced by `driver`.
fn profile_with_driver(profile: &str, driver: &str) -> String {
    let text = std::fs::read_to_string(nvidia_ml::fixture::bundled_profile(profile)).unwrap();
    let mut found = false;
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("driverVersion:") {
                found = true;
                format!("driverVersion: \"{driver}\"")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(found, "{profile} has no driverVersion line");
    text
}

/// The H100 with MIG off of the `mixed` profile.
const MIXED_GPU0_UUID: &str = "GPU-9be4bcfc-49b6-4a08-b2e6-cc3ababced20";

#[tokio::test(flavor = "multi_thread")]
async fn an_uncorrected_ecc_error_before_r565_requires_a_reset_of_the_gpu_and_its_mig_devices() {
    let dir = short_dir();
    // A driver before R565 has no recovery action: an uncorrected ECC
    // error is the catalog's XID 48 alone, a GPU reset. Dynamic MIG
    // publishes every placement of GPU 0 as a device of its own. A quiet
    // period of 3 s leaves time to look before it recovers.
    let yaml = profile_with_driver("mixed", "535.104.05");
    let (plugin, control) = start_yaml(
        dir.path(),
        &yaml,
        &[],
        &["--dynamic-mig", "--health-quiet-period=3s"],
    );
    let env = plugin.env.clone();
    let slices = env.wait_pool(NODE, Duration::from_secs(10)).await;
    let names = device_names(&slices);
    let on0: Vec<&String> = names.iter().filter(|n| on_gpu(n, 0)).collect();
    let others: Vec<&String> = names.iter().filter(|n| !on_gpu(n, 0)).collect();
    assert!(on0.len() > 1, "GPU 0 has no MIG devices: {names:?}");
    assert!(!others.is_empty(), "{names:?}");
    let mut stream = health_stream(&plugin).await;
    let first = wait_health(&mut stream, Duration::from_secs(5), |_| true).await;
    assert!(first.iter().all(|d| d.health == "Healthy"), "{first:#?}");
    let text = metrics(&plugin).await;
    let unknown = format!(r#"gpu_recovery_action{{uuid="{MIXED_GPU0_UUID}"}} -1"#);
    assert!(has_line(&text, &unknown), "{unknown} not in {text}");

    inject(&control, "ecc 0 1");
    let took = wait_tainted(&env, "gpu-0", "gpu.nvidia.com/reset-required", "NoSchedule").await;
    eprintln!("uncorrected ECC (R535) to the reset-required taint: {took:?}");
    let slices = env
        .wait_slices(FAULT_WAIT, |s| {
            on0.iter().all(|d| {
                taints_of(s, d).iter().any(|(k, v, e)| {
                    k == "gpu.nvidia.com/reset-required" && v == "GPU_RESET" && e == "NoSchedule"
                })
            })
        })
        .await;
    for other in &others {
        assert!(
            taints_of(&slices, other).is_empty(),
            "{other}: {:?}",
            taints_of(&slices, other)
        );
    }
    let list = wait_health(&mut stream, FAULT_WAIT, |l| {
        on0.iter().all(|d| is(l, d, "Unhealthy"))
    })
    .await;
    for other in &others {
        assert!(is(&list, other, "Healthy"), "{other}: {list:#?}");
    }
    let gpu0 = health_of(&list, "gpu-0").unwrap();
    assert!(gpu0.message.contains("ECC"), "{gpu0:?}");
    let text = metrics(&plugin).await;
    for device in &on0 {
        for needle in [
            format!(
                r#"gpu_health_state{{device="{device}",uuid="{MIXED_GPU0_UUID}",state="Unhealthy"}} 1"#
            ),
            format!(
                r#"gpu_health_taint{{device="{device}",key="gpu.nvidia.com/reset-required",effect="NoSchedule"}} 1"#
            ),
        ] {
            assert!(has_line(&text, &needle), "{needle} not in {text}");
        }
    }
    assert!(
        !text.contains(r#"device="gpu-2",key="#),
        "gpu-2 has a taint metric: {text}"
    );
    wait_event(&env, "GpuUnhealthy").await;

    // The GPU answers and nothing new comes: after the quiet period the
    // reset-required taint goes from every device.
    wait_cleared(&env, "gpu-0", "gpu.nvidia.com/reset-required", "NoSchedule").await;
    let slices = env
        .wait_slices(RECOVERY_WAIT, |s| {
            on0.iter().all(|d| taints_of(s, d).is_empty())
        })
        .await;
    assert!(taints_of(&slices, "gpu-0").is_empty());
    wait_health(&mut stream, RECOVERY_WAIT, |l| {
        on0.iter().all(|d| is(l, d, "Healthy"))
    })
    .await;
    let text = metrics(&plugin).await;
    assert!(!text.contains("gpu.nvidia.com/reset-required"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_contained_ecc_error_only_logs_until_the_recovery_action_asks_for_a_reset() {
    let dir = short_dir();
    // The bundled profile's driver is R580: recovery action NONE.
    let (plugin, control) = start(dir.path(), &[], &[]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    let mut stream = health_stream(&plugin).await;
    wait_health(&mut stream, Duration::from_secs(5), |_| true).await;

    inject(&control, "ecc 0 1");
    // What it leaves: an info line naming the GPU.
    plugin
        .wait_log("memory error contained: recovery action needs nothing")
        .await;
    let logged = plugin.stderr();
    let line = logged
        .lines()
        .find(|l| l.contains("memory error contained"))
        .unwrap();
    assert!(line.contains(&format!("gpu={GPU0_UUID}")), "{line}");
    // The fault is a field of its own (a field named `message` would
    // clash with the event's message).
    // (The double-bit ECC event or the poll's grown counter, whichever
    // came first.)
    let detail = line.split(" detail=").nth(1).unwrap_or_default();
    assert!(detail.contains("ECC"), "{line}");
    // Two poll periods more: still no taint, still Healthy without message.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        taints_of(&env.slices(NODE), "gpu-0").is_empty(),
        "{:?}",
        taints_of(&env.slices(NODE), "gpu-0")
    );
    let list = wait_health(&mut stream, Duration::from_secs(11), |_| true).await;
    let gpu0 = health_of(&list, "gpu-0").unwrap();
    assert_eq!(gpu0.health, "Healthy", "{gpu0:?}");
    assert!(gpu0.message.is_empty(), "{gpu0:?}");
    let text = metrics(&plugin).await;
    let healthy =
        format!(r#"gpu_health_state{{device="gpu-0",uuid="{GPU0_UUID}",state="Healthy"}} 1"#);
    assert!(has_line(&text, &healthy), "{text}");
    assert!(
        !text.contains(r#"gpu_health_taint{device="gpu-0""#),
        "{text}"
    );

    // The driver then asks for a reset: reset-required.
    inject(&control, "recovery 0 reset");
    wait_tainted(&env, "gpu-0", "gpu.nvidia.com/reset-required", "NoSchedule").await;
    assert_taint_value(&env, "gpu-0", "gpu.nvidia.com/reset-required", "GPU_RESET");
    wait_health(&mut stream, FAULT_WAIT, |l| is(l, "gpu-0", "Unhealthy")).await;
    // More ECC errors while it waits for the reset keep it there.
    inject(&control, "ecc 0 2");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_tainted(&env, "gpu-0", "gpu.nvidia.com/reset-required", "NoSchedule");
    // Reset done (the action is NONE again): cleared after the quiet period.
    inject(&control, "recovery 0 none");
    wait_cleared(&env, "gpu-0", "gpu.nvidia.com/reset-required", "NoSchedule").await;
    wait_health(&mut stream, RECOVERY_WAIT, |l| is(l, "gpu-0", "Healthy")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pcie_replays_over_8_a_minute_degrade_the_gpu_until_the_info_ttl() {
    let dir = short_dir();
    // The shortest TTL the flag takes.
    let (plugin, control) = start(dir.path(), &[], &["--health-info-ttl=1m"]);
    let env = plugin.env.clone();
    env.wait_pool(NODE, Duration::from_secs(10)).await;
    let mut stream = health_stream(&plugin).await;
    wait_health(&mut stream, Duration::from_secs(5), |_| true).await;

    inject(&control, "pcie-replays 0 1000");
    let started = Instant::now();
    let slices = env
        .wait_slices(FAULT_WAIT, |s| {
            taints_of(s, "gpu-0")
                .iter()
                .any(|(k, v, e)| k == "gpu.nvidia.com/degraded" && v == "pcie" && e == "None")
        })
        .await;
    let raised = Instant::now();
    eprintln!("1000 PCIe replays to degraded=pcie: {:?}", raised - started);
    assert_eq!(taints_of(&slices, "gpu-0").len(), 1);
    for other in ["gpu-1", "gpu-2", "gpu-3"] {
        assert!(taints_of(&slices, other).is_empty(), "{other}");
    }
    let list = wait_health(&mut stream, FAULT_WAIT, |l| {
        health_of(l, "gpu-0").is_some_and(|d| d.message.contains("PCIe"))
    })
    .await;
    let gpu0 = health_of(&list, "gpu-0").unwrap();
    assert_eq!(gpu0.health, "Healthy", "{gpu0:?}");
    assert!(gpu0.message.contains("1000 PCIe replays"), "{gpu0:?}");
    let text = metrics(&plugin).await;
    for needle in [
        format!(r#"gpu_health_state{{device="gpu-0",uuid="{GPU0_UUID}",state="Healthy"}} 1"#),
        r#"gpu_health_taint{device="gpu-0",key="gpu.nvidia.com/degraded",effect="None"} 1"#
            .to_owned(),
    ] {
        assert!(has_line(&text, &needle), "{needle} not in {text}");
    }
    wait_event(&env, "GpuDegraded").await;

    // The counter stays: no new replays, the condition expires one TTL
    // after it was raised, not before.
    wait_taint(
        &env,
        "gpu-0",
        "gpu.nvidia.com/degraded",
        "None",
        false,
        Duration::from_secs(75),
    )
    .await;
    let lasted = raised.elapsed();
    eprintln!("degraded=pcie expired after {lasted:?}");
    assert!(
        lasted >= Duration::from_secs(55),
        "expired after {lasted:?}"
    );
    let list = wait_health(&mut stream, FAULT_WAIT, |l| {
        health_of(l, "gpu-0").is_some_and(|d| d.message.is_empty())
    })
    .await;
    assert!(is(&list, "gpu-0", "Healthy"), "{list:#?}");
    let text = metrics(&plugin).await;
    assert!(!text.contains("gpu.nvidia.com/degraded"), "{text}");
}
