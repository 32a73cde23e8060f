//! OTLP output self-metrics, per signal (`signal="metrics"`: data points; `signal="logs"`:
//! log records):
//!
//! | metric | meaning |
//! |---|---|
//! | `uctel_collector_otlp_items_in_total{signal}` | items handed to the output |
//! | `uctel_collector_otlp_items_sent_total{signal}` | items of requests the receiver accepted (2xx, less a partial success's rejected items) |
//! | `uctel_collector_otlp_items_dropped_total{signal,reason}` | items given up ([`Dropped`]) |
//! | `uctel_collector_otlp_items_retried_total{signal}` | items of requests sent again (each retry counts) |
//! | `uctel_collector_otlp_items_pending{signal}` | items queued or in flight |
//! | `uctel_collector_otlp_oldest_pending_seconds{signal}` | age of the oldest queued item at the scrape (the output's lag; 0 when none waits) |
//! | `uctel_collector_otlp_request_duration_seconds{signal}` | duration of one export request (histogram) |
//!
//! At every scrape, per signal, `items_in = items_sent + Σ items_dropped + items_pending`,
//! exactly: the counters change only under the signal queue's lock and the scrape (the
//! parent module's `LockedCollector`) holds both locks while it reads. A dropped item is
//! counted here only, not in the agent's `uctel_collector_records_dropped_total`
//! (`crate::outputs` module docs, "Drops").

use prometheus::core::Collector;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts,
};

use crate::telemetry::NAMESPACE;

/// Why an item was given up. The `reason` label value is [`Dropped::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// The receiver refused the request for good: a 4xx other than 429, or a 5xx other
    /// than 502/503/504 (OTLP/HTTP spec, "Failures": they must not be retried), or the
    /// request could not be built.
    Rejected,
    /// The receiver accepted the request but refused this many of its items, which it does
    /// not name (OTLP spec, "Partial Success": `rejected_data_points`,
    /// `rejected_log_records`). Its message is logged the first time it is seen.
    PartialSuccess,
    /// The queue was full; the oldest item made room.
    QueueFull,
    /// Still queued, or its request still failing, when the collector stopped.
    Shutdown,
    /// Still queued, or its request still failing, when the grace period of an endpoint a
    /// reload replaced or removed ended (`crate::outputs::handover`).
    Reload,
}

impl Dropped {
    /// Every reason.
    pub const ALL: [Dropped; 5] = [
        Dropped::Rejected,
        Dropped::PartialSuccess,
        Dropped::QueueFull,
        Dropped::Shutdown,
        Dropped::Reload,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Rejected => "rejected",
            Dropped::PartialSuccess => "partial_success",
            Dropped::QueueFull => "queue_full",
            Dropped::Shutdown => "shutdown",
            Dropped::Reload => "reload",
        }
    }

    fn index(self) -> usize {
        match self {
            Dropped::Rejected => 0,
            Dropped::PartialSuccess => 1,
            Dropped::QueueFull => 2,
            Dropped::Shutdown => 3,
            Dropped::Reload => 4,
        }
    }
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NAMESPACE).subsystem("otlp")
}

/// The metric families of the output (both signals), registered through the output's
/// locked collector only.
#[derive(Clone, Debug)]
pub struct Families {
    items_in: IntCounterVec,
    sent: IntCounterVec,
    dropped: IntCounterVec,
    retried: IntCounterVec,
    pending: IntGaugeVec,
    oldest: GaugeVec,
    duration: HistogramVec,
}

impl Families {
    /// Builds the families.
    ///
    /// # Errors
    /// A `prometheus` error for an invalid descriptor (a bug).
    pub fn new() -> prometheus::Result<Families> {
        Ok(Families {
            items_in: IntCounterVec::new(
                opts(
                    "items_in_total",
                    "Items (data points, log records) handed to the OTLP output.",
                ),
                &["signal"],
            )?,
            sent: IntCounterVec::new(
                opts(
                    "items_sent_total",
                    "Items of OTLP export requests the receiver accepted.",
                ),
                &["signal"],
            )?,
            dropped: IntCounterVec::new(
                opts(
                    "items_dropped_total",
                    "Items the OTLP output gave up, by reason.",
                ),
                &["signal", "reason"],
            )?,
            retried: IntCounterVec::new(
                opts(
                    "items_retried_total",
                    "Items of OTLP export requests sent again (each retry counts).",
                ),
                &["signal"],
            )?,
            pending: IntGaugeVec::new(
                opts(
                    "items_pending",
                    "Items queued or in flight to the OTLP receiver.",
                ),
                &["signal"],
            )?,
            oldest: GaugeVec::new(
                opts(
                    "oldest_pending_seconds",
                    "Age of the oldest item queued for the OTLP receiver, seconds (0: none).",
                ),
                &["signal"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "request_duration_seconds",
                    "Duration of OTLP export requests, seconds.",
                )
                .namespace(NAMESPACE)
                .subsystem("otlp")
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
                &["signal"],
            )?,
        })
    }

    /// The families, for the registered collector.
    pub(crate) fn collectors(&self) -> [&dyn Collector; 7] {
        [
            &self.items_in,
            &self.sent,
            &self.dropped,
            &self.retried,
            &self.pending,
            &self.oldest,
            &self.duration,
        ]
    }

    /// The counters of `signal` (`metrics`, `logs`), every reason at zero.
    pub fn signal(&self, signal: &str) -> Counters {
        Counters {
            items_in: self.items_in.with_label_values(&[signal]),
            sent: self.sent.with_label_values(&[signal]),
            dropped: Dropped::ALL.map(|r| self.dropped.with_label_values(&[signal, r.as_str()])),
            retried: self.retried.with_label_values(&[signal]),
            pending: self.pending.with_label_values(&[signal]),
            oldest: self.oldest.with_label_values(&[signal]),
            duration: self.duration.with_label_values(&[signal]),
        }
    }
}

/// One signal's counters.
#[derive(Clone, Debug)]
pub struct Counters {
    items_in: IntCounter,
    sent: IntCounter,
    dropped: [IntCounter; 5],
    retried: IntCounter,
    pending: IntGauge,
    pub(crate) oldest: Gauge,
    duration: Histogram,
}

impl Counters {
    /// `n` items handed in and queued (callers hold the queue lock).
    pub(crate) fn queued(&self, n: u64) {
        self.items_in.inc_by(n);
        self.pending.add(n as i64);
    }

    /// `n` pending items sent.
    pub(crate) fn sent(&self, n: u64) {
        self.sent.inc_by(n);
        self.pending.sub(n as i64);
    }

    /// `n` pending items dropped for `reason`.
    pub(crate) fn dropped(&self, reason: Dropped, n: u64) {
        self.dropped[reason.index()].inc_by(n);
        self.pending.sub(n as i64);
    }

    /// `n` items of a request sent again.
    pub(crate) fn retried(&self, n: u64) {
        self.retried.inc_by(n);
    }

    /// One request's duration.
    pub(crate) fn observe(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    /// The figures now (callers hold the queue lock for a consistent view).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            items_in: self.items_in.get(),
            sent: self.sent.get(),
            dropped: Dropped::ALL.map(|r| self.dropped[r.index()].get()),
            retried: self.retried.get(),
            pending: self.pending.get(),
        }
    }
}

/// One signal's counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `items_in_total`.
    pub items_in: u64,
    /// `items_sent_total`.
    pub sent: u64,
    /// `items_dropped_total`, in the order of [`Dropped::ALL`].
    pub dropped: [u64; 5],
    /// `items_retried_total`.
    pub retried: u64,
    /// `items_pending`.
    pub pending: i64,
}

impl Snapshot {
    /// Items dropped for `reason`.
    pub fn dropped_for(&self, reason: Dropped) -> u64 {
        self.dropped[reason.index()]
    }

    /// Items dropped, every reason.
    pub fn dropped(&self) -> u64 {
        self.dropped.iter().sum()
    }
}
