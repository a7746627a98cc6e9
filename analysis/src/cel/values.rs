//! Kubernetes' `Quantity` and `Semver` as CEL values: opaque types that
//! only their own functions handle (no `<`, `+` or `==` across types, as in
//! Kubernetes).

use std::any::Any;
use std::cmp::Ordering;

use cel::common::types::Type;
use cel::common::value::{StaticVal, Val};

use gpu_dra_api::quantity::Quantity;

/// The CEL type of quantities.
pub(crate) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
/// The CEL type of semantic versions.
pub(crate) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

/// A quantity; equal to another quantity of the same value, whatever the
/// suffixes (`quantity('1Gi') == quantity('1024Mi')`).
#[derive(Debug, Clone)]
pub(crate) struct CelQuantity(pub(crate) Quantity);

impl Val for CelQuantity {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<CelQuantity>()
            .is_some_and(|o| o.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for CelQuantity {}

/// A semantic version; versions compare by SemVer precedence, so build
/// metadata is ignored (`1.0.0+a == 1.0.0+b`), as in Kubernetes.
#[derive(Debug, Clone)]
pub(crate) struct CelSemver(pub(crate) semver::Version);

impl CelSemver {
    pub(crate) fn compare(&self, other: &CelSemver) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

impl Val for CelSemver {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<CelSemver>()
            .is_some_and(|o| self.compare(o) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for CelSemver {}
