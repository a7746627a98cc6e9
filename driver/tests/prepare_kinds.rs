//! Claim preparation end to end: the real plugin binary on the fake NVML,
//! a fake driver root (recording `nvidia-smi` and a real daemonizing fake
//! MPS control daemon), stand-in device nodes, driven by the kubelet
//! simulator over its Unix sockets, with claims in the test API server read
//! through the real kube client. One test per kind of allocation, both
//! DRAPlugin versions, plus the per-claim errors.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::prepare::{
    LOCK_LOGS, VENDOR_KIND, env_of, gpu_config, gpu_config_for, long_time_slices, node, node_yaml,
    result, share, share_id, shared_claim,
};
use common::{DRIVER, NODE};
use fake_driver_root::FakeDriverRoot;
use gpu_dra_sim::kubelet::{Claim, DraVersion};
use serde_json::json;

async fn whole_gpu(version: DraVersion, flags: &[&str]) {
    let n = node("t4-inference", flags, version).await;
    let c = n.gpu_claim("whole", "gpu-1").await;
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices.len(), 1);
    let d = &r.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-1")
    );
    assert_eq!(d.request_names, ["gpu"]);
    let id = format!("{VENDOR_KIND}={}-gpu-1", c.uid);
    assert_eq!(d.cdi_device_ids, [id]);

    // The spec: the GPU's node, the control nodes, the driver's files.
    let spec = n.spec(&c);
    assert_eq!(spec["kind"], VENDOR_KIND);
    let dev = n.spec_device(&c, "gpu-1");
    let nodes = dev["containerEdits"]["deviceNodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["path"], "/dev/nvidia1");
    let common = &spec["containerEdits"];
    let control: Vec<&str> = common["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        control,
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    let mounts: Vec<&str> = common["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(
        mounts.iter().any(|m| m.ends_with("/libcuda.so.1")),
        "{mounts:?}"
    );
    assert!(
        mounts.iter().any(|m| m.ends_with("/nvidia-smi")),
        "{mounts:?}"
    );
    let driver = n.env.driver_root.path().to_str().unwrap().to_owned();
    assert!(
        common["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["hostPath"].as_str().unwrap().starts_with(&driver)),
        "host paths come from the driver root"
    );
    // No configuration asked, none applied.
    assert!(n.env.driver_root.nvidia_smi_calls().unwrap().is_empty());

    // The claim's status shows what the pod got.
    let status = n.status_devices_eventually(&c, 1).await;
    assert_eq!(status.len(), 1, "{status:?}");
    assert_eq!(status[0]["device"], "gpu-1");
    assert_eq!(status[0]["conditions"][0]["type"], "Ready");
    assert!(
        status[0]["data"]["uuid"]
            .as_str()
            .unwrap()
            .starts_with("GPU-")
    );

    // Idempotent: the same answer again, from the checkpoint.
    let again = n.prepare_ok(&c).await;
    assert_eq!(again.devices, r.devices);
    assert_eq!(n.checkpoint_claims(), std::slice::from_ref(&c.uid));

    n.unprepare_ok(&c).await;
    assert!(!n.spec_path(&c).exists());
    assert!(n.checkpoint_claims().is_empty());
    // Cleared right after the answer, not before it.
    let left = n.status_devices_eventually(&c, 0).await;
    assert!(left.is_empty(), "{left:?}\n{}", n.plugin.stderr());
    // Unprepare of what is not prepared succeeds.
    n.unprepare_ok(&c).await;
}

/// The unprepare's clear of `status.devices` writes the claim back as it
/// read it: a field this build's types do not know (`skipNodeOperations` of
/// an allocation result, new in Kubernetes 1.37) stays, so the allocation,
/// which may not change, is accepted, and our entry goes.
#[tokio::test]
async fn the_status_clear_keeps_fields_this_build_does_not_know() {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let mut newer = result("gpu", "gpu-1");
    newer["skipNodeOperations"] = json!(false);
    let c = n.claim("newer", json!([newer]), json!([])).await;
    n.prepare_ok(&c).await;
    assert_eq!(n.status_devices_eventually(&c, 1).await.len(), 1);

    n.unprepare_ok(&c).await;
    let left = n.status_devices_eventually(&c, 0).await;
    assert!(left.is_empty(), "{left:?}\n{}", n.logs());
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "resource.k8s.io",
        "v1",
        "ResourceClaim",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(n.client.clone(), "default", &resource);
    let raw = api.get(&c.name).await.unwrap();
    assert_eq!(
        raw.data["status"]["allocation"]["devices"]["results"][0]["skipNodeOperations"],
        json!(false),
        "{:?}",
        raw.data
    );
}

/// The `nvidia-uvm` nodes appear when that module is loaded, which may be
/// after the plugin's first prepare: the claims prepared after that get
/// them, not only those of a new plugin.
#[tokio::test]
async fn uvm_nodes_that_appear_later_reach_the_next_claims() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let control = |c: &Claim| -> Vec<String> {
        n.spec(c)["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap().to_owned())
            .collect()
    };
    let dev = n.env.dev_root.join("dev");
    let aside = n.dir.path().join("aside");
    std::fs::create_dir(&aside).unwrap();
    for name in ["nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::rename(dev.join(name), aside.join(name)).unwrap();
    }
    let before = n.gpu_claim("before", "gpu-0").await;
    n.prepare_ok(&before).await;
    assert_eq!(control(&before), ["/dev/nvidiactl"]);

    for name in ["nvidia-uvm", "nvidia-uvm-tools"] {
        std::fs::rename(aside.join(name), dev.join(name)).unwrap();
    }
    let after = n.gpu_claim("after", "gpu-1").await;
    n.prepare_ok(&after).await;
    let all = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];
    assert_eq!(control(&after), all);
    // The first claim's spec is its own, unchanged.
    assert_eq!(control(&before), ["/dev/nvidiactl"]);
    n.unprepare_ok(&before).await;
    n.unprepare_ok(&after).await;
}

#[tokio::test]
async fn whole_gpu_v1() {
    whole_gpu(DraVersion::V1, &[]).await;
}

#[tokio::test]
async fn whole_gpu_v1beta1() {
    whole_gpu(DraVersion::V1beta1, &[]).await;
}

/// `--runtime-threads` above 1: the same prepare on a multi-threaded
/// runtime with that many workers (the runtime's own count, logged at
/// start; the default runtime has one, the main thread).
#[tokio::test]
async fn whole_gpu_on_three_runtime_threads() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let log = n.plugin.stderr();
    assert!(log.contains("runtime_workers=1"), "{log}");
    drop(n);
    let n = node("t4-inference", &["--runtime-threads", "3"], DraVersion::V1).await;
    let log = n.plugin.stderr();
    assert!(log.contains("runtime_workers=3"), "{log}");
    drop(n);
    whole_gpu(DraVersion::V1, &["--runtime-threads", "3"]).await;
}

/// `--nvidia-cdi-hook-path` names the hook the specs run (a toolkit outside
/// the driver root, as the GPU Operator installs it), instead of the one in
/// the driver root.
#[tokio::test]
async fn the_cdi_hook_path_flag_names_the_hook_in_the_specs() {
    const HOOK: &str = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";
    let n = node(
        "t4-inference",
        &["--nvidia-cdi-hook-path", HOOK],
        DraVersion::V1,
    )
    .await;
    let c = n.gpu_claim("whole", "gpu-0").await;
    n.prepare_ok(&c).await;
    let hooks = n.spec(&c)["containerEdits"]["hooks"].clone();
    let hooks = hooks.as_array().unwrap();
    let args: Vec<&str> = hooks
        .iter()
        .map(|h| h["args"][1].as_str().unwrap())
        .collect();
    assert_eq!(args, ["create-symlinks", "update-ldcache"], "{hooks:?}");
    assert!(hooks.iter().all(|h| h["path"] == HOOK), "{hooks:?}");
    n.unprepare_ok(&c).await;
}

/// The status write runs after the answer: a plugin killed before it
/// lands writes it at its next start, for claims still prepared.
#[tokio::test]
async fn a_status_lost_in_a_crash_is_written_at_the_next_start() {
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    let kept = n.gpu_claim("kept", "gpu-0").await;
    let gone = n.gpu_claim("gone", "gpu-1").await;
    n.prepare_ok(&kept).await;
    n.prepare_ok(&gone).await;
    assert_eq!(n.status_devices_eventually(&kept, 1).await.len(), 1);
    assert_eq!(n.status_devices_eventually(&gone, 1).await.len(), 1);
    // As if the plugin died between its answer and the write: no entries.
    for c in [&kept, &gone] {
        n.remove_status_devices(c).await;
    }
    // A claim deleted while the plugin was down is skipped.
    let api: kube::Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        kube::Api::namespaced(n.client.clone(), "default");
    api.delete(&gone.name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    n.restart(&[]).await;
    let status = n.status_devices_eventually(&kept, 1).await;
    assert_eq!(status.len(), 1, "{status:?}\n{}", n.logs());
    assert_eq!(status[0]["device"], "gpu-0");
    assert!(
        n.logs()
            .contains("status.devices of prepared claims written again"),
        "{}",
        n.logs()
    );
    n.unprepare_ok(&kept).await;
    n.unprepare_ok(&gone).await;
    assert!(n.status_devices_eventually(&kept, 0).await.is_empty());
    assert!(n.checkpoint_claims().is_empty());
}

/// A claim answered again from its checkpoint entry (kubelet restarted)
/// writes no status while its entries are there, so the `Ready` condition
/// keeps the time it became true; entries removed meanwhile are written
/// again.
#[tokio::test]
async fn a_repeated_prepare_writes_the_status_only_where_it_is_missing() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n.gpu_claim("again", "gpu-0").await;
    n.prepare_ok(&c).await;
    let first = n.status_devices_eventually(&c, 1).await;
    let since = first[0]["conditions"][0]["lastTransitionTime"].clone();
    assert!(since.is_string(), "{first:?}");
    // Times have whole seconds: a write now would show a later one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    n.prepare_ok(&c).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = n.status_devices(&c).await;
    assert_eq!(now, first, "{}", n.logs());

    n.remove_status_devices(&c).await;
    n.prepare_ok(&c).await;
    let back = n.status_devices_eventually(&c, 1).await;
    assert_ne!(back[0]["conditions"][0]["lastTransitionTime"], since);
    n.unprepare_ok(&c).await;
    assert!(n.status_devices_eventually(&c, 0).await.is_empty());
}

/// A checkpoint commit that fails after the hardware is set up: the
/// claim gets the error, the MIG instance and the CDI spec are undone, the
/// status is not written, and once the disk works the prepare succeeds.
#[tokio::test]
async fn a_failed_commit_rolls_the_prepare_back() {
    let n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    let name = n.device_starting_with("gpu-0-mig-1g10gb").await;
    let c = n
        .claim("mig", json!([result("mig", &name)]), json!([]))
        .await;
    // The checkpoint's temp file cannot be created, even by root.
    let blocker = n.state_dir().join("checkpoint.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let error = n.prepare_error(&c).await;
    assert!(
        error.contains("PrepareCompleted") && error.contains("checkpoint.json.tmp"),
        "{error}\n{}",
        n.logs()
    );
    assert!(n.mig_instances().is_empty(), "{:?}", n.mig_instances());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(n.checkpoint_claims().is_empty());
    assert!(n.status_devices(&c).await.is_empty());

    std::fs::remove_dir(&blocker).unwrap();
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices[0].device_name, name);
    assert_eq!(n.mig_instances().len(), 1);
    assert_eq!(n.status_devices_eventually(&c, 1).await.len(), 1);
    n.unprepare_ok(&c).await;
    assert!(n.mig_instances().is_empty());
}

/// A claim's half-prepared entry on one GPU (its undo failed, even at the
/// plugin's start), the claim allocated to another GPU since: the next
/// prepare undoes the old entry under the old GPU's lock too, as any other
/// change to that GPU is made.
#[tokio::test]
async fn a_half_prepared_entry_on_another_gpu_is_undone_under_that_gpus_lock() {
    use gpu_kubelet_plugin::prepare::checkpoint::{Batch, ClaimState, ClaimUid};
    let mut n = node("t4-inference", &[], DraVersion::V1).await;
    // What the old entry records: a time slice set on gpu-2.
    let old = long_time_slices(&n, "old").await;
    n.prepare_ok(&old).await;
    let moved = n.gpu_claim("moved", "gpu-1").await;
    n.stop();
    n.edit_checkpoint(|store| {
        let mut stale = store.get(&ClaimUid(old.uid.clone())).unwrap();
        stale.state = ClaimState::PrepareStarted;
        stale.name = "moved".into();
        store
            .commit(
                Batch::new()
                    .remove(ClaimUid(old.uid.clone()))
                    .put(ClaimUid(moved.uid.clone()), stale),
            )
            .unwrap();
    });
    // The reset fails at the start, so the entry stays.
    n.fake_behaves(fake_driver_root::Behaviour {
        nvidia_smi_failure: Some((3, "GPU is busy".to_owned())),
        ..fake_driver_root::Behaviour::default()
    });
    n.restart(&[LOCK_LOGS]).await;
    assert_eq!(
        n.checkpoint_claims(),
        vec![moved.uid.clone()],
        "{}",
        n.logs()
    );
    n.fake_behaves(fake_driver_root::Behaviour::default());
    let mark = n.log_mark();
    n.prepare_ok(&moved).await;
    let held = n.lines_after(mark, &["GPU locks held", &moved.uid]);
    assert!(
        held.iter().any(|l| l.contains("gpus=[1, 2]")),
        "gpu-2's lock was not held: {held:?}\n{}",
        n.logs()
    );
    let dev = n.spec_device(&moved, "gpu-1");
    assert_eq!(
        dev["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia1"
    );
    // The old entry's time slice was put back.
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    let last = &calls.last().unwrap().args;
    assert!(
        last.contains(&"--set-timeslice".to_owned()) && last.last().is_some_and(|a| a == "0"),
        "{calls:?}"
    );
    n.unprepare_ok(&moved).await;
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn time_slicing_sets_and_resets_the_interval() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = long_time_slices(&n, "ts").await;
    n.prepare_ok(&c).await;
    let calls: Vec<Vec<String>> = n
        .env
        .driver_root
        .nvidia_smi_calls()
        .unwrap()
        .into_iter()
        .map(|c| c.args)
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].contains(&"--set-timeslice".to_owned()),
        "{calls:?}"
    );
    assert_eq!(calls[0].last().unwrap(), "3", "{calls:?}");
    n.unprepare_ok(&c).await;
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].args.last().unwrap(), "0", "reset to Default");
}

#[tokio::test]
async fn mps_claim_gets_a_daemon_with_its_limits_and_the_pipe() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let c = n
        .claim(
            "mps",
            json!([result("gpu", "gpu-0")]),
            json!([gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "10Gi"}}))]),
        )
        .await;
    n.prepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 1, "one control daemon");
    let commands: Vec<String> = n
        .env
        .driver_root
        .mps_commands()
        .unwrap()
        .into_iter()
        .map(|c| c.command)
        .collect();
    assert!(
        commands
            .iter()
            .any(|c| c == "set_default_active_thread_percentage 25"),
        "{commands:?}"
    );
    assert!(
        commands
            .iter()
            .any(|c| c.starts_with("set_default_device_pinned_mem_limit") && c.ends_with("10240M")),
        "{commands:?}"
    );
    let dev = n.spec_device(&c, "gpu-0");
    let env = env_of(&dev);
    assert!(
        env.iter()
            .any(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY=")),
        "{env:?}"
    );
    assert!(
        dev["containerEdits"]["mounts"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
    );
    let status = n.status_devices_eventually(&c, 1).await;
    assert!(status[0]["data"]["mpsDaemon"].is_string(), "{status:?}");
    assert!(!n.live_processes().is_empty(), "the daemon runs");
    n.unprepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 0, "daemon stopped");
    assert_eq!(n.processes(), 0, "no process left");
}

/// A prepared claim's MPS daemon that dies is started again by the
/// plugin's periodic check (`--mps-check-interval`), with the claim's
/// settings, and the unprepare stops the new one.
#[tokio::test]
async fn a_dead_mps_daemon_is_started_again_with_its_settings() {
    let n = node(
        "t4-inference",
        &["--mps-check-interval=100ms"],
        DraVersion::V1,
    )
    .await;
    let c = n.mps_claim("mps").await;
    n.prepare_ok(&c).await;
    let applied = || {
        n.env
            .driver_root
            .mps_commands()
            .unwrap()
            .into_iter()
            .filter(|c| c.command == "set_default_active_thread_percentage 25")
            .count()
    };
    assert_eq!(applied(), 1);

    n.kill_daemons_and_see_them_started_again();
    assert_eq!(applied(), 2, "the settings again\n{}", n.logs());
    n.unprepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 0, "daemon stopped");
    assert_eq!(n.processes(), 0, "no process left");
}

/// NVIDIA's driver starts one daemon per config entry, and counts
/// index-keyed per-device limits within the entry's devices, sorted by UUID.
/// Two entries with the same content are two groups: each GPU is its
/// group's device "0" and gets the limit. One entry for both requests is
/// one group: only its first GPU does.
#[tokio::test]
async fn mps_daemons_and_index_keyed_limits_follow_config_entries_not_their_content() {
    let n = node("dgx-h100", &[], DraVersion::V1).await;
    let sharing = json!({"strategy": "MPS", "mpsConfig": {
        "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}});
    let results = json!([result("a", "gpu-0"), result("b", "gpu-1")]);
    // Each daemon of the checkpoint's entries: the GPUs it serves and
    // those it was given a limit of 1 GiB for, by UUID (the daemon takes
    // devices by their place in its CUDA_VISIBLE_DEVICES), read from the
    // fake daemon's own state.
    let daemons = |n: &common::prepare::Node| -> BTreeSet<(Vec<String>, Vec<String>)> {
        let checkpoint = n.checkpoint();
        let mut found = BTreeSet::new();
        for entry in checkpoint["entries"].as_object().unwrap().values() {
            for device in entry["entry"]["devices"].as_array().unwrap() {
                let Some(pipe) = device["sharing"]["mpsDaemon"]["pipeDir"].as_str() else {
                    continue;
                };
                let state = FakeDriverRoot::mps_state(pipe.as_ref()).unwrap().unwrap();
                let visible: Vec<String> = state
                    .visible_devices
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                let limited = state
                    .pinned_mem_limits
                    .iter()
                    .map(|(place, value)| {
                        assert_eq!(value, "1024M");
                        visible[place.parse::<usize>().unwrap()].clone()
                    })
                    .collect();
                let mut served = visible.clone();
                served.sort();
                found.insert((served, limited));
            }
        }
        found
    };

    let two = n
        .claim(
            "two-entries",
            results.clone(),
            json!([
                gpu_config_for(&["a"], sharing.clone()),
                gpu_config_for(&["b"], sharing.clone())
            ]),
        )
        .await;
    n.prepare_ok(&two).await;
    assert_eq!(n.mps_daemons(), 2, "a daemon per config entry");
    let found = daemons(&n);
    assert_eq!(found.len(), 2, "{found:?}");
    for (served, limited) in &found {
        assert_eq!(served.len(), 1, "{found:?}");
        assert_eq!(
            limited, served,
            "each GPU is device 0 of its own daemon and has the limit"
        );
    }
    n.unprepare_ok(&two).await;
    assert_eq!(n.mps_daemons(), 0);

    let one = n
        .claim(
            "one-entry",
            results,
            json!([gpu_config_for(&["a", "b"], sharing)]),
        )
        .await;
    n.prepare_ok(&one).await;
    assert_eq!(n.mps_daemons(), 1, "one daemon for the entry's two GPUs");
    let found = daemons(&n);
    let [(served, limited)] = Vec::from_iter(found.clone()).try_into().unwrap();
    assert_eq!(served.len(), 2, "{found:?}");
    assert_eq!(
        limited,
        served[..1],
        "only the group's first GPU by sorted UUID has the limit"
    );
    n.unprepare_ok(&one).await;
    assert_eq!(n.processes(), 0, "no process left");
}

#[tokio::test]
async fn mps_dir_flag_puts_the_daemons_directories_there_across_a_restart() {
    let outside = tempfile::tempdir().unwrap();
    let mps_dir = outside.path().join("run-mps");
    let flag = format!("--mps-dir={}", mps_dir.display());
    let mut n = node("t4-inference", &[&flag], DraVersion::V1).await;
    let c = n.mps_claim("mps").await;
    n.prepare_ok(&c).await;
    let daemon = format!("claim-{}-0", c.uid);
    // The daemons' directories (the plugin's lock file is there too).
    let daemon_dirs = || -> Vec<String> {
        std::fs::read_dir(&mps_dir)
            .unwrap()
            .map(Result::unwrap)
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().into_string().unwrap())
            .collect()
    };
    assert_eq!(daemon_dirs(), std::slice::from_ref(&daemon), "{}", n.logs());
    assert!(
        !n.state_dir().join("mps").exists(),
        "nothing under the state dir"
    );
    // Containers mount the daemon's directories from there.
    let dev = n.spec_device(&c, "gpu-0");
    let hosts: Vec<&str> = dev["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["hostPath"].as_str().unwrap())
        .collect();
    let pipe = mps_dir.join(&daemon).join("pipe");
    assert!(
        hosts.iter().any(|host| std::path::Path::new(host) == pipe),
        "{hosts:?}"
    );
    // A restarted plugin finds the daemon there and stops it on unprepare.
    n.restart(&[]).await;
    n.unprepare_ok(&c).await;
    assert_eq!(daemon_dirs(), Vec::<String>::new(), "{}", n.logs());
    assert_eq!(n.processes(), 0, "no process left");
}

#[tokio::test]
async fn an_mps_prepare_whose_compute_mode_change_fails_leaves_no_daemon() {
    // The daemon starts while the compute mode is set (both take time);
    // the mode change fails, so the daemon that did start must be stopped.
    let yaml =
        std::fs::read_to_string(nvidia_ml::fixture::bundled_profile("t4-inference")).unwrap();
    let line = "    minor: 0\n";
    assert!(yaml.contains(line));
    let yaml = yaml.replacen(
        line,
        &format!("{line}    fail: {{nvmlDeviceSetComputeMode: NO_PERMISSION}}\n"),
        1,
    );
    let n = node_yaml(&yaml, &[], DraVersion::V1).await;
    let c = n.mps_claim("mps").await;
    let error = n.prepare_error(&c).await;
    assert!(error.contains("gpu-0"), "{error}");
    assert!(
        error.to_lowercase().contains("permission"),
        "the NVML error is named: {error}"
    );
    // The daemon was started, then stopped by the rollback.
    let starts = n.env.driver_root.mps_control_calls().unwrap();
    assert!(
        starts.iter().any(|call| call.args == ["-d"]),
        "the daemon started alongside: {starts:?}"
    );
    assert_rolled_back(&n);
}

/// After a failed MPS prepare: no daemon, process, CDI spec, checkpoint
/// entry or changed compute mode is left.
fn assert_rolled_back(n: &common::prepare::Node) {
    assert_eq!(n.mps_daemons(), 0, "{}", n.logs());
    assert_eq!(n.processes(), 0, "no process left\n{}", n.logs());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert!(
        n.checkpoint_claims().is_empty(),
        "{:?}",
        n.checkpoint_claims()
    );
    let modes = n.compute_modes();
    assert!(
        modes.values().all(|m| m == "Default"),
        "no compute mode changed, or it was restored: {modes:?}"
    );
}

#[tokio::test]
async fn an_mps_prepare_whose_daemon_fails_leaves_no_spec_and_no_mode() {
    // The CDI spec is written, and the compute mode set, while the daemon
    // starts; the start fails, so the rollback undoes both.
    let n = node("t4-inference", &[], DraVersion::V1).await;
    n.fake_behaves(fake_driver_root::Behaviour {
        mps_start_failure: Some("simulated: no MPS for you".to_owned()),
        ..fake_driver_root::Behaviour::default()
    });
    let c = n.mps_claim("mps").await;
    let error = n.prepare_error(&c).await;
    assert!(error.contains("no MPS for you"), "{error}");
    assert_rolled_back(&n);

    // Once the daemon can start, the same claim prepares, spec and all.
    n.fake_behaves(fake_driver_root::Behaviour::default());
    n.prepare_ok(&c).await;
    assert_eq!(n.cdi_files().len(), 1, "{:?}", n.cdi_files());
    assert_eq!(n.mps_daemons(), 1);
    n.unprepare_ok(&c).await;
    assert!(n.cdi_files().is_empty() && n.mps_daemons() == 0);
}

#[tokio::test]
async fn dynamic_mig_creates_and_destroys_the_instance() {
    let n = node("dgx-h100", &["--dynamic-mig"], DraVersion::V1).await;
    // Wait for the pool so the device name is one the plugin publishes.
    let slices = n.env.wait_pool(NODE, Duration::from_secs(20)).await;
    let name = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .find(|d| d.starts_with("gpu-0-mig-1g10gb"))
        .expect("a 1g.10gb placement on GPU 0");
    let c = n
        .claim("mig", json!([result("mig", &name)]), json!([]))
        .await;
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices[0].device_name, name);
    let dev = n.spec_device(&c, &name);
    let nodes: Vec<String> = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(nodes[0], "/dev/nvidia0");
    assert!(
        nodes[1].starts_with("/dev/nvidia-caps/nvidia-cap"),
        "{nodes:?}"
    );
    let caps = n.env.proc_root.join("driver/nvidia/capabilities/gpu0/mig");
    assert!(caps.exists(), "the GPU instance's capability files exist");
    let status = n.status_devices_eventually(&c, 1).await;
    assert!(
        status[0]["data"]["uuid"]
            .as_str()
            .unwrap()
            .starts_with("MIG-"),
        "{status:?}"
    );
    n.unprepare_ok(&c).await;
    let left: Vec<_> = std::fs::read_dir(&caps)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|f| !f.to_string_lossy().starts_with("gi")),
        "instance destroyed: {left:?}"
    );
}

#[tokio::test]
async fn memory_fraction_shares_one_daemon_until_the_last_claim_leaves() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let a = shared_claim(&n, 'a', "4Gi").await;
    let b = shared_claim(&n, 'b', "8Gi").await;
    let ra = n.prepare_ok(&a).await;
    assert_eq!(
        ra.devices[0].share_id.as_deref(),
        Some(share_id('a').as_str())
    );
    n.prepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 1, "one daemon for the GPU");
    let env_a = env_of(&n.spec_device(&a, "gpu-3"));
    let env_b = env_of(&n.spec_device(&b, "gpu-3"));
    assert!(
        env_a.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M".to_owned()),
        "{env_a:?}"
    );
    assert!(
        env_b.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M".to_owned()),
        "{env_b:?}"
    );
    // A T4 has 15 GiB (15,360 MiB) in the profile: 4 GiB is 26.7 %,
    // rounded down so the shares' threads add up to no more than their
    // memory.
    assert!(
        env_a.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26".to_owned()),
        "{env_a:?}"
    );
    n.unprepare_ok(&a).await;
    assert_eq!(n.mps_daemons(), 1, "b still uses the daemon");
    n.unprepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 0, "stopped after the last claim");
    assert_eq!(n.processes(), 0, "no process left");
}

/// Two shares of one GPU in one claim: its containers reach the GPU's one
/// daemon and get the sum as their limit, on both CDI devices alike (the
/// runtime merges their environments, the last value winning).
#[tokio::test]
async fn a_claim_with_two_shares_of_one_gpu_gets_their_sum() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let c = n
        .claim(
            "two",
            json!([
                share("small", "gpu-3", &share_id('a'), "4Gi"),
                share("large", "gpu-3", &share_id('b'), "8Gi")
            ]),
            json!([]),
        )
        .await;
    let r = n.prepare_ok(&c).await;
    assert_eq!(r.devices.len(), 2);
    let spec = n.spec(&c);
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{spec}");
    for d in devices {
        let env = env_of(d);
        for want in [
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M",
            // 12 GiB of 15 GiB.
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80",
        ] {
            assert!(env.contains(&want.to_owned()), "{}: {env:?}", d["name"]);
        }
    }
    assert_eq!(n.mps_daemons(), 1);
    n.unprepare_ok(&c).await;
    assert_eq!(n.mps_daemons(), 0);
}

/// Shares of two GPUs in one claim would need two daemons at one pipe
/// directory in the container: refused before anything is set up.
#[tokio::test]
async fn a_claim_with_shares_of_two_gpus_is_refused_and_leaves_nothing() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let c = n
        .claim(
            "spread",
            json!([
                share("one", "gpu-2", &share_id('a'), "4Gi"),
                share("other", "gpu-3", &share_id('b'), "4Gi")
            ]),
            json!([]),
        )
        .await;
    let error = n.prepare_error(&c).await;
    assert!(
        error.contains("memory shares of two GPUs (gpu-2 and gpu-3)")
            && error.contains("separate claims"),
        "{error}"
    );
    assert!(n.checkpoint_claims().is_empty(), "{}", n.checkpoint());
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    assert_eq!(n.mps_daemons(), 0);
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
}

/// A share whose failed prepare could not be undone in full keeps its
/// entry, with the compute-mode change but no daemon. Another share has
/// since taken the GPU's daemon; undoing the first (here at the plugin's
/// start) leaves the mode to the share that uses it.
#[tokio::test]
async fn undoing_a_failed_share_leaves_the_compute_mode_to_the_share_using_the_gpu() {
    use gpu_kubelet_plugin::prepare::checkpoint::{Batch, ClaimState, ClaimUid, ComputeModeChange};
    let mut n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let a = shared_claim(&n, 'a', "4Gi").await;
    n.prepare_ok(&a).await;
    assert_eq!(n.exclusive_gpus().len(), 1, "{:?}", n.compute_modes());
    n.stop();
    n.edit_checkpoint(|store| {
        let mut failed = store.get(&ClaimUid(a.uid.clone())).unwrap();
        failed.state = ClaimState::PrepareStarted;
        failed.name = "share-f".into();
        failed.cdi_spec_paths.clear();
        let record = &mut failed.devices[0];
        record.sharing.mps_daemon = None;
        record.sharing.compute_mode = Some(ComputeModeChange {
            set: "ExclusiveProcess".into(),
            previous: "Default".into(),
        });
        store
            .commit(Batch::new().put(ClaimUid("f-uid".into()), failed))
            .unwrap();
    });
    n.restart(&[]).await;
    assert_eq!(n.checkpoint_claims(), vec![a.uid.clone()], "{}", n.logs());
    assert_eq!(
        n.exclusive_gpus().len(),
        1,
        "the mode was restored under the share using the GPU: {:?}\n{}",
        n.compute_modes(),
        n.logs()
    );
    assert_eq!(n.mps_daemons(), 1);
    // The last share out restores it.
    n.unprepare_ok(&a).await;
    assert!(n.exclusive_gpus().is_empty(), "{:?}", n.compute_modes());
    assert_eq!(n.mps_daemons(), 0);
}

#[tokio::test]
async fn a_share_whose_daemon_start_fails_leaves_the_gpu_to_the_claims_sharing_it() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    let a = shared_claim(&n, 'a', "4Gi").await;
    let b = shared_claim(&n, 'b', "4Gi").await;
    n.prepare_ok(&a).await;
    let exclusive = |n: &common::prepare::Node| n.exclusive_gpus().len();
    assert_eq!(exclusive(&n), 1, "{:?}", n.compute_modes());
    // The second share cannot reach the daemon: its prepare fails and
    // rolls back, but the GPU's mode and daemon belong to the first too.
    let program = n
        .env
        .driver_root
        .path()
        .join("usr/bin/nvidia-cuda-mps-control");
    let hidden = program.with_extension("hidden");
    std::fs::rename(&program, &hidden).unwrap();
    let r = n.prepare(std::slice::from_ref(&b)).await;
    std::fs::rename(&hidden, &program).unwrap();
    let error = r[&b.uid].error.clone().unwrap_or_default();
    assert!(error.contains("nvidia-cuda-mps-control"), "{error}");
    assert_eq!(n.checkpoint_claims(), vec![a.uid.clone()]);
    assert_eq!(
        exclusive(&n),
        1,
        "the mode stays for the first share: {:?}\n{}",
        n.compute_modes(),
        n.logs()
    );
    assert_eq!(n.mps_daemons(), 1);
    // Once it can, the second share joins; the last one out restores.
    n.prepare_ok(&b).await;
    n.unprepare_ok(&a).await;
    assert_eq!(exclusive(&n), 1);
    n.unprepare_ok(&b).await;
    assert_eq!(exclusive(&n), 0, "{:?}", n.compute_modes());
    assert_eq!(n.mps_daemons(), 0);
}

#[tokio::test]
async fn a_refused_time_slice_fails_the_claim_and_leaves_the_gpu_free() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    n.fake_behaves(fake_driver_root::Behaviour {
        nvidia_smi_failure: Some((3, "Setting time slice is Not Supported".to_owned())),
        ..fake_driver_root::Behaviour::default()
    });
    let ts = long_time_slices(&n, "ts").await;
    let error = n.prepare_error(&ts).await;
    assert!(error.contains("Not Supported"), "{error}");
    assert!(
        n.checkpoint_claims().is_empty(),
        "{:?}",
        n.checkpoint_claims()
    );
    assert!(n.cdi_files().is_empty(), "{:?}", n.cdi_files());
    // The refused set is not "reset" (it would be refused the same way).
    let calls = n.env.driver_root.nvidia_smi_calls().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    // The GPU is free for the next claim.
    n.fake_behaves(fake_driver_root::Behaviour::default());
    let whole = n.gpu_claim("whole", "gpu-2").await;
    n.prepare_ok(&whole).await;
    n.unprepare_ok(&whole).await;
    n.unprepare_ok(&ts).await;
}

#[tokio::test]
async fn an_empty_gpu_config_is_accepted_on_a_memory_shared_gpu_but_time_slicing_is_not() {
    let n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    // `GpuConfig` with nothing set (normalized to time-slicing, default
    // interval: no change).
    let mut empty = gpu_config(json!(null));
    empty["opaque"]["parameters"]
        .as_object_mut()
        .unwrap()
        .remove("sharing");
    let plain = n
        .claim(
            "plain",
            json!([share(
                "a",
                "gpu-1",
                "11111111-0000-4000-8000-0000000000a1",
                "2Gi"
            )]),
            json!([empty]),
        )
        .await;
    n.prepare_ok(&plain).await;
    let mps = n
        .claim(
            "mps",
            json!([share(
                "b",
                "gpu-1",
                "11111111-0000-4000-8000-0000000000b1",
                "2Gi"
            )]),
            json!([gpu_config(
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}})
            )]),
        )
        .await;
    let error = n.prepare_error(&mps).await;
    assert!(error.contains("remove the time-slicing config"), "{error}");
    assert_eq!(n.checkpoint_claims(), vec![plain.uid.clone()]);
    n.unprepare_ok(&plain).await;
    assert_eq!(n.mps_daemons(), 0);
}

#[tokio::test]
async fn a_changed_mps_dir_takes_over_running_daemons_where_they_were_started() {
    let outside = tempfile::tempdir().unwrap();
    let new_dir = outside.path().join("run-mps");
    let mut n = node("t4-inference", &["--memory-sharing=all"], DraVersion::V1).await;
    // A 4 GiB share of gpu-3, named `share-<n>`.
    async fn share(n: &common::prepare::Node, name: char) -> Claim {
        shared_claim(n, name, "4Gi").await
    }
    let a = share(&n, 'a').await;
    n.prepare_ok(&a).await;
    let old_pipe = n.state_dir().join("mps/shared-gpu3/pipe");
    assert!(old_pipe.is_dir(), "{}", n.logs());

    // The plugin again, with another --mps-dir: the GPU's daemon runs on.
    let flag = format!("--mps-dir={}", new_dir.display());
    n.restart_with_flags(&["--memory-sharing=all", &flag]).await;
    assert!(
        n.logs()
            .contains("MPS daemons of an earlier --mps-dir taken over"),
        "{}",
        n.logs()
    );
    let b = share(&n, 'b').await;
    n.prepare_ok(&b).await;
    let starts = |n: &common::prepare::Node| {
        let calls = n.env.driver_root.mps_control_calls().unwrap();
        calls.iter().filter(|c| c.args == ["-d"]).count()
    };
    assert_eq!(starts(&n), 1, "b joined the running daemon\n{}", n.logs());
    let mounts = n.spec_device(&b, "gpu-3")["containerEdits"]["mounts"].clone();
    assert!(
        mounts
            .as_array()
            .unwrap()
            .iter()
            .any(|m| std::path::Path::new(m["hostPath"].as_str().unwrap()) == old_pipe),
        "{mounts}"
    );
    // The last claim's unprepare stops it there.
    n.unprepare_ok(&a).await;
    assert!(old_pipe.is_dir(), "b still uses it");
    n.unprepare_ok(&b).await;
    assert_eq!(n.mps_daemons(), 0, "{}", n.logs());
    assert_eq!(n.processes(), 0, "no process left");
    // The next claim's daemon starts under the new directory.
    let c = share(&n, 'c').await;
    n.prepare_ok(&c).await;
    assert!(new_dir.join("shared-gpu3/pipe").is_dir(), "{}", n.logs());
    n.unprepare_ok(&c).await;
    assert_eq!(n.processes(), 0, "no process left");
    assert_eq!(starts(&n), 2);
}

#[tokio::test]
async fn a_device_is_never_given_to_two_claims_but_admin_access_may_watch() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let first = n.gpu_claim("first", "gpu-0").await;
    let second = n.gpu_claim("second", "gpu-0").await;
    let mut admin_result = result("mon", "gpu-0");
    admin_result["adminAccess"] = json!(true);
    let admin = n.claim("monitor", json!([admin_result]), json!([])).await;
    n.prepare_ok(&first).await;
    let r = n.prepare(std::slice::from_ref(&second)).await;
    let e = r[&second.uid].error.clone().unwrap();
    assert!(
        e.contains("already prepared for claim default/first"),
        "{e}"
    );
    assert!(
        !n.spec_path(&second).exists(),
        "nothing left by the refused claim"
    );
    n.prepare_ok(&admin).await;
    n.unprepare_ok(&first).await;
    n.prepare_ok(&second).await;
    n.unprepare_ok(&second).await;
    n.unprepare_ok(&admin).await;
    assert!(n.checkpoint_claims().is_empty());
}

#[tokio::test]
async fn unusable_claims_get_precise_per_claim_errors_and_leave_nothing() {
    let n = node("t4-inference", &[], DraVersion::V1).await;
    let ok = n.gpu_claim("ok", "gpu-0").await;
    let foreign = n
        .claim(
            "elsewhere",
            json!([{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}]),
            json!([]),
        )
        .await;
    let unknown = n.gpu_claim("unknown", "gpu-9").await;
    let bad_config = n
        .claim(
            "bad-config",
            json!([result("gpu", "gpu-1")]),
            json!([gpu_config(json!({"strategy": "Sometimes"}))]),
        )
        .await;
    let missing = Claim::new("default", "missing", "00000000-0000-4000-8000-00000000dead");
    let renamed = Claim::new("default", "ok", "00000000-0000-4000-8000-00000000beef");
    let all = [
        ok.clone(),
        foreign.clone(),
        unknown.clone(),
        bad_config.clone(),
        missing.clone(),
        renamed.clone(),
    ];
    let r = n.prepare(&all).await;
    assert_eq!(r[&ok.uid].error, None);
    let err = |c: &Claim| r[&c.uid].error.clone().unwrap_or_default();
    assert!(
        err(&foreign).contains("on node node-a") && err(&foreign).contains("node-b"),
        "{}",
        err(&foreign)
    );
    assert!(err(&unknown).contains("\"gpu-9\""), "{}", err(&unknown));
    assert!(
        err(&bad_config).contains("Sometimes"),
        "{}",
        err(&bad_config)
    );
    assert!(err(&missing).contains("not found"), "{}", err(&missing));
    assert!(
        err(&renamed).contains("deleted and re-created"),
        "{}",
        err(&renamed)
    );
    assert_eq!(n.checkpoint_claims(), std::slice::from_ref(&ok.uid));
    let specs = std::fs::read_dir(&n.env.cdi_root).unwrap().count();
    assert_eq!(specs, 1, "only the good claim has a spec");
}
