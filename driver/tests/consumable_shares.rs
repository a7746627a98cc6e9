//! NVIDIA's consumable shares (`--consumable-shares`) and MPS `multiUser`
//! at prepare, end to end: the real plugin binary on the fake NVML and the
//! fake driver root, driven by the kubelet simulator, with claims allocated
//! as the scheduler allocates shares (`shareID`, `consumedCapacity`). What
//! the scheduler does with the published policies is tested in
//! `e2e/tests/memory_sharing.rs` (the allocator) and the golden pools.

mod common;

use common::prepare::{env_of, gpu_config, mig_config, node, node_yaml, result, share, share_id};
use common::short_dir;
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use serde_json::json;

/// A claim `share-<letter>` for a share of `device` consuming `memory`,
/// with `config` (a JSON list).
async fn share_of(
    n: &common::prepare::Node,
    letter: char,
    device: &str,
    memory: &str,
    config: serde_json::Value,
) -> Claim {
    let name = format!("share-{letter}");
    let result = share(&name, device, &share_id(letter), memory);
    n.claim(&name, json!([result]), config).await
}

/// A claim config (JSON list) of MPS with `threads` percent and `memory`
/// as its default limits.
fn mps_config(threads: u32, memory: &str) -> serde_json::Value {
    json!([gpu_config(json!({"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": threads, "defaultPinnedDeviceMemoryLimit": memory}}))])
}

/// A claim config (JSON list) of MPS with `multiUser` set to `on`.
fn multi_user(on: bool) -> serde_json::Value {
    json!([gpu_config(
        json!({"strategy": "MPS", "mpsConfig": {"multiUser": on}})
    )])
}

/// Asserts that `env` (a CDI device's environment) limits MPS to
/// `memory` (as the daemon takes it, e.g. `4096M`) and `threads` percent.
fn assert_mps_limits(env: &[String], memory: &str, threads: u32) {
    for line in [
        format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory}"),
        format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}"),
    ] {
        assert!(env.contains(&line), "{line} not in {env:?}");
    }
}

/// `memory` mode is memory-fraction sharing: two claims on one T4 get one
/// MPS daemon and limits from what they consumed; a claim's MPS config
/// lowers its own limits; unprepare keeps the daemon until the last claim.
#[tokio::test]
async fn memory_mode_enforces_each_share_with_mps_limits() {
    let n = node(
        "t4-inference",
        &["--consumable-shares=memory"],
        DraVersion::V1,
    )
    .await;
    let a = share_of(&n, 'a', "gpu-2", "4Gi", json!([])).await;
    // 6 GiB, but its MPS config asks for 1 GiB and 10 % of the threads.
    let b = share_of(&n, 'b', "gpu-2", "6Gi", mps_config(10, "1Gi")).await;
    n.prepare_ok(&a).await;
    n.prepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 1, "one daemon for the GPU");
    let env_a = env_of(&n.spec_device(&a, "gpu-2"));
    let env_b = env_of(&n.spec_device(&b, "gpu-2"));
    // 4 GiB of a 15,360 MiB T4: 26 % of the threads.
    assert_mps_limits(&env_a, "4096M", 26);
    assert_mps_limits(&env_b, "1024M", 10);
    // An MPS config never raises a limit above the share.
    let c = share_of(&n, 'c', "gpu-2", "2Gi", mps_config(100, "8Gi")).await;
    n.prepare_ok(&c).await;
    let env_c = env_of(&n.spec_device(&c, "gpu-2"));
    assert_mps_limits(&env_c, "2048M", 13);
    n.unprepare_ok(&a).await;
    n.unprepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 1, "b still uses the daemon");
    n.unprepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 0, "stopped after the last claim");
    assert!(n.exclusive_gpus().is_empty(), "compute mode restored");
    assert_eq!(n.processes(), 0, "no process left");
}

/// On a memory share, time-slicing and `multiUser` are refused with a
/// reason, before anything is set up.
#[tokio::test]
async fn memory_mode_refuses_what_a_share_cannot_have() {
    let n = node(
        "t4-inference",
        &["--consumable-shares=memory"],
        DraVersion::V1,
    )
    .await;
    for (letter, sharing, expect) in [
        (
            'a',
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            "remove the time-slicing config or use an MPS config",
        ),
        (
            'b',
            json!({"strategy": "MPS", "mpsConfig": {"multiUser": true}}),
            "a shared GPU's daemon serves every claim on it: leave multiUser out",
        ),
    ] {
        let c = share_of(&n, letter, "gpu-1", "1Gi", json!([gpu_config(sharing)])).await;
        let error = n.prepare_error(&c).await;
        assert!(error.contains(expect), "{error}");
    }
    assert!(n.checkpoint_claims().is_empty());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert_eq!(n.mps_daemons(), 0);
}

/// `unlimited`: two claims on one GPU are both prepared, each as if it had
/// the GPU alone (no MPS, no limits). Claims with an MPS config join the
/// GPU's one daemon with their config's limits, but not beside claims
/// without one (compute mode EXCLUSIVE_PROCESS would lock them out), nor
/// the other way round. A claim for the whole GPU (no share) is refused
/// while shares hold it.
#[tokio::test]
async fn unlimited_mode_counts_only_and_mps_configs_join_one_daemon() {
    let n = node(
        "t4-inference",
        &["--consumable-shares=unlimited"],
        DraVersion::V1,
    )
    .await;
    let sa = share_of(&n, 'a', "gpu-0", "0", json!([])).await;
    let sb = share_of(&n, 'b', "gpu-0", "0", json!([])).await;
    n.prepare_ok(&sa).await;
    n.prepare_ok(&sb).await;
    for sc in [&sa, &sb] {
        let dev = n.spec_device(sc, "gpu-0");
        let env = env_of(&dev);
        assert!(
            !env.iter().any(|se| se.starts_with("CUDA_MPS")),
            "not enforced: {env:?}"
        );
        assert_eq!(
            dev["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia0"
        );
    }
    assert_eq!(n.mps_daemons(), 0);
    // MPS beside claims without it: refused, naming one of them.
    let sc = share_of(&n, 'c', "gpu-0", "0", mps_config(30, "3Gi")).await;
    let error = n.prepare_error(&sc).await;
    assert!(
        error.contains("claim default/share-") && error.contains("shares this GPU without MPS"),
        "{error}"
    );
    assert_eq!(n.mps_daemons(), 0);
    // The whole GPU, not a share: refused while shares hold it.
    let whole = n.gpu_claim("whole", "gpu-0").await;
    let error = n.prepare_error(&whole).await;
    assert!(error.contains("already prepared for claim"), "{error}");
    n.unprepare_ok(&sa).await;
    n.unprepare_ok(&sb).await;

    // Now sc and sd, both with MPS, share one daemon with their own limits.
    n.prepare_ok(&sc).await;
    let sd = share_of(&n, 'd', "gpu-0", "0", mps_config(60, "5Gi")).await;
    n.prepare_ok(&sd).await;
    assert_eq!(n.mps_daemons(), 1);
    let env_c = env_of(&n.spec_device(&sc, "gpu-0"));
    let env_d = env_of(&n.spec_device(&sd, "gpu-0"));
    assert_mps_limits(&env_c, "3072M", 30);
    assert_mps_limits(&env_d, "5120M", 60);
    // And a claim without MPS is refused beside them.
    let se = share_of(&n, 'e', "gpu-0", "0", json!([])).await;
    let error = n.prepare_error(&se).await;
    assert!(
        error.contains("runs this GPU's MPS daemon")
            && error.contains("give this claim an MPS config too"),
        "{error}"
    );
    n.unprepare_ok(&sc).await;
    assert_eq!(n.mps_daemons(), 1, "d still uses the daemon");
    n.unprepare_ok(&sd).await;
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.exclusive_gpus().is_empty());
    n.prepare_ok(&whole).await;
    n.unprepare_ok(&whole).await;
}

/// `<N>` mode and time-slicing: the time slice is the GPU's; each claim's
/// config sets it when that claim is prepared, and unpreparing one sets it
/// back to `Default` (what docs/sharing.md says).
#[tokio::test]
async fn n_mode_time_slices_are_the_gpus() {
    let n = node("t4-inference", &["--consumable-shares=4"], DraVersion::V1).await;
    let slices = |interval: &str| {
        json!([gpu_config(
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
        )])
    };
    // The `nvidia-smi ... --set-timeslice` calls so far, each as its args.
    let set_timeslice_calls = || -> Vec<Vec<String>> {
        n.env
            .driver_root
            .nvidia_smi_calls()
            .unwrap()
            .into_iter()
            .map(|c| c.args)
            .filter(|a| a.iter().any(|x| x == "--set-timeslice"))
            .collect()
    };
    let a = share_of(&n, 'a', "gpu-1", "0", slices("Long")).await;
    let b = share_of(&n, 'b', "gpu-1", "0", slices("Short")).await;
    n.prepare_ok(&a).await;
    n.prepare_ok(&b).await;
    let set = set_timeslice_calls();
    let last = |set: &[Vec<String>]| set.last().and_then(|a| a.last().cloned());
    assert_eq!(set.len(), 2, "{set:?}");
    assert_eq!(
        last(&set).as_deref(),
        Some("1"),
        "Short, the last set: {set:?}"
    );
    n.unprepare_ok(&a).await;
    let set = set_timeslice_calls();
    assert_eq!(last(&set).as_deref(), Some("0"), "back to Default: {set:?}");
    n.unprepare_ok(&b).await;
}

/// `<N>` on the mixed node: shares of the static MIG device coexist, each
/// prepared with the MIG device; an MPS config on a share (its own daemon)
/// needs the device alone; the MIG device held whole by another claim
/// refuses shares.
#[tokio::test]
async fn n_mode_shares_a_static_mig_device() {
    let n = node("mixed", &["--consumable-shares=4"], DraVersion::V1).await;
    let mig = "gpu-1-mig-3g40gb-9-0";
    let mps = |request: &str| json!([mig_config(&[request], json!({"strategy": "MPS"}))]);
    let sa = share_of(&n, 'a', mig, "0", json!([])).await;
    let sb = share_of(&n, 'b', mig, "0", json!([])).await;
    n.prepare_ok(&sa).await;
    n.prepare_ok(&sb).await;
    let dev = n.spec_device(&sa, mig);
    assert!(dev["containerEdits"].is_object(), "{dev}");
    // An MPS config beside other shares: refused.
    let sc = share_of(&n, 'c', mig, "0", mps("share-c")).await;
    let error = n.prepare_error(&sc).await;
    assert!(
        error.contains("holds a share of this MIG device")
            && error.contains("leave the MPS config out"),
        "{error}"
    );
    for x in [&sa, &sb] {
        n.unprepare_ok(x).await;
    }
    // Alone it runs its daemon; then another share is refused beside it.
    n.prepare_ok(&sc).await;
    assert_eq!(n.mps_daemons(), 1);
    let sd = share_of(&n, 'd', mig, "0", json!([])).await;
    let error = n.prepare_error(&sd).await;
    assert!(
        error.contains("claim default/share-c")
            && error.contains("runs an MPS daemon on this MIG device"),
        "{error}"
    );
    n.unprepare_ok(&sc).await;
    assert_eq!(n.mps_daemons(), 0);
    // Held whole (an allocation without a share), shares are refused.
    let whole = n
        .claim("whole", json!([result("gpu", mig)]), json!([]))
        .await;
    n.prepare_ok(&whole).await;
    let error = n.prepare_error(&sd).await;
    assert!(
        error.contains("already prepared for claim default/whole"),
        "{error}"
    );
    n.unprepare_ok(&whole).await;
    n.prepare_ok(&sd).await;
    n.unprepare_ok(&sd).await;
}

/// `multiUser` starts the claim's daemon as a multi-user server
/// (`-d -M`), also when a dead one is started again; without it, `-d`
/// alone.
#[tokio::test]
async fn multi_user_starts_a_multi_user_server() {
    let n = node(
        "t4-inference",
        &["--mps-check-interval=100ms"],
        DraVersion::V1,
    )
    .await;
    let on = n
        .claim("on", json!([result("gpu", "gpu-1")]), multi_user(true))
        .await;
    let off = n
        .claim("off", json!([result("gpu", "gpu-2")]), multi_user(false))
        .await;
    n.prepare_ok(&on).await;
    n.prepare_ok(&off).await;
    let starts: Vec<Vec<String>> = n
        .env
        .driver_root
        .mps_control_calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.args.first().is_some_and(|a| a == "-d"))
        .map(|c| c.args)
        .collect();
    let mut starts = starts;
    starts.sort();
    assert_eq!(starts, [vec!["-d"], vec!["-d", "-M"]], "{starts:?}");
    n.kill_daemons_and_see_them_started_again();
    // Both daemons are started again (each in its own check): wait for the
    // multi-user one's second `-d -M`.
    let multi = || {
        n.env
            .driver_root
            .mps_control_calls()
            .unwrap()
            .into_iter()
            .filter(|c| c.args == ["-d", "-M"])
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while multi() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "not restarted as a multi-user server\n{}",
            n.logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(multi(), 2);
    n.unprepare_ok(&on).await;
    n.unprepare_ok(&off).await;
    assert_eq!(n.mps_daemons(), 0);
}

/// On a GPU older than Volta, `multiUser` fails the prepare with the
/// reason, and nothing is started.
#[tokio::test]
async fn multi_user_is_refused_before_volta() {
    let yaml = "driverVersion: \"580.95.05\"\ncudaDriverVersion: 13000\ngpus:\n  - {model: P4, uuid: GPU-11111111-2222-3333-4444-555555555555, pciBusId: \"0000:18:00.0\", minor: 0, numaNode: 0, pcieRoot: pci0000:17}\n";
    let n = node_yaml(yaml, &[], DraVersion::V1).await;
    let c = n
        .claim("old", json!([result("gpu", "gpu-0")]), multi_user(true))
        .await;
    let error = n.prepare_error(&c).await;
    assert!(
        error.contains(
            "mpsConfig.multiUser needs compute capability 7.0 (Volta) or later; this GPU has 6.1"
        ),
        "{error}"
    );
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.checkpoint_claims().is_empty());
    // Without multiUser the same claim is prepared.
    let ok = n
        .claim(
            "plain",
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config(json!({"strategy": "MPS"}))]),
        )
        .await;
    n.prepare_ok(&ok).await;
    n.unprepare_ok(&ok).await;
}

/// Hostile `--consumable-shares` values (flag or `CONSUMABLE_SHARES`) stop
/// the plugin with one line naming the flag and the problem, before it
/// touches anything.
#[tokio::test]
async fn malformed_consumable_shares_stop_the_plugin_with_one_line() {
    for (value, expect) in [
        ("0", "0 shares would allow no claim"),
        ("-1", "\"-1\": expected disabled, memory, unlimited"),
        ("Memory", "the modes are lowercase"),
        ("", "empty; expected disabled"),
        ("99999999999", "at most 65536 shares per device"),
        ("half", "\"half\": expected disabled"),
    ] {
        let dir = short_dir();
        let flag = format!("--consumable-shares={value}");
        let (status, stderr) = common::run_to_exit(&[&flag], dir.path());
        common::assert_one_line_error(status, &stderr, "--consumable-shares");
        assert!(stderr.contains(expect), "{value:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    let dir = short_dir();
    let (status, stderr) = common::run_to_exit(
        &["--consumable-shares=memory", "--memory-sharing=all"],
        dir.path(),
    );
    common::assert_one_line_error(status, &stderr, "cannot be used with");
    // The same from the environment (the chart's way).
    let dir = short_dir();
    let args = common::TestEnv::new(dir.path()).args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stderr) = common::run_bare(&args, &[("CONSUMABLE_SHARES", "Memory")], dir.path());
    common::assert_one_line_error(status, &stderr, "the modes are lowercase");
}
