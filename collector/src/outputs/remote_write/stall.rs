//! The collector's own stall, and the samples it leaves behind another collector's.
//!
//! **The rule (two collectors, one series).** A collector that did not run for longer than
//! its dead-peer time (`control.heartbeat_interval_seconds ×
//! control.dead_after_missed_heartbeats`: a `SIGSTOP`/`SIGCONT`, a VM pause, a swap storm)
//! must assume that every agent connected to it declared the session dead by the same rule
//! (DESIGN.md §6, one dead-peer rule on both sides) and moved to the next collector of its
//! pool, which has been writing the agent's newer samples since. The samples this collector
//! still holds for those agents are older than those: a receiver refuses them as out of
//! order (Prometheus answers the whole request `400`). So when it notices the stall — the
//! first of its worker, its senders or a 250 ms tick to run again sees a gap longer than the
//! dead-peer time since the last time any of them ran (monotonic clock, which runs on while
//! the process is stopped) — it
//!
//! * drops every sample still queued or taken for a request and not sent yet, and
//! * for one dead-peer time after, every sample handed to it that is stamped before the
//!   moment it noticed (collector clock, Unix ms): the agents' frames the kernel buffered
//!   during the stall and the worker decodes now,
//!
//! counted in `uctel_collector_remote_write_samples_dropped_total{reason="agent_moved"}`
//! and logged once per endpoint with the count. Agents whose session survives (their own
//! dead-peer time is longer than the stall) lose the same samples, counted: the collector
//! cannot tell them apart. The rule is keyed on the collector's own stall only: an agent
//! that dies (`SIGKILL`, a session that ends without `Goodbye`) while this collector runs
//! loses nothing queued, since no other collector can have written its series meanwhile
//! without the agent having left this one first.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the watch task checks even with no traffic.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// A detected stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stall {
    /// How long nothing ran (at least the dead-peer time).
    pub(crate) gap: Duration,
    /// Samples stamped before this (Unix ms) are dropped.
    pub(crate) before_ms: i64,
}

/// Notices the collector's stalls and holds the fence after one (module docs).
#[derive(Debug)]
pub(crate) struct StallWatch {
    base: Instant,
    /// Nanoseconds since `base` of the latest check.
    last_ns: AtomicU64,
    /// Dead-peer time, ns.
    threshold_ns: u64,
    /// Nanoseconds since `base` until which the fence holds (0: none yet).
    fence_until_ns: AtomicU64,
    /// Samples stamped before this (Unix ms) are behind the fence.
    fence_before_ms: AtomicI64,
}

impl StallWatch {
    /// A watch that calls a gap longer than `dead_peer` a stall; `now` is its first check.
    pub(crate) fn new(dead_peer: Duration, now: Instant) -> StallWatch {
        StallWatch {
            base: now,
            last_ns: AtomicU64::new(0),
            threshold_ns: u64::try_from(dead_peer.as_nanos()).unwrap_or(u64::MAX),
            fence_until_ns: AtomicU64::new(0),
            fence_before_ms: AtomicI64::new(i64::MIN),
        }
    }

    fn ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records that the collector runs at `now` (`now_ms`: the same moment, Unix ms).
    /// `Some` for exactly one caller per stall: the one that noticed it, which then drops
    /// what is queued.
    pub(crate) fn check(&self, now: Instant, now_ms: i64) -> Option<Stall> {
        let now_ns = self.ns(now);
        let last = self.last_ns.fetch_max(now_ns, Ordering::AcqRel);
        let gap = now_ns.checked_sub(last)?;
        if gap <= self.threshold_ns {
            return None;
        }
        self.fence_before_ms.store(now_ms, Ordering::Release);
        self.fence_until_ns
            .store(now_ns.saturating_add(self.threshold_ns), Ordering::Release);
        Some(Stall {
            gap: Duration::from_nanos(gap),
            before_ms: now_ms,
        })
    }

    /// The fence at `now`: samples stamped before the returned Unix ms are dropped
    /// (`None`: no fence).
    pub(crate) fn fence(&self, now: Instant) -> Option<i64> {
        let until = self.fence_until_ns.load(Ordering::Acquire);
        (until != 0 && self.ns(now) < until).then(|| self.fence_before_ms.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_longer_than_the_dead_peer_time_is_noticed_once_and_fences_older_samples() {
        let t0 = Instant::now();
        let w = StallWatch::new(Duration::from_secs(3), t0);
        let ms = 1_000_000;
        // Running on time: no stall, no fence.
        for k in 1..=20 {
            assert_eq!(w.check(t0 + TICK * k, ms), None);
        }
        assert_eq!(w.fence(t0 + TICK * 20), None);
        // A gap of exactly the dead-peer time is not a stall.
        let t1 = t0 + TICK * 20 + Duration::from_secs(3);
        assert_eq!(w.check(t1, ms), None);
        // Frozen 20 s: the first to run notices, the others do not.
        let t2 = t1 + Duration::from_secs(20);
        let s = w.check(t2, ms + 23_000).expect("stall noticed");
        assert_eq!(s.gap, Duration::from_secs(20));
        assert_eq!(s.before_ms, ms + 23_000);
        assert_eq!(w.check(t2, ms + 23_000), None);
        assert_eq!(w.check(t2 + TICK, ms + 23_250), None);
        // The fence holds one dead-peer time, then lifts.
        assert_eq!(w.fence(t2 + Duration::from_secs(2)), Some(ms + 23_000));
        assert_eq!(w.fence(t2 + Duration::from_secs(3)), None);
        // A check from a thread that read its clock before another's later check.
        assert_eq!(w.check(t2, ms), None);
    }
}
