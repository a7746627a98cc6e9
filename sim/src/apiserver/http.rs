//! The HTTP layer the routes and the watches share: the handlers' state, query parameters,
//! how objects are rendered (whole or as metadata), JSON responses, and `metav1.Status` errors
//! as responses. Below the routes and the watches, above the store and the status errors, so
//! that status, store, routes and watch import one way.

use std::sync::Arc;

use axum::extract::{Query, Request};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};

use super::ServerOptions;
use super::resources::Resource;
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::status::ApiError;
use super::store::Store;

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub(crate) struct AppState {
    pub store: Arc<Store>,
    pub faults: Arc<super::faults::Faults>,
    pub opts: ServerOptions,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// A JSON response.
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// Query parameters.
#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn parse(req: &Request) -> Result<Self, ApiError> {
        Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| Params(q.0))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("" | "false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid boolean value \"{other}\" for parameter {name}"
            ))),
        }
    }

    pub(crate) fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid value \"{v}\" for parameter {name}"))
                })
            })
            .transpose()
    }

    pub(crate) fn selectors(&self, resource: Resource) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            fields: FieldSelector::parse(resource, self.get("fieldSelector").unwrap_or(""))?,
            labels: LabelSelector::parse(self.get("labelSelector").unwrap_or(""))?,
        })
    }

    pub(crate) fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "Invalid dryRun value: \"{other}\": supported values: \"All\""
            ))),
        }
    }
}

/// How objects are rendered: whole, or as `PartialObjectMetadata` (kube's metadata API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Representation {
    Full,
    Metadata,
}

impl Representation {
    pub(crate) fn from_headers(headers: &HeaderMap) -> Self {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if accept.contains("as=PartialObjectMetadata") {
            Representation::Metadata
        } else {
            Representation::Full
        }
    }

    /// Renders an object (watch events and single objects).
    pub(crate) fn object(self, obj: &Value) -> Value {
        match self {
            Representation::Full => obj.clone(),
            Representation::Metadata => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_status())
    }
}
