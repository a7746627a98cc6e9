//! Running the driver's programs (`nvidia-cuda-mps-control`, `nvidia-smi`)
//! with a clean environment, a bounded wait and bounded output.
//!
//! Programs come from the driver root: their `PATH` starts with
//! `<driver-root>/usr/bin` (the MPS control daemon starts
//! `nvidia-cuda-mps-server` from there) and, when the driver root is not
//! `/`, `LD_LIBRARY_PATH` lists its library directories so the programs load
//! that driver's `libcuda`/`libnvidia-ml`. Nothing else of the plugin's
//! environment leaks in (the plugin's own `CUDA_VISIBLE_DEVICES`, for one).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, pidfd_open};

use super::CONTAINER_PIPE_DIR;
use super::launch::Launch;
use crate::prepare::cdi::driver_root::LIB_DIRS;

/// The `PATH` after the driver root's `usr/bin`.
pub(crate) const STD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Output kept per stream; the rest is read and dropped.
const MAX_OUTPUT: usize = 64 * 1024;
/// `ETXTBSY`: the executable is open for writing somewhere (a fork of
/// another thread of this process that has not exec'd yet, right after the
/// file was written); retried briefly.
const ETXTBSY: i32 = 26;

/// What a finished program left.
#[derive(Debug)]
pub(crate) struct Ran {
    /// Its exit status.
    pub status: ExitStatus,
    /// Stdout (lossy UTF-8, at most [`MAX_OUTPUT`] bytes).
    pub stdout: String,
    /// Stderr (lossy UTF-8, at most [`MAX_OUTPUT`] bytes).
    pub stderr: String,
}

impl Ran {
    /// Stdout and stderr, trimmed, for an error message.
    pub fn output(&self) -> String {
        combine(&self.stdout, &self.stderr)
    }
}

/// Stdout and stderr, trimmed and joined, cut to 2 KiB for messages.
pub(crate) fn combine(stdout: &str, stderr: &str) -> String {
    let joined = [stdout.trim(), stderr.trim()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    if joined.is_empty() {
        return "no output".into();
    }
    truncate(&joined, 2048)
}

/// `s` cut to at most `max` bytes on a character boundary, marked when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... (truncated)", &s[..end])
}

/// Why a program did not finish.
#[derive(Debug)]
pub(crate) enum RunError {
    /// It could not be started.
    Spawn(io::Error),
    /// It ran past the timeout and was killed.
    TimedOut,
    /// Waiting for it failed.
    Wait(io::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Spawn(e) => write!(f, "cannot start: {e}"),
            Self::TimedOut => f.write_str("timed out and was killed"),
            Self::Wait(e) => write!(f, "waiting for it failed: {e}"),
        }
    }
}

/// Clears `cmd`'s environment and sets `PATH` (and `LD_LIBRARY_PATH` for a
/// driver root other than `/`) for programs of `driver_root`.
pub(crate) fn driver_env(cmd: &mut Command, driver_root: &Path) {
    cmd.env_clear().envs(driver_env_vars(driver_root));
}

/// The environment [`driver_env`] sets, as variables.
pub(crate) fn driver_env_vars(driver_root: &Path) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    let bin = driver_root.join("usr/bin");
    vars.insert("PATH".into(), format!("{}:{STD_PATH}", bin.display()));
    if driver_root != Path::new("/") {
        let dirs: Vec<String> = LIB_DIRS
            .iter()
            .map(|d| driver_root.join(d))
            .filter(|d| d.is_dir())
            .map(|d| d.display().to_string())
            .collect();
        if !dirs.is_empty() {
            vars.insert("LD_LIBRARY_PATH".into(), dirs.join(":"));
        }
    }
    vars
}

/// A step of setting up a daemon start that failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub(crate) struct SetupError {
    /// What was being done.
    pub op: &'static str,
    /// On what.
    pub path: PathBuf,
    /// The OS error.
    pub source: io::Error,
}

/// The `-d` start of an MPS control daemon, the same whether the plugin
/// runs it or the MPS daemon host does: `program -d` (`-d -M` for a
/// multi-user server, `mpsConfig.multiUser`), or with `private`
/// (the launcher, the daemon's shm and pipe directories) through the
/// launcher in a mount namespace of its own; exactly `env` as its
/// environment; stdout and stderr into a new `output` file; stdin
/// `/dev/null`; a process group of its own from the start, whatever the
/// program does, so signals to the caller's group (a Ctrl-C in a terminal,
/// a kill of the group) never reach it (`-d` itself makes the daemon the
/// leader of a session of its own when it forks it).
pub(crate) fn daemon_start<V: AsRef<OsStr>>(
    program: &Path,
    private: Option<(&Path, &Path, &Path)>,
    env: &BTreeMap<String, V>,
    output: &Path,
    multi_user: bool,
) -> Result<Command, SetupError> {
    let args: &[&str] = if multi_user { &["-d", "-M"] } else { &["-d"] };
    let failed = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| SetupError { op, path, source }
    };
    // The command first: if its mount point cannot be made, no empty output file is left.
    let mut cmd = if let Some((launcher, shm, pipe)) = private {
        Launch::Daemon {
            shm: shm.to_path_buf(),
            pipe: pipe.to_path_buf(),
            program: program.to_path_buf(),
            args: args.iter().map(Into::into).collect(),
        }
        .command(launcher)
        .map_err(failed("create mount point", Path::new(CONTAINER_PIPE_DIR)))?
    } else {
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd
    };
    let out = File::create(output).map_err(failed("create", output))?;
    let err = out.try_clone().map_err(failed("dup", output))?;
    cmd.process_group(0)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    Ok(cmd)
}

/// Spawns `cmd`, retrying for up to half a second on `ETXTBSY`.
pub(crate) fn spawn(cmd: &mut Command) -> io::Result<Child> {
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn drain(stream: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    match stream {
        Some(mut r) => {
            thread::spawn(move || {
                let mut kept = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let room = MAX_OUTPUT.saturating_sub(kept.len());
                            kept.extend_from_slice(&buf[..n.min(room)]);
                        }
                    }
                }
                let _ = tx.send(kept);
            });
        }
        None => {
            let _ = tx.send(Vec::new());
        }
    }
    rx
}

/// Sleeps between polls: short at first, longer later.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(match attempt {
        0..=9 => 2,
        10..=29 => 5,
        _ => 20,
    })
}

/// A descriptor that becomes readable when `child` exits (a pidfd; `None`
/// where the kernel has none, before Linux 5.3).
fn exit_notifier(child: &Child) -> Option<OwnedFd> {
    let pid = Pid::from_raw(i32::try_from(child.id()).ok()?)?;
    // Not reaped before we do, so the pid still names our child.
    pidfd_open(pid, PidfdFlags::empty()).ok()
}

/// Waits until `child` exits or `deadline` passes (`None`). The kernel wakes
/// the wait the moment the child exits (its pidfd becomes readable), so a
/// quick program costs no polling interval; without pidfds it polls with
/// [`backoff`].
pub(crate) fn wait_until(child: &mut Child, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    let notifier = exit_notifier(child);
    let mut attempt = 0;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        if let Some(fd) = &notifier {
            let timeout = Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            thread::sleep(backoff(attempt).min(left));
            attempt += 1;
        }
    }
}

/// Runs `cmd` with `stdin` (or `/dev/null`), stdout and stderr captured;
/// kills it after `timeout`.
pub(crate) fn run(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Ran, RunError> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = spawn(cmd).map_err(RunError::Spawn)?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A program that exits without reading gives EPIPE: not an error here.
        let _ = pipe.write_all(data);
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = match wait_until(&mut child, Instant::now() + timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::TimedOut);
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Wait(e));
        }
    };
    // A grandchild holding the pipes open must not hang us: wait briefly.
    let grace = Duration::from_millis(500);
    let text = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(grace).map_or_else(
            |_| "(output still open after exit)".into(),
            |b| String::from_utf8_lossy(&b).into_owned(),
        )
    };
    Ok(Ran {
        status,
        stdout: text(out),
        stderr: text(err),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_status_with_a_clean_environment() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            "read x; echo \"out:$x:${HOME-unset}\"; echo err >&2; exit 3",
        ]);
        driver_env(&mut cmd, Path::new("/"));
        let ran = run(&mut cmd, Some(b"in\n"), Duration::from_secs(5)).unwrap();
        assert_eq!(ran.status.code(), Some(3));
        assert_eq!(ran.stdout, "out:in:unset\n");
        assert_eq!(ran.stderr, "err\n");
        assert_eq!(ran.output(), "out:in:unset\nerr");
    }

    #[test]
    fn kills_a_program_past_its_timeout() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exec sleep 5"]);
        let begun = Instant::now();
        let err = run(&mut cmd, None, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, RunError::TimedOut), "{err}");
        assert!(begun.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn a_wait_ends_when_the_program_does_not_at_a_poll_interval() {
        // The exit wakes the wait (a pidfd on this kernel), status intact.
        for _ in 0..3 {
            let mut cmd = Command::new("/bin/true");
            let mut child = spawn(&mut cmd).unwrap();
            assert!(exit_notifier(&child).is_some(), "no pidfd on this kernel");
            let status = wait_until(&mut child, Instant::now() + Duration::from_secs(5))
                .unwrap()
                .unwrap();
            assert!(status.success());
        }
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exit 4"]);
        let mut child = spawn(&mut cmd).unwrap();
        let status = wait_until(&mut child, Instant::now() + Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(status.code(), Some(4));
        // A program still running at the deadline is left running.
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exec sleep 5"]);
        let mut child = spawn(&mut cmd).unwrap();
        let begun = Instant::now();
        let waited = wait_until(&mut child, begun + Duration::from_millis(50)).unwrap();
        assert!(waited.is_none());
        assert!(begun.elapsed() >= Duration::from_millis(50));
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let mut cmd = Command::new("/nonexistent/nvidia-smi");
        let err = run(&mut cmd, None, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, RunError::Spawn(ref e) if e.kind() == io::ErrorKind::NotFound));
    }

    #[test]
    fn driver_root_gets_path_and_library_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/lib64")).unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "echo \"$PATH|$LD_LIBRARY_PATH\""]);
        driver_env(&mut cmd, dir.path());
        let ran = run(&mut cmd, None, Duration::from_secs(5)).unwrap();
        assert_eq!(
            ran.stdout.trim(),
            format!(
                "{}/usr/bin:{STD_PATH}|{}/usr/lib64",
                dir.path().display(),
                dir.path().display()
            )
        );
    }

    #[test]
    fn long_output_is_cut_for_messages() {
        let long = "é".repeat(3000);
        let cut = combine(&long, "");
        assert!(
            cut.len() < 2100 && cut.ends_with("... (truncated)"),
            "{}",
            cut.len()
        );
        assert_eq!(combine(" ", "\n"), "no output");
    }
}
