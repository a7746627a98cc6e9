//! Tests of the checkpoint: format round trip, every kind of damage,
//! reboots, versions, group commit, hostile sizes and crashes at each step
//! of a write (the test binary re-runs itself with a failpoint armed).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

const BOOT: &str = "6a1c3f2e-0000-4000-8000-000000000001";

/// A state dir and a boot id file in a temp dir.
struct Env {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
}

impl Env {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let boot = tmp.path().join("boot_id");
        fs::write(&boot, format!("{BOOT}\n")).unwrap();
        Self {
            _tmp: tmp,
            state,
            boot,
        }
    }

    fn open(&self) -> (Store, LoadReport) {
        Store::open(&self.state, &self.boot).unwrap()
    }

    fn file(&self) -> PathBuf {
        self.state.join(FILE_NAME)
    }

    fn doc(&self) -> Value {
        serde_json::from_slice(&fs::read(self.file()).unwrap()).unwrap()
    }

    fn write_doc(&self, doc: &Value) {
        fs::write(self.file(), serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    }
}

fn gpu_entry(state: ClaimState, name: &str) -> ClaimEntry {
    ClaimEntry {
        state,
        namespace: "default".into(),
        name: name.into(),
        devices: vec![PreparedDeviceRecord {
            kind: DeviceKind::Gpu {
                uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
                minor: 0,
            },
            requests: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            share_id: None,
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=abc-gpu-0".into()],
            sharing: SharingApplied {
                time_slice_interval: Some("Long".into()),
                compute_mode: None,
                mps_daemon: None,
            },
            admin: false,
        }],
        cdi_spec_paths: vec![PathBuf::from(
            "/var/run/cdi/k8s.gpu.nvidia.com-claim_abc.json",
        )],
    }
}

fn mig_entry() -> ClaimEntry {
    ClaimEntry {
        state: ClaimState::PrepareStarted,
        namespace: "ml".into(),
        name: "train".into(),
        devices: vec![PreparedDeviceRecord {
            kind: DeviceKind::Mig {
                parent_uuid: "GPU-aaaaaaaa-2222-3333-4444-555555555555".into(),
                parent_minor: 3,
                profile_id: 19,
                placement_start: 4,
                placement_size: 1,
                gpu_instance_id: Some(7),
                compute_instance_id: None,
                mig_uuid: None,
                created: true,
            },
            requests: vec!["mig".into(), "other".into()],
            pool: "node-a".into(),
            device: "gpu-3-mig-1g10gb-4-1".into(),
            share_id: Some("0b7e".into()),
            cdi_device_ids: vec![],
            sharing: SharingApplied {
                time_slice_interval: None,
                compute_mode: Some(ComputeModeChange {
                    set: "ExclusiveProcess".into(),
                    previous: "Default".into(),
                }),
                mps_daemon: Some(MpsDaemonRecord {
                    id: "mps-train".into(),
                    pipe_dir: "/run/nvidia/mps/train".into(),
                    ..MpsDaemonRecord::default()
                }),
            },
            admin: true,
        }],
        cdi_spec_paths: vec![],
    }
}

fn uid(s: &str) -> ClaimUid {
    ClaimUid::from(s)
}

/// A store holding claims `a` (GPU, completed) and `b` (MIG, started).
fn two_claims(env: &Env) {
    let (store, _) = env.open();
    store
        .commit(
            Batch::new()
                .put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a"))
                .put(uid("b"), mig_entry()),
        )
        .unwrap();
}

#[test]
fn round_trip_through_the_file() {
    let env = Env::new();
    two_claims(&env);
    let (store, report) = env.open();
    assert_eq!(
        report,
        LoadReport {
            loaded: 2,
            ..LoadReport::default()
        }
    );
    let snap = store.snapshot();
    assert_eq!(snap.boot_id, BOOT);
    assert_eq!(
        snap.claims[&uid("a")],
        gpu_entry(ClaimState::PrepareCompleted, "a")
    );
    assert_eq!(snap.claims[&uid("b")], mig_entry());
    let doc = env.doc();
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["bootId"], BOOT);
    assert_eq!(
        doc["entries"]["b"]["entry"]["devices"][0]["kind"]["type"],
        "mig"
    );
    assert_eq!(doc["entries"]["b"]["entry"]["state"], "PrepareStarted");
    let sum = doc["entries"]["a"]["checksum"].as_str().unwrap();
    assert_eq!(sum.len(), 8, "{sum}");
}

/// The format's definition: the whole document as one JSON value,
/// pretty-printed (what the encoder from fragments must reproduce).
fn reference_encoding(checkpoint: &Checkpoint) -> Vec<u8> {
    let mut entries = serde_json::Map::new();
    for (uid, entry) in &checkpoint.claims {
        let value = serde_json::to_value(entry).unwrap();
        let checksum = format::checksum(&uid.0, &value);
        entries.insert(
            uid.0.clone(),
            serde_json::json!({"checksum": checksum, "entry": value}),
        );
    }
    let doc = serde_json::json!({
        "version": format::CURRENT_VERSION,
        "bootId": checkpoint.boot_id,
        "entries": entries,
    });
    let mut bytes = serde_json::to_vec_pretty(&doc).unwrap();
    bytes.push(b'\n');
    bytes
}

#[test]
fn the_encoding_from_fragments_is_the_whole_document_pretty_printed() {
    let mut odd = gpu_entry(
        ClaimState::PrepareStarted,
        "line\nbreak \"quoted\" \\ tab\t é",
    );
    odd.namespace = "\u{1}ctl".into();
    let cases = [
        BTreeMap::new(),
        BTreeMap::from([(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a"))]),
        BTreeMap::from([
            (uid("b"), mig_entry()),
            (uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a")),
            (uid("key \"with\" escapes\n"), odd),
        ]),
    ];
    for claims in cases {
        let checkpoint = Checkpoint {
            boot_id: "boot \"id\"".into(),
            claims,
        };
        let bytes = format::encode(&checkpoint).unwrap();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            String::from_utf8(reference_encoding(&checkpoint)).unwrap()
        );
        let format::Decoded::Usable {
            claims,
            quarantined,
            ..
        } = format::decode(&bytes)
        else {
            panic!("not usable");
        };
        assert!(quarantined.is_empty());
        assert_eq!(claims, checkpoint.claims);
    }
}

#[test]
fn entries_kept_encoded_between_writes_stay_exact() {
    // Every write's file must be what encoding the checkpoint afresh gives:
    // replaced, removed and re-added entries, and a failed write in between
    // (whose changes, and their encodings, must not survive it).
    let env = Env::new();
    let (store, _) = env.open();
    let file = || fs::read(env.file()).unwrap();
    let check = |store: &Store| {
        assert_eq!(file(), reference_encoding(&store.snapshot()));
    };
    store
        .commit(
            Batch::new()
                .put(uid("a"), gpu_entry(ClaimState::PrepareStarted, "a"))
                .put(uid("b"), mig_entry()),
        )
        .unwrap();
    check(&store);
    store
        .commit(Batch::new().put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a")))
        .unwrap();
    check(&store);
    store.commit(Batch::new().remove(uid("b"))).unwrap();
    check(&store);
    let mut renamed = mig_entry();
    renamed.name = "again".into();
    store.commit(Batch::new().put(uid("b"), renamed)).unwrap();
    check(&store);

    // A write that fails (its temp file path is a non-empty directory):
    // neither its change nor its encoding may survive it.
    let before = file();
    let temp = env.state.join(format!("{FILE_NAME}.tmp"));
    fs::remove_file(&temp).unwrap();
    fs::create_dir_all(temp.join("x")).unwrap();
    let lost = gpu_entry(ClaimState::PrepareCompleted, "lost");
    store.commit(Batch::new().put(uid("b"), lost)).unwrap_err();
    fs::remove_dir_all(&temp).unwrap();
    assert_eq!(file(), before);
    store.commit(Batch::new().remove(uid("zz"))).unwrap();
    check(&store);
    assert_eq!(store.get(&uid("b")).unwrap().name, "again");
    // A reopened store encodes the entries it loads and writes the same bytes.
    drop(store);
    let (again, _) = env.open();
    again.commit(Batch::new().remove(uid("zz"))).unwrap();
    check(&again);
}

#[test]
fn writes_swap_the_checkpoint_with_its_temp_file() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    let (store, _) = env.open();
    let temp = env.state.join(format!("{FILE_NAME}.tmp"));
    let inode = |p: &Path| fs::metadata(p).unwrap().ino();
    // The store's first write (at open, no file yet) had nothing to swap
    // with: a plain rename.
    assert!(env.file().exists() && !temp.exists());
    let empty = fs::read(env.file()).unwrap();
    store
        .commit(Batch::new().put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a")))
        .unwrap();
    assert_eq!(fs::read(&temp).unwrap(), empty);
    let first = fs::read(env.file()).unwrap();
    let long = Batch::new()
        .put(uid("b"), mig_entry())
        .put(uid("c"), gpu_entry(ClaimState::PrepareStarted, "c"));
    store.commit(long).unwrap();
    // From then on the two files swap names: the temp file holds the
    // version before, and no write makes a new file.
    assert_eq!(fs::read(&temp).unwrap(), first);
    let files = [inode(&env.file()), inode(&temp)];
    let second = fs::read(env.file()).unwrap();
    store
        .commit(Batch::new().remove(uid("b")).remove(uid("c")))
        .unwrap();
    assert_eq!(fs::read(&temp).unwrap(), second);
    assert_eq!([inode(&temp), inode(&env.file())], files);
    // The file written in place over a longer version keeps no tail.
    let third = fs::read(env.file()).unwrap();
    assert_eq!(third, reference_encoding(&store.snapshot()));
    assert!(third.len() < second.len());
    store.commit(Batch::new().remove(uid("a"))).unwrap();
    assert_eq!(
        fs::read(env.file()).unwrap(),
        reference_encoding(&store.snapshot())
    );
    // A restarted plugin reads the checkpoint, never the temp file.
    fs::write(&temp, b"garbage left by a crash mid-write").unwrap();
    let (again, report) = env.open();
    assert_eq!(report.loaded, 0);
    assert!(report.moved_aside.is_none() && report.quarantined.is_empty());
    again
        .commit(Batch::new().put(uid("d"), mig_entry()))
        .unwrap();
    let (again, report) = env.open();
    assert_eq!(report.loaded, 1);
    assert_eq!(again.get(&uid("d")), Some(mig_entry()));
}

#[test]
fn claims_where_copies_only_the_selected_entries() {
    let env = Env::new();
    two_claims(&env);
    let (store, _) = env.open();
    let migs = store.claims_where(|e| e.name == mig_entry().name);
    assert_eq!(migs.keys().cloned().collect::<Vec<_>>(), vec![uid("b")]);
    assert_eq!(migs[&uid("b")], mig_entry());
    assert_eq!(store.claims_where(|_| true), store.snapshot().claims);
    assert!(store.claims_where(|_| false).is_empty());
}

#[test]
fn remove_and_get() {
    let env = Env::new();
    two_claims(&env);
    let (store, _) = env.open();
    store
        .commit(Batch::new().remove(uid("a")).remove(uid("zz")))
        .unwrap();
    assert!(store.get(&uid("a")).is_none());
    assert_eq!(store.get(&uid("b")), Some(mig_entry()));
    let (again, _) = env.open();
    assert_eq!(
        again.snapshot().claims.keys().cloned().collect::<Vec<_>>(),
        vec![uid("b")]
    );
}

#[test]
fn a_flipped_byte_quarantines_only_that_entry() {
    let env = Env::new();
    two_claims(&env);
    let text = fs::read_to_string(env.file()).unwrap();
    // Change the GPU claim's name without fixing its checksum.
    let damaged = text.replacen("\"name\": \"a\"", "\"name\": \"q\"", 1);
    assert_ne!(damaged, text);
    fs::write(env.file(), damaged).unwrap();

    let (store, report) = env.open();
    assert_eq!(report.loaded, 1);
    assert_eq!(report.quarantined.len(), 1);
    assert_eq!(report.quarantined[0].0, "a");
    assert!(
        report.quarantined[0].1.contains("checksum mismatch"),
        "{:?}",
        report.quarantined
    );
    assert_eq!(store.get(&uid("b")), Some(mig_entry()));
    assert!(store.get(&uid("a")).is_none());

    let quarantine: Value =
        serde_json::from_slice(&fs::read(env.state.join(QUARANTINE_FILE_NAME)).unwrap()).unwrap();
    assert_eq!(quarantine["a"]["raw"]["entry"]["name"], "q");
    // The checkpoint was rewritten without it: the next open is clean.
    let (_, report) = env.open();
    assert_eq!(
        report,
        LoadReport {
            loaded: 1,
            ..LoadReport::default()
        }
    );
}

#[test]
fn a_renamed_key_is_detected() {
    let env = Env::new();
    two_claims(&env);
    let mut doc = env.doc();
    let entries = doc["entries"].as_object_mut().unwrap();
    let a = entries.remove("a").unwrap();
    entries.insert("c".into(), a);
    env.write_doc(&doc);
    let (store, report) = env.open();
    assert_eq!(report.quarantined.len(), 1);
    assert_eq!(report.quarantined[0].0, "c");
    assert!(store.get(&uid("c")).is_none());
}

type Edit = Box<dyn FnOnce(&mut Value)>;

/// Rewrites entry `a` with `edit` applied and a correct checksum.
fn edit_entry_with_valid_checksum(env: &Env, edit: impl FnOnce(&mut Value)) {
    let mut doc = env.doc();
    let stored = &mut doc["entries"]["a"];
    edit(&mut stored["entry"]);
    let sum = format::checksum("a", &stored["entry"]);
    stored["checksum"] = sum.into();
    env.write_doc(&doc);
}

#[test]
fn wrong_types_and_missing_fields_are_quarantined_with_the_path() {
    let cases: Vec<(&str, Edit)> = vec![
        (
            "devices[0].kind",
            Box::new(|e| e["devices"][0]["kind"]["minor"] = "zero".into()),
        ),
        ("state", Box::new(|e| e["state"] = "Prepared".into())),
        (
            "namespace",
            Box::new(|e| {
                e.as_object_mut().unwrap().remove("namespace");
            }),
        ),
        (
            "devices[0].kind",
            Box::new(|e| e["devices"][0]["kind"]["type"] = "vfio".into()),
        ),
        (
            "devices[0].kind",
            Box::new(|e| e["devices"][0]["kind"]["minor"] = (-1).into()),
        ),
    ];
    for (path, edit) in cases {
        let env = Env::new();
        two_claims(&env);
        edit_entry_with_valid_checksum(&env, edit);
        let (store, report) = env.open();
        assert_eq!(report.quarantined.len(), 1, "{path}");
        let reason = &report.quarantined[0].1;
        assert!(
            reason.contains("does not decode") && reason.contains(path),
            "{path}: {reason}"
        );
        assert_eq!(store.get(&uid("b")), Some(mig_entry()), "{path}");
    }
}

#[test]
fn stored_entry_shape_errors_are_quarantined() {
    let cases: Vec<(Value, &str)> = vec![
        (Value::from(7), "not an object"),
        (serde_json::json!({"entry": {}}), "no \"checksum\""),
        (
            serde_json::json!({"checksum": 5, "entry": {}}),
            "no \"checksum\"",
        ),
        (serde_json::json!({"checksum": "00000000"}), "no \"entry\""),
    ];
    for (raw, expected) in cases {
        let env = Env::new();
        two_claims(&env);
        let mut doc = env.doc();
        doc["entries"]["a"] = raw;
        env.write_doc(&doc);
        let (_, report) = env.open();
        assert_eq!(report.loaded, 1);
        assert!(
            report.quarantined[0].1.contains(expected),
            "{expected}: {:?}",
            report.quarantined
        );
    }
    let env = Env::new();
    two_claims(&env);
    let mut doc = env.doc();
    let a = doc["entries"]["a"].clone();
    doc["entries"][&"x".repeat(300)] = a;
    env.write_doc(&doc);
    let (_, report) = env.open();
    assert!(
        report.quarantined[0].1.contains("300 bytes"),
        "{:?}",
        report.quarantined
    );
}

#[test]
fn unknown_fields_are_tolerated_within_a_version() {
    let env = Env::new();
    two_claims(&env);
    edit_entry_with_valid_checksum(&env, |e| {
        e["futureField"] = serde_json::json!({"x": 1});
        e["devices"][0]["vendorNote"] = "kept for humans".into();
    });
    let mut doc = env.doc();
    doc["writtenBy"] = "plugin v9".into();
    env.write_doc(&doc);
    let (store, report) = env.open();
    assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
    assert_eq!(
        store.get(&uid("a")),
        Some(gpu_entry(ClaimState::PrepareCompleted, "a"))
    );
}

#[test]
fn unusable_files_are_moved_aside_and_the_node_starts_empty() {
    let cases: Vec<(&[u8], &str)> = vec![
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"\x00\xff garbage", "not valid JSON"),
        (
            b"{\"version\": 1, \"bootId\": \"x\", \"entr",
            "not valid JSON",
        ),
        (b"[1, 2]", "not a JSON object"),
        (b"{\"bootId\": \"x\", \"entries\": {}}", "no \"version\""),
        (
            b"{\"version\": \"1\", \"bootId\": \"x\", \"entries\": {}}",
            "not a non-negative integer",
        ),
        (
            b"{\"version\": -1, \"bootId\": \"x\", \"entries\": {}}",
            "not a non-negative integer",
        ),
        (
            b"{\"version\": 0, \"bootId\": \"x\", \"entries\": {}}",
            "version 0",
        ),
        (b"{\"version\": 1, \"entries\": {}}", "no \"bootId\""),
        (
            b"{\"version\": 1, \"bootId\": 5, \"entries\": {}}",
            "not a non-empty string",
        ),
        (
            b"{\"version\": 1, \"bootId\": \"x\", \"entries\": []}",
            "\"entries\" is a array",
        ),
        (b"{\"version\": 1, \"bootId\": \"x\"}", "no \"entries\""),
    ];
    for (bytes, expected) in cases {
        let env = Env::new();
        fs::create_dir_all(&env.state).unwrap();
        fs::write(env.file(), bytes).unwrap();
        let (store, report) = env.open();
        let (aside, reason) = report.moved_aside.clone().expect(expected);
        assert!(reason.contains(expected), "{expected}: {reason}");
        assert_eq!(
            fs::read(&aside).unwrap(),
            bytes,
            "{expected}: the file is kept for humans"
        );
        assert!(store.snapshot().claims.is_empty());
        // A fresh, valid file replaced it and commits work.
        store
            .commit(Batch::new().put(uid("n"), mig_entry()))
            .unwrap();
        let (again, report) = env.open();
        assert_eq!(
            report,
            LoadReport {
                loaded: 1,
                ..LoadReport::default()
            },
            "{expected}"
        );
        assert_eq!(again.get(&uid("n")), Some(mig_entry()));
    }
}

#[test]
fn a_newer_version_refuses_to_start_and_keeps_the_file() {
    let env = Env::new();
    two_claims(&env);
    let mut doc = env.doc();
    doc["version"] = 2.into();
    env.write_doc(&doc);
    let before = fs::read(env.file()).unwrap();
    let err = Store::open(&env.state, &env.boot).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, Error::NewerVersion { version: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("version 2, newer than this plugin understands"),
        "{msg}"
    );
    assert_eq!(fs::read(env.file()).unwrap(), before);
}

#[test]
fn a_different_boot_id_discards_everything() {
    let env = Env::new();
    two_claims(&env);
    // Damage one entry too: entries of an earlier boot are discarded, not quarantined.
    let text = fs::read_to_string(env.file()).unwrap();
    fs::write(
        env.file(),
        text.replacen("\"name\": \"a\"", "\"name\": \"q\"", 1),
    )
    .unwrap();
    fs::write(&env.boot, "7f00aa00-0000-4000-8000-000000000002\n").unwrap();
    let (store, report) = env.open();
    assert_eq!(report.discarded_for_reboot, 2);
    assert_eq!(report.previous_boot_id.as_deref(), Some(BOOT));
    assert!(report.quarantined.is_empty());
    assert!(store.snapshot().claims.is_empty());
    assert_eq!(env.doc()["bootId"], "7f00aa00-0000-4000-8000-000000000002");
    // The earlier boot's file is kept whole (a damaged boot id reads as a
    // reboot too: its entries are not lost for a human).
    let kept = env.state.join(PREVIOUS_BOOT_FILE_NAME);
    assert_eq!(report.previous_boot_copy.as_deref(), Some(kept.as_path()));
    let old: serde_json::Value = serde_json::from_slice(&fs::read(&kept).unwrap()).unwrap();
    assert_eq!(old["bootId"], BOOT);
    assert_eq!(old["entries"].as_object().unwrap().len(), 2);
    // Another reboot with nothing prepared keeps that copy.
    drop(store);
    fs::write(&env.boot, "7f00aa00-0000-4000-8000-000000000003\n").unwrap();
    let (_, report) = env.open();
    assert_eq!(report.discarded_for_reboot, 0);
    assert_eq!(report.previous_boot_copy, None);
    let old: serde_json::Value = serde_json::from_slice(&fs::read(&kept).unwrap()).unwrap();
    assert_eq!(old["bootId"], BOOT);
}

#[test]
fn bad_boot_id_files_are_errors() {
    let env = Env::new();
    for (content, expected) in [("", "empty"), ("\n", "empty"), ("a\u{7}b", "control")] {
        fs::write(&env.boot, content).unwrap();
        let msg = Store::open(&env.state, &env.boot).unwrap_err().to_string();
        assert!(msg.contains(expected) && msg.contains("boot id"), "{msg}");
    }
    let missing = env.state.join("nope");
    let msg = Store::open(&env.state, &missing).unwrap_err().to_string();
    assert!(msg.contains("cannot read the boot id"), "{msg}");
}

#[test]
fn an_oversized_file_is_not_loaded_but_every_name_in_it_is_kept_unattributed() {
    use std::io::{Seek, SeekFrom, Write};
    let env = Env::new();
    fs::create_dir_all(&env.state).unwrap();
    let mut file = fs::File::create(env.file()).unwrap();
    file.set_len(100 << 20).unwrap(); // sparse: 100 MiB of zeros
    // Names at the start, across the first piece boundary (1 MiB), and
    // past the size limit.
    let names = [
        (0, MIG_UUID.to_owned()),
        (
            (1 << 20) - 20,
            "MIG-11111111-2222-4333-8444-555555555555".to_owned(),
        ),
        (90 << 20, r#""id": "claim-x-0""#.to_owned()),
    ];
    for (at, name) in &names {
        file.seek(SeekFrom::Start(*at)).unwrap();
        file.write_all(name.as_bytes()).unwrap();
    }
    drop(file);
    let (store, report) = env.open();
    let (_, reason) = report.moved_aside.unwrap();
    assert!(
        reason.contains("104857600 bytes") && reason.contains("limit"),
        "{reason}"
    );
    assert!(store.snapshot().claims.is_empty());
    let lost = store.lost();
    let kept = &lost[&uid(UNATTRIBUTED)];
    assert_eq!(
        kept.mig_uuids
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        [MIG_UUID, names[1].1.as_str()]
    );
    assert_eq!(kept.mps_daemons.iter().collect::<Vec<_>>(), ["claim-x-0"]);
    assert_eq!(lost.len(), 1, "{lost:?}");
}

/// Nesting deeper than serde_json's recursion limit (128, left on) in the
/// checkpoint, in an entry's value, in the quarantine file and in the
/// ledger: each is refused with a reason, nothing overflows the stack.
#[test]
fn deep_nesting_in_any_file_is_refused_not_followed() {
    let deep = "[".repeat(200_000);
    let env = Env::new();
    fs::create_dir_all(&env.state).unwrap();
    fs::write(env.file(), &deep).unwrap();
    let (_, report) = env.open();
    let (_, reason) = report.moved_aside.unwrap();
    assert!(reason.contains("recursion limit"), "{reason}");

    // An entry's value nested deep, in a file that is no longer JSON.
    let env = Env::new();
    two_claims(&env);
    let text = fs::read_to_string(env.file()).unwrap();
    let nested = text.replacen("\"entry\": {", &format!("\"entry\": {deep}"), 1);
    fs::write(env.file(), nested).unwrap();
    fs::write(env.state.join(LOST_FILE_NAME), &deep).unwrap();
    let (store, report) = env.open();
    assert!(report.moved_aside.is_some());
    assert_eq!((report.salvaged, report.salvaged_all), (1, false));
    assert!(store.get(&uid("b")).is_some() && store.is_lost(&uid("a")));
    // The unusable ledger was set aside, and a new one written.
    assert!(
        env.state
            .join(format!("{LOST_FILE_NAME}.unusable"))
            .exists()
    );
    assert!(ledger(&env)["claims"]["a"].is_object());

    // A quarantine file nested deep is replaced when an entry is
    // quarantined.
    let env = Env::new();
    two_claims(&env);
    let text = fs::read_to_string(env.file()).unwrap();
    fs::write(
        env.file(),
        text.replacen("\"name\": \"a\"", "\"name\": \"q\"", 1),
    )
    .unwrap();
    fs::write(env.state.join(QUARANTINE_FILE_NAME), &deep).unwrap();
    let (_, report) = env.open();
    assert_eq!(report.quarantined.len(), 1);
    let quarantine: Value =
        serde_json::from_slice(&fs::read(env.state.join(QUARANTINE_FILE_NAME)).unwrap()).unwrap();
    assert!(quarantine["a"]["reason"].is_string(), "{quarantine}");
}

/// A damaged key that turns into another entry's key while the file still
/// parses: JSON keeps one of the two values. The other's names are kept,
/// not given to the claim whose key it now has.
#[test]
fn a_key_made_another_entrys_in_a_file_that_still_parses_keeps_both_entries_names() {
    let env = Env::new();
    let (store, _) = env.open();
    let mut first = created_mig_entry();
    first.state = ClaimState::PrepareCompleted;
    let mut second = first.clone();
    let other = "MIG-99999999-8888-4777-8666-555555555555";
    if let DeviceKind::Mig { mig_uuid, .. } = &mut second.devices[0].kind {
        *mig_uuid = Some(other.into());
    }
    second.devices[0].sharing.mps_daemon = None;
    store
        .commit(
            Batch::new()
                .put(uid("uid-a"), first.clone())
                .put(uid("uid-b"), second),
        )
        .unwrap();
    drop(store);
    let text = fs::read_to_string(env.file()).unwrap();
    // `a` and `b` differ by one bit: a's key becomes b's.
    let damaged = text.replacen("\"uid-a\"", "\"uid-b\"", 1);
    serde_json::from_str::<Value>(&damaged).unwrap();
    fs::write(env.file(), damaged).unwrap();
    let (store, report) = env.open();
    // The last value under `uid-b` is b's own: it verifies.
    assert_eq!(report.loaded, 1);
    assert!(store.get(&uid("uid-b")).is_some());
    let lost = store.lost();
    assert!(!lost.contains_key(&uid("uid-b")), "{lost:?}");
    let kept = &lost[&uid(UNATTRIBUTED)];
    assert_eq!(kept.mig_uuids.iter().collect::<Vec<_>>(), [MIG_UUID]);
    assert_eq!(kept.mps_daemons.iter().collect::<Vec<_>>(), ["mps-train"]);
}

#[test]
fn a_state_directory_removed_under_the_store_is_written_again_whole() {
    let env = Env::new();
    // b's entry quarantined: the ledger names its MIG device.
    created_then_damaged(&env, |t| t.replacen("\"ml\"", "\"mx\"", 1));
    let (store, _) = env.open();
    store
        .commit(Batch::new().put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a")))
        .unwrap();
    assert!(!store.restore_if_removed().unwrap(), "nothing was removed");
    let (checkpoint, ledger_before) = (env.doc(), ledger(&env));

    fs::remove_dir_all(&env.state).unwrap();
    assert!(store.restore_if_removed().unwrap());
    assert_eq!(env.doc(), checkpoint);
    assert_eq!(ledger(&env), ledger_before);
    assert!(!store.restore_if_removed().unwrap(), "written once");
    // Commits go on as before, and a new open finds everything.
    store
        .commit(Batch::new().put(uid("c"), gpu_entry(ClaimState::PrepareCompleted, "c")))
        .unwrap();
    drop(store);
    let (store, report) = env.open();
    assert_eq!(report.loaded, 2);
    assert!(store.get(&uid("a")).is_some() && store.get(&uid("c")).is_some());
    assert!(store.is_lost(&uid("b")));
}

#[test]
fn a_state_directory_that_cannot_be_made_again_is_an_error_and_retried() {
    let env = Env::new();
    let (store, _) = env.open();
    store
        .commit(Batch::new().put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a")))
        .unwrap();
    fs::remove_dir_all(&env.state).unwrap();
    // A file where the directory was: it cannot be made.
    fs::write(&env.state, "").unwrap();
    let err = store.restore_if_removed().unwrap_err();
    assert!(err.to_string().contains("create state directory"), "{err}");
    fs::remove_file(&env.state).unwrap();
    assert!(store.restore_if_removed().unwrap());
    assert!(env.doc()["entries"].get("a").is_some());
}

#[test]
fn an_unreadable_checkpoint_is_an_error() {
    let env = Env::new();
    fs::create_dir_all(env.file()).unwrap(); // a directory where the file should be
    let msg = Store::open(&env.state, &env.boot).unwrap_err().to_string();
    assert!(msg.contains("cannot read checkpoint"), "{msg}");
}

#[test]
fn a_failed_write_changes_nothing() {
    let env = Env::new();
    two_claims(&env);
    let (store, _) = env.open();
    // Make the temp file path a non-empty directory: opening it fails.
    let temp = env.state.join(format!("{FILE_NAME}.tmp"));
    let _ = fs::remove_file(&temp);
    fs::create_dir_all(temp.join("x")).unwrap();
    let err = store.commit(Batch::new().remove(uid("a"))).unwrap_err();
    assert!(err.to_string().contains("open temp file"), "{err}");
    assert!(store.get(&uid("a")).is_some(), "memory must match the disk");
    fs::remove_dir_all(&temp).unwrap();
    store.commit(Batch::new().remove(uid("b"))).unwrap();
    let (again, _) = env.open();
    assert!(again.get(&uid("a")).is_some());
    assert!(again.get(&uid("b")).is_none());
}

#[test]
fn a_write_that_fails_after_the_rename_leaves_memory_as_the_file_is() {
    let env = Env::new();
    two_claims(&env);
    let (store, _) = env.open();
    // The new file is in place when the directory fsync fails: every
    // reader sees it, so the entries follow it, and a rollback that looks
    // the entry up finds it to remove.
    store.fail_next_dir_sync();
    let err = store
        .commit(Batch::new().put(uid("c"), gpu_entry(ClaimState::PrepareCompleted, "c")))
        .unwrap_err();
    assert!(err.to_string().contains("fsync directory"), "{err}");
    assert!(store.get(&uid("c")).is_some(), "memory must match the file");
    let (again, _) = env.open();
    assert!(again.get(&uid("c")).is_some());
    drop(again);
    // The same for a removal.
    store.fail_next_dir_sync();
    assert!(store.commit(Batch::new().remove(uid("a"))).is_err());
    assert!(store.get(&uid("a")).is_none());
    // The next write goes through and keeps both outcomes.
    store.commit(Batch::new().remove(uid("c"))).unwrap();
    let (again, _) = env.open();
    assert!(again.get(&uid("a")).is_none());
    assert!(again.get(&uid("b")).is_some());
    assert!(again.get(&uid("c")).is_none());
}

#[test]
fn concurrent_commits_are_grouped_into_fewer_writes() {
    const N: usize = 12;
    let env = Env::new();
    let (store, _) = env.open();
    let store = Arc::new(store);
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let first = std::sync::atomic::AtomicBool::new(true);
    store.set_before_write(Box::new(move || {
        // Hold the first write until the others have queued behind it.
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            entered_tx.send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
        }
    }));
    let commit = |i: usize| {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            store
                .commit(Batch::new().put(
                    uid(&format!("c{i}")),
                    gpu_entry(ClaimState::PrepareStarted, "x"),
                ))
                .unwrap();
        })
    };
    let mut threads = vec![commit(0)];
    entered_rx.recv().unwrap();
    let barrier = Arc::new(Barrier::new(N));
    for i in 1..N {
        let store = Arc::clone(&store);
        let barrier = Arc::clone(&barrier);
        threads.push(std::thread::spawn(move || {
            barrier.wait();
            store
                .commit(Batch::new().put(
                    uid(&format!("c{i}")),
                    gpu_entry(ClaimState::PrepareStarted, "x"),
                ))
                .unwrap();
        }));
    }
    barrier.wait();
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.queued() < N - 1 {
        assert!(Instant::now() < deadline, "commits did not queue");
        std::thread::sleep(Duration::from_millis(1));
    }
    release_tx.send(()).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        store.writes(),
        2,
        "one write for the first commit, one for the other {}",
        N - 1
    );
    let (again, _) = env.open();
    assert_eq!(again.snapshot().claims.len(), N);
}

/// The steps a crash test kills the process at, and whether the new state
/// must be visible afterwards (`None`: either old or new is fine).
const CRASH_POINTS: &[(&str, Option<bool>)] = &[
    ("checkpoint-before-temp-write", Some(false)),
    ("checkpoint-mid-temp-write", Some(false)),
    ("checkpoint-after-temp-write", Some(false)),
    ("checkpoint-after-rename", Some(true)),
    ("checkpoint-after-dir-sync", Some(true)),
];
const CHILD_DIR_ENV: &str = "GPU_DRA_CHECKPOINT_CRASH_DIR";

/// Not a test by itself: the body the crash test runs in a child process
/// with a failpoint armed (it does nothing without one).
#[test]
#[ignore = "run by crash_at_every_step_leaves_old_or_new_state in a child process"]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let (store, _) = Store::open(&dir.join("state"), &dir.join("boot_id")).unwrap();
    store
        .commit(
            Batch::new()
                .put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a"))
                .put(uid("c"), gpu_entry(ClaimState::PrepareStarted, "c")),
        )
        .unwrap();
    // Reached only when the failpoint did not fire.
    std::process::exit(3);
}

fn run_child(dir: &Path, failpoint: &str) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "prepare::checkpoint::tests::crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(FAILPOINT_ENV, failpoint)
        .output()
        .unwrap()
        .status
}

#[test]
fn crash_at_every_step_leaves_old_or_new_state() {
    use std::os::unix::process::ExitStatusExt;
    for &(point, new_visible) in CRASH_POINTS {
        let env = Env::new();
        let (store, _) = env.open();
        store
            .commit(Batch::new().put(uid("a"), gpu_entry(ClaimState::PrepareStarted, "a")))
            .unwrap();
        drop(store);
        let old: Vec<ClaimUid> = vec![uid("a")];

        let status = run_child(env.state.parent().unwrap(), point);
        assert_eq!(
            status.signal(),
            Some(libc::SIGABRT),
            "{point}: child must die at the failpoint, got {status}"
        );

        let (store, report) = env.open();
        assert!(
            report.quarantined.is_empty() && report.moved_aside.is_none(),
            "{point}: {report:?}"
        );
        let snap = store.snapshot();
        let keys: Vec<ClaimUid> = snap.claims.keys().cloned().collect();
        let is_new = keys == vec![uid("a"), uid("c")]
            && snap.claims[&uid("a")].state == ClaimState::PrepareCompleted;
        let is_old = keys == old && snap.claims[&uid("a")].state == ClaimState::PrepareStarted;
        assert!(is_new || is_old, "{point}: a mix of old and new: {snap:?}");
        if let Some(expected) = new_visible {
            assert_eq!(is_new, expected, "{point}");
        }
        // The restarted plugin goes on: repeat the prepare and unprepare.
        store
            .commit(
                Batch::new()
                    .put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a"))
                    .put(uid("c"), gpu_entry(ClaimState::PrepareCompleted, "c")),
            )
            .unwrap();
        store
            .commit(Batch::new().remove(uid("a")).remove(uid("c")))
            .unwrap();
        let (store, _) = env.open();
        assert!(store.snapshot().claims.is_empty(), "{point}");
        // The temp file stays (it holds the previous version); nothing else.
        let leftovers: Vec<_> = fs::read_dir(&env.state)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != FILE_NAME && *n != format!("{FILE_NAME}.tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{point}: {leftovers:?}");
    }
}

#[test]
fn entries_count_as_lost_when_quarantined_moved_aside_or_kept_as_an_earlier_boots() {
    let clean = LoadReport {
        loaded: 3,
        // a reboot whose file held no entries is kept nowhere: nothing lost
        discarded_for_reboot: 0,
        previous_boot_id: Some("old".into()),
        ..LoadReport::default()
    };
    assert!(!clean.lost_entries());
    let lost = [
        LoadReport {
            quarantined: vec![("uid".into(), "checksum mismatch".into())],
            ..clean.clone()
        },
        LoadReport {
            moved_aside: Some(("checkpoint.json.corrupt".into(), "not JSON".into())),
            ..clean.clone()
        },
        LoadReport {
            discarded_for_reboot: 2,
            previous_boot_copy: Some("checkpoint.previous-boot.json".into()),
            ..clean.clone()
        },
    ];
    for report in lost {
        assert!(report.lost_entries(), "{report:?}");
    }
}

const MIG_UUID: &str = "MIG-0a0b0c0d-1111-4222-8333-444455556666";

/// Entry `b` of [`two_claims`], created and with a MIG device UUID.
fn created_mig_entry() -> ClaimEntry {
    let mut entry = mig_entry();
    let record = &mut entry.devices[0];
    record.admin = false;
    if let DeviceKind::Mig { mig_uuid, .. } = &mut record.kind {
        *mig_uuid = Some(MIG_UUID.into());
    }
    entry
}

/// A store holding [`created_mig_entry`] as `b`, closed, its file's text
/// then changed by `damage`.
fn created_then_damaged(env: &Env, damage: impl FnOnce(&str) -> String) {
    let (store, _) = env.open();
    store
        .commit(Batch::new().put(uid("b"), created_mig_entry()))
        .unwrap();
    drop(store);
    let text = fs::read_to_string(env.file()).unwrap();
    fs::write(env.file(), damage(&text)).unwrap();
}

fn ledger(env: &Env) -> Value {
    serde_json::from_slice(&fs::read(env.state.join(LOST_FILE_NAME)).unwrap()).unwrap()
}

#[test]
fn a_quarantined_entry_leaves_what_it_names_in_the_ledger_across_opens() {
    let env = Env::new();
    // b's namespace changed behind its checksum.
    created_then_damaged(&env, |t| t.replacen("\"ml\"", "\"mx\"", 1));

    let (store, report) = env.open();
    assert_eq!(report.quarantined.len(), 1);
    let lost = store.lost();
    let b = &lost[&uid("b")];
    assert!(
        b.source.starts_with("quarantined (checksum mismatch"),
        "{b:?}"
    );
    assert_eq!(b.mig_uuids.iter().collect::<Vec<_>>(), [MIG_UUID]);
    assert_eq!(b.mps_daemons.iter().collect::<Vec<_>>(), ["mps-train"]);
    // The damaged entry still decodes: the mode to restore is known.
    assert_eq!(
        b.compute_modes
            .get("GPU-aaaaaaaa-2222-3333-4444-555555555555"),
        Some(&"Default".to_owned())
    );
    assert_eq!(ledger(&env)["claims"]["b"]["migUuids"][0], MIG_UUID);
    assert!(store.is_lost(&uid("b")) && !store.is_lost(&uid("a")));
    drop(store);
    // The checkpoint was rewritten clean, and the ledger still holds it.
    let (store, report) = env.open();
    assert!(!report.lost_entries());
    assert_eq!(store.lost(), lost);
    // Released: the file goes with its last claim.
    store.update_lost(BTreeMap::clear).unwrap();
    assert!(!env.state.join(LOST_FILE_NAME).exists());
    assert!(store.lost().is_empty());
}

#[test]
fn a_moved_aside_file_and_an_earlier_boots_file_leave_their_names_in_the_ledger() {
    let env = Env::new();
    // A dropped quote: the file is no longer JSON and is moved aside.
    created_then_damaged(&env, |t| t.replacen("\"ml\"", "\"ml", 1));
    let (store, report) = env.open();
    let (aside, _) = report.moved_aside.clone().unwrap();
    let b = &store.lost()[&uid("b")];
    assert!(b.source.contains(&aside.display().to_string()), "{b:?}");
    assert_eq!(b.mig_uuids.iter().collect::<Vec<_>>(), [MIG_UUID]);
    assert_eq!(b.mps_daemons.iter().collect::<Vec<_>>(), ["mps-train"]);
    store.update_lost(BTreeMap::clear).unwrap();
    store
        .commit(Batch::new().put(uid("b"), created_mig_entry()))
        .unwrap();
    drop(store);

    let mut doc = env.doc();
    doc["bootId"] = "damaged-or-rebooted".into();
    env.write_doc(&doc);
    let (store, report) = env.open();
    assert_eq!(report.discarded_for_reboot, 1);
    let b = &store.lost()[&uid("b")];
    assert_eq!(b.source, "checkpoint of boot damaged-or-rebooted");
    assert_eq!(b.mig_uuids.iter().collect::<Vec<_>>(), [MIG_UUID]);
}

/// The ledger is written before the checkpoint forgets the entry: when it
/// cannot be, the open fails and the damaged entry is still in the file.
#[test]
fn a_ledger_that_cannot_be_written_stops_the_open_before_the_entry_is_forgotten() {
    let env = Env::new();
    two_claims(&env);
    let text = fs::read_to_string(env.file()).unwrap();
    let damaged = text.replacen("\"name\": \"a\"", "\"name\": \"q\"", 1);
    fs::write(env.file(), &damaged).unwrap();
    // A directory where the ledger's temp file goes.
    fs::create_dir_all(env.state.join(format!("{LOST_FILE_NAME}.tmp"))).unwrap();
    let err = Store::open(&env.state, &env.boot).unwrap_err();
    assert!(err.to_string().contains(LOST_FILE_NAME), "{err}");
    assert_eq!(fs::read_to_string(env.file()).unwrap(), damaged);

    fs::remove_dir(env.state.join(format!("{LOST_FILE_NAME}.tmp"))).unwrap();
    let (store, report) = env.open();
    assert_eq!(report.quarantined.len(), 1);
    assert!(store.is_lost(&uid("a")));
}

#[test]
fn an_unusable_ledger_is_set_aside_and_the_plugin_starts() {
    for bad in [&b"{\"version\": 1, \"claims\": 3}"[..], b"\xff\x00", b"{}"] {
        let env = Env::new();
        fs::create_dir_all(&env.state).unwrap();
        fs::write(env.state.join(LOST_FILE_NAME), bad).unwrap();
        let (store, _) = env.open();
        assert!(store.lost().is_empty());
        assert_eq!(
            fs::read(env.state.join(format!("{LOST_FILE_NAME}.unusable"))).unwrap(),
            bad
        );
        assert!(!env.state.join(LOST_FILE_NAME).exists());
    }
}

/// [`two_claims`] with `b` completed and created, and the file's text
/// changed by `damage` (which must change it), while the store is closed.
fn damaged_two_claims(env: &Env, damage: impl FnOnce(&str) -> String) {
    let (store, _) = env.open();
    let mut b = created_mig_entry();
    b.state = ClaimState::PrepareCompleted;
    store
        .commit(
            Batch::new()
                .put(uid("a"), gpu_entry(ClaimState::PrepareCompleted, "a"))
                .put(uid("b"), b),
        )
        .unwrap();
    drop(store);
    let text = fs::read_to_string(env.file()).unwrap();
    let damaged = damage(&text);
    assert_ne!(damaged, text);
    assert!(
        serde_json::from_str::<Value>(&damaged).is_err(),
        "{damaged}"
    );
    fs::write(env.file(), damaged).unwrap();
}

#[test]
fn one_damaged_byte_between_entries_loses_no_entry() {
    let env = Env::new();
    // The comma between the two entries becomes a letter.
    damaged_two_claims(&env, |t| t.replacen("},\n    \"b\"", "}x\n    \"b\"", 1));
    let (store, report) = env.open();
    assert!(report.moved_aside.is_some());
    assert_eq!((report.salvaged, report.salvaged_all), (2, true));
    assert!(!report.lost_entries(), "{report:?}");
    assert_eq!(
        store.get(&uid("a")),
        Some(gpu_entry(ClaimState::PrepareCompleted, "a"))
    );
    assert!(store.get(&uid("b")).is_some());
    assert!(store.lost().is_empty());
    // Rewritten whole: the next open is clean.
    drop(store);
    let (_, report) = env.open();
    assert_eq!(report.loaded, 2);
    assert!(report.moved_aside.is_none());
}

#[test]
fn one_damaged_byte_inside_an_entry_loses_that_entry_alone() {
    let env = Env::new();
    // A quote of b's namespace is gone.
    damaged_two_claims(&env, |t| t.replacen("\"ml\"", "\"ml", 1));
    let (store, report) = env.open();
    assert_eq!((report.salvaged, report.salvaged_all), (1, false));
    assert!(report.lost_entries());
    assert!(store.get(&uid("a")).is_some());
    assert!(store.get(&uid("b")).is_none());
    let lost = store.lost();
    assert_eq!(lost.keys().collect::<Vec<_>>(), [&uid("b")]);
    assert_eq!(
        lost[&uid("b")].mig_uuids.iter().collect::<Vec<_>>(),
        [MIG_UUID]
    );
}

#[test]
fn in_an_unusable_file_an_entry_that_fails_its_checksum_or_is_there_twice_is_quarantined() {
    let env = Env::new();
    damaged_two_claims(&env, |t| {
        let broken = t.replacen("},\n    \"b\"", "}x\n    \"b\"", 1);
        broken.replacen("\"name\": \"a\"", "\"name\": \"q\"", 1)
    });
    let (store, report) = env.open();
    assert_eq!(report.salvaged, 1);
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    assert!(report.quarantined[0].1.contains("checksum mismatch"));
    assert!(store.is_lost(&uid("a")) && store.get(&uid("b")).is_some());

    let env = Env::new();
    damaged_two_claims(&env, |t| {
        // b's stored value under a's key too, and the file broken.
        let b_value = &t[t.find("\"b\": ").unwrap() + 5..t.rfind("\n  },").unwrap()];
        let doubled = t.replacen("\n  },", &format!(",\n    \"b\": {b_value}\n  }},"), 1);
        doubled.replacen("},\n    \"b\"", "}x\n    \"b\"", 1)
    });
    let (store, report) = env.open();
    let reasons: Vec<_> = report
        .quarantined
        .iter()
        .map(|(u, r)| (u.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("b", "the key is in the file twice"),
            ("b", "the key is in the file twice")
        ]
    );
    assert!(store.get(&uid("b")).is_none() && store.get(&uid("a")).is_some());
}

#[test]
fn nothing_is_salvaged_from_another_boot_or_version_or_an_unclear_header() {
    // Each header change, with a quote of b's namespace gone.
    let cases = [
        ("another boot", BOOT, "another-boot"),
        ("version 2", "\"version\": 1", "\"version\": 2"),
        ("no version", "\"version\": 1", "\"versi0n\": 1"),
        (
            "two boot ids",
            "\"bootId\"",
            "\"bootId\": \"x\", \"bootId\"",
        ),
    ];
    for (case, from, to) in cases {
        let env = Env::new();
        damaged_two_claims(&env, |t| {
            t.replacen(from, to, 1).replacen("\"ml\"", "\"ml", 1)
        });
        let (store, report) = env.open();
        assert!(report.moved_aside.is_some(), "{case}");
        assert_eq!(report.salvaged, 0, "{case}");
        assert!(store.snapshot().claims.is_empty(), "{case}");
        // What their text names is still kept.
        assert_eq!(store.lost().len(), 2, "{case}");
    }
}
