//! The rules of one agent's session after its `Welcome`, with no socket and no clock: every
//! event comes in with its `now`, and what to send comes out as a value
//! (`STYLE.md`, "Sans-IO core"; the model is quinn-proto's `Connection` under quinn's
//! `ConnectionDriver`). The driver in `super::session` waits for the events and does the IO.
//!
//! - **Liveness** (`uctel_protocol::session::liveness`): heartbeats every heartbeat
//!   interval; the agent is dead after `dead_after_missed_heartbeats` intervals of silence.
//!   Every message heard also stamps the [`SessionLink`], the registry's rule for telling a
//!   silent session (replaced by a newer connection of its agent id) from a live one (a
//!   second connection with its id is refused).
//! - **Reports**: every report interval on the collector-wide grid (`super::cadence`), and
//!   early for an agent out of credit: at most twice per report interval, half an interval
//!   after the last report (at once if that has passed).
//! - **The end** ([`SessionState::close`]): how the session ended (the agent's `Goodbye`,
//!   vanished, or ended by the collector) decides the `Goodbye` the collector sends, the log
//!   line's `ended_by` and `sessions_ended_total{reason}` ([`SessionEnd`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uctel_protocol::control::{self as wire, Body, Goodbye, GoodbyeReason, Heartbeat};
use uctel_protocol::session::handshake::cut_at_char;
use uctel_protocol::session::{Liveness, LivenessConfig, LivenessEvent};

use super::registry::SessionLink;
use crate::credits::SentTail;
use crate::telemetry::SessionEnd;

/// Why the collector ended a session: the reason and detail of the `Goodbye` it sends.
pub(super) type Ending = (GoodbyeReason, &'static str);

/// The `Goodbye` a draining collector sends to tell its agent to move.
pub(super) const DRAIN_DETAIL: &str =
    "the collector is draining; move to the next collector of the pool";

/// What the driver does after an event.
#[derive(Debug)]
pub(super) enum Flow {
    /// Keep waiting for events.
    Go,
    /// The session is over: `Some` when the collector ends it (its `Goodbye` is sent),
    /// `None` when the agent said `Goodbye` or vanished.
    End(Option<Ending>),
}

/// What a control message from the agent asks of the driver ([`SessionState::on_message`]).
#[derive(Debug)]
pub(super) enum Heard {
    /// A heartbeat: its credit fields and sent sequences go to the credit budget and each
    /// lane's ingest.
    Heartbeat(Heartbeat),
    /// The session is over ([`Flow::End`]).
    End(Option<Ending>),
    /// A message the agent must not send after its `Hello` (its name): the session ends
    /// with [`UNEXPECTED`].
    Unexpected(&'static str),
}

/// How the collector ends a session whose agent sent a message out of turn.
pub(super) const UNEXPECTED: Ending = (GoodbyeReason::Error, "unexpected control message");

/// Whether a report is sent at its report interval or early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Early {
    /// At its tick of the report interval.
    No,
    /// Between ticks, for an agent out of credit.
    Yes,
}

/// The timing durations of a session, from the configuration and the agent's `Hello`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// Period between the collector's heartbeats (`Welcome.heartbeat_interval_ms`).
    pub(super) heartbeat: Duration,
    /// Heartbeat periods of silence after which the agent is dead.
    pub(super) dead_after_missed: u32,
    /// Period between reports (`Welcome.report_interval_ms`).
    pub(super) report_every: Duration,
}

/// How a session ended, for its accounting and its log line ([`SessionState::close`]).
#[derive(Debug)]
pub(super) struct Closing {
    /// The agent's `Goodbye` (its final sequences settle the tail), if it said one.
    pub(super) goodbye: Option<Goodbye>,
    /// The `Goodbye` the collector sends (it ended the session).
    pub(super) send: Option<Goodbye>,
    /// What ended it, for the log line's `ended_by`.
    pub(super) ended_by: String,
    /// The agent vanished (no `Goodbye`): the log line is a warning.
    pub(super) vanished: bool,
    /// Its `sessions_ended_total{reason}`.
    pub(super) end: SessionEnd,
    /// From the `Welcome` to `now`.
    pub(super) connected_for: Duration,
}

/// The sans-IO state of one agent's session (module docs).
#[derive(Debug)]
pub(super) struct SessionState {
    liveness: Liveness,
    link: Arc<SessionLink>,
    report_every: Duration,
    /// When the last report was sent (the early report's clock).
    last_report: Instant,
    /// The agent said it is out of credit: when its early report is due.
    early_due: Option<Instant>,
    /// The agent's sent sequences, by when they were heard (credits of frames lost on the
    /// wire come back).
    sent_tail: SentTail,
    /// The drain's `Goodbye` was sent (once).
    told_to_move: bool,
    /// The agent's `Goodbye`.
    goodbye: Option<Goodbye>,
    /// Why the agent is gone when it left without a `Goodbye`.
    vanished: Option<String>,
    /// A send failed: the agent's `Goodbye` may still be unread in the socket.
    send_failed: bool,
    connected_at: Instant,
}

impl SessionState {
    /// A session whose `Welcome` went out at `now`; `link` is its registry entry's.
    pub(super) fn new(timing: Timing, link: Arc<SessionLink>, now: Instant) -> SessionState {
        let liveness = Liveness::new(
            LivenessConfig::new(timing.heartbeat, timing.dead_after_missed, Duration::ZERO),
            now,
        );
        SessionState {
            liveness,
            link,
            report_every: timing.report_every,
            last_report: now,
            early_due: None,
            sent_tail: SentTail::default(),
            told_to_move: false,
            goodbye: None,
            vanished: None,
            send_failed: false,
            connected_at: now,
        }
    }

    /// Silence after which the agent is dead; also the bound on one send to it.
    pub(super) fn dead_after(&self) -> Duration {
        self.liveness.dead_after()
    }

    /// When [`SessionState::on_liveness`] is due (`None`: the agent was declared dead).
    pub(super) fn liveness_deadline(&self) -> Option<Instant> {
        self.liveness.poll_timeout()
    }

    /// When the early report is due (`None`: none asked for).
    pub(super) fn early_due(&self) -> Option<Instant> {
        self.early_due
    }

    /// Whether the drain's `Goodbye` was sent.
    pub(super) fn told_to_move(&self) -> bool {
        self.told_to_move
    }

    /// A drain started: the `Goodbye{reason: drain}` to send, once.
    pub(super) fn on_drain(&mut self) -> Goodbye {
        self.told_to_move = true;
        Goodbye {
            final_conn_seq: None,
            streams: Vec::new(),
            reason: GoodbyeReason::Drain as i32,
            detail: DRAIN_DETAIL.into(),
            rc_final_conn_seq: None,
        }
    }

    /// A control message with `body` arrived at `now`. A heartbeat asks for an early
    /// report when either lane is out of credit (`frames_without_credit`,
    /// `rc_frames_without_credit`); a `Goodbye` ends the session; anything else ends it as an
    /// error ([`Heard::Unexpected`], an empty message [`Heard::End`]).
    pub(super) fn on_message(&mut self, body: Option<Body>, now: Instant) -> Heard {
        self.liveness.on_receive(now);
        self.link.heard_at(now);
        match body {
            Some(Body::Heartbeat(hb)) => {
                self.sent_tail.on_heartbeat(hb.sent_conn_seq, now);
                let starved = hb.frames_without_credit.unwrap_or(0);
                let rc_starved = hb.rc_frames_without_credit.unwrap_or(0);
                if starved > 0 || rc_starved > 0 {
                    self.early_due = Some(self.last_report + self.report_every / 2);
                }
                Heard::Heartbeat(hb)
            }
            Some(Body::Goodbye(g)) => {
                self.goodbye = Some(g);
                Heard::End(None)
            }
            Some(other) => Heard::Unexpected(other.name()),
            None => Heard::End(Some((GoodbyeReason::Error, "empty control message"))),
        }
    }

    /// The control connection closed (`why`: how) without a `Goodbye`.
    pub(super) fn on_closed(&mut self, why: String) -> Flow {
        self.vanished = Some(why);
        Flow::End(None)
    }

    /// A send of `what` (`"a heartbeat"`, …) failed or stalled: the session ends, unless the
    /// agent's `Goodbye` is read after all ([`SessionState::on_unread_goodbye`]).
    pub(super) fn on_send_failed(&mut self, what: &str) -> Flow {
        self.vanished = Some(format!(
            "the control connection failed: {what} could not be sent"
        ));
        self.send_failed = true;
        Flow::End(None)
    }

    /// Whether a send failed (the driver then looks for an unread `Goodbye`).
    pub(super) fn send_failed(&self) -> bool {
        self.send_failed
    }

    /// The agent's `Goodbye`, found unread after a send failed: a clean goodbye after all.
    pub(super) fn on_unread_goodbye(&mut self, g: Goodbye) {
        self.goodbye = Some(g);
        self.vanished = None;
    }

    /// The liveness deadline passed at `now`: a heartbeat to send, the agent dead (the
    /// session ends), or nothing (woken early).
    pub(super) fn on_liveness(&mut self, now: Instant) -> Result<Option<Heartbeat>, Flow> {
        match self.liveness.handle_timeout(now) {
            Some(LivenessEvent::PeerDead { silent_for }) => {
                self.vanished = Some(format!(
                    "no heartbeat for {silent_for:.1?} (at most {:?})",
                    self.dead_after()
                ));
                Err(Flow::End(Some((GoodbyeReason::Error, "heartbeats missed"))))
            }
            Some(LivenessEvent::SendHeartbeat { sequence }) => Ok(Some(Heartbeat {
                sequence,
                timestamp_ns: now_ns(),
                ..Heartbeat::default()
            })),
            None => Ok(None),
        }
    }

    /// A report is sent at `now` (at its tick, or early): it serves an early one waiting too.
    /// Returns the highest connection sequence the agent sent long enough ago that it will
    /// not arrive any more ([`SentTail::gone`]): the report's consumed point is at least that.
    pub(super) fn on_report(&mut self, now: Instant) -> Option<u64> {
        self.early_due = None;
        self.last_report = now;
        self.sent_tail.gone(now)
    }

    /// The session is over at `now`: `ending` is the collector's reason when it ended it,
    /// `replaced_by` the detail a replacing connection left (it becomes the `Goodbye`'s
    /// detail of a [`GoodbyeReason::Reconnect`]).
    pub(super) fn close(
        self,
        ending: Option<Ending>,
        replaced_by: Option<String>,
        now: Instant,
    ) -> Closing {
        let ended_by = match (&self.goodbye, &self.vanished, ending) {
            (Some(g), ..) => format!("the agent's Goodbye ({})", goodbye_reason(g)),
            (None, Some(why), _) => why.clone(),
            (None, None, Some((_, detail))) => detail.to_owned(),
            (None, None, None) => "the session ended".to_owned(),
        };
        let send = ending.map(|(reason, detail)| {
            let detail = match (reason, replaced_by) {
                (GoodbyeReason::Reconnect, Some(why)) => why,
                _ => detail.to_owned(),
            };
            Goodbye {
                final_conn_seq: None,
                streams: Vec::new(),
                reason: reason as i32,
                detail: cut_at_char(&detail, wire::MAX_DETAIL_BYTES).to_owned(),
                rc_final_conn_seq: None,
            }
        });
        let end = match (&self.goodbye, ending) {
            (Some(_), _) => SessionEnd::Goodbye,
            (None, Some((GoodbyeReason::Reconnect, _))) => SessionEnd::Replaced,
            (None, Some((GoodbyeReason::Shutdown, _))) => SessionEnd::Shutdown,
            (None, _) => SessionEnd::NoGoodbye,
        };
        Closing {
            vanished: self.vanished.is_some(),
            goodbye: self.goodbye,
            send,
            ended_by,
            end,
            connected_for: now.saturating_duration_since(self.connected_at),
        }
    }
}

/// Nanoseconds since the Unix epoch (a heartbeat's `timestamp_ns`; 0 before 1970).
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// An agent's `Goodbye` reason and detail for a log line: `shutdown`, `shutdown: stopping`.
fn goodbye_reason(g: &Goodbye) -> String {
    let reason = match GoodbyeReason::try_from(g.reason) {
        Ok(GoodbyeReason::Shutdown) => "shutdown",
        Ok(GoodbyeReason::Reconnect) => "reconnect",
        Ok(GoodbyeReason::Error) => "error",
        _ => "unspecified",
    };
    let detail: String = g
        .detail
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if detail.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}: {detail}")
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
