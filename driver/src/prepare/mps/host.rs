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
//!
//! The parts: `protocol` (the messages and their checks, both sides),
//! `client` (the plugin's side), `server` (the host itself).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod client;
mod protocol;
mod server;

pub use client::request_start;
pub use protocol::{Outcome, PrivateMount, Reply, StartRequest, pid_namespace};
pub use server::serve;

/// The first argument that selects the host in the plugin's program.
pub const HOST_ARG: &str = "mps-host";
/// Longest `-d` run a request may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// The host's flags (after [`HOST_ARG`]).
#[derive(Debug, clap::Parser)]
#[command(
    name = "gpu-kubelet-plugin mps-host",
    about = "Starts MPS control daemons for the kubelet plugin, in this process's container"
)]
pub struct HostFlags {
    /// The socket to serve on: the plugin's `--mps-host-socket`.
    #[arg(long, env = "MPS_HOST_SOCKET", value_parser = crate::paths::parse_socket_path)]
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
    crate::paths::absolute_without_dotdot(s, "the driver as this container sees it")
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
    Socket(#[from] crate::sockets::Error),
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

#[cfg(test)]
mod tests;
