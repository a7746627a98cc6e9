//! The `DRAPlugin` service (v1 and v1beta1) and the seam where claim
//! preparation plugs in.
//!
//! Both wire versions are converted to one internal form ([`ClaimRef`],
//! [`PreparedDevice`]) and handed to a [`ClaimPreparer`] in batches (one
//! batch per kubelet call, so an implementation can write its checkpoint
//! once per batch). The gRPC layer guarantees kubelet's contract around it:
//!
//! - the response holds exactly the requested claim UIDs, each with its own
//!   result; a bad claim never fails the whole call;
//! - claims that fail validation ([`claims::validate`]) never reach the
//!   preparer: an empty UID is answered under the key `""`, a UID listed
//!   twice in one request gets one error entry and is not prepared;
//! - a UID the preparer forgot to answer gets an error entry, answers for
//!   UIDs nobody asked about are dropped.
//!
//! Today's preparer is [`NotImplementedPreparer`]: preparation comes in a
//! later issue.

pub mod claims;
mod service;

use std::collections::HashMap;

use futures::future::BoxFuture;

pub(crate) use service::{DraCore, DraV1, DraV1beta1};

/// A claim as kubelet names it in a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// UID of the ResourceClaim: the key of every answer.
    pub uid: String,
}

/// One device prepared for a claim.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// Base names of the requests this device serves; empty means all.
    pub request_names: Vec<String>,
    /// The ResourceSlice pool of the device.
    pub pool_name: String,
    /// The device name inside the pool.
    pub device_name: String,
    /// Fully-qualified CDI device IDs to inject into the containers.
    pub cdi_device_ids: Vec<String>,
    /// The allocation's share ID (consumable capacity); DRAPlugin v1 only.
    pub share_id: Option<String>,
}

/// Why one claim could not be prepared or unprepared; goes into the
/// claim's `error` field of the response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// This plugin version cannot prepare claims yet.
    #[error(
        "preparing claims is not implemented yet in this version of the plugin; claim {namespace}/{name} was left untouched"
    )]
    NotImplemented {
        /// Namespace of the claim.
        namespace: String,
        /// Name of the claim.
        name: String,
    },
    /// The claim reference in the request is unusable.
    #[error("invalid claim in request: {0}")]
    Invalid(String),
    /// The claim UID appears more than once in one request.
    #[error(
        "claim UID {0:?} is listed more than once in the request; none of its entries was processed"
    )]
    Duplicate(String),
    /// The preparer returned no result for the claim.
    #[error("internal error: no result was produced for claim {0:?}")]
    Missing(String),
    /// The result cannot be expressed in the DRAPlugin version kubelet uses.
    #[error("{0}")]
    Unrepresentable(String),
    /// Preparation or unpreparation failed.
    #[error("{0}")]
    Failed(String),
}

/// Per-claim results keyed by claim UID.
pub type ClaimResults<T> = HashMap<String, Result<T, ClaimError>>;

/// Prepares and unprepares claims. Called with validated, distinct claims;
/// must return one entry per claim UID. Both operations must be idempotent
/// (kubelet retries), and unprepare must work for claims it never saw.
pub trait ClaimPreparer: Send + Sync + 'static {
    /// Prepares a batch of claims, returning the devices of each.
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>>;

    /// Undoes the preparation of a batch of claims.
    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>>;
}

/// The preparer of this plugin version: every prepare is answered with a
/// clear per-claim "not implemented yet" error, and unprepare succeeds
/// (nothing was ever prepared, so there is nothing to undo).
#[derive(Clone, Copy, Debug, Default)]
pub struct NotImplementedPreparer;

impl ClaimPreparer for NotImplementedPreparer {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        Box::pin(async move {
            claims
                .iter()
                .map(|c| {
                    (
                        c.uid.clone(),
                        Err(ClaimError::NotImplemented {
                            namespace: c.namespace.clone(),
                            name: c.name.clone(),
                        }),
                    )
                })
                .collect()
        })
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        Box::pin(async move { claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect() })
    }
}
