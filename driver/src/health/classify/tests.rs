//! Unit tests of the `classify` module: the XID table with and without a
//! recovery action, the admin overrides, and the flag parsers with hostile
//! input.

use std::time::{Duration, UNIX_EPOCH};

use super::*;

fn policy() -> Policy {
    Policy::default()
}

fn set(xids: &[u64]) -> BTreeSet<u64> {
    xids.iter().copied().collect()
}

#[test]
fn catalog_fallback_without_recovery_action() {
    let p = policy();
    // (xid, fatal, implied)
    let table: &[(u64, bool, Option<Implied>)] = &[
        // NVIDIA's default ignore list: informational, even 109 (RESET_GPU).
        (13, false, None),
        (31, false, None),
        (43, false, None),
        (45, false, None),
        (68, false, None),
        (109, false, None),
        // RESTART_APP and IGNORE classes.
        (94, false, None),
        (8, false, None),
        (63, false, None),
        (92, false, None),
        // RESET_GPU and XID 48.
        (48, true, Some(Implied::Reset("GPU_RESET".into()))),
        (119, true, Some(Implied::Reset("GPU_RESET".into()))),
        (95, true, Some(Implied::Reset("GPU_RESET".into()))),
        (64, true, Some(Implied::Reset("GPU_RESET".into()))),
        // Off the bus, reboot.
        (79, true, Some(Implied::Lost)),
        (151, true, Some(Implied::Reboot)),
        // NVLink workflows: informational, degraded.
        (74, false, Some(Implied::Nvlink)),
        (145, false, Some(Implied::Nvlink)),
        // Not in the table: fatal, as NVIDIA's driver.
        (54, true, None),
        (999, true, None),
    ];
    for (xid, fatal, implied) in table {
        let v = classify_xid(&p, *xid, None);
        assert_eq!(v.fatal, *fatal, "XID {xid}: {v:?}");
        assert_eq!(&v.implied, implied, "XID {xid}: {v:?}");
    }
}

#[test]
fn recovery_action_decides_when_known() {
    let p = policy();
    for (action, fatal) in [
        (RecoveryAction::None, false),
        (RecoveryAction::Other(5), false),
        (RecoveryAction::DrainP2p, false),
        (RecoveryAction::GpuReset, true),
        (RecoveryAction::DrainAndReset, true),
        (RecoveryAction::NodeReboot, true),
        (RecoveryAction::Other(6), true),
        (RecoveryAction::Other(42), true),
    ] {
        // 119 is fatal in the catalog, 94 informational: the action wins.
        for xid in [119, 94] {
            let v = classify_xid(&p, xid, Some(action));
            assert_eq!(v.fatal, fatal, "XID {xid} with {action:?}");
            assert_eq!(v.implied, None, "the action raises reset/reboot itself");
        }
    }
    // 79 is lost whatever the action says.
    let v = classify_xid(&p, 79, Some(RecoveryAction::None));
    assert!(v.fatal);
    assert_eq!(v.implied, Some(Implied::Lost));
}

#[test]
fn ignore_list_and_fatal_list() {
    let mut p = policy();
    p.ignored_xids = set(&[119, 94]);
    assert!(!classify_xid(&p, 119, None).fatal, "ignored");
    assert!(!classify_xid(&p, 119, Some(RecoveryAction::GpuReset)).fatal);
    p.fatal_xids = XidSet::Some(set(&[119, 43]));
    // Fatal wins over the admin's ignore list and over NVIDIA's defaults.
    let v = classify_xid(&p, 119, None);
    assert!(v.fatal);
    assert_eq!(v.why, "--xids-fatal");
    assert_eq!(v.implied, Some(Implied::Reset("GPU_RESET".into())));
    assert!(classify_xid(&p, 43, Some(RecoveryAction::None)).fatal);
    assert!(!classify_xid(&p, 94, None).fatal);
    p.fatal_xids = XidSet::All;
    assert!(classify_xid(&p, 13, None).fatal);
    assert!(classify_xid(&p, 94, Some(RecoveryAction::None)).fatal);
}

#[test]
fn action_names_and_classes() {
    assert_eq!(action_name(RecoveryAction::GpuReset), "GPU_RESET");
    assert_eq!(action_name(RecoveryAction::Other(6)), "BUS_RESET");
    assert_eq!(action_name(RecoveryAction::Other(99)), "UNKNOWN_99");
    assert_eq!(
        action_class(RecoveryAction::DrainAndReset),
        ActionClass::Reset("DRAIN_AND_RESET".into())
    );
    assert_eq!(action_class(RecoveryAction::Other(7)), ActionClass::Reboot);
    assert_eq!(action_class(RecoveryAction::Other(5)), ActionClass::Fine);
}

#[test]
fn xid_list_parses_nvidia_format() {
    assert_eq!(parse_xid_list("").unwrap(), set(&[]));
    assert_eq!(parse_xid_list("  ").unwrap(), set(&[]));
    assert_eq!(parse_xid_list("13").unwrap(), set(&[13]));
    assert_eq!(parse_xid_list("13,31, 94 ,13").unwrap(), set(&[13, 31, 94]));
    assert_eq!(parse_xid_list("4294967295").unwrap(), set(&[4_294_967_295]));
}

#[test]
fn xid_list_rejects_hostile_values_precisely() {
    let cases: &[(&str, &str)] = &[
        ("13,,31", "entry 2 is empty"),
        ("13,", "entry 2 is empty"),
        (",13", "entry 1 is empty"),
        ("13,abc", "entry 2 (\"abc\") is not a decimal number"),
        ("-1", "entry 1 (\"-1\") is not a decimal number"),
        ("+5", "not a decimal number"),
        ("0x1f", "not a decimal number"),
        ("1e3", "not a decimal number"),
        ("0", "entry 1 (0) is out of range"),
        ("4294967296", "out of range"),
        ("99999999999999999999999999", "out of range"),
        ("13;31", "not a decimal number"),
        ("１３", "not a decimal number"),
        ("13\u{0},31", "not a decimal number"),
    ];
    for (text, want) in cases {
        let err = parse_xid_list(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(!err.contains('\n'));
    }
    let long = "x".repeat(10_000);
    let err = parse_xid_list(&long).unwrap_err().to_string();
    assert!(err.len() < 200, "the entry is cut: {err}");
    let many = vec!["1"; MAX_XIDS + 1].join(",");
    assert_eq!(
        parse_xid_list(&many).unwrap_err(),
        Error::TooMany { max: MAX_XIDS }
    );
    assert!(parse_xid_list(&vec!["7"; MAX_XIDS].join(",")).is_ok());
}

#[test]
fn xid_set_all_or_list() {
    assert_eq!(parse_xid_set("all").unwrap(), XidSet::All);
    assert_eq!(parse_xid_set(" ALL ").unwrap(), XidSet::All);
    assert_eq!(parse_xid_set("").unwrap(), XidSet::Some(set(&[])));
    assert_eq!(
        parse_xid_set("48,79").unwrap(),
        XidSet::Some(set(&[48, 79]))
    );
    assert!(parse_xid_set("all,48").is_err());
    assert!(parse_xid_set("al").is_err());
    assert!(!XidSet::default().contains(48));
}

#[test]
fn evict_keys() {
    assert!(parse_evict("").unwrap().is_empty());
    let keys = parse_evict("gpu-lost, reboot-required,gpu.nvidia.com/xid").unwrap();
    assert_eq!(
        keys.into_iter().collect::<Vec<_>>(),
        ["gpu-lost", "reboot-required", "xid"]
    );
    for (text, want) in [
        ("degraded", "only has effect None"),
        ("unmonitored", "only has effect None"),
        ("gpu.nvidia.com/remap-pending", "only has effect None"),
        ("gpu-lost,,xid", "entry 2 is empty"),
        ("GPU-LOST", "unknown health taint key \"GPU-LOST\""),
        ("nvidia.com/gpu-lost", "unknown"),
        ("kubernetes.io/xid", "unknown"),
        ("gpu-lost\n", "unknown"),
    ] {
        let err = parse_evict(text);
        // "gpu-lost\n" trims to a known key: accepted.
        if text == "gpu-lost\n" {
            assert!(err.is_ok());
            continue;
        }
        let err = err.unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    let err = parse_evict(&"z".repeat(5000)).unwrap_err().to_string();
    assert!(err.len() < 250, "{err}");
    let err = parse_evict(&vec!["xid"; 100].join(",")).unwrap_err();
    assert!(matches!(err, Error::TooMany { .. }));
}

#[test]
fn policy_defaults() {
    let p = Policy::default();
    assert_eq!(p.quiet, Duration::from_secs(60));
    assert_eq!(p.info_ttl, Duration::from_secs(3600));
    assert_eq!(p.escalate_after, 5);
    assert_eq!(p.escalate_window, Duration::from_secs(600));
    for xid in DEFAULT_IGNORED_XIDS {
        assert!(p.ignores(xid));
    }
    assert!(!p.ignores(48));
}

#[test]
fn rfc3339_formats_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_953_785)),
        "2026-11-29T12:03:05Z"
    );
    // A leap day.
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
        "2000-02-29T00:00:00Z"
    );
    assert_eq!(
        rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
        "1970-01-01T00:00:00Z"
    );
}
