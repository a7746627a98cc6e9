//! Explicit gRPC message size limits for every service the plugin serves,
//! and the status a request over the limit is refused with.
//!
//! Kubelet talks to the plugin with grpc-go's defaults: it accepts
//! responses of up to 4 MiB and sends requests of any size. What kubelet
//! sends is small: a `NodePrepareResources` carries the claims of one pod,
//! each a namespace (at most 63 bytes), a name (at most 253) and a UID (36),
//! so about 360 bytes with the protobuf framing; 4 MiB hold more than
//! 11,000 of them, far more than any pod can have. So the DRA services
//! decode and encode up to [`DRA_MAX_MESSAGE`] (4 MiB, grpc-go's receive
//! default: a larger answer kubelet would refuse anyway). The registration
//! service and the health streams' requests are a few bytes: they decode
//! up to [`SMALL_MAX_MESSAGE`]; the health streams' device lists may be as
//! large as the DRA answers.
//!
//! tonic refuses a request over its decoding limit with `OutOfRange`;
//! grpc-go (kubelet's side) uses `ResourceExhausted` for the same thing,
//! and so do these servers: [`ResourceExhaustedLayer`] rewrites the status
//! of tonic's refusal (a trailers-only response, before any handler ran).
//! Hand-written: tonic has no setting for the code, and a tower
//! `MapResponse` would need a boxed function type in the server's type.

use std::task::{Context, Poll};

use http::{HeaderValue, Response};
use tower::{Layer, Service};

/// Largest DRA request decoded and DRA answer or health list encoded:
/// 4 MiB, what kubelet's grpc-go client accepts.
pub const DRA_MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Largest request the registration service and the health streams
/// decode (their requests are a few bytes), and the largest registration
/// answer encoded.
pub const SMALL_MAX_MESSAGE: usize = 64 * 1024;

/// `grpc-status` of tonic's refusal of a message over the limit.
const OUT_OF_RANGE: &str = "11";

/// `grpc-status` grpc-go uses for it.
const RESOURCE_EXHAUSTED: HeaderValue = HeaderValue::from_static("8");

/// What tonic's refusal's `grpc-message` starts with (percent-encoded,
/// as it is on the wire).
const TOO_LARGE: &str = "Error, decoded message length too large";

/// Whether the headers are tonic's refusal of an oversized request.
fn is_too_large(headers: &http::HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|s| s == OUT_OF_RANGE)
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.replace("%20", " ").starts_with(TOO_LARGE))
}

/// Answers an oversized request with `ResourceExhausted` instead of
/// tonic's `OutOfRange` (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceExhaustedLayer;

impl<S> Layer<S> for ResourceExhaustedLayer {
    type Service = ResourceExhausted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ResourceExhausted { inner }
    }
}

/// The service [`ResourceExhaustedLayer`] wraps around a server.
#[derive(Clone, Debug)]
pub struct ResourceExhausted<S> {
    inner: S,
}

impl<S, Req, B> Service<Req> for ResourceExhausted<S>
where
    S: Service<Req, Response = Response<B>>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = futures::future::MapOk<S::Future, fn(Response<B>) -> Response<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        use futures::TryFutureExt;
        self.inner.call(req).map_ok(rewrite as fn(_) -> _)
    }
}

/// Rewrites tonic's refusal of an oversized request; anything else passes.
fn rewrite<B>(mut response: Response<B>) -> Response<B> {
    if is_too_large(response.headers()) {
        response
            .headers_mut()
            .insert("grpc-status", RESOURCE_EXHAUSTED);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: &str, message: &str) -> Response<()> {
        let mut r = Response::new(());
        r.headers_mut()
            .insert("grpc-status", HeaderValue::from_str(status).unwrap());
        r.headers_mut()
            .insert("grpc-message", HeaderValue::from_str(message).unwrap());
        r
    }

    #[test]
    fn tonics_refusal_becomes_resource_exhausted() {
        let r = rewrite(response(
            "11",
            "Error,%20decoded%20message%20length%20too%20large:%20found%205%20bytes",
        ));
        assert_eq!(r.headers()["grpc-status"], "8");
    }

    #[test]
    fn other_statuses_pass_unchanged() {
        for (status, message) in [
            ("11", "index%20out%20of%20range"),
            ("3", "Error,%20decoded%20message%20length%20too%20large"),
            ("0", ""),
        ] {
            let r = rewrite(response(status, message));
            assert_eq!(r.headers()["grpc-status"], status, "{message}");
        }
        let r = rewrite(Response::new(()));
        assert!(r.headers().get("grpc-status").is_none());
    }

    #[test]
    fn many_claims_fit_under_the_dra_limit() {
        use prost::Message;
        let claim = dra_proto::dra::v1::Claim {
            namespace: "n".repeat(63),
            name: "c".repeat(253),
            uid: "8d4c7f0e-0000-4000-8000-00000000000a".into(),
        };
        let request = dra_proto::dra::v1::NodePrepareResourcesRequest {
            claims: vec![claim; 10_000],
        };
        assert!(
            request.encoded_len() < DRA_MAX_MESSAGE,
            "{}",
            request.encoded_len()
        );
    }
}
