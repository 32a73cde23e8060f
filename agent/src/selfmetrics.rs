//! The agent's own counters, `uctel_agent_*` (DESIGN.md §7, §8).
//!
//! Every place the agent gives up on a frame or a record calls [`SelfMetrics::dropped`] with a
//! [`DropReason`] from one closed enum, so `records produced = records sent + records dropped`
//! holds per stream and the `reason` label has bounded cardinality. Drops are logged too, at
//! `warn`, with stream, reason and count: the first one of a stream and reason at once, then
//! one summary per [`DROP_LOG_EVERY`] at most ([`DropLog`]). The counters live in a
//! [`prometheus::Registry`] that is
//!
//! - served on the optional local `/metrics` (`listen.metrics`), and
//! - shipped through the pipeline like any other metric: [`SelfMetrics::to_records`] turns a
//!   `gather()` of the registry into [`payload::Metric`] records for the `metrics` stream.
//!
//! The send and drop counters (`frames_sent`, `records_sent`, `frames_dropped`,
//! `records_dropped`) also go to the collector in every heartbeat on the control connection
//! ([`SelfMetrics::agent_counters`]): the `metrics` stream is what a `no_credit` drop
//! discards, so its copy would freeze exactly while the agent drops. The collector exports
//! them as `uctel_collector_agent_*_total`.
//!
//! Other agent parts (the log source, for one) register their own collectors into
//! [`SelfMetrics::registry`], and they are exported the same two ways.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `uctel_agent_frames_sent_total` | counter | `stream` |
//! | `uctel_agent_records_sent_total` | counter | `stream` |
//! | `uctel_agent_bytes_sent_total` | counter | |
//! | `uctel_agent_frames_dropped_total` | counter | `stream`, `reason` |
//! | `uctel_agent_records_dropped_total` | counter | `stream`, `reason` |
//! | `uctel_agent_delivery_ratio` | gauge | `stream` |
//! | `uctel_agent_reconnects_total` | counter | |
//! | `uctel_agent_connected` | gauge | |
//! | `uctel_agent_queue_records` | gauge | `stream` |
//! | `uctel_agent_buffer_records` | gauge | `stream` (`metrics` only) |
//! | `uctel_agent_records_collected_total` | counter | `stream` (`metrics` only) |
//! | `uctel_agent_records_truncated_total` | counter | `stream` |
//! | `uctel_agent_fault_packets_total` | counter | `action` (only with fault injection) |
//! | `uctel_agent_rc_qp_events_total` | counter | `event` (only with an RC lane) |
//! | `uctel_agent_rc_lane_failures_total` | counter | (only with an RC lane) |
//! | `uctel_agent_source_errors_total` | counter | `source`, `reason` |
//! | `uctel_agent_rdma_port_state_changes_total` | counter | `device`, `port`, `to` |
//! | `uctel_agent_rdma_gid_changes_total` | counter | `device`, `port` |
//! | `uctel_agent_rdma_async_events_total` | counter | `event` |
//!
//! `uctel_agent_source_errors_total{source,reason}` counts the inputs a source had to skip, at
//! every collection that skipped them: `source="infiniband"`, one per RDMA counter file
//! that could not be read or parsed, `reason` from [`SkipReason`] (`not_available` for
//! `N/A (no PMA)`, `read_error`, `parse_error`); `source="textfile"`, one per `*.prom` file
//! skipped, `reason` from `sources::textfile::FileError` (`read_error`, `parse_error`,
//! `timestamps`); `source="ethtool"`, one per interface request that failed other than with
//! `EOPNOTSUPP` and per statistic dropped for a clashing name, `reason` from
//! `sources::node::ethtool::SkipReason` (`link_info_error`, `driver_info_error`,
//! `stats_error`, `duplicate_name`); `source="scrape"`, one per failed scrape, `reason` from
//! `sources::scrape::ScrapeError` (`down`, `timeout`, `http_status`, `parse_error`,
//! `body_too_large`, `sample_limit`), and one per sample of a successful scrape refused,
//! `reason` from `sources::scrape::SampleRefusal` (`duplicate`, `timestamp_too_new`,
//! `timestamp_too_old`); `source="kmsg"`, one per failed open or read of `/dev/kmsg`
//! (`permission_denied`: no `CAP_SYSLOG` where `kernel.dmesg_restrict=1`, `not_found`,
//! `read_error`). Each distinct file and reason is also logged
//! once at `warn` ([`SelfMetrics::infiniband_file_skipped`]).
//!
//! `uctel_agent_fault_packets_total{action}` counts what the soft transport's fault injector
//! (`transport.soft.fault`, a lab setting) did to the agent's outgoing packets, summed over
//! every session: `passed`, `dropped`, `duplicated`, `reordered`, `corrupted`, `delayed`
//! ([`FaultAction`]). The injector is rebuilt with each session's device; [`FaultTally`] keeps
//! the running total. With one packet per frame (DESIGN.md §3) and drops as the only fault,
//! `dropped` equals the frames the collector counts lost. The series exist only once
//! [`SelfMetrics::enable_fault_metrics`] was called (the agent does so when the configuration
//! turns fault injection on).
//!
//! `uctel_agent_rc_qp_events_total{event}` counts what the RC QP of the streams set to
//! `reliability: rc` did to deliver (DESIGN.md §8b), summed over every session, `event` from
//! `uctel_transport::api::RcCounters::NAMES`: `packets_retransmitted`, `timeouts`,
//! `naks_sent`, `naks_received`, `rnr_naks_sent`, `rnr_naks_received`, `retry_exceeded`,
//! `rnr_retry_exceeded`, `duplicates` (IBTA 9.7; rxe's `hw_counters` name the same events).
//! Each session's QP counts from zero; `crate::lane::RcTally` keeps the running total. The
//! verbs transport counts these per port, not per QP: there they stay 0 (read the device's
//! `hw_counters`). `uctel_agent_rc_lane_failures_total` counts the sessions that ended
//! because the RC QP failed (an error completion such as `retry_exceeded_error`, the QP in
//! ERROR, or a fatal async event); the agent then reconnects with a new epoch. Both families
//! exist, every `event` at zero, only once [`SelfMetrics::enable_rc_metrics`] was called (the
//! agent does so when a stream is set to `reliability: rc`).
//!
//! The registry also holds the agent's own standard `process_*` series
//! (`uctel_common::http::register_process_metrics`: CPU seconds, memory, file descriptors,
//! start time, threads), served and shipped like the rest: at the collector they carry the
//! host's `instance`, so a Node Exporter dashboard's exporter-process panels show the agent,
//! the exporter of that host.
//!
//! The `uctel_agent_rdma_*` series are described in [`crate::rdma_events`].
//!
//! The log sources add `uctel_agent_log_records_read_total`, `uctel_agent_log_bytes_read_total`,
//! `uctel_agent_log_discarded_bytes_total`, `uctel_agent_log_truncated_unread_bytes_total`,
//! `uctel_agent_log_checkpoint_errors_total`, `uctel_agent_log_files` and
//! `uctel_agent_log_events_total{reason}` (see `runners::LogMetrics`).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use prometheus::core::Collector;
use prometheus::proto::MetricType as PromType;
use prometheus::{
    Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use uctel_protocol::{control, payload};
use uctel_transport::api::RcCounters;
use uctel_transport::soft::fault::{FaultCounts, FaultStats};

use crate::rdma_events::RdmaEventMetrics;
use crate::sources::rdma::{SkipReason, SkippedFile};
use crate::stream::Stream;

/// Why the agent dropped a frame or records. Closed: adding a reason is a deliberate change to
/// the exported label set (the collector uses the same reason names for its own drops where
/// they apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The credit window was full (DESIGN.md §4): dropped instead of lapping the collector's
    /// ring.
    NoCredit,
    /// The transport's send queue stayed full (every send WR and buffer in flight) while a
    /// stream's bounded frame queue was full too: its oldest frame was dropped so the
    /// newest data goes first once the QP drains (streams with `on_no_credit: drop`).
    SendQueueFull,
    /// A single record was larger than the maximum frame size and cannot be framed.
    Oversize,
    /// A record failed the frame codec's validation (metric name grammar, string limits), so
    /// the collector would reject the whole frame holding it.
    Invalid,
    /// The bounded queue between a source and the sender was full; dropped at the source,
    /// which is never blocked.
    SourceOverflow,
    /// No connection to the collector (handshake not done, reconnecting).
    NotConnected,
    /// The transport refused or failed the post (send queue full at the QP, QP in error).
    TransportError,
    /// Records still queued (or framed but not sent) when the agent shut down. Log lines
    /// dropped so are not checkpointed: the log sources read them again after a restart.
    Shutdown,
    /// Kernel log records the kernel's ring buffer overwrote before the `kmsg` source read
    /// them (read(2) of `/dev/kmsg` said `EPIPE`, or they were overwritten while the agent
    /// was down), counted exactly from the gap in the kernel's sequence numbers
    /// (`sources::kmsg`; Linux `Documentation/ABI/testing/dev-kmsg`).
    KmsgOverwritten,
    /// systemd journal entries deleted from the journal (`journalctl --vacuum-*`,
    /// `SystemMaxUse=` and the like, rotation away) before the `journald` source read them,
    /// while the agent was down or behind, counted exactly from the gap in the journal's
    /// sequence numbers (the cursor's `s=` sequence id and `i=` number,
    /// sd_journal_get_cursor(3); `sources::journald`, "Entries vacuumed unread").
    JournalVacuumed,
}

impl DropReason {
    /// Every reason, for pre-registering zero-valued series.
    pub const ALL: [DropReason; 10] = [
        DropReason::NoCredit,
        DropReason::SendQueueFull,
        DropReason::Oversize,
        DropReason::Invalid,
        DropReason::SourceOverflow,
        DropReason::NotConnected,
        DropReason::TransportError,
        DropReason::Shutdown,
        DropReason::KmsgOverwritten,
        DropReason::JournalVacuumed,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::NoCredit => "no_credit",
            DropReason::SendQueueFull => "send_queue_full",
            DropReason::Oversize => "oversize",
            DropReason::Invalid => "invalid",
            DropReason::SourceOverflow => "source_overflow",
            DropReason::NotConnected => "not_connected",
            DropReason::TransportError => "transport_error",
            DropReason::Shutdown => "shutdown",
            DropReason::KmsgOverwritten => "kmsg_overwritten",
            DropReason::JournalVacuumed => "journal_vacuumed",
        }
    }

    /// Whether the drop is the agent working as designed (load shedding, shutdown) rather than
    /// a fault: the `intentional` field of the drop log line (every drop logs at `warn`,
    /// rate-limited, see [`DropLog`]).
    pub fn intentional(self) -> bool {
        match self {
            DropReason::NoCredit
            | DropReason::SendQueueFull
            | DropReason::SourceOverflow
            | DropReason::NotConnected
            | DropReason::Shutdown => true,
            DropReason::Oversize
            | DropReason::Invalid
            | DropReason::TransportError
            | DropReason::KmsgOverwritten
            | DropReason::JournalVacuumed => false,
        }
    }

    /// Position of the reason in [`DropReason::ALL`] (and in per-reason counter arrays).
    pub(crate) fn index(self) -> usize {
        match self {
            DropReason::NoCredit => 0,
            DropReason::SendQueueFull => 1,
            DropReason::Oversize => 2,
            DropReason::Invalid => 3,
            DropReason::SourceOverflow => 4,
            DropReason::NotConnected => 5,
            DropReason::TransportError => 6,
            DropReason::Shutdown => 7,
            DropReason::KmsgOverwritten => 8,
            DropReason::JournalVacuumed => 9,
        }
    }
}

impl DropReason {
    /// The reason as the control protocol names it in `Heartbeat.agent_counters`.
    pub fn wire(self) -> control::AgentDropReason {
        match self {
            DropReason::NoCredit => control::AgentDropReason::NoCredit,
            DropReason::SendQueueFull => control::AgentDropReason::SendQueueFull,
            DropReason::Oversize => control::AgentDropReason::Oversize,
            DropReason::Invalid => control::AgentDropReason::Invalid,
            DropReason::SourceOverflow => control::AgentDropReason::SourceOverflow,
            DropReason::NotConnected => control::AgentDropReason::NotConnected,
            DropReason::TransportError => control::AgentDropReason::TransportError,
            DropReason::Shutdown => control::AgentDropReason::Shutdown,
            DropReason::KmsgOverwritten => control::AgentDropReason::KmsgOverwritten,
            DropReason::JournalVacuumed => control::AgentDropReason::JournalVacuumed,
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// At most one drop log line per stream and reason per this period ([`DropLog`]).
pub const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// One log line about the drops of one stream for one reason, made by [`DropLog`].
///
/// `Display` gives the message, e.g. `dropped 16533 log records in 16533 frames (reason
/// no_credit, stream logs) in the last 10 s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropLine {
    /// The stream the drops were on.
    pub stream: Stream,
    /// Why.
    pub reason: DropReason,
    /// Frames dropped since the previous line (0 for records dropped before framing).
    pub frames: u64,
    /// Records dropped since the previous line.
    pub records: u64,
    /// `None`: the first drop after a quiet period of at least [`DropLog`]'s period (this
    /// drop alone, logged at once); `Some(t)`: every drop since the previous line, `t` ago.
    pub window: Option<Duration>,
    /// The [`DropLog`] period, named in the first line.
    pub every: Duration,
}

impl std::fmt::Display for DropLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        let kind = match self.stream {
            Stream::Metrics => "metric",
            Stream::Logs => "log",
            Stream::FastCounters => "counter sample",
        };
        write!(
            f,
            "dropped {} {kind} record{}",
            self.records,
            plural(self.records)
        )?;
        if self.frames > 0 {
            write!(f, " in {} frame{}", self.frames, plural(self.frames))?;
        }
        write!(f, " (reason {}, stream {})", self.reason, self.stream)?;
        match self.window {
            None => write!(
                f,
                "; more drops of this stream and reason are summed up at most every {} s",
                self.every.as_secs_f64()
            ),
            Some(t) if t >= Duration::from_secs(10) => {
                write!(f, " in the last {:.0} s", t.as_secs_f64())
            }
            Some(t) => write!(f, " in the last {:.1} s", t.as_secs_f64()),
        }
    }
}

/// Drops not logged yet for one stream and reason.
#[derive(Debug, Clone, Copy, Default)]
struct DropSlot {
    /// When the last line for this stream and reason was made.
    last_line: Option<Instant>,
    frames: u64,
    records: u64,
}

impl DropSlot {
    fn pending(&self) -> bool {
        self.frames > 0 || self.records > 0
    }

    /// The line for what is pending; resets the sums and starts the next period at `now`.
    fn take(
        &mut self,
        stream: Stream,
        reason: DropReason,
        window: Option<Duration>,
        every: Duration,
        now: Instant,
    ) -> DropLine {
        let line = DropLine {
            stream,
            reason,
            frames: self.frames,
            records: self.records,
            window,
            every,
        };
        *self = DropSlot {
            last_line: Some(now),
            frames: 0,
            records: 0,
        };
        line
    }
}

/// The rate limit of drop log lines, sans-IO: the caller passes `now` and logs the
/// [`DropLine`]s it gets back.
///
/// Per stream and reason: the first drop after a quiet period (no line for at least `every`,
/// and nothing pending) gives a line at once; later drops are summed and given as one summary
/// line once `every` has passed since the previous line, either by the next
/// [`DropLog::record`] or by [`DropLog::poll`] (so the tail of a burst is logged too). So
/// there is at most one line per stream and reason per `every`, and every dropped record is
/// in exactly one line (after [`DropLog::flush`] at the end).
#[derive(Debug, Clone)]
pub struct DropLog {
    every: Duration,
    slots: PerStreamReason<DropSlot>,
}

impl DropLog {
    /// A limiter allowing one line per stream and reason per `every` ([`DROP_LOG_EVERY`] in
    /// the agent).
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            slots: [[DropSlot::default(); DropReason::ALL.len()]; Stream::ALL.len()],
        }
    }

    /// Counts `frames` frames holding `records` records dropped on `stream` for `reason` at
    /// `now`; returns the line to log now, if one is due. Nothing dropped (both 0): `None`.
    pub fn record(
        &mut self,
        stream: Stream,
        reason: DropReason,
        frames: u64,
        records: u64,
        now: Instant,
    ) -> Option<DropLine> {
        if frames == 0 && records == 0 {
            return None;
        }
        let every = self.every;
        let slot = self
            .slots
            .get_mut(stream.index())
            .and_then(|r| r.get_mut(reason.index()))?;
        let since = slot.last_line.map(|t| now.saturating_duration_since(t));
        let quiet = !slot.pending() && since.is_none_or(|s| s >= every);
        slot.frames = slot.frames.saturating_add(frames);
        slot.records = slot.records.saturating_add(records);
        if quiet {
            return Some(slot.take(stream, reason, None, every, now));
        }
        match since {
            Some(s) if s >= every => Some(slot.take(stream, reason, Some(s), every, now)),
            _ => None,
        }
    }

    /// The summary lines due at `now`: drops not logged yet whose previous line is at least
    /// the period old, oldest stream and reason first.
    pub fn poll(&mut self, now: Instant) -> Vec<DropLine> {
        self.drain(now, false)
    }

    /// Every drop not logged yet as summary lines, due or not (at shutdown).
    pub fn flush(&mut self, now: Instant) -> Vec<DropLine> {
        self.drain(now, true)
    }

    fn drain(&mut self, now: Instant, all: bool) -> Vec<DropLine> {
        let every = self.every;
        let mut out = Vec::new();
        for (stream, row) in Stream::ALL.into_iter().zip(self.slots.iter_mut()) {
            for (reason, slot) in DropReason::ALL.into_iter().zip(row.iter_mut()) {
                if !slot.pending() {
                    continue;
                }
                let since = slot.last_line.map(|t| now.saturating_duration_since(t));
                if all || since.is_none_or(|s| s >= every) {
                    out.push(slot.take(stream, reason, since, every, now));
                }
            }
        }
        out
    }
}

/// What the soft transport's fault injector did to a packet: the `action` label of
/// `uctel_agent_fault_packets_total`, one per field of [`FaultCounts`] (the injector's own
/// counters, `transport::soft::fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultAction {
    /// Handed on to the network (duplicates included).
    Passed,
    /// Dropped.
    Dropped,
    /// Extra copies made.
    Duplicated,
    /// Held back for reordering.
    Reordered,
    /// One bit flipped.
    Corrupted,
    /// Delayed by `delay_ms`.
    Delayed,
}

impl FaultAction {
    /// Every action, in label order.
    pub const ALL: [FaultAction; 6] = [
        FaultAction::Passed,
        FaultAction::Dropped,
        FaultAction::Duplicated,
        FaultAction::Reordered,
        FaultAction::Corrupted,
        FaultAction::Delayed,
    ];

    /// The `action` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultAction::Passed => "passed",
            FaultAction::Dropped => "dropped",
            FaultAction::Duplicated => "duplicated",
            FaultAction::Reordered => "reordered",
            FaultAction::Corrupted => "corrupted",
            FaultAction::Delayed => "delayed",
        }
    }

    /// This action's count in `c`.
    pub fn of(self, c: &FaultCounts) -> u64 {
        match self {
            FaultAction::Passed => c.passed,
            FaultAction::Dropped => c.dropped,
            FaultAction::Duplicated => c.duplicated,
            FaultAction::Reordered => c.reordered,
            FaultAction::Corrupted => c.corrupted,
            FaultAction::Delayed => c.delayed,
        }
    }

    fn index(self) -> usize {
        match self {
            FaultAction::Passed => 0,
            FaultAction::Dropped => 1,
            FaultAction::Duplicated => 2,
            FaultAction::Reordered => 3,
            FaultAction::Corrupted => 4,
            FaultAction::Delayed => 5,
        }
    }
}

/// Follows one fault injector (one session's soft device) and adds what it counted since the
/// last [`FaultTally::sync`] to the agent's running totals, so the exported counters stay
/// cumulative when the next session builds a new injector that counts from zero.
#[derive(Debug)]
pub struct FaultTally {
    stats: Arc<FaultStats>,
    seen: FaultCounts,
}

impl FaultTally {
    /// Starts following `stats` (counts already in it are added at the first sync).
    pub fn new(stats: Arc<FaultStats>) -> Self {
        Self {
            stats,
            seen: FaultCounts::default(),
        }
    }

    /// Adds the growth of the injector's counters since the last sync to `metrics`; returns
    /// the injector's counts so far (this session's).
    pub fn sync(&mut self, metrics: &SelfMetrics) -> FaultCounts {
        let now = self.stats.snapshot();
        let seen = &self.seen;
        let delta = FaultCounts {
            passed: now.passed.saturating_sub(seen.passed),
            dropped: now.dropped.saturating_sub(seen.dropped),
            duplicated: now.duplicated.saturating_sub(seen.duplicated),
            reordered: now.reordered.saturating_sub(seen.reordered),
            corrupted: now.corrupted.saturating_sub(seen.corrupted),
            delayed: now.delayed.saturating_sub(seen.delayed),
        };
        metrics.add_fault_counts(&delta);
        self.seen = now;
        now
    }
}

/// Metric name prefix of the agent's self-metrics.
pub const PREFIX: &str = "uctel_agent_";

type PerStream<T> = [T; Stream::ALL.len()];
type PerStreamReason<T> = [[T; DropReason::ALL.len()]; Stream::ALL.len()];

/// The agent's self-metrics. Cheap to update from any thread (atomics behind pre-resolved
/// label handles); share it with an `Arc`.
#[derive(Debug)]
pub struct SelfMetrics {
    registry: Registry,
    frames_sent: PerStream<IntCounter>,
    records_sent: PerStream<IntCounter>,
    bytes_sent: IntCounter,
    frames_dropped: PerStreamReason<IntCounter>,
    records_dropped: PerStreamReason<IntCounter>,
    delivery_ratio: PerStream<Gauge>,
    reconnects: IntCounter,
    connected: IntGauge,
    queue_records: PerStream<IntGauge>,
    /// `buffer_records{stream="metrics"}`.
    buffer_records: IntGauge,
    /// `records_collected_total{stream="metrics"}`.
    records_collected: IntCounter,
    records_truncated: PerStream<IntCounter>,
    /// `fault_packets_total{action}`, registered by [`SelfMetrics::enable_fault_metrics`].
    fault_packets: OnceLock<[IntCounter; FaultAction::ALL.len()]>,
    /// `rc_qp_events_total{event}` and `rc_lane_failures_total`, registered by
    /// [`SelfMetrics::enable_rc_metrics`].
    rc: OnceLock<RcMetrics>,
    /// Rate limit of the drop log lines.
    drop_log: Mutex<DropLog>,
    /// `source_errors_total{source="infiniband",reason}`.
    infiniband_skipped: [IntCounter; SkipReason::ALL.len()],
    /// `source_errors_total{source,reason}` for the other sources.
    source_errors: IntCounterVec,
    /// `rdma_*`: port events and async events.
    rdma: RdmaEventMetrics,
    /// Random, chosen when these counters were created at zero: it names their lifetime in
    /// the heartbeats' `agent_counters` ([`SelfMetrics::agent_counters`]).
    counters_epoch: u64,
    /// What the sources and the sender show on the status API (`crate::status`).
    status: crate::status::Board,
}

/// The RC lane's counters ([`SelfMetrics::enable_rc_metrics`]).
#[derive(Debug)]
struct RcMetrics {
    /// `rc_qp_events_total{event}`, in [`RcCounters::NAMES`] order.
    events: [IntCounter; RcCounters::NAMES.len()],
    /// `rc_lane_failures_total`.
    failures: IntCounter,
}

/// Registering the self-metrics failed (a name clash in the registry).
#[derive(Debug, thiserror::Error)]
#[error("registering agent self-metric {name}: {source}")]
pub struct RegisterError {
    name: String,
    #[source]
    source: prometheus::Error,
}

fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    c: C,
) -> Result<C, RegisterError> {
    registry
        .register(Box::new(c.clone()))
        .map_err(|source| RegisterError {
            name: name.to_owned(),
            source,
        })?;
    Ok(c)
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("{PREFIX}{name}"), help)
}

impl SelfMetrics {
    /// Creates and registers every series, each label combination at zero, in a fresh
    /// registry.
    ///
    /// # Errors
    /// [`RegisterError`] only if the metric definitions themselves are invalid (a bug).
    pub fn new() -> Result<Self, RegisterError> {
        let registry = Registry::new();
        let r = &registry;
        let mk = |e: prometheus::Error, name: &str| RegisterError {
            name: name.to_owned(),
            source: e,
        };
        uctel_common::http::register_process_metrics(r).map_err(|e| mk(e, "process"))?;
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(opts(name, help), labels)
                .map_err(|e| mk(e, name))
                .and_then(|v| register(r, name, v))
        };
        let frames_sent_v = counter_vec(
            "frames_sent_total",
            "Frames posted to the transport, per stream.",
            &["stream"],
        )?;
        let records_sent_v = counter_vec(
            "records_sent_total",
            "Records (metric samples, log lines) in frames posted to the transport, per stream.",
            &["stream"],
        )?;
        let frames_dropped_v = counter_vec(
            "frames_dropped_total",
            "Frames the agent dropped before posting them, per stream and reason.",
            &["stream", "reason"],
        )?;
        let records_dropped_v = counter_vec(
            "records_dropped_total",
            "Records the agent dropped before posting them, per stream and reason.",
            &["stream", "reason"],
        )?;
        let bytes_sent = IntCounter::with_opts(opts(
            "bytes_sent_total",
            "Frame bytes (header and payload) posted to the transport.",
        ))
        .map_err(|e| mk(e, "bytes_sent_total"))
        .and_then(|c| register(r, "bytes_sent_total", c))?;
        let reconnects = IntCounter::with_opts(opts(
            "reconnects_total",
            "Connections to the collector established after the first one (each with a new epoch).",
        ))
        .map_err(|e| mk(e, "reconnects_total"))
        .and_then(|c| register(r, "reconnects_total", c))?;
        let connected = IntGauge::with_opts(opts(
            "connected",
            "1 while the agent has a welcomed connection to the collector, else 0.",
        ))
        .map_err(|e| mk(e, "connected"))
        .and_then(|c| register(r, "connected", c))?;
        let delivery_v = GaugeVec::new(
            opts(
                "delivery_ratio",
                "Fraction of frames posted that the collector received, as last reported by the collector (received / (received + lost)).",
            ),
            &["stream"],
        )
        .map_err(|e| mk(e, "delivery_ratio"))
        .and_then(|c| register(r, "delivery_ratio", c))?;
        let queue_v = IntGaugeVec::new(
            opts(
                "queue_records",
                "Records waiting in the bounded queue between the sources and the sender.",
            ),
            &["stream"],
        )
        .map_err(|e| mk(e, "queue_records"))
        .and_then(|c| register(r, "queue_records", c))?;
        let buffer_v = IntGaugeVec::new(
            opts(
                "buffer_records",
                "Metric samples held while the agent has no connection to a collector \
                 (streams.metrics.buffer_while_disconnected_records), sent first after the \
                 next Welcome.",
            ),
            &["stream"],
        )
        .map_err(|e| mk(e, "buffer_records"))
        .and_then(|c| register(r, "buffer_records", c))?;

        let collected_v = counter_vec(
            "records_collected_total",
            "Metric samples the sources (host metrics, self-metrics, scrape targets, \
             textfiles) offered to the metrics stream. Each is sent, dropped with a reason, \
             or still queued, buffered or in the send pipeline: once the agent has stopped, \
             collected = records_sent_total + records_dropped_total (every reason). The logs \
             stream counts the lines read (log_records_read_total), fast_counters its samples \
             (fast_samples_total).",
            &["stream"],
        )?;
        let truncated_v = counter_vec(
            "records_truncated_total",
            "Records cut to fit one frame (log lines longer than the connection's frame size), marked truncated=\"frame\".",
            &["stream"],
        )?;
        let source_errors_v = counter_vec(
            "source_errors_total",
            "Inputs a source skipped (an RDMA counter file or a textfile that could not be read or parsed), at every collection that skipped them, by source and reason.",
            &["source", "reason"],
        )?;
        let rdma = RdmaEventMetrics::register(r, PREFIX).map_err(|e| mk(e, "rdma_*"))?;
        let per_stream_counter =
            |v: &IntCounterVec| Stream::ALL.map(|s| v.with_label_values(&[s.as_str()]));
        let per_stream_reason = |v: &IntCounterVec| {
            Stream::ALL
                .map(|s| DropReason::ALL.map(|d| v.with_label_values(&[s.as_str(), d.as_str()])))
        };
        let delivery_ratio = Stream::ALL.map(|s| {
            let g = delivery_v.with_label_values(&[s.as_str()]);
            g.set(1.0);
            g
        });
        Ok(Self {
            frames_sent: per_stream_counter(&frames_sent_v),
            records_sent: per_stream_counter(&records_sent_v),
            frames_dropped: per_stream_reason(&frames_dropped_v),
            records_dropped: per_stream_reason(&records_dropped_v),
            bytes_sent,
            delivery_ratio,
            reconnects,
            connected,
            queue_records: Stream::ALL.map(|s| queue_v.with_label_values(&[s.as_str()])),
            buffer_records: buffer_v.with_label_values(&[Stream::Metrics.as_str()]),
            records_collected: collected_v.with_label_values(&[Stream::Metrics.as_str()]),
            records_truncated: per_stream_counter(&truncated_v),
            fault_packets: OnceLock::new(),
            rc: OnceLock::new(),
            drop_log: Mutex::new(DropLog::new(DROP_LOG_EVERY)),
            infiniband_skipped: SkipReason::ALL
                .map(|r| source_errors_v.with_label_values(&["infiniband", r.as_str()])),
            source_errors: source_errors_v,
            rdma,
            registry,
            counters_epoch: rand::random(),
            status: crate::status::Board::default(),
        })
    }

    /// The send and drop counters for the control protocol (`Heartbeat.agent_counters`):
    /// per stream the frames and records sent, per stream and reason the frames and
    /// records dropped (every pair, zeros included), cumulative since these counters were
    /// created, under their random `counters_epoch`. The values of
    /// `uctel_agent_{frames,records}_{sent,dropped}_total`.
    pub fn agent_counters(&self) -> control::AgentCounters {
        control::AgentCounters {
            counters_epoch: self.counters_epoch,
            sent: Stream::ALL
                .iter()
                .map(|s| control::AgentStreamSent {
                    stream_id: s.id(),
                    frames: self.frames_sent(*s),
                    records: self.records_sent(*s),
                })
                .collect(),
            dropped: Stream::ALL
                .iter()
                .flat_map(|s| {
                    DropReason::ALL
                        .iter()
                        .map(move |r| control::AgentStreamDropped {
                            stream_id: s.id(),
                            reason: r.wire() as i32,
                            frames: self.frames_dropped(*s, *r),
                            records: self.records_dropped(*s, *r),
                        })
                })
                .collect(),
        }
    }

    /// Registers `uctel_agent_fault_packets_total{action}`, every action at zero. Idempotent.
    ///
    /// # Errors
    /// [`RegisterError`] if another collector already took the name.
    pub fn enable_fault_metrics(&self) -> Result<(), RegisterError> {
        if self.fault_packets.get().is_some() {
            return Ok(());
        }
        let name = "fault_packets_total";
        let v = IntCounterVec::new(
            opts(
                name,
                "Outgoing packets the soft transport's fault injector (transport.soft.fault) passed, dropped, duplicated, reordered, corrupted or delayed, over every session.",
            ),
            &["action"],
        )
        .map_err(|source| RegisterError {
            name: name.to_owned(),
            source,
        })?;
        let counters = FaultAction::ALL.map(|a| v.with_label_values(&[a.as_str()]));
        // Only the first caller registers (a racing second one finds the cell set).
        if self.fault_packets.set(counters).is_ok() {
            register(&self.registry, name, v)?;
        }
        Ok(())
    }

    /// Adds `delta` to `fault_packets_total` (a no-op unless enabled).
    pub fn add_fault_counts(&self, delta: &FaultCounts) {
        if let Some(c) = self.fault_packets.get() {
            for a in FaultAction::ALL {
                c[a.index()].inc_by(a.of(delta));
            }
        }
    }

    /// Registers `uctel_agent_rc_qp_events_total{event}` (every event of
    /// [`RcCounters::NAMES`] at zero) and `uctel_agent_rc_lane_failures_total`. Idempotent.
    ///
    /// # Errors
    /// [`RegisterError`] if another collector already took a name.
    pub fn enable_rc_metrics(&self) -> Result<(), RegisterError> {
        if self.rc.get().is_some() {
            return Ok(());
        }
        let err = |name: &str| {
            let name = name.to_owned();
            move |source| RegisterError { name, source }
        };
        let events = "rc_qp_events_total";
        let v = IntCounterVec::new(
            opts(
                events,
                "What the RC QP of the streams set to reliability: rc did to deliver (retransmissions, timeouts, NAKs, retry exhaustion), over every session; 0 on the verbs transport, which counts these per port.",
            ),
            &["event"],
        )
        .map_err(err(events))?;
        let failures = "rc_lane_failures_total";
        let f = IntCounter::with_opts(opts(
            failures,
            "Sessions ended because the RC QP failed (an error completion such as retry_exceeded_error, the QP in ERROR, or a fatal async event).",
        ))
        .map_err(err(failures))?;
        let m = RcMetrics {
            events: RcCounters::NAMES.map(|n| v.with_label_values(&[n])),
            failures: f.clone(),
        };
        // Only the first caller registers (a racing second one finds the cell set).
        if self.rc.set(m).is_ok() {
            register(&self.registry, events, v)?;
            register(&self.registry, failures, f)?;
        }
        Ok(())
    }

    /// Adds `delta` (one session's RC QP growth) to `rc_qp_events_total` (a no-op unless
    /// enabled).
    pub fn add_rc_counts(&self, delta: &RcCounters) {
        if let Some(m) = self.rc.get() {
            for (c, (_, n)) in m.events.iter().zip(delta.iter()) {
                c.inc_by(n);
            }
        }
    }

    /// Counts a session ended by a failed RC QP (a no-op unless enabled).
    pub fn rc_lane_failed(&self) {
        if let Some(m) = self.rc.get() {
            m.failures.inc();
        }
    }

    /// `rc_qp_events_total{event}` so far (`event` from [`RcCounters::NAMES`]); `None` unless
    /// enabled or for an unknown event.
    pub fn rc_qp_events(&self, event: &str) -> Option<u64> {
        let i = RcCounters::NAMES.iter().position(|n| *n == event)?;
        self.rc.get().map(|m| m.events[i].get())
    }

    /// `rc_lane_failures_total` so far; `None` unless enabled.
    pub fn rc_lane_failures(&self) -> Option<u64> {
        self.rc.get().map(|m| m.failures.get())
    }

    /// `fault_packets_total{action}` so far; `None` unless enabled.
    pub fn fault_packets(&self, action: FaultAction) -> Option<u64> {
        self.fault_packets.get().map(|c| c[action.index()].get())
    }

    /// The registry holding these metrics; other agent parts register their collectors here.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The status board the sources and the sender fill (`crate::status`).
    pub fn status(&self) -> &crate::status::Board {
        &self.status
    }

    /// One frame of `bytes` bytes (header + payload) holding `records` records was posted.
    pub fn frame_sent(&self, stream: Stream, records: u64, bytes: u64) {
        self.frames_sent[stream.index()].inc();
        self.records_sent[stream.index()].inc_by(records);
        self.bytes_sent.inc_by(bytes);
    }

    /// `frames` frames holding `records` records were dropped for `reason`. Records dropped
    /// before they were framed (source overflow, an oversize record) count with `frames = 0`.
    ///
    /// Logs at `warn`, rate-limited by [`DropLog`]: the first drop of a stream and reason at
    /// once, then at most one summary per [`DROP_LOG_EVERY`] with the count since the
    /// previous line. Call [`SelfMetrics::log_due_drops`] regularly so the tail of a burst is
    /// logged, and [`SelfMetrics::log_pending_drops`] at the end.
    pub fn dropped(&self, stream: Stream, reason: DropReason, frames: u64, records: u64) {
        let (s, d) = (stream.index(), reason.index());
        if let Some(c) = self.frames_dropped.get(s).and_then(|r| r.get(d)) {
            c.inc_by(frames);
        }
        if let Some(c) = self.records_dropped.get(s).and_then(|r| r.get(d)) {
            c.inc_by(records);
        }
        let line = self
            .drop_log()
            .record(stream, reason, frames, records, Instant::now());
        if let Some(line) = line {
            log_drop(&line);
        }
    }

    /// Logs the drop summaries that are due (drops not logged yet, the previous line of their
    /// stream and reason at least [`DROP_LOG_EVERY`] old). Cheap; call it from a loop that
    /// runs at least every few seconds.
    pub fn log_due_drops(&self) {
        let lines = self.drop_log().poll(Instant::now());
        for line in &lines {
            log_drop(line);
        }
    }

    /// Logs every drop not logged yet, due or not (at shutdown, so the log accounts for
    /// every drop).
    pub fn log_pending_drops(&self) {
        let lines = self.drop_log().flush(Instant::now());
        for line in &lines {
            log_drop(line);
        }
    }

    fn drop_log(&self) -> std::sync::MutexGuard<'_, DropLog> {
        self.drop_log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The event of an RDMA counter file skipped by a host-metrics collection
    /// ([`crate::sources::rdma`]): counts it in
    /// `source_errors_total{source="infiniband",reason}` and logs it, at `warn` the first
    /// time the file is skipped for that reason ([`SkippedFile::first`]), at `debug` after.
    pub fn infiniband_file_skipped(&self, file: &SkippedFile) {
        if let Some(c) = self.infiniband_skipped.get(file.reason.index()) {
            c.inc();
        }
        if file.first {
            tracing::warn!(
                path = %file.path.display(),
                reason = file.reason.as_str(),
                detail = %file.detail,
                "infiniband counter file skipped, its series left out (logged once per file and reason)"
            );
        } else {
            tracing::debug!(
                path = %file.path.display(),
                reason = file.reason.as_str(),
                detail = %file.detail,
                "infiniband counter file skipped"
            );
        }
    }

    /// The RDMA event counters ([`crate::rdma_events`]).
    pub fn rdma(&self) -> &RdmaEventMetrics {
        &self.rdma
    }

    /// `source_errors_total{source="infiniband",reason}` so far.
    pub fn infiniband_files_skipped(&self, reason: SkipReason) -> u64 {
        self.infiniband_skipped
            .get(reason.index())
            .map_or(0, IntCounter::get)
    }

    /// Counts one input `source` skipped for `reason` in `source_errors_total` (the textfile
    /// source: a file it could not read or parse). Both labels come from the source's own
    /// closed sets.
    pub fn source_error(&self, source: &str, reason: &str) {
        self.source_errors
            .with_label_values(&[source, reason])
            .inc();
    }

    /// Counts `n` inputs `source` skipped for `reason` in `source_errors_total` at once (the
    /// scrape source: the samples of one answer it refused for one reason). Both labels
    /// come from the source's own closed sets.
    pub fn source_errors_add(&self, source: &str, reason: &str, n: u64) {
        self.source_errors
            .with_label_values(&[source, reason])
            .inc_by(n);
    }

    /// The `source_errors_total{source,reason}` count.
    pub fn source_errors(&self, source: &str, reason: &str) -> u64 {
        self.source_errors
            .with_label_values(&[source, reason])
            .get()
    }

    /// One record of `stream` was cut to fit a frame (not a drop: the record is sent).
    pub fn truncated(&self, stream: Stream) {
        self.records_truncated[stream.index()].inc();
    }

    /// Records of `stream` cut to fit a frame so far.
    pub fn records_truncated(&self, stream: Stream) -> u64 {
        self.records_truncated[stream.index()].get()
    }

    /// Sets the delivery ratio the collector reported for `stream`: `received / (received +
    /// lost)`, in `[0, 1]`; 1 when nothing was sent yet.
    pub fn set_delivery_ratio(&self, stream: Stream, ratio: f64) {
        let r = if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.delivery_ratio[stream.index()].set(r);
    }

    /// A connection after the first one was welcomed.
    pub fn reconnected(&self) {
        self.reconnects.inc();
    }

    /// Sets the `connected` gauge.
    pub fn set_connected(&self, connected: bool) {
        self.connected.set(i64::from(connected));
    }

    /// Sets the number of records queued between the sources and the sender for `stream`.
    pub fn set_queue_records(&self, stream: Stream, records: usize) {
        self.queue_records[stream.index()].set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// `records` metric samples were offered to the metrics stream by a source
    /// (`records_collected_total{stream="metrics"}`).
    pub fn metrics_collected(&self, records: u64) {
        self.records_collected.inc_by(records);
    }

    /// Metric samples offered to the metrics stream so far.
    pub fn metrics_records_collected(&self) -> u64 {
        self.records_collected.get()
    }

    /// Sets `buffer_records{stream="metrics"}`: samples held while disconnected.
    pub fn set_buffer_records(&self, records: usize) {
        self.buffer_records
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// Frames sent on `stream` so far.
    pub fn frames_sent(&self, stream: Stream) -> u64 {
        self.frames_sent[stream.index()].get()
    }

    /// Records sent on `stream` so far.
    pub fn records_sent(&self, stream: Stream) -> u64 {
        self.records_sent[stream.index()].get()
    }

    /// Frames dropped on `stream` for `reason` so far.
    pub fn frames_dropped(&self, stream: Stream, reason: DropReason) -> u64 {
        self.frames_dropped[stream.index()][reason.index()].get()
    }

    /// Records dropped on `stream` for `reason` so far.
    pub fn records_dropped(&self, stream: Stream, reason: DropReason) -> u64 {
        self.records_dropped[stream.index()][reason.index()].get()
    }

    /// Records dropped on `stream`, all reasons.
    pub fn records_dropped_all(&self, stream: Stream) -> u64 {
        DropReason::ALL
            .iter()
            .map(|r| self.records_dropped(stream, *r))
            .sum()
    }

    /// The last delivery ratio set for `stream`.
    pub fn delivery_ratio(&self, stream: Stream) -> f64 {
        self.delivery_ratio[stream.index()].get()
    }

    /// `reconnects_total` so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.get()
    }

    /// The `connected` gauge.
    pub fn connected(&self) -> bool {
        self.connected.get() != 0
    }

    /// The Prometheus text exposition (format 0.0.4) of the registry, for the local
    /// `/metrics`.
    pub fn encode_text(&self) -> String {
        let families = self.registry.gather();
        let mut out = String::new();
        // Encoding into a String only fails on invalid metric families, which `gather` never
        // returns; an error leaves what was written.
        let _ = prometheus::TextEncoder::new().encode_utf8(&families, &mut out);
        out
    }

    /// A snapshot of every metric in the registry as payload records (one
    /// [`payload::Metric`] per series), stamped `timestamp_ms` (0 = the frame's timestamp).
    /// Counters stay cumulative, gauges absolute, histograms cumulative buckets (DESIGN.md §3
    /// rule 2). Summaries are exported as their count and sum only, as counters
    /// `<name>_count` / `<name>_sum`.
    pub fn to_records(&self, timestamp_ms: i64) -> Vec<payload::Metric> {
        families_to_records(&self.registry.gather(), timestamp_ms)
    }
}

/// The drop event's log line (see [`SelfMetrics::dropped`]).
fn log_drop(line: &DropLine) {
    tracing::warn!(
        stream = line.stream.as_str(),
        reason = line.reason.as_str(),
        intentional = line.reason.intentional(),
        frames = line.frames,
        records = line.records,
        "{line}"
    );
}

/// Converts gathered Prometheus metric families into payload records.
pub fn families_to_records(
    families: &[prometheus::proto::MetricFamily],
    timestamp_ms: i64,
) -> Vec<payload::Metric> {
    let mut out = Vec::new();
    for fam in families {
        for m in fam.get_metric() {
            let labels: Vec<payload::Label> = m
                .get_label()
                .iter()
                .map(|l| payload::Label {
                    name: l.name().to_owned(),
                    value: l.value().to_owned(),
                })
                .collect();
            let base = |name: String, ty: payload::MetricType, value: f64| payload::Metric {
                name,
                help: fam.help().to_owned(),
                r#type: ty as i32,
                labels: labels.clone(),
                value,
                timestamp_ms,
                buckets: Vec::new(),
                count: 0,
                sum: 0.0,
            };
            match fam.get_field_type() {
                PromType::COUNTER => out.push(base(
                    fam.name().to_owned(),
                    payload::MetricType::Counter,
                    m.get_counter().get_value(),
                )),
                PromType::GAUGE => out.push(base(
                    fam.name().to_owned(),
                    payload::MetricType::Gauge,
                    m.get_gauge().get_value(),
                )),
                PromType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let mut rec = base(fam.name().to_owned(), payload::MetricType::Histogram, 0.0);
                    rec.buckets = h
                        .get_bucket()
                        .iter()
                        .map(|b| payload::Bucket {
                            upper_bound: b.upper_bound(),
                            cumulative_count: b.cumulative_count(),
                        })
                        .collect();
                    rec.count = h.get_sample_count();
                    rec.sum = h.get_sample_sum();
                    out.push(rec);
                }
                PromType::SUMMARY => {
                    let s = m.get_summary();
                    #[allow(clippy::cast_precision_loss)]
                    let count = s.sample_count() as f64;
                    out.push(base(
                        format!("{}_count", fam.name()),
                        payload::MetricType::Counter,
                        count,
                    ));
                    out.push(base(
                        format!("{}_sum", fam.name()),
                        payload::MetricType::Counter,
                        s.sample_sum(),
                    ));
                }
                PromType::UNTYPED => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(
        recs: &'a [payload::Metric],
        name: &str,
        labels: &[(&str, &str)],
    ) -> Option<&'a payload::Metric> {
        recs.iter().find(|m| {
            m.name == name
                && labels
                    .iter()
                    .all(|(k, v)| m.labels.iter().any(|l| l.name == *k && l.value == *v))
        })
    }

    #[test]
    fn every_stream_and_reason_is_exported_at_zero() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let recs = sm.to_records(0);
        for s in Stream::ALL {
            for r in DropReason::ALL {
                let m = find(
                    &recs,
                    "uctel_agent_records_dropped_total",
                    &[("stream", s.as_str()), ("reason", r.as_str())],
                );
                assert_eq!(m.map(|m| m.value), Some(0.0), "{s} {r}");
            }
            assert!(find(
                &recs,
                "uctel_agent_frames_sent_total",
                &[("stream", s.as_str())]
            )
            .is_some());
        }
        assert!(find(&recs, "uctel_agent_connected", &[]).is_some());
        assert!(find(&recs, "uctel_agent_reconnects_total", &[]).is_some());
    }

    #[test]
    fn agent_counters_carry_the_exported_counters() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        sm.frame_sent(Stream::Metrics, 40, 1000);
        sm.dropped(Stream::Metrics, DropReason::NoCredit, 3, 120);
        sm.dropped(Stream::Logs, DropReason::Shutdown, 0, 7);
        let c = sm.agent_counters();
        assert_eq!(c, sm.agent_counters(), "one epoch per set of counters");
        assert_eq!(c.dropped.len(), Stream::ALL.len() * DropReason::ALL.len());
        let drop = |stream: Stream, reason: DropReason| {
            c.dropped
                .iter()
                .find(|d| d.stream_id == stream.id() && d.reason == reason.wire() as i32)
                .map(|d| (d.frames, d.records))
        };
        assert_eq!(drop(Stream::Metrics, DropReason::NoCredit), Some((3, 120)));
        assert_eq!(drop(Stream::Logs, DropReason::Shutdown), Some((0, 7)));
        assert_eq!(drop(Stream::Logs, DropReason::NoCredit), Some((0, 0)));
        let sent = c.sent.iter().find(|s| s.stream_id == Stream::Metrics.id());
        assert_eq!(sent.map(|s| (s.frames, s.records)), Some((1, 40)));
        // The wire names are the agent's label values.
        for r in DropReason::ALL {
            assert_eq!(r.wire().label(), r.as_str());
        }
        // Another agent process (another set of counters) has another epoch.
        let other = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(other.agent_counters().counters_epoch, c.counters_epoch);
    }

    #[test]
    fn drops_and_sends_are_counted_per_label() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        sm.frame_sent(Stream::Logs, 7, 900);
        sm.frame_sent(Stream::Logs, 3, 100);
        sm.dropped(Stream::Metrics, DropReason::NoCredit, 1, 40);
        sm.dropped(Stream::Logs, DropReason::SourceOverflow, 0, 5);
        assert_eq!(sm.frames_sent(Stream::Logs), 2);
        assert_eq!(sm.records_sent(Stream::Logs), 10);
        assert_eq!(
            sm.records_dropped(Stream::Metrics, DropReason::NoCredit),
            40
        );
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::NoCredit), 0);
        assert_eq!(sm.records_dropped_all(Stream::Logs), 5);

        let recs = sm.to_records(123);
        let m = find(
            &recs,
            "uctel_agent_frames_dropped_total",
            &[("stream", "metrics"), ("reason", "no_credit")],
        );
        assert_eq!(m.map(|m| (m.value, m.timestamp_ms)), Some((1.0, 123)));
        let b = find(&recs, "uctel_agent_bytes_sent_total", &[]);
        assert_eq!(b.map(|m| m.value), Some(1000.0));
        assert_eq!(
            b.map(|m| m.r#type),
            Some(payload::MetricType::Counter as i32)
        );
    }

    #[test]
    fn text_exposition_has_names_and_labels() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        sm.set_connected(true);
        sm.set_delivery_ratio(Stream::Metrics, 0.75);
        sm.set_delivery_ratio(Stream::Logs, f64::NAN);
        let text = sm.encode_text();
        assert!(text.contains("uctel_agent_connected 1"), "{text}");
        assert!(
            text.contains("uctel_agent_delivery_ratio{stream=\"metrics\"} 0.75"),
            "{text}"
        );
        assert!(
            text.contains("uctel_agent_delivery_ratio{stream=\"logs\"} 1"),
            "{text}"
        );
        assert!(text.contains(
            "uctel_agent_frames_dropped_total{reason=\"send_queue_full\",stream=\"logs\"} 0"
        ));
    }

    #[test]
    fn foreign_collectors_in_the_registry_are_exported_too() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let h = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new("uctel_agent_test_seconds", "test")
                .buckets(vec![0.1, 1.0]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        sm.registry()
            .register(Box::new(h.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        h.observe(0.5);
        h.observe(2.0);
        let recs = sm.to_records(0);
        let m = find(&recs, "uctel_agent_test_seconds", &[]).unwrap_or_else(|| panic!("missing"));
        assert_eq!(m.count, 2);
        assert_eq!(m.buckets.len(), 2);
        assert_eq!(m.buckets[1].cumulative_count, 1);
    }

    /// An injector over an in-memory link that drops every datagram (`drop_ratio` 1) or none,
    /// fed `n` datagrams.
    fn injector_after(n: usize, drop_ratio: f64) -> Arc<FaultStats> {
        use uctel_transport::soft::fault::{FaultConfig, FaultInjector};
        use uctel_transport::soft::link::{Datagram, Link, MemoryLink};
        let (a, b) = (
            "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}")),
            "127.0.0.1:2".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        let (link, _peer) = MemoryLink::pair(a, b);
        let mut inj = FaultInjector::new(
            link,
            FaultConfig {
                drop_ratio,
                seed: 1,
                ..FaultConfig::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let batch: Vec<Datagram> = (0..n).map(|_| Datagram::to(b, vec![0; 4])).collect();
        let taken = inj.send(&batch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken, n);
        inj.stats()
    }

    #[test]
    fn fault_counters_are_absent_until_enabled_then_cumulative_over_injectors() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let first = injector_after(3, 1.0);
        FaultTally::new(first.clone()).sync(&sm);
        assert_eq!(sm.fault_packets(FaultAction::Dropped), None);
        assert!(!sm.encode_text().contains("fault"));

        sm.enable_fault_metrics().unwrap_or_else(|e| panic!("{e}"));
        sm.enable_fault_metrics().unwrap_or_else(|e| panic!("{e}"));
        let text = sm.encode_text();
        for a in FaultAction::ALL {
            let series = format!(
                "uctel_agent_fault_packets_total{{action=\"{}\"}} 0",
                a.as_str()
            );
            assert!(text.contains(&series), "{series} missing: {text}");
        }
        // Session 1: three packets dropped; syncing twice adds them once.
        let mut t1 = FaultTally::new(first);
        assert_eq!(t1.sync(&sm).dropped, 3);
        assert_eq!(t1.sync(&sm).dropped, 3);
        assert_eq!(sm.fault_packets(FaultAction::Dropped), Some(3));
        // Session 2: a new injector counting from zero adds to the total.
        let mut t2 = FaultTally::new(injector_after(5, 0.0));
        assert_eq!(t2.sync(&sm).passed, 5);
        assert_eq!(sm.fault_packets(FaultAction::Dropped), Some(3));
        assert_eq!(sm.fault_packets(FaultAction::Passed), Some(5));
        let recs = sm.to_records(0);
        let m = find(
            &recs,
            "uctel_agent_fault_packets_total",
            &[("action", "dropped")],
        );
        assert_eq!(m.map(|m| m.value), Some(3.0));
    }

    #[test]
    fn rc_counters_are_absent_until_enabled_then_every_event_from_zero() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let delta = RcCounters {
            packets_retransmitted: 4,
            retry_exceeded: 1,
            ..RcCounters::default()
        };
        sm.add_rc_counts(&delta);
        sm.rc_lane_failed();
        assert_eq!(sm.rc_qp_events("timeouts"), None);
        assert_eq!(sm.rc_lane_failures(), None);
        assert!(!sm.encode_text().contains("uctel_agent_rc_"));

        sm.enable_rc_metrics().unwrap_or_else(|e| panic!("{e}"));
        sm.enable_rc_metrics().unwrap_or_else(|e| panic!("{e}"));
        let text = sm.encode_text();
        for n in RcCounters::NAMES {
            let series = format!("uctel_agent_rc_qp_events_total{{event=\"{n}\"}} 0");
            assert!(text.contains(&series), "{series} missing: {text}");
        }
        assert!(
            text.contains("uctel_agent_rc_lane_failures_total 0"),
            "{text}"
        );
        sm.add_rc_counts(&delta);
        sm.add_rc_counts(&delta);
        sm.rc_lane_failed();
        assert_eq!(sm.rc_qp_events("packets_retransmitted"), Some(8));
        assert_eq!(sm.rc_qp_events("retry_exceeded"), Some(2));
        assert_eq!(sm.rc_qp_events("timeouts"), Some(0));
        assert_eq!(sm.rc_qp_events("no_such_event"), None);
        assert_eq!(sm.rc_lane_failures(), Some(1));
        let recs = sm.to_records(0);
        let m = find(
            &recs,
            "uctel_agent_rc_qp_events_total",
            &[("event", "packets_retransmitted")],
        );
        assert_eq!(m.map(|m| m.value), Some(8.0));
    }

    #[test]
    fn fault_action_names_are_unique() {
        let mut names: Vec<&str> = FaultAction::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FaultAction::ALL.len());
        for (i, a) in FaultAction::ALL.iter().enumerate() {
            assert_eq!(a.index(), i);
        }
    }

    fn line(
        stream: Stream,
        reason: DropReason,
        frames: u64,
        records: u64,
        window: Option<Duration>,
    ) -> DropLine {
        DropLine {
            stream,
            reason,
            frames,
            records,
            window,
            every: DROP_LOG_EVERY,
        }
    }

    #[test]
    fn drop_log_first_drop_at_once_then_one_summary_per_period() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut log = DropLog::new(Duration::from_secs(10));
        let (l, nc) = (Stream::Logs, DropReason::NoCredit);
        // The first drop: a line at once, with that drop alone.
        assert_eq!(log.record(l, nc, 1, 1, t0), Some(line(l, nc, 1, 1, None)));
        // The next ones are summed; nothing is due before the period is over.
        for i in 1..=16532 {
            assert_eq!(log.record(l, nc, 1, 1, at(i / 2)), None, "drop {i}");
        }
        assert_eq!(log.poll(at(9_999)), vec![]);
        // The period is over: one summary with the count since the first line.
        let summary = line(l, nc, 16532, 16532, Some(Duration::from_secs(10)));
        assert_eq!(log.poll(at(10_000)), vec![summary]);
        assert_eq!(log.poll(at(10_001)), vec![]);
        // Within the next period a drop that brings it due is the summary itself.
        assert_eq!(log.record(l, nc, 1, 1, at(12_000)), None);
        assert_eq!(
            log.record(l, nc, 2, 2, at(20_500)),
            Some(line(l, nc, 3, 3, Some(Duration::from_millis(10_500))))
        );
        // Another stream or reason has its own period.
        assert_eq!(
            log.record(Stream::Metrics, nc, 1, 40, at(20_600)),
            Some(line(Stream::Metrics, nc, 1, 40, None))
        );
        assert_eq!(
            log.record(l, DropReason::SourceOverflow, 0, 7, at(20_700)),
            Some(line(l, DropReason::SourceOverflow, 0, 7, None))
        );
        // After a quiet period the first drop logs at once again; nothing dropped: no line.
        assert_eq!(log.record(l, nc, 0, 0, at(99_000)), None);
        assert_eq!(
            log.record(l, nc, 1, 1, at(100_000)),
            Some(line(l, nc, 1, 1, None))
        );
    }

    #[test]
    fn drop_log_flush_gives_every_pending_count_and_the_sums_add_up() {
        let t0 = Instant::now();
        let mut log = DropLog::new(Duration::from_secs(10));
        let mut logged = 0;
        let mut add = |l: Option<DropLine>| logged += l.map_or(0, |l| l.records);
        for i in 0..1000u64 {
            let now = t0 + Duration::from_millis(i * 37);
            add(log.record(Stream::Logs, DropReason::NoCredit, 1, 3, now));
            add(log.record(Stream::Metrics, DropReason::NotConnected, 0, 5, now));
            for l in log.poll(now) {
                add(Some(l));
            }
        }
        let end = t0 + Duration::from_millis(1000 * 37);
        let rest = log.flush(end);
        assert!(rest.len() <= 2, "{rest:?}");
        assert!(rest.iter().all(|l| l.window.is_some()), "{rest:?}");
        for l in rest {
            add(Some(l));
        }
        assert_eq!(logged, 1000 * (3 + 5));
        assert_eq!(log.flush(end), vec![]);
    }

    #[test]
    fn drop_line_messages_name_count_reason_and_stream() {
        let ten = Some(Duration::from_secs(10));
        assert_eq!(
            line(Stream::Logs, DropReason::NoCredit, 0, 16533, ten).to_string(),
            "dropped 16533 log records (reason no_credit, stream logs) in the last 10 s"
        );
        assert_eq!(
            line(Stream::Metrics, DropReason::NoCredit, 1, 40, ten).to_string(),
            "dropped 40 metric records in 1 frame (reason no_credit, stream metrics) in the last 10 s"
        );
        assert_eq!(
            line(
                Stream::Logs,
                DropReason::Shutdown,
                0,
                1,
                Some(Duration::from_millis(2500))
            )
            .to_string(),
            "dropped 1 log record (reason shutdown, stream logs) in the last 2.5 s"
        );
        assert_eq!(
            line(Stream::Logs, DropReason::NoCredit, 1, 1, None).to_string(),
            "dropped 1 log record in 1 frame (reason no_credit, stream logs); more drops of this stream and reason are summed up at most every 10 s"
        );
    }

    /// Collects the level and message of every event.
    struct Capture(Arc<Mutex<Vec<(tracing::Level, String)>>>);

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((*event.metadata().level(), m.0));
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn load_shedding_drops_are_logged_at_warn_rate_limited() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        tracing::subscriber::with_default(Capture(events.clone()), || {
            // A stalled collector: every log frame and metrics frame is dropped for credit.
            for _ in 0..1000 {
                sm.dropped(Stream::Logs, DropReason::NoCredit, 1, 1);
                sm.dropped(Stream::Metrics, DropReason::NoCredit, 1, 40);
                sm.log_due_drops();
            }
            sm.log_pending_drops();
        });
        let events = events.lock().unwrap_or_else(PoisonError::into_inner);
        let warn: Vec<&str> = events
            .iter()
            .filter(|(level, _)| *level == tracing::Level::WARN)
            .map(|(_, m)| m.as_str())
            .collect();
        // First drop of each stream at once, then what followed in one line each.
        assert_eq!(warn.len(), 4, "{events:#?}");
        assert!(
            warn[0]
                .starts_with("dropped 1 log record in 1 frame (reason no_credit, stream logs); "),
            "{warn:?}"
        );
        assert!(
            warn[1].starts_with(
                "dropped 40 metric records in 1 frame (reason no_credit, stream metrics); "
            ),
            "{warn:?}"
        );
        // The rest at the end, in stream order.
        assert!(warn[2].starts_with("dropped 39960 metric records in 999 frames (reason no_credit, stream metrics) in the last "), "{warn:?}");
        assert!(warn[3].starts_with("dropped 999 log records in 999 frames (reason no_credit, stream logs) in the last "), "{warn:?}");
        assert_eq!(sm.records_dropped(Stream::Logs, DropReason::NoCredit), 1000);
        assert_eq!(
            sm.frames_dropped(Stream::Metrics, DropReason::NoCredit),
            1000
        );
    }

    #[test]
    fn skipped_infiniband_files_are_counted_every_time_and_warned_once() {
        let sm = SelfMetrics::new().unwrap_or_else(|e| panic!("{e}"));
        let text = sm.encode_text();
        for r in SkipReason::ALL {
            let series = format!(
                "uctel_agent_source_errors_total{{reason=\"{}\",source=\"infiniband\"}} 0",
                r.as_str()
            );
            assert!(text.contains(&series), "{series} missing: {text}");
        }
        let mut file = SkippedFile {
            path: "/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error".into(),
            reason: SkipReason::NotAvailable,
            detail: "N/A (no PMA)".into(),
            first: true,
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Capture(events.clone()), || {
            sm.infiniband_file_skipped(&file);
            file.first = false;
            sm.infiniband_file_skipped(&file);
            sm.infiniband_file_skipped(&file);
        });
        assert_eq!(sm.infiniband_files_skipped(SkipReason::NotAvailable), 3);
        assert_eq!(sm.infiniband_files_skipped(SkipReason::ReadError), 0);
        let events = events.lock().unwrap_or_else(PoisonError::into_inner);
        let warn = events
            .iter()
            .filter(|(level, _)| *level == tracing::Level::WARN)
            .count();
        assert_eq!(warn, 1, "{events:#?}");
        let recs = sm.to_records(0);
        let m = find(
            &recs,
            "uctel_agent_source_errors_total",
            &[("source", "infiniband"), ("reason", "not_available")],
        );
        assert_eq!(m.map(|m| m.value), Some(3.0));
    }

    #[test]
    fn reason_names_are_unique_and_snake_case() {
        let mut names: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::ALL.len());
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert!(r
                .as_str()
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_'));
        }
    }
}
