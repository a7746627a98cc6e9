//! How far the plugin's start has got, shared with the liveness and
//! readiness probes. During a rolling update (`--rolling-update`) a new instance
//! waits for the old one to exit before it touches the node's state; it
//! is alive and ready to take over while it waits, and the probes must say
//! so, or kubelet would restart it and the DaemonSet would never delete
//! the old pod.

use std::path::PathBuf;

use tokio::sync::watch;

/// Where the plugin's start is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Loading NVML, discovering, recovering, binding the sockets.
    Starting,
    /// Waiting for the instance that holds `lock` to exit; everything
    /// before the node's state (NVML, discovery, the kube client) is done.
    WaitingFor(PathBuf),
    /// The kubelet sockets are bound.
    Serving,
}

/// A phase channel, starting at [`Phase::Starting`].
pub fn channel() -> (watch::Sender<Phase>, watch::Receiver<Phase>) {
    watch::channel(Phase::Starting)
}
