//! Per-GPU locks: a prepare or unprepare holds the locks of exactly the
//! physical GPUs its claim touches, so a claim on GPU 3 never waits for one
//! on GPU 5 (NVIDIA's driver takes one node-wide file lock with a 10 s
//! timeout). Locks are taken in ascending minor order, so two claims
//! spanning the same GPUs cannot deadlock, and they are async: a waiting
//! claim holds no thread.
//!
//! The locks are in-process only: one plugin instance per node is enforced
//! by the instance lock taken when the sockets are bound.
//!
//! At debug level, a call that finds a GPU's lock taken says so (claim and
//! GPU) once it is queued, and every call says when it holds its locks: what
//! a slow prepare waited for, and what tests use to order racing calls.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The lock table, one async mutex per GPU minor, created on first use.
#[derive(Debug, Default)]
pub struct GpuLocks {
    table: Mutex<BTreeMap<u32, Arc<AsyncMutex<()>>>>,
}

/// Held locks; dropping releases them.
#[derive(Debug)]
pub struct Held {
    _guards: Vec<OwnedMutexGuard<()>>,
    minors: Vec<u32>,
}

impl Held {
    /// The GPUs held, ascending.
    pub fn minors(&self) -> &[u32] {
        &self.minors
    }
}

impl GpuLocks {
    /// Takes the locks of `minors` (any order, duplicates allowed) in
    /// ascending order, for `claim` (named in the debug lines). Waiters are
    /// served first come, first served.
    pub async fn lock(&self, minors: &[u32], claim: &impl Display) -> Held {
        let mut sorted = minors.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mutexes: Vec<Arc<AsyncMutex<()>>> = {
            let mut table = self
                .table
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            sorted
                .iter()
                .map(|m| Arc::clone(table.entry(*m).or_default()))
                .collect()
        };
        let mut guards = Vec::with_capacity(mutexes.len());
        for (m, minor) in mutexes.into_iter().zip(&sorted) {
            let mut acquire = std::pin::pin!(m.lock_owned());
            // The first poll takes a free lock or queues this call; only
            // then is the wait logged, so whoever reads the line knows
            // this call is ahead of any that comes later.
            let first = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
            let guard = match first {
                Poll::Ready(guard) => guard,
                Poll::Pending => {
                    tracing::debug!(claim = %claim, gpu = minor, "waiting for a GPU's lock");
                    acquire.await
                }
            };
            guards.push(guard);
        }
        tracing::debug!(claim = %claim, gpus = ?sorted, "GPU locks held");
        Held {
            _guards: guards,
            minors: sorted,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn disjoint_gpus_do_not_wait_for_each_other() {
        let locks = Arc::new(GpuLocks::default());
        let held = locks.lock(&[3], &"a").await;
        // GPU 5 is free while 3 is held.
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock(&[5], &"b"))
            .await
            .expect("lock of another GPU waited");
        assert_eq!(other.minors(), [5]);
        // GPU 3 is not.
        let again =
            tokio::time::timeout(Duration::from_millis(50), locks.lock(&[3, 5], &"c")).await;
        assert!(again.is_err(), "GPU 3 was locked twice");
        drop(held);
        drop(other);
        let both = locks.lock(&[5, 3, 3], &"d").await;
        assert_eq!(both.minors(), [3, 5]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_sets_in_opposite_orders_do_not_deadlock() {
        let locks = Arc::new(GpuLocks::default());
        let mut tasks = Vec::new();
        for i in 0..64u32 {
            let locks = Arc::clone(&locks);
            let set = if i % 2 == 0 {
                vec![1, 2, 3]
            } else {
                vec![3, 2, 1]
            };
            tasks.push(tokio::spawn(async move {
                let _held = locks.lock(&set, &i).await;
                tokio::task::yield_now().await;
            }));
        }
        tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(tasks))
            .await
            .expect("deadlock");
    }
}
