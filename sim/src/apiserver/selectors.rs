//! Field selectors (`spec.nodeName=node-a,spec.driver!=x`) and label selectors (`a=b`, `a!=b`,
//! `a`, `!a`, `a in (x,y)`, `a notin (x)`) as the API server parses and applies them.

use serde_json::Value;

use super::resources::Resource;
use super::status::ApiError;

/// Equality or inequality.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    NotEq,
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, Op, String)>,
}

impl FieldSelector {
    /// Parses a field selector for `resource`; unknown fields are rejected like the real server
    /// does (`field label not supported: ...`).
    pub fn parse(resource: Resource, selector: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_unescaped(selector, ',') {
            if term.trim().is_empty() {
                continue;
            }
            let (field, op, value) = if let Some(i) = find_unescaped(&term, "!=") {
                (&term[..i], Op::NotEq, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "==") {
                (&term[..i], Op::Eq, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "=") {
                (&term[..i], Op::Eq, &term[i + 1..])
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{selector}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || (field == "metadata.namespace" && resource.info().namespaced)
                || resource.info().field_selectors.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_owned(), op, unescape(value)));
        }
        Ok(Self { terms })
    }

    /// Whether the object matches every term. A missing field compares as `""`.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, op, want)| {
            let mut current = obj;
            for part in field.split('.') {
                current = current.get(part).unwrap_or(&Value::Null);
            }
            let have = match current {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                Value::Bool(b) => b.to_string(),
                other => other.to_string(),
            };
            (have == *want) == (*op == Op::Eq)
        })
    }
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

impl LabelSelector {
    /// Parses a label selector.
    pub fn parse(selector: &str) -> Result<Self, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {why} (selector \"{selector}\")"
            ))
        };
        let mut reqs = Vec::new();
        for term in split_outside_parens(selector) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                LabelReq::NotExists(check_key(key.trim()).map_err(|e| bad(&e))?)
            } else if let Some((key, rest)) = split_set_op(term, " notin ") {
                LabelReq::NotIn(
                    check_key(key).map_err(|e| bad(&e))?,
                    parse_values(rest).map_err(|e| bad(&e))?,
                )
            } else if let Some((key, rest)) = split_set_op(term, " in ") {
                LabelReq::In(
                    check_key(key).map_err(|e| bad(&e))?,
                    parse_values(rest).map_err(|e| bad(&e))?,
                )
            } else if let Some((key, value)) = term.split_once("!=") {
                LabelReq::NotEq(
                    check_key(key.trim()).map_err(|e| bad(&e))?,
                    check_value(value.trim()).map_err(|e| bad(&e))?,
                )
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                LabelReq::Eq(
                    check_key(key.trim()).map_err(|e| bad(&e))?,
                    check_value(value.trim()).map_err(|e| bad(&e))?,
                )
            } else {
                LabelReq::Exists(check_key(term).map_err(|e| bad(&e))?)
            };
            reqs.push(req);
        }
        Ok(Self { reqs })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|have| vs.iter().any(|v| v == have)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|have| vs.iter().all(|v| v != have)),
        })
    }
}

/// Field and label selectors of a list, watch or deletecollection request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `labelSelector`.
    pub labels: LabelSelector,
}

impl Selectors {
    /// Whether the object matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.fields.matches(obj) && self.labels.matches(obj)
    }
}

fn check_key(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(format!("invalid label key \"{key}\""))
    }
}

fn check_value(value: &str) -> Result<String, String> {
    let valid = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!("invalid label value: \"{value}\""))
    }
}

fn split_set_op<'a>(term: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let i = term.find(op)?;
    Some((term[..i].trim(), term[i + op.len()..].trim()))
}

fn parse_values(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised value list, found \"{rest}\""))?;
    inner
        .split(',')
        .map(|v| check_value(v.trim()))
        .collect::<Result<Vec<_>, _>>()
}

fn split_outside_parens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out
}

/// Splits on `sep` not preceded by a backslash (field selector values may escape `,` and `=`).
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            current.push(c);
            escaped = false;
        } else if c == '\\' {
            current.push(c);
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    out.push(current);
    out
}

fn find_unescaped(s: &str, pat: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i..].starts_with(pat.as_bytes()) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, driver: &str) -> Value {
        json!({"metadata": {"name": "s", "labels": {"app": "gpu", "tier": "a"}},
               "spec": {"nodeName": node, "driver": driver, "pool": {"name": "p1"}}})
    }

    #[test]
    fn field_selector_terms() {
        let sel = FieldSelector::parse(
            Resource::ResourceSlices,
            "spec.nodeName=node-a,spec.driver!=other.example.com",
        )
        .unwrap();
        assert!(sel.matches(&slice("node-a", "gpu.nvidia.com")));
        assert!(!sel.matches(&slice("node-b", "gpu.nvidia.com")));
        assert!(!sel.matches(&slice("node-a", "other.example.com")));
        let pool = FieldSelector::parse(Resource::ResourceSlices, "spec.pool.name==p1").unwrap();
        assert!(pool.matches(&slice("x", "y")));
        let missing = FieldSelector::parse(Resource::ResourceSlices, "spec.nodeName=").unwrap();
        assert!(missing.matches(&json!({"spec": {"allNodes": true}})));
    }

    #[test]
    fn field_selector_rejects_unknown_fields_and_garbage() {
        let err = FieldSelector::parse(Resource::ResourceSlices, "spec.foo=x").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "field label not supported: spec.foo");
        let err = FieldSelector::parse(Resource::ResourceSlices, "spec.nodeName").unwrap_err();
        assert!(err.message.contains("can't understand"), "{}", err.message);
        assert!(FieldSelector::parse(Resource::DeviceClasses, "metadata.namespace=x").is_err());
        assert!(FieldSelector::parse(Resource::ResourceClaims, "metadata.namespace=x").is_ok());
    }

    #[test]
    fn non_ascii_input_is_an_error_not_a_panic() {
        // A backslash before a multi-byte character used to make the scanner slice mid-char.
        for sel in [
            "m\u{e9}tadata.name=\u{e9}",
            "metadata.name=\\\u{e9}=x",
            "metadata.name\u{2260}x",
            "\u{e9}\\",
        ] {
            let _ = FieldSelector::parse(Resource::Nodes, sel);
            let _ = LabelSelector::parse(sel);
        }
        let sel = FieldSelector::parse(Resource::Nodes, "metadata.name=\u{e9}t\u{e9}").unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "\u{e9}t\u{e9}"}})));
        assert!(FieldSelector::parse(Resource::Nodes, "\u{e9}=x").is_err());
        assert!(LabelSelector::parse("\u{e9}=x").is_err());
    }

    #[test]
    fn field_selector_escapes() {
        let sel = FieldSelector::parse(Resource::Nodes, r"metadata.name=a\,b").unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "a,b"}})));
    }

    #[test]
    fn label_selector_forms() {
        let obj = slice("n", "d");
        for (sel, want) in [
            ("app=gpu", true),
            ("app==gpu", true),
            ("app!=gpu", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("tier in (a, b)", true),
            ("tier notin (a)", false),
            ("missing notin (a)", true),
            ("app=gpu,tier=b", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn label_selector_rejects_malformed() {
        for sel in ["a=b c", "tier in a,b", "=x", "a in (b", "k=\u{1F600}"] {
            let err = LabelSelector::parse(sel).unwrap_err();
            assert_eq!(err.code, 400, "{sel}");
        }
    }
}
