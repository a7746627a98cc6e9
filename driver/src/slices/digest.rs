//! Compact digests of API objects, so the publisher can remember what it
//! published and wrote without keeping copies of the pool.
//!
//! A [`Digest`] is 128 bits (two SipHash-1-3 hashes under keys drawn at
//! random once per process, so nobody can aim a collision at them). It is
//! computed in one pass over the value's `serde` serialisation: no JSON text
//! and no `serde_json::Value` tree is built. The value is normalised on the
//! way, so that two values the API server would treat alike get the same
//! digest:
//! - quantities (`Quantity`) count by value, not spelling (`1Gi` equals
//!   `1073741824`);
//! - timestamps (`Time`: taint times the server sets) are left out;
//! - nulls, empty maps and empty lists are left out, recursively, so an
//!   absent field equals an empty one (a map or list whose entries are all
//!   left out counts as empty too; inside a list, a left-out element still
//!   holds its place);
//! - a struct hashes like a map with the same keys, as in JSON;
//! - fields named in [`Skip`] are left out (the pool generation, which the
//!   publisher compares on its own).
//!
//! Map entries are hashed in serialisation order: `k8s-openapi` types use
//! `BTreeMap`s, so equal maps serialise in the same order.

use std::hash::{BuildHasher, DefaultHasher, Hasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde::ser::{
    self, SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant, SerializeTuple,
    SerializeTupleStruct, SerializeTupleVariant,
};

/// A 128-bit digest of a normalised value. Only comparable with digests of
/// the same process.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(u128);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({:032x})", self.0)
    }
}

/// Struct fields to leave out: `(struct name, field name)` as the type's
/// `Serialize` implementation names them (`("ResourcePool", "generation")`).
pub type Skip = &'static [(&'static str, &'static str)];

/// The digest of `value`, normalised as the module documentation says. A
/// value that fails to serialise gets a digest unique in the process, so it
/// never equals anything.
pub fn of<T: Serialize + ?Sized>(value: &T, skip: Skip) -> Digest {
    match value.serialize(Normaliser { skip }) {
        Ok(Some(d)) => d,
        Ok(None) => Node::new(Tag::Empty).finish(),
        Err(_) => unique(),
    }
}

/// A digest that equals no other: for values that cannot be digested.
fn unique() -> Digest {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut node = Node::new(Tag::Unique);
    node.write(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    node.finish()
}

/// Type tags, so that values of different kinds never hash alike.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Tag {
    Empty,
    Unique,
    Bool,
    Int,
    BigUint,
    Float,
    Str,
    Quantity,
    Seq,
    Map,
}

/// The process-wide hash keys.
fn keys() -> &'static (RandomState, RandomState) {
    static KEYS: OnceLock<(RandomState, RandomState)> = OnceLock::new();
    KEYS.get_or_init(|| (RandomState::new(), RandomState::new()))
}

/// A value being hashed: two keyed hashers fed the same bytes.
struct Node(DefaultHasher, DefaultHasher);

impl Node {
    fn new(tag: Tag) -> Self {
        let (a, b) = keys();
        let mut node = Self(a.build_hasher(), b.build_hasher());
        node.write(&[tag as u8]);
        node
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
        self.1.write(bytes);
    }

    fn child(&mut self, d: Option<Digest>) {
        match d {
            Some(d) => self.write(&d.0.to_le_bytes()),
            None => self.write(&[Tag::Empty as u8]),
        }
    }

    fn finish(self) -> Digest {
        Digest((u128::from(self.0.finish()) << 64) | u128::from(self.1.finish()))
    }
}

fn leaf(tag: Tag, bytes: &[u8]) -> Digest {
    let mut node = Node::new(tag);
    node.write(&(bytes.len() as u64).to_le_bytes());
    node.write(bytes);
    node.finish()
}

fn int(v: i128) -> Digest {
    leaf(Tag::Int, &v.to_le_bytes())
}

fn text(v: &str) -> Digest {
    leaf(Tag::Str, v.as_bytes())
}

/// Why a value could not be digested.
#[derive(Debug)]
pub struct DigestError(String);

impl std::fmt::Display for DigestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DigestError {}

impl ser::Error for DigestError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// The serializer: its output is the digest of the normalised value, or
/// `None` when the value normalises to nothing (null, empty).
#[derive(Clone, Copy)]
struct Normaliser {
    skip: Skip,
}

type Out = Result<Option<Digest>, DigestError>;

impl ser::Serializer for Normaliser {
    type Ok = Option<Digest>;
    type Error = DigestError;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Variant<Seq>;
    type SerializeMap = Map;
    type SerializeStruct = Map;
    type SerializeStructVariant = Variant<Map>;

    fn serialize_bool(self, v: bool) -> Out {
        Ok(Some(leaf(Tag::Bool, &[u8::from(v)])))
    }
    fn serialize_i8(self, v: i8) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_i16(self, v: i16) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_i32(self, v: i32) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_i64(self, v: i64) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_i128(self, v: i128) -> Out {
        Ok(Some(int(v)))
    }
    fn serialize_u8(self, v: u8) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_u16(self, v: u16) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_u32(self, v: u32) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_u64(self, v: u64) -> Out {
        Ok(Some(int(v.into())))
    }
    fn serialize_u128(self, v: u128) -> Out {
        match i128::try_from(v) {
            Ok(v) => Ok(Some(int(v))),
            Err(_) => Ok(Some(leaf(Tag::BigUint, &v.to_le_bytes()))),
        }
    }
    fn serialize_f32(self, v: f32) -> Out {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Out {
        Ok(Some(leaf(Tag::Float, &v.to_bits().to_le_bytes())))
    }
    fn serialize_char(self, v: char) -> Out {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Out {
        Ok(Some(text(v)))
    }
    fn serialize_bytes(self, v: &[u8]) -> Out {
        // As JSON writes them: a list of numbers.
        let mut seq = Seq::new(self);
        for b in v {
            seq.push(b)?;
        }
        Ok(seq.finish())
    }
    fn serialize_none(self) -> Out {
        Ok(None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Out {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Out {
        Ok(None)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Out {
        Ok(None)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Out {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Out {
        match name {
            // Server-set timestamps.
            "Time" | "MicroTime" => Ok(None),
            "Quantity" => {
                let quantity = value.serialize(StrOnly)?;
                match crate::devices::k8s::quantity_nanos(&quantity) {
                    Some(nanos) => Ok(Some(leaf(Tag::Quantity, &nanos.to_le_bytes()))),
                    None => Ok(Some(text(&quantity))),
                }
            }
            _ => value.serialize(self),
        }
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Out {
        let mut map = Map::new(self, None);
        map.entry(variant, value.serialize(self)?);
        Ok(map.finish())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Seq, DigestError> {
        Ok(Seq::new(self))
    }
    fn serialize_tuple(self, _: usize) -> Result<Seq, DigestError> {
        Ok(Seq::new(self))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Seq, DigestError> {
        Ok(Seq::new(self))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<Seq>, DigestError> {
        Ok(Variant {
            name: variant,
            inner: Seq::new(self),
            ser: self,
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Map, DigestError> {
        Ok(Map::new(self, None))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Map, DigestError> {
        Ok(Map::new(self, Some(name)))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<Map>, DigestError> {
        Ok(Variant {
            name: variant,
            inner: Map::new(self, None),
            ser: self,
        })
    }
}

/// A list being hashed.
struct Seq {
    ser: Normaliser,
    node: Node,
    len: u64,
}

impl Seq {
    fn new(ser: Normaliser) -> Self {
        Self {
            ser,
            node: Node::new(Tag::Seq),
            len: 0,
        }
    }

    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        let d = value.serialize(self.ser)?;
        self.node.child(d);
        self.len += 1;
        Ok(())
    }

    fn finish(mut self) -> Option<Digest> {
        if self.len == 0 {
            return None;
        }
        self.node.write(&self.len.to_le_bytes());
        Some(self.node.finish())
    }
}

impl SerializeSeq for Seq {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        self.push(value)
    }
    fn end(self) -> Out {
        Ok(self.finish())
    }
}

impl SerializeTuple for Seq {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        self.push(value)
    }
    fn end(self) -> Out {
        Ok(self.finish())
    }
}

impl SerializeTupleStruct for Seq {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        self.push(value)
    }
    fn end(self) -> Out {
        Ok(self.finish())
    }
}

/// A map or struct being hashed.
struct Map {
    ser: Normaliser,
    /// The struct's name, for [`Skip`].
    name: Option<&'static str>,
    node: Node,
    entries: u64,
    /// The key of a map entry whose value comes next (an empty key, such
    /// as `()`, as the digest of nothing).
    key: Option<Digest>,
}

impl Map {
    fn new(ser: Normaliser, name: Option<&'static str>) -> Self {
        Self {
            ser,
            name,
            node: Node::new(Tag::Map),
            entries: 0,
            key: None,
        }
    }

    fn entry(&mut self, key: &str, value: Option<Digest>) {
        self.keyed_entry(text(key), value);
    }

    fn keyed_entry(&mut self, key: Digest, value: Option<Digest>) {
        if value.is_some() {
            self.node.child(Some(key));
            self.node.child(value);
            self.entries += 1;
        }
    }

    fn finish(mut self) -> Option<Digest> {
        if self.entries == 0 {
            return None;
        }
        self.node.write(&self.entries.to_le_bytes());
        Some(self.node.finish())
    }
}

impl SerializeMap for Map {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), DigestError> {
        let key = key.serialize(self.ser)?;
        self.key = Some(key.unwrap_or_else(|| Node::new(Tag::Empty).finish()));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| DigestError("map value without a key".to_owned()))?;
        let value = value.serialize(self.ser)?;
        self.keyed_entry(key, value);
        Ok(())
    }
    fn end(self) -> Out {
        Ok(self.finish())
    }
}

impl SerializeStruct for Map {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), DigestError> {
        if let Some(name) = self.name
            && self.ser.skip.contains(&(name, key))
        {
            return Ok(());
        }
        let value = value.serialize(self.ser)?;
        self.entry(key, value);
        Ok(())
    }
    fn end(self) -> Out {
        Ok(self.finish())
    }
}

/// An enum variant with content: hashed as `{variant: content}`, like JSON.
struct Variant<T> {
    name: &'static str,
    inner: T,
    ser: Normaliser,
}

impl<T> Variant<T> {
    fn wrap(variant: &'static str, ser: Normaliser, content: Option<Digest>) -> Option<Digest> {
        let mut map = Map::new(ser, None);
        map.entry(variant, content);
        map.finish()
    }
}

impl SerializeTupleVariant for Variant<Seq> {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), DigestError> {
        self.inner.push(value)
    }
    fn end(self) -> Out {
        Ok(Self::wrap(self.name, self.ser, self.inner.finish()))
    }
}

impl SerializeStructVariant for Variant<Map> {
    type Ok = Option<Digest>;
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), DigestError> {
        SerializeStruct::serialize_field(&mut self.inner, key, value)
    }
    fn end(self) -> Out {
        Ok(Self::wrap(self.name, self.ser, self.inner.finish()))
    }
}

/// A serializer that accepts only a string (the text inside a `Quantity`).
struct StrOnly;

impl ser::Serializer for StrOnly {
    type Ok = String;
    type Error = DigestError;
    type SerializeSeq = ser::Impossible<String, DigestError>;
    type SerializeTuple = ser::Impossible<String, DigestError>;
    type SerializeTupleStruct = ser::Impossible<String, DigestError>;
    type SerializeTupleVariant = ser::Impossible<String, DigestError>;
    type SerializeMap = ser::Impossible<String, DigestError>;
    type SerializeStruct = ser::Impossible<String, DigestError>;
    type SerializeStructVariant = ser::Impossible<String, DigestError>;

    fn serialize_str(self, v: &str) -> Result<String, DigestError> {
        Ok(v.to_owned())
    }
    fn serialize_bool(self, _: bool) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_i8(self, _: i8) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_i16(self, _: i16) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_i32(self, _: i32) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_i64(self, _: i64) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_u8(self, _: u8) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_u16(self, _: u16) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_u32(self, _: u32) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_u64(self, _: u64) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_f32(self, _: f32) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_f64(self, _: f64) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_char(self, v: char) -> Result<String, DigestError> {
        Ok(v.to_string())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_none(self) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<String, DigestError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, DigestError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, DigestError> {
        Err(not_a_string())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, DigestError> {
        Err(not_a_string())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, DigestError> {
        Err(not_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, DigestError> {
        Err(not_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, DigestError> {
        Err(not_a_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, DigestError> {
        Err(not_a_string())
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, DigestError> {
        Err(not_a_string())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, DigestError> {
        Err(not_a_string())
    }
}

fn not_a_string() -> DigestError {
    DigestError("a Quantity that is not a string".to_owned())
}

#[cfg(test)]
mod tests;
