//! The node budget: deserialization seeds that count every node the
//! deserializer hands out, aliases replayed included, and fail once the
//! count passes the budget. This bounds what a "billion laughs" document
//! (anchors of aliases of aliases) may expand to, in time and in memory:
//! `yaml_serde`'s own guard allows a hundred alias jumps per event of the
//! document, each of which may replay a large anchor.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Nodes left to hand out, shared by the seeds of one document.
pub(crate) struct Budget {
    left: Cell<usize>,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Budget {
            left: Cell::new(limit),
            limit,
        }
    }

    /// Counts one node.
    fn take<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "the document expands to more than {} nodes (aliases expanded)",
                self.limit
            ))),
        }
    }
}

/// Builds a [`serde_json::Value`] as `Value`'s own `Deserialize` does
/// (string keys, non-finite floats as null), counting nodes.
pub(crate) struct ToValue<'b>(pub(crate) &'b Budget);

impl<'de> DeserializeSeed<'de> for ToValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ToValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.take()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.0.take()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.take()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(ToValue(self.0))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.take()?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(Key)? {
            self.0.take()?;
            let value = map.next_value_seed(ToValue(self.0))?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A mapping key: a string, as `Value` wants it.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}

/// Walks a document without keeping anything, counting nodes: the check
/// before a typed deserialization, which has no seed to count with.
pub(crate) struct Count<'b>(pub(crate) &'b Budget);

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.0.take()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.0.take()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.0.take()
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.0.take()
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.0.take()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.0.take()
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.0.take()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.take()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.take()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.take()?;
        while seq.next_element_seed(Count(self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.take()?;
        while map.next_key_seed(Count(self.0))?.is_some() {
            map.next_value_seed(Count(self.0))?;
        }
        Ok(())
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use de::VariantAccess as _;
        self.0.take()?;
        let (IgnoredAny, variant) = data.variant::<IgnoredAny>()?;
        variant.newtype_variant_seed(Count(self.0))
    }
}
