//! The demo's proof that unprepare undoes everything prepare did: each kind
//! of state a prepared claim leaves on a node is looked up where it really
//! lives, independently of the plugin's own bookkeeping:
//!
//! - CDI spec files in the CDI directory;
//! - MIG capability files (`<proc>/driver/nvidia/capabilities/gpu*/mig/gi*`
//!   and the `nvidia-cap<N>` nodes of GPU and compute instances), and the
//!   GPU instances NVML lists;
//! - MPS daemon directories in the state directory, and live processes
//!   started from the fake driver root (daemons, servers, clients);
//! - entries of the checkpoint, in the preparer's memory and in its file.
//!
//! A check that cannot be made counts as something left. The run also
//! looks after the one path outside its temporary directory that it may
//! need: `/tmp/nvidia-mps`, the mount point MPS daemons use in their
//! private mount namespace when the plugin runs as root, shared with any
//! other demo run at the same time ([`OutsidePaths`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::prepare::Preparer;
use gpu_nvml::GpuBackend;
use rustix::fs::{FlockOperation, flock};
use serde_json::{Value, json};

/// Where a node's state lives in the demo.
#[derive(Clone)]
pub struct NodePaths {
    /// `--cdi-root`.
    pub cdi: PathBuf,
    /// `--proc-root`.
    pub proc_root: PathBuf,
    /// `--dev-root`.
    pub dev_root: PathBuf,
    /// The plugin's state directory.
    pub state_dir: PathBuf,
    /// The fake driver root (`--driver-root`).
    pub driver_root: fake_driver_root::FakeDriverRoot,
}

/// What prepared claims leave on the node; empty after a clean unprepare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub cdi_specs: Vec<String>,
    pub mig_capabilities: Vec<String>,
    pub mig_instances: Vec<String>,
    pub mps_daemon_dirs: Vec<String>,
    pub processes: Vec<String>,
    /// Claim UIDs in the preparer's checkpoint, in memory.
    pub checkpoint_memory: Vec<String>,
    /// Claim UIDs in the checkpoint file.
    pub checkpoint_file: Vec<String>,
    /// Checks that could not be made.
    pub failed_checks: Vec<String>,
}

impl Leftovers {
    /// Row labels, in the order of [`Leftovers::counts`].
    pub const LABELS: [&'static str; 8] = [
        "CDI spec files",
        "MIG capability files and nodes",
        "MIG GPU instances (NVML)",
        "MPS daemon directories",
        "processes from the driver root",
        "checkpoint entries (memory)",
        "checkpoint entries (file)",
        "checks that could not be made",
    ];

    fn lists(&self) -> [&Vec<String>; 8] {
        [
            &self.cdi_specs,
            &self.mig_capabilities,
            &self.mig_instances,
            &self.mps_daemon_dirs,
            &self.processes,
            &self.checkpoint_memory,
            &self.checkpoint_file,
            &self.failed_checks,
        ]
    }

    pub fn counts(&self) -> [usize; 8] {
        self.lists().map(Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.counts().iter().all(|n| *n == 0)
    }

    /// Every item, for the report.
    pub fn paths(&self) -> Vec<String> {
        self.lists().into_iter().flatten().cloned().collect()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cdiSpecs": self.cdi_specs,
            "migCapabilities": self.mig_capabilities,
            "migInstances": self.mig_instances,
            "mpsDaemonDirs": self.mps_daemon_dirs,
            "processes": self.processes,
            "checkpointEntries": self.checkpoint_memory,
            "checkpointFileEntries": self.checkpoint_file,
            "failedChecks": self.failed_checks,
        })
    }

    /// Looks everything up. With `settle`, processes are waited for (up to
    /// 5 s) to be gone: a daemon told to quit takes a moment to exit.
    pub fn scan(
        node: &NodePaths,
        backend: &dyn GpuBackend,
        gpu_indexes: &[u32],
        preparer: &Preparer,
        settle: bool,
    ) -> Self {
        let mut out = Leftovers::default();
        out.cdi_specs = files_in(&node.cdi, &mut out.failed_checks, |_| true);
        out.mig_capabilities = mig_capabilities(node, &mut out.failed_checks);
        for &index in gpu_indexes {
            match backend.gpu_instances(index) {
                Ok(instances) => out.mig_instances.extend(
                    instances
                        .iter()
                        .map(|gi| format!("GPU {index}: GPU instance {}", gi.id)),
                ),
                Err(e) => out
                    .failed_checks
                    .push(format!("NVML GPU instances of GPU {index}: {e}")),
            }
        }
        let mps = node.state_dir.join("mps");
        if mps.exists() {
            out.mps_daemon_dirs = files_in(&mps, &mut out.failed_checks, Path::is_dir);
        }
        out.processes = processes(&node.driver_root, settle);
        out.checkpoint_memory = preparer
            .checkpoint()
            .claims
            .keys()
            .map(|uid| format!("checkpoint entry {uid}"))
            .collect();
        out.checkpoint_file = checkpoint_file(node, &mut out.failed_checks);
        out
    }
}

/// Entries of `dir` for which `keep` holds, as paths.
fn files_in(dir: &Path, failed: &mut Vec<String>, keep: impl Fn(&Path) -> bool) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut out: Vec<String> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| keep(p))
                .map(|p| p.display().to_string())
                .collect();
            out.sort();
            out
        }
        Err(e) => {
            failed.push(format!("list {}: {e}", dir.display()));
            Vec::new()
        }
    }
}

/// `gi*` directories under each GPU's `mig` capabilities, and the
/// `nvidia-cap<N>` nodes of GPU and compute instances (minors 3 and up;
/// 1 and 2 are the node-wide `config` and `monitor`).
fn mig_capabilities(node: &NodePaths, failed: &mut Vec<String>) -> Vec<String> {
    let caps = node.proc_root.join("driver/nvidia/capabilities");
    let mut out = Vec::new();
    let gpus = files_in(&caps, failed, |p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("gpu"))
    });
    for gpu in gpus {
        let mig = Path::new(&gpu).join("mig");
        if mig.exists() {
            out.extend(files_in(&mig, failed, |p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("gi"))
            }));
        }
    }
    let nodes = node.dev_root.join("dev/nvidia-caps");
    if nodes.exists() {
        out.extend(files_in(&nodes, failed, |p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("nvidia-cap"))
                .and_then(|m| m.parse::<u32>().ok())
                .is_some_and(|m| m >= 3)
        }));
    }
    out
}

/// Live processes started from the driver root, `pid: command line`; with
/// `settle`, waits up to 15 s (room for a loaded machine) for them to go.
fn processes(root: &fake_driver_root::FakeDriverRoot, settle: bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pids = root.processes();
        if pids.is_empty() || !settle || Instant::now() >= deadline {
            return pids
                .into_iter()
                .map(|pid| {
                    let cmd = fake_driver_root::cmdline(pid).unwrap_or_default().join(" ");
                    format!("pid {pid}: {cmd}")
                })
                .collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Claim UIDs in the checkpoint file.
fn checkpoint_file(node: &NodePaths, failed: &mut Vec<String>) -> Vec<String> {
    let mut uids = Vec::new();
    let file = node
        .state_dir
        .join(gpu_kubelet_plugin::prepare::checkpoint::FILE_NAME);
    match std::fs::read(&file) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(doc) => {
                if let Some(entries) = doc["entries"].as_object() {
                    uids.extend(
                        entries
                            .keys()
                            .map(|uid| format!("{} entry {uid}", file.display())),
                    );
                } else {
                    failed.push(format!("{}: no entries object", file.display()));
                }
            }
            Err(e) => failed.push(format!("{}: {e}", file.display())),
        },
        // Never written: nothing was ever prepared.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => failed.push(format!("read {}: {e}", file.display())),
    }
    uids
}

/// The MPS daemons' mount point outside the temporary directory.
pub const MPS_MOUNT_POINT: &str = "/tmp/nvidia-mps";

/// The mode of a mount point a demo run made: the sticky bit marks it, so
/// that any later run can tell it from one the host's plugin made (a
/// plugin's has no sticky bit; a demo never removes one).
const DEMO_MADE_MODE: u32 = 0o1755;

/// How many times [`OutsidePaths::observe`] makes the mount point anew
/// after another run removed it between the making and the locking.
const HOLD_TRIES: usize = 20;

/// `/tmp/nvidia-mps` for the length of a run.
///
/// Several runs at once (the test suite starts a dozen) share the one
/// mount point, so one run's removal must never hit another's daemons: a
/// daemon binds its pipe directory there, and an `rmdir` of a mount point
/// in another mount namespace detaches that mount. So a run that may need
/// it (as root, when the plugin's daemons mount it) makes it with
/// [`DEMO_MADE_MODE`] if it is missing and holds a shared `flock` on it
/// until it settles. A settling run removes it only when it carries the
/// demo's mark, is empty, no process mounts it and an exclusive lock is
/// free (no other run holds it); the last run out removes it. A run whose
/// lock lands on a directory removed meanwhile makes it anew.
///
/// Not root: the daemons share the plugin's `/dev/shm` and pipe path
/// (`ShmMode::Inherit`), nothing is made there and nothing is touched.
pub struct OutsidePaths {
    path: PathBuf,
    /// The locked directory, while the run holds it.
    held: Option<std::fs::File>,
    /// Why it could not be held (reported at the end).
    unheld: Option<String>,
}

impl OutsidePaths {
    /// Makes and holds the mount point when this run is root.
    pub fn observe() -> Self {
        Self::observe_at(
            Path::new(MPS_MOUNT_POINT),
            rustix::process::geteuid().is_root(),
        )
    }

    fn observe_at(path: &Path, hold: bool) -> Self {
        let (held, unheld) = if hold {
            match hold_dir(path) {
                Ok(dir) => (Some(dir), None),
                Err(e) => (None, Some(format!("{}: {e}", path.display()))),
            }
        } else {
            (None, None)
        };
        Self {
            path: path.to_path_buf(),
            held,
            unheld,
        }
    }

    /// After the run: removes the mount point when this run is the last
    /// one holding it and it is a demo's, empty and mounted nowhere.
    /// Returns what this run left outside its temporary directory, and
    /// what was done. Settling again does nothing.
    pub fn settle(&mut self) -> (Vec<String>, Option<String>) {
        let Some(dir) = self.held.take() else {
            let note = self.unheld.take().map(|e| {
                format!("could not hold the MPS mount point ({e}): another demo run could have removed it under this run's daemons")
            });
            return (Vec::new(), note);
        };
        let shown = self.path.display();
        let demo_made = dir
            .metadata()
            .is_ok_and(|m| m.permissions().mode() & 0o7777 == DEMO_MADE_MODE);
        if !demo_made {
            return (Vec::new(), None);
        }
        // Non-blocking: a shared lock held elsewhere is another run's.
        if flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
            return (
                Vec::new(),
                Some(format!(
                    "{shown}: the MPS mount point, held by another demo run: kept for it"
                )),
            );
        }
        if mounted_anywhere(&self.path) {
            return (
                Vec::new(),
                Some(format!(
                    "{shown}: the MPS mount point, mounted by another process's MPS daemon: kept"
                )),
            );
        }
        // Removed while the exclusive lock is held: a run locking it
        // meanwhile finds the directory it opened gone and makes it anew.
        match std::fs::remove_dir(&self.path) {
            Ok(()) => (
                Vec::new(),
                Some(format!(
                    "{shown}: the mount point the MPS daemons needed, made by a demo run: removed"
                )),
            ),
            Err(e) => (vec![format!("{shown} (cannot remove it: {e})")], None),
        }
    }
}

/// A run that ends early (an error) settles too, silently.
impl Drop for OutsidePaths {
    fn drop(&mut self) {
        let _ = self.settle();
    }
}

/// Makes `path` (with the demo's mark) unless it exists, and takes a
/// shared lock on it; again when the directory locked is no longer the
/// one at `path` (a settling run removed it in between).
fn hold_dir(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    for _ in 0..HOLD_TRIES {
        match std::fs::DirBuilder::new().mode(DEMO_MADE_MODE).create(path) {
            Ok(()) => {
                // mkdir's mode passes through the umask: set it exactly.
                match std::fs::set_permissions(
                    path,
                    std::fs::Permissions::from_mode(DEMO_MADE_MODE),
                ) {
                    Ok(()) => {}
                    // Not there any more: a settling run removed it before
                    // this one could lock it; make it again.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let dir = match std::fs::File::open(path) {
            Ok(dir) => dir,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        flock(&dir, FlockOperation::LockShared)?;
        let locked = dir.metadata()?;
        let now = std::fs::symlink_metadata(path);
        if now.is_ok_and(|m| m.dev() == locked.dev() && m.ino() == locked.ino()) {
            return Ok(dir);
        }
    }
    Err(std::io::Error::other(format!(
        "removed by other runs each of {HOLD_TRIES} times it was made"
    )))
}

/// Whether any process has a mount on `path` (its mount namespace's
/// `mountinfo` lists it as a mount point).
fn mounted_anywhere(path: &Path) -> bool {
    let Some(target) = path.to_str() else {
        return true;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.filter_map(Result::ok).any(|e| {
        let is_pid = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(e.path().join("mountinfo")).is_ok_and(|info| {
                info.lines()
                    .any(|line| line.split(' ').nth(4) == Some(target))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory and the mount point's path in it (not made).
    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia-mps");
        (dir, path)
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// Settles `outside`: nothing left, and a note that says `expected`.
    fn settles_with_note(outside: &mut OutsidePaths, expected: &str) {
        let (left, note) = outside.settle();
        assert!(left.is_empty(), "{left:?}");
        let note = note.expect("a note");
        assert!(note.contains(expected), "{note}");
    }

    #[test]
    fn a_mount_point_the_host_made_is_left_alone() {
        let (_dir, path) = scratch();
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut outside = OutsidePaths::observe_at(&path, true);
        assert_eq!(outside.settle(), (Vec::new(), None));
        assert!(path.exists());
        assert_eq!(mode(&path), 0o755);
    }

    #[test]
    fn a_mount_point_made_by_the_run_is_marked_and_removed() {
        let (_dir, path) = scratch();
        let mut outside = OutsidePaths::observe_at(&path, true);
        assert_eq!(mode(&path), DEMO_MADE_MODE);
        settles_with_note(&mut outside, "removed");
        assert!(!path.exists());
        // Settling again (the drop does) finds nothing to do.
        assert_eq!(outside.settle(), (Vec::new(), None));
    }

    #[test]
    fn a_run_that_is_not_root_makes_and_removes_nothing() {
        let (_dir, path) = scratch();
        let mut outside = OutsidePaths::observe_at(&path, false);
        assert!(!path.exists());
        // Even a demo's leftover is not touched.
        std::fs::DirBuilder::new().create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(DEMO_MADE_MODE)).unwrap();
        assert_eq!(outside.settle(), (Vec::new(), None));
        assert!(path.exists());
    }

    #[test]
    fn the_last_of_two_runs_removes_it_and_the_first_keeps_it_for_the_other() {
        let (_dir, path) = scratch();
        let mut first = OutsidePaths::observe_at(&path, true);
        let mut second = OutsidePaths::observe_at(&path, true);
        settles_with_note(&mut first, "held by another demo run");
        assert!(path.exists());
        settles_with_note(&mut second, "removed");
        assert!(!path.exists());
    }

    #[test]
    fn a_leftover_of_a_run_that_died_is_removed_by_the_next() {
        let (_dir, path) = scratch();
        // A run that died keeps nothing locked (the kernel drops its lock).
        let mut died = OutsidePaths::observe_at(&path, true);
        drop(died.held.take());
        drop(died);
        assert!(path.exists());
        settles_with_note(&mut OutsidePaths::observe_at(&path, true), "removed");
        assert!(!path.exists());
    }

    #[test]
    fn a_lock_that_lands_on_a_removed_mount_point_makes_it_anew() {
        use std::os::unix::fs::MetadataExt;
        let (_dir, path) = scratch();
        // A settling run: the exclusive lock, held until after its rmdir.
        let mut settling = OutsidePaths::observe_at(&path, true);
        let locked = settling.held.take().unwrap();
        flock(&locked, FlockOperation::NonBlockingLockExclusive).unwrap();
        let old_ino = locked.metadata().unwrap().ino();
        let joiner = {
            let path = path.clone();
            std::thread::spawn(move || OutsidePaths::observe_at(&path, true))
        };
        // The joiner waits for its shared lock (kernel's lock table).
        let waiting = format!(":{old_ino} ");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| l.contains("->") && l.contains(&waiting))
        {
            assert!(
                Instant::now() < deadline,
                "the joiner never waited for its lock"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_dir(&path).unwrap();
        drop(locked);
        let mut joiner = joiner.join().unwrap();
        // It holds the directory now at the path, made anew with the mark
        // (the inode number may be the old one's again: it was freed).
        let held = joiner.held.as_ref().expect("held");
        assert!(
            held.metadata().unwrap().nlink() > 0,
            "holds the removed one"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            held.metadata().unwrap().ino()
        );
        assert_eq!(mode(&path), DEMO_MADE_MODE);
        settles_with_note(&mut joiner, "removed");
    }

    #[test]
    fn a_non_empty_mount_point_is_reported_not_removed() {
        let (_dir, path) = scratch();
        let mut outside = OutsidePaths::observe_at(&path, true);
        std::fs::write(path.join("control"), b"").unwrap();
        let (left, _) = outside.settle();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].contains("cannot remove"), "{left:?}");
        assert!(path.join("control").exists());
    }

    #[test]
    fn a_mount_point_that_cannot_be_made_is_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-parent").join("nvidia-mps");
        let mut outside = OutsidePaths::observe_at(&path, true);
        settles_with_note(&mut outside, "missing-parent/nvidia-mps: No such file");
        // The note names the path; it is given once.
        assert!(outside.unheld.is_none());
        assert!(!path.exists());
    }

    #[test]
    fn the_root_mount_is_seen_and_a_plain_directory_is_not() {
        assert!(mounted_anywhere(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!mounted_anywhere(dir.path()));
    }

    #[test]
    fn an_unreadable_directory_is_a_failed_check() {
        let dir = tempfile::tempdir().unwrap();
        let mut failed = Vec::new();
        let found = files_in(&dir.path().join("missing"), &mut failed, |_| true);
        assert!(found.is_empty());
        assert_eq!(failed.len(), 1);
        assert!(failed[0].contains("missing"), "{failed:?}");
    }
}
