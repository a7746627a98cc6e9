//! `events.k8s.io/v1` Event validation: the strict rules the API server applies to events written
//! through the `events.k8s.io` API (required `eventTime`, reporting fields and reason, a 1 KiB
//! note, `Normal`/`Warning` types, unset deprecated fields) and the fields an update may not
//! change (everything but the `series`).

use serde_json::{Map, Value};

use super::names;
use super::{Errors, Path};

/// Longest `note` (bytes).
pub(crate) const NOTE_MAX: usize = 1024;
/// Longest `action`, `reason` and `reportingInstance`.
const SHORT_MAX: usize = 128;
/// Fields an update must leave as they are, with the names the real server's errors give them
/// (it validates the core Event these convert to: `note` is `message`, `regarding` is
/// `involvedObject`, ...).
const IMMUTABLE: [(&str, &str); 11] = [
    ("regarding", "involvedObject"),
    ("reason", "reason"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("action", "action"),
    ("related", "related"),
    ("reportingController", "reportingController"),
    ("type", "type"),
];

/// Whether `s` is an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, optional fraction, `Z` or a
/// `+hh:mm` offset), the format of `metav1.Time` and `metav1.MicroTime`.
pub(crate) fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range.clone())
            .is_some_and(|d| d.len() == range.len() && d.iter().all(u8::is_ascii_digit))
    };
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return false;
    }
    let num = |range: std::ops::Range<usize>| s[range].parse::<u32>().unwrap_or(u32::MAX);
    if !(1..=12).contains(&num(5..7))
        || !(1..=31).contains(&num(8..10))
        || num(11..13) > 23
        || num(14..16) > 59
        || num(17..19) > 60
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 || len > 9 {
            return false;
        }
        rest = &fraction[len..];
    }
    match rest.as_bytes() {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit())
                && (u32::from(*h1 - b'0') * 10 + u32::from(*h2 - b'0')) <= 23
                && (u32::from(*m1 - b'0') * 10 + u32::from(*m2 - b'0')) <= 59
        }
        _ => false,
    }
}

/// A timestamp field: absent is fine, a non-string or unparsable value is a decode error (400).
pub(crate) fn timestamp<'v>(
    errs: &mut Errors,
    parent: &'v Map<String, Value>,
    name: &str,
    path: &Path,
) -> Option<&'v str> {
    let value = errs.string(parent, name, path)?;
    if is_rfc3339(value) {
        Some(value)
    } else {
        errs.decode.push(format!(
            "{}: parsing time {value:?} as \"2006-01-02T15:04:05.000000Z07:00\": cannot parse",
            path.child(name)
        ));
        None
    }
}

/// Validates an Event; `old` is the stored object on update.
pub(super) fn validate(
    errs: &mut Errors,
    obj: &Map<String, Value>,
    namespace: &str,
    old: Option<&Value>,
) {
    let root = Path::root("");
    let event_time = timestamp(errs, obj, "eventTime", &root);
    if let Some(old) = old.and_then(Value::as_object) {
        for (field, name) in IMMUTABLE {
            let new_value = obj.get(field).unwrap_or(&Value::Null);
            let old_value = old.get(field).unwrap_or(&Value::Null);
            if new_value != old_value {
                errs.invalid(&Path::root(name), new_value, "field is immutable");
            }
        }
        if obj.get("series") != old.get("series") {
            validate_series(errs, obj);
        }
        return;
    }
    // The core Event's rules first (for an Event without eventTime only its namespace).
    let regarding_ns = errs
        .object(obj, "regarding", &root)
        .and_then(|r| errs.string(r, "namespace", &Path::root("regarding")))
        .unwrap_or("");
    let involved_ns = Path::root("involvedObject").child("namespace");
    if event_time.is_none() {
        let mismatch = if regarding_ns.is_empty() {
            !namespace.is_empty() && namespace != "default"
        } else {
            regarding_ns != namespace
        };
        if mismatch {
            errs.invalid_str(&involved_ns, regarding_ns, "does not match event.namespace");
        }
    } else {
        if regarding_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
            errs.invalid_str(&involved_ns, regarding_ns, "does not match event.namespace");
        }
        let controller = errs.string(obj, "reportingController", &root).unwrap_or("");
        let cpath = Path::root("reportingController");
        if controller.is_empty() {
            errs.required(&cpath, "");
        }
        errs.invalid_each(&cpath, controller, names::qualified_name(controller));
        for field in ["reportingInstance", "action", "reason"] {
            match errs.string(obj, field, &root) {
                None | Some("") => errs.required(&Path::root(field), ""),
                Some(value) if value.len() > SHORT_MAX => errs.invalid_str(
                    &Path::root(field),
                    "",
                    &format!("can have at most {SHORT_MAX} characters"),
                ),
                Some(_) => {}
            }
        }
        if errs
            .string(obj, "note", &root)
            .is_some_and(|note| note.len() > NOTE_MAX)
        {
            errs.invalid_str(
                &Path::root("message"),
                "",
                &format!("can have at most {NOTE_MAX} characters"),
            );
        }
    }
    // Then those of events.k8s.io.
    if event_time.is_none() {
        errs.required(&Path::root("eventTime"), "");
    }
    match errs.string(obj, "type", &root) {
        Some("Normal" | "Warning") => {}
        other => errs.invalid_str(
            &Path::root("type"),
            "",
            &format!("has invalid value: {}", other.unwrap_or("")),
        ),
    }
    let _ = timestamp(errs, obj, "deprecatedFirstTimestamp", &root);
    let _ = timestamp(errs, obj, "deprecatedLastTimestamp", &root);
    for (field, name) in [
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
        ("deprecatedSource", "source"),
    ] {
        let set = match obj.get(field) {
            None | Some(Value::Null) => false,
            Some(Value::Number(n)) => n.as_i64() != Some(0),
            Some(Value::Object(m)) => m.values().any(|v| !v.is_null() && v != ""),
            Some(_) => true,
        };
        if set {
            errs.invalid_str(&Path::root(name), "", "needs to be unset");
        }
    }
    validate_series(errs, obj);
}

fn validate_series(errs: &mut Errors, obj: &Map<String, Value>) {
    let root = Path::root("");
    let Some(series) = errs.object(obj, "series", &root) else {
        return;
    };
    let path = Path::root("series");
    if errs
        .int(series, "count", &path)
        .is_none_or(|count| count < 2)
    {
        errs.invalid_str(&path.child("count"), "", "should be at least 2");
    }
    if timestamp(errs, series, "lastObservedTime", &path).is_none() {
        errs.required(&path.child("lastObservedTime"), "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::Resource;
    use serde_json::json;

    fn event() -> Value {
        json!({
            "metadata": {"name": "c.1", "namespace": "team-a"},
            "eventTime": "2026-01-02T03:04:05.123456Z",
            "type": "Warning",
            "reason": "Unallocatable",
            "action": "Allocate",
            "note": "no node fits",
            "reportingController": "gpu.nvidia.com/controller",
            "reportingInstance": "controller-0",
            "regarding": {"kind": "ResourceClaim", "namespace": "team-a", "name": "c"}
        })
    }

    fn errors(obj: &Value, old: Option<&Value>) -> Vec<String> {
        let mut errs = Errors::new(Resource::Events);
        validate(&mut errs, obj.as_object().unwrap(), "team-a", old);
        errs.fields
            .iter()
            .map(ToString::to_string)
            .chain(errs.decode.iter().cloned())
            .collect()
    }

    #[test]
    fn timestamps() {
        for good in [
            "2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.123456Z",
            "2026-12-31T23:59:59.999999999+02:00",
            "2026-01-02t03:04:05-07:30",
        ] {
            assert!(is_rfc3339(good), "{good}");
        }
        for bad in [
            "",
            "2026-01-02",
            "2026-13-02T03:04:05Z",
            "2026-01-02T24:04:05Z",
            "2026-01-02T03:04:05",
            "2026-01-02T03:04:05.Z",
            "2026-01-02T03:04:05.1234567890Z",
            "2026-01-02T03:04:05+2:00",
            "2026-01-02T03:04:05Zjunk",
            "２０２６-01-02T03:04:05Z",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }

    #[test]
    fn a_complete_event_is_valid() {
        assert_eq!(errors(&event(), None), Vec::<String>::new());
    }

    #[test]
    fn required_fields_and_limits() {
        let mut bad = event();
        let map = bad.as_object_mut().unwrap();
        map.remove("reason");
        map.insert("type".into(), json!("Error"));
        map.insert("action".into(), json!("x".repeat(129)));
        map.insert("note".into(), json!("n".repeat(NOTE_MAX + 1)));
        map.insert("reportingController".into(), json!("not a name"));
        map.insert("deprecatedCount".into(), json!(3));
        map.insert("regarding".into(), json!({"kind": "Node", "name": "n"}));
        let errs = errors(&bad, None).join("\n");
        for want in [
            "type: Invalid value: \"\": has invalid value: Error",
            "reason: Required value",
            "action: Invalid value: \"\": can have at most 128 characters",
            "message: Invalid value: \"\": can have at most 1024 characters",
            "reportingController: Invalid value: \"not a name\"",
            "count: Invalid value: \"\": needs to be unset",
            "involvedObject.namespace: Invalid value: \"\": does not match event.namespace",
        ] {
            assert!(errs.contains(want), "missing {want:?} in\n{errs}");
        }
    }

    #[test]
    fn an_event_without_time_gets_only_the_legacy_checks() {
        let mut bad = event();
        let map = bad.as_object_mut().unwrap();
        map.remove("eventTime");
        map.remove("reportingController");
        map.remove("action");
        map.insert(
            "regarding".into(),
            json!({"kind": "Node", "namespace": "other"}),
        );
        assert_eq!(
            errors(&bad, None),
            [
                "involvedObject.namespace: Invalid value: \"other\": does not match event.namespace",
                "eventTime: Required value",
            ]
        );
        let mut no_controller = event();
        no_controller
            .as_object_mut()
            .unwrap()
            .remove("reportingController");
        let errs = errors(&no_controller, None);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert_eq!(errs[0], "reportingController: Required value");
    }

    #[test]
    fn malformed_times_and_series_are_rejected() {
        let mut bad = event();
        bad["eventTime"] = json!("yesterday");
        let errs = errors(&bad, None).join("\n");
        assert!(
            errs.contains("eventTime: parsing time \"yesterday\""),
            "{errs}"
        );
        let mut series = event();
        series["series"] = json!({"count": 1});
        let errs = errors(&series, None).join("\n");
        assert!(errs.contains("series.count: Invalid value: \"\": should be at least 2"));
        assert!(errs.contains("series.lastObservedTime: Required value"));
    }

    #[test]
    fn updates_may_change_only_the_series() {
        let old = event();
        let mut new = old.clone();
        new["series"] = json!({"count": 2, "lastObservedTime": "2026-01-02T03:05:05.000000Z"});
        assert_eq!(errors(&new, Some(&old)), Vec::<String>::new());
        new["note"] = json!("something else");
        assert_eq!(
            errors(&new, Some(&old)),
            ["message: Invalid value: \"something else\": field is immutable"]
        );
    }
}
