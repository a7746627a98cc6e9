//! Claims between staging and their `PrepareCompleted` commit.
//!
//! A prepare holds its GPU locks while it sets the hardware up, and lets
//! them go before the checkpoint commit, so claims on one GPU do not queue
//! behind each other's disk writes (their commits group into one write).
//! Until the commit lands, the staged entry is *pending*: conflict checks,
//! the shared-daemon bookkeeping of memory-shared GPUs and unprepare look
//! at the checkpoint overlaid with the pending entries ([`Pending::overlay`]),
//! so a claim being committed counts as prepared. A second call for the
//! same claim, and an unprepare of it, wait until it settles.
//!
//! An unprepare also waits for every prepare of the claim still running,
//! from its first step (the prepare a kubelet gave up on runs to its end;
//! see `per_claim` in the preparer). Kubelet sends the unprepare of a pod
//! deleted while its claim prepared: answered before that prepare commits,
//! it would find nothing to undo, and the claim's devices would stay
//! prepared with no one left to unprepare them.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::prepare::checkpoint::{ClaimEntry, ClaimUid};

/// The pending entries, the prepares running, and a signal when either
/// changes.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    claims: Mutex<BTreeMap<ClaimUid, ClaimEntry>>,
    /// How many prepares of each claim are running.
    preparing: Mutex<BTreeMap<ClaimUid, usize>>,
    settled: Notify,
}

impl Pending {
    fn table(&self) -> MutexGuard<'_, BTreeMap<ClaimUid, ClaimEntry>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `uid` is being committed.
    pub(crate) fn contains(&self, uid: &ClaimUid) -> bool {
        self.table().contains_key(uid)
    }

    /// Registers a staged entry (under the claim's GPU locks).
    pub(crate) fn insert(&self, uid: ClaimUid, entry: ClaimEntry) {
        self.table().insert(uid, entry);
    }

    /// `claims` (the checkpoint's, those `keep` selected) with the pending
    /// entries `keep` selects over them.
    pub(crate) fn overlay(
        &self,
        mut claims: BTreeMap<ClaimUid, ClaimEntry>,
        keep: impl Fn(&ClaimEntry) -> bool,
    ) -> BTreeMap<ClaimUid, ClaimEntry> {
        for (uid, entry) in self.table().iter().filter(|(_, e)| keep(e)) {
            claims.insert(uid.clone(), entry.clone());
        }
        claims
    }

    /// Returns once `uid` is not pending.
    pub(crate) async fn wait_settled(&self, uid: &ClaimUid) {
        self.wait_until(|| !self.contains(uid)).await;
    }

    /// Returns once `done` holds, looked at again after every settle and
    /// every end of a prepare.
    async fn wait_until(&self, done: impl Fn() -> bool) {
        loop {
            // Registered before the check, so a settle in between is not
            // missed.
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done() {
                return;
            }
            notified.await;
        }
    }

    fn settle(&self, uid: &ClaimUid) {
        self.table().remove(uid);
        self.settled.notify_waiters();
    }

    fn running(&self) -> MutexGuard<'_, BTreeMap<ClaimUid, usize>> {
        self.preparing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a prepare of `uid` as running, until [`Self::end_prepare`].
    pub(crate) fn begin_prepare(&self, uid: &ClaimUid) {
        *self.running().entry(uid.clone()).or_default() += 1;
    }

    /// A prepare of `uid` counted by [`Self::begin_prepare`] has ended.
    pub(crate) fn end_prepare(&self, uid: &ClaimUid) {
        {
            let mut running = self.running();
            if let Some(n) = running.get_mut(uid) {
                *n -= 1;
                if *n == 0 {
                    running.remove(uid);
                }
            }
        }
        self.settled.notify_waiters();
    }

    /// Returns once no prepare of `uid` runs and `uid` is not pending.
    pub(crate) async fn wait_idle(&self, uid: &ClaimUid) {
        self.wait_until(|| !self.running().contains_key(uid) && !self.contains(uid))
            .await;
    }
}

/// Settles a pending claim when dropped: after its commit (the checkpoint
/// has it) or its rollback (it is gone), and on any early return.
pub(crate) struct Settle<'a> {
    pending: &'a Pending,
    uid: &'a ClaimUid,
}

impl<'a> Settle<'a> {
    /// Settles `uid` when the guard goes.
    pub(crate) fn new(pending: &'a Pending, uid: &'a ClaimUid) -> Self {
        Self { pending, uid }
    }
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.pending.settle(self.uid);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::prepare::checkpoint::ClaimState;

    fn entry() -> ClaimEntry {
        ClaimEntry {
            state: ClaimState::PrepareCompleted,
            namespace: "ns".into(),
            name: "c".into(),
            devices: Vec::new(),
            cdi_spec_paths: Vec::new(),
        }
    }

    #[test]
    fn overlay_puts_pending_entries_over_the_checkpoint() {
        let pending = Pending::default();
        let (a, b) = (ClaimUid("a".into()), ClaimUid("b".into()));
        let mut stored = entry();
        stored.state = ClaimState::PrepareStarted;
        pending.insert(a.clone(), entry());
        let stored_claims = BTreeMap::from([(a.clone(), stored), (b.clone(), entry())]);
        let view = pending.overlay(stored_claims.clone(), |_| true);
        assert_eq!(view.len(), 2);
        assert_eq!(view[&a].state, ClaimState::PrepareCompleted);
        assert!(pending.contains(&a) && !pending.contains(&b));
        // Pending entries the filter leaves out do not cover stored ones.
        let view = pending.overlay(stored_claims, |e| e.state == ClaimState::PrepareStarted);
        assert_eq!(view[&a].state, ClaimState::PrepareStarted);
        let c = ClaimUid("c".into());
        pending.insert(c.clone(), entry());
        let view = pending.overlay(BTreeMap::new(), |e| e.state == ClaimState::PrepareCompleted);
        assert_eq!(view.keys().collect::<Vec<_>>(), vec![&a, &c]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_return_only_once_the_claim_settles() {
        let pending = Arc::new(Pending::default());
        let uid = ClaimUid("a".into());
        // Not pending: no wait.
        tokio::time::timeout(Duration::from_secs(5), pending.wait_settled(&uid))
            .await
            .expect("an unknown claim is settled");
        pending.insert(uid.clone(), entry());
        let waiter = {
            let (pending, uid) = (Arc::clone(&pending), uid.clone());
            tokio::spawn(async move { pending.wait_settled(&uid).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "returned while the claim was pending"
        );
        // Another claim settling does not release it.
        let other = ClaimUid("b".into());
        pending.insert(other.clone(), entry());
        drop(Settle::new(&pending, &other));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "released by another claim");
        drop(Settle::new(&pending, &uid));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter returns once settled")
            .unwrap();
        assert!(!pending.contains(&uid));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unprepare_waits_for_every_running_prepare_of_its_claim() {
        let pending = Arc::new(Pending::default());
        let uid = ClaimUid("a".into());
        let other = ClaimUid("b".into());
        pending.begin_prepare(&uid);
        pending.begin_prepare(&uid);
        pending.begin_prepare(&other);
        let waiter = {
            let (pending, uid) = (Arc::clone(&pending), uid.clone());
            tokio::spawn(async move { pending.wait_idle(&uid).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        pending.end_prepare(&uid);
        pending.end_prepare(&other);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "returned while a prepare still ran");
        // The last prepare went on to stage its entry: still not idle.
        pending.insert(uid.clone(), entry());
        pending.end_prepare(&uid);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "returned while the claim was pending"
        );
        drop(Settle::new(&pending, &uid));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("idle once no prepare runs and nothing is pending")
            .unwrap();
    }
}
