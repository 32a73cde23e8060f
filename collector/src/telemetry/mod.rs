//! The collector's own metrics (`uctel_collector_*`, DESIGN.md §8) and the one closed
//! [`DropReason`] enum for every path where the collector discards a frame or record.
//!
//! Following Vector's internal events, each drop goes through one function
//! ([`AgentTelemetry::drop_frames`], [`AgentTelemetry::drop_records`]) that increments the
//! labelled counter and logs, rate-limited to one line per agent and reason per
//! [`LOG_EVERY`], so a flood of bad frames cannot flood the log. Loss (gaps) is logged while
//! it happens, once per agent and stream per window ([`live_loss`]).
//!
//! # Accounting
//!
//! * `frames_received_total{agent,stream}`: frames accepted (header, CRC and payload good,
//!   new in the stream's sequence).
//! * `frames_lost_total{agent,stream}`: frames of the stream's sequence that never arrived,
//!   counted once and only when certain: when a skipped sequence leaves the reorder window
//!   unseen (`reorder_window_frames` later frames arrived, or the first of them is
//!   `reorder_window_seconds` old, whichever comes first; the worker checks the time every
//!   0.1 s), at the first frame for a leading gap, and at the end of the session for what is
//!   still missing (and the tail the agent's `Goodbye` or last heartbeat names). Until then a
//!   skipped frame is *missing* (`frames_missing{agent,stream}`, a gauge below the reorder
//!   window): it may still arrive, as a late frame (`frames_late_total`, accepted and counted
//!   received). A lost frame is never taken back, so at every scrape
//!   `received + lost ≤ sent` and the sum needs no correction. `records_lost_total` follows
//!   the same rule (records of a frame are counted when the frame is settled).
//! * `frames_stale_total{agent,stream}`: frames that arrived after their sequence was settled
//!   (already counted received or lost): discarded, and in no other counter.
//! * `frames_dropped_total{agent,reason}`: frames the collector received but discarded.
//!   A frame discarded *before* its header could be trusted (transport reasons, `queue_full`,
//!   `ring_overrun`, `imm_mismatch`, `torn_slot`, `crc_mismatch`, `malformed_frame`) never
//!   reaches its stream's tracker, so its stream also counts it as lost; a frame discarded
//!   after its stream was tracked (`malformed_payload`, `limit_exceeded`) is not lost. Per connection the sum is exact:
//!   `sent = Σ received + Σ dropped + connection_frames_lost` (the connection tracker knows
//!   the connection sequence of early drops from the immediate).
//! * Per stream: `sent = received + lost + dropped_after_tracking` once the last frame is in.
//! * `records_replayed_total{agent,stream}`: log records an agent sent again after a restart
//!   (its checkpoint lags what it sent), recognised by their `file_id` and `end_offset` as
//!   already delivered (or counted lost) in an earlier epoch of that agent
//!   ([`crate::ingest::DeliveredLogs`]); discarded, and in no other counter. Their frame is
//!   received; `records_received_total` counts only the records delivered. So per stream,
//!   agent records sent `= records_received + records_lost + records_dropped +
//!   records_replayed`.
//! * `agent_frames_sent_total{agent,stream}`, `agent_records_sent_total{agent,stream}`,
//!   `agent_frames_dropped_total{agent,stream,reason}`,
//!   `agent_records_dropped_total{agent,stream,reason}`: the agent's own
//!   `uctel_agent_{frames,records}_{sent,dropped}_total`, carried by its heartbeats on the
//!   control connection (`Heartbeat.agent_counters`), so the drops they count cannot starve
//!   them (the copy in the agent's self-metrics travels in the `metrics` frames a
//!   `no_credit` drop discards). `reason` is the agent's (`no_credit`, `send_queue_full`,
//!   `oversize`, `invalid`, `source_overflow`, `not_connected`, `transport_error`,
//!   `shutdown`; `unspecified` for a reason this collector does not know). Visible within
//!   one heartbeat interval (an agent out of credit heartbeats at once); monotonic for the
//!   collector's lifetime across reconnects and agent restarts ([`crate::agent_counters`]):
//!   while the agent process has not restarted they equal its own counters as of its last
//!   heartbeat, and the agent's last heartbeat before its `Goodbye` carries its final
//!   figures. After an agent moves to another collector of a pool, that collector's series
//!   start at the agent's lifetime figures: sum `rate()`/`increase()` over collectors, not
//!   raw values. Per stream, agent records produced
//!   `= agent_records_sent + Σ agent_records_dropped`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::core::{AtomicF64, AtomicI64, AtomicU64, GenericCounter, GenericGauge};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use uctel_transport::api::{RcCounters, UcDropReason};

/// Prefix of every self-metric.
pub const NAMESPACE: &str = "uctel_collector";

/// The `queues` values of `connection_queues` (`dataplane::QueueMode`, as its `as_str`
/// names them), each series created at zero.
pub const CONNECTION_QUEUES: [&str; 3] = ["shared_cq_srq", "shared_cq", "own"];

/// At most one log line per agent and drop reason per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Most `(agent, reason)` pairs the log rate limiter remembers. Agent ids of refused
/// handshakes come from unauthenticated peers, so the table is bounded: when full, entries
/// older than [`LOG_EVERY`] are forgotten, and if it is still full the line is not logged
/// (the counters still count every event).
pub const LOG_LIMITER_ENTRIES: usize = 4096;

/// Why the collector discarded a frame or a record. One closed set for every drop path;
/// [`DropReason::as_str`] is the `reason` label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Write-with-immediate: the slot's header sequence is *later* than the immediate
    /// announced: the agent lapped the ring before the frame was read (DESIGN.md §4).
    RingOverrun,
    /// Write-with-immediate: the slot's header sequence is neither the announced one nor a
    /// later one (a slot not yet written, or garbage).
    ImmMismatch,
    /// Write-with-immediate: header sequence matches the immediate but the CRC32C does not:
    /// the slot was being overwritten while it was copied.
    TornSlot,
    /// Send path: the frame's CRC32C does not match (corruption).
    CrcMismatch,
    /// The header is not a version-1 uctel header (magic, version, kind, flags, reserved,
    /// truncated).
    MalformedFrame,
    /// Header and CRC are good but the payload does not decode or validate.
    MalformedPayload,
    /// The frame or a payload item exceeds a configured limit (`max_frame_bytes`, label
    /// counts, string lengths; `uctel_protocol::limits`).
    LimitExceeded,
    /// No room was left for a completion waiting for the worker beyond its agent's credit
    /// window (`ring.descriptor_queue`).
    QueueFull,
    /// The frame's epoch is not the epoch the agent announced for this connection.
    EpochMismatch,
    /// The frame's stream travels on the connection's other lane (`Hello.rc_lane` names the
    /// streams on the RC QP, DESIGN.md §8b): a misbehaving agent.
    WrongLane,
    /// A receive completion with an error status (e.g. message too long, flushed).
    WcError,
    /// A completion for a QP with no live agent session (teardown race).
    NoSession,
    /// A sample for a new series beyond `series_cap_per_agent` (record-level, intentional).
    SeriesCap,
    /// The log sink failed to write a record (record-level).
    LogSinkError,
    /// A sample whose metric name already has another type in the store (record-level).
    TypeConflict,
    /// A sample named in the collector's own namespace or clashing with a histogram's
    /// `_bucket`/`_sum`/`_count` names (record-level).
    ReservedName,
    /// The transport's responder silently discarded the message (IBTA UC rules as rxe
    /// implements them), surfaced from the QP's drop counters.
    Transport(UcDropReason),
}

impl DropReason {
    /// Every collector-level reason (transport reasons come from [`UcDropReason::ALL`]).
    pub const COLLECTOR: [DropReason; 16] = [
        DropReason::RingOverrun,
        DropReason::ImmMismatch,
        DropReason::TornSlot,
        DropReason::CrcMismatch,
        DropReason::MalformedFrame,
        DropReason::MalformedPayload,
        DropReason::LimitExceeded,
        DropReason::QueueFull,
        DropReason::EpochMismatch,
        DropReason::WrongLane,
        DropReason::WcError,
        DropReason::NoSession,
        DropReason::SeriesCap,
        DropReason::LogSinkError,
        DropReason::TypeConflict,
        DropReason::ReservedName,
    ];

    /// Every reason, collector and transport.
    pub fn all() -> impl Iterator<Item = DropReason> {
        Self::COLLECTOR
            .into_iter()
            .chain(UcDropReason::ALL.into_iter().map(DropReason::Transport))
    }

    /// The `reason` label value (snake case, stable).
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::RingOverrun => "ring_overrun",
            DropReason::ImmMismatch => "imm_mismatch",
            DropReason::TornSlot => "torn_slot",
            DropReason::CrcMismatch => "crc_mismatch",
            DropReason::MalformedFrame => "malformed_frame",
            DropReason::MalformedPayload => "malformed_payload",
            DropReason::LimitExceeded => "limit_exceeded",
            DropReason::QueueFull => "queue_full",
            DropReason::EpochMismatch => "epoch_mismatch",
            DropReason::WrongLane => "wrong_lane",
            DropReason::WcError => "wc_error",
            DropReason::NoSession => "no_session",
            DropReason::SeriesCap => "series_cap",
            DropReason::LogSinkError => "log_sink_error",
            DropReason::TypeConflict => "type_conflict",
            DropReason::ReservedName => "reserved_name",
            // The QP-in-ERROR drop of the transport is reported as a QP error, not a reason of
            // its own, so the label value `qp_error` stays unambiguous.
            DropReason::Transport(UcDropReason::QpError) => "qp_in_error",
            DropReason::Transport(r) => r.as_str(),
        }
    }

    /// True for drops done on purpose by policy (cardinality cap), as Vector's
    /// `intentional` flag; false for drops caused by faults.
    pub fn intentional(self) -> bool {
        matches!(self, DropReason::SeriesCap)
    }

    /// True for reasons that discard single records out of an accepted frame
    /// (`records_dropped_total`), false for frame-level reasons (`frames_dropped_total`).
    pub fn record_level(self) -> bool {
        matches!(
            self,
            DropReason::SeriesCap
                | DropReason::LogSinkError
                | DropReason::TypeConflict
                | DropReason::ReservedName
        )
    }

    /// True when the frame was discarded before its stream could be tracked, so its stream
    /// also counts it as lost (see the module docs).
    pub fn before_tracking(self) -> bool {
        !self.record_level()
            && !matches!(
                self,
                DropReason::MalformedPayload | DropReason::LimitExceeded
            )
    }

    fn index(self) -> usize {
        match self {
            DropReason::Transport(r) => Self::COLLECTOR.len() + r.index(),
            other => Self::COLLECTOR
                .iter()
                .position(|r| *r == other)
                .unwrap_or(0),
        }
    }
}

/// Number of distinct [`DropReason`] values (array size for per-reason tables).
pub const DROP_REASONS: usize = DropReason::COLLECTOR.len() + UcDropReason::COUNT;

pub use uctel_protocol::control::RefuseReason;
use uctel_protocol::control::{AgentCounters, AgentDropReason};

use crate::agent_counters::{CounterBaseline, CounterKey};
use uctel_protocol::tracker::ResetReason;

type IntCounter = GenericCounter<AtomicU64>;
type IntGauge = GenericGauge<AtomicI64>;
type Gauge = GenericGauge<AtomicF64>;

/// The registry and metric vectors. One per collector; cheap to clone.
#[derive(Clone, Debug)]
pub struct Telemetry {
    inner: Arc<Families>,
    log_limiter: Arc<Mutex<HashMap<(String, &'static str), Instant>>>,
    /// Per agent id, the last figures of its `Heartbeat.agent_counters`
    /// ([`crate::agent_counters`]). Agent ids here are authenticated.
    agent_counters: Arc<Mutex<HashMap<String, CounterBaseline>>>,
}

#[derive(Debug)]
struct Families {
    registry: Registry,
    frames_received: IntCounterVec,
    frames_lost: IntCounterVec,
    records_lost: IntCounterVec,
    records_replayed: IntCounterVec,
    frames_dropped: IntCounterVec,
    records_dropped: IntCounterVec,
    frames_late: IntCounterVec,
    frames_duplicate: IntCounterVec,
    frames_stale: IntCounterVec,
    frames_missing: IntGaugeVec,
    sessions_ended: IntCounterVec,
    stream_resets: IntCounterVec,
    connection_resets: IntCounterVec,
    loss_ratio: prometheus::GaugeVec,
    connection_frames_lost: IntCounterVec,
    agents_connected: IntGauge,
    control_probes: prometheus::IntCounter,
    probes: IntCounterVec,
    draining: IntGauge,
    ring_slots_in_use: IntGaugeVec,
    qp_errors: IntCounterVec,
    rc_qp_events: IntCounterVec,
    rc_gap_frames: IntCounterVec,
    handshakes_refused: IntCounterVec,
    connections_replaced: IntCounterVec,
    transport_packets_dropped: IntCounterVec,
    records_received: IntCounterVec,
    store_series: IntGaugeVec,
    /// `rdma_async_events_total{event}`, one handle per [`crate::rdma_events::EVENT_LABELS`].
    rdma_async_events: [prometheus::IntCounter; crate::rdma_events::EVENT_KINDS],
    /// Whether each event kind was logged at `warn` already.
    rdma_async_logged: [std::sync::atomic::AtomicBool; crate::rdma_events::EVENT_KINDS],
    /// `connection_queues{queues}` (one series per [`CONNECTION_QUEUES`] value).
    connection_queues: IntGaugeVec,
    /// `agent_frames_sent_total{agent,stream}` ([`crate::agent_counters`]).
    agent_frames_sent: IntCounterVec,
    /// `agent_records_sent_total{agent,stream}`.
    agent_records_sent: IntCounterVec,
    /// `agent_frames_dropped_total{agent,stream,reason}`.
    agent_frames_dropped: IntCounterVec,
    /// `agent_records_dropped_total{agent,stream,reason}`.
    agent_records_dropped: IntCounterVec,
    /// `agent_up{agent}` ([`crate::liveness`]).
    agent_up: crate::liveness::AgentUp,
}

mod families;
pub mod live_loss;
mod status;

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NAMESPACE)
}

impl Telemetry {
    /// Creates and registers every family in a new registry, with the collector process's
    /// `process_*` metrics and `uctel_collector_build_info{version} 1`.
    ///
    /// # Errors
    /// A registration conflict (a programming error, surfaced rather than panicking).
    pub fn new() -> Result<Telemetry, prometheus::Error> {
        let registry = Registry::new();
        uctel_common::http::register_process_metrics(&registry)?;
        uctel_common::http::register_build_info(&registry, NAMESPACE, env!("CARGO_PKG_VERSION"))?;
        let r = families::Registrar(&registry);
        let frames_received = r.counter_vec(&families::FRAMES_RECEIVED)?;
        let frames_lost = r.counter_vec(&families::FRAMES_LOST)?;
        let records_lost = r.counter_vec(&families::RECORDS_LOST)?;
        let records_replayed = r.counter_vec(&families::RECORDS_REPLAYED)?;
        let frames_dropped = r.counter_vec(&families::FRAMES_DROPPED)?;
        let records_dropped = r.counter_vec(&families::RECORDS_DROPPED)?;
        let frames_late = r.counter_vec(&families::FRAMES_LATE)?;
        let frames_duplicate = r.counter_vec(&families::FRAMES_DUPLICATE)?;
        let frames_stale = r.counter_vec(&families::FRAMES_STALE)?;
        let frames_missing = r.int_gauge_vec(&families::FRAMES_MISSING)?;
        let sessions_ended = r.counter_vec(&families::SESSIONS_ENDED)?;
        let stream_resets = r.counter_vec(&families::STREAM_RESETS)?;
        let connection_resets = r.counter_vec(&families::CONNECTION_RESETS)?;
        let loss_ratio = r.gauge_vec(&families::LOSS_RATIO)?;
        let connection_frames_lost = r.counter_vec(&families::CONNECTION_FRAMES_LOST)?;
        let agents_connected = r.int_gauge(&families::AGENTS_CONNECTED)?;
        let agent_up = r.int_gauge_vec(&families::AGENT_UP)?;
        let control_probes = r.counter(&families::CONTROL_PROBES)?;
        let probes = r.counter_vec(&families::PROBES)?;
        let draining = r.int_gauge(&families::DRAINING)?;
        let ring_slots_in_use = r.int_gauge_vec(&families::RING_SLOTS_IN_USE)?;
        let rdma_async_events = r.counter_vec(&families::RDMA_ASYNC_EVENTS)?;
        let connection_queues = r.int_gauge_vec(&families::CONNECTION_QUEUES)?;
        for mode in CONNECTION_QUEUES {
            connection_queues.with_label_values(&[mode]).set(0);
        }
        let qp_errors = r.counter_vec(&families::QP_ERRORS)?;
        let rc_qp_events = r.counter_vec(&families::RC_QP_EVENTS)?;
        let rc_gap_frames = r.counter_vec(&families::RC_GAP_FRAMES)?;
        let handshakes_refused = r.counter_vec(&families::HANDSHAKES_REFUSED)?;
        let connections_replaced = r.counter_vec(&families::CONNECTIONS_REPLACED)?;
        let transport_packets_dropped = r.counter_vec(&families::TRANSPORT_PACKETS_DROPPED)?;
        let records_received = r.counter_vec(&families::RECORDS_RECEIVED)?;
        let store_series = r.int_gauge_vec(&families::STORE_SERIES)?;
        let agent_frames_sent = r.counter_vec(&families::AGENT_FRAMES_SENT)?;
        let agent_records_sent = r.counter_vec(&families::AGENT_RECORDS_SENT)?;
        let agent_frames_dropped = r.counter_vec(&families::AGENT_FRAMES_DROPPED)?;
        let agent_records_dropped = r.counter_vec(&families::AGENT_RECORDS_DROPPED)?;
        for reason in RefuseReason::ALL {
            if reason != RefuseReason::Unspecified {
                handshakes_refused.with_label_values(&[reason.label()]);
            }
        }
        Ok(Telemetry {
            inner: Arc::new(Families {
                registry,
                frames_received,
                frames_lost,
                records_lost,
                records_replayed,
                frames_dropped,
                records_dropped,
                frames_late,
                frames_duplicate,
                frames_stale,
                frames_missing,
                sessions_ended,
                stream_resets,
                connection_resets,
                loss_ratio,
                connection_frames_lost,
                agents_connected,
                control_probes,
                probes,
                draining,
                ring_slots_in_use,
                qp_errors,
                rc_qp_events,
                rc_gap_frames,
                handshakes_refused,
                connections_replaced,
                transport_packets_dropped,
                records_received,
                store_series,
                rdma_async_events: crate::rdma_events::EVENT_LABELS
                    .map(|e| rdma_async_events.with_label_values(&[e])),
                rdma_async_logged: Default::default(),
                connection_queues,
                agent_frames_sent,
                agent_records_sent,
                agent_frames_dropped,
                agent_records_dropped,
                agent_up: crate::liveness::AgentUp::new(agent_up),
            }),
            log_limiter: Arc::new(Mutex::new(HashMap::new())),
            agent_counters: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The registry holding the self-metrics (the series store registers its collector
    /// here too).
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Handles for one agent, with every drop reason pre-created at zero (so dashboards see
    /// a zero rather than no series).
    pub fn agent(&self, agent: &str) -> AgentTelemetry {
        let f = &self.inner;
        let mut dropped = Vec::with_capacity(DROP_REASONS);
        let mut records_dropped = Vec::with_capacity(DROP_REASONS);
        for i in 0..DROP_REASONS {
            let reason = DropReason::all().find(|r| r.index() == i);
            let label = reason.map_or("unused", DropReason::as_str);
            let record_level = reason.map(DropReason::record_level);
            dropped.push(match record_level {
                Some(false) => Some(f.frames_dropped.with_label_values(&[agent, label])),
                _ => None,
            });
            records_dropped.push(match record_level {
                Some(true) => Some(f.records_dropped.with_label_values(&[agent, label])),
                _ => None,
            });
        }
        AgentTelemetry {
            agent: agent.to_string(),
            telemetry: self.clone(),
            frames_dropped: dropped,
            records_dropped,
            connection_frames_lost: f.connection_frames_lost.with_label_values(&[agent]),
            connection_resets_epoch: f
                .connection_resets
                .with_label_values(&[agent, ResetReason::EpochChange.as_str()]),
            connection_resets_dropout: f
                .connection_resets
                .with_label_values(&[agent, ResetReason::Dropout.as_str()]),
            ring_slots_in_use: f.ring_slots_in_use.with_label_values(&[agent]),
            qp_errors: f.qp_errors.with_label_values(&[agent]),
            series: f.store_series.with_label_values(&[agent]),
        }
    }

    /// The RC-lane counters of `agent`, every label value created at zero (only agents
    /// with an RC lane have these series).
    pub fn rc_lane(&self, agent: &str) -> RcLaneTelemetry {
        let f = &self.inner;
        RcLaneTelemetry {
            events: RcCounters::NAMES.map(|e| f.rc_qp_events.with_label_values(&[agent, e])),
            gap_frames: f.rc_gap_frames.with_label_values(&[agent]),
        }
    }

    /// Counts a refused handshake and logs it, at most once per 10 s per agent id and
    /// reason (an agent retrying with a wrong token must not flood the log).
    pub fn handshake_refused(&self, reason: RefuseReason, agent: &str, peer: &str, detail: &str) {
        self.inner
            .handshakes_refused
            .with_label_values(&[reason.label()])
            .inc();
        if self.should_log(agent, reason.label()) {
            tracing::warn!(
                reason = reason.label(),
                agent,
                peer,
                detail,
                "handshake refused (logged at most once per 10 s per agent and reason)"
            );
        }
    }

    /// Counts a connection of `agent` replaced by a newer one with the same agent id;
    /// `alive`: the replaced connection was still heard from (see
    /// `connections_replaced_total`).
    pub fn connection_replaced(&self, agent: &str, alive: bool) {
        let previous = if alive { "alive" } else { "silent" };
        self.inner
            .connections_replaced
            .with_label_values(&[agent, previous])
            .inc();
    }

    /// The agents-connected gauge.
    pub fn agents_connected(&self) -> &IntGauge {
        &self.inner.agents_connected
    }

    /// `agent_up{agent}` ([`crate::liveness`]).
    pub fn agent_up(&self) -> &crate::liveness::AgentUp {
        &self.inner.agent_up
    }

    /// Counts a control probe (a connection closed before its first byte).
    pub fn control_probe(&self) {
        self.inner.control_probes.inc();
    }

    /// Counts a `Probe` answered with a `ProbeAnswer`: `uctel_collector_probes_total{result}`,
    /// `result` = `accepting` or `refusing`.
    pub fn probe_answered(&self, accepting: bool) {
        let result = if accepting { "accepting" } else { "refusing" };
        self.inner.probes.with_label_values(&[result]).inc();
    }

    /// Sets `uctel_collector_draining`.
    pub fn set_draining(&self, draining: bool) {
        self.inner.draining.set(i64::from(draining));
    }

    /// Adds device-level transport drops (packets that matched no QP).
    pub fn transport_packets_dropped(&self, reason: UcDropReason, n: u64) {
        if n > 0 {
            self.inner
                .transport_packets_dropped
                .with_label_values(&[reason.as_str()])
                .inc_by(n);
        }
    }

    /// Counts one async event of `device` in `rdma_async_events_total{event}` and logs it, at
    /// `warn` the first time its kind is met, at `debug` after ([`crate::rdma_events`]).
    pub fn rdma_async_event(&self, device: &str, ev: &uctel_transport::api::AsyncEvent) {
        let i = crate::rdma_events::event_index(ev);
        let event = crate::rdma_events::EVENT_LABELS[i];
        self.inner.rdma_async_events[i].inc();
        let logged = &self.inner.rdma_async_logged[i];
        if !logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(device, event, detail = ?ev, "RDMA async event (logged once per kind; uctel_collector_rdma_async_events_total counts them all)");
        } else {
            tracing::debug!(device, event, detail = ?ev, "RDMA async event");
        }
    }

    /// The `connection_queues{queues}` gauge of `mode`, one of [`CONNECTION_QUEUES`] (a
    /// session increments it while it lives).
    pub fn connection_queues(&self, mode: &str) -> IntGauge {
        self.inner.connection_queues.with_label_values(&[mode])
    }

    /// Encodes the registry in the text format.
    ///
    /// # Errors
    /// The encoder rejected a family (duplicate or invalid names).
    pub fn render(&self) -> Result<Vec<u8>, String> {
        uctel_common::http::encode_registry(&self.inner.registry)
    }

    fn should_log(&self, agent: &str, reason: &'static str) -> bool {
        let Ok(mut map) = self.log_limiter.lock() else {
            return false;
        };
        let now = Instant::now();
        match map.get_mut(&(agent.to_string(), reason)) {
            Some(last) if now.duration_since(*last) < LOG_EVERY => false,
            Some(last) => {
                *last = now;
                true
            }
            None => {
                if map.len() >= LOG_LIMITER_ENTRIES {
                    map.retain(|_, last| now.duration_since(*last) < LOG_EVERY);
                    if map.len() >= LOG_LIMITER_ENTRIES {
                        return false;
                    }
                }
                map.insert((agent.to_string(), reason), now);
                true
            }
        }
    }
}

/// Per-agent metric handles, resolved once at connection time so the hot path does no label
/// hashing.
#[derive(Clone, Debug)]
pub struct AgentTelemetry {
    agent: String,
    telemetry: Telemetry,
    frames_dropped: Vec<Option<IntCounter>>,
    records_dropped: Vec<Option<IntCounter>>,
    /// Connection-sequence gaps not explained by a counted drop.
    pub connection_frames_lost: IntCounter,
    /// Connection sequence resets on a new agent epoch.
    pub connection_resets_epoch: IntCounter,
    /// Connection sequence resyncs after a jump beyond the maximum dropout.
    pub connection_resets_dropout: IntCounter,
    /// Completed but unconsumed slots.
    pub ring_slots_in_use: IntGauge,
    /// QP errors.
    pub qp_errors: IntCounter,
    /// Series stored for the agent.
    pub series: IntGauge,
}

/// The counters of one agent's RC lane ([`Telemetry::rc_lane`]).
#[derive(Clone, Debug)]
pub struct RcLaneTelemetry {
    /// `rc_qp_events_total{agent, event}`, in [`RcCounters::NAMES`] order.
    pub events: [IntCounter; 9],
    /// `rc_gap_frames_total{agent}`.
    pub gap_frames: IntCounter,
}

impl RcLaneTelemetry {
    /// Adds what the QP counted since `before` (`now`: its counters now).
    pub fn add(&self, before: &RcCounters, now: &RcCounters) {
        for (c, (_, n)) in self.events.iter().zip(now.since(before).iter()) {
            c.inc_by(n);
        }
    }
}

/// How an agent session ended: the `reason` of `sessions_ended_total`. A closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionEnd {
    /// The agent sent `Goodbye` with its final sequences: the tail loss is exact.
    Goodbye,
    /// The control connection closed or went silent without a `Goodbye`: what the agent
    /// sent after its last heartbeat is unknown (DESIGN.md §6).
    NoGoodbye,
    /// A new connection with the same agent id took over this (silent) one.
    Replaced,
    /// The collector shut down with the session open.
    Shutdown,
}

impl SessionEnd {
    /// Every reason, in label order.
    pub const ALL: [SessionEnd; 4] = [
        SessionEnd::Goodbye,
        SessionEnd::NoGoodbye,
        SessionEnd::Replaced,
        SessionEnd::Shutdown,
    ];

    /// The `reason` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            SessionEnd::Goodbye => "goodbye",
            SessionEnd::NoGoodbye => "no_goodbye",
            SessionEnd::Replaced => "replaced",
            SessionEnd::Shutdown => "shutdown",
        }
    }
}

impl AgentTelemetry {
    /// The agent id the handles are labelled with.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Counts one ended session under `reason` (`sessions_ended_total{agent,reason}`).
    pub fn session_ended(&self, reason: SessionEnd) {
        self.telemetry
            .inner
            .sessions_ended
            .with_label_values(&[&self.agent, reason.as_str()])
            .inc();
    }

    /// Counts `n` drops under `reason` in `family` (through the pre-resolved handle in
    /// `per_reason` when there is one; a reason without one is still counted under its own
    /// label) and says whether the event should be logged now (rate-limited). `n == 0`
    /// counts and logs nothing.
    fn count_drop(
        &self,
        per_reason: &[Option<IntCounter>],
        family: &IntCounterVec,
        reason: DropReason,
        n: u64,
    ) -> bool {
        if n == 0 {
            return false;
        }
        if let Some(Some(c)) = per_reason.get(reason.index()) {
            c.inc_by(n);
        } else {
            family
                .with_label_values(&[&self.agent, reason.as_str()])
                .inc_by(n);
        }
        self.telemetry.should_log(&self.agent, reason.as_str())
    }

    /// The drop event: counts `n` discarded frames under `reason` and logs (rate-limited).
    pub fn drop_frames(&self, reason: DropReason, n: u64, detail: &dyn std::fmt::Display) {
        let family = &self.telemetry.inner.frames_dropped;
        if self.count_drop(&self.frames_dropped, family, reason, n) {
            tracing::warn!(
                agent = %self.agent,
                reason = reason.as_str(),
                intentional = reason.intentional(),
                frames = n,
                %detail,
                "frames dropped (logged at most once per 10 s per agent and reason)"
            );
        }
    }

    /// The record-drop event (series cap, log sink errors): counts and logs rate-limited.
    pub fn drop_records(&self, reason: DropReason, n: u64, detail: &dyn std::fmt::Display) {
        let family = &self.telemetry.inner.records_dropped;
        if self.count_drop(&self.records_dropped, family, reason, n) {
            tracing::warn!(
                agent = %self.agent,
                reason = reason.as_str(),
                intentional = reason.intentional(),
                records = n,
                %detail,
                "records dropped (logged at most once per 10 s per agent and reason)"
            );
        }
    }

    /// Handles for one stream of this agent, labelled with the stream's name
    /// (`uctel_protocol::stream::label`: `metrics`, `logs`, else the id's number), the
    /// agent's own `stream` label values.
    pub fn stream(&self, stream_id: u32) -> StreamTelemetry {
        let f = &self.telemetry.inner;
        let s = uctel_protocol::stream::label(stream_id);
        let l = [self.agent.as_str(), &*s];
        StreamTelemetry {
            frames_received: f.frames_received.with_label_values(&l),
            records_received: f.records_received.with_label_values(&l),
            frames_lost: f.frames_lost.with_label_values(&l),
            records_lost: f.records_lost.with_label_values(&l),
            records_replayed: f.records_replayed.with_label_values(&l),
            frames_late: f.frames_late.with_label_values(&l),
            frames_duplicate: f.frames_duplicate.with_label_values(&l),
            frames_stale: f.frames_stale.with_label_values(&l),
            frames_missing: f.frames_missing.with_label_values(&l),
            resets_epoch: f.stream_resets.with_label_values(&[
                l[0],
                l[1],
                ResetReason::EpochChange.as_str(),
            ]),
            resets_resync: f.stream_resets.with_label_values(&[
                l[0],
                l[1],
                ResetReason::Dropout.as_str(),
            ]),
            loss_ratio: f.loss_ratio.with_label_values(&l),
        }
    }

    /// Adds what the agent's own counters in a heartbeat (`Heartbeat.agent_counters`) grew
    /// since its previous heartbeat of the same counter epoch to
    /// `agent_{frames,records}_{sent,dropped}_total` ([`crate::agent_counters`]); every
    /// counter the message names gets its series, at zero if it never grew.
    pub fn agent_counters(&self, counters: &AgentCounters) {
        let increases = {
            let mut map = self
                .telemetry
                .agent_counters
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.entry(self.agent.clone())
                .or_default()
                .increases(counters)
        };
        let f = &self.telemetry.inner;
        for (key, n) in increases {
            let agent = self.agent.as_str();
            let c =
                match key {
                    CounterKey::FramesSent(s) => f
                        .agent_frames_sent
                        .with_label_values(&[agent, &uctel_protocol::stream::label(s)]),
                    CounterKey::RecordsSent(s) => f
                        .agent_records_sent
                        .with_label_values(&[agent, &uctel_protocol::stream::label(s)]),
                    CounterKey::FramesDropped(s, r) => f.agent_frames_dropped.with_label_values(&[
                        agent,
                        &uctel_protocol::stream::label(s),
                        r.label(),
                    ]),
                    CounterKey::RecordsDropped(s, r) => f
                        .agent_records_dropped
                        .with_label_values(&[agent, &uctel_protocol::stream::label(s), r.label()]),
                };
            c.inc_by(n);
        }
    }

    /// Current value of `agent_records_dropped_total{stream,reason}` for this agent.
    pub fn agent_records_dropped(&self, stream_id: u32, reason: AgentDropReason) -> u64 {
        self.telemetry
            .inner
            .agent_records_dropped
            .with_label_values(&[
                self.agent.as_str(),
                &uctel_protocol::stream::label(stream_id),
                reason.label(),
            ])
            .get()
    }

    /// Current value of `frames_dropped_total{reason}` for this agent (tests, reports).
    pub fn frames_dropped(&self, reason: DropReason) -> u64 {
        self.telemetry
            .inner
            .frames_dropped
            .with_label_values(&[&self.agent, reason.as_str()])
            .get()
    }

    /// Current value of `records_dropped_total{reason}` for this agent.
    pub fn records_dropped(&self, reason: DropReason) -> u64 {
        self.telemetry
            .inner
            .records_dropped
            .with_label_values(&[&self.agent, reason.as_str()])
            .get()
    }
}

/// Per-stream metric handles.
#[derive(Clone, Debug)]
pub struct StreamTelemetry {
    /// Accepted frames.
    pub frames_received: IntCounter,
    /// Records in accepted frames.
    pub records_received: IntCounter,
    /// Frames missing from the sequence.
    pub frames_lost: IntCounter,
    /// Records missing.
    pub records_lost: IntCounter,
    /// Log records sent again after an agent restart, discarded (in no other counter).
    pub records_replayed: IntCounter,
    /// Late (reordered) frames.
    pub frames_late: IntCounter,
    /// Duplicate frames.
    pub frames_duplicate: IntCounter,
    /// Frames arriving after their sequence was settled.
    pub frames_stale: IntCounter,
    /// Frames skipped by a gap, still inside the reorder window.
    pub frames_missing: IntGauge,
    /// Resets on a new epoch of an agent seen before (a restart or reconnect, DESIGN.md §5),
    /// counted at the stream's first frame in the new epoch; not loss.
    pub resets_epoch: IntCounter,
    /// Resyncs after a large jump.
    pub resets_resync: IntCounter,
    /// RFC 3550 A.3 interval loss fraction.
    pub loss_ratio: Gauge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_and_indexed() {
        let all: Vec<_> = DropReason::all().collect();
        let mut names: Vec<_> = all.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate label values");
        let mut idx: Vec<_> = all.iter().map(|r| r.index()).collect();
        idx.sort_unstable();
        idx.dedup();
        assert_eq!(idx.len(), n);
        assert!(idx.iter().all(|i| *i < DROP_REASONS));
        assert!(names.contains(&"psn_gap") && names.contains(&"no_receive_wr"));
        assert!(names.contains(&"qp_in_error"));
    }

    #[test]
    fn sink_drops_are_record_level_and_output_drops_have_no_reason_here() {
        let r = DropReason::LogSinkError;
        assert!(r.record_level() && !r.before_tracking(), "{r:?}");
        let t = Telemetry::new().unwrap();
        t.agent("web-1");
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains(
            "uctel_collector_records_dropped_total{agent=\"web-1\",reason=\"log_sink_error\"} 0"
        ));
        // An output's drops are its own (`crate::outputs` module docs, "Drops").
        assert!(!text.contains("reason=\"clickhouse_"), "{text}");
    }

    #[test]
    fn drop_event_counts_under_reason() {
        let t = Telemetry::new().unwrap();
        let a = t.agent("web-1");
        a.drop_frames(DropReason::CrcMismatch, 1, &"test");
        a.drop_frames(DropReason::CrcMismatch, 2, &"test");
        a.drop_frames(DropReason::Transport(UcDropReason::PsnGap), 5, &"test");
        a.drop_records(DropReason::SeriesCap, 7, &"test");
        assert_eq!(a.frames_dropped(DropReason::CrcMismatch), 3);
        assert_eq!(
            a.frames_dropped(DropReason::Transport(UcDropReason::PsnGap)),
            5
        );
        assert_eq!(a.records_dropped(DropReason::SeriesCap), 7);
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains(
            "uctel_collector_frames_dropped_total{agent=\"web-1\",reason=\"crc_mismatch\"} 3"
        ));
        assert!(text.contains(
            "uctel_collector_frames_dropped_total{agent=\"web-1\",reason=\"psn_gap\"} 5"
        ));
        // Pre-created zeros.
        assert!(text.contains(
            "uctel_collector_frames_dropped_total{agent=\"web-1\",reason=\"ring_overrun\"} 0"
        ));
        assert!(text.contains("uctel_collector_handshakes_refused_total{reason=\"bad_proof\"} 0"));
    }

    #[test]
    fn agent_counters_become_collector_series() {
        use uctel_protocol::control::{AgentStreamDropped, AgentStreamSent};
        let t = Telemetry::new().unwrap();
        let msg = |epoch, records| AgentCounters {
            counters_epoch: epoch,
            sent: vec![AgentStreamSent {
                stream_id: uctel_protocol::stream::METRICS,
                frames: 2,
                records: 80,
            }],
            dropped: vec![
                AgentStreamDropped {
                    stream_id: uctel_protocol::stream::METRICS,
                    reason: AgentDropReason::NoCredit as i32,
                    frames: 1,
                    records,
                },
                AgentStreamDropped {
                    stream_id: uctel_protocol::stream::LOGS,
                    reason: AgentDropReason::Shutdown as i32,
                    frames: 0,
                    records: 0,
                },
            ],
        };
        let a = t.agent("web-1");
        a.agent_counters(&msg(5, 40));
        a.agent_counters(&msg(5, 55));
        // A new session of the same agent process: the handles of the new session share
        // the baseline.
        t.agent("web-1").agent_counters(&msg(5, 60));
        assert_eq!(
            a.agent_records_dropped(uctel_protocol::stream::METRICS, AgentDropReason::NoCredit),
            60
        );
        // The agent restarted: its counters start again, the collector's go on.
        a.agent_counters(&msg(6, 4));
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains(
            "uctel_collector_agent_records_dropped_total{agent=\"web-1\",reason=\"no_credit\",stream=\"metrics\"} 64"
        ), "{text}");
        assert!(text.contains(
            "uctel_collector_agent_records_dropped_total{agent=\"web-1\",reason=\"shutdown\",stream=\"logs\"} 0"
        ));
        assert!(text.contains(
            "uctel_collector_agent_records_sent_total{agent=\"web-1\",stream=\"metrics\"} 160"
        ));
        assert!(text.contains(
            "uctel_collector_agent_frames_dropped_total{agent=\"web-1\",reason=\"no_credit\",stream=\"metrics\"} 2"
        ));
    }

    #[test]
    fn process_metrics_and_build_info_are_exposed() {
        let t = Telemetry::new().unwrap();
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains(&format!(
            "uctel_collector_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_resident_memory_bytes gauge"),
            "{text}"
        );
    }

    #[test]
    fn log_limiter_allows_first_then_throttles() {
        let t = Telemetry::new().unwrap();
        assert!(t.should_log("a", "x"));
        assert!(!t.should_log("a", "x"));
        assert!(t.should_log("b", "x"));
        assert!(t.should_log("a", "y"));
    }

    #[test]
    fn log_limiter_memory_is_bounded_by_unauthenticated_ids() {
        let t = Telemetry::new().unwrap();
        for i in 0..3 * LOG_LIMITER_ENTRIES {
            t.handshake_refused(RefuseReason::UnknownAgent, &format!("id-{i}"), "peer", "x");
        }
        let entries = t.log_limiter.lock().unwrap().len();
        assert_eq!(entries, LOG_LIMITER_ENTRIES);
        // Every refusal is still counted.
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains(&format!(
            "uctel_collector_handshakes_refused_total{{reason=\"unknown_agent\"}} {}",
            3 * LOG_LIMITER_ENTRIES
        )));
    }

    #[test]
    fn stream_handles() {
        let t = Telemetry::new().unwrap();
        let s = t.agent("a").stream(7);
        s.frames_received.inc_by(4);
        s.resets_epoch.inc();
        let a = t.agent("a");
        a.stream(uctel_protocol::stream::METRICS)
            .frames_received
            .inc_by(2);
        a.stream(uctel_protocol::stream::LOGS).frames_lost.inc();
        let text = String::from_utf8(t.render().unwrap()).unwrap();
        assert!(text.contains("uctel_collector_frames_received_total{agent=\"a\",stream=\"7\"} 4"));
        // Well-known streams carry the agent's names, so the two sides match in PromQL.
        assert!(text
            .contains("uctel_collector_frames_received_total{agent=\"a\",stream=\"metrics\"} 2"));
        assert!(text.contains("uctel_collector_frames_lost_total{agent=\"a\",stream=\"logs\"} 1"));
        assert!(text.contains(
            "uctel_collector_stream_resets_total{agent=\"a\",reason=\"epoch_change\",stream=\"7\"} 1"
        ));
    }
}
