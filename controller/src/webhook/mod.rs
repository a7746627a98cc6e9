//! The validating admission webhook: an HTTPS server (rustls on ring) with
//! `POST /validate` for DeviceClasses, ResourceClaims and
//! ResourceClaimTemplates of every `resource.k8s.io` version, plus
//! `GET /healthz` and `GET /metrics`.
//!
//! - [`tls`]: the certificate and key, re-read when the files change.
//! - [`review`]: AdmissionReview in, decision out (no I/O; the shared
//!   validation engine of `gpu_dra_analysis::validate` does the judging).
//! - [`server`]: the listener, the routes, body limits and metrics.
//! - [`metrics`]: the webhook's Prometheus metrics.

pub mod metrics;
pub mod review;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::time::Duration;

pub use review::Reviewer;
pub use server::WebhookServer;
pub use tls::TlsFiles;

/// Default limit of an AdmissionReview body: 6 MiB. The API server accepts
/// request bodies up to 3 MiB, and an UPDATE review carries both the new and
/// the old object, so twice that covers every review it can send.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 6 << 20;

/// Settings of the webhook server.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Address to listen on; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Certificate and key files.
    pub tls: TlsFiles,
    /// How often the TLS files are checked for changes.
    pub reload_interval: Duration,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// Reviews judged at the same time; more wait their turn (bounds the
    /// CPU and memory a flood of large reviews can take).
    pub max_concurrent_reviews: usize,
    /// Longest time for a client to finish the TLS handshake and to send a
    /// request body.
    pub client_timeout: Duration,
    /// Longest time an HTTP/1.1 connection may wait for (the headers of) its
    /// next request. Longer than the API server's idle-connection timeout
    /// (Go's 90 s), so that it is the client that closes idle connections:
    /// a server-side close racing a new request would fail that review.
    pub idle_timeout: Duration,
    /// How long a graceful shutdown waits for open connections to finish.
    pub shutdown_grace: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            addr: SocketAddr::from(([0, 0, 0, 0], 8443)),
            tls: TlsFiles::default(),
            reload_interval: Duration::from_secs(10),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES as usize,
            max_concurrent_reviews: std::thread::available_parallelism()
                .map_or(2, std::num::NonZeroUsize::get)
                * 2,
            client_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}
