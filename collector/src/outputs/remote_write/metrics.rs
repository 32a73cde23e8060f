//! Remote-write self-metrics, in the style of Prometheus' own
//! `prometheus_remote_storage_*` (all labelled `url`, credentials removed):
//!
//! | metric | meaning |
//! |---|---|
//! | `uctel_collector_remote_write_samples_in_total` | samples handed to the endpoint (stale markers included) |
//! | `uctel_collector_remote_write_samples_total` | samples the receiver accepted (2xx) |
//! | `uctel_collector_remote_write_samples_failed_total{reason}` | samples of requests that failed for good ([`Failed`]) |
//! | `uctel_collector_remote_write_samples_dropped_total{reason}` | samples never sent ([`Dropped`]) |
//! | `uctel_collector_remote_write_stale_markers_total` | stale markers queued (series ended: `Goodbye`, staleness, or the agent's own marker), part of `samples_in` |
//! | `uctel_collector_remote_write_samples_retried_total` | samples of requests sent again (each retry counts) |
//! | `uctel_collector_remote_write_samples_pending` | samples queued or in flight |
//! | `uctel_collector_remote_write_highest_sent_timestamp_seconds` | newest sample timestamp the receiver accepted |
//! | `uctel_collector_remote_write_sent_batch_duration_seconds` | request duration (histogram) |
//! | `uctel_collector_remote_write_shards` | shards (parallel senders) |
//! | `uctel_collector_remote_write_series` | series known (with a last timestamp) |
//!
//! At every scrape `samples_in = samples + Σ samples_failed + Σ samples_dropped +
//! samples_pending`, exactly: every counter changes only under a shard lock and the scrape
//! (`remote_write::LockedCollector`) holds all of them while it reads.

use prometheus::core::Collector;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts,
};

use crate::telemetry::NAMESPACE;

/// Why a sample was never sent. The `reason` label value is [`Dropped::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Not newer than the last sample queued for its series (a late frame): a receiver
    /// would reject the whole request.
    OutOfOrder,
    /// Remote-write cannot carry it: a `__`-prefixed label name, a histogram value with
    /// the stale marker's bits, no timestamp.
    Invalid,
    /// The agent's stale marker (a counter, gauge or untyped value with the bits of
    /// Prometheus's `StaleNaN`) for a series the endpoint does not hold: it ended already
    /// (agents send a marker again in case UC lost it) or never had a sample queued.
    NoSeries,
    /// The queue was full; the oldest sample made room.
    QueueFull,
    /// Still queued when the collector stopped.
    Shutdown,
    /// A new series of an agent that has `series_cap_per_agent` series already (the
    /// series store's bound, so remote-write memory is bounded the same way).
    SeriesCap,
    /// Held when the collector stalled longer than its dead-peer time: its agents moved
    /// and another collector has written their newer samples (`stall` module docs).
    AgentMoved,
    /// Still queued when a reload removed or changed the endpoint and its grace period
    /// (`min(5 s, timeout_seconds)`, as at shutdown) ended (`remote_write::live` module docs).
    Reload,
}

/// Why a request's samples were given up after sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// The receiver answered 4xx other than 429: retrying cannot help.
    Rejected,
    /// The collector stopped while the request was still being retried.
    Shutdown,
    /// A reload removed or changed the endpoint while the request was still being retried,
    /// and its grace period ended (`remote_write::live` module docs).
    Reload,
}

impl Dropped {
    /// Every reason.
    pub const ALL: [Dropped; 8] = [
        Dropped::OutOfOrder,
        Dropped::Invalid,
        Dropped::NoSeries,
        Dropped::QueueFull,
        Dropped::Shutdown,
        Dropped::SeriesCap,
        Dropped::AgentMoved,
        Dropped::Reload,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::OutOfOrder => "out_of_order",
            Dropped::Invalid => "invalid",
            Dropped::NoSeries => "no_series",
            Dropped::QueueFull => "queue_full",
            Dropped::Shutdown => "shutdown",
            Dropped::SeriesCap => "series_cap",
            Dropped::AgentMoved => "agent_moved",
            Dropped::Reload => "reload",
        }
    }
}

impl Failed {
    /// Every reason.
    pub const ALL: [Failed; 3] = [Failed::Rejected, Failed::Shutdown, Failed::Reload];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Failed::Rejected => "rejected",
            Failed::Shutdown => "shutdown",
            Failed::Reload => "reload",
        }
    }
}

/// The metric families, one set per collector.
#[derive(Debug, Clone)]
pub struct Families {
    samples_in: IntCounterVec,
    samples: IntCounterVec,
    failed: IntCounterVec,
    dropped: IntCounterVec,
    retried: IntCounterVec,
    stale: IntCounterVec,
    pending: IntGaugeVec,
    highest_sent: GaugeVec,
    duration: HistogramVec,
    shards: IntGaugeVec,
    series: IntGaugeVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
        .namespace(NAMESPACE)
        .subsystem("remote_write")
}

impl Families {
    /// Builds the families (not registered themselves: the output registers one collector
    /// that reads them under the shard locks).
    ///
    /// # Errors
    /// A `prometheus` error for an invalid descriptor (a bug).
    pub fn new() -> prometheus::Result<Families> {
        let url = &["url"];
        let reason = &["url", "reason"];
        Ok(Families {
            samples_in: IntCounterVec::new(
                opts(
                    "samples_in_total",
                    "Samples handed to the remote-write endpoint (stale markers included).",
                ),
                url,
            )?,
            samples: IntCounterVec::new(
                opts(
                    "samples_total",
                    "Samples the remote-write receiver accepted.",
                ),
                url,
            )?,
            failed: IntCounterVec::new(
                opts(
                    "samples_failed_total",
                    "Samples of remote-write requests that failed for good, by reason.",
                ),
                reason,
            )?,
            dropped: IntCounterVec::new(
                opts(
                    "samples_dropped_total",
                    "Samples never sent to the remote-write receiver, by reason.",
                ),
                reason,
            )?,
            retried: IntCounterVec::new(
                opts(
                    "samples_retried_total",
                    "Samples of remote-write requests sent again after a recoverable error.",
                ),
                url,
            )?,
            stale: IntCounterVec::new(
                opts(
                    "stale_markers_total",
                    "Stale markers queued for the endpoint (series ended by Goodbye, \
                     staleness or the agent's own stale marker); also counted in \
                     samples_in_total.",
                ),
                url,
            )?,
            pending: IntGaugeVec::new(
                opts(
                    "samples_pending",
                    "Samples queued or in flight to the endpoint.",
                ),
                url,
            )?,
            highest_sent: GaugeVec::new(
                opts(
                    "highest_sent_timestamp_seconds",
                    "Newest sample timestamp the remote-write receiver accepted, seconds \
                     since the Unix epoch.",
                ),
                url,
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "sent_batch_duration_seconds",
                    "Duration of remote-write requests, seconds.",
                )
                .namespace(NAMESPACE)
                .subsystem("remote_write")
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                url,
            )?,
            shards: IntGaugeVec::new(opts("shards", "Parallel remote-write senders."), url)?,
            series: IntGaugeVec::new(
                opts(
                    "series",
                    "Series the remote-write output knows (their last timestamp).",
                ),
                url,
            )?,
        })
    }

    /// The counters of endpoint `url`.
    pub fn endpoint(&self, url: &str) -> Counters {
        Counters {
            samples_in: self.samples_in.with_label_values(&[url]),
            samples: self.samples.with_label_values(&[url]),
            failed: Failed::ALL.map(|r| self.failed.with_label_values(&[url, r.as_str()])),
            dropped: Dropped::ALL.map(|r| self.dropped.with_label_values(&[url, r.as_str()])),
            retried: self.retried.with_label_values(&[url]),
            stale: self.stale.with_label_values(&[url]),
            pending: self.pending.with_label_values(&[url]),
            highest_sent: self.highest_sent.with_label_values(&[url]),
            duration: self.duration.with_label_values(&[url]),
            shards: self.shards.with_label_values(&[url]),
            series: self.series.with_label_values(&[url]),
        }
    }

    /// Every family, for registration and scrapes.
    pub(crate) fn collectors(&self) -> [&dyn Collector; 11] {
        [
            &self.stale,
            &self.samples_in,
            &self.samples,
            &self.failed,
            &self.dropped,
            &self.retried,
            &self.pending,
            &self.highest_sent,
            &self.duration,
            &self.shards,
            &self.series,
        ]
    }
}

/// One endpoint's counters.
#[derive(Debug)]
pub struct Counters {
    /// `samples_in_total`.
    pub samples_in: IntCounter,
    samples: IntCounter,
    failed: [IntCounter; 3],
    dropped: [IntCounter; 8],
    /// `samples_retried_total`.
    pub retried: IntCounter,
    /// `stale_markers_total`.
    pub stale: IntCounter,
    /// `samples_pending`.
    pub pending: IntGauge,
    highest_sent: Gauge,
    /// `sent_batch_duration_seconds`.
    pub duration: Histogram,
    /// `shards`.
    pub shards: IntGauge,
    /// `series`.
    pub series: IntGauge,
}

impl Counters {
    /// `n` samples dropped before sending (queued ones leave the pending gauge; samples
    /// never queued must be counted in `samples_in` by the caller first and pass through
    /// `pending` too, which this keeps exact).
    pub fn drop_queued(&self, reason: Dropped, n: u64) {
        self.dropped[Dropped::ALL.iter().position(|r| *r == reason).unwrap_or(0)].inc_by(n);
        match reason {
            // Never queued: counted in `samples_in` without passing `pending`.
            Dropped::OutOfOrder | Dropped::Invalid | Dropped::NoSeries | Dropped::SeriesCap => {}
            Dropped::QueueFull | Dropped::Shutdown | Dropped::AgentMoved | Dropped::Reload => {
                self.pending.sub(n as i64);
            }
        }
    }

    /// `n` samples accepted by the receiver, the newest at `newest_ms`.
    pub fn sent(&self, n: u64, newest_ms: i64) {
        self.samples.inc_by(n);
        self.pending.sub(n as i64);
        let s = newest_ms as f64 / 1000.0;
        if s > self.highest_sent.get() {
            self.highest_sent.set(s);
        }
    }

    /// `n` samples given up after sending.
    pub fn failed(&self, reason: Failed, n: u64) {
        self.failed[Failed::ALL.iter().position(|r| *r == reason).unwrap_or(0)].inc_by(n);
        self.pending.sub(n as i64);
    }

    /// Samples sent (for tests).
    pub fn samples_sent(&self) -> u64 {
        self.samples.get()
    }

    /// Samples dropped for `reason` (for tests).
    pub fn dropped(&self, reason: Dropped) -> u64 {
        self.dropped[Dropped::ALL.iter().position(|r| *r == reason).unwrap_or(0)].get()
    }

    /// Samples failed for `reason` (for tests).
    pub fn failed_count(&self, reason: Failed) -> u64 {
        self.failed[Failed::ALL.iter().position(|r| *r == reason).unwrap_or(0)].get()
    }
}
