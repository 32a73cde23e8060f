//! The collector's status API: `GET /api/v1/status` on its metrics port, a JSON document
//! of schema version [`uctel_common::status::API_VERSION`] (`docs/status-api.md`).
//!
//! Built at each request from what the collector already keeps: the live sessions
//! ([`Board`], put there by the control plane), the credit budget, and the counters behind
//! `/metrics` ([`crate::telemetry::Telemetry::status_samples`] per agent; the registry for
//! the outputs). A figure named after a metric equals that series at the same moment;
//! "last 10 s" figures are increases over a [`Window`] sampled every second
//! ([`sample_loop`]). A request costs what a scrape of the self-metrics costs.
//!
//! - [`board`]: the live sessions.
//! - [`view`]: the document's shapes (serde).

pub mod board;
pub mod view;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use uctel_common::shutdown::Shutdown;
use uctel_common::status::{Samples, Since, Window, SAMPLE_EVERY};

pub use board::{Board, SessionView};

use crate::credits::CreditBudget;
use crate::telemetry::Telemetry;
use view::{AgentStatus, CollectorStatus, Counts, Credit, LastError, OutputStatus, SumRule};

const C: &str = "uctel_collector_";

/// Everything the status document is built from; cheap to clone.
#[derive(Debug, Clone)]
pub struct Status {
    board: Board,
    telemetry: Telemetry,
    credits: Arc<CreditBudget>,
    window: Arc<Mutex<Window>>,
    /// The outputs' counters at earlier requests (their rates; not sampled in between).
    outputs_window: Arc<Mutex<Window>>,
    started: SystemTime,
    started_instant: Instant,
    draining: Shutdown,
}

impl Status {
    /// The status of a collector whose sessions go on `board`; `draining` fires when it
    /// drains.
    pub fn new(
        board: Board,
        telemetry: Telemetry,
        credits: Arc<CreditBudget>,
        draining: Shutdown,
    ) -> Status {
        Status {
            board,
            telemetry,
            credits,
            window: Arc::default(),
            outputs_window: Arc::default(),
            started: SystemTime::now(),
            started_instant: Instant::now(),
            draining,
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds the per-agent counters now to the window.
    pub fn sample(&self, now: Instant) -> Arc<Samples> {
        let samples = Arc::new(self.telemetry.status_samples());
        self.window().record(now, samples.clone());
        samples
    }

    /// The status document now.
    pub fn document(&self) -> CollectorStatus {
        let now = Instant::now();
        let current = self.sample(now);
        let since = self.window().since(now, &current);
        let sessions = self.board.sessions();
        let mut ids: Vec<String> =
            current.label_values(&format!("{C}agent_frames_sent_total"), "agent");
        for name in [
            "frames_received_total",
            "frames_lost_total",
            "frames_missing",
        ] {
            ids.extend(current.label_values(&format!("{C}{name}"), "agent"));
        }
        ids.extend(sessions.keys().cloned());
        ids.sort();
        ids.dedup();
        let agents: Vec<AgentStatus> = ids
            .iter()
            .map(|id| self.agent(id, sessions.get(id), &current, &since, now))
            .collect();
        let budget = self.credits.state();
        let all = Arc::new(gather_outputs(&self.telemetry));
        let outputs_since = {
            let mut w = self
                .outputs_window
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            w.record(now, all.clone());
            w.since(now, &all)
        };
        CollectorStatus {
            version: uctel_common::status::API_VERSION,
            daemon: "uctel-collector",
            daemon_version: env!("CARGO_PKG_VERSION"),
            time_unix_seconds: uctel_common::status::unix_seconds(SystemTime::now()),
            started_unix_seconds: uctel_common::status::unix_seconds(self.started),
            uptime_seconds: now
                .saturating_duration_since(self.started_instant)
                .as_secs_f64(),
            window_seconds: since.seconds,
            draining: self.draining.is_triggered(),
            credit_budget_frames: budget.capacity,
            credit_claimed_frames: budget.claimed,
            totals: view::Totals::of(&agents),
            agents,
            outputs: outputs(&all, &outputs_since),
        }
    }

    /// The document as JSON bytes (what the route serves).
    pub fn json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.document()).unwrap_or_else(|e| {
            format!("{{\"version\":1,\"error\":{:?}}}", e.to_string()).into_bytes()
        })
    }

    fn agent(
        &self,
        id: &str,
        session: Option<&SessionView>,
        current: &Samples,
        since: &Since,
        now: Instant,
    ) -> AgentStatus {
        let total = counts(current, None, id);
        let last = counts(current, Some(since), id);
        let a = [("agent", id)];
        let credit = session
            .and_then(|s| self.credits.conn(s.conn_id))
            .map(|c| Credit {
                window_frames: c.window,
                window_cap_frames: c.window_cap,
                claim_frames: c.claim,
                want_frames: c.want,
            });
        AgentStatus {
            agent: id.to_owned(),
            state: if session.is_some() {
                "connected"
            } else {
                "disconnected"
            },
            hostname: session.map(|s| s.hostname.clone()),
            peer: session.map(|s| s.peer.to_string()),
            epoch: session.map(|s| format!("{:#x}", s.epoch)),
            data_path: session.map(|s| s.data_path),
            lanes: session.map(|s| s.lanes.clone()).unwrap_or_default(),
            connected_seconds: session
                .map(|s| now.saturating_duration_since(s.since_instant).as_secs_f64()),
            connected_since_unix_seconds: session
                .map(|s| uctel_common::status::unix_seconds(s.since)),
            frames_per_second: since.rate(current, &format!("{C}frames_received_total"), &a),
            records_per_second: since.rate(current, &format!("{C}records_received_total"), &a),
            loss_ratio_last_10s: ratio(last.frames_lost, last.frames_received),
            lag_frames: session
                .and_then(|s| self.credits.conn(s.conn_id))
                .map(|c| c.in_flight),
            ring_slots_in_use: as_u64(current.sum(&format!("{C}ring_slots_in_use"), &a)),
            frames_missing: as_u64(current.sum(&format!("{C}frames_missing"), &a)),
            credit,
            sum_rule: SumRule::of(&total),
            last_10s: last,
            total,
        }
    }
}

/// Lost over lost + received (0 when nothing was expected).
fn ratio(lost: u64, received: u64) -> f64 {
    let expected = lost + received;
    if expected == 0 {
        0.0
    } else {
        #[allow(clippy::cast_precision_loss)]
        let r = lost as f64 / expected as f64;
        r
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn as_u64(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

fn by_reason(m: BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    m.into_iter().map(|(k, v)| (k, as_u64(v))).collect()
}

/// `agent`'s counters since start (`since` `None`) or over the window.
fn counts(current: &Samples, since: Option<&Since>, agent: &str) -> Counts {
    let a = [("agent", agent)];
    let get = |name: &str| {
        let name = format!("{C}{name}");
        as_u64(match since {
            Some(s) => s.increase(current, &name, &a),
            None => current.sum(&name, &a),
        })
    };
    let reasons = |name: &str| {
        let name = format!("{C}{name}");
        by_reason(match since {
            Some(s) => s.increase_by(current, &name, "reason", &a),
            None => current.sum_by(&name, "reason", &a),
        })
    };
    Counts {
        frames_sent: get("agent_frames_sent_total"),
        records_sent: get("agent_records_sent_total"),
        frames_received: get("frames_received_total"),
        records_received: get("records_received_total"),
        frames_lost: get("frames_lost_total"),
        records_lost: get("records_lost_total"),
        records_replayed: get("records_replayed_total"),
        frames_dropped: reasons("frames_dropped_total"),
        records_dropped: reasons("records_dropped_total"),
        agent_frames_dropped: reasons("agent_frames_dropped_total"),
        agent_records_dropped: reasons("agent_records_dropped_total"),
    }
}

/// The outputs' families (`remote_write_*`, `clickhouse_*`) from the whole registry.
fn gather_outputs(telemetry: &Telemetry) -> Samples {
    let families: Vec<_> = telemetry
        .registry()
        .gather()
        .into_iter()
        .filter(|f| {
            let n = f.name();
            n.starts_with("uctel_collector_remote_write_")
                || n.starts_with("uctel_collector_clickhouse_")
        })
        .collect();
    Samples::from_families(&families)
}

fn outputs(s: &Samples, since: &Since) -> Vec<OutputStatus> {
    let rw = "uctel_collector_remote_write_";
    let mut out: Vec<OutputStatus> = s
        .label_values(&format!("{rw}samples_in_total"), "url")
        .into_iter()
        .map(|url| {
            let u = [("url", url.as_str())];
            let mut dropped =
                by_reason(s.sum_by(&format!("{rw}samples_dropped_total"), "reason", &u));
            for (k, v) in by_reason(s.sum_by(&format!("{rw}samples_failed_total"), "reason", &u)) {
                *dropped.entry(format!("failed_{k}")).or_insert(0) += v;
            }
            OutputStatus {
                kind: "remote_write",
                url: Some(url.clone()),
                items: "samples",
                items_in: as_u64(s.sum(&format!("{rw}samples_in_total"), &u)),
                delivered: as_u64(s.sum(&format!("{rw}samples_total"), &u)),
                delivered_per_second: since.rate(s, &format!("{rw}samples_total"), &u),
                retried: as_u64(s.sum(&format!("{rw}samples_retried_total"), &u)),
                pending: as_u64(s.sum(&format!("{rw}samples_pending"), &u)),
                dropped,
                last_error: LastError::of(&url),
            }
        })
        .collect();
    let ch = "uctel_collector_clickhouse_";
    if !s.series(&format!("{ch}rows_in_total")).is_empty() {
        out.push(OutputStatus {
            kind: "clickhouse",
            url: None,
            items: "rows",
            items_in: as_u64(s.sum(&format!("{ch}rows_in_total"), &[])),
            delivered: as_u64(s.sum(&format!("{ch}rows_inserted_total"), &[])),
            delivered_per_second: since.rate(s, &format!("{ch}rows_inserted_total"), &[]),
            retried: as_u64(s.sum(&format!("{ch}rows_retried_total"), &[])),
            pending: as_u64(s.sum(&format!("{ch}rows_pending"), &[])),
            dropped: by_reason(s.sum_by(&format!("{ch}rows_dropped_total"), "reason", &[])),
            last_error: LastError::of(crate::outputs::last_error::CLICKHOUSE),
        });
    }
    out
}

/// Samples `status` every [`SAMPLE_EVERY`] until `shutdown`, so the "last 10 s" figures
/// cover ten seconds however rarely the API is asked.
pub async fn sample_loop(status: Status, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => { status.sample(Instant::now()); }
            () = shutdown.wait() => return,
        }
    }
}
