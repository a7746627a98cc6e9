//! Fault injection for the stand-in API server's writes: a knob a test
//! turns to make every write (POST, PUT, PATCH, DELETE) fail the way a
//! sick API server fails, and turns back to see the client recover.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gpu_dra_sim::apiserver::Error> {
//! use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer, WriteFault};
//! let server = TestApiServer::start(ServerOptions::default()).await?;
//! server.faults().set_writes(WriteFault::Status(429)); // every write: 429 TooManyRequests
//! server.faults().set_writes(WriteFault::Hang);        // every write: no answer
//! server.faults().set_writes(WriteFault::None);        // healthy again; hung writes go on
//! # Ok(()) }
//! ```
//!
//! Reads and watches are never touched: a plugin whose writes fail still
//! sees the claims it prepares.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode, header};
use serde_json::json;

/// What the server does with every write request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteFault {
    /// Nothing: writes are served.
    #[default]
    None,
    /// Every write is answered with this HTTP status and a `metav1.Status`
    /// body with the real server's reason for it (`429` comes with
    /// `Retry-After: 1`, as the real server's priority and fairness
    /// sends it).
    Status(u16),
    /// Every write waits, unanswered, until the fault is changed (it is
    /// then served as the new setting says) or the server shuts down
    /// (`503`).
    Hang,
}

/// The server's fault settings and what they did ([`super::TestApiServer::faults`]).
#[derive(Debug)]
pub struct Faults {
    writes: tokio::sync::watch::Sender<WriteFault>,
    faulted: AtomicU64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            writes: tokio::sync::watch::channel(WriteFault::None).0,
            faulted: AtomicU64::new(0),
        }
    }
}

impl Faults {
    /// Sets what every write gets from now on (writes hanging now are
    /// released into the new setting).
    pub fn set_writes(&self, fault: WriteFault) {
        tracing::info!(?fault, "test API server: write fault set");
        self.writes.send_replace(fault);
    }

    /// The current write fault.
    pub fn writes(&self) -> WriteFault {
        *self.writes.borrow()
    }

    /// How many write requests a fault has met so far (refused, or hung).
    pub fn faulted_writes(&self) -> u64 {
        self.faulted.load(Ordering::Relaxed)
    }

    /// The fault's answer to a request with `method`, or `None` to serve
    /// it. A hung write waits here; `shutdown` ends the wait with `503`.
    pub(crate) async fn intercept(
        &self,
        method: &Method,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Response> {
        if !is_write(method) {
            return None;
        }
        let mut fault = self.writes();
        if fault != WriteFault::None {
            self.faulted.fetch_add(1, Ordering::Relaxed);
        }
        if fault == WriteFault::Hang {
            let mut rx = self.writes.subscribe();
            tokio::select! {
                changed = rx.wait_for(|f| *f != WriteFault::Hang) => match changed {
                    Ok(f) => fault = *f,
                    Err(_) => return Some(refusal(503)),
                },
                _ = shutdown.wait_for(|stop| *stop) => return Some(refusal(503)),
            }
        }
        match fault {
            WriteFault::None | WriteFault::Hang => None,
            WriteFault::Status(code) => Some(refusal(code)),
        }
    }
}

fn is_write(method: &Method) -> bool {
    [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method)
}

/// The answer to a refused write: `metav1.Status` with the real server's
/// reason for `code`.
fn refusal(code: u16) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let reason = match code {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        500 => "InternalError",
        _ => "",
    };
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("injected fault: every write is answered with {code}"),
        "code": code,
    });
    if !reason.is_empty() {
        body["reason"] = json!(reason);
    }
    // Built here, not with the HTTP layer's helper: the HTTP layer's state
    // holds the faults, and modules import one way.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let mut response =
        (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    if code == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_pass_and_writes_get_the_fault() {
        let faults = Faults::default();
        let (_stop, mut shutdown) = tokio::sync::watch::channel(false);
        assert!(
            faults
                .intercept(&Method::POST, &mut shutdown)
                .await
                .is_none()
        );
        faults.set_writes(WriteFault::Status(429));
        assert!(
            faults
                .intercept(&Method::GET, &mut shutdown)
                .await
                .is_none()
        );
        let r = faults
            .intercept(&Method::PATCH, &mut shutdown)
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        faults.set_writes(WriteFault::Status(500));
        let r = faults
            .intercept(&Method::DELETE, &mut shutdown)
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(faults.faulted_writes(), 2);
    }

    #[tokio::test]
    async fn a_hung_write_goes_on_when_the_fault_is_lifted() {
        let faults = std::sync::Arc::new(Faults::default());
        faults.set_writes(WriteFault::Hang);
        let (_stop, mut shutdown) = tokio::sync::watch::channel(false);
        let f = faults.clone();
        let hung = tokio::spawn(async move { f.intercept(&Method::PUT, &mut shutdown).await });
        tokio::task::yield_now().await;
        assert!(!hung.is_finished());
        faults.set_writes(WriteFault::None);
        assert!(hung.await.unwrap().is_none());
        assert_eq!(faults.faulted_writes(), 1);
    }

    #[tokio::test]
    async fn shutdown_ends_a_hung_write() {
        let faults = Faults::default();
        faults.set_writes(WriteFault::Hang);
        let (stop, mut shutdown) = tokio::sync::watch::channel(false);
        stop.send_replace(true);
        let r = faults
            .intercept(&Method::POST, &mut shutdown)
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
