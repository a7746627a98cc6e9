//! Unit tests: validation, command building, edits, directory bookkeeping.
//! (Tests running the fake daemon are in `daemon_tests.rs`.)

use std::collections::BTreeMap;

use super::*;

const A: &str = "GPU-9be4bcfc-49b6-4a08-b2e6-cc3ababced20";
const B: &str = "GPU-830e07bc-1e39-4f10-92bd-4acefaecbd38";

fn cfg() -> DaemonConfig {
    DaemonConfig {
        id: "claim-1".into(),
        gpu_uuids: vec![A.into(), B.into()],
        active_thread_percentage: Some(50),
        pinned_memory_limits: BTreeMap::from([(B.into(), "2G".into()), (A.into(), "512M".into())]),
        multi_user: false,
    }
}

fn control(dir: &Path) -> MpsControl {
    MpsControl::new(
        HostRoot::same(dir.join("driver")),
        HostRoot::new(dir.join("state"), "/host/state").join("mps"),
    )
    .with_shm_mode(ShmMode::Inherit)
}

#[test]
fn commands_follow_device_order_with_ordinals_and_mib() {
    assert_eq!(
        cfg().commands().unwrap(),
        [
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 512M",
            "set_default_device_pinned_mem_limit 1 2048M",
        ]
    );
    let bare = DaemonConfig {
        id: "x".into(),
        gpu_uuids: vec!["MIG-ea8d189c-bcdb-519a-a97e-8a2e7848bc1c".into()],
        ..DaemonConfig::default()
    };
    assert_eq!(bare.commands().unwrap(), Vec::<String>::new());
    assert_eq!(cfg().visible_devices(), format!("{A},{B}"));
}

#[test]
fn ids_must_be_safe_directory_names() {
    for good in ["a", "claim-1", "0b7e.share_2", &"x".repeat(128)] {
        assert_eq!(validate_id(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "-flag",
        "a/b",
        "../x",
        "a b",
        "a\nb",
        "é",
        &"x".repeat(129),
    ] {
        assert!(validate_id(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn hostile_settings_are_refused_before_anything_runs() {
    let cases: Vec<(DaemonConfig, &str)> = vec![
        (
            DaemonConfig {
                id: "../etc".into(),
                ..cfg()
            },
            "invalid MPS daemon id",
        ),
        (
            DaemonConfig {
                gpu_uuids: vec![],
                ..cfg()
            },
            "no GPU UUIDs",
        ),
        (
            DaemonConfig {
                gpu_uuids: vec![format!("{A}\nquit")],
                pinned_memory_limits: BTreeMap::new(),
                ..cfg()
            },
            "may only hold hex digits",
        ),
        (
            DaemonConfig {
                gpu_uuids: vec![format!("{A} 1")],
                pinned_memory_limits: BTreeMap::new(),
                ..cfg()
            },
            "may only hold hex digits",
        ),
        (
            DaemonConfig {
                gpu_uuids: vec!["0".into()],
                pinned_memory_limits: BTreeMap::new(),
                ..cfg()
            },
            "must start with GPU- or MIG-",
        ),
        (
            DaemonConfig {
                gpu_uuids: vec![A.into(), A.into()],
                pinned_memory_limits: BTreeMap::new(),
                ..cfg()
            },
            "listed twice",
        ),
        (
            DaemonConfig {
                gpu_uuids: (0..65).map(|i| format!("GPU-{i:x}")).collect(),
                pinned_memory_limits: BTreeMap::new(),
                ..cfg()
            },
            "at most 64",
        ),
        (
            DaemonConfig {
                active_thread_percentage: Some(101),
                ..cfg()
            },
            "above 100",
        ),
        (
            DaemonConfig {
                pinned_memory_limits: BTreeMap::from([("GPU-dead".into(), "1G".into())]),
                ..cfg()
            },
            "not one of the daemon's devices",
        ),
    ];
    for (bad, message) in cases {
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains(message), "{bad:?}: {err}");
        assert!(bad.commands().is_err());
    }
    for limit in [
        "0M",
        "0G",
        "1T",
        "1",
        "M",
        "-1M",
        "1.5G",
        "1 M",
        "1M\nquit",
        "16777217M",
        "16385G",
        "99999999999999999999M",
        "18446744073709551615G",
    ] {
        let bad = DaemonConfig {
            pinned_memory_limits: BTreeMap::from([(A.into(), limit.into())]),
            ..cfg()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("pinned memory limit"), "{limit:?}: {err}");
    }
    assert_eq!(parse_limit_mib("16384G"), Ok(MAX_PINNED_LIMIT_MIB));
    assert_eq!(parse_limit_mib("1M"), Ok(1));
}

#[test]
fn container_edits_mount_host_paths_like_nvidia() {
    let dir = tempfile::tempdir().unwrap();
    let edits = control(dir.path()).container_edits("claim-1");
    assert_eq!(
        control(dir.path())
            .checked_container_edits("claim-1")
            .unwrap(),
        edits
    );
    assert_eq!(edits.env, ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]);
    let mounts: Vec<(&str, &str)> = edits
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/host/state/mps/claim-1/pipe", "/tmp/nvidia-mps"),
            ("/host/state/mps/claim-1/shm", "/dev/shm"),
        ]
    );
    assert_eq!(edits.mounts[0].options, ["rw", "nosuid", "nodev", "bind"]);
    for bad in ["", "../../etc", "a/../../b", "/abs"] {
        let err = control(dir.path())
            .checked_container_edits(bad)
            .unwrap_err();
        assert!(matches!(err, MpsError::InvalidId { .. }), "{bad:?}");
        // The infallible form mounts nothing for such an id.
        assert_eq!(
            control(dir.path()).container_edits(bad),
            ContainerEdits::default()
        );
    }
}

#[test]
fn client_limits_are_env_for_device_zero() {
    let edits = client_limit_edits(A, 4096, 25);
    assert_eq!(checked_client_limit_edits(A, 4096, 25).unwrap(), edits);
    assert_eq!(
        edits.env,
        [
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        ]
    );
    assert!(edits.mounts.is_empty());
    for (uuid, mib, p, message) in [
        ("GPU-1,0=99999", 1, 10, "hex digits"),
        ("", 1, 10, "GPU- or MIG-"),
        (A, 0, 10, "outside"),
        (A, u64::MAX, 10, "outside"),
        (A, MAX_PINNED_LIMIT_MIB + 1, 10, "outside"),
        (A, 1, 101, "above 100"),
        (A, 1, 0, "leaves no threads"),
    ] {
        let err = checked_client_limit_edits(uuid, mib, p)
            .unwrap_err()
            .to_string();
        assert!(err.contains(message), "{uuid:?} {mib} {p}: {err}");
        // Clamped, never passed through: no UUID, no absurd value in the env.
        let clamped = client_limit_edits(uuid, mib, p).env;
        let mib_out: u64 = clamped[0]
            .strip_prefix("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=")
            .and_then(|v| v.strip_suffix('M'))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!((1..=MAX_PINNED_LIMIT_MIB).contains(&mib_out), "{clamped:?}");
        let pct_out: u8 = clamped[1]
            .strip_prefix("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=")
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!((1..=100).contains(&pct_out), "{clamped:?}");
    }
    assert_eq!(
        client_limit_edits(A, 0, 0).env,
        [
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1",
        ]
    );
}

#[test]
fn list_skips_foreign_entries_and_a_missing_dir_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mps = control(dir.path());
    assert_eq!(mps.list().unwrap(), Vec::<String>::new());
    let root = dir.path().join("state/mps");
    for d in ["b-daemon", "a-daemon", ".tmp", "bad name"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("c-file"), "").unwrap();
    assert_eq!(mps.list().unwrap(), ["a-daemon", "b-daemon"]);
}

#[test]
fn settings_files_round_trip_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mps = control(dir.path());
    let dirs = mps.dirs("claim-1").unwrap();
    assert_eq!(mps.config("claim-1").unwrap(), None);
    fs::create_dir_all(&dirs.root).unwrap();
    write_config(&dirs, &cfg()).unwrap();
    assert_eq!(mps.config("claim-1").unwrap(), Some(cfg()));

    for (text, message) in [
        ("{", "EOF"),
        (
            r#"{"id":"claim-1","gpuUuids":["GPU-1"],"evil":1}"#,
            "unknown field",
        ),
        (
            r#"{"id":"claim-1","gpuUuids":["GPU-1\nquit"]}"#,
            "hex digits",
        ),
        (
            r#"{"id":"claim-1","gpuUuids":["GPU-1"],"activeThreadPercentage":300}"#,
            "u8",
        ),
    ] {
        fs::write(&dirs.config, text).unwrap();
        let err = mps.config("claim-1").unwrap_err();
        assert!(matches!(err, MpsError::BadRecord { .. }), "{text}: {err}");
        assert!(err.to_string().contains(message), "{text}: {err}");
    }
    fs::write(&dirs.config, " ".repeat(70 * 1024)).unwrap();
    assert!(
        mps.config("claim-1")
            .unwrap_err()
            .to_string()
            .contains("larger than")
    );
}

#[test]
fn a_record_carries_host_paths() {
    let dir = tempfile::tempdir().unwrap();
    let mps = control(dir.path());
    let dirs = mps.dirs("claim-1").unwrap();
    let record = mps.record(&cfg(), 42);
    assert_eq!(record.id, "claim-1");
    assert_eq!(record.pid, Some(42));
    assert_eq!(
        record.pipe_dir,
        PathBuf::from("/host/state/mps/claim-1/pipe")
    );
    assert_eq!(record.shm_dir, PathBuf::from("/host/state/mps/claim-1/shm"));
    assert_eq!(record.log_dir, PathBuf::from("/host/state/mps/claim-1/log"));
    assert_eq!(record.gpu_uuids, [A, B]);
    assert_eq!(dirs.pipe, dir.path().join("state/mps/claim-1/pipe"));
}
