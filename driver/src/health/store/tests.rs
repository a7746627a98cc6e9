//! Unit tests of the `store` module: round trip, and every kind of damaged
//! or hostile file leading to a precise error and a start without saved
//! faults.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;

use super::super::tracker::{ClearRequest, SavedCondition, SavedGpu, Scope};
use super::*;

fn sample() -> Saved {
    let mut gpus = BTreeMap::new();
    gpus.insert(
        "GPU-0000-aaaa".to_owned(),
        SavedGpu {
            conditions: vec![
                SavedCondition {
                    scope: Scope::Gpu,
                    key: Key::ResetRequired,
                    value: Some("GPU_RESET".into()),
                    fatal: false,
                    since: 100,
                    last: 200,
                    count: 3,
                    message: "XID 119 at 1970-01-01T00:01:40Z; recovery action GPU_RESET".into(),
                },
                SavedCondition {
                    scope: Scope::Mig {
                        profile_id: 9,
                        placement_start: 4,
                    },
                    key: Key::Xid(13),
                    value: None,
                    fatal: false,
                    since: 100,
                    last: 100,
                    count: 1,
                    message: "XID 13".into(),
                },
            ],
            volatile_uncorrected_ecc: Some(7),
        },
    );
    Saved {
        boot_id: "0b5e4c1e-1111-2222-3333-444455556666".into(),
        gpus,
    }
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn missing_file_is_a_fresh_start() {
    let d = dir();
    let (store, saved) = HealthStore::open(d.path().join("health.json")).unwrap();
    assert!(saved.is_none());
    assert!(store.load_error().is_none());
}

#[test]
fn round_trip() {
    let d = dir();
    let path = d.path().join("health.json");
    let (store, _) = HealthStore::open(&path).unwrap();
    store.save(&sample()).unwrap();
    assert!(!d.path().join("health.json.tmp").exists());
    let (store2, saved) = HealthStore::open(&path).unwrap();
    assert_eq!(saved, Some(sample()));
    assert!(store2.load_error().is_none());
    // Overwrite with an empty state.
    store2.save(&Saved::default()).unwrap();
    let (_, saved) = HealthStore::open(&path).unwrap();
    assert_eq!(saved, Some(Saved::default()));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"version\":1,"), "{text}");
}

/// Writes `body`, opens it, and expects a start without saved faults with
/// an error containing `want`; the file is moved aside.
fn expect_damaged(body: &[u8], want: &str) {
    let d = dir();
    let path = d.path().join("health.json");
    std::fs::write(&path, body).unwrap();
    let (store, saved) = HealthStore::open(&path).unwrap();
    assert!(saved.is_none(), "{want}");
    let err = store.load_error().expect("an error").to_string();
    assert!(err.contains(want), "want {want:?} in {err}");
    assert!(err.contains("health.json"), "{err}");
    assert!(err.len() < 600, "{err}");
    assert!(!path.exists(), "moved aside");
    assert!(d.path().join("health.json.damaged").exists());
    // And the store still saves.
    store.save(&sample()).unwrap();
    assert_eq!(HealthStore::open(&path).unwrap().1, Some(sample()));
}

fn good_json() -> serde_json::Value {
    serde_json::json!({ "version": 1, "saved": sample() })
}

fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v = good_json();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn malformed_files() {
    expect_damaged(b"", "EOF while parsing");
    expect_damaged(b"garbage", "expected value at line 1 column 1");
    expect_damaged(b"[]", "damaged");
    expect_damaged(b"{}", "missing field `version`");
    expect_damaged(b"\xff\xfe\x00", "damaged");
    let good = serde_json::to_vec(&good_json()).unwrap();
    expect_damaged(&good[..good.len() / 2], "EOF while parsing");
    expect_damaged(
        &with(|v| v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][0]["key"] = "melted".into()),
        "unknown variant `melted`",
    );
    expect_damaged(&with(|v| v["extra"] = 1.into()), "unknown field `extra`");
    expect_damaged(
        &with(|v| v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][0]["count"] = (-1).into()),
        "invalid value",
    );
}

#[test]
fn wrong_version() {
    let d = dir();
    let path = d.path().join("health.json");
    std::fs::write(&path, with(|v| v["version"] = 2.into())).unwrap();
    let (store, saved) = HealthStore::open(&path).unwrap();
    assert!(saved.is_none());
    assert!(matches!(
        store.load_error(),
        Some(Error::Version { found: 2, .. })
    ));
    assert!(
        store
            .load_error()
            .unwrap()
            .to_string()
            .contains("has format version 2, this build reads 1")
    );
    expect_damaged(
        &with(|v| v["version"] = "1".into()),
        "version is \"1\", not a number",
    );
}

#[test]
fn hostile_values() {
    let gpu = |v: &mut serde_json::Value| v["saved"]["gpus"]["GPU-0000-aaaa"].clone();
    expect_damaged(
        &with(|v| {
            v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][0]["value"] =
                "GPU RESET; rm -rf".into();
        }),
        "reset-required needs a label value",
    );
    expect_damaged(
        &with(|v| {
            v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][0]["value"] = serde_json::Value::Null;
        }),
        "reset-required needs a label value, found None",
    );
    expect_damaged(
        &with(|v| v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][1]["value"] = "x".into()),
        "xid takes no value",
    );
    expect_damaged(
        &with(|v| {
            v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][1]["message"] =
                "m".repeat(MAX_MESSAGE + 1).into();
        }),
        "a message longer than",
    );
    expect_damaged(
        &with(|v| {
            v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][1]["message"] =
                "line\nbreak\u{1b}[31m".into();
        }),
        "a message with control characters",
    );
    expect_damaged(
        &with(|v| v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][1]["since"] = 101.into()),
        "last seen before it began",
    );
    expect_damaged(
        &with(|v| v["saved"]["boot_id"] = "b".repeat(200).into()),
        "boot id longer than",
    );
    expect_damaged(
        &with(|v| {
            let g = gpu(v);
            v["saved"]["gpus"]["GPU with spaces\n"] = g;
        }),
        "is not a UUID",
    );
    expect_damaged(
        &with(|v| {
            let g = gpu(v);
            v["saved"]["gpus"][""] = g;
        }),
        "is not a UUID",
    );
    expect_damaged(
        &with(|v| {
            let c = v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"][1].clone();
            v["saved"]["gpus"]["GPU-0000-aaaa"]["conditions"] =
                serde_json::Value::Array(vec![c; MAX_CONDITIONS_PER_GPU + 1]);
        }),
        "more than 128 conditions",
    );
    expect_damaged(
        &with(|v| {
            let g = gpu(v);
            let map = v["saved"]["gpus"].as_object_mut().unwrap();
            for i in 0..=MAX_GPUS {
                map.insert(format!("GPU-{i}"), g.clone());
            }
        }),
        "more than 1024 GPUs",
    );
}

#[test]
fn huge_and_deeply_nested_files() {
    // Over the cap: never parsed, whatever it holds.
    let mut big = serde_json::to_vec(&good_json()).unwrap();
    big.pop();
    big.extend(std::iter::repeat_n(
        b' ',
        usize::try_from(MAX_FILE_BYTES).unwrap(),
    ));
    big.push(b'}');
    expect_damaged(&big, "larger than 1048576 bytes");
    // 100 000 levels of nesting: a parse error, no stack overflow.
    let mut deep = Vec::new();
    deep.extend(std::iter::repeat_n(b'[', 100_000));
    deep.extend(std::iter::repeat_n(b']', 100_000));
    expect_damaged(&deep, "recursion limit exceeded");
    let mut deep = b"{\"version\":1,\"saved\":".to_vec();
    deep.extend(std::iter::repeat_n(b'[', 10_000));
    expect_damaged(&deep, "EOF while parsing");
    // Well-formed but deep where the state is: the version is read, the
    // state is refused at its first level (no field takes free-form JSON).
    deep.extend(std::iter::repeat_n(b']', 10_000));
    deep.push(b'}');
    expect_damaged(&deep, "invalid type: sequence, expected a string");
}

#[test]
fn unreadable_paths_are_errors() {
    let d = dir();
    // A directory where the file should be.
    let path = d.path().join("health.json");
    std::fs::create_dir(&path).unwrap();
    let err = HealthStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("health.json"), "{err}");
    assert!(err.contains("read"), "{err}");
}

#[test]
fn save_failure_leaves_the_old_file() {
    let d = dir();
    let sub = d.path().join("state");
    std::fs::create_dir(&sub).unwrap();
    let path = sub.join("health.json");
    let (store, _) = HealthStore::open(&path).unwrap();
    store.save(&sample()).unwrap();
    // A read-only directory: the temporary file cannot be made (unless
    // running as root, which ignores the mode; then the save succeeds).
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o500)).unwrap();
    let result = store.save(&Saved::default());
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (_, saved) = HealthStore::open(&path).unwrap();
    match result {
        Err(e) => {
            assert!(e.to_string().contains("create temporary file"), "{e}");
            assert_eq!(saved, Some(sample()));
        }
        Ok(()) => assert_eq!(saved, Some(Saved::default())),
    }
    // A path whose directory does not exist.
    let (store, _) = HealthStore::open(d.path().join("nope/health.json")).unwrap();
    let err = store.save(&sample()).unwrap_err().to_string();
    assert!(err.contains("create temporary file"), "{err}");
}

#[test]
fn label_values() {
    for ok in [
        "GPU_RESET",
        "row-remap-failure",
        "a",
        "x.y",
        &"a".repeat(63),
    ] {
        assert!(is_label_value(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "a b", "ä", &"a".repeat(64), "a/b"] {
        assert!(!is_label_value(bad), "{bad}");
    }
}

#[test]
fn clear_requests() {
    let d = dir();
    let path = d.path().join(CLEAR_FILE);
    assert!(take_clear_request(&path).unwrap().is_none());
    std::fs::write(
        &path,
        "# repaired\nGPU-0000-aaaa\n\n  GPU-1111-bbbb  \nGPU-0000-aaaa\n",
    )
    .unwrap();
    let req = take_clear_request(&path).unwrap().unwrap();
    assert_eq!(
        req,
        ClearRequest::Gpus(["GPU-0000-aaaa".to_owned(), "GPU-1111-bbbb".to_owned()].into())
    );
    assert!(!path.exists(), "taken");
    std::fs::write(&path, "GPU-x\nall\n").unwrap();
    assert_eq!(take_clear_request(&path).unwrap(), Some(ClearRequest::All));
    for (body, want) in [
        (
            &b"GPU-1\nrm -rf /\n"[..],
            "line 2: \"rm -rf /\" is neither a GPU UUID",
        ),
        (b"", "names no GPU"),
        (b"# only a comment\n", "names no GPU"),
        (b"MIG-1234\n", "line 1"),
        (b"GPU-1/../../etc\n", "line 1"),
        (b"\xff\xfe", "not UTF-8"),
    ] {
        std::fs::write(&path, body).unwrap();
        let err = take_clear_request(&path).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        assert!(!path.exists(), "a bad request is taken too");
    }
    let long = format!("GPU-{}\n", "a".repeat(200));
    std::fs::write(&path, long).unwrap();
    assert!(
        take_clear_request(&path)
            .unwrap_err()
            .to_string()
            .contains("line 1")
    );
    std::fs::write(&path, "GPU-1\n".repeat(20_000)).unwrap();
    let err = take_clear_request(&path).unwrap_err().to_string();
    assert!(err.contains("larger than 65536 bytes"), "{err}");
    assert!(!path.exists());
    // A directory in its place: an error, and it goes (if empty).
    std::fs::create_dir(&path).unwrap();
    assert!(take_clear_request(&path).is_err());
}

#[test]
fn a_fifo_in_place_of_a_file_is_refused_without_blocking() {
    let d = dir();
    for name in ["health.json", CLEAR_FILE] {
        let path = d.path().join(name);
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("mkfifo is not available: skipped");
            return;
        }
        let err = if name == CLEAR_FILE {
            take_clear_request(&path).unwrap_err().to_string()
        } else {
            HealthStore::open(&path).unwrap_err().to_string()
        };
        assert!(err.contains("not a regular file"), "{err}");
    }
}
