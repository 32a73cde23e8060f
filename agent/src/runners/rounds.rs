//! Waiting for the aligned instants of a source ([`crate::pacing::grid`]) and counting the
//! rounds that were late or skipped.
//!
//! Two waits: [`next_round_blocking`] for the sources on a thread of their own (host
//! metrics, fast counters: a `recv_timeout` on the stop channel, to the microsecond the
//! kernel's timer slack allows) and [`next_round`] for the async ones (scrape targets, the
//! textfile directory, self-metrics: a tokio sleep, to the millisecond).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use uctel_common::shutdown::Shutdown;

use crate::pacing::grid::{unix_now_ns, Grid, GridRound};

/// `uctel_agent_missed_rounds_total{source}` and `uctel_agent_round_lateness_seconds{source}`
/// for the aligned sources (`host_metrics`, `scrape`, `textfile`, `self_metrics`; the fast
/// counters keep their own `uctel_agent_fast_*`).
#[derive(Debug, Clone)]
pub struct RoundMetrics {
    missed: IntCounterVec,
    lateness: HistogramVec,
}

/// One round that began: its instant, and the wall-clock time it began (ns since the Unix
/// epoch; what its records are stamped with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Began {
    /// The grid's answer.
    pub round: GridRound,
    /// When the round began, ns since the Unix epoch (≥ `round.scheduled_unix_ns`).
    pub unix_ns: u64,
}

impl Began {
    /// Milliseconds since the Unix epoch of the round's start (the records' timestamp).
    pub fn unix_ms(&self) -> i64 {
        i64::try_from(self.unix_ns / 1_000_000).unwrap_or(i64::MAX)
    }

    /// How late the round began after its instant.
    pub fn lateness(&self) -> Duration {
        Duration::from_nanos(self.unix_ns.saturating_sub(self.round.scheduled_unix_ns))
    }
}

impl RoundMetrics {
    /// Registers both families in `registry`.
    ///
    /// # Errors
    /// A registration error (the names are already registered).
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let missed = IntCounterVec::new(
            Opts::new(
                "uctel_agent_missed_rounds_total",
                "Aligned collection instants (whole multiples of the interval since the Unix \
                 epoch plus the offset) a source skipped because its previous round or its \
                 wake-up ended after them, by source. Skipped, never run late in a bunch.",
            ),
            &["source"],
        )?;
        let lateness = HistogramVec::new(
            HistogramOpts::new(
                "uctel_agent_round_lateness_seconds",
                "How late each round of an aligned source began after its instant, by \
                 source.",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0,
            ]),
            &["source"],
        )?;
        registry.register(Box::new(missed.clone()))?;
        registry.register(Box::new(lateness.clone()))?;
        Ok(Self { missed, lateness })
    }

    /// Counts a round of `source`: its missed instants and its lateness.
    pub fn observe(&self, source: &str, began: &Began) {
        if began.round.missed > 0 {
            self.missed
                .with_label_values(&[source])
                .inc_by(began.round.missed);
        }
        self.lateness
            .with_label_values(&[source])
            .observe(began.lateness().as_secs_f64());
    }

    /// `uctel_agent_missed_rounds_total{source}` so far.
    pub fn missed(&self, source: &str) -> u64 {
        self.missed.with_label_values(&[source]).get()
    }
}

/// Sleeps on `stop` until the next instant of `grid` and begins its round; `None` once
/// `stop`'s sender is dropped (shutdown).
pub fn next_round_blocking(grid: &mut Grid, stop: &Receiver<()>) -> Option<Began> {
    loop {
        let wait = grid.wait(unix_now_ns());
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return None,
        }
        let now = unix_now_ns();
        if let Some(round) = grid.begin(now) {
            return Some(Began {
                round,
                unix_ns: now,
            });
        }
    }
}

/// Sleeps until the next instant of `grid` and begins its round; `None` at shutdown.
pub async fn next_round(grid: &mut Grid, shutdown: &mut Shutdown) -> Option<Began> {
    loop {
        let wait = grid.wait(unix_now_ns());
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.wait() => return None,
        }
        let now = unix_now_ns();
        if let Some(round) = grid.begin(now) {
            return Some(Began {
                round,
                unix_ns: now,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_begin_on_the_grid_and_stop_when_the_sender_is_dropped() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut grid = Grid::new(Duration::from_millis(20), Duration::from_millis(7));
        let mut indices = Vec::new();
        for _ in 0..3 {
            let b = next_round_blocking(&mut grid, &rx).unwrap();
            assert_eq!(b.round.scheduled_unix_ns % 20_000_000, 7_000_000);
            assert!(b.unix_ns >= b.round.scheduled_unix_ns);
            indices.push(b.round.index);
        }
        assert!(indices.windows(2).all(|w| w[1] > w[0]));
        drop(tx);
        assert_eq!(next_round_blocking(&mut grid, &rx), None);
        let registry = Registry::new();
        let m = RoundMetrics::register(&registry).unwrap();
        let b = Began {
            round: GridRound {
                scheduled_unix_ns: 1_000,
                index: 1,
                missed: 4,
            },
            unix_ns: 2_000,
        };
        m.observe("host_metrics", &b);
        assert_eq!(m.missed("host_metrics"), 4);
        assert_eq!(b.lateness(), Duration::from_nanos(1_000));
        assert!(RoundMetrics::register(&registry).is_err());
    }
}
