//! The checkpoint's commit against the bare durable write it is built on:
//! a write + fsync + rename + directory fsync of a small file in the same
//! directory, then commits of one claim's entry with 1 and with 101 claims
//! in the file. Prints one line each (mean per write).
//!
//! `cargo bench -p gpu-kubelet-plugin --bench checkpoint_commit`; the bench
//! runner (`cargo run --release -p gpu-dra-e2e --bin bench`) runs it and
//! reads the lines back (`<label>: <duration> per <write|commit>`).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::prepare::checkpoint::{
    Batch, ClaimEntry, ClaimState, ClaimUid, DeviceKind, FILE_NAME, PreparedDeviceRecord,
    SharingApplied, Store,
};

/// Writes timed per measurement.
const ROUNDS: u32 = 200;

fn main() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let state = tmp.path().join("state");
    let boot = tmp.path().join("boot_id");
    fs::create_dir_all(&state).expect("the state directory");
    fs::write(&boot, "6a9f1c2e-0000-4000-8000-000000000000\n").expect("a boot id");
    let baseline = bare_writes(&state);
    let (store, _) = Store::open(&state, &boot).expect("the checkpoint opens");
    let (one, one_size) = commits(&store, &state, 1);
    let (many, many_size) = commits(&store, &state, 101);
    println!("bare write+fsync+rename+dir fsync: {baseline:?} per write");
    println!("commit, 1 claim ({one_size} bytes): {one:?} per commit");
    println!("commit, 101 claims ({many_size} bytes): {many:?} per commit");
}

/// The floor: a small file written durably, `ROUNDS` times.
fn bare_writes(dir: &Path) -> Duration {
    let path = dir.join("bare");
    let temp = dir.join("bare.tmp");
    let start = Instant::now();
    for i in 0..ROUNDS {
        let mut f = fs::File::create(&temp).expect("the temp file");
        f.write_all(format!("{{\"round\": {i}}}\n").as_bytes())
            .expect("the write");
        f.sync_all().expect("the fsync");
        fs::rename(&temp, &path).expect("the rename");
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .expect("the directory fsync");
    }
    start.elapsed() / ROUNDS
}

/// The mean commit of one claim's entry (alternately started and
/// completed) with `claims` entries in the file, and the file's size.
fn commits(store: &Store, dir: &Path, claims: usize) -> (Duration, u64) {
    let mut clear = Batch::new();
    for uid in store.snapshot().claims.into_keys() {
        clear = clear.remove(uid);
    }
    store.commit(clear).expect("the checkpoint is cleared");
    let mut others = Batch::new();
    for i in 1..claims {
        others = others.put(ClaimUid::from(format!("pre-{i}").as_str()), entry(i));
    }
    store.commit(others).expect("the other claims are written");
    let start = Instant::now();
    for i in 0..ROUNDS {
        let mut one = entry(0);
        if i % 2 == 1 {
            one.state = ClaimState::PrepareCompleted;
        }
        store
            .commit(Batch::new().put(ClaimUid::from("x"), one))
            .expect("the commit");
    }
    let size = fs::metadata(PathBuf::from(dir).join(FILE_NAME)).map_or(0, |m| m.len());
    (start.elapsed() / ROUNDS, size)
}

/// A whole-GPU claim's entry, as a time-sliced prepare records it.
fn entry(i: usize) -> ClaimEntry {
    ClaimEntry {
        state: ClaimState::PrepareStarted,
        namespace: "default".into(),
        name: format!("claim-{i}"),
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
