//! The kinds of devices a selector can be evaluated on: the four kinds
//! this driver publishes ([`DeviceKind`]) and "a device of another driver"
//! (DeviceClass selectors see every device of the node).

use std::fmt;

use gpu_dra_api::schema::DeviceKind;

/// A set of device kinds: some of this driver's [`DeviceKind`]s, and
/// possibly devices of other drivers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceSet(u8);

const GPU: u8 = 1;
const MIG_STATIC: u8 = 2;
const MIG_DYNAMIC: u8 = 4;
const OTHER: u8 = 8;
const VFIO: u8 = 16;

/// One device kind of a [`DeviceSet`], for the per-kind analysis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// One of this driver's kinds.
    Ours(DeviceKind),
    /// A device of another driver.
    Other,
}

impl Kind {
    fn bit(self) -> u8 {
        match self {
            Kind::Ours(DeviceKind::Gpu) => GPU,
            Kind::Ours(DeviceKind::MigStatic) => MIG_STATIC,
            Kind::Ours(DeviceKind::MigDynamic) => MIG_DYNAMIC,
            Kind::Ours(DeviceKind::Vfio) => VFIO,
            Kind::Other => OTHER,
        }
    }
}

impl DeviceSet {
    /// No device.
    pub const NONE: DeviceSet = DeviceSet(0);
    /// Every device this driver publishes.
    pub const OURS: DeviceSet = DeviceSet(GPU | MIG_STATIC | MIG_DYNAMIC | VFIO);
    /// Every device of every driver: what the first selector of a
    /// DeviceClass is evaluated on.
    pub const ALL: DeviceSet = DeviceSet(GPU | MIG_STATIC | MIG_DYNAMIC | VFIO | OTHER);
    /// Devices of other drivers only.
    pub const OTHER_DRIVERS: DeviceSet = DeviceSet(OTHER);

    /// The set of one of this driver's kinds.
    pub fn of(kind: DeviceKind) -> Self {
        DeviceSet(Kind::Ours(kind).bit())
    }

    /// The set of these kinds of this driver.
    pub fn of_kinds(kinds: &[DeviceKind]) -> Self {
        kinds
            .iter()
            .fold(DeviceSet::NONE, |set, k| set.union(DeviceSet::of(*k)))
    }

    /// Whether devices of `kind` are in the set.
    pub fn contains(self, kind: DeviceKind) -> bool {
        self.0 & Kind::Ours(kind).bit() != 0
    }

    /// Whether devices of other drivers are in the set.
    pub fn has_other_drivers(self) -> bool {
        self.0 & OTHER != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Both sets together.
    #[must_use]
    pub fn union(self, other: DeviceSet) -> DeviceSet {
        DeviceSet(self.0 | other.0)
    }

    /// What both sets have.
    #[must_use]
    pub fn intersection(self, other: DeviceSet) -> DeviceSet {
        DeviceSet(self.0 & other.0)
    }

    /// This driver's kinds in the set.
    pub fn kinds(self) -> impl Iterator<Item = DeviceKind> {
        DeviceKind::ALL
            .into_iter()
            .filter(move |k| self.contains(*k))
    }

    /// Every kind in the set, other drivers last.
    pub(crate) fn members(self) -> impl Iterator<Item = Kind> {
        self.kinds()
            .map(Kind::Ours)
            .chain(self.has_other_drivers().then_some(Kind::Other))
    }

    /// Adds one kind.
    pub(crate) fn insert(&mut self, kind: Kind) {
        self.0 |= kind.bit();
    }

    /// Words for messages: "full GPUs and MIG devices".
    pub fn describe(self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if self.contains(DeviceKind::Gpu) {
            parts.push("full GPUs");
        }
        match (
            self.contains(DeviceKind::MigStatic),
            self.contains(DeviceKind::MigDynamic),
        ) {
            (true, true) => parts.push("MIG devices"),
            (true, false) => parts.push("static MIG devices"),
            (false, true) => parts.push("dynamic MIG devices"),
            (false, false) => {}
        }
        if self.contains(DeviceKind::Vfio) {
            parts.push("VFIO passthrough GPUs");
        }
        if self.has_other_drivers() {
            parts.push("devices of other drivers");
        }
        match parts.as_slice() {
            [] => "no device".to_owned(),
            [one] => (*one).to_owned(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        }
    }
}

impl fmt::Debug for DeviceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceSet({})", self.describe())
    }
}

impl fmt::Display for DeviceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
