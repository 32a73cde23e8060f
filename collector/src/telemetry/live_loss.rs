//! Loss in the log while it happens: every [`WINDOW`], one warning per agent and stream that
//! lost frames in that window, `lost N frames / M records in the last 10 s`, read from the
//! gap detection's own counters (`frames_lost_total{agent,stream}`,
//! `records_lost_total{agent,stream}`, DESIGN.md §5), so the log and `/metrics` never
//! disagree. A stream that loses nothing logs nothing; one that keeps losing logs once per
//! window, whatever its rate (the rate limit is the window, per agent and stream). The
//! session's end still sums the whole connection up (`crate::control`).
//!
//! [`LossWindow`] is the rule (sans-IO: counts in, lines out); [`live_loss_loop`] drives it.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus::core::Collector;
use uctel_common::shutdown::Shutdown;

use super::Telemetry;

/// How often the loss of the last window is logged.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Cumulative `(frames lost, records lost)` by `(agent, stream)`.
pub type LossCounts = BTreeMap<(String, String), (u64, u64)>;

/// Loss of one agent's stream over one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossLine {
    /// The agent id.
    pub agent: String,
    /// The stream name (`metrics`, `logs`, `fast_counters`).
    pub stream: String,
    /// Frames counted lost in the window.
    pub frames: u64,
    /// Records of those frames.
    pub records: u64,
}

/// The counts at the end of the last window.
#[derive(Debug, Default)]
pub struct LossWindow {
    last: LossCounts,
}

impl LossWindow {
    /// Starts from `counts` (nothing before them is reported).
    pub fn new(counts: LossCounts) -> LossWindow {
        LossWindow { last: counts }
    }

    /// The window ends with `counts`: what each stream lost since the last call, for the
    /// streams that lost anything. A count below the last one (a series forgotten and
    /// counted anew) counts from 0, as Prometheus's `increase()` treats a counter reset.
    pub fn observe(&mut self, counts: LossCounts) -> Vec<LossLine> {
        let mut out = Vec::new();
        for ((agent, stream), &(frames, records)) in &counts {
            let (f0, r0) = self
                .last
                .get(&(agent.clone(), stream.clone()))
                .copied()
                .unwrap_or((0, 0));
            let delta = |now: u64, before: u64| if now >= before { now - before } else { now };
            let (frames, records) = (delta(frames, f0), delta(records, r0));
            if frames > 0 || records > 0 {
                out.push(LossLine {
                    agent: agent.clone(),
                    stream: stream.clone(),
                    frames,
                    records,
                });
            }
        }
        self.last = counts;
        out
    }
}

impl Telemetry {
    /// `frames_lost_total` and `records_lost_total` of every agent and stream, now.
    pub fn lost_by_stream(&self) -> LossCounts {
        let mut out = LossCounts::new();
        let mut read = |vec: &prometheus::IntCounterVec, records: bool| {
            for family in vec.collect() {
                for m in family.get_metric() {
                    let label = |name: &str| {
                        m.get_label()
                            .iter()
                            .find(|l| l.name() == name)
                            .map(|l| l.value().to_owned())
                            .unwrap_or_default()
                    };
                    // Counters hold whole numbers below 2^53.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let v = m.get_counter().get_value() as u64;
                    let e = out.entry((label("agent"), label("stream"))).or_default();
                    if records {
                        e.1 = v;
                    } else {
                        e.0 = v;
                    }
                }
            }
        };
        read(&self.inner.frames_lost, false);
        read(&self.inner.records_lost, true);
        out
    }
}

/// Every [`WINDOW`] until `shutdown`, logs the loss of the window ([`LossWindow`]).
pub async fn live_loss_loop(telemetry: Telemetry, mut shutdown: Shutdown) {
    let mut window = LossWindow::new(telemetry.lost_by_stream());
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + WINDOW, WINDOW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.wait() => return,
        }
        for l in window.observe(telemetry.lost_by_stream()) {
            tracing::warn!(
                agent = %l.agent,
                stream = %l.stream,
                frames_lost = l.frames,
                records_lost = l.records,
                "agent {} stream {}: lost {} frames / {} records in the last {} s",
                l.agent,
                l.stream,
                l.frames,
                l.records,
                WINDOW.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(v: &[(&str, &str, u64, u64)]) -> LossCounts {
        v.iter()
            .map(|(a, s, f, r)| (((*a).to_owned(), (*s).to_owned()), (*f, *r)))
            .collect()
    }

    #[test]
    fn one_line_per_stream_that_lost_in_the_window() {
        let mut w = LossWindow::new(counts(&[("a", "metrics", 5, 50)]));
        assert!(w.observe(counts(&[("a", "metrics", 5, 50)])).is_empty());
        let lines = w.observe(counts(&[
            ("a", "metrics", 8, 80),
            ("a", "logs", 0, 0),
            ("b", "logs", 2, 7),
        ]));
        assert_eq!(
            lines,
            vec![
                LossLine {
                    agent: "a".into(),
                    stream: "metrics".into(),
                    frames: 3,
                    records: 30
                },
                LossLine {
                    agent: "b".into(),
                    stream: "logs".into(),
                    frames: 2,
                    records: 7
                },
            ]
        );
        // A series counted anew (forgotten, then back): from 0.
        let lines = w.observe(counts(&[("a", "metrics", 1, 4), ("b", "logs", 2, 7)]));
        assert_eq!(lines.len(), 1);
        assert_eq!((lines[0].frames, lines[0].records), (1, 4));
    }

    #[test]
    fn reads_the_gap_counters() {
        let t = Telemetry::new().unwrap();
        t.inner
            .frames_lost
            .with_label_values(&["a", "logs"])
            .inc_by(3);
        t.inner
            .records_lost
            .with_label_values(&["a", "logs"])
            .inc_by(9);
        assert_eq!(t.lost_by_stream(), counts(&[("a", "logs", 3, 9)]));
    }
}
