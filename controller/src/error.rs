//! Errors of the controller library: what can go wrong while loading the
//! webhook's TLS identity, binding its address, or connecting to the
//! Kubernetes API.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything the controller library reports to its caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TLS certificate or key file could not be read.
    #[error("cannot read {what} file {path}: {source}")]
    ReadTlsFile {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A TLS certificate or key file is larger than any sane PEM file.
    #[error("{what} file {path} is too large ({size} bytes, at most {limit})")]
    TlsFileTooLarge {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The largest accepted size.
        limit: u64,
    },
    /// A TLS certificate or key file is not usable PEM (or holds nothing of
    /// the right kind).
    #[error("invalid {what} file {path}: {reason}")]
    BadTlsFile {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key cannot be used by rustls, or does not match the certificate.
    #[error("certificate {cert} and key {key} cannot be used together: {source}")]
    TlsIdentity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The webhook address could not be bound.
    #[error("cannot listen on webhook address {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What kube said.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster configuration exists but is unusable.
    #[error("cannot use the in-cluster Kubernetes configuration: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// A Kubernetes client could not be built from a valid configuration.
    #[error("cannot create the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}
