//! The device as selectors see it, independent of Kubernetes types, and its
//! conversion to the CEL value `device` (done once per device and
//! evaluation round, by [`Evaluator::new`](super::Evaluator::new)).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};

use cel::ExecutionError;
use cel::common::traits::{Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelInt, CelMap, CelMapKey, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};

use super::values::{CelQuantity, CelSemver};
use gpu_dra_api::quantity::Quantity;

/// An attribute value of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    /// `int` (int64).
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `version`: a semantic version, a `Semver` in CEL.
    Version(semver::Version),
}

impl AttrValue {
    /// A `version` attribute from its text, which must be a SemVer 2.0.0
    /// version, as Kubernetes requires.
    pub fn version(text: &str) -> Result<Self, DeviceError> {
        semver::Version::parse(text)
            .map(AttrValue::Version)
            .map_err(|e| DeviceError::InvalidVersion {
                value: text.to_owned(),
                reason: e.to_string(),
            })
    }
}

/// Why a device could not be described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// An attribute or capacity name is not a (qualified) name.
    #[error("invalid attribute or capacity name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Two names resolve to the same domain and id (e.g. `memory` and
    /// `<driver>/memory`).
    #[error("duplicate attribute or capacity {domain}/{id}")]
    Duplicate {
        /// The domain.
        domain: String,
        /// The id.
        id: String,
    },
    /// A `version` attribute that is not a semantic version.
    #[error("invalid version {value:?}: {reason}")]
    InvalidVersion {
        /// The text.
        value: String,
        /// The parser's message.
        reason: String,
    },
}

/// A device's driver, attributes and capacities, keyed by domain and id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CelDevice {
    /// The driver's name.
    pub driver: String,
    /// domain → id → value.
    pub attributes: BTreeMap<String, BTreeMap<String, AttrValue>>,
    /// domain → id → capacity.
    pub capacity: BTreeMap<String, BTreeMap<String, Quantity>>,
    /// Whether the device can be allocated to several claims at once.
    pub allow_multiple_allocations: bool,
}

/// Splits a ResourceSlice attribute or capacity name into domain and id: a
/// name without a domain (`memory`) belongs to the driver's domain,
/// `<domain>/<id>` to that domain.
pub fn split_qualified_name<'a>(
    driver: &'a str,
    name: &'a str,
) -> Result<(&'a str, &'a str), DeviceError> {
    let invalid = |reason| DeviceError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    let (domain, id) = match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    };
    if domain.is_empty() {
        return Err(invalid("empty domain"));
    }
    if id.is_empty() {
        return Err(invalid("empty id"));
    }
    if id.contains('/') {
        return Err(invalid("more than one '/'"));
    }
    Ok((domain, id))
}

/// Inserts `value` under the domain and id of `name`, unless already there.
fn insert_new<V>(
    map: &mut BTreeMap<String, BTreeMap<String, V>>,
    driver: &str,
    name: &str,
    value: V,
) -> Result<(), DeviceError> {
    let (domain, id) = split_qualified_name(driver, name)?;
    let entries = map.entry(domain.to_owned()).or_default();
    if entries.contains_key(id) {
        return Err(DeviceError::Duplicate {
            domain: domain.to_owned(),
            id: id.to_owned(),
        });
    }
    entries.insert(id.to_owned(), value);
    Ok(())
}

impl CelDevice {
    /// A device of `driver` without attributes or capacities.
    pub fn new(driver: impl Into<String>) -> Self {
        CelDevice {
            driver: driver.into(),
            ..CelDevice::default()
        }
    }

    /// Adds an attribute by its ResourceSlice name, qualified or not.
    pub fn add_attribute(&mut self, name: &str, value: AttrValue) -> Result<(), DeviceError> {
        insert_new(&mut self.attributes, &self.driver, name, value)
    }

    /// Adds a capacity by its ResourceSlice name, qualified or not.
    pub fn add_capacity(&mut self, name: &str, value: Quantity) -> Result<(), DeviceError> {
        insert_new(&mut self.capacity, &self.driver, name, value)
    }

    /// The CEL value of the device.
    pub(crate) fn to_value(&self) -> Box<dyn Val + 'static> {
        let attributes = domains(&self.attributes, |v| match v {
            AttrValue::Int(i) => Box::new(CelInt::from(*i)),
            AttrValue::Bool(b) => Box::new(CelBool::from(*b)),
            AttrValue::String(s) => Box::new(CelString::from(s.clone())),
            AttrValue::Version(v) => Box::new(CelSemver(v.clone())),
        });
        let capacity = domains(&self.capacity, |q| Box::new(CelQuantity(*q)));
        let mut device: HashMap<CelMapKey<'static>, Box<dyn Val>> = HashMap::with_capacity(4);
        device.insert(
            key("driver"),
            Box::new(CelString::from(self.driver.clone())),
        );
        device.insert(key("attributes"), Box::new(attributes));
        device.insert(key("capacity"), Box::new(capacity));
        device.insert(
            key("allowMultipleAllocations"),
            Box::new(CelBool::from(self.allow_multiple_allocations)),
        );
        Box::new(CelMap::from(device))
    }
}

fn key(name: &str) -> CelMapKey<'static> {
    CelMapKey::from(name.to_owned())
}

fn domains<T>(
    source: &BTreeMap<String, BTreeMap<String, T>>,
    convert: impl Fn(&T) -> Box<dyn Val>,
) -> DomainMap {
    let inner = source
        .iter()
        .map(|(domain, entries)| {
            let entries: HashMap<CelMapKey<'static>, Box<dyn Val>> = entries
                .iter()
                .map(|(id, v)| (key(id), convert(v)))
                .collect();
            (key(domain), Box::new(CelMap::from(entries)) as Box<dyn Val>)
        })
        .collect::<HashMap<_, _>>();
    DomainMap {
        inner: CelMap::from(inner),
        empty: CelMap::default(),
    }
}

/// `device.attributes` and `device.capacity`: a map whose unknown keys
/// (domains) read as an empty map, as in Kubernetes, while `in` and
/// iteration see only the domains the device has.
#[derive(Debug, Clone)]
struct DomainMap {
    inner: CelMap<'static>,
    empty: CelMap<'static>,
}

impl Val for DomainMap {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(&self.inner)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(&self.inner)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(&self.inner)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        match other.downcast_ref::<DomainMap>() {
            Some(o) => self.inner.equals(&o.inner),
            None => self.inner.equals(other),
        }
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for DomainMap {}

impl Indexer for DomainMap {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match self.inner.get(idx) {
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::Borrowed(&self.empty)),
            other => other,
        }
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}
