//! Every single-byte damage of a realistic checkpoint, one at a time: a
//! file of three entries (a whole GPU with an MPS daemon and a compute
//! mode change, a dynamically created MIG device, a MIG device with an MPS
//! daemon), written by the store, then each byte in turn changed (bits
//! flipped) or deleted, and the store opened on it. After every open:
//! every MIG device and MPS daemon of the three entries is still owned (by
//! a loaded entry, or by the ledger: named, or held by its damaged text as
//! startup recovery reads it), so the start-up sweep would remove none;
//! every loaded entry is exactly as written; nothing is put under a real
//! claim's UID in the ledger that the claim did not own; and nothing
//! panics.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use super::*;

const BOOT: &str = "0e9d8c7b-6a59-4847-a635-241302f1e0d9";
/// Realistic claim UIDs (random version-4 UUIDs, in file order).
const GPU_MPS: &str = "3f2a9c1e-7b4d-4e8a-9c61-0d5e8f7a2b13";
const MIG: &str = "8c0d4b7a-1e2f-4a3b-b5c6-9d8e7f6a5b4c";
const MIG_MPS: &str = "c5e1f0a2-6d3b-4c9e-8a7f-2b1c0d9e8f7a";
const GPU_0: &str = "GPU-6b1f3c2a-9d8e-4f7a-b6c5-d4e3f2a1b0c9";
const GPU_1: &str = "GPU-a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d";
const MIG_A: &str = "MIG-5d4c3b2a-1f0e-5d9c-8b7a-6f5e4d3c2b1a";
const MIG_B: &str = "MIG-e7f8a9b0-c1d2-5e3f-9a4b-5c6d7e8f9a0b";

/// The damages tried at each byte: the byte changed, bit 1 flipped (a
/// quote becomes a space, a space a quote, a brace a letter, a digit
/// another digit or a colon), or bit 7 (an invalid UTF-8 byte), and the
/// byte deleted. (Every bit of every byte would be eight times the opens:
/// a debug build opens about 400 a second per core.)
const DAMAGES: [Damage; 3] = [Damage::Xor(0x02), Damage::Xor(0x80), Damage::Delete];

#[derive(Clone, Copy, Debug)]
enum Damage {
    Xor(u8),
    Delete,
}

impl Damage {
    fn apply(self, file: &[u8], at: usize) -> Vec<u8> {
        let mut damaged = file.to_vec();
        match self {
            Self::Xor(bits) => damaged[at] ^= bits,
            Self::Delete => {
                damaged.remove(at);
            }
        }
        damaged
    }
}

fn gpu_with_mps() -> ClaimEntry {
    let uid = ClaimUid::from(GPU_MPS);
    let id = daemon_id(&uid, 0);
    ClaimEntry {
        state: ClaimState::PrepareCompleted,
        namespace: "inference".into(),
        name: "shared-t4".into(),
        devices: vec![PreparedDeviceRecord {
            kind: DeviceKind::Gpu {
                uuid: GPU_0.into(),
                minor: 0,
            },
            requests: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            share_id: None,
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={GPU_MPS}-gpu-0")],
            sharing: SharingApplied {
                time_slice_interval: None,
                compute_mode: Some(ComputeModeChange {
                    set: "ExclusiveProcess".into(),
                    previous: "Default".into(),
                }),
                mps_daemon: Some(MpsDaemonRecord {
                    pipe_dir: format!("/run/nvidia/mps/{id}/pipe").into(),
                    pid: Some(41_207),
                    log_dir: format!("/run/nvidia/mps/{id}/log").into(),
                    shm_dir: format!("/run/nvidia/mps/{id}/shm").into(),
                    gpu_uuids: vec![GPU_0.into()],
                    id,
                }),
            },
            admin: false,
        }],
        cdi_spec_paths: vec![
            format!("/var/run/cdi/k8s.gpu.nvidia.com-claim_{GPU_MPS}.json").into(),
        ],
    }
}

fn mig_record(mig_uuid: &str, gi: u32, start: u32) -> PreparedDeviceRecord {
    PreparedDeviceRecord {
        kind: DeviceKind::Mig {
            parent_uuid: GPU_1.into(),
            parent_minor: 1,
            profile_id: 19,
            placement_start: start,
            placement_size: 1,
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            mig_uuid: Some(mig_uuid.into()),
            created: true,
        },
        requests: vec!["mig".into()],
        pool: "node-a".into(),
        device: format!("gpu-1-mig-1g10gb-{start}-1"),
        share_id: None,
        cdi_device_ids: vec![],
        sharing: SharingApplied::default(),
        admin: false,
    }
}

fn dynamic_mig() -> ClaimEntry {
    ClaimEntry {
        state: ClaimState::PrepareCompleted,
        namespace: "ml".into(),
        name: "train".into(),
        devices: vec![mig_record(MIG_A, 9, 2)],
        cdi_spec_paths: vec![format!("/var/run/cdi/k8s.gpu.nvidia.com-claim_{MIG}.json").into()],
    }
}

fn mig_with_mps() -> ClaimEntry {
    let uid = ClaimUid::from(MIG_MPS);
    let id = daemon_id(&uid, 0);
    let mut record = mig_record(MIG_B, 11, 4);
    record.sharing.mps_daemon = Some(MpsDaemonRecord {
        pipe_dir: format!("/run/nvidia/mps/{id}/pipe").into(),
        pid: Some(41_388),
        log_dir: format!("/run/nvidia/mps/{id}/log").into(),
        shm_dir: format!("/run/nvidia/mps/{id}/shm").into(),
        gpu_uuids: vec![MIG_B.into()],
        id,
    });
    ClaimEntry {
        state: ClaimState::PrepareCompleted,
        namespace: "ml".into(),
        name: "notebook".into(),
        devices: vec![record],
        cdi_spec_paths: vec![
            format!("/var/run/cdi/k8s.gpu.nvidia.com-claim_{MIG_MPS}.json").into(),
        ],
    }
}

fn originals() -> BTreeMap<ClaimUid, ClaimEntry> {
    BTreeMap::from([
        (ClaimUid::from(GPU_MPS), gpu_with_mps()),
        (ClaimUid::from(MIG), dynamic_mig()),
        (ClaimUid::from(MIG_MPS), mig_with_mps()),
    ])
}

/// The MIG device UUIDs and MPS daemon ids an entry records.
fn names_of(entry: &ClaimEntry) -> BTreeSet<String> {
    entry
        .devices
        .iter()
        .flat_map(|r| {
            let mig = match &r.kind {
                DeviceKind::Mig { mig_uuid, .. } => mig_uuid.clone(),
                DeviceKind::Gpu { .. } | DeviceKind::Vfio { .. } => None,
            };
            mig.into_iter()
                .chain(r.sharing.mps_daemon.as_ref().map(|d| d.id.clone()))
        })
        .collect()
}

/// A state directory on a memory filesystem where there is one (the opens
/// fsync), and the boot id file beside it.
struct Dir {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
}

impl Dir {
    fn new() -> Self {
        let shm = Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let boot = tmp.path().join("boot_id");
        fs::write(&boot, format!("{BOOT}\n")).unwrap();
        Self {
            state: tmp.path().join("state"),
            boot,
            _tmp: tmp,
        }
    }

    /// The store's own file for the three entries.
    fn written(&self) -> Vec<u8> {
        let (store, _) = Store::open(&self.state, &self.boot).unwrap();
        let mut batch = Batch::new();
        for (uid, entry) in originals() {
            batch = batch.put(uid, entry);
        }
        store.commit(batch).unwrap();
        drop(store);
        let bytes = fs::read(self.state.join(FILE_NAME)).unwrap();
        fs::remove_dir_all(&self.state).unwrap();
        bytes
    }
}

/// What one open of a damaged file came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// Every entry loaded (the damage missed them all).
    #[default]
    AllLoaded,
    /// Some entries lost, kept in the ledger.
    SomeLost,
    /// Every entry lost (the header damaged), kept in the ledger.
    AllLost,
    /// The version read as a newer one: the plugin does not start and
    /// leaves the file as it is.
    Refused,
}

/// Opens the store on `damaged` and checks it; the outcome, or what is
/// wrong.
fn check(
    dir: &Dir,
    damaged: &[u8],
    originals: &BTreeMap<ClaimUid, ClaimEntry>,
) -> Result<Outcome, String> {
    if dir.state.exists() {
        fs::remove_dir_all(&dir.state).unwrap();
    }
    fs::create_dir_all(&dir.state).unwrap();
    fs::write(dir.state.join(FILE_NAME), damaged).unwrap();
    let opened = catch_unwind(AssertUnwindSafe(|| Store::open(&dir.state, &dir.boot)))
        .map_err(|_| "Store::open panicked".to_owned())?;
    let store = match opened {
        Ok((store, _)) => store,
        Err(Error::NewerVersion { .. }) => {
            let left = fs::read(dir.state.join(FILE_NAME)).map_err(|e| e.to_string())?;
            return if left == damaged {
                Ok(Outcome::Refused)
            } else {
                Err("refused to start but changed the file".into())
            };
        }
        Err(e) => return Err(format!("open failed: {e}")),
    };
    let loaded = store.snapshot().claims;
    for (uid, entry) in &loaded {
        if originals.get(uid) != Some(entry) {
            return Err(format!(
                "loaded {uid} differs from what was written: {entry:?}"
            ));
        }
    }
    let ledger = store.lost();
    for (key, lost) in &ledger {
        if key.0 == UNATTRIBUTED {
            continue;
        }
        // Under a real claim's UID nothing another claim owned: its release
        // (at its unprepare) must not take another claim's device. (A name
        // of its own a byte off names nothing on the node.)
        if let Some(own) = originals.get(key) {
            let own = names_of(own);
            let others: BTreeSet<String> = originals
                .values()
                .flat_map(names_of)
                .filter(|n| !own.contains(n))
                .collect();
            let foreign: Vec<&String> = lost
                .mig_uuids
                .iter()
                .chain(&lost.mps_daemons)
                .filter(|n| others.contains(*n))
                .collect();
            let held: Vec<&String> = others.iter().filter(|n| lost.holds_nearly(n)).collect();
            if !foreign.is_empty() || !held.is_empty() {
                return Err(format!(
                    "the ledger gives {key} names it did not own: {foreign:?}, in its text {held:?}"
                ));
            }
        }
    }
    for (uid, entry) in originals {
        for name in names_of(entry) {
            let in_entry = loaded.values().any(|e| names_of(e).contains(&name));
            let in_ledger = ledger.values().any(|l| {
                l.mig_uuids.contains(&name)
                    || l.mps_daemons.contains(&name)
                    || l.holds_nearly(&name)
            });
            if !in_entry && !in_ledger {
                return Err(format!(
                    "{name} of {uid} is owned by nothing: the sweep would remove it"
                ));
            }
        }
    }
    Ok(match loaded.len() {
        3 => Outcome::AllLoaded,
        0 => Outcome::AllLost,
        _ => Outcome::SomeLost,
    })
}

#[test]
fn every_single_byte_damage_keeps_every_name_owned_and_loads_only_what_was_written() {
    let originals = originals();
    let file = Dir::new().written();
    let cases: Vec<(usize, Damage)> = (0..file.len())
        .flat_map(|at| DAMAGES.iter().map(move |d| (at, *d)))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(2, std::num::NonZero::get)
        .min(8);
    let chunk = cases.len().div_ceil(threads);
    let results: Vec<(BTreeMap<Outcome, usize>, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .chunks(chunk)
            .map(|part| {
                let (file, originals) = (&file, &originals);
                scope.spawn(move || {
                    let dir = Dir::new();
                    let mut outcomes = BTreeMap::new();
                    let mut failures = Vec::new();
                    for (at, damage) in part {
                        let damaged = damage.apply(file, *at);
                        match check(&dir, &damaged, originals) {
                            Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
                            Err(what) => failures.push(format!(
                                "byte {at} ({:?}) {damage:?}: {what}",
                                char::from(file[*at])
                            )),
                        }
                    }
                    (outcomes, failures)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut outcomes: BTreeMap<Outcome, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (o, f) in results {
        for (k, n) in o {
            *outcomes.entry(k).or_default() += n;
        }
        failures.extend(f);
    }
    assert!(
        failures.is_empty(),
        "{} of {} damaged files fail:\n{}",
        failures.len(),
        cases.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(outcomes.values().sum::<usize>(), file.len() * DAMAGES.len());
    // Every kind of outcome came up: damage in the header, in entries and
    // between them.
    for kind in [
        Outcome::AllLoaded,
        Outcome::SomeLost,
        Outcome::AllLost,
        Outcome::Refused,
    ] {
        assert!(
            outcomes.contains_key(&kind),
            "{kind:?} never came up: {outcomes:?}"
        );
    }
    eprintln!(
        "{} bytes x {} damages = {} opens: {outcomes:?}",
        file.len(),
        DAMAGES.len(),
        cases.len()
    );
}

/// The case of the review: the opening quote of the middle entry's key
/// damaged, so its text reads as the tail of the first entry, which still
/// verifies on its own.
#[test]
fn a_damaged_key_quote_leaves_the_entrys_names_unattributed_not_to_the_entry_before() {
    let dir = Dir::new();
    let file = dir.written();
    let text = String::from_utf8(file.clone()).unwrap();
    let at = text.find(&format!("\"{MIG}\"")).unwrap();
    let damaged = Damage::Xor(0x02).apply(&file, at);
    fs::create_dir_all(&dir.state).unwrap();
    fs::write(dir.state.join(FILE_NAME), &damaged).unwrap();
    let (store, report) = Store::open(&dir.state, &dir.boot).unwrap();
    assert!(report.moved_aside.is_some(), "{report:?}");
    // Both keys found verified: as far as the salvage can tell, nothing
    // was damaged.
    assert_eq!((report.salvaged, report.salvaged_all), (2, true));
    let loaded: Vec<String> = store.snapshot().claims.into_keys().map(|u| u.0).collect();
    assert_eq!(loaded, [GPU_MPS, MIG_MPS]);
    let ledger = store.lost();
    assert_eq!(
        ledger.keys().map(|k| k.0.as_str()).collect::<Vec<_>>(),
        [UNATTRIBUTED]
    );
    let names = &ledger[&ClaimUid::from(UNATTRIBUTED)];
    assert_eq!(names.mig_uuids, BTreeSet::from([MIG_A.to_owned()]));
    assert!(names.mps_daemons.is_empty());
    assert!(!store.is_lost(&ClaimUid::from(GPU_MPS)));
    // The ledger file says so too, and reads back.
    let on_disk = lost::decode_ledger(&fs::read(dir.state.join(LOST_FILE_NAME)).unwrap()).unwrap();
    assert_eq!(on_disk, ledger);
}

/// The damaged key of the MIG entry with an MPS daemon: its daemon is kept
/// unattributed, and its id names its claim.
#[test]
fn an_unattributed_daemon_id_names_its_claim() {
    let dir = Dir::new();
    let file = dir.written();
    let text = String::from_utf8(file.clone()).unwrap();
    let at = text.find(&format!("\"{MIG_MPS}\"")).unwrap();
    let damaged = Damage::Delete.apply(&file, at);
    fs::create_dir_all(&dir.state).unwrap();
    fs::write(dir.state.join(FILE_NAME), &damaged).unwrap();
    let (store, _) = Store::open(&dir.state, &dir.boot).unwrap();
    let names = &store.lost()[&ClaimUid::from(UNATTRIBUTED)];
    let id = daemon_id(&ClaimUid::from(MIG_MPS), 0);
    assert_eq!(names.mps_daemons, BTreeSet::from([id.clone()]));
    assert!(is_daemon_of(&id, &ClaimUid::from(MIG_MPS)));
    assert!(!is_daemon_of(&id, &ClaimUid::from(MIG)));
    assert!(!is_daemon_of(&format!("{id}x"), &ClaimUid::from(MIG_MPS)));
    assert!(!is_daemon_of("claim--0", &ClaimUid::from("")));
}
