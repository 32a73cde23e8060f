//! One signal's bounded queue of items waiting for an export request, under one lock.
//!
//! An item is pending from the moment it is queued until it is settled, once: sent (the
//! receiver accepted its request) or dropped by a [`Dropped`] reason. Items the sender took
//! for a request stay pending while it is in flight and being retried. When the queue holds
//! `capacity` items, a new one pushes the oldest out (`queue_full`). Every counter changes
//! only under the lock, so `items_in = sent + dropped + pending` holds at every scrape.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::metrics::{Counters, Dropped};
use crate::outputs::http::LogLimiter;

/// What the lock guards.
#[derive(Debug)]
pub(crate) struct State<T> {
    items: VecDeque<(Instant, T)>,
    /// When the oldest queued item arrived, or the last take left items behind (the batch
    /// deadline runs from it).
    oldest: Option<Instant>,
    /// Drop lines, at most one per reason every 10 s.
    pub(crate) log: LogLimiter,
}

/// The queue of one signal.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    state: Mutex<State<T>>,
    /// Woken when the queue gets its first item or a full request.
    pub(crate) wake: tokio::sync::Notify,
    /// Items per request.
    pub(crate) max_items: usize,
    capacity: usize,
    /// `metrics` or `logs`.
    pub(crate) signal: &'static str,
    /// The signal's counters (changed only under the lock).
    pub(crate) counters: Counters,
}

impl<T> Queue<T> {
    /// An empty queue of at most `capacity` items, `max_items` per request.
    pub(crate) fn new(
        signal: &'static str,
        capacity: usize,
        max_items: usize,
        counters: Counters,
    ) -> Queue<T> {
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                oldest: None,
                log: LogLimiter::default(),
            }),
            wake: tokio::sync::Notify::new(),
            max_items: max_items.max(1),
            capacity: capacity.max(1),
            signal,
            counters,
        }
    }

    /// The state, locked (a poisoned lock is taken over: the state stays consistent
    /// between statements).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `items` (the worker thread: never waits for the network).
    pub(crate) fn push(&self, items: impl IntoIterator<Item = T>, now: Instant) {
        let mut st = self.lock();
        let mut wake = false;
        let mut pushed_out = 0u64;
        for item in items {
            if st.items.len() >= self.capacity && st.items.pop_front().is_some() {
                pushed_out += 1;
            }
            st.items.push_back((now, item));
            self.counters.queued(1);
            if st.items.len() == 1 {
                st.oldest = Some(now);
                wake = true;
            }
            wake |= st.items.len() == self.max_items;
        }
        if pushed_out > 0 {
            self.dropped_locked(&mut st, pushed_out, Dropped::QueueFull, "queue full");
        }
        drop(st);
        if wake {
            self.wake.notify_one();
        }
    }

    /// A request's items if one is due at `now` (a full one, the deadline passed, or
    /// `flush`); else when the next is due (`None`: when an item arrives).
    pub(crate) fn due(
        &self,
        now: Instant,
        deadline: std::time::Duration,
        flush: bool,
    ) -> Result<Vec<T>, Option<Instant>> {
        let mut st = self.lock();
        let at = st.oldest.map(|t| t + deadline);
        let full = st.items.len() >= self.max_items;
        if !st.items.is_empty() && (full || flush || at.is_some_and(|d| d <= now)) {
            let n = st.items.len().min(self.max_items);
            let batch: Vec<T> = st.items.drain(..n).map(|(_, t)| t).collect();
            st.oldest = (!st.items.is_empty()).then_some(now);
            Ok(batch)
        } else {
            Err(at)
        }
    }

    /// Seconds the oldest queued item has waited at `now` (0 when none waits).
    pub(crate) fn oldest_age(st: &State<T>, now: Instant) -> f64 {
        st.items.front().map_or(0.0, |(t, _)| {
            now.saturating_duration_since(*t).as_secs_f64()
        })
    }

    /// Settles `n` in-flight items as sent.
    pub(crate) fn settle_sent(&self, n: usize) {
        let _st = self.lock();
        self.counters.sent(n as u64);
    }

    /// Settles `n` in-flight items as dropped for `reason` (`detail` for the drop log).
    pub(crate) fn settle_dropped(&self, n: usize, reason: Dropped, detail: &str) {
        let mut st = self.lock();
        self.dropped_locked(&mut st, n as u64, reason, detail);
    }

    /// Settles `sent` items as sent and `rejected` as dropped for `reason`, at one instant.
    pub(crate) fn settle_split(&self, sent: usize, rejected: usize, reason: Dropped) {
        let _st = self.lock();
        self.counters.sent(sent as u64);
        if rejected > 0 {
            self.counters.dropped(reason, rejected as u64);
        }
    }

    /// Drops every queued item (`reason`), e.g. at shutdown. Returns how many.
    pub(crate) fn drop_queued(&self, reason: Dropped, detail: &str) -> usize {
        let mut st = self.lock();
        let n = st.items.len();
        st.items.clear();
        st.oldest = None;
        self.dropped_locked(&mut st, n as u64, reason, detail);
        n
    }

    fn dropped_locked(&self, st: &mut State<T>, n: u64, reason: Dropped, detail: &str) {
        if n == 0 {
            return;
        }
        self.counters.dropped(reason, n);
        if st.log.due(reason.as_str()) {
            tracing::warn!(
                signal = self.signal,
                reason = reason.as_str(),
                items = n,
                %detail,
                "OTLP items dropped; counted in \
                 uctel_collector_otlp_items_dropped_total{{signal,reason}} (logged at most \
                 once per 10 s per reason)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn queue(capacity: usize, max: usize) -> Queue<u32> {
        let f = super::super::metrics::Families::new().unwrap();
        Queue::new("logs", capacity, max, f.signal("logs"))
    }

    /// `items_in = sent + dropped + pending`.
    fn balanced(q: &Queue<u32>) -> bool {
        let _st = q.lock();
        let s = q.counters.snapshot();
        s.items_in as i64 == s.sent as i64 + s.dropped() as i64 + s.pending
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_every_item_is_settled_once() {
        let q = queue(3, 2);
        let now = Instant::now();
        q.push(0..5, now);
        let s = q.counters.snapshot();
        assert_eq!(
            (s.items_in, s.dropped_for(Dropped::QueueFull), s.pending),
            (5, 2, 3)
        );
        assert!(balanced(&q));
        let batch = q.due(now, Duration::from_secs(1), false).unwrap();
        assert_eq!(batch, [2, 3], "items 0 and 1 made room");
        assert!(balanced(&q), "in-flight items stay pending");
        q.settle_split(1, 1, Dropped::PartialSuccess);
        assert!(balanced(&q));
        assert_eq!(
            q.due(now, Duration::from_secs(1), false).unwrap_err(),
            Some(now + Duration::from_secs(1))
        );
        assert_eq!(q.drop_queued(Dropped::Shutdown, "test"), 1);
        let s = q.counters.snapshot();
        assert_eq!(
            (
                s.sent,
                s.dropped_for(Dropped::PartialSuccess),
                s.dropped_for(Dropped::Shutdown),
                s.pending
            ),
            (1, 1, 1, 0)
        );
        assert!(balanced(&q));
    }
}
