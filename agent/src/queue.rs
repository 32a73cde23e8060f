//! The bounded queue between a source and the sender.
//!
//! Sources are never blocked (DESIGN.md §7, the Fluent Bit "paused forever" lesson): a source
//! offers a batch with [`RecordQueue::offer`], which takes what fits and hands back the count
//! that did not; the source counts those as `source_overflow`. The sender takes records with
//! [`RecordQueue::take`] and waits for more with [`RecordQueue::notified`]. Capacity is in
//! records, not batches, so memory is bounded whatever the batch sizes.
//!
//! A `Mutex<VecDeque>` is enough here: one producer and one consumer per queue, a few
//! thousand records per second, and the critical sections are a `VecDeque` append.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// A bounded multi-producer single-consumer queue of records. Clone to share.
#[derive(Debug)]
pub struct RecordQueue<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for RecordQueue<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Debug)]
struct Inner<T> {
    /// Changed by a reload ([`RecordQueue::set_capacity`]).
    capacity: AtomicUsize,
    items: Mutex<VecDeque<T>>,
    notify: Notify,
}

impl<T> RecordQueue<T> {
    /// A queue holding at most `capacity` records (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity: AtomicUsize::new(capacity.max(1)),
                items: Mutex::new(VecDeque::new()),
                notify: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        // A panic while holding the lock cannot leave a VecDeque half-updated in a way
        // that matters here; keep going with the data.
        self.inner
            .items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Capacity in records.
    pub fn capacity(&self) -> usize {
        self.inner.capacity.load(Ordering::Relaxed)
    }

    /// Sets the capacity to `capacity` records (at least 1), e.g. at a reload. Records
    /// queued stay queued whatever the new capacity: a queue holding more than a smaller
    /// capacity takes no new record until the sender has taken it below.
    pub fn set_capacity(&self, capacity: usize) {
        self.inner
            .capacity
            .store(capacity.max(1), Ordering::Relaxed);
    }

    /// Records queued now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Free places now.
    pub fn vacancy(&self) -> usize {
        self.capacity().saturating_sub(self.len())
    }

    /// Appends as many records of `batch`, in order, as fit; never blocks. Returns how many
    /// did **not** fit (the tail of the batch), which the caller counts as
    /// `source_overflow`.
    pub fn offer(&self, batch: impl IntoIterator<Item = T>) -> usize {
        let mut rejected = 0;
        let mut added = false;
        let capacity = self.capacity();
        {
            let mut q = self.lock();
            for item in batch {
                if q.len() < capacity {
                    q.push_back(item);
                    added = true;
                } else {
                    rejected += 1;
                }
            }
        }
        if added {
            self.inner.notify.notify_one();
        }
        rejected
    }

    /// Removes up to `max` records from the front.
    pub fn take(&self, max: usize) -> Vec<T> {
        let mut q = self.lock();
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// Removes the record at the front, if any.
    pub fn pop(&self) -> Option<T> {
        self.lock().pop_front()
    }

    /// Removes everything.
    pub fn take_all(&self) -> Vec<T> {
        self.lock().drain(..).collect()
    }

    /// Completes after the next successful [`RecordQueue::offer`] (or at once if one
    /// happened since the last wait). Cancel-safe.
    pub async fn notified(&self) {
        self.inner.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offer_takes_what_fits_and_reports_the_rest() {
        let q = RecordQueue::new(3);
        assert_eq!(q.offer([1, 2]), 0);
        assert_eq!(q.offer([3, 4, 5]), 2);
        assert_eq!(q.len(), 3);
        assert_eq!(q.vacancy(), 0);
        assert_eq!(q.take(2), vec![1, 2]);
        assert_eq!(q.offer([6]), 0);
        assert_eq!(q.take_all(), vec![3, 6]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_changed_capacity_keeps_what_is_queued() {
        let q = RecordQueue::new(2);
        assert_eq!(q.offer([1, 2, 3]), 1);
        q.set_capacity(4);
        assert_eq!(q.offer([3, 4, 5]), 1);
        q.set_capacity(1);
        assert_eq!((q.len(), q.vacancy()), (4, 0));
        assert_eq!(q.offer([6]), 1);
        assert_eq!(q.take_all(), vec![1, 2, 3, 4]);
        assert_eq!(q.offer([7, 8]), 1);
    }

    #[test]
    fn zero_capacity_is_raised_to_one() {
        let q = RecordQueue::new(0);
        assert_eq!(q.offer(["a", "b"]), 1);
    }

    #[tokio::test]
    async fn notified_wakes_after_an_offer_from_another_thread() {
        let q = RecordQueue::new(10);
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.offer([1u32]));
        q.notified().await;
        assert_eq!(t.join().ok(), Some(0));
        assert_eq!(q.take(10), vec![1]);
    }
}
