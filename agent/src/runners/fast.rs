//! The `fast_counters` source's thread (`sources::fast_counters`): samples its counters at
//! the aligned instants of its interval ([`crate::pacing::grid`]).

use std::sync::Arc;
use std::time::Instant;

use prometheus::{IntCounter, Opts};
use uctel_common::shutdown::Shutdown;
use uctel_protocol::samples::SampleSeries;

use super::rounds::next_round_blocking;
use super::run_thread;
use crate::pacing::grid::Grid;
use crate::queue::RecordQueue;
use crate::selfmetrics::{DropReason, SelfMetrics};
use crate::sources::pod_resources::{PodLabels, SeriesLabeller};
use crate::stream::Stream;

/// The `fast_counters` source's own counters (on the agent's registry, so also shipped with
/// the self-metrics).
#[derive(Debug, Clone)]
pub struct FastCounterMetrics {
    /// `uctel_agent_fast_samples_total`: samples taken (successful reads).
    pub samples: IntCounter,
    /// `uctel_agent_fast_missed_rounds_total`: sampling instants skipped.
    pub missed_rounds: IntCounter,
    /// `uctel_agent_fast_stale_markers_total`: stale markers sent for series whose pod
    /// labels changed (`sources::pod_resources`), one sample each on the stream.
    pub stale_markers: IntCounter,
    /// `uctel_agent_fast_sample_lateness_seconds`: sample time − scheduled time.
    pub lateness: prometheus::Histogram,
}

impl FastCounterMetrics {
    /// Registers the counters in `registry`.
    ///
    /// # Errors
    /// A registration error (the names are already registered).
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let samples = IntCounter::with_opts(Opts::new(
            "uctel_agent_fast_samples_total",
            "Samples taken by the fast_counters source (successful reads). Every one (and \
             every stale marker, uctel_agent_fast_stale_markers_total) is received, lost or \
             dropped with a reason on the fast_counters stream.",
        ))?;
        let stale_markers = IntCounter::with_opts(Opts::new(
            "uctel_agent_fast_stale_markers_total",
            "Stale markers the fast_counters source sent to end a series whose pod labels \
             changed (sources.pod_resources: the pod that owned the device ended); one \
             sample each on the fast_counters stream.",
        ))?;
        let missed_rounds = IntCounter::with_opts(Opts::new(
            "uctel_agent_fast_missed_rounds_total",
            "Sampling instants of the fast_counters source skipped because the previous \
             round ended after them (the host was too busy).",
        ))?;
        let lateness = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "uctel_agent_fast_sample_lateness_seconds",
                "How late each fast_counters sample was read: sample time minus scheduled \
                 time.",
            )
            .buckets(vec![
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005,
                0.01, 0.05,
            ]),
        )?;
        registry.register(Box::new(samples.clone()))?;
        registry.register(Box::new(missed_rounds.clone()))?;
        registry.register(Box::new(lateness.clone()))?;
        registry.register(Box::new(stale_markers.clone()))?;
        Ok(Self {
            samples,
            missed_rounds,
            stale_markers,
            lateness,
        })
    }
}

/// Runs the `fast_counters` source (`sources::fast_counters`) until shutdown, on a thread
/// of its own (`fast-counters`, scheduled as `sources.wake_scheduling` says:
/// [`super::rounds::schedule_wake`]) that sleeps until each sampling instant: one read per
/// counter per instant, a record per counter every `samples_per_record` samples, offered to
/// the fast_counters queue. What the queue cannot take is counted as `source_overflow`, in
/// samples. At shutdown the samples not yet shipped are offered as a last, shorter record.
/// Its counters are registered and resolved already (`FastCountersSection::resolve`), so a
/// reload starts the source again on the same counters ([`crate::metric_sources`]); the
/// device series carry the labels of `pod_labels` (`sources::pod_resources`) where given,
/// and a series whose labels changed is ended with stale markers
/// ([`crate::sources::pod_resources::SeriesLabeller`]), counted in
/// `uctel_agent_fast_stale_markers_total`.
pub async fn fast_counters_loop(
    (section, scheduling): (
        crate::sources::fast_counters::FastCountersSection,
        crate::config::WakeScheduling,
    ),
    specs: Vec<crate::sources::fast_counters::CounterSpec>,
    metrics: FastCounterMetrics,
    (queue, pod_labels): (RecordQueue<SampleSeries>, Option<PodLabels>),
    stats: Arc<SelfMetrics>,
    mut shutdown: Shutdown,
) {
    run_thread("fast-counters", &mut shutdown, move |stopped| {
        super::rounds::schedule_wake("fast-counters", scheduling);
        fast_counters_thread(
            &section,
            &specs,
            (&queue, pod_labels.as_ref()),
            &stats,
            &metrics,
            stopped,
        );
    })
    .await;
}

/// The body of [`fast_counters_loop`]'s thread: samples until `stop` is dropped.
pub fn fast_counters_thread(
    section: &crate::sources::fast_counters::FastCountersSection,
    specs: &[crate::sources::fast_counters::CounterSpec],
    (queue, pod_labels): (&RecordQueue<SampleSeries>, Option<&PodLabels>),
    stats: &SelfMetrics,
    metrics: &FastCounterMetrics,
    stop: &std::sync::mpsc::Receiver<()>,
) {
    use crate::sources::fast_counters::{unix_us, Reader, SeriesBuffer};
    let mut readers: Vec<Reader> = specs.iter().map(|s| Reader::new(&s.origin)).collect();
    let mut buffers = vec![SeriesBuffer::default(); specs.len()];
    let mut warned = std::collections::HashSet::new();
    let mut labeller = pod_labels.map(|l| SeriesLabeller::new(l.clone()));
    let mut grid = Grid::new(section.interval(), section.offset());
    let per_record = section.samples_per_record.max(1);
    tracing::info!(
        counters = specs.len(),
        interval_ms = section.interval_milliseconds,
        offset_ms = section.offset_milliseconds,
        samples_per_record = per_record,
        "fast_counters: sampling"
    );
    let mut stopping = false;
    while !stopping {
        let began = next_round_blocking(&mut grid, stop);
        let mut ready = Vec::new();
        if let Some(began) = began {
            metrics.missed_rounds.inc_by(began.round.missed);
            // Re-anchored at every round on the wall clock, so sample times follow it (no
            // drift from the grid); within a round they come from the monotonic clock.
            let anchor = (
                Instant::now(),
                i64::try_from(began.unix_ns / 1_000).unwrap_or(i64::MAX),
            );
            let scheduled_us = i64::try_from(began.round.scheduled_unix_ns / 1_000).unwrap_or(0);
            let mut taken = 0;
            for (i, (spec, reader)) in specs.iter().zip(readers.iter_mut()).enumerate() {
                let at = unix_us(anchor, Instant::now());
                match reader.read() {
                    Ok(raw) => {
                        let lateness_us = at.saturating_sub(scheduled_us).max(0);
                        metrics.lateness.observe(lateness_us as f64 / 1e6);
                        taken += 1;
                        let value = raw.saturating_mul(spec.scale) as f64;
                        buffers[i].push(at, value);
                    }
                    Err(e) => {
                        stats.source_error("fast_counters", e.as_str());
                        if warned.insert((i, e)) {
                            tracing::warn!(counter = %spec.name, origin = ?spec.origin, reason = e.as_str(), "fast_counters: cannot read a counter; its samples are skipped until it reads again (logged once per counter and reason)");
                        }
                    }
                }
                if buffers[i].len() >= per_record {
                    ready.extend(buffers[i].take(spec));
                }
            }
            metrics.samples.inc_by(taken);
        } else {
            stopping = true;
            for (spec, buffer) in specs.iter().zip(buffers.iter_mut()) {
                ready.extend(buffer.take(spec));
            }
        }
        if let Some(l) = labeller.as_mut() {
            metrics.stale_markers.inc_by(l.apply(&mut ready));
        }
        if !ready.is_empty() {
            offer_samples(queue, ready, stats);
        }
    }
    tracing::info!(
        samples_taken = metrics.samples.get(),
        missed_rounds = metrics.missed_rounds.get(),
        "fast_counters: stopped"
    );
}

/// Offers sample series to the fast_counters queue; the samples of those that do not fit
/// are counted as `source_overflow`.
fn offer_samples(
    queue: &RecordQueue<SampleSeries>,
    mut ready: Vec<SampleSeries>,
    stats: &SelfMetrics,
) {
    let weights: Vec<u64> = ready.iter().map(|s| u64::from(s.weight())).collect();
    let rejected = queue.offer(std::mem::take(&mut ready));
    let lost: u64 = weights[weights.len() - rejected..].iter().sum();
    if lost > 0 {
        stats.dropped(Stream::FastCounters, DropReason::SourceOverflow, 0, lost);
    }
    stats.set_queue_records(Stream::FastCounters, queue.len());
}
