//! Errors of the plugin's sockets: starting, serving and stopping the gRPC
//! servers on them. Every message is one line and names the path involved.

use std::path::PathBuf;
use std::time::Duration;

/// Why the plugin's gRPC servers could not start, or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver name cannot be used in socket paths or as a DRA driver name.
    #[error("invalid driver name {name:?}: {reason}")]
    InvalidDriverName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A socket path does not fit into `sockaddr_un.sun_path`.
    #[error("socket path {path} is {len} bytes long; Unix socket paths are limited to {max} bytes")]
    SocketPathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path that fits.
        max: usize,
    },
    /// The current directory could not be read to make a relative path absolute.
    #[error("cannot make {path} absolute: {source}")]
    Absolute {
        /// The relative path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A socket directory could not be created or given its mode.
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A path that must be a directory is something else.
    #[error("{path} exists and is not a directory")]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// The lock file that serializes plugin instances could not be opened.
    #[error("cannot open lock file {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another plugin instance holds the lock of this socket.
    #[error("another plugin instance holds {path}; refusing to start a second one")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// Something other than a socket sits where a socket must be bound.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// A live server answers on the socket path: starting would hijack it.
    #[error("another process is serving on {path}; refusing to take over a live socket")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Checking whether an existing socket is live failed.
    #[error("cannot check whether {path} is in use: {source}")]
    Probe {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A stale socket file could not be removed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Binding or listening on a socket failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Renaming a bound socket from its hidden staging name into place
    /// failed.
    #[error("cannot move the socket {staging} to {path}: {source}")]
    Place {
        /// The hidden name it was bound under.
        staging: PathBuf,
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Setting a socket's mode failed.
    #[error("cannot set the mode of {path}: {source}")]
    Chmod {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A gRPC server stopped with an error.
    #[error("gRPC server on {path} failed: {message}")]
    Serve {
        /// The socket it served.
        path: PathBuf,
        /// The transport error, flattened to one line.
        message: String,
    },
    /// A gRPC server stopped although nobody asked it to.
    #[error("gRPC server on {path} stopped unexpectedly")]
    Stopped {
        /// The socket it served.
        path: PathBuf,
    },
    /// In-flight calls did not finish within the drain timeout.
    #[error("in-flight calls on {path} did not finish within {timeout:?}; they were cut off")]
    DrainTimeout {
        /// The socket whose calls were cut off.
        path: PathBuf,
        /// How long the drain waited.
        timeout: Duration,
    },
}
