//! Work sharing for long scans: the calling thread walks a list of items
//! (nodes, pools) from the front and does the real work on each; helper
//! threads take items from the back and only prepare what the walk will
//! read (caches behind `OnceLock`s and atomics, so whoever comes first
//! computes a value once and the other uses it). Results never depend on
//! the helpers: they stop where the walk is, and the walk does everything
//! itself that a helper has not done yet.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{Builder, Scope};

/// The shortest list for which helpers are started unasked: below it,
/// starting a thread costs more than it saves.
pub(crate) const MIN_ITEMS: usize = 32;

/// The most threads used unasked: the work is bound by memory latency, and
/// a controller should not take a large machine for one simulation.
pub(crate) const MAX_AUTO_THREADS: usize = 8;

/// Where the walk and the helpers are in a list.
#[derive(Debug)]
pub(crate) struct Ahead {
    /// Items before this one are left to the helpers (they take
    /// `back - 1`).
    back: AtomicUsize,
    /// The item the walk is at.
    front: AtomicUsize,
    stopped: AtomicBool,
}

impl Ahead {
    pub(crate) fn new(len: usize) -> Self {
        Ahead {
            back: AtomicUsize::new(len),
            front: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    /// The walk is at item `i`: helpers take nothing at or before it.
    pub(crate) fn reached(&self, i: usize) {
        self.front.fetch_max(i, Ordering::Relaxed);
    }

    /// The next item for a helper, from the back; `None` once it meets the
    /// walk or the walk is over.
    pub(crate) fn take(&self) -> Option<usize> {
        let mut back = self.back.load(Ordering::Relaxed);
        loop {
            if self.stopped.load(Ordering::Relaxed) || back == 0 {
                return None;
            }
            let item = back - 1;
            if item <= self.front.load(Ordering::Relaxed) {
                return None;
            }
            match self
                .back
                .compare_exchange_weak(back, item, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(item),
                Err(now) => back = now,
            }
        }
    }

    /// The walk is over: helpers finish the item they hold and leave.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// Stops the helpers when dropped, so that an early return (an error met
/// by the walk) does not wait for them to finish the list.
pub(crate) struct StopOnDrop<'a>(pub &'a Ahead);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Threads to use on a list of `items` when `requested` (0: as many as
/// the machine offers, up to [`MAX_AUTO_THREADS`], and only for lists of
/// [`MIN_ITEMS`] or more); never more than there are items.
pub(crate) fn threads(requested: usize, items: usize) -> usize {
    let threads = match requested {
        0 if items < MIN_ITEMS => 1,
        0 => std::thread::available_parallelism()
            .map_or(1, NonZeroUsize::get)
            .min(MAX_AUTO_THREADS),
        n => n,
    };
    threads.min(items).max(1)
}

/// Starts `helpers` threads in `scope` that run `work` on the items
/// `ahead` hands out. A thread that cannot be started is simply not
/// there: the walk does its share.
pub(crate) fn spawn_helpers<'scope, F>(
    scope: &'scope Scope<'scope, '_>,
    ahead: &'scope Ahead,
    helpers: usize,
    work: &'scope F,
) where
    F: Fn(usize) + Sync,
{
    spawn_helpers_with(scope, ahead, helpers, move |(): &mut (), item| work(item));
}

/// [`spawn_helpers`] where each helper keeps a state `S` (made by the
/// helper, starting from `S::default()`) from one item to the next.
pub(crate) fn spawn_helpers_with<'scope, S, F>(
    scope: &'scope Scope<'scope, '_>,
    ahead: &'scope Ahead,
    helpers: usize,
    work: F,
) where
    S: Default,
    F: Fn(&mut S, usize) + Send + Copy + 'scope,
{
    for _ in 0..helpers {
        let spawned = Builder::new()
            .name("allocator-helper".to_owned())
            .spawn_scoped(scope, move || {
                let mut state = S::default();
                while let Some(item) = ahead.take() {
                    work(&mut state, item);
                }
            });
        if spawned.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn helpers_take_from_the_back_until_they_meet_the_walk() {
        let ahead = Ahead::new(10);
        assert_eq!(ahead.take(), Some(9));
        assert_eq!(ahead.take(), Some(8));
        ahead.reached(6);
        assert_eq!(ahead.take(), Some(7));
        assert_eq!(ahead.take(), None);
        let ahead = Ahead::new(3);
        ahead.stop();
        assert_eq!(ahead.take(), None);
        assert_eq!(Ahead::new(0).take(), None);
        // the walk's first item is never taken
        let ahead = Ahead::new(1);
        assert_eq!(ahead.take(), None);
    }

    #[test]
    fn every_item_is_taken_at_most_once_and_the_walk_covers_the_rest() {
        let ahead = Ahead::new(1000);
        let taken = Mutex::new(Vec::new());
        let work = |i: usize| taken.lock().unwrap().push(i);
        let mut walked = Vec::new();
        std::thread::scope(|scope| {
            let _stop = StopOnDrop(&ahead);
            spawn_helpers(scope, &ahead, 3, &work);
            for i in 0..1000 {
                ahead.reached(i);
                walked.push(i);
            }
        });
        let taken = taken.into_inner().unwrap();
        let mut sorted = taken.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), taken.len(), "an item was taken twice");
        assert!(taken.iter().all(|&i| i > 0 && i < 1000));
        assert_eq!(walked.len(), 1000);
    }

    #[test]
    fn zero_threads_means_the_machine_for_long_lists() {
        let machine = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(threads(0, 1000), machine.min(MAX_AUTO_THREADS));
        assert_eq!(threads(0, MIN_ITEMS - 1), 1);
        assert_eq!(threads(3, 1000), 3);
        assert_eq!(threads(3, 2), 2);
        assert_eq!(threads(3, 0), 1);
        assert_eq!(threads(1, 1000), 1);
    }
}
