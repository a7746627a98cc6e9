//! The claim lifecycle reconciler: for each ResourceClaim that uses one of
//! our DeviceClasses and has stayed unallocated longer than the grace
//! period, simulate its allocation against the live ResourceSlices and, if
//! no node can satisfy it, say why in a Warning Event on the claim, once per
//! distinct explanation.
//!
//! Claims the simulation finds satisfiable are left alone (the scheduler
//! has not got to them yet: its queue, or no pod yet); allocated claims,
//! claims being deleted and claims of other drivers get nothing.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Error;
use super::events::{EventRecorder, REASON_ALLOCATION_ERROR, REASON_UNALLOCATABLE};
use super::metrics::{ErrorLabels, Metrics, Outcome, ReasonLabels};
use super::ours::{ClaimOwnership, claim_ownership};
use super::simulate::{Simulator, Verdict};

/// Explanations remembered per claim (older ones are forgotten, so an old
/// explanation that comes back is recorded again).
const REMEMBERED_EXPLANATIONS: usize = 16;

/// Timing of the claim reconciler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSettings {
    /// The DRA driver name.
    pub driver: String,
    /// How long a claim may stay unallocated before it is explained.
    pub grace_period: Duration,
    /// How often a satisfiable pending claim (or one naming a class that
    /// does not exist yet) is looked at again.
    pub recheck_interval: Duration,
    /// How often an unallocatable claim is simulated again.
    pub unallocatable_recheck_interval: Duration,
    /// Delay before a failed reconcile is retried.
    pub error_backoff: Duration,
}

/// What a claim we are watching has shown so far.
#[derive(Debug)]
struct Tracked {
    namespace: String,
    name: String,
    /// When this controller first saw it unallocated.
    first_pending: Instant,
    /// Whether the last simulation found it unallocatable.
    unallocatable: bool,
    /// Hashes of the explanations already recorded.
    explained: VecDeque<u64>,
}

/// What the reconciler works with (kube-runtime's `Context`).
pub struct Context {
    settings: ClaimSettings,
    claims: Store<ResourceClaim>,
    classes: Store<DeviceClass>,
    slices: Store<ResourceSlice>,
    simulator: Simulator,
    recorder: EventRecorder,
    metrics: Metrics,
    tracked: Mutex<HashMap<String, Tracked>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over these caches.
    pub fn new(
        settings: ClaimSettings,
        claims: Store<ResourceClaim>,
        classes: Store<DeviceClass>,
        slices: Store<ResourceSlice>,
        simulator: Simulator,
        recorder: EventRecorder,
        metrics: Metrics,
    ) -> Self {
        Context {
            settings,
            claims,
            classes,
            slices,
            simulator,
            recorder,
            metrics,
            tracked: Mutex::new(HashMap::new()),
        }
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets a claim and updates the gauge.
    fn forget(&self, uid: &str) {
        let mut tracked = self.tracked();
        if tracked.remove(uid).is_some() {
            self.update_gauge(&tracked);
        }
    }

    /// Forgets claims that are gone from the cache, allocated or replaced.
    fn prune(&self) {
        let mut tracked = self.tracked();
        let before = tracked.len();
        tracked.retain(|uid, t| {
            let key = ObjectRef::new(&t.name).within(&t.namespace);
            self.claims.get(&key).is_some_and(|c| {
                c.metadata.uid.as_deref() == Some(uid.as_str()) && !is_allocated(&c)
            })
        });
        if tracked.len() != before {
            self.update_gauge(&tracked);
        }
    }

    fn update_gauge(&self, tracked: &HashMap<String, Tracked>) {
        let count = tracked.values().filter(|t| t.unallocatable).count();
        self.metrics
            .unallocatable_claims
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Starts tracking `claim` (if new); returns when it was first seen
    /// pending.
    fn first_pending(&self, uid: &str, claim: &ResourceClaim) -> Instant {
        let mut tracked = self.tracked();
        tracked
            .entry(uid.to_owned())
            .or_insert_with(|| Tracked {
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                name: claim.metadata.name.clone().unwrap_or_default(),
                first_pending: Instant::now(),
                unallocatable: false,
                explained: VecDeque::new(),
            })
            .first_pending
    }

    fn set_unallocatable(&self, uid: &str, unallocatable: bool) {
        let mut tracked = self.tracked();
        if let Some(t) = tracked.get_mut(uid)
            && t.unallocatable != unallocatable
        {
            t.unallocatable = unallocatable;
            self.update_gauge(&tracked);
        }
    }

    fn explained(&self, uid: &str, hash: u64) -> bool {
        self.tracked()
            .get(uid)
            .is_some_and(|t| t.explained.contains(&hash))
    }

    fn remember_explanation(&self, uid: &str, hash: u64) {
        if let Some(t) = self.tracked().get_mut(uid) {
            if t.explained.len() >= REMEMBERED_EXPLANATIONS {
                t.explained.pop_front();
            }
            t.explained.push_back(hash);
        }
    }

    async fn reconcile_claim(
        &self,
        claim: &Arc<ResourceClaim>,
    ) -> Result<(Outcome, Action), Error> {
        let settings = &self.settings;
        let Some(uid) = claim.metadata.uid.as_deref() else {
            return Ok((Outcome::NotOurs, Action::await_change()));
        };
        self.prune();
        if is_allocated(claim) {
            self.forget(uid);
            return Ok((Outcome::Allocated, Action::await_change()));
        }
        if claim.metadata.deletion_timestamp.is_some() {
            self.forget(uid);
            return Ok((Outcome::Deleting, Action::await_change()));
        }
        self.classes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("DeviceClass"))?;
        let lookup = |name: &str| self.classes.get(&ObjectRef::new(name));
        match claim_ownership(claim, &settings.driver, lookup) {
            ClaimOwnership::Ours => {}
            ClaimOwnership::NotOurs => {
                self.forget(uid);
                return Ok((Outcome::NotOurs, Action::await_change()));
            }
            ClaimOwnership::Unknown(missing) => {
                tracing::debug!(claim = %name_of(claim), ?missing, "claim names classes that do not exist yet");
                return Ok((Outcome::Waiting, Action::requeue(settings.recheck_interval)));
            }
        }
        let first_pending = self.first_pending(uid, claim);
        let pending_for = age(claim).min(first_pending.elapsed());
        if let Some(wait) = settings.grace_period.checked_sub(pending_for)
            && !wait.is_zero()
        {
            return Ok((Outcome::Waiting, Action::requeue(wait)));
        }
        self.slices
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("ResourceSlice"))?;
        self.claims
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheGone("ResourceClaim"))?;
        let (reason, note) = match self.simulator.simulate(Arc::clone(claim)).await? {
            Verdict::Satisfiable { node } => {
                tracing::debug!(claim = %name_of(claim), ?node, "pending claim is satisfiable");
                self.set_unallocatable(uid, false);
                return Ok((
                    Outcome::Satisfiable,
                    Action::requeue(settings.recheck_interval),
                ));
            }
            Verdict::Unsatisfiable { note } => (REASON_UNALLOCATABLE, note),
            Verdict::Failed { note } => (REASON_ALLOCATION_ERROR, note),
        };
        self.set_unallocatable(uid, true);
        let hash = explanation_hash(reason, &note);
        if !self.explained(uid, hash) {
            let created = self.recorder.warn_once(claim, reason, &note).await?;
            if created {
                self.metrics
                    .events
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
                tracing::info!(claim = %name_of(claim), reason, %note, "recorded why the claim cannot be allocated");
            }
            self.remember_explanation(uid, hash);
        }
        Ok((
            Outcome::Unallocatable,
            Action::requeue(settings.unallocatable_recheck_interval),
        ))
    }
}

/// `namespace/name` of a claim, for logs.
fn name_of(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether the claim has an allocation.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// How long ago the claim was created (zero when unknown or in the future).
fn age(claim: &ResourceClaim) -> Duration {
    let Some(created) = &claim.metadata.creation_timestamp else {
        return Duration::ZERO;
    };
    let elapsed = Timestamp::now().duration_since(created.0);
    Duration::try_from(elapsed).unwrap_or(Duration::ZERO)
}

/// Identifies an explanation (reason and note).
pub(crate) fn explanation_hash(reason: &str, note: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    reason.hash(&mut hasher);
    note.hash(&mut hasher);
    hasher.finish()
}

/// kube-runtime's reconcile function.
pub async fn reconcile(claim: Arc<ResourceClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = ctx.reconcile_claim(&claim).await;
    match &result {
        Ok((outcome, _)) => ctx.metrics.reconciled(*outcome),
        Err(err) => {
            ctx.metrics.reconciled(Outcome::Error);
            ctx.metrics
                .reconcile_errors
                .get_or_create(&ErrorLabels { kind: err.kind() })
                .inc();
        }
    }
    result.map(|(_, action)| action)
}

/// kube-runtime's error policy: log and retry after the backoff.
pub fn error_policy(claim: Arc<ResourceClaim>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(claim = %name_of(&claim), error = %err, "claim reconcile failed");
    Action::requeue(ctx.settings.error_backoff)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    #[test]
    fn explanations_are_told_apart_by_reason_and_note() {
        let a = explanation_hash(REASON_UNALLOCATABLE, "no node fits");
        assert_eq!(a, explanation_hash(REASON_UNALLOCATABLE, "no node fits"));
        assert_ne!(a, explanation_hash(REASON_ALLOCATION_ERROR, "no node fits"));
        assert_ne!(a, explanation_hash(REASON_UNALLOCATABLE, "no node fits."));
    }

    #[test]
    fn ages_come_from_the_creation_timestamp() {
        let mut claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "spec": {}
        }))
        .unwrap();
        assert_eq!(age(&claim), Duration::ZERO);
        let past = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(90);
        claim.metadata.creation_timestamp = Some(Time(past));
        let a = age(&claim);
        assert!(
            a >= Duration::from_secs(90) && a < Duration::from_secs(120),
            "{a:?}"
        );
        let future = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(90);
        claim.metadata.creation_timestamp = Some(Time(future));
        assert_eq!(age(&claim), Duration::ZERO);
        assert!(!is_allocated(&claim));
    }
}
