//! Object metadata helpers: RFC 3339 timestamps, random UIDs, `generateName` suffixes, and
//! typed access to `metadata` fields of JSON objects.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// Characters `generateName` suffixes are drawn from (no vowels, no confusable digits).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Length of the random suffix appended to `generateName`.
pub(crate) const GENERATED_SUFFIX_LEN: usize = 5;

/// A fresh pseudo-random 64-bit value (SipHash of a counter and the clock under a random key;
/// good enough for UIDs and names in a test server, not for cryptography).
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    hasher.finish()
}

/// A random RFC 4122 version 4 UID in normalized lowercase form.
pub(crate) fn new_uid() -> String {
    let hi = random_u64();
    let lo = random_u64();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = to_hex(&bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Lowercase hexadecimal encoding.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// A random `generateName` suffix.
pub(crate) fn random_suffix() -> String {
    let mut value = random_u64();
    let base = NAME_ALPHABET.len() as u64;
    (0..GENERATED_SUFFIX_LEN)
        .map(|_| {
            let c = NAME_ALPHABET[(value % base) as usize];
            value /= base;
            c as char
        })
        .collect()
}

/// The current time as RFC 3339 with second precision (`2026-01-02T03:04:05Z`), the format of
/// `metav1.Time`.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_rfc3339(secs)
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC.
pub(crate) fn format_rfc3339(secs: u64) -> String {
    let ts = i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `metadata` of an object, if it is a JSON object.
pub(crate) fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// `metadata` of an object, created if missing or not an object.
pub(crate) fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let map = obj.as_object_mut().expect("object ensured above");
    let entry = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut().expect("object ensured above")
}

/// A string field of `metadata` (`""` when absent or not a string).
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    metadata(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.name`.
pub(crate) fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}

/// `metadata.namespace`.
pub(crate) fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}

/// `metadata.resourceVersion`.
pub(crate) fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}

/// `metadata.uid`.
pub(crate) fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

/// Sets a string field of `metadata`.
pub(crate) fn set_meta_str(obj: &mut Value, field: &str, value: &str) {
    metadata_mut(obj).insert(field.to_owned(), Value::String(value.to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_normalized_v4_and_distinct() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!("89ab".contains(&a[19..20]));
        assert!(
            a.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
    }

    #[test]
    fn suffixes_use_the_alphabet() {
        let s = random_suffix();
        assert_eq!(s.len(), GENERATED_SUFFIX_LEN);
        assert!(s.bytes().all(|c| NAME_ALPHABET.contains(&c)));
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_767_323_045), "2026-01-02T03:04:05Z");
    }

    #[test]
    fn metadata_accessors() {
        let mut obj = serde_json::json!({"metadata": {"name": "a", "namespace": 5}});
        assert_eq!(name(&obj), "a");
        assert_eq!(namespace(&obj), "");
        set_meta_str(&mut obj, "uid", "u");
        assert_eq!(uid(&obj), "u");
        let mut bare = serde_json::json!("x");
        set_meta_str(&mut bare, "name", "b");
        assert_eq!(name(&bare), "b");
    }
}
