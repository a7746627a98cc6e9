//! Leader election over a `coordination.k8s.io/v1` Lease, so that with
//! several replicas exactly one runs the claim lifecycle and slice GC (the
//! webhook serves on every replica).
//!
//! The usual Kubernetes protocol: the holder renews `renewTime` every retry
//! period; a candidate takes the lease over (`holderIdentity`,
//! `acquireTime`, `leaseTransitions + 1`) once the record has not changed
//! for `leaseDurationSeconds` as measured on the candidate's own monotonic
//! clock (so clock skew between replicas does not matter). Every write
//! carries the resourceVersion it read, so of two candidates racing for an
//! expired lease exactly one wins (the other gets 409 Conflict). A leader
//! that cannot renew within the renew deadline steps down before its lease
//! can expire for the others. A leader that stops cleanly releases the
//! lease (empty holder) so that another replica takes over at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};

use super::Error;
use super::metrics::Metrics;

/// Where the lease lives and how it is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (unique among replicas).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down
    /// (shorter than `lease_duration`).
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Checks that the durations fit together (`retry_period <
    /// renew_deadline < lease_duration`, all positive).
    pub fn validate(&self) -> Result<(), Error> {
        if self.retry_period.is_zero() {
            return Err(Error::Settings(
                "the leader election retry period must be positive".into(),
            ));
        }
        if self.renew_deadline <= self.retry_period {
            return Err(Error::Settings(format!(
                "the leader election renew deadline ({:?}) must be longer than the retry period ({:?})",
                self.renew_deadline, self.retry_period
            )));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(Error::Settings(format!(
                "the leader election lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            )));
        }
        if self.identity.is_empty() || self.identity.len() > 253 {
            return Err(Error::Settings(
                "the leader election identity must be 1 to 253 characters".into(),
            ));
        }
        Ok(())
    }
}

/// Why leadership ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Another replica holds the lease now.
    TakenBy(String),
    /// The lease could not be renewed within the renew deadline.
    RenewDeadline,
}

/// The last lease record seen and when it was first seen (monotonic).
#[derive(Debug, Clone)]
struct Observed {
    resource_version: String,
    at: Instant,
}

/// Campaigns for, holds and releases the lease.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    metrics: Metrics,
    observed: Option<Observed>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Duration in whole seconds for `leaseDurationSeconds` (at least 1).
fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl LeaderElector {
    /// An elector for the lease in `settings`.
    pub fn new(client: Client, settings: LeaseSettings, metrics: Metrics) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            metrics,
            observed: None,
        }
    }

    /// The identity this elector campaigns under.
    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// Tries every retry period until this replica holds the lease.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    self.metrics.leader.set(1);
                    self.metrics.leader_acquisitions.inc();
                    tracing::info!(identity = %self.settings.identity, lease = %self.settings.name, "became the leader");
                    return;
                }
                Ok(false) => {}
                Err(err) => tracing::warn!(error = %err, "leader election attempt failed"),
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Renews the lease every retry period; returns when leadership is
    /// lost (the caller must stop leading at once).
    pub async fn hold(&mut self) -> Lost {
        let mut last_renewal = Instant::now();
        let lost = loop {
            tokio::time::sleep(self.settings.retry_period).await;
            let left = self
                .settings
                .renew_deadline
                .saturating_sub(last_renewal.elapsed());
            if left.is_zero() {
                break Lost::RenewDeadline;
            }
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_renewal = Instant::now(),
                Ok(Ok(false)) => break Lost::TakenBy(self.holder().await),
                Ok(Err(err)) => tracing::warn!(error = %err, "renewing the lease failed"),
                Err(_) => break Lost::RenewDeadline,
            }
        };
        self.metrics.leader.set(0);
        tracing::warn!(identity = %self.settings.identity, ?lost, "lost leadership");
        lost
    }

    /// The current holder, as far as can be told.
    async fn holder(&self) -> String {
        match self.api.get_opt(&self.settings.name).await {
            Ok(Some(lease)) => lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// Gives the lease up if this replica holds it (empty holder, so the
    /// next candidate need not wait for it to expire).
    pub async fn release(&mut self) {
        self.metrics.leader.set(0);
        let lease = match self.api.get_opt(&self.settings.name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the lease to release it");
                return;
            }
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return;
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        let released = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => tracing::info!(identity = %self.settings.identity, "released the lease"),
            Err(err) => tracing::warn!(error = %err, "cannot release the lease"),
        }
    }

    /// One attempt: creates the lease, renews it, or takes it over if it
    /// expired. `Ok(true)` when this replica holds it afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, Error> {
        let name = self.settings.name.clone();
        let now = MicroTime(Timestamp::now());
        let existing = self
            .api
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("reading Lease {name}"), e))?;
        let Some(lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.settings.identity.clone()),
                    lease_duration_seconds: Some(whole_seconds(self.settings.lease_duration)),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(format!("creating Lease {name}"), e)),
            };
        };
        self.observe(&lease);
        let mut spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.settings.identity;
        if !mine && !holder.is_empty() && !self.expired(&spec) {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.settings.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.lease_duration_seconds = Some(whole_seconds(self.settings.lease_duration));
        spec.renew_time = Some(now);
        let updated = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(format!("updating Lease {name}"), e)),
        }
    }

    /// Notes the record; a new resourceVersion restarts the expiry clock.
    fn observe(&mut self, lease: &Lease) {
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        if self
            .observed
            .as_ref()
            .is_none_or(|o| o.resource_version != rv)
        {
            self.observed = Some(Observed {
                resource_version: rv,
                at: Instant::now(),
            });
        }
    }

    /// Whether the observed record has gone unchanged for its lease
    /// duration.
    fn expired(&self, spec: &LeaseSpec) -> bool {
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.settings.lease_duration, Duration::from_secs);
        self.observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() >= duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings {
            namespace: "kube-system".into(),
            name: "gpu-dra-controller".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn durations_must_nest() {
        assert!(settings().validate().is_ok());
        let mut s = settings();
        s.renew_deadline = Duration::from_secs(15);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("lease duration")
        );
        let mut s = settings();
        s.retry_period = Duration::from_secs(10);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("retry period")
        );
        let mut s = settings();
        s.retry_period = Duration::ZERO;
        assert!(s.validate().is_err());
        let mut s = settings();
        s.identity = String::new();
        assert!(s.validate().unwrap_err().to_string().contains("identity"));
    }

    #[test]
    fn lease_seconds_are_whole_and_positive() {
        assert_eq!(whole_seconds(Duration::from_millis(300)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(15)), 15);
        assert_eq!(whole_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
