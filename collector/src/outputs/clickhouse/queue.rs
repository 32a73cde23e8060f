//! The bounded queue of rows waiting for an `INSERT`, under one lock.
//!
//! A row is pending from the moment it is queued until it is settled, once: inserted
//! (the server acknowledged its `INSERT`) or dropped by a [`Dropped`] reason. Rows the
//! sender took for a request stay pending while it is in flight and being retried. When
//! the queue holds `capacity` rows, a new one pushes the oldest out (`queue_full`). Every
//! counter changes only under the lock, so `rows_in = inserted + dropped + pending` holds
//! at every scrape. A dropped row is counted here only, not in the agent's
//! `records_dropped_total`: the rule for every asynchronous output (`crate::outputs`
//! module docs, "Drops").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::metrics::{Counters, Dropped};
use crate::outputs::http::LogLimiter;

/// One encoded row (a `JSONEachRow` object without the newline) and its agent.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// The agent the record came from.
    pub(crate) agent: Arc<str>,
    /// The JSON object.
    pub(crate) json: Box<[u8]>,
}

/// What the lock guards.
#[derive(Debug)]
pub(crate) struct State {
    rows: VecDeque<Row>,
    /// When the oldest queued row arrived, or the last take left rows behind (the batch
    /// deadline runs from it).
    oldest: Option<Instant>,
    /// Drop lines, at most one per reason every 10 s.
    log: LogLimiter,
}

/// The queue.
#[derive(Debug)]
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Woken when the queue gets its first row or a full request.
    pub(crate) wake: tokio::sync::Notify,
    /// Rows per `INSERT`.
    pub(crate) max_rows: usize,
    capacity: usize,
    /// The output's counters (changed only under the lock; shared with the queue of the
    /// endpoint a reload put in its place, whose lock the scrape holds too).
    pub(crate) counters: Arc<Counters>,
}

impl Queue {
    /// An empty queue of at most `capacity` rows, `max_rows` per `INSERT`.
    pub(crate) fn new(capacity: usize, max_rows: usize, counters: Arc<Counters>) -> Queue {
        Queue {
            state: Mutex::new(State {
                rows: VecDeque::new(),
                oldest: None,
                log: LogLimiter::default(),
            }),
            wake: tokio::sync::Notify::new(),
            max_rows: max_rows.max(1),
            capacity: capacity.max(1),
            counters,
        }
    }

    /// The state, locked (a poisoned lock is taken over: the state stays consistent
    /// between statements).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `rows` (the worker thread: never waits for the network).
    pub(crate) fn push(&self, rows: impl IntoIterator<Item = Row>, now: Instant) {
        let mut st = self.lock();
        let mut wake = false;
        let mut pushed_out = Vec::new();
        for row in rows {
            if st.rows.len() >= self.capacity {
                if let Some(old) = st.rows.pop_front() {
                    pushed_out.push(old);
                }
            }
            st.rows.push_back(row);
            self.counters.queued(1);
            if st.rows.len() == 1 {
                st.oldest = Some(now);
                wake = true;
            }
            wake |= st.rows.len() == self.max_rows;
        }
        if !pushed_out.is_empty() {
            self.settle_dropped_locked(&mut st, &pushed_out, Dropped::QueueFull, "queue full");
        }
        drop(st);
        if wake {
            self.wake.notify_one();
        }
    }

    /// A request's rows if one is due at `now` (a full one, the deadline passed, or
    /// `flush`); else when the next is due (`None`: when a row arrives).
    pub(crate) fn due(
        &self,
        now: Instant,
        deadline: std::time::Duration,
        flush: bool,
    ) -> Result<Vec<Row>, Option<Instant>> {
        let mut st = self.lock();
        let at = st.oldest.map(|t| t + deadline);
        let full = st.rows.len() >= self.max_rows;
        if !st.rows.is_empty() && (full || flush || at.is_some_and(|d| d <= now)) {
            let n = st.rows.len().min(self.max_rows);
            let batch: Vec<Row> = st.rows.drain(..n).collect();
            st.oldest = (!st.rows.is_empty()).then_some(now);
            Ok(batch)
        } else {
            Err(at)
        }
    }

    /// Rows queued (not in flight).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.lock().rows.len()
    }

    /// Settles in-flight `rows` as inserted.
    pub(crate) fn settle_inserted(&self, rows: &[Row]) {
        let _st = self.lock();
        self.counters.inserted(rows.len() as u64);
    }

    /// Settles in-flight `rows` as dropped for `reason` (`detail` for the drop log).
    pub(crate) fn settle_dropped(&self, rows: &[Row], reason: Dropped, detail: &str) {
        let mut st = self.lock();
        self.settle_dropped_locked(&mut st, rows, reason, detail);
    }

    /// Drops every queued row (`reason`), e.g. at shutdown. Returns how many.
    pub(crate) fn drop_queued(&self, reason: Dropped, detail: &str) -> usize {
        let mut st = self.lock();
        let rows: Vec<Row> = st.rows.drain(..).collect();
        st.oldest = None;
        self.settle_dropped_locked(&mut st, &rows, reason, detail);
        rows.len()
    }

    fn settle_dropped_locked(&self, st: &mut State, rows: &[Row], reason: Dropped, detail: &str) {
        if rows.is_empty() {
            return;
        }
        self.counters.dropped(reason, rows.len() as u64);
        if st.log.due(reason.as_str()) {
            tracing::warn!(
                reason = reason.as_str(),
                rows = rows.len(),
                agent = %rows[0].agent,
                %detail,
                "ClickHouse rows dropped; counted in \
                 uctel_collector_clickhouse_rows_dropped_total{{reason}} (logged at most once \
                 per 10 s per reason)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn row(agent: &str, n: u32) -> Row {
        Row {
            agent: Arc::from(agent),
            json: format!("{{\"n\":{n}}}").into_bytes().into_boxed_slice(),
        }
    }

    fn queue(capacity: usize, max_rows: usize) -> Queue {
        Queue::new(capacity, max_rows, Arc::new(Counters::new().unwrap()))
    }

    /// `rows_in = inserted + dropped + pending`.
    fn balanced(q: &Queue) -> bool {
        let _st = q.lock();
        let s = q.counters.snapshot();
        s.rows_in as i64 == s.inserted as i64 + s.dropped() as i64 + s.pending
    }

    #[test]
    fn full_queue_drops_the_oldest_and_counts_them() {
        let q = queue(3, 2);
        let now = Instant::now();
        q.push(
            (0..5).map(|n| row(if n % 2 == 0 { "a" } else { "b" }, n)),
            now,
        );
        let s = q.counters.snapshot();
        assert_eq!((s.rows_in, s.queue_full, s.pending), (5, 2, 3));
        assert!(balanced(&q));
        // Rows 0 (a) and 1 (b) made room.
        let batch = q.due(now, Duration::from_secs(1), false).unwrap();
        assert_eq!(
            batch.iter().map(|r| &*r.json).collect::<Vec<_>>(),
            [&b"{\"n\":2}"[..], b"{\"n\":3}"]
        );
    }

    #[test]
    fn a_request_is_due_when_full_at_the_deadline_or_when_flushing() {
        let q = queue(100, 3);
        let t0 = Instant::now();
        let d = Duration::from_millis(500);
        assert_eq!(q.due(t0, d, false).unwrap_err(), None);
        q.push([row("a", 0)], t0);
        assert_eq!(q.due(t0, d, false).unwrap_err(), Some(t0 + d));
        assert_eq!(q.due(t0 + d, d, false).unwrap().len(), 1);
        q.push((1..5).map(|n| row("a", n)), t0);
        assert_eq!(q.due(t0, d, false).unwrap().len(), 3);
        assert_eq!(q.due(t0, d, true).unwrap().len(), 1);
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn every_row_is_settled_once_and_the_sum_holds() {
        let q = queue(10, 4);
        let now = Instant::now();
        q.push((0..10).map(|n| row("a", n)), now);
        let first = q.due(now, Duration::ZERO, false).unwrap();
        assert!(balanced(&q), "in flight rows stay pending");
        q.settle_inserted(&first);
        let second = q.due(now, Duration::ZERO, false).unwrap();
        q.settle_dropped(&second, Dropped::Rejected, "test");
        assert!(balanced(&q));
        assert_eq!(q.drop_queued(Dropped::Shutdown, "test"), 2);
        let s = q.counters.snapshot();
        assert_eq!(
            (s.rows_in, s.inserted, s.rejected, s.shutdown, s.pending),
            (10, 4, 4, 2, 0)
        );
        assert!(balanced(&q));
    }
}
