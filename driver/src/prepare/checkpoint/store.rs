//! The checkpoint store: loading at startup (verification, quarantine,
//! reboot detection, moving unusable files aside) and durable, grouped
//! commits.
//!
//! Every write replaces the whole file: the new content goes to a temp file
//! in the same directory (`<file>.tmp`), which is fsynced, renamed over the
//! checkpoint, and the directory is fsynced, so a crash at any point leaves
//! either the old or the new file. The rename is an exchange
//! (`renameat2(RENAME_EXCHANGE)`): the temp file and the checkpoint swap
//! names, so the temp file keeps the previous version and is overwritten in
//! place by the next write. No inode is made or freed per write, and the
//! fsync flushes only the data and the size: on ext4 the whole write costs
//! about half of a new file renamed over the old one (measured by the
//! bench's durable-write rows, `e2e/src/bin/bench/prepare.rs`).
//! Where the filesystem cannot exchange, a plain rename does the same job
//! and the next write makes the temp file anew. The temp file is never
//! read: its content after a crash mid-write does not matter.
//!
//! Commits are serialised by a mutex and grouped: callers that arrive while
//! a write is in flight queue their [`Batch`]es, and the next writer applies
//! all of them in one write (one fsync for many batches). The in-memory
//! state only ever holds what is on disk: a batch whose write failed is
//! dropped and its caller gets the error. Each entry is kept with its
//! encoded text, and the writer reads the entries through a second
//! reference while it writes, then changes them in place: a write neither
//! copies the entries nor encodes more than the ones it changes.
//!
//! The API is blocking (fsync): async callers use `spawn_blocking`.
//!
//! Why an unusable file is moved aside and the node starts empty instead of
//! refusing to start: refusing would block every pod on the node until a
//! human intervenes (NVIDIA's driver does that on a checksum mismatch).
//! Starting without the lost entries is safe because what their text still
//! names goes into the ledger of lost claims (`lost`), written before the
//! checkpoint is rewritten without them: the startup sweep of the prepare
//! code leaves it for the claims' running pods, and kubelet's unprepare of
//! such a claim releases it. Names the damaged text holds outside every
//! entry that verified (an entry whose key was damaged) are kept too,
//! unattributed, and a file over the size limit is scanned for names
//! without being loaded (see `lost`). What nothing names any more (the
//! text of a file cut short) is found and removed by the sweep. The file
//! is kept for humans.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::format::{self, Decoded, MAX_FILE_BYTES, Quarantined};
use super::lost::{self, LOST_FILE_NAME, LostClaim};
use super::{
    Checkpoint, ClaimEntry, ClaimUid, Error, FILE_NAME, LoadReport, PREVIOUS_BOOT_FILE_NAME,
    QUARANTINE_FILE_NAME, WriteFailure,
};
use crate::prepare::capped::Capped;

/// Lost claims by UID (see [`lost`]).
type Ledger = BTreeMap<ClaimUid, LostClaim>;

/// Environment variable naming steps at which a checkpoint commit aborts
/// the process, for crash tests: `checkpoint-before-temp-write`,
/// `checkpoint-mid-temp-write`, `checkpoint-after-temp-write`,
/// `checkpoint-after-rename`, `checkpoint-after-dir-sync`; or fails with an
/// injected I/O error, for tests of failed writes:
/// `checkpoint-fail-temp-write` (nothing on disk changes) and
/// `checkpoint-fail-dir-sync` (the new file has taken the checkpoint's
/// name). Each is optionally followed by `@N`: at the N-th commit write
/// since the store was opened (default: the first). Several are separated
/// by commas; the first one armed for a write is the one it hits. Other
/// values are left to the prepare code's own step failpoints; a malformed
/// `checkpoint-` value is logged and not armed.
pub const FAILPOINT_ENV: &str = "GPU_DRA_FAILPOINT";

/// A step of a commit at which a crash test kills the process, or a step
/// a test makes fail (`Fail...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failpoint {
    BeforeTempWrite,
    MidTempWrite,
    AfterTempWrite,
    AfterRename,
    AfterDirSync,
    FailTempWrite,
    FailDirSync,
}

/// A failpoint and the commit write (1-based, counted from open) it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Armed {
    at: Failpoint,
    write: u64,
}

/// Longest `@N` accepted, so a hostile value cannot make a huge number.
const MAX_FAILPOINT_WRITE: u64 = 1_000_000;

impl Armed {
    fn from_env() -> Vec<Self> {
        std::env::var(FAILPOINT_ENV)
            .map(|value| Self::parse_all(&value))
            .unwrap_or_default()
    }

    /// The checkpoint failpoints of a comma-separated list.
    fn parse_all(value: &str) -> Vec<Self> {
        value
            .split(',')
            .filter_map(|one| match Self::parse(one) {
                Ok(Some(armed)) => {
                    tracing::warn!(failpoint = %one, "checkpoint failpoint armed: a write will abort the process or fail");
                    Some(armed)
                }
                Ok(None) => None,
                Err(reason) => {
                    tracing::error!(failpoint = %one, reason, "checkpoint failpoint not armed");
                    None
                }
            })
            .collect()
    }

    /// `Ok(None)` for a value that is not a checkpoint failpoint.
    fn parse(value: &str) -> Result<Option<Self>, &'static str> {
        if !value.starts_with("checkpoint-") {
            return Ok(None);
        }
        let (name, write) = match value.split_once('@') {
            None => (value, 1),
            Some((name, n)) => {
                let write = n
                    .parse::<u64>()
                    .map_err(|_| "the part after @ is not a whole number")?;
                if write == 0 || write > MAX_FAILPOINT_WRITE {
                    return Err("the write after @ must be between 1 and 1000000");
                }
                (name, write)
            }
        };
        let at = match name {
            "checkpoint-before-temp-write" => Failpoint::BeforeTempWrite,
            "checkpoint-mid-temp-write" => Failpoint::MidTempWrite,
            "checkpoint-after-temp-write" => Failpoint::AfterTempWrite,
            "checkpoint-after-rename" => Failpoint::AfterRename,
            "checkpoint-after-dir-sync" => Failpoint::AfterDirSync,
            "checkpoint-fail-temp-write" => Failpoint::FailTempWrite,
            "checkpoint-fail-dir-sync" => Failpoint::FailDirSync,
            _ => return Err("unknown checkpoint failpoint"),
        };
        Ok(Some(Self { at, write }))
    }

    /// The step armed for commit write number `write`, if any.
    fn for_write(armed: &[Self], write: u64) -> Option<Failpoint> {
        armed.iter().find(|a| a.write == write).map(|a| a.at)
    }
}

impl Failpoint {
    /// Aborts the process (no destructors, no flushing: for the files on
    /// disk the same as SIGKILL) when `self` is `at`.
    fn hit(armed: Option<Self>, at: Self) {
        if armed == Some(at) {
            tracing::error!(failpoint = ?at, "checkpoint failpoint hit: aborting");
            std::process::abort();
        }
    }
}

/// Changes to the checkpoint committed together in one write.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    changes: Vec<Change>,
}

#[derive(Clone, Debug)]
enum Change {
    Put(ClaimUid, ClaimEntry),
    Remove(ClaimUid),
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (inserts or replaces) the entry of `uid`.
    pub fn put(mut self, uid: ClaimUid, entry: ClaimEntry) -> Self {
        self.changes.push(Change::Put(uid, entry));
        self
    }

    /// Removes the entry of `uid` (no-op when absent).
    pub fn remove(mut self, uid: ClaimUid) -> Self {
        self.changes.push(Change::Remove(uid));
        self
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// A durable entry with its encoded text ([`format::encode_entry`]), made
/// once when the entry is put: a write encodes only what it changes.
struct Stored {
    entry: ClaimEntry,
    encoded: Box<[u8]>,
}

impl Stored {
    fn new(uid: &ClaimUid, entry: ClaimEntry) -> Result<Arc<Self>, serde_json::Error> {
        let encoded = format::encode_entry(uid, &entry)?.into_boxed_slice();
        Ok(Arc::new(Self { entry, encoded }))
    }
}

/// The durable entries by UID. The writer holds a second reference while
/// it writes (without the lock) and changes the map in place once it is
/// done, so no write copies the entries.
type Entries = BTreeMap<ClaimUid, Arc<Stored>>;

/// What a group of batches does, per UID: the last change wins (`None`
/// removes), each new entry encoded.
type Changed = BTreeMap<ClaimUid, Option<Arc<Stored>>>;

fn changed(group: Vec<(u64, Batch)>) -> Result<Changed, serde_json::Error> {
    let mut last: BTreeMap<ClaimUid, Option<ClaimEntry>> = BTreeMap::new();
    for change in group.into_iter().flat_map(|(_, batch)| batch.changes) {
        match change {
            Change::Put(uid, entry) => last.insert(uid, Some(entry)),
            Change::Remove(uid) => last.insert(uid, None),
        };
    }
    last.into_iter()
        .map(|(uid, entry)| {
            let stored = entry.map(|e| Stored::new(&uid, e)).transpose()?;
            Ok((uid, stored))
        })
        .collect()
}

/// The file for `durable` with `changed` applied, from the encoded
/// entries; the same bytes as encoding that checkpoint afresh.
fn encode_with(
    boot_id: &str,
    durable: &Entries,
    changed: &Changed,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut entries: Vec<(&ClaimUid, &[u8])> = durable
        .iter()
        .filter(|(uid, _)| !changed.contains_key(*uid))
        .map(|(uid, s)| (uid, &s.encoded[..]))
        .chain(
            changed
                .iter()
                .filter_map(|(uid, s)| s.as_ref().map(|s| (uid, &s.encoded[..]))),
        )
        .collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    format::assemble(boot_id, entries.into_iter())
}

/// Puts `temp` in place of `path` in one atomic step: an exchange of the
/// two names when the filesystem can (the old `path` then lives on as
/// `temp`), a rename otherwise (also when `path` does not exist yet).
fn exchange_or_rename(temp: &Path, path: &Path) -> io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    match renameat_with(CWD, temp, CWD, path, RenameFlags::EXCHANGE) {
        Ok(()) => Ok(()),
        // No `path` yet (the first write), or a filesystem (or kernel)
        // without exchange.
        Err(Errno::NOENT | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            fs::rename(temp, path)
        }
        Err(e) => Err(e.into()),
    }
}

/// State shared by committing threads.
#[derive(Default)]
struct Shared {
    /// What is on disk (with [`Store::boot_id`]).
    durable: Arc<Entries>,
    /// Batches waiting for the next write, with their sequence numbers.
    queue: Vec<(u64, Batch)>,
    next_seq: u64,
    /// Whether a thread is writing.
    writing: bool,
    /// Results of finished writes, per batch, until its caller takes it.
    outcomes: HashMap<u64, Result<(), WriteFailure>>,
}

/// The durable checkpoint of one plugin instance.
pub struct Store {
    dir: PathBuf,
    path: PathBuf,
    /// The boot the entries belong to (this boot, once open).
    boot_id: String,
    failpoints: Vec<Armed>,
    shared: Mutex<Shared>,
    written: Condvar,
    writes: AtomicU64,
    /// The ledger of lost claims, as on disk; held while it is rewritten.
    lost: Mutex<Ledger>,
    #[cfg(test)]
    before_write: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Fails the next write's directory fsync (after the rename), once.
    #[cfg(test)]
    fail_dir_sync: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the checkpoint in `state_dir` for the boot named
    /// by the file `boot_id_path` (`/proc/sys/kernel/random/boot_id`).
    ///
    /// Bad entries are quarantined and an unusable file is moved aside (both
    /// reported, the node starts with what is left); only a file of a newer
    /// format version, an unreadable file or an unwritable directory is an
    /// error.
    pub fn open(state_dir: &Path, boot_id_path: &Path) -> Result<(Self, LoadReport), Error> {
        let boot_id = read_boot_id(boot_id_path)?;
        fs::create_dir_all(state_dir)
            .map_err(|e| failure("create state directory", state_dir, e))?;
        let store = Self {
            dir: state_dir.to_owned(),
            path: state_dir.join(FILE_NAME),
            boot_id: boot_id.clone(),
            failpoints: Armed::from_env(),
            shared: Mutex::new(Shared::default()),
            written: Condvar::new(),
            writes: AtomicU64::new(0),
            lost: Mutex::new(Ledger::new()),
            #[cfg(test)]
            before_write: Mutex::new(None),
            #[cfg(test)]
            fail_dir_sync: std::sync::atomic::AtomicBool::new(false),
        };
        let mut report = LoadReport::default();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Claims whose entries this load loses, with what their text names.
        let mut newly_lost = Ledger::new();

        let mut claims = BTreeMap::new();
        let clean = match read_capped(&store.path)? {
            Capped::Missing => false,
            Capped::TooLarge(len) => {
                store.move_aside(
                    format!("the file is {len} bytes, more than the {MAX_FILE_BYTES}-byte limit"),
                    &mut report,
                )?;
                if let Some((path, reason)) = &report.moved_aside {
                    // Not this plugin's writing: every name in it is kept,
                    // none of them for a claim.
                    let source = format!("checkpoint moved aside to {} ({reason})", path.display());
                    match lost::from_large_file(path, &source, now) {
                        Ok(names) if !names.names_nothing() => {
                            newly_lost.insert(ClaimUid::from(lost::UNATTRIBUTED), names);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!(
                            path = %path.display(),
                            error = %e,
                            "the moved-aside checkpoint cannot be read for what it names: the startup sweep removes it"
                        ),
                    }
                }
                false
            }
            Capped::Bytes(bytes) => match format::decode(&bytes) {
                Decoded::Newer(version) => {
                    return Err(Error::NewerVersion {
                        path: store.path.clone(),
                        version,
                    });
                }
                Decoded::Unusable(reason) => {
                    store.move_aside(reason, &mut report)?;
                    // Entries that still verify are taken back one by one
                    // (those of another boot are left to the ledger).
                    let salvaged = format::salvage(&bytes).filter(|s| s.boot_id == boot_id);
                    if let Some((path, reason)) = &report.moved_aside {
                        let source =
                            format!("checkpoint moved aside to {} ({reason})", path.display());
                        let verified = salvaged.as_ref().map(|s| &s.claims);
                        newly_lost = lost::from_file(
                            &bytes,
                            true,
                            verified.unwrap_or(&BTreeMap::new()),
                            &source,
                            now,
                        );
                    }
                    if let Some(salvaged) = salvaged {
                        report.salvaged = salvaged.claims.len();
                        report.salvaged_all = salvaged.damaged.is_empty();
                        tracing::warn!(
                            salvaged = report.salvaged,
                            damaged = ?salvaged.damaged,
                            "entries that still verify taken from the unusable checkpoint"
                        );
                        claims = salvaged.claims;
                        store.quarantine(
                            salvaged.quarantined,
                            now,
                            &mut newly_lost,
                            &mut report,
                        )?;
                    }
                    false
                }
                Decoded::Usable {
                    boot_id: file_boot,
                    claims,
                    quarantined,
                } if file_boot != boot_id => {
                    report.discarded_for_reboot = claims.len() + quarantined.len();
                    tracing::warn!(
                        previous_boot = %file_boot,
                        boot = %boot_id,
                        discarded = report.discarded_for_reboot,
                        "the node rebooted: discarding prepared state of the previous boot"
                    );
                    if report.discarded_for_reboot > 0 {
                        report.previous_boot_copy = store.keep_previous_boot();
                        // After a real reboot nothing they name is left, and
                        // recovery forgets them; a damaged boot id reads as
                        // a reboot too, and then it keeps them.
                        let source = format!("checkpoint of boot {file_boot}");
                        newly_lost = lost::from_file(&bytes, false, &BTreeMap::new(), &source, now);
                        let each = claims
                            .iter()
                            .map(|(uid, entry)| {
                                (uid.clone(), lost::from_entry(entry, &source, now))
                            })
                            .chain(quarantined.iter().map(|q| {
                                (
                                    ClaimUid(q.uid.clone()),
                                    lost::from_stored(&q.raw, &source, now),
                                )
                            }));
                        for (uid, claim) in each {
                            merge_into(&mut newly_lost, uid, claim);
                        }
                    }
                    report.previous_boot_id = Some(file_boot);
                    false
                }
                Decoded::Usable {
                    claims: loaded,
                    quarantined,
                    ..
                } => {
                    // What the text names beyond the verified entries: the
                    // quarantined ones, and the text of an entry whose key
                    // a damage made another's (JSON keeps the last). A file
                    // whose every key verified, each once, names nothing
                    // more: the common start reads its text only once.
                    let whole = quarantined.is_empty()
                        && std::str::from_utf8(&bytes)
                            .is_ok_and(|text| format::entry_keys(text).len() == loaded.len());
                    if !whole {
                        newly_lost = lost::from_file(
                            &bytes,
                            !quarantined.is_empty(),
                            &loaded,
                            "checkpoint text no verified entry owns",
                            now,
                        );
                    }
                    claims = loaded;
                    let clean = quarantined.is_empty() && newly_lost.is_empty();
                    store.quarantine(quarantined, now, &mut newly_lost, &mut report)?;
                    clean
                }
            },
        };
        report.loaded = claims.len();
        let serialise =
            |e: serde_json::Error| failure("serialise checkpoint", &store.path, e.into());
        let entries = claims
            .into_iter()
            .map(|(uid, entry)| Ok((uid.clone(), Stored::new(&uid, entry)?)))
            .collect::<Result<Entries, serde_json::Error>>()
            .map_err(serialise)?;
        // Durable before the checkpoint is rewritten without the lost
        // entries: a crash in between must not forget them.
        store.open_ledger(newly_lost)?;
        if !clean {
            // Rewrite so that the file holds exactly what is in memory.
            let bytes =
                encode_with(&store.boot_id, &entries, &Changed::new()).map_err(serialise)?;
            store
                .write_atomic(&store.path, &bytes, None)
                .map_err(|u| u.failure)?;
        }
        store.lock().durable = Arc::new(entries);
        tracing::info!(path = %store.path.display(), claims = report.loaded, "checkpoint loaded");
        Ok((store, report))
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A copy of the durable checkpoint.
    pub fn snapshot(&self) -> Checkpoint {
        Checkpoint {
            boot_id: self.boot_id.clone(),
            claims: self.claims_where(|_| true),
        }
    }

    /// The durable entries `keep` selects: a copy of part of the
    /// checkpoint, for callers that need a few entries out of many (a copy
    /// of all of them per prepare grows with the node's claims).
    pub fn claims_where(
        &self,
        keep: impl Fn(&ClaimEntry) -> bool,
    ) -> BTreeMap<ClaimUid, ClaimEntry> {
        self.lock()
            .durable
            .iter()
            .filter(|(_, s)| keep(&s.entry))
            .map(|(u, s)| (u.clone(), s.entry.clone()))
            .collect()
    }

    /// The claims whose entries were lost, with what their text names
    /// (see [`LostClaim`]).
    pub fn lost(&self) -> Ledger {
        self.lost_ledger().clone()
    }

    /// Whether a claim of the ledger of lost claims passes `test`.
    pub fn any_lost(&self, test: impl Fn(&LostClaim) -> bool) -> bool {
        self.lost_ledger().values().any(test)
    }

    /// Whether a record of the ledger of lost claims passes `test`, given
    /// its key too (one is [`lost::UNATTRIBUTED`]).
    pub fn any_lost_where(&self, test: impl Fn(&ClaimUid, &LostClaim) -> bool) -> bool {
        self.lost_ledger().iter().any(|(uid, l)| test(uid, l))
    }

    /// The first `Some` that `find` gives for a claim of the ledger of lost
    /// claims.
    pub fn find_lost<T>(&self, find: impl Fn(&LostClaim) -> Option<T>) -> Option<T> {
        self.lost_ledger().values().find_map(find)
    }

    /// Whether the ledger of lost claims names `uid`.
    pub fn is_lost(&self, uid: &ClaimUid) -> bool {
        self.lost_ledger().contains_key(uid)
    }

    /// Changes the ledger of lost claims with `change` and makes it durable
    /// (the file is removed once no claim is left in it). On error the
    /// ledger is unchanged.
    pub fn update_lost(&self, change: impl FnOnce(&mut Ledger)) -> Result<(), Error> {
        let mut held = self.lost_ledger();
        let mut next = held.clone();
        change(&mut next);
        if next != *held {
            self.write_ledger(&next)?;
            *held = next;
        }
        Ok(())
    }

    fn lost_ledger(&self) -> MutexGuard<'_, Ledger> {
        self.lost.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Loads the ledger of lost claims and adds `newly_lost` to it (written
    /// at once). A ledger that cannot be used is set aside, reported, and
    /// replaced.
    fn open_ledger(&self, newly_lost: Ledger) -> Result<(), Error> {
        let path = self.dir.join(LOST_FILE_NAME);
        let unusable = match read_capped_at(&path, lost::MAX_LEDGER_BYTES)? {
            Capped::Missing => None,
            Capped::TooLarge(len) => Some(format!("{len} bytes, over the limit")),
            Capped::Bytes(bytes) => match lost::decode_ledger(&bytes) {
                Ok(ledger) => {
                    *self.lost_ledger() = ledger;
                    None
                }
                Err(reason) => Some(reason),
            },
        };
        if let Some(reason) = unusable {
            let aside = self.dir.join(format!("{LOST_FILE_NAME}.unusable"));
            let moved = fs::rename(&path, &aside);
            tracing::error!(
                path = %path.display(),
                moved_to = %aside.display(),
                moved = moved.is_ok(),
                reason = %reason,
                "ledger of lost checkpoint entries unusable: what it named is no longer kept"
            );
        }
        if newly_lost.is_empty() {
            return Ok(());
        }
        for (uid, claim) in &newly_lost {
            if uid.0 == lost::UNATTRIBUTED {
                tracing::warn!(
                    source = %claim.source,
                    mig = ?claim.mig_uuids,
                    mps = ?claim.mps_daemons,
                    "damaged checkpoint text names these outside any entry that verified: kept for whichever claim's pods use them, until they are gone or the ledger is removed by hand (a claim's own MPS daemons go at its unprepare)"
                );
                continue;
            }
            tracing::warn!(
                claim = %uid,
                source = %claim.source,
                mig = ?claim.mig_uuids,
                mps = ?claim.mps_daemons,
                "checkpoint entry lost: what its text names is kept for the claim's pods until it is unprepared"
            );
        }
        self.update_lost(|ledger| {
            for (uid, claim) in newly_lost {
                match ledger.get_mut(&uid) {
                    Some(known) => known.merge(claim),
                    None => {
                        ledger.insert(uid, claim);
                    }
                }
            }
        })
    }

    /// Makes the state directory's entries (a rename, a removal) durable.
    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir).and_then(|dir| dir.sync_all())
    }

    /// Writes `ledger` durably, or removes its file when it is empty.
    fn write_ledger(&self, ledger: &Ledger) -> Result<(), Error> {
        let path = self.dir.join(LOST_FILE_NAME);
        if ledger.is_empty() {
            return match fs::remove_file(&path) {
                Ok(()) => self
                    .sync_dir()
                    .map_err(|e| failure("fsync directory", &self.dir, e).into()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failure("remove", &path, e).into()),
            };
        }
        let bytes = lost::encode_ledger(ledger)
            .map_err(|e| failure("serialise the lost-entry ledger", &path, e.into()))?;
        self.write_atomic(&path, &bytes, None)
            .map_err(|u| u.failure.into())
    }

    /// The durable entry of `uid`.
    pub fn get(&self, uid: &ClaimUid) -> Option<ClaimEntry> {
        self.lock().durable.get(uid).map(|s| s.entry.clone())
    }

    /// How many times the checkpoint file has been written by commits since
    /// open (a metric; fewer than the commits when they were grouped).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Applies `batch` and makes it durable, together with batches other
    /// threads commit at the same time. Returns once the file on disk holds
    /// the batch. On error the batch is not applied, unless the write
    /// failed after the new file took the checkpoint's name (its
    /// directory's fsync): then the entries follow the file, which every
    /// reader (and the next start) sees; the caller's rollback, seeing its
    /// entry, marks it for the undo before it undoes anything.
    pub fn commit(&self, batch: Batch) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut shared = self.lock();
        let seq = shared.next_seq;
        shared.next_seq += 1;
        shared.queue.push((seq, batch));
        loop {
            if let Some(outcome) = shared.outcomes.remove(&seq) {
                return outcome.map_err(Error::from);
            }
            if shared.writing {
                shared = self
                    .written
                    .wait(shared)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Become the writer for everything queued so far.
            shared.writing = true;
            let group = std::mem::take(&mut shared.queue);
            let durable = Arc::clone(&shared.durable);
            drop(shared);

            let seqs: Vec<u64> = group.iter().map(|(s, _)| *s).collect();
            #[cfg(test)]
            if let Some(hook) = self
                .before_write
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
            {
                hook();
            }
            let written = changed(group)
                .and_then(|changed| {
                    encode_with(&self.boot_id, &durable, &changed).map(|bytes| (changed, bytes))
                })
                .map_err(|e| (failure("serialise checkpoint", &self.path, e.into()), None))
                .and_then(|(changed, bytes)| {
                    let armed =
                        Armed::for_write(&self.failpoints, self.writes.load(Ordering::Relaxed) + 1);
                    match self.write_atomic(&self.path, &bytes, armed) {
                        Ok(()) => Ok(changed),
                        Err(Unfinished { failure, in_place }) => {
                            Err((failure, in_place.then_some(changed)))
                        }
                    }
                });
            self.writes.fetch_add(1, Ordering::Relaxed);
            // The only other reference: the map is changed in place below.
            drop(durable);

            shared = self.lock();
            shared.writing = false;
            let apply = |shared: &mut Shared, changed: Changed| {
                let entries = Arc::make_mut(&mut shared.durable);
                for (uid, stored) in changed {
                    match stored {
                        Some(stored) => entries.insert(uid, stored),
                        None => entries.remove(&uid),
                    };
                }
            };
            let result = match written {
                Ok(changed) => {
                    apply(&mut shared, changed);
                    Ok(())
                }
                Err((e, in_place)) => {
                    let in_place = in_place.map(|changed| apply(&mut shared, changed));
                    tracing::error!(
                        error = %e,
                        batches = seqs.len(),
                        in_place = in_place.is_some(),
                        "checkpoint write failed"
                    );
                    Err(e)
                }
            };
            for s in seqs {
                shared.outcomes.insert(s, result.clone());
            }
            self.written.notify_all();
        }
    }

    /// Writes the checkpoint and the ledger again when the checkpoint file
    /// is gone from disk (its directory removed under the running plugin:
    /// by default the state directory is kubelet's `plugins/<driver>`,
    /// which node clean-ups and kubelet reinstalls remove), so a crash
    /// after that still finds every prepared claim. Returns whether it
    /// wrote. Waits for a commit in progress and holds the writer's turn,
    /// so no commit writes at the same time.
    pub fn restore_if_removed(&self) -> Result<bool, Error> {
        if fs::symlink_metadata(&self.path).is_ok() {
            return Ok(false);
        }
        let mut shared = self.lock();
        while shared.writing {
            shared = self
                .written
                .wait(shared)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if fs::symlink_metadata(&self.path).is_ok() {
            return Ok(false);
        }
        shared.writing = true;
        let durable = Arc::clone(&shared.durable);
        drop(shared);
        let written = fs::create_dir_all(&self.dir)
            .map_err(|e| failure("create state directory", &self.dir, e).into())
            .and_then(|()| {
                encode_with(&self.boot_id, &durable, &Changed::new())
                    .map_err(|e| failure("serialise checkpoint", &self.path, e.into()).into())
            })
            .and_then(|bytes| {
                self.write_atomic(&self.path, &bytes, None)
                    .map_err(|u| u.failure.into())
            })
            .and_then(|()| self.write_ledger(&self.lost_ledger()));
        drop(durable);
        let mut shared = self.lock();
        shared.writing = false;
        drop(shared);
        // Commits queued meanwhile wait for a writer's turn.
        self.written.notify_all();
        written.map(|()| true)
    }

    /// Installs a hook the writer calls right before each commit write.
    #[cfg(test)]
    pub(super) fn set_before_write(&self, hook: Box<dyn Fn() + Send>) {
        *self
            .before_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// Makes the next write's directory fsync fail.
    #[cfg(test)]
    pub(super) fn fail_next_dir_sync(&self) {
        self.fail_dir_sync.store(true, Ordering::Relaxed);
    }

    /// Number of batches waiting for a write.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn temp_path(&self, path: &Path) -> PathBuf {
        let name = path
            .file_name()
            .map_or_else(|| FILE_NAME.into(), |n| n.to_string_lossy().into_owned());
        self.dir.join(format!("{name}.tmp"))
    }

    /// Replaces `path` with `bytes`: the temp file written (in place, from
    /// the start, cut to length) and fsynced, swapped with `path`, then the
    /// directory fsynced (see the module docs).
    fn write_atomic(
        &self,
        path: &Path,
        bytes: &[u8],
        failpoint: Option<Failpoint>,
    ) -> Result<(), Unfinished> {
        let before = |failure| Unfinished {
            failure,
            in_place: false,
        };
        let temp = self.temp_path(path);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&temp)
            .map_err(|e| before(failure("open temp file", &temp, e)))?;
        Failpoint::hit(failpoint, Failpoint::BeforeTempWrite);
        if failpoint == Some(Failpoint::FailTempWrite) {
            return Err(before(failure(
                "write temp file",
                &temp,
                io::Error::other("injected write failure (failpoint)"),
            )));
        }
        if failpoint == Some(Failpoint::MidTempWrite) {
            file.write_all(&bytes[..bytes.len() / 2])
                .and_then(|()| file.sync_all())
                .map_err(|e| before(failure("write temp file", &temp, e)))?;
            Failpoint::hit(failpoint, Failpoint::MidTempWrite);
        }
        // Written from the start, then cut: an older, longer version in the
        // file leaves no tail. fdatasync covers the size (needed to read
        // the data back); the times need no flush.
        // A failed write (a full disk) removes the temp file: it is only a
        // buffer, and a partial one would hold on to the space.
        let unwritten = |what, e| {
            let _ = fs::remove_file(&temp);
            before(failure(what, &temp, e))
        };
        file.write_all(bytes)
            .and_then(|()| file.set_len(bytes.len() as u64))
            .map_err(|e| unwritten("write temp file", e))?;
        file.sync_data()
            .map_err(|e| unwritten("fsync temp file", e))?;
        drop(file);
        Failpoint::hit(failpoint, Failpoint::AfterTempWrite);
        exchange_or_rename(&temp, path)
            .map_err(|e| before(failure("rename temp file over", path, e)))?;
        Failpoint::hit(failpoint, Failpoint::AfterRename);
        #[cfg(test)]
        let injected = self.fail_dir_sync.swap(false, Ordering::Relaxed);
        #[cfg(not(test))]
        let injected = false;
        let synced = if injected || failpoint == Some(Failpoint::FailDirSync) {
            Err(io::Error::other("injected directory fsync failure"))
        } else {
            self.sync_dir()
        };
        synced.map_err(|e| Unfinished {
            failure: failure("fsync directory", &self.dir, e),
            in_place: true,
        })?;
        Failpoint::hit(failpoint, Failpoint::AfterDirSync);
        Ok(())
    }

    /// Renames the file of an earlier boot, which held entries, to
    /// [`PREVIOUS_BOOT_FILE_NAME`] (over an older one), for humans; best
    /// effort.
    fn keep_previous_boot(&self) -> Option<PathBuf> {
        let kept = self.dir.join(PREVIOUS_BOOT_FILE_NAME);
        match fs::rename(&self.path, &kept) {
            Ok(()) => {
                tracing::info!(path = %kept.display(), "checkpoint of the previous boot kept");
                Some(kept)
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot keep the checkpoint of the previous boot");
                None
            }
        }
    }

    /// Moves the unusable checkpoint file aside for humans.
    fn move_aside(&self, reason: String, report: &mut LoadReport) -> Result<(), Error> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let aside = self.dir.join(format!("{FILE_NAME}.corrupt-{nanos}"));
        fs::rename(&self.path, &aside).map_err(|source| Error::MoveAside {
            path: self.path.clone(),
            source,
        })?;
        tracing::error!(
            path = %self.path.display(),
            moved_to = %aside.display(),
            reason = %reason,
            "checkpoint unusable: moved aside, starting with no prepared claims \
             (what its entries' text names is kept for their claims until they are unprepared)"
        );
        report.moved_aside = Some((aside, reason));
        Ok(())
    }

    /// Records quarantined entries in the quarantine file (merged with what
    /// is there), in the report, and, with what their text names, among
    /// the claims `newly_lost`.
    fn quarantine(
        &self,
        entries: Vec<Quarantined>,
        now: u64,
        newly_lost: &mut Ledger,
        report: &mut LoadReport,
    ) -> Result<(), Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(QUARANTINE_FILE_NAME);
        // Best effort: a damaged quarantine file is replaced.
        let mut all = match read_capped(&path) {
            Ok(Capped::Bytes(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Object(map)) => map,
                _ => Map::new(),
            },
            _ => Map::new(),
        };
        for q in entries {
            tracing::error!(claim = %q.uid, reason = %q.reason, "checkpoint entry quarantined");
            let source = format!("quarantined ({})", q.reason);
            let claim = lost::from_stored(&q.raw, &source, now);
            match newly_lost.get_mut(&ClaimUid(q.uid.clone())) {
                // Its text's names were found already: the source is this.
                Some(known) => {
                    known.source.clone_from(&claim.source);
                    known.merge(claim);
                }
                None => {
                    newly_lost.insert(ClaimUid(q.uid.clone()), claim);
                }
            }
            let mut record = Map::new();
            record.insert("reason".into(), q.reason.clone().into());
            record.insert("quarantinedAtUnixSeconds".into(), now.into());
            record.insert("raw".into(), q.raw);
            all.insert(q.uid.clone(), Value::Object(record));
            report.quarantined.push((q.uid, q.reason));
        }
        let bytes = serde_json::to_vec_pretty(&Value::Object(all))
            .map_err(|e| failure("serialise quarantine", &path, e.into()))?;
        self.write_atomic(&path, &bytes, None)
            .map_err(|u| u.failure)?;
        Ok(())
    }
}

/// Adds `claim` to what `ledger` holds for `uid`.
fn merge_into(ledger: &mut Ledger, uid: ClaimUid, claim: LostClaim) {
    match ledger.get_mut(&uid) {
        Some(known) => known.merge(claim),
        None => {
            ledger.insert(uid, claim);
        }
    }
}

/// Reads `path`, refusing files over [`MAX_FILE_BYTES`] without reading them.
fn read_capped(path: &Path) -> Result<Capped, Error> {
    read_capped_at(path, MAX_FILE_BYTES)
}

/// Reads `path`, refusing files over `max` bytes without reading them.
fn read_capped_at(path: &Path, max: u64) -> Result<Capped, Error> {
    crate::prepare::capped::read_capped(path, max).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads the kernel boot id.
fn read_boot_id(path: &Path) -> Result<String, Error> {
    let err = |reason: String| Error::BootId {
        path: path.to_owned(),
        reason,
    };
    let mut text = String::new();
    File::open(path)
        .and_then(|f| f.take(256).read_to_string(&mut text))
        .map_err(|e| err(e.to_string()))?;
    let id = text.trim();
    if id.is_empty() {
        return Err(err("the file is empty".into()));
    }
    if id.len() > 128 || id.chars().any(char::is_control) {
        return Err(err("not a boot id (too long or control characters)".into()));
    }
    Ok(id.to_owned())
}

/// A write that failed, and whether the new file had already taken the
/// checkpoint's name (every later read sees it).
struct Unfinished {
    failure: WriteFailure,
    in_place: bool,
}

fn failure(step: &'static str, path: &Path, e: io::Error) -> WriteFailure {
    WriteFailure {
        step,
        path: path.to_owned(),
        source: Arc::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::{Armed, Failpoint};

    #[test]
    fn failpoints_parse_with_and_without_a_write_number() {
        assert_eq!(
            Armed::parse("checkpoint-mid-temp-write"),
            Ok(Some(Armed {
                at: Failpoint::MidTempWrite,
                write: 1
            }))
        );
        assert_eq!(
            Armed::parse("checkpoint-after-rename@3"),
            Ok(Some(Armed {
                at: Failpoint::AfterRename,
                write: 3
            }))
        );
        // The prepare code's own step failpoints are not the store's.
        assert_eq!(Armed::parse("prepare-after-mig"), Ok(None));
        assert_eq!(Armed::parse(""), Ok(None));
    }

    #[test]
    fn malformed_checkpoint_failpoints_are_refused_with_the_reason() {
        for (value, reason) in [
            ("checkpoint-after-renam", "unknown checkpoint failpoint"),
            ("checkpoint-after-rename@", "not a whole number"),
            ("checkpoint-after-rename@x", "not a whole number"),
            ("checkpoint-after-rename@-1", "not a whole number"),
            ("checkpoint-after-rename@1@2", "not a whole number"),
            ("checkpoint-after-rename@0", "between 1 and"),
            ("checkpoint-after-rename@1000001", "between 1 and"),
            (
                "checkpoint-after-rename@99999999999999999999999",
                "not a whole number",
            ),
            ("checkpoint-@2", "unknown checkpoint failpoint"),
        ] {
            let got = Armed::parse(value);
            assert!(
                matches!(got, Err(r) if r.contains(reason)),
                "{value:?}: {got:?}"
            );
        }
    }

    #[test]
    fn a_failpoint_hits_only_its_write() {
        let armed: Vec<Armed> = Armed::parse("checkpoint-after-temp-write@2")
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(Armed::for_write(&armed, 1), None);
        assert_eq!(Armed::for_write(&armed, 2), Some(Failpoint::AfterTempWrite));
        assert_eq!(Armed::for_write(&armed, 3), None);
        assert_eq!(Armed::for_write(&[], 1), None);
    }

    #[test]
    fn a_list_arms_each_checkpoint_failpoint_in_it_and_the_first_for_a_write_wins() {
        let armed = Armed::parse_all(
            "checkpoint-fail-dir-sync@2,prepare-after-mig,checkpoint-bogus,checkpoint-fail-temp-write@3,checkpoint-after-rename@3,",
        );
        assert_eq!(
            armed,
            [
                Armed {
                    at: Failpoint::FailDirSync,
                    write: 2
                },
                Armed {
                    at: Failpoint::FailTempWrite,
                    write: 3
                },
                Armed {
                    at: Failpoint::AfterRename,
                    write: 3
                },
            ]
        );
        assert_eq!(Armed::for_write(&armed, 1), None);
        assert_eq!(Armed::for_write(&armed, 2), Some(Failpoint::FailDirSync));
        assert_eq!(Armed::for_write(&armed, 3), Some(Failpoint::FailTempWrite));
        assert!(Armed::parse_all("").is_empty());
    }
}
