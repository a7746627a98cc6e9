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
//! watches the one path outside its temporary directory it may create:
//! `/tmp/nvidia-mps`, the mount point MPS daemons use in their private
//! mount namespace when the plugin runs as root.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::prepare::preparer::Preparer;
use gpu_nvml::GpuBackend;
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

/// Live processes started from the driver root, `pid: command line`.
fn processes(root: &fake_driver_root::FakeDriverRoot, settle: bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
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

/// `/tmp/nvidia-mps` as found before the run.
pub struct OutsidePaths {
    path: PathBuf,
    existed: bool,
}

impl OutsidePaths {
    /// Notes whether the mount point exists now.
    pub fn observe() -> Self {
        Self::observe_at(Path::new(MPS_MOUNT_POINT))
    }

    fn observe_at(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            existed: path.exists(),
        }
    }

    /// After the run: removes the mount point if it did not exist before,
    /// is empty and is a mount point in no process's mount namespace (so
    /// it was this run's daemons' and no other MPS daemon uses it). Returns
    /// what this run left outside its temporary directory, and what was
    /// done.
    pub fn settle(&self) -> (Vec<String>, Option<String>) {
        if self.existed || !self.path.exists() {
            return (Vec::new(), None);
        }
        let shown = self.path.display();
        if mounted_anywhere(&self.path) {
            return (
                Vec::new(),
                Some(format!(
                    "{shown} appeared during the run but another process's MPS daemon mounts it: kept"
                )),
            );
        }
        match std::fs::remove_dir(&self.path) {
            Ok(()) => (
                Vec::new(),
                Some(format!(
                    "{shown}: the mount point the MPS daemons needed, created by this run: removed"
                )),
            ),
            Err(e) => (vec![format!("{shown} (cannot remove it: {e})")], None),
        }
    }
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

    #[test]
    fn a_mount_point_that_existed_before_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia-mps");
        std::fs::create_dir(&path).unwrap();
        let outside = OutsidePaths::observe_at(&path);
        assert_eq!(outside.settle(), (Vec::new(), None));
        assert!(path.exists());
    }

    #[test]
    fn a_mount_point_created_during_the_run_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia-mps");
        let outside = OutsidePaths::observe_at(&path);
        std::fs::create_dir(&path).unwrap();
        let (left, note) = outside.settle();
        assert!(left.is_empty(), "{left:?}");
        assert!(note.unwrap().contains("removed"));
        assert!(!path.exists());
    }

    #[test]
    fn a_non_empty_mount_point_is_reported_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvidia-mps");
        let outside = OutsidePaths::observe_at(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("control"), b"").unwrap();
        let (left, _) = outside.settle();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].contains("cannot remove"), "{left:?}");
        assert!(path.join("control").exists());
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
