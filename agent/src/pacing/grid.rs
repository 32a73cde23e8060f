//! Sampling instants aligned to the Unix epoch: `k × interval + offset` nanoseconds since
//! 1970-01-01T00:00:00Z, the wall-clock-aligned sampling of OVIS LDMS (`ldmsd` samplers'
//! `interval` + `offset`, both in µs there). Every agent with the same interval and offset
//! samples the same instants, so a fabric-wide event lines up across hosts.
//!
//! Sans-IO: [`Grid`] is handed the wall-clock time (`now_unix_ns`) and answers how long to
//! wait and which instant a round belongs to; the source loops read the clock and sleep.
//!
//! Rules:
//! - The first round is the first instant at or after the time the source started (never an
//!   unaligned round at start).
//! - A round that wakes late takes the latest instant not after `now`; the instants between
//!   the previous round and it were not sampled and are reported in [`GridRound::missed`]
//!   (the loops count them in `uctel_agent_missed_rounds_total{source}`); rounds are never
//!   bunched to catch up (unlike `tokio::time::MissedTickBehavior::Burst`, and unlike
//!   `Skip`/`Delay`, which keep the phase of the loop's start rather than of the epoch).
//! - A wake-up before the next instant (a spurious wake, or the wall clock slewed or
//!   stepped back less than one interval) is no round: [`Grid::begin`] answers `None` and
//!   the loop waits again.
//! - The wall clock stepped back by more than one interval (the next instant is more than
//!   two intervals ahead): the grid re-seats at the first
//!   instant at or after `now` (nothing is counted missed). Stepped forward: the instants it
//!   jumps over count as missed, as they were not sampled.

use std::time::Duration;

/// The aligned instants of one source, and which of them have been sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// Nanoseconds between instants; ≥ 1000 (1 µs).
    interval_ns: u64,
    /// Nanoseconds after each whole multiple of `interval_ns`; `< interval_ns`.
    offset_ns: u64,
    /// The index of the next instant to sample; `None` before the first [`Grid::wait`].
    next: Option<u64>,
}

/// One round of a [`Grid`]: the instant it samples and the instants skipped before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridRound {
    /// The instant `index × interval + offset`, ns since the Unix epoch.
    pub scheduled_unix_ns: u64,
    /// The instant's index (whole intervals since the epoch).
    pub index: u64,
    /// Instants since the previous round that were never sampled (the previous round, or
    /// the wait, ended after them).
    pub missed: u64,
}

impl Grid {
    /// The instants `k × interval + offset` since the Unix epoch. `interval` is raised to
    /// 1 µs; `offset` is taken modulo `interval` (an offset of one whole interval is the same
    /// grid).
    pub fn new(interval: Duration, offset: Duration) -> Grid {
        let interval_ns = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000);
        let offset_ns = u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX) % interval_ns;
        Grid {
            interval_ns,
            offset_ns,
            next: None,
        }
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// The offset (below the interval).
    pub fn offset(&self) -> Duration {
        Duration::from_nanos(self.offset_ns)
    }

    /// The instant of index `k`, ns since the epoch (saturating).
    pub fn instant(&self, k: u64) -> u64 {
        k.saturating_mul(self.interval_ns)
            .saturating_add(self.offset_ns)
    }

    /// The index of the latest instant at or before `now_unix_ns`, `None` before the first.
    fn floor(&self, now_unix_ns: u64) -> Option<u64> {
        now_unix_ns
            .checked_sub(self.offset_ns)
            .map(|since| since / self.interval_ns)
    }

    /// The index of the first instant at or after `now_unix_ns`.
    fn ceil(&self, now_unix_ns: u64) -> u64 {
        match self.floor(now_unix_ns) {
            None => 0,
            Some(k) if self.instant(k) == now_unix_ns => k,
            Some(k) => k.saturating_add(1),
        }
    }

    /// How long from `now_unix_ns` until the next instant to sample (zero: it is due). The
    /// first call seats the grid at the first instant at or after `now_unix_ns`; a wall clock
    /// stepped back by more than one interval re-seats it the same way.
    pub fn wait(&mut self, now_unix_ns: u64) -> Duration {
        let next = match self.next {
            Some(k)
                if self.instant(k)
                    <= now_unix_ns.saturating_add(self.interval_ns.saturating_mul(2)) =>
            {
                k
            }
            _ => self.ceil(now_unix_ns),
        };
        self.next = Some(next);
        Duration::from_nanos(self.instant(next).saturating_sub(now_unix_ns))
    }

    /// The round of a wake-up at `now_unix_ns`: the latest instant not after it, with the
    /// unsampled instants before it in [`GridRound::missed`]; `None` when the next instant
    /// is still ahead (woken early: wait again).
    pub fn begin(&mut self, now_unix_ns: u64) -> Option<GridRound> {
        let latest = self.floor(now_unix_ns)?;
        let next = *self.next.get_or_insert(latest);
        if latest < next {
            return None;
        }
        self.next = Some(latest.saturating_add(1));
        Some(GridRound {
            scheduled_unix_ns: self.instant(latest),
            index: latest,
            missed: latest - next,
        })
    }
}

/// What `--check-config` says about an `offset_*` key of `interval` (both in the key's
/// unit): `None` when `0 ≤ offset < interval`.
pub fn offset_problem(offset: f64, interval: f64) -> Option<String> {
    if offset.is_finite() && offset >= 0.0 && offset < interval {
        None
    } else {
        Some(format!(
            "must be at least 0 and less than the interval ({interval}), got {offset}"
        ))
    }
}

/// Nanoseconds since the Unix epoch on the wall clock (`CLOCK_REALTIME`), 0 before 1970.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn instants_are_whole_intervals_since_the_epoch_plus_the_offset() {
        let mut g = Grid::new(Duration::from_millis(10), Duration::from_millis(3));
        // Started at 1_000_000_004.5 ms: the first instant is ...013 ms, not start + 10 ms.
        let start = 1_000_000_004 * MS + MS / 2;
        assert_eq!(g.wait(start), Duration::from_micros(8_500));
        assert_eq!(g.begin(start), None, "woken early: no round");
        let at = 1_000_000_013 * MS;
        let r = g.begin(at + 200_000).unwrap();
        assert_eq!((r.scheduled_unix_ns, r.missed), (at, 0));
        assert_eq!(r.index, 100_000_001);
        assert_eq!(g.wait(at + 200_000), Duration::from_micros(9_800));
        // An offset of a whole interval or more is taken modulo the interval.
        assert_eq!(
            Grid::new(Duration::from_secs(1), Duration::from_millis(1_250)).offset(),
            Duration::from_millis(250)
        );
        // Two grids started at different times agree on every instant.
        let mut a = Grid::new(Duration::from_secs(1), Duration::ZERO);
        let mut b = Grid::new(Duration::from_secs(1), Duration::ZERO);
        let ta = 5_000 * MS + 123;
        let tb = 5_700 * MS;
        a.wait(ta);
        b.wait(tb);
        let wa = a.wait(ta).as_nanos() as u64;
        let wb = b.wait(tb).as_nanos() as u64;
        let ra = a.begin(ta + wa).unwrap();
        let rb = b.begin(tb + wb).unwrap();
        assert_eq!(ra.scheduled_unix_ns, 6_000 * MS);
        assert_eq!(ra, rb);
    }

    #[test]
    fn a_late_round_skips_and_counts_the_instants_it_missed_never_bunches() {
        let mut g = Grid::new(Duration::from_millis(10), Duration::ZERO);
        let t0 = 1_700_000_000_000 * MS;
        assert_eq!(g.wait(t0), Duration::ZERO);
        assert_eq!(g.begin(t0).map(|r| r.missed), Some(0));
        // The round took 35 ms: instants +10, +20, +30 passed; the next round is +30 (the
        // latest not after now) with 2 missed, then +40 with none: one round per wake-up.
        let late = t0 + 35 * MS;
        assert_eq!(g.wait(late), Duration::ZERO);
        let r = g.begin(late).unwrap();
        assert_eq!((r.scheduled_unix_ns, r.missed), (t0 + 30 * MS, 2));
        assert_eq!(g.wait(late), Duration::from_millis(5));
        assert_eq!(g.begin(late), None, "no second round for the same instants");
        let r = g.begin(t0 + 40 * MS).unwrap();
        assert_eq!((r.scheduled_unix_ns, r.missed), (t0 + 40 * MS, 0));
    }

    #[test]
    fn a_wall_clock_stepped_back_reseats_and_one_stepped_forward_counts_missed() {
        let mut g = Grid::new(Duration::from_secs(1), Duration::from_millis(500));
        let t0 = 1_000_000 * 1_000 * MS + 500 * MS;
        g.wait(t0);
        assert!(g.begin(t0).is_some());
        // Back by an hour: the next instant is the first after the new time, not in an hour.
        let back = t0 - 3_600_000 * MS + 600 * MS;
        assert_eq!(g.wait(back), Duration::from_millis(400));
        let r = g.begin(back + 400 * MS).unwrap();
        assert_eq!(r.missed, 0);
        // Back by less than one interval: no round until the instant comes again.
        let again = r.scheduled_unix_ns - 10 * MS;
        assert_eq!(g.wait(again), Duration::from_millis(1_010));
        assert_eq!(g.begin(again), None);
        // Forward by 10 s: the 9 instants jumped over (after the next one) were not sampled.
        let fwd = r.scheduled_unix_ns + 10_000 * MS + 1;
        assert_eq!(g.begin(fwd).map(|r| r.missed), Some(9));
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let mut g = Grid::new(Duration::ZERO, Duration::MAX);
        assert_eq!(g.interval(), Duration::from_micros(1));
        for now in [0, 1, u64::MAX - 1, u64::MAX] {
            let _ = g.wait(now);
            let _ = g.begin(now);
        }
        let mut g = Grid::new(Duration::MAX, Duration::from_secs(1));
        assert_eq!(g.begin(0), None);
        let _ = g.wait(u64::MAX);
        let _ = g.begin(u64::MAX);
    }
}
