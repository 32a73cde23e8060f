//! The shapes of the collector's status document (`docs/status-api.md`, schema version 1).
//! Counts are whole items; `*_seconds` are seconds; `*_per_second` are rates over the
//! document's window (`window_seconds`, up to 10 s).

use std::collections::BTreeMap;

use serde::Serialize;

/// The whole document.
#[derive(Debug, Clone, Serialize)]
pub struct CollectorStatus {
    /// Schema version, 1.
    pub version: u32,
    /// `uctel-collector`.
    pub daemon: &'static str,
    /// The collector's package version.
    pub daemon_version: &'static str,
    /// When the document was built (Unix seconds).
    pub time_unix_seconds: f64,
    /// When the collector started (Unix seconds).
    pub started_unix_seconds: f64,
    /// Seconds since it started.
    pub uptime_seconds: f64,
    /// The span of every `last_10s` and `*_per_second` figure: 10 s once the collector has
    /// run that long, less before.
    pub window_seconds: f64,
    /// True while the collector drains (`SIGUSR1`, `POST /-/drain`).
    pub draining: bool,
    /// The collector-wide credit budget, frames (`credit_budget_frames` on `/metrics`).
    pub credit_budget_frames: u64,
    /// Frames the connected agents may send or have in flight (Σ claims).
    pub credit_claimed_frames: u64,
    /// One entry per agent with a session or with series on `/metrics`, by agent id.
    pub agents: Vec<AgentStatus>,
    /// Σ over `agents`.
    pub totals: Totals,
    /// The asynchronous outputs (remote-write endpoints, ClickHouse).
    pub outputs: Vec<OutputStatus>,
}

/// One agent.
#[derive(Debug, Clone, Serialize)]
pub struct AgentStatus {
    /// The agent id (`agent` label).
    pub agent: String,
    /// `connected` (a live session) or `disconnected` (series kept, no session).
    pub state: &'static str,
    /// Host name from its `Hello`; `null` while disconnected (as every session field).
    pub hostname: Option<String>,
    /// Its control-connection address.
    pub peer: Option<String>,
    /// Its epoch, hex (`0x…`, as the collector logs it).
    pub epoch: Option<String>,
    /// `write_with_imm` or `send`.
    pub data_path: Option<&'static str>,
    /// `["uc"]` or `["uc", "rc"]`; empty while disconnected.
    pub lanes: Vec<&'static str>,
    /// Seconds since its `Welcome`.
    pub connected_seconds: Option<f64>,
    /// When its `Welcome` was sent (Unix seconds).
    pub connected_since_unix_seconds: Option<f64>,
    /// Frames received per second over the window.
    pub frames_per_second: f64,
    /// Records received per second over the window.
    pub records_per_second: f64,
    /// Frames lost / (lost + received) over the window.
    pub loss_ratio_last_10s: f64,
    /// Frames the agent said it sent (heartbeats) that the collector has not consumed yet.
    pub lag_frames: Option<u64>,
    /// `ring_slots_in_use{agent}`: completed slots not consumed by the worker yet.
    pub ring_slots_in_use: u64,
    /// `frames_missing{agent}`: skipped by a gap, may still arrive.
    pub frames_missing: u64,
    /// Its share of the credit budget; `null` while disconnected.
    pub credit: Option<Credit>,
    /// Counters over the window.
    pub last_10s: Counts,
    /// Counters since the collector started (the `/metrics` series).
    pub total: Counts,
    /// The loss-accounting sum over `total` (README "Loss accounting").
    pub sum_rule: SumRule,
}

/// An agent's share of the credit budget (DESIGN.md §4), frames.
#[derive(Debug, Clone, Serialize)]
pub struct Credit {
    /// The window of its latest grant.
    pub window_frames: u64,
    /// The most its ring allows.
    pub window_cap_frames: u64,
    /// What it may send or has in flight now.
    pub claim_frames: u64,
    /// What it wants per report interval.
    pub want_frames: u64,
}

/// Counters of one agent (or Σ), each equal to the `uctel_collector_` series of the
/// same name summed over streams (since start), or its increase over the window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// `agent_frames_sent_total`: frames the agent posted (its heartbeats).
    pub frames_sent: u64,
    /// `agent_records_sent_total`.
    pub records_sent: u64,
    /// `frames_received_total`.
    pub frames_received: u64,
    /// `records_received_total`.
    pub records_received: u64,
    /// `frames_lost_total`.
    pub frames_lost: u64,
    /// `records_lost_total`.
    pub records_lost: u64,
    /// `records_replayed_total`.
    pub records_replayed: u64,
    /// `frames_dropped_total` by reason (dropped at the collector).
    pub frames_dropped: BTreeMap<String, u64>,
    /// `records_dropped_total` by reason.
    pub records_dropped: BTreeMap<String, u64>,
    /// `agent_frames_dropped_total` by reason (dropped at the agent, before sending).
    pub agent_frames_dropped: BTreeMap<String, u64>,
    /// `agent_records_dropped_total` by reason.
    pub agent_records_dropped: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.frames_sent += o.frames_sent;
        self.records_sent += o.records_sent;
        self.frames_received += o.frames_received;
        self.records_received += o.records_received;
        self.frames_lost += o.frames_lost;
        self.records_lost += o.records_lost;
        self.records_replayed += o.records_replayed;
        for (mine, theirs) in [
            (&mut self.frames_dropped, &o.frames_dropped),
            (&mut self.records_dropped, &o.records_dropped),
            (&mut self.agent_frames_dropped, &o.agent_frames_dropped),
            (&mut self.agent_records_dropped, &o.agent_records_dropped),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_insert(0) += v;
            }
        }
    }
}

/// The records sum of README "Loss accounting", over counters since start:
/// `sent = received + lost + dropped + replayed + unsettled` and
/// `produced = sent + agent_dropped`. `sent` and `agent_dropped` come with the agent's
/// heartbeats (at most one heartbeat interval old) while the collector's own counts are
/// live, so `unsettled` is what is in flight or missing (positive) less what arrived since
/// the agent's last heartbeat (negative); once an agent said `Goodbye` its figures are
/// final and the sum is exact.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SumRule {
    /// Records the sources produced: sent + dropped at the agent.
    pub produced: u64,
    /// Records the agent dropped before sending (Σ reasons).
    pub agent_dropped: u64,
    /// Records the agent sent, as of its last heartbeat.
    pub sent: u64,
    /// Records delivered.
    pub received: u64,
    /// Records lost on the wire.
    pub lost: u64,
    /// Records dropped at the collector (Σ reasons).
    pub dropped: u64,
    /// Log records sent again after an agent restart, discarded.
    pub replayed: u64,
    /// received + lost + dropped + replayed: every record the collector has accounted for.
    pub counted: u64,
    /// sent − counted.
    pub unsettled: i64,
}

impl SumRule {
    /// The sum over `c`.
    pub fn of(c: &Counts) -> SumRule {
        let agent_dropped: u64 = c.agent_records_dropped.values().sum();
        let dropped: u64 = c.records_dropped.values().sum();
        let counted = c.records_received + c.records_lost + dropped + c.records_replayed;
        SumRule {
            produced: c.records_sent + agent_dropped,
            agent_dropped,
            sent: c.records_sent,
            received: c.records_received,
            lost: c.records_lost,
            dropped,
            replayed: c.records_replayed,
            counted,
            unsettled: i64::try_from(c.records_sent)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(counted).unwrap_or(i64::MAX)),
        }
    }
}

/// Σ over the agents.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Agents with a live session.
    pub agents_connected: u64,
    /// Σ frames received per second.
    pub frames_per_second: f64,
    /// Σ records received per second.
    pub records_per_second: f64,
    /// Σ over the window.
    pub last_10s: Counts,
    /// Σ since start.
    pub total: Counts,
    /// The sum rule over `total`.
    pub sum_rule: SumRule,
}

impl Totals {
    /// Σ over `agents`.
    pub fn of(agents: &[AgentStatus]) -> Totals {
        let mut t = Totals::default();
        for a in agents {
            t.agents_connected += u64::from(a.state == "connected");
            t.frames_per_second += a.frames_per_second;
            t.records_per_second += a.records_per_second;
            t.last_10s.add(&a.last_10s);
            t.total.add(&a.total);
        }
        t.sum_rule = SumRule::of(&t.total);
        t
    }
}

/// One asynchronous output.
#[derive(Debug, Clone, Serialize)]
pub struct OutputStatus {
    /// `remote_write` or `clickhouse`.
    pub kind: &'static str,
    /// The endpoint (`url` label); `null` for ClickHouse (one table per collector).
    pub url: Option<String>,
    /// What it counts: `samples` or `rows`.
    pub items: &'static str,
    /// Items handed to it (`samples_in_total`, `rows_in_total`).
    pub items_in: u64,
    /// Items the receiver accepted (`samples_total`, `rows_inserted_total`).
    pub delivered: u64,
    /// Delivered per second since an earlier status request (up to 10 s ago; 0 on the
    /// first).
    pub delivered_per_second: f64,
    /// Items sent again after a recoverable error.
    pub retried: u64,
    /// Items queued or in flight (`samples_pending`, `rows_pending`).
    pub pending: u64,
    /// Items given up by reason (`*_dropped_total`; remote-write's `*_failed_total` as
    /// `failed_<reason>`). `items_in = delivered + Σ dropped + pending`.
    pub dropped: BTreeMap<String, u64>,
    /// The last error of a request (a retry, a refusal, a give-up), as logged; `null`
    /// when it has had none since the collector started.
    pub last_error: Option<LastError>,
}

/// An output's last error.
#[derive(Debug, Clone, Serialize)]
pub struct LastError {
    /// The error: the transport error or the receiver's status and answer.
    pub error: String,
    /// When (Unix seconds).
    pub at_unix_seconds: f64,
}

impl LastError {
    /// The last error of `endpoint` (`crate::outputs::last_error`).
    pub fn of(endpoint: &str) -> Option<LastError> {
        crate::outputs::last_error::get(endpoint).map(|(t, error)| LastError {
            error,
            at_unix_seconds: uctel_common::status::unix_seconds(t),
        })
    }
}
