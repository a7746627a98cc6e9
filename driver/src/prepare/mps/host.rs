//! The MPS daemon host: `gpu-kubelet-plugin mps-host --socket <path>`, a
//! small process in a pod of its own (the chart's `mpsHost`) that starts
//! MPS control daemons when the plugin asks it to, so the daemons live in
//! the host's container instead of the plugin's.
//!
//! Why: a container's processes end with it. Daemons the plugin starts
//! itself end when the plugin's pod is replaced (a DaemonSet upgrade, a
//! failed liveness probe), and every CUDA process connected to them fails.
//! The host's DaemonSet is updated only when its pod is deleted
//! (`OnDelete`), so upgrading the plugin leaves the daemons running, and
//! the new plugin re-adopts them from their pid files as after a crash.
//!
//! What the host does, and nothing more: it takes one [`StartRequest`] per
//! connection (one JSON line), runs `nvidia-cuda-mps-control -d` as asked
//! (through its own launcher, [`super::launch`], for a private `/dev/shm`),
//! waits until that returns, and answers with a [`Reply`]. `-d` forks the
//! daemon into the background; the host is the child subreaper, so the
//! daemon becomes its child and is reaped by it when it exits. Everything
//! else (readiness, settings, supervision, `quit`, killing) the plugin does
//! as it does for its own daemons: through the pipe directory, the pid file
//! and `/proc`, which is why both pods share the host's PID namespace
//! (`hostPID`) and mount the MPS directory and the driver root at the same
//! paths. The plugin refuses a host in another PID namespace, where the
//! daemon's pid file would name pids the plugin cannot see: before it sends
//! a request, by the listening process the socket's peer credentials name
//! (so such a host starts nothing), and again by the namespace the reply
//! carries.
//!
//! On SIGTERM or SIGINT the host stops taking requests (its socket goes)
//! and answers the starts it is running before it exits (up to
//! `STOP_GRACE`), so the plugin learns whether each daemon started. A
//! start killed at its timeout that does not end (a driver call that
//! hangs) is answered as timed out after `KILL_GRACE`, and reaped whenever
//! it ends.
//!
//! Requests are checked before anything runs ([`StartRequest::check`]): the
//! program must be the control program of the host's `--container-driver-root`, the
//! environment only the variables the plugin sets on a daemon, paths
//! absolute and without NUL bytes, the timeout bounded. The socket is
//! 0600 in a root-only directory: only root on the node reaches it, and
//! root can start processes there anyway, so the checks guard against
//! mistakes and malformed input rather than grant anything.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus, kill_process, set_child_subreaper};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::signal::unix::{SignalKind, signal};

use super::{CONTROL_PROGRAM, exec, procs};
use crate::grpc::sockets;

/// The first argument that selects the host in the plugin's program.
pub const HOST_ARG: &str = "mps-host";
/// Largest request or reply read.
const MAX_MESSAGE: u64 = 64 * 1024;
/// Most input read away after a reply (see `handle`).
const DRAIN_LIMIT: u64 = 16 * MAX_MESSAGE;
/// Longest `-d` run a request may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the host waits for a request once connected.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Extra time the plugin gives the host beyond the request's own timeout.
const REPLY_SLACK: Duration = Duration::from_secs(5);
/// How long a `-d` killed at its timeout may take to end before the host
/// answers without it (a process in uninterruptible sleep, in a hung
/// driver call, ends only when that call returns); it is reaped whenever
/// it ends.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a stopping host goes on with the starts it is running, so
/// that their replies reach the plugin.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The variables a request may set: those the plugin sets on a daemon.
const ALLOWED_ENV: [&str; 7] = [
    "PATH",
    "LD_LIBRARY_PATH",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_VISIBLE_DEVICES",
    procs::DAEMON_MARKER_ENV,
    procs::OWNER_ENV,
];

/// The host's flags (after [`HOST_ARG`]).
#[derive(Debug, clap::Parser)]
#[command(
    name = "gpu-kubelet-plugin mps-host",
    about = "Starts MPS control daemons for the kubelet plugin, in this process's container"
)]
pub struct HostFlags {
    /// The socket to serve on: the plugin's `--mps-host-socket`.
    #[arg(long, env = "MPS_HOST_SOCKET", value_parser = crate::flags::parse_socket_path)]
    pub socket: PathBuf,
    /// Where this container sees the NVIDIA driver (the plugin's
    /// `--container-driver-root`): only its `usr/bin/nvidia-cuda-mps-control`
    /// is run.
    #[arg(
        long = "container-driver-root",
        env = "CONTAINER_DRIVER_ROOT",
        default_value = "/",
        value_parser = absolute_path
    )]
    pub driver_root: PathBuf,
    /// Log format on stderr. The level comes from RUST_LOG (default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = gpu_dra_cmdline::LogFormat::Text)]
    pub log_format: gpu_dra_cmdline::LogFormat,
    /// Run the host as a child of this process, which starts it again when
    /// it dies and reaps the daemons it leaves (for the container's main
    /// process): a crash of the host then ends neither its container nor
    /// the daemons. The host gets every other argument as given.
    #[arg(long)]
    pub supervise: bool,
}

fn absolute_path(s: &str) -> Result<PathBuf, String> {
    crate::flags::absolute_without_dotdot(s, "the driver as this container sees it")
        .map(Path::to_path_buf)
}

/// Whether the command line asks for the host (its first argument is
/// [`HOST_ARG`]); if so, the arguments to parse as [`HostFlags`] (the
/// program's name, then those after [`HOST_ARG`]).
pub fn asked(args: &[std::ffi::OsString]) -> Option<Vec<std::ffi::OsString>> {
    (args.get(1)? == HOST_ARG).then(|| {
        let mut rest = vec![args[0].clone()];
        rest.extend(args[2..].iter().cloned());
        rest
    })
}

/// Errors of the host and of asking it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The socket could not be set up.
    #[error("MPS host socket: {0}")]
    Socket(#[from] crate::grpc::Error),
    /// `PR_SET_CHILD_SUBREAPER` failed.
    #[error("cannot become the reaper of the MPS daemons: {0}")]
    Subreaper(#[source] io::Error),
    /// Signal handlers could not be installed.
    #[error("cannot handle signals: {0}")]
    Signals(#[source] io::Error),
    /// This process's PID namespace cannot be read.
    #[error("cannot read this process's PID namespace (/proc/self/ns/pid): {0}")]
    Namespace(#[source] io::Error),
    /// The plugin cannot reach the host.
    #[error(
        "cannot reach the MPS daemon host at {path} ({source}): is its pod (the chart's mpsHost) running on this node?"
    )]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Talking to the host failed half-way.
    #[error("MPS daemon host at {path}: {op}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The request cannot be written as JSON (a path that is not UTF-8).
    #[error("cannot write a request to the MPS daemon host at {path}: {reason}")]
    Encode {
        /// The socket.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The host did not answer in time.
    #[error(
        "the MPS daemon host at {path} did not answer within {} s; the daemon's start may still be running there",
        waited.as_secs()
    )]
    NoReply {
        /// The socket.
        path: PathBuf,
        /// How long the plugin waited.
        waited: Duration,
    },
    /// The host's answer is not a [`Reply`].
    #[error("MPS daemon host at {path} answered with something else than a reply: {reason}")]
    BadReply {
        /// The socket.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The host runs in another PID namespace than the plugin.
    #[error(
        "the MPS daemon host at {path} runs in another PID namespace ({host}) than the plugin ({plugin}): run both pods with hostPID, or leave --mps-host-socket out"
    )]
    OtherPidNamespace {
        /// The socket.
        path: PathBuf,
        /// The host's namespace.
        host: String,
        /// The plugin's.
        plugin: String,
    },
}

/// A daemon's private mounts: its `shm/` on `/dev/shm` and its `pipe/` on
/// [`super::CONTAINER_PIPE_DIR`], set up by the host's own launcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivateMount {
    /// The daemon's shm directory.
    pub shm: PathBuf,
    /// The daemon's pipe directory.
    pub pipe: PathBuf,
}

/// What the plugin asks the host to run: `<program> -d`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartRequest {
    /// The control program (`<driver-root>/usr/bin/nvidia-cuda-mps-control`,
    /// the same path in both pods).
    pub program: PathBuf,
    /// Through the launcher, in a mount namespace of the daemon's own;
    /// absent: the host's `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_mount: Option<PrivateMount>,
    /// The whole environment (nothing of the host's own is passed on).
    pub env: BTreeMap<String, String>,
    /// Where `-d`'s stdout and stderr go (created or truncated).
    pub output: PathBuf,
    /// How long `-d` may run before it is killed, in milliseconds.
    pub timeout_ms: u64,
}

/// How a started `-d` ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum Outcome {
    /// It ran and ended.
    Exited {
        /// Its exit code, if it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        /// The signal that ended it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// It ran past the timeout and was killed.
    TimedOut,
    /// The request was refused or the program could not be started.
    Failed {
        /// Why.
        error: String,
    },
}

impl Outcome {
    /// Whether `-d` exited with status 0.
    pub fn success(&self) -> bool {
        matches!(
            self,
            Self::Exited {
                code: Some(0),
                signal: None
            }
        )
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited {
                code: Some(code), ..
            } => write!(f, "exit status: {code}"),
            Self::Exited {
                signal: Some(signal),
                ..
            } => write!(f, "killed by signal {signal}"),
            Self::Exited { .. } => f.write_str("ended"),
            Self::TimedOut => f.write_str("did not return in time and was killed"),
            Self::Failed { error } => write!(f, "refused: {error}"),
        }
    }
}

/// The host's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Reply {
    /// The host's PID namespace (`/proc/self/ns/pid`'s link, `pid:[N]`).
    pub pid_namespace: String,
    /// How `-d` ended.
    pub outcome: Outcome,
}

fn absolute_without_nul(what: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{what} {} is not an absolute path", path.display()));
    }
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(format!("{what} {} contains a NUL byte", path.display()));
    }
    Ok(())
}

impl StartRequest {
    /// Checks the request before anything runs; `driver_root` is where
    /// the host sees the driver, whose control program alone it runs.
    pub fn check(&self, driver_root: &Path) -> Result<(), String> {
        absolute_without_nul("program", &self.program)?;
        let control = driver_root.join(CONTROL_PROGRAM);
        if self.program != control {
            return Err(format!(
                "program {} is not {}, the driver root's MPS control program",
                self.program.display(),
                control.display()
            ));
        }
        if let Some(m) = &self.private_mount {
            absolute_without_nul("shm directory", &m.shm)?;
            absolute_without_nul("pipe directory", &m.pipe)?;
        }
        absolute_without_nul("output file", &self.output)?;
        for (key, value) in &self.env {
            if !ALLOWED_ENV.contains(&key.as_str()) {
                return Err(format!(
                    "environment variable {key:?} is not one a daemon gets (allowed: {})",
                    ALLOWED_ENV.join(", ")
                ));
            }
            if value.contains('\0') {
                return Err(format!("environment variable {key} contains a NUL byte"));
            }
        }
        let max = u64::try_from(MAX_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        if self.timeout_ms == 0 || self.timeout_ms > max {
            return Err(format!(
                "timeoutMs {} is outside 1..={max}",
                self.timeout_ms
            ));
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// This process's PID namespace, as `/proc/self/ns/pid` names it (read
/// once: a process never changes it).
pub fn pid_namespace() -> io::Result<String> {
    static NAMESPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(ns) = NAMESPACE.get() {
        return Ok(ns.clone());
    }
    let ns = fs::read_link("/proc/self/ns/pid")?
        .to_string_lossy()
        .into_owned();
    Ok(NAMESPACE.get_or_init(|| ns).clone())
}

/// The PID namespace of the process listening at the other end of
/// `stream`: the kernel names it by its pid in this process's namespace, 0
/// when it cannot be seen from here (`Ok(None)`), and `/proc/<pid>/ns/pid`
/// names its namespace.
fn listener_pid_namespace(stream: &StdUnixStream) -> io::Result<Option<String>> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let pid = getsockopt(stream, PeerCredentials)
        .map_err(io::Error::from)?
        .pid();
    if pid <= 0 {
        return Ok(None);
    }
    let link = fs::read_link(format!("/proc/{pid}/ns/pid"))?;
    Ok(Some(link.to_string_lossy().into_owned()))
}

/// Asks the host at `socket` to run `request`; returns how `-d` ended.
/// Blocking (the plugin calls it on its blocking pool, as it runs `-d`
/// itself otherwise).
pub fn request_start(socket: &Path, request: &StartRequest) -> Result<Outcome, HostError> {
    let io_err = |op: &'static str| {
        move |source: io::Error| HostError::Io {
            path: socket.to_owned(),
            op,
            source,
        }
    };
    let mut stream = StdUnixStream::connect(socket).map_err(|source| HostError::Unreachable {
        path: socket.to_owned(),
        source,
    })?;
    let own = pid_namespace().map_err(io_err("read this process's /proc/self/ns/pid"))?;
    let other = |host: String| HostError::OtherPidNamespace {
        path: socket.to_owned(),
        host,
        plugin: own.clone(),
    };
    match listener_pid_namespace(&stream) {
        Ok(Some(host)) if host == own => {}
        Ok(Some(host)) => return Err(other(host)),
        Ok(None) => return Err(other("one the plugin cannot see".into())),
        // The listener named has gone while its socket lives on (another
        // process holds it): the reply's namespace decides.
        Err(e) => {
            tracing::debug!(path = %socket.display(), error = %e, "cannot read the MPS daemon host's PID namespace before the request");
        }
    }
    let wait = request.timeout() + REPLY_SLACK;
    stream
        .set_read_timeout(Some(wait))
        .and_then(|()| stream.set_write_timeout(Some(wait)))
        .map_err(io_err("set timeouts"))?;
    let mut line = serde_json::to_vec(request).map_err(|e| HostError::Encode {
        path: socket.to_owned(),
        reason: e.to_string(),
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io_err("send request"))?;
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(io_err("send request"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_MESSAGE)
        .read_to_end(&mut answer)
        .map_err(|source| match source.kind() {
            // What an expired read timeout reads as.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HostError::NoReply {
                path: socket.to_owned(),
                waited: wait,
            },
            _ => io_err("read reply")(source),
        })?;
    let reply: Reply = serde_json::from_slice(&answer).map_err(|e| HostError::BadReply {
        path: socket.to_owned(),
        reason: if answer.is_empty() {
            "nothing (the host closed the connection)".into()
        } else {
            e.to_string()
        },
    })?;
    if reply.pid_namespace != own {
        return Err(other(reply.pid_namespace));
    }
    Ok(reply.outcome)
}

/// The host's children whose end a request waits for, and how they ended;
/// every other child (a daemon, re-parented to the host) is reaped and
/// forgotten.
#[derive(Default)]
struct Children {
    ended: Mutex<HashMap<i32, Option<WaitStatus>>>,
    changed: Condvar,
}

impl Children {
    /// Reaps every exited child.
    fn reap(&self) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => {
                    let raw = pid.as_raw_nonzero().get();
                    if let Some(slot) = ended.get_mut(&raw) {
                        *slot = Some(status);
                    } else {
                        tracing::info!(pid = raw, "reaped an exited MPS daemon process");
                    }
                }
                Ok(None) | Err(Errno::CHILD) => break,
                Err(Errno::INTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    break;
                }
            }
        }
        self.changed.notify_all();
    }

    /// Starts `cmd` and registers it before the reaper can see it end.
    fn spawn(&self, cmd: &mut Command) -> io::Result<i32> {
        // Held across the start: the reaper cannot take the child's status
        // before it is registered, nor the status std's own wait reads when
        // the exec fails.
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let child = exec::spawn(cmd)?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        // Reaped by `reap`, not through `child`.
        drop(child);
        ended.insert(pid, None);
        Ok(pid)
    }

    /// Waits until child `pid` ends, killing it at `deadline`; `None` when
    /// it had to be killed. A killed child that has not ended after
    /// [`KILL_GRACE`] is left to the reaper.
    fn wait(&self, pid: i32, deadline: Instant) -> Option<WaitStatus> {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let mut killed = false;
        loop {
            if killed && Instant::now() >= deadline + KILL_GRACE {
                ended.remove(&pid);
                tracing::warn!(
                    pid,
                    "a killed MPS daemon start has not ended; answering without it"
                );
                return None;
            }
            let status = match ended.get(&pid) {
                Some(Some(status)) => Some(*status),
                // Registered and not reaped: the pid is still this child.
                // Reaped here too, so the wait does not hang on the reaper.
                _ => Pid::from_raw(pid)
                    .and_then(|p| rustix::process::waitpid(Some(p), WaitOptions::NOHANG).ok())
                    .flatten()
                    .map(|(_, status)| status),
            };
            if let Some(status) = status {
                ended.remove(&pid);
                return (!killed).then_some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !killed {
                if let Some(p) = Pid::from_raw(pid) {
                    let _ = kill_process(p, Signal::KILL);
                }
                killed = true;
            }
            // Woken by the reaper at once; the nap bounds a missed wake-up.
            let nap = if killed {
                Duration::from_millis(20)
            } else {
                left.min(Duration::from_millis(100))
            };
            ended = self
                .changed
                .wait_timeout(ended, nap)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Runs one checked request; `launcher` is the host's own program.
fn run_start(request: &StartRequest, launcher: &Path, children: &Children) -> Outcome {
    let failed = |error: String| Outcome::Failed { error };
    let private = request
        .private_mount
        .as_ref()
        .map(|m| (launcher, m.shm.as_path(), m.pipe.as_path()));
    let mut cmd = match exec::daemon_start(&request.program, private, &request.env, &request.output)
    {
        Ok(cmd) => cmd,
        Err(e) => return failed(format!("{} {}: {}", e.op, e.path.display(), e.source)),
    };
    let pid = match children.spawn(&mut cmd) {
        Ok(pid) => pid,
        Err(e) => return failed(format!("cannot run {}: {e}", request.program.display())),
    };
    match children.wait(pid, Instant::now() + request.timeout()) {
        Some(status) => Outcome::Exited {
            code: status.exit_status(),
            signal: status.terminating_signal(),
        },
        None => Outcome::TimedOut,
    }
}

/// Reads one request line (bounded in size and time) and checks it.
async fn read_request(stream: &mut UnixStream, driver_root: &Path) -> Result<StartRequest, String> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut limited = stream.take(MAX_MESSAGE + 1);
        let mut chunk = [0u8; 4096];
        loop {
            let n = limited.read(&mut chunk).await?;
            buf.extend_from_slice(&chunk[..n]);
            // Only the new bytes can hold the first newline.
            if n == 0 || chunk[..n].contains(&b'\n') {
                return Ok::<_, io::Error>(());
            }
        }
    })
    .await;
    match read {
        Err(_) => return Err(format!("no request within {} s", READ_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("reading the request: {e}")),
        Ok(Ok(())) if buf.len() as u64 > MAX_MESSAGE => {
            return Err(format!("request longer than {MAX_MESSAGE} bytes"));
        }
        Ok(Ok(())) => {}
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    let request: StartRequest =
        serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))?;
    request.check(driver_root)?;
    Ok(request)
}

/// Answers one connection: its request run, or why not.
async fn handle(mut stream: UnixStream, host: Arc<Shared>) {
    let outcome = match read_request(&mut stream, &host.driver_root).await {
        Err(error) => Outcome::Failed { error },
        Ok(request) => {
            let started = Instant::now();
            let shared = host.clone();
            let ran = tokio::task::spawn_blocking(move || {
                let outcome = run_start(&request, &shared.launcher, &shared.children);
                (request, outcome)
            })
            .await;
            match ran {
                Ok((request, outcome)) => {
                    let daemon = request.env.get(procs::DAEMON_MARKER_ENV);
                    tracing::info!(
                        program = %request.program.display(),
                        daemon = daemon.map_or("", String::as_str),
                        %outcome,
                        elapsed_us = crate::micros(started),
                        "ran an MPS daemon start"
                    );
                    outcome
                }
                Err(e) => Outcome::Failed {
                    error: format!("the start task failed: {e}"),
                },
            }
        }
    };
    if let Outcome::Failed { error } = &outcome {
        tracing::warn!(%error, "MPS daemon start refused or failed");
    }
    let reply = Reply {
        pid_namespace: host.namespace.clone(),
        outcome,
    };
    if let Ok(mut line) = serde_json::to_vec(&reply) {
        line.push(b'\n');
        // The plugin gone meanwhile is its own business.
        let _ = stream.write_all(&line).await;
        let _ = stream.shutdown().await;
    }
    // A socket closed with input left unread resets the connection, and
    // the client would read that instead of the reply (a request refused
    // as too long): read the rest away first, bounded in size and time.
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        let mut sink = [0u8; 4096];
        let mut left = DRAIN_LIMIT;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n as u64),
            }
        }
    })
    .await;
}

/// What every connection of a serving host uses.
struct Shared {
    /// The host's own program, the daemons' launcher.
    launcher: PathBuf,
    /// Where the host sees the driver.
    driver_root: PathBuf,
    /// The host's PID namespace, for the replies.
    namespace: String,
    children: Children,
}

/// Serves start requests on `socket` until SIGTERM or SIGINT, running the
/// control program of `driver_root` only, through `launcher` (the host's
/// own program) for a private mount. Daemons keep running when the host
/// exits.
pub async fn serve(socket: &Path, launcher: &Path, driver_root: &Path) -> Result<(), HostError> {
    let namespace = pid_namespace().map_err(HostError::Namespace)?;
    set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| HostError::Subreaper(e.into()))?;
    let mut term = signal(SignalKind::terminate()).map_err(HostError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(HostError::Signals)?;
    let mut child = signal(SignalKind::child()).map_err(HostError::Signals)?;
    sockets::check_path_len(socket)?;
    if let Some(dir) = socket.parent() {
        sockets::ensure_dir(dir)?;
    }
    sockets::clear_stale(socket).await?;
    let listener = sockets::bind(socket)?;
    tracing::info!(
        socket = %socket.display(),
        driver_root = %driver_root.display(),
        pid_namespace = %namespace,
        "MPS daemon host serving"
    );
    let host = Arc::new(Shared {
        launcher: launcher.to_owned(),
        driver_root: driver_root.to_owned(),
        namespace,
        children: Children::default(),
    });
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    in_flight.spawn(handle(stream, host.clone()));
                }
                // Never a reason to exit: the host's end is its daemons' end
                // (out of descriptors, say, passes).
                Err(e) => {
                    tracing::warn!(socket = %socket.display(), error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = child.recv() => {
                let host = host.clone();
                // The lock may be held across a program start: off the runtime thread.
                let _ = tokio::task::spawn_blocking(move || host.children.reap()).await;
            }
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // No new requests; those being run are answered first, so the plugin
    // learns whether its daemon started (bounded: the pod's grace period
    // is not for this alone).
    sockets::remove_socket(socket);
    drop(listener);
    if !in_flight.is_empty() {
        tracing::info!(
            requests = in_flight.len(),
            "MPS daemon host stopping; answering the requests it is running first"
        );
        let answered = tokio::time::timeout(STOP_GRACE, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if answered.is_err() {
            tracing::warn!(
                requests = in_flight.len(),
                grace_s = STOP_GRACE.as_secs(),
                "MPS daemon host stopping without answering every request"
            );
        }
    }
    tracing::info!("MPS daemon host stopped; the daemons it started keep running");
    Ok(())
}

#[cfg(test)]
mod tests;
