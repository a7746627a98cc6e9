//! Prometheus metrics of the claim lifecycle, the slice GC and leader
//! election. [`Metrics::register`] puts them into the controller's registry
//! under `lifecycle_`, `slice_gc_` and `leader_election_`.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What one reconcile of a claim concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The claim is allocated: nothing to explain.
    Allocated,
    /// The claim is being deleted.
    Deleting,
    /// No request of the claim uses one of our DeviceClasses.
    NotOurs,
    /// The claim is younger than the grace period (or a class it names is
    /// not there yet): looked at again later.
    Waiting,
    /// The claim could be allocated now; the scheduler has not got to it.
    Satisfiable,
    /// No node can satisfy the claim (or the simulation met an error the
    /// scheduler would meet too).
    Unallocatable,
    /// The reconcile failed (API error, simulator gone).
    Error,
}

impl Outcome {
    /// The label value (snake case).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allocated => "allocated",
            Outcome::Deleting => "deleting",
            Outcome::NotOurs => "not_ours",
            Outcome::Waiting => "waiting",
            Outcome::Satisfiable => "satisfiable",
            Outcome::Unallocatable => "unallocatable",
            Outcome::Error => "error",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Label set of [`Metrics::reconciles`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The outcome.
    pub result: Outcome,
}

/// Label set of the error counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    /// A short error kind, [`crate::lifecycle::Error::kind`].
    pub kind: &'static str,
}

/// Label set of [`Metrics::events`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The Event's reason.
    pub reason: &'static str,
}

/// Every metric of this module. Cheap to clone: clones share the values.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Claim reconciles by outcome.
    pub reconciles: Family<OutcomeLabels, Counter>,
    /// Failed claim reconciles by error kind.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Claims of ours that are pending and that no node can satisfy now.
    pub unallocatable_claims: Gauge,
    /// Events recorded on claims, by reason.
    pub events: Family<ReasonLabels, Counter>,
    /// Simulation snapshots built (once per set of slices and classes).
    pub snapshot_builds: Counter,
    /// Garbage collection passes over the ResourceSlices.
    pub gc_passes: Counter,
    /// ResourceSlices deleted because their Node is gone.
    pub gc_slices_deleted: Counter,
    /// Failed GC passes or deletions, by error kind.
    pub gc_errors: Family<ErrorLabels, Counter>,
    /// 1 while this replica holds the lease (or runs without election).
    pub leader: Gauge,
    /// Times this replica became the leader.
    pub leader_acquisitions: Counter,
}

impl Metrics {
    /// Fresh metrics (all zero), not registered anywhere.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// Registers every metric into `registry` (the names get `lifecycle_`,
    /// `slice_gc_` or `leader_election_` in front, after the registry's
    /// own prefix).
    pub fn register(&self, registry: &mut Registry) {
        let lifecycle = registry.sub_registry_with_prefix("lifecycle");
        lifecycle.register(
            "reconciles",
            "Claim reconciles by outcome",
            self.reconciles.clone(),
        );
        lifecycle.register(
            "reconcile_errors",
            "Failed claim reconciles by error kind",
            self.reconcile_errors.clone(),
        );
        lifecycle.register(
            "unallocatable_claims",
            "Pending claims of this driver that no node can satisfy",
            self.unallocatable_claims.clone(),
        );
        lifecycle.register(
            "events",
            "Events recorded on claims, by reason",
            self.events.clone(),
        );
        lifecycle.register(
            "snapshot_builds",
            "Allocation simulation snapshots built from the ResourceSlices",
            self.snapshot_builds.clone(),
        );
        let gc = registry.sub_registry_with_prefix("slice_gc");
        gc.register(
            "passes",
            "Garbage collection passes over the ResourceSlices",
            self.gc_passes.clone(),
        );
        gc.register(
            "slices_deleted",
            "ResourceSlices deleted because their Node is gone",
            self.gc_slices_deleted.clone(),
        );
        gc.register(
            "errors",
            "Failed slice GC passes or deletions, by error kind",
            self.gc_errors.clone(),
        );
        let leader = registry.sub_registry_with_prefix("leader_election");
        leader.register(
            "leader",
            "1 while this replica runs the claim lifecycle and slice GC",
            self.leader.clone(),
        );
        leader.register(
            "acquisitions",
            "Times this replica became the leader",
            self.leader_acquisitions.clone(),
        );
    }

    /// Counts one reconcile with this outcome.
    pub(crate) fn reconciled(&self, result: Outcome) {
        self.reconciles
            .get_or_create(&OutcomeLabels { result })
            .inc();
    }

    /// The count of reconciles with this outcome.
    pub fn reconcile_count(&self, result: Outcome) -> u64 {
        self.reconciles
            .get_or_create(&OutcomeLabels { result })
            .get()
    }

    /// The count of events recorded with this reason.
    pub fn event_count(&self, reason: &'static str) -> u64 {
        self.events.get_or_create(&ReasonLabels { reason }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_are_encoded_with_their_prefixes() {
        let metrics = Metrics::new();
        let registry = crate::metrics::SharedRegistry::new();
        registry.register(|r| metrics.register(r));
        metrics.reconciled(Outcome::Unallocatable);
        metrics.reconciled(Outcome::Unallocatable);
        metrics
            .events
            .get_or_create(&ReasonLabels {
                reason: "Unallocatable",
            })
            .inc();
        metrics.unallocatable_claims.set(3);
        metrics.gc_slices_deleted.inc();
        metrics.leader.set(1);
        let text = registry.encode();
        for line in [
            "gpu_dra_controller_lifecycle_reconciles_total{result=\"unallocatable\"} 2",
            "gpu_dra_controller_lifecycle_events_total{reason=\"Unallocatable\"} 1",
            "gpu_dra_controller_lifecycle_unallocatable_claims 3",
            "gpu_dra_controller_slice_gc_slices_deleted_total 1",
            "gpu_dra_controller_leader_election_leader 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(metrics.reconcile_count(Outcome::Unallocatable), 2);
        assert_eq!(metrics.reconcile_count(Outcome::Allocated), 0);
        assert_eq!(metrics.event_count("Unallocatable"), 1);
    }
}
