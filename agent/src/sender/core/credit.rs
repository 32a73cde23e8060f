//! The credit side of [`SenderCore`] (DESIGN.md §4 "Credits"): the credits a collector
//! `Report` or credit word gives back, the room they leave for the streams that wait for
//! credit, and when the pipeline asks the collector for credit early (an early heartbeat
//! naming frames without credit, at most once per report): a frame found no credit, or
//! records wait in a source queue for it.

use uctel_protocol::control::{CreditGrant, Report};

use super::SenderCore;
use crate::credits::{GrantOutcome, ReportOutcome};
use crate::stream::Stream;

impl SenderCore {
    /// Whether the credits leave room for more frames, by the rule of the streams that wait
    /// for credit ([`SenderCore::wants_records`]): the frames already built (ready on any
    /// stream, plus open ones) and the reserve for the streams that drop would not use up
    /// the credits. The metric samples held while disconnected are taken only while this
    /// holds ([`crate::sender::pump::pull`]): they are a backlog to deliver, not fresh
    /// samples to drop for lack of credit.
    pub fn credit_room(&self) -> bool {
        let open = usize::from(self.metrics_framer.has_open_frame())
            + usize::from(self.logs_framer.has_open_frame())
            + usize::from(self.samples_framer.has_open_frame());
        let built = self.ready_frames() + open;
        // Leave a share of the window to the streams that drop, so a log burst does not
        // starve the metrics: 1/16 of the window, at least one frame, none in windows too
        // small to share (below 4 frames).
        let window = self.credits.granted_window();
        let reserve = if window < 4 {
            0
        } else {
            usize::try_from(window / 16).unwrap_or(usize::MAX).max(1)
        };
        let available = usize::try_from(self.credits.available()).unwrap_or(usize::MAX);
        available > built.saturating_add(reserve)
    }

    /// Whether the whole granted window is free again (every frame sent was reported
    /// consumed): the end of a catch-up, so the next collection finds the window a
    /// collection finds in the steady state.
    pub fn credits_recovered(&self) -> bool {
        self.credits.available() >= self.credits.granted_window()
    }

    /// Applies the collector's report that every frame up to connection sequence `consumed`
    /// was consumed (DESIGN.md §4 credits).
    pub fn on_consumed(&mut self, consumed: u64) -> ReportOutcome {
        self.credits.on_consumed(consumed)
    }

    /// Takes the RC lane's part of a collector `Report` (`Report.rc_lane`, DESIGN.md §8b)
    /// for the pipeline of that lane: its consumed sequence (`None` before the lane's first
    /// frame arrived; then nothing is applied). No credit grant applies to the RC lane: its
    /// credit is its window beyond its consumed sequence.
    pub fn on_lane_report(&mut self, consumed: Option<u64>) -> Option<ReportOutcome> {
        self.asked_for_credit = false;
        consumed.map(|c| self.on_consumed(c))
    }

    /// Takes the credits of a collector `Report` (DESIGN.md §4). A report sent before any
    /// frame reached the collector says `consumed_conn_seq: 0` meaning "nothing yet", which
    /// cannot be told apart from "frame 0 consumed": it is ignored (`None`), since taking it
    /// would count a lost frame 0 as consumed and shift the credit window by one. A non-zero
    /// consumed sequence with nothing received is taken: the collector gave back the credit
    /// of frames lost on the wire (sent a heartbeat interval ago and never seen).
    pub fn on_report(&mut self, report: &Report) -> Option<ReportOutcome> {
        if let Some(g) = report.credit_grant {
            self.on_grant(g);
        }
        self.asked_for_credit = false;
        (report.conn_received > 0 || report.consumed_conn_seq > 0)
            .then(|| self.on_consumed(report.consumed_conn_seq))
    }

    /// Applies a grant of the collector's credit budget (DESIGN.md §4). A grant that lowers
    /// the limit makes an early heartbeat due ([`SenderCore::take_credit_heartbeat`]): the
    /// collector counts the older limit as usable until it hears the grant was applied.
    pub fn on_grant(&mut self, grant: CreditGrant) -> GrantOutcome {
        let outcome = self.credits.on_grant(grant.sequence, grant.limit);
        if outcome == (GrantOutcome::Applied { lowered: true }) {
            self.credit_heartbeat = true;
        }
        outcome
    }

    /// The credit window now, for the status API (`crate::status`).
    pub fn credit_view(&self) -> crate::status::CreditView {
        crate::status::CreditView {
            window_frames: self.credits.window(),
            granted_window_frames: self.credits.granted_window(),
            outstanding_frames: self.credits.outstanding(),
            available_frames: self.credits.available(),
        }
    }

    /// Takes a credit word the collector wrote into the agent's memory (DESIGN.md §4,
    /// `uctel_protocol::control::CreditWord`): its grant as a `Report`'s, and its consumed
    /// point (`consumed_next`, one past the highest connection sequence consumed; 0: none
    /// yet). Both only apply forward, so an old, repeated or reordered word changes nothing.
    /// Returns whether the word changed anything; a change lets the pipeline ask for credit
    /// again as a report does.
    pub fn on_credit_word(&mut self, grant: CreditGrant, consumed_next: u64) -> bool {
        let granted = matches!(self.on_grant(grant), GrantOutcome::Applied { .. });
        let advanced = consumed_next.checked_sub(1).is_some_and(|c| {
            matches!(
                self.on_consumed(c),
                ReportOutcome::Advanced(1..) | ReportOutcome::Ahead
            )
        });
        if granted || advanced {
            self.asked_for_credit = false;
        }
        granted || advanced
    }

    /// Sequence of the credit grant applied last, for heartbeats.
    pub fn grant_applied(&self) -> Option<u64> {
        self.credits.grant_applied()
    }

    /// Frames that found no credit since the previous call (for a heartbeat); resets.
    pub fn take_frames_without_credit(&mut self) -> u64 {
        std::mem::take(&mut self.without_credit)
    }

    /// Whether an early heartbeat is due (credit ran out with frames to send, at most once
    /// per report; or a grant lowered the limit); resets.
    pub fn take_credit_heartbeat(&mut self) -> bool {
        std::mem::take(&mut self.credit_heartbeat)
    }

    pub(super) fn starved(&mut self, frames: u64) {
        self.without_credit = self.without_credit.saturating_add(frames);
        if !self.asked_for_credit {
            self.asked_for_credit = true;
            self.credit_heartbeat = true;
        }
    }

    /// Credits left.
    pub fn credits_available(&self) -> u64 {
        self.credits.available()
    }

    /// Whether `stream` waits for credit and the credits leave no room for another frame
    /// ([`SenderCore::credit_room`]): records queued for it stay in their source queue.
    pub fn waits_for_credit(&self, stream: Stream) -> bool {
        let st = &self.streams[stream.index()];
        st.carried && st.wait_for_credit && !self.credit_room()
    }

    /// Whether records wait in a source queue for a stream that
    /// [`SenderCore::waits_for_credit`] (`waiting`, as the last pull found it,
    /// [`crate::sender::pump::pull`]). While they do, the collector is asked for credit at
    /// once, as a frame that found none asks: an early heartbeat
    /// ([`SenderCore::take_credit_heartbeat`]), at most once per report or credit word,
    /// naming one frame without credit; and the session keeps reading its credit word
    /// ([`SenderCore::records_waiting`]). Without this a stream that waits never builds the
    /// frame that would find no credit (it takes no records while the credits are spoken
    /// for, and keeps a reserve for the streams that drop), so a backlog would move one
    /// window per report interval.
    pub fn set_records_waiting(&mut self, waiting: bool) {
        self.records_waiting = waiting;
        if waiting && !self.asked_for_credit {
            self.starved(1);
        }
    }

    /// Whether records wait for credit in a source queue, as the last pull found them
    /// ([`SenderCore::set_records_waiting`]).
    pub fn records_waiting(&self) -> bool {
        self.records_waiting
    }
}
