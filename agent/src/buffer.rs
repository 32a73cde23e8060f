//! The metrics buffer: metric samples held while the agent has no connection to a collector
//! (a collector restart, a pool move, a drain), sent first after the next `Welcome`.
//!
//! ```text
//!  sources ─► metrics queue ─┬─ connected, caught up ──────────────────────► SenderCore
//!                            └─ no session, catching up ─► DisconnectedBuffer ─┘ first,
//!                                                                  as credits allow
//!  session lost / moving on: samples still in the pipeline ─► front of the buffer
//! ```
//!
//! Rules:
//!
//! - **Bounded in records** (`streams.metrics.buffer_while_disconnected_records`); 0 turns
//!   the buffer off (every sample collected while disconnected is dropped as
//!   `not_connected`, a sample being fresh or worthless).
//! - **The newest are kept.** When full, the *oldest* samples are dropped and counted as
//!   `not_connected`: metrics carry state (DESIGN.md §3 rule 2), so the newest sample of a
//!   series supersedes the older ones, and the gap is left where the outage began. Order
//!   is not at stake: what is kept is a contiguous, time-ordered tail.
//! - **Samples keep their collection time.** A sample without its own timestamp
//!   (`timestamp_ms` 0, "the frame's timestamp") is stamped when it enters the buffer:
//!   taken from the queue as soon as the source offered it, or from the frame it was
//!   pushed into (its push time) when it comes back from the pipeline. A frame built after
//!   the reconnect would otherwise stamp it with the send time.
//! - **In collection order, as credits allow.** After the next `Welcome` the sender takes
//!   the buffer first, as the credits allow (a backlog is never dropped as `no_credit`), and
//!   until it has caught up (the buffer empty, every credit back) the samples the sources
//!   collect meanwhile join the buffer's tail, stamped as they arrive
//!   ([`crate::sender::pump::pull`]). Per series the samples go out oldest first, the
//!   buffered ones before every newer collection, each with its own time: a receiver that
//!   wants samples in order per series (Prometheus remote-write) gets them in order.
//!
//! A `Mutex<VecDeque>` as in [`crate::queue`]: one producer at a time (the connection loop
//! between sessions, the session when it ends or while it catches up) and one consumer (the
//! session).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use uctel_protocol::payload::Metric;

/// Default capacity in samples: about 5 MiB (a sample takes about 260 bytes in memory,
/// measured on the host collection of a small server, about 440 samples), some 37 host
/// collections: six minutes at the default 10 s interval, more than a collector restart
/// (5–8 s) or a move within the pool takes.
pub const DEFAULT_BUFFER_RECORDS: usize = 16384;

/// A bounded buffer of metric samples, the newest kept. Clone to share.
#[derive(Debug, Clone)]
pub struct DisconnectedBuffer {
    /// Shared by the clones; grown by a reload ([`DisconnectedBuffer::grow`]).
    capacity: Arc<AtomicUsize>,
    items: Arc<Mutex<VecDeque<Metric>>>,
}

impl DisconnectedBuffer {
    /// A buffer holding at most `capacity` samples (0: none).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: Arc::new(AtomicUsize::new(capacity)),
            items: Arc::new(Mutex::new(VecDeque::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Metric>> {
        self.items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Capacity in samples.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Raises the capacity to `capacity` samples (a reload); a smaller value changes
    /// nothing (shrinking would drop samples held: a restart applies it).
    pub fn grow(&self, capacity: usize) {
        self.capacity.fetch_max(capacity, Ordering::Relaxed);
    }

    /// Samples held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `records` (newer than everything held), stamping those without a timestamp
    /// with `now_ms` (ms since the Unix epoch). Returns how many samples were dropped, the
    /// oldest first, to stay within the capacity; the caller counts them as
    /// `not_connected`.
    pub fn hold(&self, records: Vec<Metric>, now_ms: i64) -> u64 {
        let mut q = self.lock();
        for mut m in records {
            if m.timestamp_ms == 0 {
                m.timestamp_ms = now_ms;
            }
            q.push_back(m);
        }
        self.trim(&mut q)
    }

    /// Puts `records` back in front of everything held (samples taken from the buffer or
    /// the queue earlier, in their order), each already stamped. Returns how many samples
    /// were dropped, the oldest first, to stay within the capacity.
    pub fn hold_front(&self, records: Vec<Metric>) -> u64 {
        let mut q = self.lock();
        for m in records.into_iter().rev() {
            q.push_front(m);
        }
        self.trim(&mut q)
    }

    fn trim(&self, q: &mut VecDeque<Metric>) -> u64 {
        let excess = q.len().saturating_sub(self.capacity());
        q.drain(..excess);
        excess as u64
    }

    /// Removes up to `max` samples, the oldest first.
    pub fn take(&self, max: usize) -> Vec<Metric> {
        let mut q = self.lock();
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// Removes everything.
    pub fn take_all(&self) -> Vec<Metric> {
        self.lock().drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(value: f64, timestamp_ms: i64) -> Metric {
        Metric {
            name: "node_load1".into(),
            value,
            timestamp_ms,
            ..Metric::default()
        }
    }

    fn values(v: &[Metric]) -> Vec<f64> {
        v.iter().map(|m| m.value).collect()
    }

    #[test]
    fn hold_stamps_unstamped_samples_and_keeps_their_own_timestamps() {
        let b = DisconnectedBuffer::new(10);
        assert_eq!(b.hold(vec![m(1.0, 0), m(2.0, 42)], 1_700_000_000_000), 0);
        let got = b.take_all();
        assert_eq!(got[0].timestamp_ms, 1_700_000_000_000);
        assert_eq!(got[1].timestamp_ms, 42, "a source's own timestamp is kept");
    }

    #[test]
    fn when_full_the_oldest_are_dropped_and_counted() {
        let b = DisconnectedBuffer::new(3);
        assert_eq!(b.hold(vec![m(1.0, 1), m(2.0, 2)], 9), 0);
        assert_eq!(b.hold(vec![m(3.0, 3), m(4.0, 4), m(5.0, 5)], 9), 2);
        assert_eq!(b.len(), 3);
        assert_eq!(values(&b.take(2)), vec![3.0, 4.0]);
        assert_eq!(values(&b.take(9)), vec![5.0]);
        assert!(b.is_empty());
    }

    #[test]
    fn samples_put_back_go_first_and_the_oldest_of_them_go_when_full() {
        let b = DisconnectedBuffer::new(4);
        assert_eq!(b.hold(vec![m(5.0, 5), m(6.0, 6)], 9), 0);
        assert_eq!(b.hold_front(vec![m(1.0, 1), m(2.0, 2), m(3.0, 3)]), 1);
        assert_eq!(values(&b.take_all()), vec![2.0, 3.0, 5.0, 6.0]);
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let b = DisconnectedBuffer::new(0);
        assert_eq!(b.hold(vec![m(1.0, 0), m(2.0, 0)], 9), 2);
        assert_eq!(b.hold_front(vec![m(0.0, 1)]), 1);
        assert!(b.is_empty());
    }
}
