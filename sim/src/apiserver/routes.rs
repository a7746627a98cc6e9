//! HTTP routing: parses Kubernetes REST paths, query parameters and bodies, calls the store,
//! and renders objects, lists and Status errors the way the API server does.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Value, json};

use super::http::{AppState, Params, Representation, json_response};
use super::patch::PatchBody;
use super::resources::{self, Resource};
use super::schema;
use super::status::{self, ApiError, StatusCause};
use super::store::{DeleteOptions, WriteOptions};
use super::watch;

/// The router: everything goes through one handler that parses Kubernetes paths itself, so
/// unknown paths get a proper Status.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// A JSON response with one `Warning: 299 - "..."` header per warning.
fn warned(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut response = json_response(code, body);
    for warning in warnings {
        let text = format!("299 - {}", serde_json::Value::String(warning.clone()));
        if let Ok(value) = http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// `fieldValidation`: what a write does with fields its type does not declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them with a warning each (the default).
    Warn,
    /// Refuse the request.
    Strict,
}

impl FieldValidation {
    /// `options` names the request's options type in the error (`CreateOptions`, ...).
    fn parse(params: &Params, options: &str) -> Result<Self, ApiError> {
        match params.get("fieldValidation").unwrap_or("") {
            "Ignore" => Ok(Self::Ignore),
            "" | "Warn" => Ok(Self::Warn),
            "Strict" => Ok(Self::Strict),
            other => Err(ApiError::invalid_options(
                options,
                StatusCause {
                    reason: "FieldValueNotSupported".into(),
                    message: format!(
                        "Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                    ),
                    field: "fieldValidation".into(),
                },
            )),
        }
    }

    /// The warnings for `unknown` fields, or the Strict refusal.
    fn check(self, resource: Resource, unknown: Vec<String>) -> Result<Vec<String>, ApiError> {
        if unknown.is_empty() {
            return Ok(unknown);
        }
        match self {
            Self::Ignore => Ok(Vec::new()),
            Self::Warn => Ok(unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect()),
            Self::Strict => Err(schema::strict_error(resource, &unknown)),
        }
    }
}

/// What a request path addresses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// A collection (`.../resourceslices`, `.../namespaces/ns/resourceclaims`).
    Collection {
        resource: Resource,
        namespace: Option<String>,
    },
    /// One object, or its status subresource.
    Item {
        resource: Resource,
        namespace: Option<String>,
        name: String,
        status: bool,
    },
}

/// Parses a request path.
pub(crate) fn parse_path(path: &str) -> Result<Target, ApiError> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    let segs: Vec<&str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    if segs.iter().any(|s| s.is_empty()) {
        return Err(ApiError::unknown_path());
    }
    match segs.as_slice() {
        ["api", "v1", rest @ ..] => resource_path("", rest),
        ["apis", group, "v1", rest @ ..] if resources::GROUPS.contains(group) => {
            resource_path(group, rest)
        }
        ["version"] => Ok(Target::Version),
        ["healthz" | "livez" | "readyz"] => Ok(Target::Health),
        _ => Err(ApiError::unknown_path()),
    }
}

fn resource_path(group: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::unknown_path()),
    };
    let resource = Resource::from_group_plural(group, plural).ok_or_else(ApiError::unknown_path)?;
    let info = resource.info();
    if namespace.is_some() && !info.namespaced {
        return Err(ApiError::unknown_path());
    }
    let Some(name) = name else {
        return Ok(Target::Collection {
            resource,
            namespace,
        });
    };
    if info.namespaced && namespace.is_none() {
        return Err(ApiError::unknown_path());
    }
    let status = match sub {
        None => false,
        Some("status") if info.status_subresource => true,
        Some(_) => return Err(ApiError::unknown_path()),
    };
    Ok(Target::Item {
        resource,
        namespace,
        name: name.to_owned(),
        status,
    })
}

async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut shutdown = app.shutdown.clone();
    if let Some(response) = app.faults.intercept(&method, &mut shutdown).await {
        tracing::debug!(%method, %path, code = response.status().as_u16(), "write refused by an injected fault");
        return response;
    }
    match dispatch(&app, req).await {
        Ok(response) => {
            tracing::debug!(%method, %path, code = response.status().as_u16(), "request");
            response
        }
        Err(err) => {
            tracing::debug!(%method, %path, code = err.code, reason = %err.reason, message = %err.message, "request failed");
            err.into_response()
        }
    }
}

async fn dispatch(app: &Arc<AppState>, req: Request) -> Result<Response, ApiError> {
    let target = parse_path(req.uri().path())?;
    let params = Params::parse(&req)?;
    let method = req.method().clone();
    match target {
        Target::Version => {
            only_get(&method)?;
            Ok(json_response(StatusCode::OK, &version(app)))
        }
        Target::Health => {
            only_get(&method)?;
            Ok((StatusCode::OK, "ok").into_response())
        }
        Target::Collection {
            resource,
            namespace,
        } => collection(app, req, &params, resource, namespace).await,
        Target::Item {
            resource,
            namespace,
            name,
            status,
        } => item(app, req, &params, resource, namespace, &name, status).await,
    }
}

fn only_get(method: &Method) -> Result<(), ApiError> {
    if method == Method::GET {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed())
    }
}

fn version(app: &AppState) -> Value {
    let minor = app.opts.rules.minor();
    json!({
        "major": "1",
        "minor": minor.to_string(),
        "gitVersion": format!("v1.{minor}.0+gpu-dra-test-apiserver"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// The field manager of a non-apply write: `fieldManager`, else the User-Agent's product name.
fn field_manager(params: &Params, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if let Some(manager) = params.get("fieldManager").filter(|m| !m.is_empty()) {
        if manager.len() > 128 || manager.chars().any(char::is_control) {
            return Err(ApiError::bad_request(format!(
                "invalid fieldManager \"{}\": must be at most 128 printable characters",
                manager.escape_debug()
            )));
        }
        return Ok(Some(manager.to_owned()));
    }
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|ua| !ua.is_empty())
        .map(|ua| ua.chars().take(128).collect::<String>());
    Ok(agent)
}

/// Reads the body, enforcing the size limit.
async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::too_large(limit))
        }
        Err(err) => Err(ApiError::bad_request(format!(
            "failed to read the request body: {err}"
        ))),
    }
}

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("couldn't decode the body as JSON: {e}")))
}

/// An object body for create/update: JSON with `apiVersion` and `kind`.
fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let obj = parse_json(bytes)?;
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    for field in ["apiVersion", "kind"] {
        if obj
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            let shown: String = String::from_utf8_lossy(bytes).chars().take(200).collect();
            let what = if field == "kind" { "Kind" } else { "Version" };
            return Err(ApiError::bad_request(format!(
                "Object '{what}' is missing in '{shown}'"
            )));
        }
    }
    Ok(obj)
}

/// An apply body: JSON or YAML.
fn parse_apply(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
        return Ok(v);
    }
    // The body is already within `max_body_bytes`; bounded-yaml holds its
    // nesting and alias expansion to limits checked while reading.
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "error decoding YAML: invalid UTF-8 at byte {}",
            e.valid_up_to()
        ))
    })?;
    bounded_yaml::to_value(text, bytes.len())
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn write_options(params: &Params, headers: &HeaderMap) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        field_manager: field_manager(params, headers)?,
        dry_run: params.dry_run()?,
        force: params.flag("force")?,
    })
}

fn delete_options(params: &Params, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        dry_run: params.dry_run()?,
        orphan: params.get("propagationPolicy") == Some("Orphan"),
        ..DeleteOptions::default()
    };
    if let Some(policy) = params.get("propagationPolicy") {
        check_propagation(policy)?;
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(opts);
    }
    let body = parse_json(body)?;
    let Some(map) = body.as_object() else {
        return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
    };
    if let Some(pre) = map.get("preconditions").filter(|p| !p.is_null()) {
        let field = |name: &str| -> Result<Option<String>, ApiError> {
            match pre.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ApiError::bad_request(format!(
                    "DeleteOptions preconditions.{name} must be a string"
                ))),
            }
        };
        opts.uid = field("uid")?;
        opts.resource_version = field("resourceVersion")?;
    }
    match map.get("propagationPolicy") {
        None | Some(Value::Null) => {}
        Some(Value::String(policy)) => {
            check_propagation(policy)?;
            opts.orphan = policy == "Orphan";
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "DeleteOptions propagationPolicy must be a string",
            ));
        }
    }
    match map.get("dryRun") {
        None | Some(Value::Null) => {}
        Some(Value::Array(values)) if values.iter().all(|v| v == "All") => {
            opts.dry_run |= !values.is_empty();
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid dryRun value: {other}: supported values: \"All\""
            )));
        }
    }
    Ok(opts)
}

fn check_propagation(policy: &str) -> Result<(), ApiError> {
    if matches!(policy, "Orphan" | "Background" | "Foreground") {
        Ok(())
    } else {
        Err(ApiError::unprocessable(format!(
            "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \
             \"{policy}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
        )))
    }
}

/// Hex-encodes a continue token (opaque to clients).
fn encode_continue(namespace: &str, name: &str, rv: u64) -> String {
    super::meta::to_hex(json!([namespace, name, rv]).to_string().as_bytes())
}

fn decode_continue(token: &str) -> Result<((String, String), u64), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: malformed token");
    if !token.len().is_multiple_of(2) || token.len() > 2048 {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect::<Result<Vec<u8>, _>>()?;
    let (ns, name, rv): (String, String, u64) =
        serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok(((ns, name), rv))
}

fn list_response(
    resource: Resource,
    items: Vec<Value>,
    rv: u64,
    cont: Option<String>,
    remaining: usize,
    repr: Representation,
) -> Response {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = cont {
        metadata["continue"] = json!(token);
        metadata["remainingItemCount"] = json!(remaining);
    }
    let (kind, api_version) = match repr {
        Representation::Full => (resource.list_kind(), resource.api_version()),
        Representation::Metadata => (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1".to_owned(),
        ),
    };
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| match repr {
            Representation::Full => {
                if let Some(map) = item.as_object_mut() {
                    map.remove("apiVersion");
                    map.remove("kind");
                }
                item
            }
            Representation::Metadata => repr.object(&item),
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}),
    )
}

async fn collection(
    app: &Arc<AppState>,
    req: Request,
    params: &Params,
    resource: Resource,
    namespace: Option<String>,
) -> Result<Response, ApiError> {
    let ns = namespace.as_deref();
    let repr = Representation::from_headers(req.headers());
    let all_namespaces = resource.info().namespaced && ns.is_none();
    let method = req.method().clone();
    match method.as_str() {
        "GET" if params.flag("watch")? => watch::serve(app, resource, ns, params, repr),
        "GET" => {
            let selectors = params.selectors(resource)?;
            let limit = params.number("limit")?.map(|l| l as usize);
            let (after, list_rv) = match params.get("continue").filter(|c| !c.is_empty()) {
                Some(token) => {
                    let (after, rv) = decode_continue(token)?;
                    (Some(after), Some(rv))
                }
                None => (None, None),
            };
            let page = app
                .store
                .list_page(resource, ns, &selectors, limit, after.as_ref());
            let rv = list_rv.unwrap_or(page.resource_version);
            let cont = page
                .continue_after
                .as_ref()
                .map(|(n, name)| encode_continue(n, name, rv));
            Ok(list_response(
                resource,
                page.items,
                rv,
                cont,
                page.remaining,
                repr,
            ))
        }
        "POST" if !all_namespaces => {
            let headers = req.headers().clone();
            let validation = FieldValidation::parse(params, "CreateOptions")?;
            let body = read_body(req, app.opts.max_body_bytes).await?;
            let obj = parse_object(&body)?;
            let warnings = validation.check(resource, schema::unknown_fields(resource, &obj))?;
            let opts = write_options(params, &headers)?;
            let created = app.store.create(resource, ns, obj, &opts)?;
            Ok(warned(
                StatusCode::CREATED,
                &repr.object(&created),
                &warnings,
            ))
        }
        "DELETE" if !all_namespaces => {
            let selectors = params.selectors(resource)?;
            let body = read_body(req, app.opts.max_body_bytes).await?;
            let opts = delete_options(params, &body)?;
            let deleted = app
                .store
                .delete_collection(resource, ns, &selectors, &opts)?;
            let rv = app.store.resource_version();
            Ok(list_response(resource, deleted, rv, None, 0, repr))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

async fn item(
    app: &Arc<AppState>,
    req: Request,
    params: &Params,
    resource: Resource,
    namespace: Option<String>,
    name: &str,
    status: bool,
) -> Result<Response, ApiError> {
    let ns = namespace.as_deref();
    let repr = Representation::from_headers(req.headers());
    let headers = req.headers().clone();
    let method = req.method().clone();
    match method.as_str() {
        "GET" => {
            let obj = app.store.get(resource, ns, name)?;
            Ok(json_response(StatusCode::OK, &repr.object(&obj)))
        }
        "PUT" => {
            let validation = FieldValidation::parse(params, "UpdateOptions")?;
            let body = read_body(req, app.opts.max_body_bytes).await?;
            let obj = parse_object(&body)?;
            let warnings = validation.check(resource, schema::unknown_fields(resource, &obj))?;
            let opts = write_options(params, &headers)?;
            let updated = app.store.update(resource, ns, name, obj, status, &opts)?;
            Ok(warned(StatusCode::OK, &repr.object(&updated), &warnings))
        }
        "PATCH" => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let validation = FieldValidation::parse(params, "PatchOptions")?;
            let body = read_body(req, app.opts.max_body_bytes).await?;
            let patch = match content_type.as_str() {
                "application/merge-patch+json" => PatchBody::Merge(parse_json(&body)?),
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                    PatchBody::Apply(parse_apply(&body)?)
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let warnings = match &patch {
                PatchBody::Merge(p) => {
                    validation.check(resource, schema::unknown_fields(resource, p))?
                }
                PatchBody::Apply(_) => Vec::new(),
            };
            let mut opts = write_options(params, &headers)?;
            if matches!(patch, PatchBody::Apply(_)) {
                opts.field_manager = params
                    .get("fieldManager")
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned);
            } else if opts.force {
                return Err(ApiError::bad_request(
                    "force is only allowed for apply patches",
                ));
            }
            let (obj, created) = app.store.patch(resource, ns, name, &patch, status, &opts)?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(warned(code, &repr.object(&obj), &warnings))
        }
        "DELETE" if !status => {
            let body = read_body(req, app.opts.max_body_bytes).await?;
            let opts = delete_options(params, &body)?;
            let deleted = app.store.delete(resource, ns, name, &opts)?;
            if resource.info().delete_returns_object {
                Ok(json_response(StatusCode::OK, &repr.object(&deleted)))
            } else {
                let uid = super::meta::uid(&deleted);
                Ok(json_response(
                    StatusCode::OK,
                    &status::delete_success(resource, name, uid),
                ))
            }
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path: &str) -> Result<Target, ApiError> {
        parse_path(path)
    }

    #[test]
    fn paths() {
        assert_eq!(
            target("/apis/resource.k8s.io/v1/resourceslices").unwrap(),
            Target::Collection {
                resource: Resource::ResourceSlices,
                namespace: None
            }
        );
        assert_eq!(
            target("/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/c/status").unwrap(),
            Target::Item {
                resource: Resource::ResourceClaims,
                namespace: Some("ns1".into()),
                name: "c".into(),
                status: true
            }
        );
        assert_eq!(
            target("/api/v1/nodes/n1/").unwrap(),
            Target::Item {
                resource: Resource::Nodes,
                namespace: None,
                name: "n1".into(),
                status: false
            }
        );
        assert_eq!(
            target("/apis/resource.k8s.io/v1/resourceclaims").unwrap(),
            Target::Collection {
                resource: Resource::ResourceClaims,
                namespace: None
            }
        );
        assert_eq!(
            target("/apis/events.k8s.io/v1/namespaces/ns1/events/e1").unwrap(),
            Target::Item {
                resource: Resource::Events,
                namespace: Some("ns1".into()),
                name: "e1".into(),
                status: false
            }
        );
        assert_eq!(
            target("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases").unwrap(),
            Target::Collection {
                resource: Resource::Leases,
                namespace: Some("kube-system".into())
            }
        );
        assert!(matches!(target("/version").unwrap(), Target::Version));
    }

    #[test]
    fn unknown_paths_are_404() {
        for path in [
            "/apis/resource.k8s.io/v1/pods",
            "/apis/apps/v1/deployments",
            "/apis/events.k8s.io/v1/events/e",
            "/apis/events.k8s.io/v2/namespaces/x/events",
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/l/status",
            "/api/v1/namespaces/x/nodes",
            "/apis/resource.k8s.io/v1/resourceclaims/c",
            "/apis/resource.k8s.io/v1/resourceslices/s/status",
            "/apis/resource.k8s.io/v1/namespaces/x/resourceclaims/c/scale",
            "/apis/resource.k8s.io/v1/resourceslices/a/b/c",
            "/api//v1",
            "/nope",
        ] {
            let err = target(path).unwrap_err();
            assert_eq!(err.code, 404, "{path}");
            assert_eq!(
                err.message,
                "the server could not find the requested resource"
            );
        }
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let token = encode_continue("ns", "name-1", 42);
        assert_eq!(
            decode_continue(&token).unwrap(),
            (("ns".into(), "name-1".into()), 42)
        );
        for bad in ["zz", "abc", "7b7d", &"ab".repeat(2000)] {
            assert_eq!(decode_continue(bad).unwrap_err().code, 400, "{bad}");
        }
    }

    #[test]
    fn object_bodies_need_type_information() {
        assert!(parse_object(br#"{"apiVersion":"v1","kind":"Node"}"#).is_ok());
        let err = parse_object(br#"{"apiVersion":"v1"}"#).unwrap_err();
        assert!(
            err.message.starts_with("Object 'Kind' is missing in"),
            "{}",
            err.message
        );
        assert_eq!(parse_object(b"[1]").unwrap_err().code, 400);
        assert_eq!(parse_object(b"   ").unwrap_err().code, 400);
        assert_eq!(parse_object(b"{\"kind\":").unwrap_err().code, 400);
    }

    #[test]
    fn apply_bodies_accept_yaml() {
        let v = parse_apply(b"apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n").unwrap();
        assert_eq!(v["metadata"]["name"], "n");
        assert_eq!(parse_apply(b"a: [unclosed").unwrap_err().code, 400);
    }

    #[test]
    fn hostile_apply_bodies_are_refused_where_they_cross_a_limit() {
        // Nesting (not JSON, so read as YAML): refused at the 129th level
        // for n, 2n, 4n, ... levels alike (the pre-scan counts a sequence
        // at its mapping's column with it, a lower bound: the 129th `-`).
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            let body = format!("kind: Node\nspec:\n{}", "- ".repeat(n));
            let err = parse_apply(body.as_bytes()).unwrap_err();
            assert_eq!(err.code, 400);
            assert_eq!(
                err.message,
                "error decoding YAML: collections nested deeper than 128 levels at line 3 column 257"
            );
        }
        // Aliases: held to a node budget.
        let mut lines = vec!["a0: &a0 [x, x, x, x, x, x, x, x, x, x]".to_owned()];
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            lines.push(format!("a{i}: &a{i} [{refs}]"));
        }
        let err = parse_apply(lines.join("\n").as_bytes()).unwrap_err();
        assert!(
            err.message.contains("nodes (aliases expanded)"),
            "{}",
            err.message
        );
        let err = parse_apply(b"a: \xff").unwrap_err();
        assert_eq!(err.message, "error decoding YAML: invalid UTF-8 at byte 3");
    }

    #[test]
    fn delete_options_parse() {
        let params = Params::default();
        let opts = delete_options(
            &params,
            br#"{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1","preconditions":{"uid":"u","resourceVersion":"5"},"propagationPolicy":"Orphan","dryRun":["All"]}"#,
        )
        .unwrap();
        assert_eq!(opts.uid.as_deref(), Some("u"));
        assert_eq!(opts.resource_version.as_deref(), Some("5"));
        assert!(opts.orphan && opts.dry_run);
        assert_eq!(
            delete_options(&params, br#"{"propagationPolicy":"Sideways"}"#)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            delete_options(&params, br#"{"dryRun":["Some"]}"#)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            delete_options(&params, br#"{"preconditions":{"uid":5}}"#)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(delete_options(&params, b"[]").unwrap_err().code, 400);
    }
}
