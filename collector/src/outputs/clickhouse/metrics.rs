//! ClickHouse output self-metrics:
//!
//! | metric | meaning |
//! |---|---|
//! | `uctel_collector_clickhouse_rows_in_total` | log records handed to the output |
//! | `uctel_collector_clickhouse_rows_inserted_total` | rows of `INSERT`s the server acknowledged (2xx) |
//! | `uctel_collector_clickhouse_rows_dropped_total{reason}` | rows given up ([`Dropped`]) |
//! | `uctel_collector_clickhouse_rows_retried_total` | rows of `INSERT`s sent again (each retry counts) |
//! | `uctel_collector_clickhouse_rows_pending` | rows queued or in flight |
//! | `uctel_collector_clickhouse_insert_checks_total{result}` | queries asking whether an `INSERT` of unknown outcome landed (`landed`, `absent`, `running`, `failed`; `sender` module docs) |
//! | `uctel_collector_clickhouse_insert_duration_seconds` | duration of one `INSERT` request (histogram) |
//!
//! At every scrape `rows_in = rows_inserted + Σ rows_dropped + rows_pending`, exactly: the
//! counters change only under a queue's lock and the scrape (`LockedCollector` of the parent
//! module) holds the lock of every queue that counts in them while it reads (two while a
//! reload hands over from one endpoint to the next: they count in the same series). A dropped row is counted here only, not in the agent's
//! `uctel_collector_records_dropped_total` (`crate::outputs` module docs, "Drops").

use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};

use crate::telemetry::NAMESPACE;

/// Why a row was given up. The `reason` label value is [`Dropped::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// The server refused its `INSERT` for good: a bad-data or configuration error code,
    /// or a 4xx answer (`sender` module docs). Retrying the same rows cannot help.
    Rejected,
    /// The queue was full; the oldest row made room.
    QueueFull,
    /// Still queued, or its `INSERT` still failing, when the collector stopped.
    Shutdown,
    /// Still queued, or its `INSERT` still failing, when the grace period of an endpoint a
    /// reload replaced or removed ended (`crate::outputs::handover`).
    Reload,
}

impl Dropped {
    /// Every reason.
    pub const ALL: [Dropped; 4] = [
        Dropped::Rejected,
        Dropped::QueueFull,
        Dropped::Shutdown,
        Dropped::Reload,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Rejected => "rejected",
            Dropped::QueueFull => "queue_full",
            Dropped::Shutdown => "shutdown",
            Dropped::Reload => "reload",
        }
    }

    fn index(self) -> usize {
        match self {
            Dropped::Rejected => 0,
            Dropped::QueueFull => 1,
            Dropped::Shutdown => 2,
            Dropped::Reload => 3,
        }
    }
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
        .namespace(NAMESPACE)
        .subsystem("clickhouse")
}

/// The output's counters (registered through the output's locked collector only).
#[derive(Debug)]
pub struct Counters {
    rows_in: IntCounter,
    inserted: IntCounter,
    dropped_vec: IntCounterVec,
    dropped: [IntCounter; 4],
    retried: IntCounter,
    pending: IntGauge,
    duration: Histogram,
    checks: IntCounterVec,
}

impl Counters {
    /// Builds the counters, every reason at zero.
    ///
    /// # Errors
    /// A `prometheus` error for an invalid descriptor (a bug).
    pub fn new() -> prometheus::Result<Counters> {
        let dropped_vec = IntCounterVec::new(
            opts(
                "rows_dropped_total",
                "Log rows the ClickHouse output gave up, by reason.",
            ),
            &["reason"],
        )?;
        let dropped = Dropped::ALL.map(|r| dropped_vec.with_label_values(&[r.as_str()]));
        Ok(Counters {
            rows_in: IntCounter::with_opts(opts(
                "rows_in_total",
                "Log records handed to the ClickHouse output.",
            ))?,
            inserted: IntCounter::with_opts(opts(
                "rows_inserted_total",
                "Rows of INSERTs ClickHouse acknowledged.",
            ))?,
            dropped_vec,
            dropped,
            retried: IntCounter::with_opts(opts(
                "rows_retried_total",
                "Rows of INSERTs sent again after a recoverable error (each retry counts).",
            ))?,
            pending: IntGauge::with_opts(opts(
                "rows_pending",
                "Rows queued or in flight to ClickHouse.",
            ))?,
            duration: Histogram::with_opts(
                HistogramOpts::new(
                    "insert_duration_seconds",
                    "Duration of INSERT requests to ClickHouse, seconds.",
                )
                .namespace(NAMESPACE)
                .subsystem("clickhouse")
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ]),
            )?,
            checks: IntCounterVec::new(
                opts(
                    "insert_checks_total",
                    "Checks whether an INSERT of unknown outcome landed, by result.",
                ),
                &["result"],
            )?,
        })
    }

    /// The metric families, for the registered collector (`LockedCollector` of the
    /// parent module).
    pub(crate) fn collectors(&self) -> [&dyn Collector; 7] {
        [
            &self.checks,
            &self.rows_in,
            &self.inserted,
            &self.dropped_vec,
            &self.retried,
            &self.pending,
            &self.duration,
        ]
    }

    /// `n` rows handed in and queued (callers hold the queue lock).
    pub(crate) fn queued(&self, n: u64) {
        self.rows_in.inc_by(n);
        self.pending.add(n as i64);
    }

    /// `n` pending rows inserted.
    pub(crate) fn inserted(&self, n: u64) {
        self.inserted.inc_by(n);
        self.pending.sub(n as i64);
    }

    /// `n` pending rows dropped for `reason`.
    pub(crate) fn dropped(&self, reason: Dropped, n: u64) {
        self.dropped[reason.index()].inc_by(n);
        self.pending.sub(n as i64);
    }

    /// `n` rows of a request sent again.
    pub(crate) fn retried(&self, n: u64) {
        self.retried.inc_by(n);
    }

    /// One check of an ambiguous `INSERT` with `result`.
    pub(crate) fn checked(&self, result: &str) {
        self.checks.with_label_values(&[result]).inc();
    }

    /// One request's duration.
    pub(crate) fn observe(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    /// The figures now (callers hold the queue lock for a consistent view).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rows_in: self.rows_in.get(),
            inserted: self.inserted.get(),
            rejected: self.dropped[Dropped::Rejected.index()].get(),
            queue_full: self.dropped[Dropped::QueueFull.index()].get(),
            shutdown: self.dropped[Dropped::Shutdown.index()].get(),
            reload: self.dropped[Dropped::Reload.index()].get(),
            retried: self.retried.get(),
            pending: self.pending.get(),
        }
    }
}

/// The counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `rows_in_total`.
    pub rows_in: u64,
    /// `rows_inserted_total`.
    pub inserted: u64,
    /// `rows_dropped_total{reason="rejected"}`.
    pub rejected: u64,
    /// `rows_dropped_total{reason="queue_full"}`.
    pub queue_full: u64,
    /// `rows_dropped_total{reason="shutdown"}`.
    pub shutdown: u64,
    /// `rows_dropped_total{reason="reload"}`.
    pub reload: u64,
    /// `rows_retried_total`.
    pub retried: u64,
    /// `rows_pending`.
    pub pending: i64,
}

impl Snapshot {
    /// Rows dropped, every reason.
    pub fn dropped(&self) -> u64 {
        self.rejected + self.queue_full + self.shutdown + self.reload
    }
}
