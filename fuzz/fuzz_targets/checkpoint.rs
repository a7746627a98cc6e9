//! The prepare checkpoint's reader and salvage
//! (`gpu_kubelet_plugin::prepare::checkpoint`), through the public way in:
//! `Store::open` on a state directory whose `checkpoint.json` holds the
//! input, for a fixed boot id.
//!
//! Checked beyond "no panic": whatever the file held, a checkpoint that
//! opens is left on disk in a state that opens again cleanly to the same
//! claims (nothing quarantined, nothing moved aside, nothing salvaged), and
//! a commit on top of it reads back as committed.

#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use gpu_kubelet_plugin::prepare::checkpoint::{
    Batch, ClaimEntry, ClaimState, ClaimUid, DeviceKind, FILE_NAME, PreparedDeviceRecord,
    SharingApplied, Store,
};
use libfuzzer_sys::fuzz_target;

/// The boot id of every run; seed checkpoints carry it.
const BOOT: &str = "6a1c3f2e-0000-4000-8000-000000000001";

/// A directory for the whole run: on tmpfs when there is one, since every
/// open that repairs the file fsyncs it.
struct Dirs {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
}

static DIRS: LazyLock<Dirs> = LazyLock::new(|| {
    let shm = std::path::Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::Builder::new().prefix("fuzz-ckpt").tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a temp dir");
    let boot = tmp.path().join("boot_id");
    std::fs::write(&boot, format!("{BOOT}\n")).expect("the boot id file");
    Dirs {
        state: tmp.path().join("state"),
        boot,
        _tmp: tmp,
    }
});

fn entry() -> ClaimEntry {
    ClaimEntry {
        state: ClaimState::PrepareCompleted,
        namespace: "fuzz".into(),
        name: "committed".into(),
        devices: vec![PreparedDeviceRecord {
            kind: DeviceKind::Gpu {
                uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
                minor: 0,
            },
            requests: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            share_id: None,
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=fuzz-gpu-0".into()],
            sharing: SharingApplied::default(),
            admin: false,
        }],
        cdi_spec_paths: vec![],
    }
}

fuzz_target!(|data: &[u8]| {
    let dirs = &*DIRS;
    let _ = std::fs::remove_dir_all(&dirs.state);
    std::fs::create_dir_all(&dirs.state).expect("the state dir");
    std::fs::write(dirs.state.join(FILE_NAME), data).expect("the checkpoint file");

    let Ok((store, _report)) = Store::open(&dirs.state, &dirs.boot) else {
        // A newer format version is refused, and left alone.
        return;
    };
    let first = store.snapshot();
    drop(store);

    let (store, report) = Store::open(&dirs.state, &dirs.boot)
        .unwrap_or_else(|e| panic!("a checkpoint that opened once does not open again: {e}"));
    assert_eq!(
        store.snapshot(),
        first,
        "the second open reads other claims"
    );
    assert!(
        report.quarantined.is_empty() && report.moved_aside.is_none() && report.salvaged == 0,
        "the checkpoint left by an open is not clean: {report:?}"
    );
    assert_eq!(report.loaded, first.claims.len());

    // A commit on top: one claim put, the first loaded one (if any) removed.
    let uid = ClaimUid::from("fuzz-committed-claim");
    let mut batch = Batch::new().put(uid.clone(), entry());
    let mut expected = first.claims.clone();
    if let Some(old) = first.claims.keys().find(|k| **k != uid) {
        batch = batch.remove(old.clone());
        expected.remove(old);
    }
    expected.insert(uid, entry());
    store
        .commit(batch)
        .unwrap_or_else(|e| panic!("commit failed: {e}"));
    drop(store);
    let (store, _) = Store::open(&dirs.state, &dirs.boot)
        .unwrap_or_else(|e| panic!("the committed checkpoint does not open: {e}"));
    assert_eq!(
        store.snapshot().claims,
        expected,
        "the commit did not read back"
    );
});
