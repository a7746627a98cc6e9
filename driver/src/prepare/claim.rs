//! A claim as the preparer sees it: the reference kubelet sends, the
//! devices it gets back, why one claim failed, and the [`ClaimPreparer`]
//! seam the gRPC services call. The transport (`crate::grpc::dra`) converts
//! both DRAPlugin versions to and from these types; the domain owns them.

use std::collections::HashMap;

use futures::future::BoxFuture;

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

/// The preparer of a plugin still starting (recovering its checkpoint,
/// or waiting for the instance it replaces to exit): every claim is
/// answered with an error saying so, and kubelet retries.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotReady;

impl ClaimPreparer for NotReady {
    fn prepare<'a>(
        &'a self,
        claims: &'a [ClaimRef],
    ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
        Box::pin(async move { not_ready(claims) })
    }

    fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
        Box::pin(async move { not_ready(claims) })
    }
}

fn not_ready<T>(claims: &[ClaimRef]) -> ClaimResults<T> {
    claims
        .iter()
        .map(|c| {
            let message = format!(
                "the plugin is still starting and cannot serve claim {}/{} yet; kubelet retries",
                c.namespace, c.name
            );
            (c.uid.clone(), Err(ClaimError::Failed(message)))
        })
        .collect()
}
