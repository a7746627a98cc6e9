//! The allocation simulator: one thread that answers "can this claim be
//! allocated, and if not why" against the live caches, so that CPU-bound
//! simulations never block the async runtime.
//!
//! The thread keeps one [`Snapshot`] per set of ResourceSlices and
//! DeviceClasses (keyed by their names, UIDs and resourceVersions), so the
//! work the allocator caches inside it (pool indexes, selector columns,
//! memoised CEL results) is shared by every claim until a slice or class
//! changes. When only claims change, [`Snapshot::with_allocated`] reuses it.
//! A snapshot borrows the objects it was built from; the allocated claims
//! it borrows live in an append-only arena next to the slices, deduplicated
//! by UID and resourceVersion, and the snapshot is rebuilt when the arena is
//! full (which bounds memory).

use std::cell::{Cell, OnceCell};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc;

use gpu_dra_analysis::allocator::{Allocator, Outcome, SimulateOptions, Snapshot};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::runtime::reflector::Store;
use tokio::sync::oneshot;

use super::Error;
use super::metrics::Metrics;

/// Longest Event note Kubernetes accepts (bytes).
pub const EVENT_NOTE_MAX_BYTES: usize = 1024;

/// Spare room in the claim arena beyond the allocated claims seen when a
/// snapshot is built.
const ARENA_SLACK: usize = 256;

/// The simulator's answer for one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some node fits (the first in name order).
    Satisfiable {
        /// That node (`None`: cluster-wide devices only).
        node: Option<String>,
    },
    /// No node fits; the explanation, at most 1 KiB.
    Unsatisfiable {
        /// [`gpu_dra_analysis::allocator::Explanation::event_note`].
        note: String,
    },
    /// The simulation met an error the scheduler would meet too (a CEL
    /// runtime error, an invalid pool, ...): the claim cannot be allocated
    /// until that is fixed.
    Failed {
        /// The error, at most 1 KiB.
        note: String,
    },
}

/// The caches the simulator reads.
#[derive(Clone)]
pub struct SimulatorStores {
    /// All ResourceSlices (of every driver: a claim may mix drivers).
    pub slices: Store<ResourceSlice>,
    /// All DeviceClasses.
    pub classes: Store<DeviceClass>,
    /// All ResourceClaims (the allocated ones make devices busy).
    pub claims: Store<ResourceClaim>,
}

struct Job {
    claim: Arc<ResourceClaim>,
    reply: oneshot::Sender<Verdict>,
}

/// Handle on the simulation thread; the thread ends when the handle is
/// dropped.
#[derive(Debug)]
pub struct Simulator {
    jobs: mpsc::Sender<Job>,
}

impl Simulator {
    /// Starts the thread.
    pub fn start(
        stores: SimulatorStores,
        allocator: Allocator,
        metrics: Metrics,
    ) -> Result<Simulator, Error> {
        let (jobs, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("allocation-simulator".into())
            .spawn(move || serve(&rx, &stores, &allocator, &metrics))
            .map_err(Error::SpawnSimulator)?;
        Ok(Simulator { jobs })
    }

    /// Simulates allocating `claim` now (its own allocation, if any, is
    /// ignored, and so is any allocated copy of it in the cache).
    pub async fn simulate(&self, claim: Arc<ResourceClaim>) -> Result<Verdict, Error> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { claim, reply })
            .map_err(|_| Error::SimulatorGone)?;
        answer.await.map_err(|_| Error::SimulatorGone)
    }
}

/// A fingerprint of the slices and classes: names, UIDs and
/// resourceVersions, independent of order.
pub(crate) fn fingerprint(slices: &[Arc<ResourceSlice>], classes: &[Arc<DeviceClass>]) -> u64 {
    fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> [&str; 3] {
        [
            meta.name.as_deref().unwrap_or(""),
            meta.uid.as_deref().unwrap_or(""),
            meta.resource_version.as_deref().unwrap_or(""),
        ]
    }
    let mut slice_keys: Vec<[&str; 3]> = slices.iter().map(|s| key(&s.metadata)).collect();
    let mut class_keys: Vec<[&str; 3]> = classes.iter().map(|c| key(&c.metadata)).collect();
    slice_keys.sort_unstable();
    class_keys.sort_unstable();
    let mut hasher = DefaultHasher::new();
    slice_keys.hash(&mut hasher);
    class_keys.hash(&mut hasher);
    hasher.finish()
}

fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

fn claim_uid(claim: &ResourceClaim) -> &str {
    claim.metadata.uid.as_deref().unwrap_or("")
}

/// Allocated claims other than `pending`.
fn allocated_except(
    claims: &Store<ResourceClaim>,
    pending: &ResourceClaim,
) -> Vec<Arc<ResourceClaim>> {
    let uid = claim_uid(pending);
    claims.state_filter(|c| is_allocated(c) && (uid.is_empty() || claim_uid(c) != uid))
}

/// An append-only arena of claims: hands out references that live as long
/// as the arena, through a shared reference.
struct ClaimArena {
    slots: Vec<OnceCell<Arc<ResourceClaim>>>,
    used: Cell<usize>,
}

impl ClaimArena {
    fn with_capacity(capacity: usize) -> Self {
        ClaimArena {
            slots: (0..capacity).map(|_| OnceCell::new()).collect(),
            used: Cell::new(0),
        }
    }

    /// Stores `claim`, or gives it back when the arena is full.
    fn alloc(&self, claim: Arc<ResourceClaim>) -> Result<&ResourceClaim, Arc<ResourceClaim>> {
        let index = self.used.get();
        let Some(slot) = self.slots.get(index) else {
            return Err(claim);
        };
        self.used.set(index + 1);
        Ok(slot.get_or_init(|| claim))
    }
}

/// Interns the allocated claims into the arena; `None` when it is full.
fn intern<'a>(
    arena: &'a ClaimArena,
    interned: &mut HashMap<(String, String), &'a ResourceClaim>,
    claims: Vec<Arc<ResourceClaim>>,
) -> Option<Vec<&'a ResourceClaim>> {
    let mut refs = Vec::with_capacity(claims.len());
    for claim in claims {
        let key = (
            claim_uid(&claim).to_owned(),
            claim.metadata.resource_version.clone().unwrap_or_default(),
        );
        if let Some(found) = interned.get(&key) {
            refs.push(*found);
            continue;
        }
        let stored = arena.alloc(claim).ok()?;
        interned.insert(key, stored);
        refs.push(stored);
    }
    Some(refs)
}

fn verdict(outcome: Result<Outcome, gpu_dra_analysis::allocator::AllocError>) -> Verdict {
    match outcome {
        Ok(Outcome::Satisfiable(allocations)) => Verdict::Satisfiable {
            node: allocations.first().and_then(|a| a.node.clone()),
        },
        Ok(Outcome::Unsatisfiable(explanation)) => Verdict::Unsatisfiable {
            note: explanation.event_note(EVENT_NOTE_MAX_BYTES),
        },
        Err(err) => Verdict::Failed {
            note: truncate(&err.to_string(), EVENT_NOTE_MAX_BYTES),
        },
    }
}

/// `text` cut to at most `max` bytes on a character boundary, ending in
/// `...` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The thread: serves jobs until every [`Simulator`] handle is gone.
fn serve(
    rx: &mpsc::Receiver<Job>,
    stores: &SimulatorStores,
    allocator: &Allocator,
    metrics: &Metrics,
) {
    let options = SimulateOptions::default();
    let mut carried: Option<Job> = None;
    loop {
        let mut job = match carried.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let slices = stores.slices.state();
        let classes = stores.classes.state();
        let key = fingerprint(&slices, &classes);
        let mut allocated = allocated_except(&stores.claims, &job.claim);
        let arena = ClaimArena::with_capacity(allocated.len() * 2 + ARENA_SLACK);
        let mut interned = HashMap::new();
        let base = Snapshot::new(
            slices.iter().map(AsRef::as_ref),
            classes.iter().map(AsRef::as_ref),
            std::iter::empty(),
        );
        metrics.snapshot_builds.inc();
        tracing::debug!(
            slices = slices.len(),
            classes = classes.len(),
            "built a simulation snapshot"
        );
        loop {
            let Some(refs) = intern(&arena, &mut interned, allocated) else {
                // The arena is full: start over with a fresh one.
                carried = Some(job);
                break;
            };
            let snapshot = base.with_allocated(refs);
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                allocator.simulate(&snapshot, &job.claim, &options)
            }));
            let panicked = result.is_err();
            let answer = result.map_or_else(
                |_| Verdict::Failed {
                    note: "the allocation simulation panicked".to_owned(),
                },
                verdict,
            );
            // The reconciler may have given up waiting; that is fine.
            let _ = job.reply.send(answer);
            if panicked {
                tracing::error!("the allocation simulation panicked; rebuilding the snapshot");
                break;
            }
            job = match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            };
            if fingerprint(&stores.slices.state(), &stores.classes.state()) != key {
                carried = Some(job);
                break;
            }
            allocated = allocated_except(&stores.claims, &job.claim);
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;

    fn slice(name: &str, rv: &str, memory: &str) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [{
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}},
                    "capacity": {"memory": {"value": memory}}
                }]
            }
        }))
        .unwrap()
    }

    fn class() -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu.nvidia.com", "uid": "uid-class", "resourceVersion": "1"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}
        }))
        .unwrap()
    }

    fn claim(name: &str, memory: &str, allocated: bool) -> ResourceClaim {
        let mut claim = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": format!(
                    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{memory}')) >= 0"
                )}}]
            }}]}}
        });
        if allocated {
            claim["status"] = json!({"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"
            }]}}});
        }
        serde_json::from_value(claim).unwrap()
    }

    struct Fixture {
        slices: reflector::store::Writer<ResourceSlice>,
        classes: reflector::store::Writer<DeviceClass>,
        claims: reflector::store::Writer<ResourceClaim>,
        stores: SimulatorStores,
    }

    fn fixture() -> Fixture {
        let (slice_store, slices) = reflector::store();
        let (class_store, classes) = reflector::store();
        let (claim_store, claims) = reflector::store();
        Fixture {
            slices,
            classes,
            claims,
            stores: SimulatorStores {
                slices: slice_store,
                classes: class_store,
                claims: claim_store,
            },
        }
    }

    #[tokio::test]
    async fn verdicts_and_snapshot_reuse() {
        let mut f = fixture();
        f.slices
            .apply_watcher_event(&Event::Apply(slice("s", "1", "40Gi")));
        f.classes.apply_watcher_event(&Event::Apply(class()));
        let metrics = Metrics::new();
        let sim = Simulator::start(f.stores.clone(), Allocator::new(), metrics.clone()).unwrap();

        let big = Arc::new(claim("big", "80Gi", false));
        let Verdict::Unsatisfiable { note } = sim.simulate(big.clone()).await.unwrap() else {
            panic!("80Gi cannot fit on a 40Gi GPU");
        };
        assert!(note.contains("`gpu`"), "{note}");
        assert!(note.contains("gpu-0"), "{note}");
        assert!(note.len() <= EVENT_NOTE_MAX_BYTES);

        let small = Arc::new(claim("small", "10Gi", false));
        assert_eq!(
            sim.simulate(small.clone()).await.unwrap(),
            Verdict::Satisfiable {
                node: Some("node-a".into())
            }
        );
        assert_eq!(
            metrics.snapshot_builds.get(),
            1,
            "claims alone reuse the snapshot"
        );

        // Another claim holds the only GPU: now the small one does not fit.
        f.claims
            .apply_watcher_event(&Event::Apply(claim("holder", "1Gi", true)));
        assert!(matches!(
            sim.simulate(small.clone()).await.unwrap(),
            Verdict::Unsatisfiable { .. }
        ));
        // ... unless the holder is the claim itself.
        assert!(matches!(
            sim.simulate(Arc::new(claim("holder", "1Gi", false)))
                .await
                .unwrap(),
            Verdict::Satisfiable { .. }
        ));
        assert_eq!(metrics.snapshot_builds.get(), 1);

        // A bigger GPU (a new resourceVersion of the slice) makes a new snapshot.
        f.claims
            .apply_watcher_event(&Event::Delete(claim("holder", "1Gi", true)));
        f.slices
            .apply_watcher_event(&Event::Apply(slice("s", "2", "80Gi")));
        assert!(matches!(
            sim.simulate(big).await.unwrap(),
            Verdict::Satisfiable { .. }
        ));
        assert_eq!(metrics.snapshot_builds.get(), 2);
    }

    #[tokio::test]
    async fn errors_the_scheduler_would_meet_are_failed_verdicts() {
        let mut f = fixture();
        f.slices
            .apply_watcher_event(&Event::Apply(slice("s", "1", "40Gi")));
        let sim = Simulator::start(f.stores.clone(), Allocator::new(), Metrics::new()).unwrap();
        // The class does not exist.
        let Verdict::Failed { note } = sim
            .simulate(Arc::new(claim("c", "1Gi", false)))
            .await
            .unwrap()
        else {
            panic!("an unknown class is an error");
        };
        assert!(note.contains("not found"), "{note}");
    }

    #[test]
    fn the_arena_interns_by_uid_and_version_and_fills_up() {
        let arena = ClaimArena::with_capacity(2);
        let mut interned = HashMap::new();
        let a = Arc::new(claim("a", "1Gi", true));
        let b = Arc::new(claim("b", "1Gi", true));
        let refs = intern(&arena, &mut interned, vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(refs.len(), 2);
        // The same versions again take no room.
        let again = intern(&arena, &mut interned, vec![a.clone(), b]).unwrap();
        assert!(std::ptr::eq(refs[0], again[0]));
        let mut newer = (*a).clone();
        newer.metadata.resource_version = Some("2".into());
        assert!(intern(&arena, &mut interned, vec![Arc::new(newer)]).is_none());
    }

    #[test]
    fn fingerprints_follow_versions_not_order() {
        let s1 = Arc::new(slice("s1", "1", "40Gi"));
        let s2 = Arc::new(slice("s2", "1", "40Gi"));
        let c = Arc::new(class());
        let classes = std::slice::from_ref(&c);
        let a = fingerprint(&[s1.clone(), s2.clone()], classes);
        assert_eq!(a, fingerprint(&[s2.clone(), s1.clone()], classes));
        let s1b = Arc::new(slice("s1", "7", "40Gi"));
        assert_ne!(a, fingerprint(&[s1b, s2.clone()], classes));
        assert_ne!(a, fingerprint(&[s1, s2], &[]));
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(600), 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."), "{}", cut.len());
    }
}
