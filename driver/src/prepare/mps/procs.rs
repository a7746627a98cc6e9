//! Control daemon processes, seen through `/proc`: is a pid a live MPS
//! daemon, which processes belong to a daemon directory, and killing them.
//!
//! A pid from a pid file is trusted only when the process is alive (not a
//! zombie), its command line is `nvidia-cuda-mps-control` (directly or as
//! the script argument of an interpreter) and it carries the marker of the
//! pid file's own daemon directory, so neither a recycled pid nor a pid a
//! client container wrote there is taken for the daemon. Processes of one
//! daemon (control daemon, MPS servers) carry [`DAEMON_MARKER_ENV`] with the
//! daemon directory in their environment, which finds them even without a
//! pid file.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::process::{Pid, Signal, kill_process};

/// Environment variable naming the daemon directory, set on every daemon
/// the plugin starts (inherited by its MPS servers).
pub const DAEMON_MARKER_ENV: &str = "GPU_DRA_MPS_DAEMON_DIR";
/// Environment variable naming the plugin's state directory, set on every
/// daemon the plugin starts: which plugin's daemon a process is, when no
/// record says so.
pub const OWNER_ENV: &str = "GPU_DRA_MPS_OWNER";
/// Largest pid file read.
const MAX_PID_FILE: u64 = 64;

fn stat_fields(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: comm may hold spaces and parentheses.
    Some(stat[stat.rfind(')')? + 1..].to_owned())
}

/// Whether `pid` is a live process (exists and is not a zombie).
pub fn is_alive(pid: u32) -> bool {
    stat_fields(pid)
        .and_then(|f| f.trim_start().chars().next())
        .is_some_and(|s| s != 'Z' && s != 'X')
}

fn cmdline(pid: u32) -> Option<Vec<Vec<u8>>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

fn names_mps(arg: &[u8], prefix: &str) -> bool {
    Path::new(OsStr::from_bytes(arg))
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(prefix))
}

/// Whether `pid` runs `nvidia-cuda-mps-control` (argv\[0\], or argv\[1\] of
/// an interpreter running it as a script).
pub fn is_control_daemon(pid: u32) -> bool {
    cmdline(pid).is_some_and(|args| {
        args.iter()
            .take(2)
            .any(|a| names_mps(a, "nvidia-cuda-mps-control"))
    })
}

/// The pid in the pid file of the daemon in directory `dir`, if it names a
/// live control daemon of that directory (its environment carries
/// `GPU_DRA_MPS_DAEMON_DIR=<dir>`).
///
/// The pid file lies in the pipe directory, which the daemon's client
/// containers can write: a pid written there that names another daemon (of
/// another claim, or a recycled pid) is not this daemon's, and a FIFO or a
/// symbolic link put in its place is not read (opening a FIFO would wait
/// for a writer).
pub fn live_daemon_pid(pid_file: &Path, dir: &Path) -> Option<u32> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(pid_file)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_PID_FILE).read_to_string(&mut text).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    (pid > 1 && is_alive(pid) && is_control_daemon(pid) && carries_marker(pid, dir)).then_some(pid)
}

/// `<name>=<value>`, as it appears in an environment.
fn env_entry(name: &str, value: &Path) -> Vec<u8> {
    let mut entry = format!("{name}=").into_bytes();
    entry.extend_from_slice(value.as_os_str().as_encoded_bytes());
    entry
}

/// Whether `environ` (`/proc/<pid>/environ`) holds `entry`.
fn holds(environ: &[u8], entry: &[u8]) -> bool {
    environ.split(|b| *b == 0).any(|v| v == entry)
}

/// `GPU_DRA_MPS_DAEMON_DIR=<dir>`, as it appears in an environment.
fn marker(dir: &Path) -> Vec<u8> {
    env_entry(DAEMON_MARKER_ENV, dir)
}

fn carries_marker(pid: u32, dir: &Path) -> bool {
    fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| holds(&environ, &marker(dir)))
}

/// Live processes whose environment holds `GPU_DRA_MPS_DAEMON_DIR=<dir>`.
pub fn daemon_processes(dir: &Path) -> Vec<u32> {
    let needle = marker(dir);
    // The environment first, liveness only for a match: most processes
    // are not the daemon's, and a zombie's environment reads empty.
    let mut out: Vec<u32> = environments()
        .filter(|(pid, environ)| holds(environ, &needle) && is_alive(*pid))
        .map(|(pid, _)| pid)
        .collect();
    out.sort_unstable();
    out
}

/// `(pid, /proc/<pid>/environ)` of every process but this one whose
/// environment can be read.
fn environments() -> impl Iterator<Item = (u32, Vec<u8>)> {
    let me = std::process::id();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(move |entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            if pid == me {
                return None;
            }
            Some((pid, fs::read(format!("/proc/{pid}/environ")).ok()?))
        })
}

/// The live processes whose environment holds `GPU_DRA_MPS_OWNER=<owner>`,
/// by their daemon directory ([`DAEMON_MARKER_ENV`]), each list sorted. A
/// process with the owner but no marker is skipped.
pub fn owned_daemons(owner: &Path) -> BTreeMap<PathBuf, Vec<u32>> {
    let needle = env_entry(OWNER_ENV, owner);
    let marker = format!("{DAEMON_MARKER_ENV}=");
    let mut out: BTreeMap<PathBuf, Vec<u32>> = BTreeMap::new();
    for (pid, environ) in environments() {
        if !holds(&environ, &needle) {
            continue;
        }
        let dir = environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(marker.as_bytes()));
        if let Some(dir) = dir.filter(|d| !d.is_empty())
            && is_alive(pid)
        {
            out.entry(PathBuf::from(OsStr::from_bytes(dir)))
                .or_default()
                .push(pid);
        }
    }
    for pids in out.values_mut() {
        pids.sort_unstable();
    }
    out
}

/// Sends SIGKILL; a process already gone counts as killed.
pub fn kill(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match kill_process(p, Signal::KILL) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::SRCH,
    }
}

/// Spawns `cmd` and returns once its environment reads back through
/// `/proc/<pid>/environ`. `spawn` returns as soon as the child has left this
/// process's memory, but the kernel sets up the new program's environment
/// after that, so for a moment the file reads empty (seen under load). A
/// test that scans environments for a marker needs this; a real leftover
/// daemon is long past that moment.
#[cfg(test)]
pub fn spawn_with_environment(cmd: &mut std::process::Command) -> std::process::Child {
    let child = cmd.spawn().expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while fs::read(format!("/proc/{}/environ", child.id())).is_ok_and(|e| e.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "process {} never showed its environment",
            child.id()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_not_a_daemon() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(!is_control_daemon(me));
        assert!(!is_alive(u32::MAX));
    }

    #[test]
    fn pid_files_are_trusted_only_for_live_daemons() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pid");
        assert_eq!(live_daemon_pid(&file, dir.path()), None);
        for text in ["", "abc", "-1", "1", "99999999999", &"9".repeat(500)] {
            fs::write(&file, text).unwrap();
            assert_eq!(live_daemon_pid(&file, dir.path()), None, "{text:?}");
        }
        // A live process that is not a control daemon (this test binary).
        fs::write(&file, std::process::id().to_string()).unwrap();
        assert_eq!(live_daemon_pid(&file, dir.path()), None);
    }

    /// What a client container can put in the pid file, which lies in the
    /// pipe directory it shares: another daemon's pid, a FIFO, a link.
    #[test]
    fn a_pid_file_names_only_the_daemon_of_its_own_directory() {
        let t = tempfile::tempdir().unwrap();
        let (mine, other) = (t.path().join("mine"), t.path().join("other"));
        fs::create_dir_all(&mine).unwrap();
        let script = t.path().join("nvidia-cuda-mps-control");
        fs::write(&script, "while :; do sleep 1; done\n").unwrap();
        // `sh <script>`: a control daemon by its command line (run by the
        // shell, so no exec of a file this process just wrote).
        let mut daemon = spawn_with_environment(
            std::process::Command::new("sh")
                .arg(&script)
                .env(DAEMON_MARKER_ENV, &other),
        );
        let pid = daemon.id();
        assert!(is_control_daemon(pid));
        let file = mine.join("pid");
        fs::write(&file, pid.to_string()).unwrap();
        assert_eq!(live_daemon_pid(&file, &other), Some(pid), "its own");
        assert_eq!(live_daemon_pid(&file, &mine), None, "another daemon's");
        // A link to a good pid file is not followed.
        let good = other.with_extension("pid");
        fs::write(&good, pid.to_string()).unwrap();
        fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&good, &file).unwrap();
        assert_eq!(live_daemon_pid(&file, &other), None, "a link");
        // A FIFO with no writer: answered at once, not waited on.
        fs::remove_file(&file).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&file).status();
        assert!(made.is_ok_and(|s| s.success()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (f, o) = (file.clone(), other.clone());
        std::thread::spawn(move || tx.send(live_daemon_pid(&f, &o)).unwrap());
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        assert_eq!(answer, Ok(None), "a FIFO");
        let _ = daemon.kill();
        kill(pid);
        let _ = daemon.wait();
    }

    #[test]
    fn marked_processes_are_found_until_they_die() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = spawn_with_environment(
            std::process::Command::new("sleep")
                .arg("30")
                .env(DAEMON_MARKER_ENV, dir.path()),
        );
        let pid = child.id();
        assert_eq!(daemon_processes(dir.path()), vec![pid]);
        // The marker must name the directory exactly: neither a directory
        // under it nor the one above it matches.
        let other = dir.path().join("x");
        assert!(!daemon_processes(&other).contains(&pid));
        assert!(!daemon_processes(dir.path().parent().unwrap()).contains(&pid));
        // Killed and not yet reaped: a zombie, no longer the daemon's.
        assert!(kill(pid));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while is_alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!is_alive(pid));
        assert_eq!(daemon_processes(dir.path()), Vec::<u32>::new());
        child.wait().unwrap();
    }

    #[test]
    fn names_match_scripts_and_binaries() {
        assert!(names_mps(
            b"/usr/bin/nvidia-cuda-mps-control",
            "nvidia-cuda-mps-control"
        ));
        assert!(names_mps(
            b"nvidia-cuda-mps-control",
            "nvidia-cuda-mps-control"
        ));
        assert!(!names_mps(
            b"/usr/bin/nvidia-cuda-mps-control/x",
            "nvidia-cuda-mps-control"
        ));
        assert!(!names_mps(b"/bin/sh", "nvidia-cuda-mps-control"));
    }
}
