//! The per-stream state of a connection ([`StreamState`]): its sequence tracker, its ledger
//! and the frames tracked but not settled yet, whose records count once their sequence is
//! settled (module documentation of `ingest`, "Records are settled with their frame").

use std::collections::VecDeque;

use uctel_protocol::tracker::{SequenceTracker, TrackerCounts};

use super::{is_after, StreamLedger};
use crate::telemetry::StreamTelemetry;

/// A frame tracked but not yet settled: its records count once its sequence is settled.
#[derive(Clone, Copy, Debug)]
struct Unsettled {
    stream_seq: u64,
    /// Cumulative record count of the stream carried by the frame (its own records included).
    record_count: u64,
    /// Records accounted for by it: delivered or replayed (0 when its payload was dropped).
    records: u64,
    /// Its payload was decoded: `records` are all of its own records, so the stream's
    /// cumulative count before it is `record_count − records`.
    decoded: bool,
}

/// One stream of a connection: its tracker, exported handles and ledger.
#[derive(Debug)]
pub(super) struct StreamState {
    /// The stream-sequence tracker.
    pub(super) tracker: SequenceTracker,
    /// The stream's metric handles.
    pub(super) tel: StreamTelemetry,
    /// Frames claimed lost by the agent's last sequences for an epoch the tracker never
    /// observed (all of `0..=final`).
    pub(super) leading_lost: u64,
    /// Frames accepted and delivered.
    pub(super) accepted: u64,
    /// Frames tracked, then dropped (bad payload).
    pub(super) dropped_after_tracking: u64,
    /// Records delivered.
    pub(super) records_received: u64,
    /// Log records discarded as replays.
    pub(super) records_replayed: u64,
    /// Highest cumulative record count carried by any frame (bounds a `Goodbye`'s claim).
    pub(super) max_record_count: u64,
    /// Tracked frames not yet settled, in stream-sequence order.
    unsettled: VecDeque<Unsettled>,
    /// Highest cumulative record count of the settled frames (and of `Goodbye`/heartbeat).
    pub(super) settled_record_count: u64,
    /// Records delivered from settled frames.
    settled_records: u64,
    lost_emitted: u64,
    records_lost_emitted: u64,
}

impl StreamState {
    pub(super) fn new(tracker: SequenceTracker, tel: StreamTelemetry) -> StreamState {
        StreamState {
            tracker,
            tel,
            leading_lost: 0,
            accepted: 0,
            dropped_after_tracking: 0,
            records_received: 0,
            records_replayed: 0,
            max_record_count: 0,
            unsettled: VecDeque::new(),
            settled_record_count: 0,
            settled_records: 0,
            lost_emitted: 0,
            records_lost_emitted: 0,
        }
    }

    /// Frames lost: the tracker's settled loss (`counts`) and the leading loss.
    fn lost(&self, counts: &TrackerCounts) -> u64 {
        counts.lost.saturating_add(self.leading_lost)
    }

    fn records_lost(&self) -> u64 {
        self.settled_record_count
            .saturating_sub(self.settled_records)
    }

    pub(super) fn ledger(&self) -> StreamLedger {
        let c = self.tracker.counts();
        StreamLedger {
            accepted: self.accepted,
            lost: self.lost(&c),
            missing: c.missing,
            late: c.late,
            duplicate: c.duplicate,
            dropped_after_tracking: self.dropped_after_tracking,
            records_received: self.records_received,
            records_lost: self.records_lost(),
            records_replayed: self.records_replayed,
        }
    }

    /// Remember a tracked frame until its sequence is settled (`decoded`: its payload was
    /// decoded and `records` are all of its records).
    pub(super) fn track(
        &mut self,
        stream_seq: u64,
        record_count: u64,
        records: u64,
        decoded: bool,
    ) {
        let entry = Unsettled {
            stream_seq,
            record_count,
            records,
            decoded,
        };
        // Frames arrive nearly in order: find the place from the back.
        let mut at = self.unsettled.len();
        while at > 0
            && self
                .unsettled
                .get(at - 1)
                .is_some_and(|e| is_after(e.stream_seq, stream_seq))
        {
            at -= 1;
        }
        self.unsettled.insert(at, entry);
    }

    /// Move settled frames (all of them with `all`) into the settled record counts.
    ///
    /// When the first frame not settled yet directly follows the settled ones and was
    /// decoded, the records of every frame before it are known as well (its cumulative
    /// count less its own records), so the records of lost frames just before it count now,
    /// not once that frame leaves the reorder window: a gap settled by the reorder time on
    /// a slow stream shows in `records_lost_total` at once.
    pub(super) fn settle_records(&mut self, all: bool) {
        while let Some(front) = self.unsettled.front().copied() {
            if !all && !self.tracker.is_settled(front.stream_seq) {
                break;
            }
            self.unsettled.pop_front();
            self.settled_records = self.settled_records.saturating_add(front.records);
            self.settled_record_count = self.settled_record_count.max(front.record_count);
        }
        let next = self.unsettled.front().filter(|n| n.decoded);
        if let Some(n) = next.filter(|n| self.tracker.is_settled(n.stream_seq.wrapping_sub(1))) {
            let before = n.record_count.saturating_sub(n.records);
            self.settled_record_count = self.settled_record_count.max(before);
        }
    }

    /// Settle what the tracker settled and bring the exported counters up to the ledger:
    /// `frames_lost_total` and `records_lost_total` only grow, by what became certain.
    pub(super) fn sync(&mut self) {
        self.settle_records(self.tracker.is_closed());
        let counts = self.tracker.counts();
        let lost = self.lost(&counts);
        if lost > self.lost_emitted {
            self.tel.frames_lost.inc_by(lost - self.lost_emitted);
            self.lost_emitted = lost;
        }
        let records_lost = self.records_lost();
        if records_lost > self.records_lost_emitted {
            self.tel
                .records_lost
                .inc_by(records_lost - self.records_lost_emitted);
            self.records_lost_emitted = records_lost;
        }
        self.tel
            .frames_missing
            .set(i64::try_from(counts.missing).unwrap_or(i64::MAX));
    }
}
