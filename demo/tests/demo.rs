//! Runs `gpu-dra-demo` as a user would and checks what it reports: the real
//! plugin code against the fake NVML library, the API server stand-in and
//! the kubelet simulator; the example claims of `demo/` admitted or denied
//! by the webhook, placed by the allocator, prepared and unprepared; and
//! that nothing is left behind, checked again here on the disk and in the
//! process table rather than taken from the report.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

fn demo_in(tmpdir: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpu-dra-demo"));
    c.args(args).env_remove("RUST_LOG");
    if let Some(dir) = tmpdir {
        c.env("TMPDIR", dir);
    }
    c.output().expect("run gpu-dra-demo")
}

fn demo(args: &[&str]) -> std::process::Output {
    demo_in(None, args)
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the JSON report")
}

fn demo_json(args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    json_of(&demo(&all))
}

/// The default demo's report, run once for the tests that read it.
fn default_report() -> &'static Value {
    static REPORT: OnceLock<Value> = OnceLock::new();
    REPORT.get_or_init(|| demo_json(&[]))
}

/// The claim named `name` in a report.
fn claim<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no claim {name} in {report}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// Devices allocated to a claim.
fn allocated(c: &Value) -> Vec<&str> {
    c["allocation"]
        .as_array()
        .map(|a| a.iter().map(|r| r["device"].as_str().unwrap()).collect())
        .unwrap_or_default()
}

#[test]
fn default_demo_publishes_a_dgx_h100_pool_and_cleans_up() {
    let report = default_report();
    assert_eq!(report["profile"], "dgx-h100");
    assert_eq!(report["registration"]["draVersion"], "v1.DRAPlugin");
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    // NVSwitch: one NVLink domain for all eight GPUs.
    let domain = &gpus[0]["nvlinkDomain"];
    assert!(domain.is_string());
    assert!(gpus.iter().all(|g| &g["nvlinkDomain"] == domain));
    // The last GPU is shared by memory fraction: it has no MIG placements,
    // the seven others one counter set each.
    assert_eq!(report["memorySharing"], serde_json::json!([7]));
    assert_eq!(gpus[7]["memorySharing"], true);
    assert!(gpus[..7].iter().all(|g| g["memorySharing"] == false));
    assert_eq!(report["pool"]["byType"]["gpu"], 8);
    assert!(report["pool"]["byType"]["mig"].as_u64().unwrap() > 8);
    assert_eq!(report["pool"]["counterSets"], 7);
    assert_eq!(report["cleanup"]["slicesLeft"], 0);
    assert_eq!(report["cleanup"]["claimsLeft"], 0);
    assert_eq!(report["cleanup"]["tempDirRemoved"], true);
    assert_eq!(
        report["cleanup"]["socketsLeft"].as_array().unwrap().len(),
        0
    );
}

#[test]
fn every_example_claim_reaches_its_outcome_in_manifest_order() {
    let report = default_report();
    let walked: Vec<(&str, &str)> = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        walked,
        [
            ("whole-gpu", "prepared"),
            ("nvlink-pair", "prepared"),
            ("mig-1g10gb", "prepared"),
            ("mps-gpu", "prepared"),
            ("memory-share-a", "prepared"),
            ("memory-share-b", "prepared"),
            ("invalid-selector", "rejected"),
            ("too-much-memory", "unsatisfiable"),
        ]
    );
    // Every prepared claim: its devices as allocated, CDI ids the runtime
    // resolved in the spec files, status.devices published, and no two
    // claims on one device unless it is shared.
    let mut exclusive: Vec<&str> = Vec::new();
    for c in report["claims"].as_array().unwrap() {
        if c["outcome"] != "prepared" {
            continue;
        }
        let devices = c["prepared"]["devices"].as_array().unwrap();
        let names: Vec<&str> = devices
            .iter()
            .map(|d| d["device"].as_str().unwrap())
            .collect();
        assert_eq!(names, allocated(c), "{c}");
        for d in devices {
            let ids = strings(&d["cdiDeviceIds"]);
            let uid = c["uid"].as_str().unwrap();
            assert_eq!(
                ids,
                [format!(
                    "k8s.gpu.nvidia.com/claim={uid}-{}",
                    d["device"].as_str().unwrap()
                )]
            );
            assert!(!strings(&d["deviceNodes"]).is_empty(), "{d}");
            if d["shareID"].is_null() {
                exclusive.push(d["device"].as_str().unwrap());
            }
        }
        assert_eq!(c["statusDevices"], devices.len(), "{c}");
        let common = &c["prepared"]["claimEdits"];
        assert_eq!(
            strings(&common["deviceNodes"]),
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert!(common["mounts"].as_u64().unwrap() > 0, "{common}");
    }
    let mut unique = exclusive.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), exclusive.len(), "{exclusive:?}");
}

#[test]
fn nvlink_pair_shares_a_domain_and_mig_gets_a_created_instance() {
    let report = default_report();
    let pair = allocated(claim(report, "nvlink-pair"));
    assert_eq!(pair.len(), 2);
    let domain = |device: &str| {
        report["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["device"] == device)
            .unwrap()["nvlinkDomain"]
            .clone()
    };
    assert_eq!(domain(pair[0]), domain(pair[1]));

    let mig = claim(report, "mig-1g10gb");
    let device = &mig["prepared"]["devices"][0];
    assert!(
        device["device"].as_str().unwrap().contains("-mig-1g10gb-"),
        "{device}"
    );
    let nodes = strings(&device["deviceNodes"]);
    assert_eq!(nodes.len(), 3, "the parent GPU and two capability nodes");
    assert!(
        nodes[1].starts_with("/dev/nvidia-caps/nvidia-cap"),
        "{nodes:?}"
    );
    let on_node = strings(&mig["prepared"]["onTheNode"]);
    assert!(
        on_node
            .iter()
            .any(|l| l.starts_with("MIG device MIG-") && l.contains("created")),
        "{on_node:?}"
    );
}

#[test]
fn mps_and_memory_shares_carry_their_limits() {
    let report = default_report();
    let mps = claim(report, "mps-gpu");
    let env = strings(&mps["prepared"]["devices"][0]["env"]);
    assert!(
        env.iter()
            .any(|e| e.starts_with("CUDA_MPS_PIPE_DIRECTORY=")),
        "{env:?}"
    );
    // The daemon holds the claim's settings (read from the running daemon).
    let on_node = strings(&mps["prepared"]["onTheNode"]).join("; ");
    assert!(on_node.contains("default active threads 25%"), "{on_node}");
    assert!(on_node.contains("=10240M"), "{on_node}");

    let a = claim(report, "memory-share-a");
    let b = claim(report, "memory-share-b");
    assert_eq!(allocated(a), allocated(b), "both shares on one GPU");
    assert_eq!(allocated(a), ["gpu-7"], "the GPU shared by memory fraction");
    let share = |c: &Value| c["allocation"][0]["shareID"].as_str().unwrap().to_owned();
    assert_ne!(share(a), share(b));
    assert_eq!(
        a["allocation"][0]["consumedCapacity"]["memory"],
        "4294967296"
    );
    assert_eq!(
        b["allocation"][0]["consumedCapacity"]["memory"],
        "8589934592"
    );
    let env = |c: &Value| {
        strings(&c["prepared"]["devices"][0]["env"])
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(
        env(a).contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M".to_owned()),
        "{:?}",
        env(a)
    );
    assert!(
        env(b).contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M".to_owned()),
        "{:?}",
        env(b)
    );
}

#[test]
fn the_invalid_claim_gets_the_webhooks_message_and_the_big_one_an_explanation() {
    let report = default_report();
    let invalid = claim(report, "invalid-selector");
    assert_eq!(invalid["admission"]["allowed"], false);
    assert_eq!(invalid["admission"]["code"], 422);
    assert!(invalid["uid"].is_null(), "never stored");
    let message = invalid["admission"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "ResourceClaim \"invalid-selector\" is invalid for driver gpu.nvidia.com (1 error):"
        ),
        "{message}"
    );
    assert!(message.contains("did you mean `productName`?"), "{message}");

    let big = claim(report, "too-much-memory");
    assert!(big["uid"].is_string(), "stored, pending");
    let summary = big["explanation"]["summary"].as_str().unwrap();
    assert!(summary.contains("quantity('256Gi')"), "{summary}");
    assert!(summary.contains("closest device `gpu-"), "{summary}");
    let requests = strings(&big["explanation"]["requests"]);
    assert!(
        requests[0].contains("-> 0 pass selector 1 of request `gpu`"),
        "{requests:?}"
    );
}

/// The health part: a GPU no claim holds falls off the bus, every device
/// on it is tainted in the published slice and Unhealthy to kubelet, a
/// claim for it is not placed; once it is back, not before the quiet
/// period, the taints are gone and the claim is placed on it.
#[test]
fn a_lost_gpu_is_tainted_refused_and_recovers_after_the_quiet_period() {
    let report = default_report();
    let health = &report["health"];
    let minor = health["gpu"]["minor"].as_u64().unwrap();
    let device = format!("gpu-{minor}");
    assert_eq!(health["gpu"]["device"], device.as_str());
    // No walked claim holds it.
    for c in report["claims"].as_array().unwrap() {
        assert!(
            allocated(c)
                .iter()
                .all(|d| d.split('-').nth(1) != Some(&minor.to_string())),
            "{c}"
        );
    }
    assert_eq!(
        strings(&health["injected"]),
        [format!("xid {minor} 79"), format!("lose {minor}")]
    );
    // Every device on the GPU (the full GPU and its MIG placements) has
    // NVIDIA's gpu-lost and xid=79 taints, NoSchedule.
    let tainted = health["taints"].as_array().unwrap();
    let on_gpu = report["pool"]["devices"].as_u64().unwrap();
    assert!(
        tainted.len() > 1 && (tainted.len() as u64) < on_gpu,
        "{tainted:?}"
    );
    for d in tainted {
        let name = d["device"].as_str().unwrap();
        assert!(
            name == device || name.starts_with(&format!("{device}-mig-")),
            "{name}"
        );
        let keys: Vec<(&str, &str, &str)> = d["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap(),
                    t["value"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap(),
                )
            })
            .collect();
        assert!(
            keys.contains(&("gpu.nvidia.com/gpu-lost", "", "NoSchedule")),
            "{name}: {keys:?}"
        );
        assert!(
            keys.contains(&("gpu.nvidia.com/xid", "79", "NoSchedule")),
            "{name}: {keys:?}"
        );
    }
    assert_eq!(health["view"]["state"], "Unschedulable");
    assert_eq!(
        health["view"]["devices"].as_array().unwrap().len(),
        tainted.len()
    );
    assert!(
        health["healthMessage"].as_str().unwrap().contains("XID 79"),
        "{health}"
    );
    // The events path: the taint within a second (goal of issue #43).
    assert!(health["taintMs"].as_f64().unwrap() < 1000.0, "{health}");
    // The allocator refuses a claim for exactly that GPU, for its taints.
    assert_eq!(health["whileTainted"]["placed"], false);
    let why = strings(&health["whileTainted"]["explanation"]).join("\n");
    assert!(why.contains("1 tainted"), "{why}");
    // Recovery: not before the quiet period, and then clean. The quiet
    // period runs from the last poll that still saw the GPU lost, up to one
    // poll before the restore the demo times from.
    assert_eq!(health["quietPeriodS"], 2.0);
    let quiet_ms = health["quietPeriodS"].as_f64().unwrap() * 1000.0;
    let poll_ms = health["pollIntervalS"].as_f64().unwrap() * 1000.0;
    assert!(poll_ms > 0.0 && poll_ms < quiet_ms, "{health}");
    let untaint = health["untaintMs"].as_f64().unwrap();
    assert!(
        untaint >= quiet_ms - poll_ms,
        "recovered after {untaint} ms, quiet period {quiet_ms} ms, poll {poll_ms} ms"
    );
    assert_eq!(health["viewAfter"]["state"], "NoTaints");
    assert_eq!(health["afterRecovery"]["placed"], true);
    assert_eq!(
        strings(&health["afterRecovery"]["devices"]),
        [device.as_str()]
    );
}

/// A quiet period outside the plugin's range is refused by the demo.
#[test]
fn a_quiet_period_out_of_range_is_a_flag_error() {
    for bad in ["500ms", "2h", "soon", ""] {
        let out = demo(&["--health-quiet-period", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--health-quiet-period"), "{bad}: {err}");
    }
}

#[test]
fn the_proof_saw_the_state_before_and_none_after() {
    let cleanup = &default_report()["cleanup"];
    assert_eq!(cleanup["unprepared"], 6);
    let before = &cleanup["before"];
    for (key, at_least) in [
        ("cdiSpecs", 6),
        ("migCapabilities", 1),
        ("migInstances", 1),
        ("mpsDaemonDirs", 2),
        ("processes", 2),
        ("checkpointEntries", 6),
        ("checkpointFileEntries", 6),
    ] {
        let n = before[key].as_array().unwrap().len();
        assert!(n >= at_least, "{key}: {n} before unprepare: {before}");
    }
    let after = &cleanup["after"];
    for (key, value) in after.as_object().unwrap() {
        assert_eq!(value, &serde_json::json!([]), "{key} after unprepare");
    }
}

#[test]
fn t4_node_shows_missing_hardware_as_unsatisfiable_and_leaves_its_tmpdir_empty() {
    let tmpdir = tempfile::tempdir().unwrap();
    let out = demo_in(
        Some(tmpdir.path()),
        &["--profile", "t4-inference", "--output", "json"],
    );
    let report = json_of(&out);
    let gpus = report["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 4);
    assert!(gpus.iter().all(|g| g["mig"] == "not capable"));
    let mut domains: Vec<&str> = gpus
        .iter()
        .map(|g| g["nvlinkDomain"].as_str().unwrap())
        .collect();
    domains.sort_unstable();
    domains.dedup();
    assert_eq!(domains.len(), 4, "no NVLink: each GPU is its own domain");
    assert_eq!(report["pool"]["byType"]["gpu"], 4);
    assert!(report["pool"]["byType"]["mig"].is_null());

    for (name, outcome) in [
        ("whole-gpu", "prepared"),
        ("nvlink-pair", "unsatisfiable"),
        ("mig-1g10gb", "unsatisfiable"),
        ("mps-gpu", "prepared"),
        ("memory-share-a", "prepared"),
        ("memory-share-b", "prepared"),
        ("invalid-selector", "rejected"),
        ("too-much-memory", "unsatisfiable"),
    ] {
        assert_eq!(claim(&report, name)["outcome"], outcome, "{name}");
    }
    let nvlink = claim(&report, "nvlink-pair")["explanation"]["summary"]
        .as_str()
        .unwrap();
    assert!(nvlink.contains("nvlinkCount > 0"), "{nvlink}");
    let mig = claim(&report, "mig-1g10gb")["explanation"]["summary"]
        .as_str()
        .unwrap();
    assert!(mig.contains("1g.10gb.mig.nvidia.com"), "{mig}");

    // The run's directory was under TMPDIR, and it is gone with all it held.
    let temp = report["cleanup"]["tempDir"].as_str().unwrap();
    assert!(Path::new(temp).starts_with(tmpdir.path()), "{temp}");
    let left: Vec<_> = std::fs::read_dir(tmpdir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

/// Processes whose command line mentions `dir`.
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.to_str().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmd| cmd.contains(needle))
        .collect()
}

#[test]
fn a_kept_temp_dir_holds_no_prepared_state_after_the_run() {
    let tmpdir = tempfile::tempdir().unwrap();
    let out = demo_in(
        Some(tmpdir.path()),
        &["--profile", "mixed", "--keep-temp-dir", "--output", "json"],
    );
    let report = json_of(&out);
    let root = Path::new(report["cleanup"]["tempDir"].as_str().unwrap()).to_path_buf();
    assert!(root.starts_with(tmpdir.path()), "{}", root.display());
    assert!(root.is_dir(), "kept");
    assert_eq!(report["cleanup"]["tempDirRemoved"], false);

    // Things did happen there: a MIG instance, MPS daemons, CDI specs.
    assert_eq!(claim(&report, "mig-1g10gb")["outcome"], "prepared");
    assert_eq!(claim(&report, "mps-gpu")["outcome"], "prepared");
    let calls = std::fs::read_to_string(root.join("driver/var/log/fake-driver/calls.log")).unwrap();
    assert!(calls.contains("nvidia-cuda-mps-control"), "{calls}");

    // ... and none of it is left.
    let cdi: Vec<_> = std::fs::read_dir(root.join("cdi"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(cdi.is_empty(), "CDI specs left: {cdi:?}");
    let caps = root.join("proc/driver/nvidia/capabilities");
    for gpu in std::fs::read_dir(&caps).unwrap().map(|e| e.unwrap().path()) {
        let mig = gpu.join("mig");
        if let Ok(entries) = std::fs::read_dir(&mig) {
            let instances: Vec<_> = entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("gi"))
                .collect();
            assert!(instances.is_empty(), "{}: {instances:?}", mig.display());
        }
    }
    let nodes: Vec<String> = std::fs::read_dir(root.join("devroot/dev/nvidia-caps"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix("nvidia-cap")
                .and_then(|m| m.parse::<u32>().ok())
                .is_some_and(|m| m >= 3)
        })
        .collect();
    assert!(nodes.is_empty(), "MIG capability nodes left: {nodes:?}");
    let state = root.join("plugins/gpu.nvidia.com");
    let mps: Vec<_> = std::fs::read_dir(state.join("mps"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(mps.is_empty(), "MPS daemon directories left: {mps:?}");
    let checkpoint: Value =
        serde_json::from_slice(&std::fs::read(state.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(checkpoint["entries"], serde_json::json!({}), "{checkpoint}");
    let procs = processes_mentioning(&root);
    assert!(procs.is_empty(), "processes left: {procs:?}");
}

#[test]
fn static_mig_mode_publishes_whole_gpus_only_and_the_mig_claim_cannot_fit() {
    let report = demo_json(&["--dynamic-mig", "false"]);
    assert_eq!(report["pool"]["devices"], 8);
    assert_eq!(report["pool"]["counterSets"], 0);
    let mig = claim(&report, "mig-1g10gb");
    assert_eq!(mig["outcome"], "unsatisfiable");
    assert!(
        mig["explanation"]["summary"]
            .as_str()
            .unwrap()
            .contains("0 of 8 devices"),
        "{mig}"
    );
}

#[test]
fn text_output_has_tables_claims_and_the_cleanup_verdict() {
    let out = demo(&["--profile", "pcie-a100-bridged"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "GPUs found",
        "NVIDIA A100-PCIE-40GB",
        "ResourceSlices published",
        "==> claim whole-gpu (a whole GPU, demo/whole-gpu.yaml) ... prepared",
        "    CDI ID        k8s.gpu.nvidia.com/claim=",
        "every container of the claim also gets: device nodes /dev/nvidiactl",
        "==> claim invalid-selector",
        "the webhook denied it:",
        "the allocator cannot place it:",
        "What the prepared claims left on the node, before and after unprepare",
        "nothing left behind",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    assert!(!text.contains("LEFT"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no colour when stdout is not a terminal"
    );
}

#[test]
fn unknown_profile_is_a_one_line_error() {
    let out = demo(&["--profile", "no-such-machine"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: unknown profile \"no-such-machine\""),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn malformed_profile_file_is_reported_not_panicked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "driverVersion: [\n").unwrap();
    let tmpdir = tempfile::tempdir().unwrap();
    let out = demo_in(Some(tmpdir.path()), &["--profile", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmpdir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        left.is_empty(),
        "a failed run leaves nothing either: {left:?}"
    );
}
