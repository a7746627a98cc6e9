//! Kubernetes `metav1.Status` errors: the shapes the real API server answers with (kind
//! `Status`, `status: Failure`, a `reason`, a `code` and `details`), so that kube-rs turns them into
//! `kube::Error::Api(Status)` exactly as it does against a real cluster.

use http::StatusCode;
use serde_json::{Map, Value, json};

use super::resources::Resource;

/// One field-level cause of an error (`details.causes[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCause {
    /// Machine-readable reason, e.g. `FieldValueInvalid` or `FieldManagerConflict`.
    pub reason: String,
    /// Human-readable description of this cause.
    pub message: String,
    /// The field path the cause refers to, e.g. `spec.devices[3].name`.
    pub field: String,
}

/// `details` of a Status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusDetails {
    /// `details.name`.
    pub name: String,
    /// `details.group`.
    pub group: String,
    /// `details.kind` (the resource plural for most errors, the Kind for `Invalid`).
    pub kind: String,
    /// `details.causes`.
    pub causes: Vec<StatusCause>,
}

/// A failed API request, rendered as a `metav1.Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code (also `status.code`).
    pub code: u16,
    /// `status.reason`, e.g. `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `BadRequest`.
    pub reason: &'static str,
    /// `status.message`.
    pub message: String,
    /// `status.details` (boxed: errors travel in `Result`s everywhere).
    pub details: Box<StatusDetails>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: code.as_u16(),
            reason,
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_resource(mut self, resource: Resource, name: &str) -> Self {
        name.clone_into(&mut self.details.name);
        resource.info().group.clone_into(&mut self.details.group);
        resource.info().plural.clone_into(&mut self.details.kind);
        self
    }

    /// `404 NotFound` for a missing object: `resourceslices.resource.k8s.io "x" not found`.
    pub fn not_found(resource: Resource, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified_plural()),
        )
        .with_resource(resource, name)
    }

    /// `404 NotFound` for a path the server does not serve.
    pub fn unknown_path() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// `409 AlreadyExists` on create.
    pub fn already_exists(resource: Resource, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.qualified_plural()),
        )
        .with_resource(resource, name)
    }

    /// `409 Conflict` when the `resourceVersion` of an update is not the stored one.
    pub fn conflict(resource: Resource, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                resource.qualified_plural()
            ),
        )
        .with_resource(resource, name)
    }

    /// `409 Conflict` for a failed precondition of a delete (`preconditions.uid` or
    /// `preconditions.resourceVersion`): `detail` is the real server's sentence, e.g. `the UID in
    /// the precondition (a) does not match the UID in record (b). The object might have been
    /// deleted and then recreated`. Unlike other conflicts, `details.kind` is the Kind.
    pub fn precondition_failed(resource: Resource, name: &str, detail: &str) -> Self {
        let info = resource.info();
        let mut err = Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {detail}",
                kind_group(resource)
            ),
        )
        .with_resource(resource, name);
        info.kind.clone_into(&mut err.details.kind);
        err
    }

    /// `409 Conflict` for a failed storage precondition of an update (a body naming another
    /// UID than the stored object's), worded as the real server's storage layer words it.
    pub fn storage_precondition_failed(
        resource: Resource,
        namespace: &str,
        name: &str,
        detail: &str,
    ) -> Self {
        let info = resource.info();
        // etcd keys: `/registry/<resource>/[<namespace>/]<name>`; Nodes live under `minions`.
        let prefix = if resource == Resource::Nodes {
            "minions"
        } else {
            info.plural
        };
        let key = if namespace.is_empty() {
            format!("/registry/{prefix}/{name}")
        } else {
            format!("/registry/{prefix}/{namespace}/{name}")
        };
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": StorageError: invalid object, \
                 Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: {detail}",
                resource.qualified_plural()
            ),
        )
        .with_resource(resource, name)
    }

    /// `422 Invalid` for a request option (`kind` is `CreateOptions`, `UpdateOptions`,
    /// `PatchOptions`): `PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value`.
    pub fn invalid_options(kind: &str, cause: StatusCause) -> Self {
        let mut err = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "{kind}.meta.k8s.io \"\" is invalid: {}: {}",
                cause.field, cause.message
            ),
        );
        err.details = Box::new(StatusDetails {
            name: String::new(),
            group: "meta.k8s.io".into(),
            kind: kind.to_owned(),
            causes: vec![cause],
        });
        err
    }

    /// `409 Conflict` for server-side apply conflicts, with one `FieldManagerConflict` cause per
    /// field.
    pub fn apply_conflict(message: String, causes: Vec<StatusCause>) -> Self {
        let mut err = Self::new(StatusCode::CONFLICT, "Conflict", message);
        err.details.causes = causes;
        err
    }

    /// `422 Invalid` with field causes: `Kind.group "name" is invalid: ...`.
    pub fn invalid(
        resource: Resource,
        name: &str,
        causes: Vec<StatusCause>,
        summary: &str,
    ) -> Self {
        let info = resource.info();
        // events.k8s.io Events are validated as core Events: no group, and `note` is `message`.
        let (kind_group, group) = if resource == Resource::Events {
            (info.kind.to_owned(), "")
        } else {
            (kind_group(resource), info.group)
        };
        let mut err = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{kind_group} \"{name}\" is invalid: {summary}"),
        );
        err.details = Box::new(StatusDetails {
            name: name.to_owned(),
            group: group.to_owned(),
            kind: info.kind.to_owned(),
            causes,
        });
        err
    }

    /// `422 Invalid` without a resource (e.g. an unsupported `propagationPolicy`).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// `413 RequestEntityTooLarge`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// `415 UnsupportedMediaType` for a patch content type the stand-in does not serve (the
    /// real server's reason and code; its message lists the types the stand-in accepts).
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}) - accepted \
                 media types include: application/merge-patch+json, application/apply-patch+yaml"
            ),
        )
    }

    /// `410 Expired`, sent as a watch `ERROR` event when the requested resourceVersion is gone.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            StatusCode::GONE,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// `500 InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    /// `500` without a reason: what the real server answers for errors that are not API
    /// errors (a server-side apply with undeclared fields, a watch at an unparsable
    /// resourceVersion).
    pub fn internal_without_reason(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "", message)
    }

    /// The `metav1.Status` JSON for this error.
    pub fn to_status(&self) -> Value {
        let d = &self.details;
        let mut details = Map::new();
        if !d.name.is_empty() {
            details.insert("name".into(), Value::String(d.name.clone()));
        }
        if !d.group.is_empty() {
            details.insert("group".into(), Value::String(d.group.clone()));
        }
        if !d.kind.is_empty() {
            details.insert("kind".into(), Value::String(d.kind.clone()));
        }
        if !d.causes.is_empty() {
            let causes = d
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// `Kind.group` (`Kind` for the core group), as messages name a type.
fn kind_group(resource: Resource) -> String {
    let info = resource.info();
    if info.group.is_empty() {
        info.kind.to_owned()
    } else {
        format!("{}.{}", info.kind, info.group)
    }
}

/// The `metav1.Status` a delete answers with for resources that do not return the deleted
/// object (Leases, Events).
pub(crate) fn delete_success(resource: Resource, name: &str, uid: &str) -> Value {
    let info = resource.info();
    let mut details = Map::new();
    details.insert("name".into(), json!(name));
    if !info.group.is_empty() {
        details.insert("group".into(), json!(info.group));
    }
    details.insert("kind".into(), json!(info.plural));
    details.insert("uid".into(), json!(uid));
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_api_server_shape() {
        let status = ApiError::not_found(Resource::ResourceSlices, "node-a-gpu").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["apiVersion"], "v1");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(
            status["message"],
            "resourceslices.resource.k8s.io \"node-a-gpu\" not found"
        );
        assert_eq!(status["details"]["kind"], "resourceslices");
        assert_eq!(status["details"]["group"], "resource.k8s.io");
    }

    #[test]
    fn core_resources_have_no_group_suffix() {
        let err = ApiError::not_found(Resource::Nodes, "n1");
        assert_eq!(err.message, "nodes \"n1\" not found");
        let status = err.to_status();
        assert!(status["details"].get("group").is_none());
    }

    #[test]
    fn invalid_carries_causes_and_kind() {
        let cause = StatusCause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.driver".into(),
        };
        let err = ApiError::invalid(
            Resource::ResourceSlices,
            "s",
            vec![cause],
            "spec.driver: Required value",
        );
        let status = err.to_status();
        assert_eq!(status["code"], 422);
        assert_eq!(
            status["message"],
            "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.driver: Required value"
        );
        assert_eq!(status["details"]["kind"], "ResourceSlice");
        assert_eq!(status["details"]["causes"][0]["field"], "spec.driver");
    }
}
