//! The `DRAPlugin` service (v1 and v1beta1) and the seam where claim
//! preparation plugs in.
//!
//! Both wire versions are converted to one internal form
//! ([`ClaimRef`](crate::prepare::claim::ClaimRef),
//! [`PreparedDevice`](crate::prepare::claim::PreparedDevice)) and handed to a
//! [`ClaimPreparer`](crate::prepare::claim::ClaimPreparer) in batches (one
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
//! The claim types and the `ClaimPreparer` trait belong to the domain
//! ([`crate::prepare::claim`]); the plugin's preparer is
//! [`crate::prepare::Preparer`].

pub mod claims;
mod service;

pub(crate) use service::{DraCore, DraV1, DraV1beta1};

#[cfg(test)]
pub(crate) use testing::NotImplementedPreparer;

/// Test scaffolding: a preparer that prepares nothing, for the transport's
/// own tests.
#[cfg(test)]
mod testing {
    use futures::future::BoxFuture;

    use crate::prepare::claim::{
        ClaimError, ClaimPreparer, ClaimRef, ClaimResults, PreparedDevice,
    };

    /// Every prepare is answered with a clear per-claim "not implemented"
    /// error, and unprepare succeeds (nothing was ever prepared).
    #[derive(Clone, Copy, Debug, Default)]
    pub(crate) struct NotImplementedPreparer;

    impl ClaimPreparer for NotImplementedPreparer {
        fn prepare<'a>(
            &'a self,
            claims: &'a [ClaimRef],
        ) -> BoxFuture<'a, ClaimResults<Vec<PreparedDevice>>> {
            Box::pin(async move {
                claims
                    .iter()
                    .map(|c| {
                        let message = format!(
                            "preparing claims is not implemented yet in this test preparer; claim {}/{} was left untouched",
                            c.namespace, c.name
                        );
                        (c.uid.clone(), Err(ClaimError::Failed(message)))
                    })
                    .collect()
            })
        }

        fn unprepare<'a>(&'a self, claims: &'a [ClaimRef]) -> BoxFuture<'a, ClaimResults<()>> {
            Box::pin(async move { claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect() })
        }
    }
}
