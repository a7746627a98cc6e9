//! Daemons under another MPS directory: those a checkpoint records under
//! an earlier `--mps-dir` are taken over where they run, and, when entries
//! were lost, this plugin's daemons there that nothing names are found by
//! their owner mark and stopped.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::PoisonError;

use super::stop::kill_and_wait;
use super::{DaemonDirs, MpsControl, MpsError, checked_id, procs, validate_id};
use crate::prepare::cdi::HostRoot;
use crate::prepare::checkpoint::MpsDaemonRecord;

impl MpsControl {
    /// The daemons taken over under another directory (a poisoned lock
    /// still holds a consistent map: each use is one map operation).
    pub(super) fn elsewhere(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        self.elsewhere
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn is_elsewhere(&self, id: &str) -> bool {
        self.elsewhere().contains_key(id)
    }

    pub(super) fn forget_elsewhere(&self, id: &str) {
        self.elsewhere().remove(id);
    }

    /// The MPS directory (host path) a checkpoint's daemon record names, when
    /// it is not `--mps-dir`: the plugin ran with another `--mps-dir` when
    /// the daemon was started. `None`: the current directory, or a record
    /// from before the directories were recorded. The record comes from a
    /// file: its three directories must be `<dir>/<id>/{pipe,log,shm}` of
    /// one absolute, normalized `dir` (log and shm may be missing).
    pub fn recorded_elsewhere(
        &self,
        record: &MpsDaemonRecord,
    ) -> Result<Option<PathBuf>, MpsError> {
        checked_id(&record.id)?;
        if record.pipe_dir.as_os_str().is_empty() {
            return Ok(None);
        }
        let bad = |reason: String| MpsError::BadRecord {
            path: record.pipe_dir.clone(),
            reason: format!(
                "the checkpoint's record of MPS daemon {}: {reason}",
                record.id
            ),
        };
        let normal = |p: &Path| {
            p.is_absolute()
                && p.components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        };
        let dir = record
            .pipe_dir
            .parent()
            .and_then(Path::parent)
            .filter(|d| normal(d))
            .ok_or_else(|| bad("the pipe directory is not <absolute dir>/<id>/pipe".into()))?;
        for (leaf, recorded) in [
            ("pipe", &record.pipe_dir),
            ("log", &record.log_dir),
            ("shm", &record.shm_dir),
        ] {
            let expected = dir.join(&record.id).join(leaf);
            if !(recorded.as_os_str().is_empty() && leaf != "pipe") && *recorded != expected {
                return Err(bad(format!(
                    "the {leaf} directory {} is not {}",
                    recorded.display(),
                    expected.display()
                )));
            }
        }
        // Spelled as components (`/a/./b/` is `/a/b`), as the marker is.
        let dir: PathBuf = dir.components().collect();
        Ok((dir != self.dir.host).then_some(dir))
    }

    /// Takes over daemon `id` under `dir` (from
    /// [`MpsControl::recorded_elsewhere`]), seen at that path: `start` (the
    /// claims of a memory-shared GPU join it), `check`, `stop`, its records
    /// and container edits use that directory until the daemon is stopped;
    /// daemons started later go under `--mps-dir`. Where this plugin cannot
    /// see `dir` (not mounted in its container), a start or check finds
    /// whether any process of the daemon is left by its marker, and `stop`
    /// kills them by it.
    pub fn adopt_elsewhere(&self, id: &str, dir: PathBuf) {
        self.elsewhere().insert(id.to_owned(), dir);
    }

    /// The directories to start or check daemon `id` in. A daemon taken
    /// over under a directory this plugin cannot see is forgotten when none
    /// of its processes is left, so it starts afresh under `--mps-dir`;
    /// while one runs, that is [`MpsError::Unreachable`] (a second daemon
    /// for its devices would fight it).
    pub(super) fn usable_dirs(&self, id: &str) -> Result<DaemonDirs, MpsError> {
        checked_id(id)?;
        // The map first, looked at once: a daemon under --mps-dir (every
        // start on a prepare's path) needs no look at the file system here.
        let Some(dir) = self.elsewhere().get(id).cloned() else {
            return Ok(DaemonDirs::under(&self.dir, id));
        };
        let dirs = DaemonDirs::under(&HostRoot::same(dir), id);
        if dirs.root.exists() {
            return Ok(dirs);
        }
        let pids = procs::daemon_processes(&dirs.root);
        if !pids.is_empty() {
            return Err(MpsError::Unreachable {
                id: id.to_owned(),
                dir: dirs.root,
                pids,
            });
        }
        tracing::warn!(
            daemon = %id,
            dir = %dirs.root.display(),
            "MPS daemon of an earlier --mps-dir, in a directory this plugin cannot see, is gone; it starts afresh under --mps-dir"
        );
        self.forget_elsewhere(id);
        Ok(DaemonDirs::under(&self.dir, id))
    }

    /// Kills this owner's daemons ([`Self::with_owner`]) that run under
    /// another MPS directory than `--mps-dir` and were not taken over from a
    /// record ([`Self::adopt_elsewhere`]): daemons of an earlier `--mps-dir`
    /// whose checkpoint entry was lost. Found by a walk over every process's
    /// environment, so only run when entries were lost; daemons under
    /// `--mps-dir` are [`Self::list`]ed instead. Returns `<id> in
    /// <directory>` of each daemon stopped, and the failures.
    ///
    /// A daemon whose id `keep` names (the text of a lost entry names it:
    /// its claim's pods may use it) is taken over where it runs instead,
    /// as from a record, so that its claim's unprepare can stop it; or left
    /// alone when `--mps-dir` has a daemon of that id too.
    ///
    /// Only the processes found are killed (the daemon and its servers, which
    /// carry both marks), with SIGKILL, and their directories are left:
    /// a process's environment is anyone's to write, so its marker is not
    /// trusted with a `quit` to a socket, a pid file or a directory removal.
    /// A forged mark only gets its own process killed.
    pub fn stop_orphans_elsewhere(
        &self,
        keep: &dyn Fn(&str) -> bool,
    ) -> (Vec<String>, Vec<String>) {
        let (mut stopped, mut errors) = (Vec::new(), Vec::new());
        let Some(owner) = &self.owner else {
            return (stopped, errors);
        };
        for (root, pids) in procs::owned_daemons(owner) {
            let (Some(dir), Some(id)) = (root.parent(), root.file_name()) else {
                continue;
            };
            if dir == self.dir.path {
                continue;
            }
            let Some(id) = id.to_str().filter(|id| validate_id(id).is_ok()) else {
                errors.push(format!(
                    "processes {pids:?} carry this plugin's mark and MPS daemon directory {}, whose name is not a daemon id; left running",
                    root.display()
                ));
                continue;
            };
            let known = self.elsewhere().get(id).cloned();
            if known.as_deref() == Some(dir) {
                continue;
            }
            if keep(id) {
                if known.is_some() || DaemonDirs::under(&self.dir, id).root.exists() {
                    tracing::warn!(daemon = %id, dir = %root.display(), "MPS daemon named by a lost checkpoint entry runs under an earlier --mps-dir, and a daemon of that id is known already: left running, not taken over");
                } else {
                    tracing::warn!(daemon = %id, dir = %root.display(), "MPS daemon named by a lost checkpoint entry: taken over where it runs, for its claim's pods");
                    self.adopt_elsewhere(id, dir.to_path_buf());
                }
                continue;
            }
            match kill_and_wait(pids) {
                Ok(()) => {
                    tracing::warn!(
                        daemon = %id,
                        dir = %root.display(),
                        "killed MPS daemon of an earlier --mps-dir whose checkpoint entry was lost; its directory is left"
                    );
                    stopped.push(format!("{id} in {}", dir.display()));
                }
                Err(left) => errors.push(format!(
                    "MPS daemon {id} of an earlier --mps-dir {}: processes {left:?} still alive after SIGKILL",
                    dir.display()
                )),
            }
        }
        (stopped, errors)
    }
}
