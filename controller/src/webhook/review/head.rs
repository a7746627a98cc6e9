//! The type fields of an AdmissionReview, read in a first pass before the
//! full decode, with every other field skipped within serde_json's
//! recursion limit (128 levels).
//!
//! Hand-written instead of a derived struct: a derived one skips unknown
//! fields through `IgnoredAny`, which serde_json walks without any depth
//! limit, reading the whole body (up to the server's body limit) before a
//! 100,000-deep `request` is refused. Skipping through `deserialize_any`
//! puts the limit back, so a deep body is refused at its 129th level.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// `apiVersion` and `kind`, whatever their JSON type.
pub(super) struct Head {
    /// `apiVersion`, if present.
    pub(super) api_version: Option<Value>,
    /// `kind`, if present.
    pub(super) kind: Option<Value>,
}

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Head, D::Error> {
        d.deserialize_map(HeadVisitor)
    }
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Head;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct AdmissionReview")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
        let mut head = Head {
            api_version: None,
            kind: None,
        };
        while let Some(key) = map.next_key::<String>()? {
            let (slot, name) = match key.as_str() {
                "apiVersion" => (&mut head.api_version, "apiVersion"),
                "kind" => (&mut head.kind, "kind"),
                _ => {
                    map.next_value::<Skip>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::duplicate_field(name));
            }
            *slot = Some(map.next_value()?);
        }
        Ok(head)
    }
}

/// Any JSON value, read and dropped through `deserialize_any`.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}
