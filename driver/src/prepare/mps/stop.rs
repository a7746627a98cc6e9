//! Stopping a daemon: `quit`, then every process that carries its marker
//! killed and waited for, then its directories removed.

use std::fs;
use std::sync::PoisonError;
use std::thread;
use std::time::{Duration, Instant};

use super::exec::backoff;
use super::{DaemonDirs, MpsControl, MpsError, checked_id, io_err, procs};

impl MpsControl {
    /// Kills every process of daemon `id` (by its marker: the pid file's
    /// daemon counts only when it carries it too) and waits until they are
    /// gone.
    pub(super) fn kill_all(id: &str, dirs: &DaemonDirs) -> Result<(), MpsError> {
        let pids = procs::daemon_processes(&dirs.root);
        kill_and_wait(pids).map_err(|pids| MpsError::StopFailed {
            id: id.to_owned(),
            pids,
        })
    }

    /// Stops daemon `id`: `quit`, SIGKILL after [`Timeouts::stop`](super::Timeouts::stop) (and for
    /// any MPS server left), then removes its directories. An unknown id is
    /// a success.
    pub fn stop(&self, id: &str) -> Result<(), MpsError> {
        // Before a lock entry is made for it.
        checked_id(id)?;
        let lock = self.lock_for(id);
        let held = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let result = self.dirs(id).and_then(|dirs| self.stop_locked(id, &dirs));
        if result.is_ok() {
            self.forget_elsewhere(id);
        }
        drop(held);
        self.forget_lock(id, &lock);
        result
    }

    pub(super) fn stop_locked(&self, id: &str, dirs: &DaemonDirs) -> Result<(), MpsError> {
        if !dirs.root.exists() {
            if self.is_elsewhere(id) {
                // Under an earlier --mps-dir this plugin cannot see: no
                // pid file or socket to reach, but its processes carry
                // the marker.
                Self::kill_all(id, dirs)?;
                tracing::warn!(
                    daemon = %id,
                    dir = %dirs.root.display(),
                    "stopped MPS daemon of an earlier --mps-dir by its marker; its directory, which this plugin cannot see, is left on the host"
                );
            }
            return Ok(());
        }
        if let Some(pid) = dirs.live_pid() {
            let quit = self
                .control_program()
                .and_then(|p| self.send(&p, dirs, id, "quit", self.timeouts.command));
            if let Err(e) = &quit {
                tracing::warn!(daemon = %id, pid, error = %e, "MPS quit failed; killing the daemon");
            }
            let deadline = Instant::now() + self.timeouts.stop;
            let mut attempt = 0;
            while quit.is_ok() && procs::is_alive(pid) && Instant::now() < deadline {
                thread::sleep(backoff(attempt));
                attempt += 1;
            }
            if procs::is_alive(pid) {
                tracing::warn!(daemon = %id, pid, "MPS control daemon did not exit after quit; killing it");
            }
        }
        Self::kill_all(id, dirs)?;
        fs::remove_dir_all(&dirs.root).map_err(io_err("remove", &dirs.root))?;
        tracing::info!(daemon = %id, "stopped MPS control daemon");
        Ok(())
    }
}

/// SIGKILLs `pids` and waits up to 2 s for them to go; the ones left.
pub(super) fn kill_and_wait(mut pids: Vec<u32>) -> Result<(), Vec<u32>> {
    for pid in &pids {
        procs::kill(*pid);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut attempt = 0;
    loop {
        pids.retain(|p| procs::is_alive(*p));
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(pids);
        }
        thread::sleep(backoff(attempt));
        attempt += 1;
    }
}
