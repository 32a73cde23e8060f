//! The sample law of the `fast_counters` stream, judged by [`Row::verdict`] for every agent
//! that runs `sources.fast_counters`. A `SampleSeries` counts one record per sample in every
//! accounting (`uctel_protocol::samples`), so over the whole run of an agent:
//!
//! - agent: samples taken (`fast_counters: stopped samples_taken=N`, i.e.
//!   `uctel_agent_fast_samples_total`) = `fast_counters_records_sent` +
//!   `fast_counters_records_dropped` (the `stopped: records sent and dropped per stream over
//!   the whole run` line: `uctel_agent_records_sent_total` and
//!   `uctel_agent_records_dropped_total{stream="fast_counters"}`, every reason);
//! - collector: the agent's samples sent = `uctel_collector_records_received_total` +
//!   `uctel_collector_records_lost_total` for `{agent, stream="fast_counters"}`, once every
//!   session has ended with `Goodbye`. Asserted where both sides cover the same span (one
//!   agent life per id, one collector life, no frame baseline); elsewhere the per-epoch rule
//!   of `law.rs` (Goodbye figures = received + lost) is what holds.
//!
//! Both sides read only what the daemons log and serve; nothing is estimated.

use std::collections::BTreeMap;

use crate::exposition::Scrape;
use crate::pipeline::last_log_fields;

// The sibling modules, re-exported by `faults`.
use super::*;

/// The stream's name as both daemons label it.
pub const FAST_COUNTERS: &str = "fast_counters";

/// Whole-run sample figures of one agent of a row (all its lives), with the collector's
/// figures for its id. Counts are samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleFigures {
    /// Lives that logged `fast_counters: stopped` (one per clean stop).
    pub stopped_lives: usize,
    /// Σ `samples_taken` over those lives.
    pub taken: u64,
    /// Σ `fast_counters_records_sent` of the lives' `stopped:` lines.
    pub sent: u64,
    /// Σ `fast_counters_records_dropped` of the lives' `stopped:` lines.
    pub dropped: u64,
    /// Σ `missed_rounds` over the lives.
    pub missed_rounds: u64,
    /// Per reason: `uctel_agent_records_dropped_total{stream="fast_counters"}` at the last
    /// scrape of each life (before its SIGTERM; drops at shutdown come after it).
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Per reason: `uctel_agent_source_errors_total{source="fast_counters"}` at the last
    /// scrape of each life.
    pub errors_by_reason: BTreeMap<String, u64>,
    /// `uctel_agent_fast_samples_total` at the last scrape of each life.
    pub taken_at_last_scrape: u64,
    /// Collector `records_received_total{agent, stream="fast_counters"}`, every life.
    pub received: u64,
    /// Collector `records_lost_total{agent, stream="fast_counters"}`, every life.
    pub lost: u64,
}

fn field(fields: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    fields.get(key).and_then(|v| v.parse().ok())
}

fn add_by_label(s: &Scrape, name: &str, m: &[(&str, &str)], into: &mut BTreeMap<String, u64>) {
    for smp in s.select(name, m) {
        if let Some(r) = smp.label("reason") {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = smp.value.max(0.0).round() as u64;
            *into.entry(r.to_owned()).or_default() += v;
        }
    }
}

impl Row {
    /// Whether agent `i` is configured with `sources.fast_counters`.
    pub fn runs_fast_counters(&self, i: usize) -> bool {
        self.agents[i]
            .spec
            .config
            .iter()
            .any(|(k, _)| k.starts_with("sources.fast_counters"))
    }

    /// The whole-run sample figures of agent `i` (read after it stopped: the `stopped`
    /// lines are written at its exit).
    pub fn sample_figures(&self, i: usize) -> SampleFigures {
        let a = &self.agents[i];
        let mut f = SampleFigures::default();
        // Each life logs both lines once, at its stop (a daemon log is appended to by every
        // life).
        for line in a.daemon.log().lines() {
            if line.contains("fast_counters: stopped") {
                if let Some(fl) = last_log_fields(line, "fast_counters: stopped") {
                    f.taken += field(&fl, "samples_taken").unwrap_or(0);
                    f.missed_rounds += field(&fl, "missed_rounds").unwrap_or(0);
                    f.stopped_lives += 1;
                }
            } else if line.contains("stopped: records sent and dropped per stream") {
                if let Some(t) = last_log_fields(line, "stopped: records sent and dropped") {
                    f.sent += field(&t, "fast_counters_records_sent").unwrap_or(0);
                    f.dropped += field(&t, "fast_counters_records_dropped").unwrap_or(0);
                }
            }
        }
        let stream = [("stream", FAST_COUNTERS)];
        for life in &a.lives {
            let Some(s) = &life.last else { continue };
            add_by_label(
                s,
                "uctel_agent_records_dropped_total",
                &stream,
                &mut f.dropped_by_reason,
            );
            add_by_label(
                s,
                "uctel_agent_source_errors_total",
                &[("source", FAST_COUNTERS)],
                &mut f.errors_by_reason,
            );
            f.taken_at_last_scrape += s.count("uctel_agent_fast_samples_total", &[]);
        }
        let m = [("agent", a.spec.id.as_str()), ("stream", FAST_COUNTERS)];
        for life in &self.collector_lives {
            let Some(s) = &life.last else { continue };
            f.received += s.count("uctel_collector_records_received_total", &m);
            f.lost += s.count("uctel_collector_records_lost_total", &m);
        }
        f
    }
}
