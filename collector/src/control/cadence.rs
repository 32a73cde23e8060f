//! When each session's periodic `Report` is due.
//!
//! A report is a round trip through the data-plane worker (it owns the trackers) and a
//! write on the control connection. Sessions that tick at phases of their own wake the
//! runtime and interrupt the worker once per report; at 10 agents and a 10 ms interval that
//! was about 3.7 context switches per report and a tenth of the collector's CPU. So
//! sessions report in groups: the sessions of one group of [`REPORT_GROUP`] consecutive
//! session ids tick at one phase of the interval, measured from one collector-wide epoch,
//! and one wake-up of the runtime and one pass of the worker serve them all. The groups'
//! phases are spread over the interval (golden-ratio steps, so consecutive groups never
//! share one), so at 10,000 agents a report instant carries at most [`REPORT_GROUP`]
//! reports and their grants, not every agent's at once.

use std::time::{Duration, Instant};

/// Sessions whose reports share one phase of the report interval.
pub(super) const REPORT_GROUP: u32 = 64;

/// The collector-wide grid that sessions' report ticks are laid on.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReportClock {
    epoch: Instant,
}

impl Default for ReportClock {
    /// A grid starting now.
    fn default() -> Self {
        ReportClock {
            epoch: Instant::now(),
        }
    }
}

impl ReportClock {
    /// The first report tick after `now` of session `id` reporting every `every`: on its
    /// group's phase, `epoch + phase + k·every` with the least `k` that makes it later than
    /// `now`. An `every` of zero ticks at `now`.
    pub(super) fn first_tick(&self, id: u32, every: Duration, now: Instant) -> Instant {
        let every_ns = every.as_nanos();
        if every_ns == 0 {
            return now;
        }
        let group = u64::from(id / REPORT_GROUP);
        // frac(group · φ⁻¹) in 2⁻³² units: the Weyl sequence spreads groups evenly.
        let frac = u128::from(group.wrapping_mul(0x9e37_79b9) & 0xffff_ffff);
        let phase_ns = (every_ns * frac) >> 32;
        let since_ns = now.saturating_duration_since(self.epoch).as_nanos();
        // The least k with phase + k·every > since (phase < every).
        let k = if since_ns < phase_ns {
            0
        } else {
            (since_ns - phase_ns) / every_ns + 1
        };
        let at_ns = phase_ns + k * every_ns;
        let at = u64::try_from(at_ns).map(Duration::from_nanos);
        at.ok()
            .and_then(|d| self.epoch.checked_add(d))
            .unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_group_ticks_together_and_groups_do_not() {
        let clock = ReportClock::default();
        let every = Duration::from_millis(10);
        // Sessions of one group joining at different times land on the same grid.
        let a = clock.first_tick(1, every, clock.epoch + Duration::from_micros(1_300));
        let b = clock.first_tick(63, every, clock.epoch + Duration::from_micros(7_900));
        let c = clock.first_tick(5, every, clock.epoch + Duration::from_micros(12_100));
        assert_eq!(a, b);
        assert_eq!(c, a + every);
        // Group 0's phase is the epoch itself; each tick is after `now`, within one interval.
        assert_eq!(a, clock.epoch + every);
        for (id, at) in [(0u32, 0u64), (64, 1), (700, 13_333), (9_999, 250_001)] {
            let now = clock.epoch + Duration::from_micros(at);
            let t = clock.first_tick(id, every, now);
            assert!(t > now && t <= now + every, "id {id}: {t:?} after {now:?}");
        }
        // 10,000 sessions: 157 groups, no two consecutive ones on one phase, and at most
        // one group's reports at any instant (the phases are distinct).
        let now = clock.epoch + Duration::from_secs(5);
        let every = Duration::from_secs(1);
        let mut ticks: Vec<Instant> = (0..10_000u32)
            .step_by(REPORT_GROUP as usize)
            .map(|id| clock.first_tick(id, every, now))
            .collect();
        assert!(ticks.windows(2).all(|w| w[0] != w[1]));
        ticks.sort();
        ticks.dedup();
        assert_eq!(ticks.len(), 10_000usize.div_ceil(REPORT_GROUP as usize));
    }

    #[test]
    fn a_zero_interval_ticks_at_once() {
        let clock = ReportClock::default();
        let now = clock.epoch + Duration::from_millis(3);
        assert_eq!(clock.first_tick(7, Duration::ZERO, now), now);
    }
}
