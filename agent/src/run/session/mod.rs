//! One session (one epoch) of the agent as a state struct, [`Session`], and a thin async
//! driver around it ([`driver`]), the shape of quinn's `ConnectionDriver` over its sans-IO
//! `Connection`: the driver only waits (a deadline, the source queues, the control
//! connection, the liveness timer, the pool's probes, shutdown) and hands each event to one
//! method; the methods take the time as `now` and return what to send, or how the session
//! ends.
//!
//! ```text
//!  driver ── wake ─────────► Session::on_wake      → credit heartbeat? | end (a lane failed)
//!         ── control msg ──► Session::on_control   → end? (Goodbye, broken connection)
//!         ── liveness ─────► Session::on_liveness  → heartbeat? | end (collector silent)
//!         ── probe/move ───► driver::Moves          → end? (rebalance)
//!         ── shutdown ─────► end
//!  end ─────────────────────► Session::close        → last frames, Goodbye, final sequences
//! ```
//!
//! The session's lanes ([`Lanes`]: UC, then RC when configured) get the same work in a
//! loop; they take turns stepping first, because they draw on one pacer and the first to
//! ask takes the tokens.

#[allow(clippy::wildcard_imports)]
use super::*;

use uctel_protocol::control::{ControlMessage, Heartbeat};

use crate::config::Reliability;
use crate::credits::{CreditReader, WordRead};
use crate::lane::{Lane, Lanes, BUSY_RETRY};

mod close;
mod driver;
pub(super) use driver::session;

/// The state of one welcomed session: its lanes, the collector's liveness, and what the
/// lanes' last step asked for. Built without IO ([`Session::new`]); the driver feeds it.
#[derive(Debug)]
pub(super) struct Session {
    epoch: u64,
    collector: SocketAddr,
    lanes: Lanes,
    /// The dead-peer rule and the heartbeat period (`uctel_protocol::session::liveness`).
    liveness: Liveness,
    /// The sequence of the last periodic heartbeat: a credit heartbeat repeats it (it is not
    /// a period of its own).
    last_heartbeat: u64,
    /// The collector's `Welcome.report_interval_ms`, for the demand meter.
    report_interval: Duration,
    /// The lane that stepped first last time (index into the lanes).
    turn: usize,
    /// What the lanes' last step asked for ([`lane::merge_stops`] of theirs).
    stop: Stop,
    /// The credit word the collector writes into this session's memory, when it agreed to
    /// (`Welcome.credit_writes`, DESIGN.md §4); read at every wake for the UC lane.
    credit: Option<CreditReader>,
    stats: Arc<SelfMetrics>,
}

/// How often a session whose credits are written into its memory looks at its credit word
/// while its UC lane has frames and no credit, or records wait in a source queue for credit
/// ([`SenderCore::records_waiting`]): nothing else wakes it when a write lands.
pub(super) const CREDIT_WORD_POLL: Duration = Duration::from_millis(1);

/// What the collector's silence and heartbeat period are, for [`Session::new`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// The collector's heartbeat period (`SenderConfig::idle_heartbeat`).
    pub(super) heartbeat_every: Duration,
    /// `collector.heartbeat_timeout_seconds`: the collector is dead after the longer of
    /// this and [`AGENT_MISSED_HEARTBEATS`] periods of silence.
    pub(super) heartbeat_timeout: Duration,
    /// `Welcome.report_interval_ms`.
    pub(super) report_interval: Duration,
}

impl Session {
    /// A session of `epoch` with `collector` over `lanes`, welcomed at `now` (the collector
    /// counts as heard then; the first heartbeat is due at once).
    pub(super) fn new(
        epoch: u64,
        collector: SocketAddr,
        lanes: Lanes,
        timing: Timing,
        stats: Arc<SelfMetrics>,
        now: Instant,
    ) -> Session {
        let liveness = Liveness::new(
            LivenessConfig::new(
                timing.heartbeat_every,
                AGENT_MISSED_HEARTBEATS,
                timing.heartbeat_timeout,
            ),
            now,
        );
        Session {
            epoch,
            collector,
            lanes,
            liveness,
            last_heartbeat: 0,
            report_interval: timing.report_interval,
            turn: 0,
            stop: Stop::Wait(None),
            credit: None,
            stats,
        }
    }

    /// From now on the UC lane takes its credits also from the word `reader` reads
    /// (`Welcome.credit_writes`).
    pub(super) fn set_credit_reader(&mut self, reader: Option<CreditReader>) {
        self.credit = reader;
    }

    /// Reads the credit word once and hands a new one to the UC lane's pipeline.
    fn read_credit_word(&mut self) {
        let Some(reader) = self.credit.as_mut() else {
            return;
        };
        if let WordRead::New(w) = reader.read() {
            let _ = self
                .lanes
                .cores_mut()
                .0
                .on_credit_word(w.grant(), w.consumed_next);
        }
    }

    /// One wake of the send path: the lanes' QPs checked for a failure (the RC lane first:
    /// on the soft transport its QP shares the UC plane's device, whose async events the UC
    /// plane takes; the lane sees its own failure by its error completion, queued before the
    /// device's async event, so it is counted as the RC QP's), then one step of each lane,
    /// taking turns at going first. Returns a heartbeat to send now when a lane ran out of
    /// credit with frames to send or had its window taken back (the collector answers it
    /// with a report; `demand` learns the sessions were starved).
    ///
    /// # Errors
    /// [`SessionEnd::Lost`] on the data path: a failed QP or a failed post.
    pub(super) fn on_wake(
        &mut self,
        queues: &Queues,
        demand: &mut DemandMeter,
    ) -> Result<Option<Heartbeat>, SessionEnd> {
        for lane in self.lanes.iter_mut().rev() {
            if let Some(why) = lane.failure(&self.stats) {
                return Err(SessionEnd::Lost(why, LostOn::DataPath));
            }
        }
        // After the failure checks: they polled the CQs, which on a busy-poll soft device
        // is also what moved the collector's credit writes into memory.
        self.read_credit_word();
        let n = self.lanes.len();
        self.turn = (self.turn + 1) % n.max(1);
        let mut stops = vec![Stop::Wait(None); n];
        for k in 0..n {
            let i = (self.turn + k) % n;
            if let Some(lane) = self.lanes.get_mut(i) {
                stops[i] = lane.step(queues, &self.stats);
            }
        }
        let credit_heartbeat = self.credit_asked();
        if credit_heartbeat {
            // Before a failed post ends the session: the next session's `Hello` still
            // announces the rate this one was starved at.
            demand.starved();
        }
        for (lane, stop) in self.lanes.iter().zip(&stops).rev() {
            if *stop == Stop::Failed {
                return Err(SessionEnd::Lost(
                    lane.post_failed(&self.stats),
                    LostOn::DataPath,
                ));
            }
        }
        self.stop = stops
            .into_iter()
            .reduce(|a, b| lane::merge_stops(a, Some(b)))
            .unwrap_or(Stop::Wait(None));
        if !credit_heartbeat {
            return Ok(None);
        }
        Ok(Some(self.lanes.heartbeat(self.last_heartbeat, &self.stats)))
    }

    /// Whether a lane ran out of credit with frames to send since the last call (at most
    /// once per grant: [`SenderCore::take_credit_heartbeat`]); resets.
    fn credit_asked(&mut self) -> bool {
        let mut asked = false;
        for lane in self.lanes.iter_mut() {
            asked |= lane.core.take_credit_heartbeat();
        }
        asked
    }

    /// When the send path wants the next wake after `now`: the lanes' pacing or credit
    /// deadline, [`BUSY_RETRY`] when a send queue was full, and sooner while sends are in
    /// flight ([`Lane::reap_after`]). `None`: only an event (records queued, a control
    /// message) wakes it.
    pub(super) fn next_wake(&self, now: Instant) -> Option<Instant> {
        let mut deadline = match self.stop {
            Stop::Wait(at) => at,
            Stop::Busy | Stop::Failed => Some(now + BUSY_RETRY),
        };
        if let Some(after) = self.lanes.iter().filter_map(Lane::reap_after).min() {
            let soon = now + after;
            deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
        }
        let uc = &self.lanes.uc().core;
        let starved = uc.ready_frames() > 0 && uc.credits_available() == 0;
        if self.credit.is_some() && (starved || uc.records_waiting()) {
            let soon = now + CREDIT_WORD_POLL;
            deadline = Some(deadline.map_or(soon, |d| d.min(soon)));
        }
        deadline
    }

    /// A control message (or the connection's error) received at `now`. A `Report` returns
    /// each lane its credits, feeds `demand` and sets `delivery_ratio` per stream.
    ///
    /// # Errors
    /// [`SessionEnd::Drain`] for the collector's `Goodbye` with reason `drain`;
    /// [`SessionEnd::Lost`] on the control connection for any other `Goodbye`, an
    /// unexpected or empty message, or a broken connection.
    pub(super) fn on_control(
        &mut self,
        now: Instant,
        msg: Result<ControlMessage, ControlError>,
        demand: &mut DemandMeter,
    ) -> Result<(), SessionEnd> {
        self.liveness.on_receive(now);
        let lost = |why: String| SessionEnd::Lost(why, LostOn::Control);
        let msg = msg.map_err(|e| lost(e.to_string()))?;
        match msg.body {
            Some(Body::Report(r)) => {
                self.on_report(&r, now, demand);
                Ok(())
            }
            Some(Body::DictAck(a)) => {
                for lane in self.lanes.iter_mut() {
                    lane.core.on_dict_ack(&a);
                }
                Ok(())
            }
            Some(Body::Heartbeat(_)) => Ok(()),
            Some(Body::Goodbye(g)) if g.reason == GoodbyeReason::Drain as i32 => {
                Err(SessionEnd::Drain(g.detail))
            }
            Some(Body::Goodbye(g)) => {
                Err(lost(format!("the collector said goodbye: {}", g.detail)))
            }
            Some(other) => Err(lost(format!(
                "unexpected {} from the collector",
                other.name()
            ))),
            None => Err(lost("empty control message".into())),
        }
    }

    fn on_report(&mut self, r: &control::Report, now: Instant, demand: &mut DemandMeter) {
        for lane in self.lanes.iter_mut() {
            lane.on_report(r);
        }
        demand.on_report(now, self.lanes.frames_sent(), self.report_interval);
        for s in &r.streams {
            if let Some(stream) = Stream::from_id(s.stream_id) {
                let total = s.received.saturating_add(s.lost);
                #[allow(clippy::cast_precision_loss)]
                let ratio = if total == 0 {
                    1.0
                } else {
                    s.received as f64 / total as f64
                };
                self.stats.set_delivery_ratio(stream, ratio);
            }
        }
    }

    /// When [`Session::on_liveness`] is due next; `None` once the collector was found dead.
    pub(super) fn liveness_due(&self) -> Option<Instant> {
        self.liveness.poll_timeout()
    }

    /// The liveness timer at `now`: a periodic heartbeat to send (with the lanes' sequences
    /// and the agent's counters), or nothing (woken early).
    ///
    /// # Errors
    /// [`SessionEnd::Lost`] on the control connection when nothing was heard from the
    /// collector for the dead-peer time.
    pub(super) fn on_liveness(&mut self, now: Instant) -> Result<Option<Heartbeat>, SessionEnd> {
        match self.liveness.handle_timeout(now) {
            Some(LivenessEvent::PeerDead { .. }) => Err(SessionEnd::Lost(
                format!(
                    "nothing heard from the collector for {:?}",
                    self.liveness.dead_after()
                ),
                LostOn::Control,
            )),
            Some(LivenessEvent::SendHeartbeat { sequence }) => {
                self.last_heartbeat = sequence;
                Ok(Some(self.lanes.heartbeat(sequence, &self.stats)))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
