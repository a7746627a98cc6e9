//! One admission review, from the AdmissionReview JSON the API server sends
//! to the AdmissionReview it gets back. No I/O: the judging is done by the
//! shared engine, [`gpu_dra_analysis::validate::Validator`], the same code the
//! plugin runs at prepare time and `gpu-dra lint` runs offline.
//!
//! Rules:
//! - Only `admission.k8s.io/v1` reviews are read; anything else that is not
//!   a well-formed review is a [`Rejection`] (HTTP 400), never a denial.
//! - DELETE and CONNECT, subresources, kinds other than DeviceClass,
//!   ResourceClaim and ResourceClaimTemplate of `resource.k8s.io`, and
//!   UPDATEs that leave `spec` as it was are admitted without looking
//!   further (an object that is already stored must stay deletable and its
//!   finalizers removable even if today's rules would reject it).
//! - Objects the engine says are not ours are admitted with no warnings.
//! - Ours with errors: denied, 422 `Invalid`, with every error (path, message,
//!   hint) in `status.message` and as `status.details.causes`.
//! - Warnings go to `response.warnings`, one line each, within the API
//!   server's limits (it truncates every warning to 256 characters once all
//!   of them exceed 4096 characters, and drops warnings with control
//!   characters), so they arrive whole.
//! - Dry-run requests are judged the same way.

use std::fmt::Write as _;
use std::sync::Arc;

use gpu_dra_analysis::validate::{ClassLookup, Finding, Report, Validator};
use kube::core::DynamicObject;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::response::{Status, StatusCause, StatusDetails};

use super::metrics::{Kind, Outcome};

/// Longest warning sent, in characters.
pub const MAX_WARNING_CHARS: usize = 256;
/// Longest total of all warnings of one review, in characters.
pub const MAX_WARNINGS_TOTAL_CHARS: usize = 4096;
/// Longest `status.message` of a denial, in bytes; errors beyond it are
/// counted, not listed.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Longest error message of a [`Rejection`], in characters.
const MAX_REJECTION_CHARS: usize = 512;

/// The answer to a well-formed review (HTTP 200).
#[derive(Debug)]
pub struct Verdict {
    /// What the object was.
    pub kind: Kind,
    /// How the review ended.
    pub outcome: Outcome,
    /// The AdmissionReview to send back.
    pub review: AdmissionReview<DynamicObject>,
}

impl Verdict {
    /// The response part of [`Verdict::review`] (always present).
    pub fn response(&self) -> Option<&AdmissionResponse> {
        self.review.response.as_ref()
    }
}

/// A request that is not a usable AdmissionReview (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Rejection {
    /// What the object was, as far as it could be read.
    pub kind: Kind,
    /// One precise line.
    pub message: String,
}

fn reject(kind: Kind, message: impl Into<String>) -> Rejection {
    let mut message = message.into();
    if message.chars().count() > MAX_REJECTION_CHARS {
        // The `…` counts: the message stays within the bound.
        message = message
            .chars()
            .take(MAX_REJECTION_CHARS - 1)
            .collect::<String>()
            + "…";
    }
    Rejection { kind, message }
}

/// Judges reviews with a [`Validator`] and the cluster's DeviceClasses.
/// Shared by all connections (`Send + Sync`).
pub struct Reviewer {
    validator: Validator,
    classes: Arc<dyn ClassLookup + Send + Sync>,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewer")
            .field("driver", &self.validator.driver())
            .finish_non_exhaustive()
    }
}

impl Reviewer {
    /// A reviewer judging with `validator`, resolving class names through
    /// `classes`.
    pub fn new(validator: Validator, classes: Arc<dyn ClassLookup + Send + Sync>) -> Self {
        Reviewer { validator, classes }
    }

    /// The driver whose objects are judged.
    pub fn driver(&self) -> &str {
        self.validator.driver()
    }

    /// Reads an AdmissionReview from JSON and judges it.
    pub fn review_json(&self, body: &[u8]) -> Result<Verdict, Rejection> {
        // The type fields first, on their own: the full decode flattens them
        // and would lose the field name in its error.
        let head: head::Head = serde_json::from_slice(body)
            .map_err(|e| reject(Kind::Unknown, format!("malformed AdmissionReview: {e}")))?;
        let is = |v: &Option<serde_json::Value>, want: &str| {
            v.as_ref().and_then(serde_json::Value::as_str) == Some(want)
        };
        if !is(&head.api_version, META_API_VERSION_V1) || !is(&head.kind, META_KIND) {
            let show = |v: Option<serde_json::Value>| {
                v.map_or_else(|| "nothing".to_owned(), |v| v.to_string())
            };
            return Err(reject(
                Kind::Unknown,
                format!(
                    "expected apiVersion {META_API_VERSION_V1:?} kind {META_KIND:?}, got apiVersion \
                     {} kind {}",
                    show(head.api_version),
                    show(head.kind)
                ),
            ));
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let review: AdmissionReview<DynamicObject> = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." || path.is_empty() {
                    reject(Kind::Unknown, format!("malformed AdmissionReview: {inner}"))
                } else {
                    reject(
                        Kind::Unknown,
                        format!("malformed AdmissionReview at {path}: {inner}"),
                    )
                }
            })?;
        de.end()
            .map_err(|e| reject(Kind::Unknown, format!("malformed AdmissionReview: {e}")))?;
        self.review(review)
    }

    /// Judges a decoded AdmissionReview.
    pub fn review(&self, review: AdmissionReview<DynamicObject>) -> Result<Verdict, Rejection> {
        if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
            return Err(reject(
                Kind::Unknown,
                format!(
                    "expected apiVersion {META_API_VERSION_V1:?} kind {META_KIND:?}, got \
                     apiVersion {:?} kind {:?}",
                    review.types.api_version, review.types.kind
                ),
            ));
        }
        let request: AdmissionRequest<DynamicObject> = review
            .try_into()
            .map_err(|_| reject(Kind::Unknown, "AdmissionReview has no request"))?;
        let kind = Kind::of(&request.kind.group, &request.kind.kind);
        if request.uid.is_empty() {
            return Err(reject(kind, "request.uid is empty"));
        }
        let admit = |outcome| Verdict {
            kind,
            outcome,
            review: AdmissionResponse::from(&request).into_review(),
        };

        if matches!(request.operation, Operation::Delete | Operation::Connect)
            || request
                .sub_resource
                .as_deref()
                .is_some_and(|s| !s.is_empty())
        {
            return Ok(admit(Outcome::skipped));
        }
        if kind == Kind::Other {
            return Ok(admit(Outcome::not_ours));
        }
        let Some(object) = &request.object else {
            return Err(reject(
                kind,
                format!("request.object is missing for {:?}", request.operation),
            ));
        };
        if request.operation == Operation::Update
            && let Some(old) = &request.old_object
            && object.data.get("spec") == old.data.get("spec")
        {
            return Ok(admit(Outcome::skipped));
        }

        let mut json = serde_json::to_value(object)
            .map_err(|e| reject(kind, format!("request.object cannot be read: {e}")))?;
        let Some(map) = json.as_object_mut() else {
            return Err(reject(kind, "request.object is not a JSON object"));
        };
        // The API server always sends them; fill them in from request.kind
        // if a caller did not.
        if !map.contains_key("kind") {
            map.insert("kind".into(), request.kind.kind.clone().into());
        }
        if !map.contains_key("apiVersion") {
            let api_version = format!("{}/{}", request.kind.group, request.kind.version);
            map.insert("apiVersion".into(), api_version.into());
        }

        let report = self.validator.validate(&json, self.classes.as_ref());
        if !report.ours {
            return Ok(admit(Outcome::not_ours));
        }
        let mut response = AdmissionResponse::from(&request);
        let warnings = warning_lines(&report.warnings);
        if !warnings.is_empty() {
            response.warnings = Some(warnings);
        }
        let outcome = if report.is_ok() {
            if report.warnings.is_empty() {
                Outcome::allowed
            } else {
                Outcome::warned
            }
        } else {
            let name = if report.name.is_empty() {
                request.name.as_str()
            } else {
                report.name.as_str()
            };
            response.allowed = false;
            response.result = denial_status(&report, name, self.driver());
            Outcome::denied
        };
        tracing::debug!(
            uid = %request.uid,
            kind = ?kind,
            name = %report.name,
            namespace = request.namespace.as_deref().unwrap_or(""),
            dry_run = request.dry_run,
            result = ?outcome,
            errors = report.errors.len(),
            warnings = report.warnings.len(),
            "reviewed"
        );
        Ok(Verdict {
            kind,
            outcome,
            review: response.into_review(),
        })
    }
}

/// The `status` of a denial: 422 `Invalid`, every error listed in the
/// message (as far as [`MAX_MESSAGE_BYTES`] allows) and as a cause.
fn denial_status(report: &Report, name: &str, driver: &str) -> Status {
    let n = report.errors.len();
    let mut message = format!(
        "{} {name:?} is invalid for driver {driver} ({n} error{}):",
        report.kind,
        if n == 1 { "" } else { "s" }
    );
    let mut causes = Vec::new();
    for (listed, finding) in report.errors.iter().enumerate() {
        let entry = error_entry(finding);
        if message.len() + entry.len() > MAX_MESSAGE_BYTES {
            let _ = write!(message, "\n- … and {} more error(s) not shown", n - listed);
            break;
        }
        message.push_str(&entry);
        causes.push(StatusCause {
            reason: "FieldValueInvalid".to_owned(),
            message: match &finding.hint {
                Some(h) => format!("{} (hint: {h})", finding.message),
                None => finding.message.clone(),
            },
            field: finding.path.clone(),
        });
    }
    let mut status = Status::failure(&message, "Invalid").with_code(422);
    status.details = Some(StatusDetails {
        name: name.to_owned(),
        group: "resource.k8s.io".to_owned(),
        kind: report.kind.clone(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    });
    status
}

/// `\n- path: message` (continuation lines indented) and the hint.
fn error_entry(finding: &Finding) -> String {
    let mut entry = String::from("\n- ");
    if !finding.path.is_empty() {
        entry.push_str(&finding.path);
        entry.push_str(": ");
    }
    for (i, line) in finding.message.lines().enumerate() {
        if i > 0 {
            entry.push_str("\n  ");
        }
        entry.push_str(line);
    }
    if let Some(hint) = &finding.hint {
        entry.push_str("\n  hint: ");
        entry.push_str(&hint.lines().collect::<Vec<_>>().join(" "));
    }
    entry
}

/// One line per warning, each at most [`MAX_WARNING_CHARS`], together at
/// most [`MAX_WARNINGS_TOTAL_CHARS`]; what does not fit is counted in a
/// last line.
fn warning_lines(findings: &[Finding]) -> Vec<String> {
    const ROOM_FOR_TAIL: usize = 64;
    let mut out = Vec::new();
    let mut total = 0;
    for (i, finding) in findings.iter().enumerate() {
        let mut text = String::new();
        if !finding.path.is_empty() {
            text.push_str(&finding.path);
            text.push_str(": ");
        }
        text.push_str(finding.message.lines().next().unwrap_or_default());
        // The hint only if it fits whole: a cut hint would mislead.
        if let Some(hint) = &finding.hint {
            let with_hint = format!("{text} (hint: {})", hint.lines().next().unwrap_or_default());
            if one_line(&with_hint, usize::MAX).chars().count() <= MAX_WARNING_CHARS {
                text = with_hint;
            }
        }
        let line = one_line(&text, MAX_WARNING_CHARS);
        let chars = line.chars().count();
        if total + chars > MAX_WARNINGS_TOTAL_CHARS - ROOM_FOR_TAIL {
            out.push(format!(
                "… and {} more warning(s) not shown",
                findings.len() - i
            ));
            break;
        }
        total += chars;
        out.push(line);
    }
    out
}

/// `text` with control characters and whitespace runs turned into single
/// spaces, cut to `max` characters (the last one then an ellipsis).
fn one_line(text: &str, max: usize) -> String {
    let mut joined = String::with_capacity(text.len());
    for word in text
        .split(|c: char| c.is_control() || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        if !joined.is_empty() {
            joined.push(' ');
        }
        joined.push_str(word);
    }
    if joined.chars().count() <= max {
        return joined;
    }
    let mut cut: String = joined.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

mod head;

#[cfg(test)]
mod tests;
