//! The collector's self-metric families (module documentation of `telemetry`): the name
//! (under the `uctel_collector` namespace), help text and label names of each, and the
//! [`Registrar`] that creates one and registers it.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Registry};

use super::{opts, IntGauge};

/// One metric family: `name` without the namespace (`_total` for counters, as Prometheus
/// names them), `help` as exposed, `labels` the label names (empty for a single series).
pub(super) struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

/// Creates families and registers each in its registry.
pub(super) struct Registrar<'a>(pub(super) &'a Registry);

impl Registrar<'_> {
    /// A counter family (`IntCounterVec`).
    ///
    /// # Errors
    /// A bad name or label, or a family registered twice.
    pub(super) fn counter_vec(&self, f: &Family) -> Result<IntCounterVec, prometheus::Error> {
        let v = IntCounterVec::new(opts(f.name, f.help), f.labels)?;
        self.0.register(Box::new(v.clone()))?;
        Ok(v)
    }

    /// An integer gauge family (`IntGaugeVec`).
    ///
    /// # Errors
    /// As [`Registrar::counter_vec`].
    pub(super) fn int_gauge_vec(&self, f: &Family) -> Result<IntGaugeVec, prometheus::Error> {
        let v = IntGaugeVec::new(opts(f.name, f.help), f.labels)?;
        self.0.register(Box::new(v.clone()))?;
        Ok(v)
    }

    /// A float gauge family (`GaugeVec`).
    ///
    /// # Errors
    /// As [`Registrar::counter_vec`].
    pub(super) fn gauge_vec(&self, f: &Family) -> Result<GaugeVec, prometheus::Error> {
        let v = GaugeVec::new(opts(f.name, f.help), f.labels)?;
        self.0.register(Box::new(v.clone()))?;
        Ok(v)
    }

    /// One integer gauge without labels.
    ///
    /// # Errors
    /// As [`Registrar::counter_vec`].
    pub(super) fn int_gauge(&self, f: &Family) -> Result<IntGauge, prometheus::Error> {
        let v = IntGauge::with_opts(opts(f.name, f.help))?;
        self.0.register(Box::new(v.clone()))?;
        Ok(v)
    }

    /// One counter without labels.
    ///
    /// # Errors
    /// As [`Registrar::counter_vec`].
    pub(super) fn counter(&self, f: &Family) -> Result<prometheus::IntCounter, prometheus::Error> {
        let v = prometheus::IntCounter::with_opts(opts(f.name, f.help))?;
        self.0.register(Box::new(v.clone()))?;
        Ok(v)
    }
}

/// `frames_received_total`.
pub(super) const FRAMES_RECEIVED: Family = Family {
    name: "frames_received_total",
    help: "Frames accepted (header, CRC32C and payload valid, new in the stream sequence).",
    labels: &["agent", "stream"],
};

/// `frames_lost_total`.
pub(super) const FRAMES_LOST: Family = Family {
    name: "frames_lost_total",
    help: "Frames of the stream sequence that never arrived: counted once, when a skipped frame leaves the reorder window unseen (reorder_window_frames later frames, or reorder_window_seconds after the first of them) or the session ends (tail from Goodbye or the last heartbeat); never taken back.",
    labels: &["agent", "stream"],
};

/// `records_lost_total`.
pub(super) const RECORDS_LOST: Family = Family {
    name: "records_lost_total",
    help: "Records (samples or log lines) of lost frames, from the cumulative record counts of the frames around each gap; counted when the gap is settled, never taken back.",
    labels: &["agent", "stream"],
};

/// `records_replayed_total`.
pub(super) const RECORDS_REPLAYED: Family = Family {
    name: "records_replayed_total",
    help: "Records an agent sent again after a restart, already delivered (or counted lost) in an earlier epoch; discarded, in no other counter.",
    labels: &["agent", "stream"],
};

/// `frames_dropped_total`.
pub(super) const FRAMES_DROPPED: Family = Family {
    name: "frames_dropped_total",
    help: "Frames received but discarded, by reason.",
    labels: &["agent", "reason"],
};

/// `records_dropped_total`.
pub(super) const RECORDS_DROPPED: Family = Family {
    name: "records_dropped_total",
    help: "Records discarded from accepted frames, by reason (series cap, log sink errors).",
    labels: &["agent", "reason"],
};

/// `frames_late_total`.
pub(super) const FRAMES_LATE: Family = Family {
    name: "frames_late_total",
    help: "Frames that arrived after a later frame of the same stream (inside the reorder window); accepted.",
    labels: &["agent", "stream"],
};

/// `frames_duplicate_total`.
pub(super) const FRAMES_DUPLICATE: Family = Family {
    name: "frames_duplicate_total",
    help: "Frames whose stream sequence was already received; discarded.",
    labels: &["agent", "stream"],
};

/// `frames_stale_total`.
pub(super) const FRAMES_STALE: Family = Family {
    name: "frames_stale_total",
    help: "Frames that arrived after their sequence was settled (counted received or lost already, or of a closed or retired epoch); discarded and in no other counter.",
    labels: &["agent", "stream"],
};

/// `frames_missing`.
pub(super) const FRAMES_MISSING: Family = Family {
    name: "frames_missing",
    help: "Frames skipped by a gap that may still arrive (inside the reorder window, in frames and in time); counted lost once they leave it or the session ends.",
    labels: &["agent", "stream"],
};

/// `sessions_ended_total`.
pub(super) const SESSIONS_ENDED: Family = Family {
    name: "sessions_ended_total",
    help: "Agent sessions ended, by reason: goodbye (the agent named its last sequences; tail loss exact), no_goodbye (the connection ended or went silent without one: frames sent after the agent's last heartbeat are unknown and counted nowhere), replaced (a new connection of the same agent id took over a silent one), shutdown (the collector stopped).",
    labels: &["agent", "reason"],
};

/// `stream_resets_total`.
pub(super) const STREAM_RESETS: Family = Family {
    name: "stream_resets_total",
    help: "Stream sequence resets: epoch_change (new agent epoch) or dropout (a jump beyond max_dropout_frames, resynchronised, not counted as loss).",
    labels: &["agent", "stream", "reason"],
};

/// `connection_resets_total`.
pub(super) const CONNECTION_RESETS: Family = Family {
    name: "connection_resets_total",
    help: "Connection sequence resets: epoch_change (the agent came back with a new epoch: a restart or a reconnect, counted at the first frame of the new epoch) or dropout (a jump beyond max_dropout_frames).",
    labels: &["agent", "reason"],
};

/// `loss_ratio`.
pub(super) const LOSS_RATIO: Family = Family {
    name: "loss_ratio",
    help: "Fraction of expected frames lost in the last report interval (RFC 3550 A.3).",
    labels: &["agent", "stream"],
};

/// `connection_frames_lost_total`.
pub(super) const CONNECTION_FRAMES_LOST: Family = Family {
    name: "connection_frames_lost_total",
    help: "Gaps in the connection sequence not explained by a counted drop.",
    labels: &["agent"],
};

/// `agents_connected`.
pub(super) const AGENTS_CONNECTED: Family = Family {
    name: "agents_connected",
    help: "Agents with a live control connection and data path.",
    labels: &[],
};

/// `agent_up`.
pub(super) const AGENT_UP: Family = Family {
    name: "agent_up",
    help: "1 while the agent has a live session on this collector; 0 once it ended (Goodbye, control connection lost, or heartbeats missed past the dead-peer rule), kept for metrics.agent_up_retention_seconds.",
    labels: &["agent"],
};

/// `control_probes_total`.
pub(super) const CONTROL_PROBES: Family = Family {
    name: "control_probes_total",
    help: "Control connections closed before their first byte: health probes of agents connected to another collector of the pool.",
    labels: &[],
};

/// `probes_total`.
pub(super) const PROBES: Family = Family {
    name: "probes_total",
    help: "Probe messages answered by this collector's control listener: result=accepting (a Hello now would be taken) or refusing (draining or at control.max_agents).",
    labels: &["result"],
};

/// `draining`.
pub(super) const DRAINING: Family = Family {
    name: "draining",
    help: "1 while the collector drains (SIGUSR1 or POST /-/drain): new agents are refused, connected agents are told to move.",
    labels: &[],
};

/// `ring_slots_in_use`.
pub(super) const RING_SLOTS_IN_USE: Family = Family {
    name: "ring_slots_in_use",
    help: "Completed ring slots (and Send buffers) not yet consumed by the worker.",
    labels: &["agent"],
};

/// `rdma_async_events_total`.
pub(super) const RDMA_ASYNC_EVENTS: Family = Family {
    name: "rdma_async_events_total",
    help: "Asynchronous events (ibv_get_async_event) of the collector's RDMA device, QPs and CQs, by event.",
    labels: &["event"],
};

/// `connection_queues`.
pub(super) const CONNECTION_QUEUES: Family = Family {
    name: "connection_queues",
    help: "Agent connections (QPs) of the data-plane worker by where their completions and receive WRs go: shared_cq_srq (the worker's shared CQ and shared receive queue), shared_cq (shared CQ, a receive queue of their own: Send path, RC lanes, or a device that refused the SRQ), own (CQs and a receive queue of their own).",
    labels: &["queues"],
};

/// `qp_errors_total`.
pub(super) const QP_ERRORS: Family = Family {
    name: "qp_errors_total",
    help: "Times one of the agent's QPs (UC, or its RC lane's) went to the ERROR state (the connection is rebuilt).",
    labels: &["agent"],
};

/// `rc_qp_events_total`.
pub(super) const RC_QP_EVENTS: Family = Family {
    name: "rc_qp_events_total",
    help: "What the collector's RC QP of the agent's RC lane did to deliver (soft transport; verbs devices count per port): packets_retransmitted, timeouts, naks_sent, naks_received, rnr_naks_sent, rnr_naks_received, retry_exceeded, rnr_retry_exceeded, duplicates (IBTA 9.7, rxe hw_counters).",
    labels: &["agent", "event"],
};

/// `rc_gap_frames_total`.
pub(super) const RC_GAP_FRAMES: Family = Family {
    name: "rc_gap_frames_total",
    help: "Frames missing from the connection sequence of the agent's RC lane (also in connection_frames_lost_total). RC retransmits: frames go missing only when the lane ends with frames unacknowledged (its QP out of retries, a session cut short); any other gap is a bug.",
    labels: &["agent"],
};

/// `handshakes_refused_total`.
pub(super) const HANDSHAKES_REFUSED: Family = Family {
    name: "handshakes_refused_total",
    help: "Control-plane handshakes refused, by reason.",
    labels: &["reason"],
};

/// `connections_replaced_total`.
pub(super) const CONNECTIONS_REPLACED: Family = Family {
    name: "connections_replaced_total",
    help: "Agent connections ended because a new connection with the same agent id arrived: previous=\"silent\" (an agent restart racing its old connection) or previous=\"alive\" (the old connection was heard from within the last heartbeat interval: two agents probably share the agent id).",
    labels: &["agent", "previous"],
};

/// `transport_packets_dropped_total`.
pub(super) const TRANSPORT_PACKETS_DROPPED: Family = Family {
    name: "transport_packets_dropped_total",
    help:
        "Packets the transport device dropped before they reached a QP (no agent known), by reason.",
    labels: &["reason"],
};

/// `records_received_total`.
pub(super) const RECORDS_RECEIVED: Family = Family {
    name: "records_received_total",
    help: "Records (samples or log lines) delivered from accepted frames (log records replayed after an agent restart excluded: records_replayed_total).",
    labels: &["agent", "stream"],
};

/// `series`.
pub(super) const STORE_SERIES: Family = Family {
    name: "series",
    help: "Series currently stored for the agent (bounded by series_cap_per_agent).",
    labels: &["agent"],
};

/// `agent_frames_sent_total`.
pub(super) const AGENT_FRAMES_SENT: Family = Family {
    name: "agent_frames_sent_total",
    help: "Frames the agent posted to its transport, per stream: the agent's uctel_agent_frames_sent_total, carried by its heartbeats on the control connection (cumulative since the agent started; an agent restart adds on top).",
    labels: &["agent", "stream"],
};

/// `agent_records_sent_total`.
pub(super) const AGENT_RECORDS_SENT: Family = Family {
    name: "agent_records_sent_total",
    help: "Records in the frames the agent posted, per stream: the agent's uctel_agent_records_sent_total, carried by its heartbeats.",
    labels: &["agent", "stream"],
};

/// `agent_frames_dropped_total`.
pub(super) const AGENT_FRAMES_DROPPED: Family = Family {
    name: "agent_frames_dropped_total",
    help: "Frames the agent dropped before posting them, per stream and reason: the agent's uctel_agent_frames_dropped_total, carried by its heartbeats on the control connection, which its drops cannot starve.",
    labels: &["agent", "stream", "reason"],
};

/// `agent_records_dropped_total`.
pub(super) const AGENT_RECORDS_DROPPED: Family = Family {
    name: "agent_records_dropped_total",
    help: "Records the agent dropped before posting them, per stream and reason (no_credit, source_overflow, not_connected, ...): the agent's uctel_agent_records_dropped_total, carried by its heartbeats on the control connection, which its drops cannot starve; visible within one heartbeat interval.",
    labels: &["agent", "stream", "reason"],
};
