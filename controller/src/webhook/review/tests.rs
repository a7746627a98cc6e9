use gpu_dra_analysis::validate::StaticClasses;
use serde_json::{Value, json};

use super::*;

fn reviewer() -> Reviewer {
    Reviewer::new(
        Validator::new("gpu.nvidia.com"),
        Arc::new(StaticClasses::default()),
    )
}

fn finding(path: &str, message: &str, hint: Option<&str>) -> Finding {
    Finding {
        path: path.to_owned(),
        message: message.to_owned(),
        hint: hint.map(str::to_owned),
    }
}

fn review_of(kind: &str, operation: &str, object: Option<Value>, old: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "things"},
            "name": "x",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

fn run(review: &Value) -> Result<Verdict, Rejection> {
    reviewer().review_json(serde_json::to_string(review).unwrap().as_bytes())
}

#[test]
fn malformed_reviews_are_rejections_with_a_path() {
    let mut wrong_uid = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    wrong_uid["request"]["uid"] = json!(42);
    let mut wrong_op = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    wrong_op["request"]["operation"] = json!("EXPLODE");
    let mut no_user = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    no_user["request"]
        .as_object_mut()
        .unwrap()
        .remove("userInfo");
    let mut old_version = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    old_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut empty_uid = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    empty_uid["request"]["uid"] = json!("");
    let no_object = review_of("DeviceClass", "CREATE", None, None);

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "malformed AdmissionReview"),
        (b"{".to_vec(), "malformed AdmissionReview"),
        (b"[]".to_vec(), "malformed AdmissionReview"),
        (b"null".to_vec(), "malformed AdmissionReview"),
        (
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"} x".to_vec(),
            "trailing",
        ),
        (
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}".to_vec(),
            "has no request",
        ),
        (serde_json::to_vec(&wrong_uid).unwrap(), "request.uid"),
        (serde_json::to_vec(&wrong_op).unwrap(), "request.operation"),
        (serde_json::to_vec(&no_user).unwrap(), "userInfo"),
        (
            serde_json::to_vec(&old_version).unwrap(),
            "admission.k8s.io/v1beta1",
        ),
        (
            serde_json::to_vec(&empty_uid).unwrap(),
            "request.uid is empty",
        ),
        (
            serde_json::to_vec(&no_object).unwrap(),
            "request.object is missing",
        ),
    ];
    for (body, needle) in cases {
        let err = reviewer().review_json(&body).unwrap_err();
        assert!(
            err.message.contains(needle),
            "{}: {}",
            String::from_utf8_lossy(&body),
            err.message
        );
        assert!(!err.message.contains('\n'), "{}", err.message);
    }
}

#[test]
fn deeply_nested_objects_are_rejected_not_overflowing_the_stack() {
    let depth = 100_000;
    let nested = "[".repeat(depth) + &"]".repeat(depth);
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u",
        "kind":{{"group":"resource.k8s.io","version":"v1","kind":"DeviceClass"}},
        "resource":{{"group":"resource.k8s.io","version":"v1","resource":"deviceclasses"}},
        "operation":"CREATE","userInfo":{{}},"object":{{"spec":{nested}}}}}}}"#
    );
    let err = reviewer().review_json(body.as_bytes()).unwrap_err();
    assert!(err.message.contains("recursion limit"), "{}", err.message);
}

#[test]
fn rejection_messages_are_bounded_even_for_huge_offending_values() {
    let mut review = review_of("DeviceClass", "CREATE", Some(json!({})), None);
    review["request"]["operation"] = json!("X".repeat(100_000));
    let err = run(&review).unwrap_err();
    // Cut to the bound exactly, the `…` included (fuzz finding: it was
    // one over).
    assert_eq!(err.message.chars().count(), MAX_REJECTION_CHARS);
    assert!(err.message.ends_with("XXX…"), "{}", err.message);
}

#[test]
fn delete_connect_subresources_and_other_kinds_are_admitted_untouched() {
    let obj = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"}});
    let mut status = review_of(
        "ResourceClaim",
        "UPDATE",
        Some(obj.clone()),
        Some(obj.clone()),
    );
    status["request"]["subResource"] = json!("status");
    let pod = review_of("Pod", "CREATE", Some(json!({"kind": "Pod"})), None);
    let mut core_pod = pod.clone();
    core_pod["request"]["kind"]["group"] = json!("");
    for (review, outcome) in [
        (
            review_of("DeviceClass", "DELETE", None, Some(obj.clone())),
            Outcome::skipped,
        ),
        (
            review_of("DeviceClass", "CONNECT", None, None),
            Outcome::skipped,
        ),
        (status, Outcome::skipped),
        (pod, Outcome::not_ours),
        (core_pod, Outcome::not_ours),
    ] {
        let verdict = run(&review).unwrap();
        assert_eq!(verdict.outcome, outcome, "{review}");
        let response = verdict.response().unwrap();
        assert!(response.allowed);
        assert_eq!(response.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(response.warnings.is_none());
    }
}

#[test]
fn an_update_that_leaves_the_spec_alone_is_admitted_without_judging() {
    // Whatever the rules say about this spec, removing a finalizer from a
    // stored object must never be blocked.
    let old = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "x", "finalizers": ["f"]},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' &&"}}]}
    });
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!([]);
    let verdict = run(&review_of("DeviceClass", "UPDATE", Some(new), Some(old))).unwrap();
    assert_eq!(verdict.outcome, Outcome::skipped);
    assert!(verdict.response().unwrap().allowed);
}

#[test]
fn the_response_is_a_v1_review_echoing_the_uid() {
    let verdict = run(&review_of("Pod", "CREATE", Some(json!({})), None)).unwrap();
    let out = serde_json::to_value(&verdict.review).unwrap();
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(
        out["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(out["response"]["allowed"], true);
    assert!(out.get("request").is_none());
}

#[test]
fn a_denial_lists_every_error_with_path_and_hint_as_422_invalid() {
    let report = Report {
        ours: true,
        kind: "ResourceClaim".to_owned(),
        name: "c".to_owned(),
        errors: vec![
            finding(
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
                "unknown attribute productname\ndevice.attributes[\"gpu.nvidia.com\"].productname\n        ^",
                Some("productName"),
            ),
            finding(
                "spec.devices.config[0].opaque.parameters",
                "unknown field `sharng`",
                None,
            ),
        ],
        warnings: vec![],
    };
    let status = denial_status(&report, "c", "gpu.nvidia.com");
    assert_eq!(status.code, 422);
    assert_eq!(status.reason, "Invalid");
    assert!(status.is_failure());
    let m = &status.message;
    assert!(
        m.starts_with("ResourceClaim \"c\" is invalid for driver gpu.nvidia.com (2 errors):"),
        "{m}"
    );
    assert!(
        m.contains("\n- spec.devices.requests[0].exactly.selectors[0].cel.expression: unknown attribute productname\n  device.attributes"),
        "{m}"
    );
    assert!(m.contains("\n  hint: productName"), "{m}");
    assert!(
        m.contains("\n- spec.devices.config[0].opaque.parameters: unknown field `sharng`"),
        "{m}"
    );
    let details = status.details.unwrap();
    assert_eq!(details.kind, "ResourceClaim");
    assert_eq!(details.group, "resource.k8s.io");
    assert_eq!(details.causes.len(), 2);
    assert_eq!(
        details.causes[1].field,
        "spec.devices.config[0].opaque.parameters"
    );
    assert!(details.causes[0].message.ends_with("(hint: productName)"));
}

#[test]
fn a_denial_with_thousands_of_errors_stays_bounded_and_counts_the_rest() {
    let errors: Vec<Finding> = (0..5000)
        .map(|i| {
            finding(
                &format!("spec.selectors[{i}].cel.expression"),
                &"bad ".repeat(20),
                None,
            )
        })
        .collect();
    let report = Report {
        ours: true,
        kind: "DeviceClass".to_owned(),
        name: "d".to_owned(),
        errors,
        warnings: vec![],
    };
    let status = denial_status(&report, "d", "gpu.nvidia.com");
    assert!(status.message.len() <= MAX_MESSAGE_BYTES + 100);
    assert!(status.message.contains("(5000 errors)"));
    let shown = status.details.as_ref().unwrap().causes.len();
    assert!(shown > 10 && shown < 5000);
    assert!(
        status
            .message
            .ends_with(&format!("… and {} more error(s) not shown", 5000 - shown)),
        "{}",
        &status.message[status.message.len() - 100..]
    );
}

#[test]
fn warnings_are_single_lines_within_the_api_server_limits() {
    let mut findings = vec![
        finding(
            "spec.selectors[0].cel.expression",
            "always true\nsnippet\n ^",
            Some("drop it"),
        ),
        finding("", "tab\there\u{7}bell", None),
        finding("p", &"é".repeat(1000), None),
        finding("q", &"m".repeat(200), Some(&"h".repeat(100))),
    ];
    let lines = warning_lines(&findings);
    assert_eq!(
        lines[3],
        format!("q: {}", "m".repeat(200)),
        "a hint that does not fit is left out"
    );
    assert_eq!(
        lines[0],
        "spec.selectors[0].cel.expression: always true (hint: drop it)"
    );
    assert_eq!(lines[1], "tab here bell");
    assert_eq!(lines[2].chars().count(), MAX_WARNING_CHARS);
    assert!(lines[2].ends_with('…'));

    findings = (0..100)
        .map(|i| finding(&format!("spec.selectors[{i}]"), &"x".repeat(300), None))
        .collect();
    let lines = warning_lines(&findings);
    let total: usize = lines.iter().map(|l| l.chars().count()).sum();
    assert!(total <= MAX_WARNINGS_TOTAL_CHARS, "{total}");
    assert!(lines.iter().all(|l| l.chars().count() <= MAX_WARNING_CHARS));
    assert!(lines.iter().all(|l| !l.chars().any(char::is_control)));
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(&format!("… and {} more", 100 - (lines.len() - 1))),
        "{last}"
    );
}

/// A review whose `request` nests `n` levels deep, unterminated.
fn deep_review(open: &str, n: usize) -> Vec<u8> {
    format!(
        "{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{}",
        open.repeat(n)
    )
    .into_bytes()
}

#[test]
fn deep_bodies_are_refused_at_the_depth_limit_whatever_their_size() {
    // n, 2n, 4n, ... levels: refused at the same byte each time, the
    // recursion limit's, so what is read does not grow with the body.
    let prefix = deep_review("", 0).len();
    for (open, per) in [("[", 1), ("{\"a\":", 5)] {
        // Where serde_json stops: at the opener that would be the 129th
        // level, the review's own object being the first.
        let at = prefix + 126 * per + 1;
        for n in [20_000, 40_000, 80_000, 100_000, 200_000] {
            let err = reviewer().review_json(&deep_review(open, n)).unwrap_err();
            assert_eq!(
                err.message,
                format!(
                    "malformed AdmissionReview: recursion limit exceeded at line 1 column {at}"
                ),
                "{open} {n}"
            );
        }
    }
    // A duplicated type field is still refused by the first pass.
    let err = reviewer()
        .review_json(br#"{"kind":"AdmissionReview","kind":"AdmissionReview"}"#)
        .unwrap_err();
    assert!(
        err.message.contains("duplicate field `kind`"),
        "{}",
        err.message
    );
}
