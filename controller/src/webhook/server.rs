//! The webhook's HTTPS server: a TCP listener, rustls (ring) with the
//! reloading certificate resolver, hyper serving HTTP/1.1 and HTTP/2, and
//! three routes:
//!
//! - `POST /validate`: AdmissionReview JSON in, AdmissionReview JSON out.
//!   Malformed or wrong-typed reviews get 400 with a one-line message,
//!   bodies over the limit 413, non-JSON content types 415, bodies that do
//!   not arrive in time 408. Reviews are judged on blocking threads, at most
//!   [`WebhookConfig::max_concurrent_reviews`] at once; a review that fails
//!   internally gets 500 and the server keeps serving.
//! - `GET /healthz`: `ok`.
//! - `GET /metrics`: the controller's whole registry (OpenMetrics text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::WebhookConfig;
use super::metrics::{Kind, Outcome, WebhookMetrics};
use super::review::Reviewer;
use super::tls::{CertReloader, CertResolver};
use crate::Error;
use crate::metrics::{CONTENT_TYPE, SharedRegistry};

/// A running webhook server. Dropping it stops accepting connections
/// abruptly; [`WebhookServer::shutdown`] drains open ones first.
#[derive(Debug)]
pub struct WebhookServer {
    local_addr: SocketAddr,
    resolver: Arc<CertResolver>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.stop.send_replace(true);
    }
}

struct AppState {
    reviewer: Arc<Reviewer>,
    metrics: WebhookMetrics,
    registry: SharedRegistry,
    max_body_bytes: usize,
    body_timeout: Duration,
    permits: Arc<Semaphore>,
}

impl WebhookServer {
    /// Loads the certificate (an error if it is unusable), binds
    /// `config.addr`, registers the webhook metrics in `registry` and starts
    /// serving in the background.
    pub async fn start(
        config: WebhookConfig,
        reviewer: Reviewer,
        registry: &SharedRegistry,
    ) -> Result<Self, Error> {
        let metrics = WebhookMetrics::register(registry);
        let tls_files = config.tls.clone();
        let (resolver, reloader) = CertReloader::start(tls_files.clone(), Some(metrics.clone()))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|source| Error::TlsIdentity {
            cert: tls_files.cert.clone(),
            key: tls_files.key.clone(),
            source,
        })?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;

        let state = Arc::new(AppState {
            reviewer: Arc::new(reviewer),
            metrics,
            registry: registry.clone(),
            max_body_bytes: config.max_body_bytes,
            body_timeout: config.client_timeout,
            permits: Arc::new(Semaphore::new(config.max_concurrent_reviews.max(1))),
        });
        let router = Router::new()
            .route("/validate", post(validate))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/metrics", get(metrics_text))
            .with_state(state);

        let (stop, stopped) = watch::channel(false);
        let reload = tokio::spawn(reloader.run(config.reload_interval, stopped.clone()));
        let task = tokio::spawn(async move {
            accept_loop(
                listener,
                TlsAcceptor::from(Arc::new(tls)),
                router,
                &config,
                stopped,
            )
            .await;
            let _ = reload.await;
        });
        tracing::info!(addr = %local_addr, "admission webhook listening");
        Ok(WebhookServer {
            local_addr,
            resolver,
            stop,
            task: Some(task),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The leaf certificate (DER) served now.
    pub fn current_certificate(&self) -> Vec<u8> {
        self.resolver
            .current()
            .cert
            .first()
            .map(|c| c.to_vec())
            .unwrap_or_default()
    }

    /// Stops accepting connections, lets open ones finish their requests
    /// (up to [`WebhookConfig::shutdown_grace`]) and waits for the server to
    /// end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    config: &WebhookConfig,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.idle_timeout);
    builder.http2().timer(TokioTimer::new());
    let handshake_timeout = config.client_timeout;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off a little
                // instead of spinning.
                tracing::warn!(error = %e, "webhook accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builder = builder.clone();
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(config.shutdown_grace) => {
            tracing::warn!("webhook connections still open after the shutdown grace period");
        }
    }
    tracing::info!("admission webhook stopped");
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.registry.encode(),
    )
        .into_response()
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    let mut text = message.into();
    text.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn validate(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let (kind, outcome, response) = state.validate(&headers, body).await;
    state
        .metrics
        .review(kind, outcome, started.elapsed().as_secs_f64());
    response
}

impl AppState {
    async fn validate(&self, headers: &HeaderMap, body: Body) -> (Kind, Outcome, Response) {
        let bad =
            |status, message: String| (Kind::Unknown, Outcome::bad_request, plain(status, message));
        if let Some(ct) = headers.get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or_default();
            let essence = ct.split(';').next().unwrap_or_default().trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                return bad(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("content type must be application/json, got {ct:?}"),
                );
            }
        }
        let too_large = || {
            (
                Kind::Unknown,
                Outcome::too_large,
                plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request body is larger than the limit of {} bytes",
                        self.max_body_bytes
                    ),
                ),
            )
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return too_large();
        }
        let collected = tokio::time::timeout(
            self.body_timeout,
            Limited::new(body, self.max_body_bytes).collect(),
        )
        .await;
        let bytes: Bytes = match collected {
            Ok(Ok(c)) => c.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(),
            Ok(Err(e)) => {
                return bad(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read request body: {e}"),
                );
            }
            Err(_) => {
                return bad(
                    StatusCode::REQUEST_TIMEOUT,
                    "request body did not arrive in time".to_owned(),
                );
            }
        };

        let Ok(_permit) = self.permits.clone().acquire_owned().await else {
            return (
                Kind::Unknown,
                Outcome::internal_error,
                plain(StatusCode::SERVICE_UNAVAILABLE, "webhook is shutting down"),
            );
        };
        let reviewer = self.reviewer.clone();
        let judged = tokio::task::spawn_blocking(move || {
            reviewer.review_json(&bytes).map(|verdict| {
                let body = serde_json::to_vec(&verdict.review);
                (verdict.kind, verdict.outcome, body)
            })
        })
        .await;
        match judged {
            Ok(Ok((kind, outcome, Ok(body)))) => (
                kind,
                outcome,
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    body,
                )
                    .into_response(),
            ),
            Ok(Ok((kind, _, Err(e)))) => {
                tracing::error!(error = %e, "cannot encode the AdmissionReview response");
                (
                    kind,
                    Outcome::internal_error,
                    plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot encode the response",
                    ),
                )
            }
            Ok(Err(rejection)) => {
                tracing::debug!(error = %rejection.message, "rejected a malformed AdmissionReview");
                (
                    rejection.kind,
                    Outcome::bad_request,
                    plain(StatusCode::BAD_REQUEST, rejection.message),
                )
            }
            Err(e) => {
                // A panic in the validation engine: answer, log, keep serving.
                tracing::error!(error = %e, "review failed internally");
                (
                    Kind::Unknown,
                    Outcome::internal_error,
                    plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal error while judging the review; see the webhook log",
                    ),
                )
            }
        }
    }
}
