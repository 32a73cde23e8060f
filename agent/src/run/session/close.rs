//! The end of a session: the last frames of a planned end (shutdown, drain, rebalance)
//! within [`FINISH_GRACE`], every lane's epoch ended ([`Lane::end_epoch`]), then the last
//! heartbeat and the `Goodbye` with the final sequences ([`Session::last_words`]).

#[allow(clippy::wildcard_imports)]
use super::*;

use crate::lane::BUSY_RETRY;

/// What a session says as it ends.
#[derive(Debug)]
pub(in crate::run) struct LastWords {
    /// A last heartbeat with the agent's counters, before `Goodbye` (planned ends only: the
    /// counters with this epoch's final drops reach the collector before the connection
    /// closes).
    pub(in crate::run) heartbeat: Option<Heartbeat>,
    /// The `Goodbye` with both lanes' final sequences.
    pub(in crate::run) goodbye: control::Goodbye,
    /// The merged final sequences of the lanes ([`Lanes::merged`]).
    pub(in crate::run) fin: FinalSequences,
    /// The RC lane's own final sequences, with an RC lane.
    pub(in crate::run) rc_fin: Option<FinalSequences>,
    /// The ending for the `goodbye sent` line: `shutdown`, `drain`, `rebalance` or `lost`.
    pub(in crate::run) label: &'static str,
}

impl Session {
    /// The `Goodbye` (and, for a planned end, the last heartbeat) for `end`, from the lanes'
    /// sequences now: reason `shutdown` for a shutdown, `reconnect` otherwise, with a detail
    /// that says why (a drain, the collector moved to, or what was lost).
    pub(in crate::run) fn last_words(&mut self, end: &SessionEnd) -> LastWords {
        let (reason, detail, label) = match end {
            SessionEnd::Shutdown => (
                GoodbyeReason::Shutdown,
                "agent shutting down".to_owned(),
                "shutdown",
            ),
            SessionEnd::Drain(_) => (
                GoodbyeReason::Reconnect,
                "the collector is draining; moving to the next collector".to_owned(),
                "drain",
            ),
            SessionEnd::Rebalance { to, .. } => (
                GoodbyeReason::Reconnect,
                format!("moving to the collector at {to}"),
                "rebalance",
            ),
            SessionEnd::Lost(why, _) => (GoodbyeReason::Reconnect, why.clone(), "lost"),
        };
        let fin = self.lanes.merged();
        let rc_fin = self.lanes.rc_final();
        let goodbye = lane::goodbye(&fin, rc_fin.and_then(|f| f.last_conn_seq), reason, &detail);
        let heartbeat = (!matches!(end, SessionEnd::Lost(..)))
            .then(|| self.lanes.heartbeat(self.last_heartbeat, &self.stats));
        LastWords {
            heartbeat,
            goodbye,
            fin,
            rc_fin,
            label,
        }
    }

    /// Ends the session after `end` on `conn`: the last frames and a `Goodbye` (a planned
    /// end), or the pipelines' leftovers accounted and a `Goodbye` on a best-effort basis
    /// (a lost session). Returns `end` and the merged final sequences.
    pub(in crate::run) async fn close(
        mut self,
        end: SessionEnd,
        conn: &mut ControlConn,
        queues: &Queues,
    ) -> (SessionEnd, FinalSequences) {
        let reason = match &end {
            // Lost: the metric samples not posted yet wait in the metrics buffer for the
            // next session; the rest is dropped (on RC after the last acknowledgements).
            SessionEnd::Lost(..) => DropReason::NotConnected,
            SessionEnd::Shutdown => {
                self.finish(conn, queues).await;
                // What is left was not sent: counted as `shutdown`, not settled, so the log
                // sources read those lines again after a restart.
                DropReason::Shutdown
            }
            // Moving on: the metric samples that could not be sent in time wait in the
            // metrics buffer for the next collector; the rest is dropped as when the
            // connection is lost.
            SessionEnd::Drain(_) | SessionEnd::Rebalance { .. } => {
                self.finish(conn, queues).await;
                DropReason::NotConnected
            }
        };
        for lane in self.lanes.iter_mut() {
            lane.end_epoch(reason, queues, &self.stats).await;
        }
        // What a fault injector still holds back (reorder, delay) goes out now or is
        // counted as its drop, before its figures go into the `goodbye sent` line.
        self.lanes.uc().plane.flush_link();
        let dropped = self
            .lanes
            .sync_session_faults(&self.stats)
            .map(|c| c.dropped);
        let words = self.last_words(&end);
        let logged = match &end {
            SessionEnd::Lost(_, on) => {
                let sent =
                    tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(words.goodbye)).await;
                // With the control connection up (a data-path loss) the collector takes the
                // Goodbye and settles the epoch by it: its figures, as after a planned end.
                *on == LostOn::DataPath && matches!(sent, Ok(Ok(())))
            }
            _ => {
                let heartbeat = words.heartbeat;
                let _ = tokio::time::timeout(CONTROL_SEND_TIMEOUT, async {
                    if let Some(hb) = heartbeat {
                        let _ = conn.send(hb).await;
                    }
                    let _ = conn.send(words.goodbye).await;
                    conn.shutdown().await;
                })
                .await;
                true
            }
        };
        if logged {
            let (fin, rc_fin) = (&words.fin, words.rc_fin.as_ref());
            lane::log_goodbye(
                self.epoch,
                self.collector,
                words.label,
                fin,
                rc_fin,
                dropped,
            );
        }
        (end, words.fin)
    }

    /// The last frames of a planned end: first what the sources queued (log lines waiting
    /// for credit included, as long as reports keep coming), then every stream's
    /// LAST_OF_EPOCH frame, all within [`FINISH_GRACE`]. Out of time, the epoch is closed
    /// with what could be sent; the rest is counted when the lanes end their epoch.
    async fn finish(&mut self, conn: &mut ControlConn, queues: &Queues) {
        let until = Instant::now() + FINISH_GRACE;
        let mut finished = false;
        loop {
            for lane in self.lanes.iter_mut() {
                lane.reap();
            }
            // After the reap, which on a busy-poll soft device moved the collector's credit
            // writes into memory: credit granted by a word counts here as in the session.
            self.read_credit_word();
            if !finished {
                for lane in self.lanes.iter_mut() {
                    pump::pull(&mut lane.core, queues, &self.stats);
                }
                if queues.metrics_buffer.is_empty()
                    && queues.metrics.is_empty()
                    && queues.logs.is_empty()
                {
                    for lane in self.lanes.iter_mut() {
                        lane.core.finish(pump::unix_ns());
                    }
                    finished = true;
                }
            }
            let stop = self.transmit(queues);
            let done = finished && self.lanes.ready_frames() == 0;
            if done || Instant::now() >= until || stop == Stop::Failed {
                break;
            }
            // Out of credit with frames left: ask for it, as the session does; the
            // collector answers at once (a Report, or a credit write). Without the ask
            // credit came only at the next report interval, where credit writes make
            // Reports rare (every `credit_writes_report_every_intervals`).
            if let Some(hb) = self.credit_ask() {
                let sent = tokio::time::timeout(CONTROL_SEND_TIMEOUT, conn.send(hb)).await;
                if !matches!(sent, Ok(Ok(()))) {
                    break;
                }
            }
            let wait = self.finish_wait(stop, finished, Instant::now(), until);
            tokio::select! {
                () = tokio::time::sleep_until(wait.into()) => {}
                msg = conn.recv() => match msg {
                    Ok(m) => if let Some(Body::Report(r)) = m.body {
                        for lane in self.lanes.iter_mut() {
                            lane.on_report(&r);
                        }
                    },
                    Err(_) => break,
                }
            }
        }
        if !finished {
            for lane in self.lanes.iter_mut() {
                lane.core.finish(pump::unix_ns());
                let _ = lane.transmit(queues, &self.stats);
            }
        }
    }

    /// The heartbeat that asks for credit when a lane ran out of it with frames to send
    /// (at most once per grant, as in the session; `None` otherwise).
    pub(super) fn credit_ask(&mut self) -> Option<Heartbeat> {
        self.credit_asked()
            .then(|| self.lanes.heartbeat(self.last_heartbeat, &self.stats))
    }

    /// Until when the last frames wait after a transmit that stopped at `stop` at `now`:
    /// for pacing until it allows, for credit until a Report comes or, with credit
    /// writes, [`CREDIT_WORD_POLL`] (the word is read again then: nothing wakes the loop
    /// when one lands); never past `until`.
    pub(super) fn finish_wait(
        &self,
        stop: Stop,
        finished: bool,
        now: Instant,
        until: Instant,
    ) -> Instant {
        let wait = match stop {
            Stop::Wait(Some(at)) => at.min(until),
            Stop::Wait(None) if !finished => until,
            _ => now + BUSY_RETRY,
        };
        if self.credit.is_some() {
            wait.min(now + CREDIT_WORD_POLL)
        } else {
            wait
        }
    }

    /// Frames out on every lane, no records taken; the most urgent of their stops.
    fn transmit(&mut self, queues: &Queues) -> Stop {
        let mut stop: Option<Stop> = None;
        for lane in self.lanes.iter_mut() {
            let s = lane.transmit(queues, &self.stats);
            stop = Some(stop.map_or(s, |a| lane::merge_stops(a, Some(s))));
        }
        stop.unwrap_or(Stop::Wait(None))
    }
}
