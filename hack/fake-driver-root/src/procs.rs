//! Processes started from a fake driver root, found through `/proc`, and a
//! guard that kills them, so that tests never leak a daemon.
//!
//! A script runs as `<shell> <root>/usr/bin/<tool> ...` and the compiled
//! MPS control program as `<root>/usr/bin/nvidia-cuda-mps-control`, whatever
//! its argv\[0\] says: a process whose command line names a file under the
//! root, or whose executable (`/proc/<pid>/exe`) is one, is one of ours.

use std::fs;
use std::path::{Path, PathBuf};

use rustix::process::{Pid, Signal, kill_process};

/// Field `n` of a `/proc/<pid>/stat` line counted after `(comm)` (0: the
/// state letter, 1: the parent, 2: the process group, 3: the session);
/// comm may hold spaces and parentheses, so the fields start after the
/// last `)`.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(n)
}

/// Field `n` (see [`stat_field`]) of process `pid`, if it exists.
fn read_stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_field(&stat, n).map(str::to_owned)
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `Z`...), if the process exists.
pub fn process_state(pid: u32) -> Option<char> {
    read_stat_field(pid, 0)?.chars().next()
}

/// Whether `pid` is a live process (not a zombie).
pub fn is_alive(pid: u32) -> bool {
    matches!(process_state(pid), Some(s) if s != 'Z' && s != 'X')
}

/// The parent pid of a process (field 4 of `/proc/<pid>/stat`).
pub fn parent_id(pid: u32) -> Option<u32> {
    read_stat_field(pid, 1)?.parse().ok()
}

/// The process group id of a process (field 5 of `/proc/<pid>/stat`).
pub fn process_group_id(pid: u32) -> Option<u32> {
    read_stat_field(pid, 2)?.parse().ok()
}

/// The session id of a process (field 6 of `/proc/<pid>/stat`).
pub fn session_id(pid: u32) -> Option<u32> {
    read_stat_field(pid, 3)?.parse().ok()
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` text, in
/// clock ticks: the CPU time of the whole process, exited threads
/// included.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let utime: u64 = stat_field(stat, 11)?.parse().ok()?;
    let stime: u64 = stat_field(stat, 12)?.parse().ok()?;
    Some(utime + stime)
}

/// The argv of a process, if readable.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Live processes (other than this one) whose command line names a path
/// under `root`, or whose executable is under `root` (a file replaced since
/// shows as `<path> (deleted)`, still under `root`).
pub fn processes_under(root: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || !is_alive(pid) {
            continue;
        }
        let named =
            cmdline(pid).is_some_and(|args| args.iter().any(|a| Path::new(a).starts_with(root)));
        if named || fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(root))
        {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// Sends SIGKILL; a process already gone counts as killed.
pub fn kill(pid: u32) -> bool {
    send(pid, Signal::KILL)
}

/// Sends SIGTERM (a runtime's stop); a process already gone counts as
/// signalled.
pub fn terminate(pid: u32) -> bool {
    send(pid, Signal::TERM)
}

fn send(pid: u32, signal: Signal) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match kill_process(p, signal) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::SRCH,
    }
}

/// Kills every live process started from `root`; returns how many were signalled.
pub fn kill_under(root: &Path) -> usize {
    let pids = processes_under(root);
    pids.iter().filter(|pid| kill(**pid)).count()
}

/// Kills, when dropped, every process started from the watched roots.
#[derive(Debug, Default)]
pub struct ProcessGuard {
    roots: Vec<PathBuf>,
}

impl ProcessGuard {
    /// A guard watching `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            roots: vec![root.into()],
        }
    }

    /// Also watches `root`.
    pub fn watch(&mut self, root: impl Into<PathBuf>) {
        self.roots.push(root.into());
    }

    /// Live processes started from the watched roots.
    pub fn processes(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self.roots.iter().flat_map(|r| processes_under(r)).collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        for root in &self.roots {
            kill_under(root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_an_odd_command_name() {
        let stat = "42 (a) b (c) S 7 42 9 0";
        assert_eq!(stat_field(stat, 0), Some("S"));
        assert_eq!(stat_field(stat, 1), Some("7"));
        assert_eq!(stat_field(stat, 2), Some("42"));
        assert_eq!(stat_field(stat, 3), Some("9"));
        assert_eq!(stat_field("42 (x) S", 1), None);
        assert_eq!(stat_field("garbage", 0), None);
        let me = std::process::id();
        assert_eq!(parent_id(me), Some(std::os::unix::process::parent_id()));
        assert!(process_group_id(me).is_some_and(|g| g > 0));
        // Its state letter parsed and not a zombie's.
        assert!(is_alive(me));
    }
}
