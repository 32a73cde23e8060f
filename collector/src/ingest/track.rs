//! Step 2 of a frame, *track* (module documentation of `ingest`, step 3): the connection
//! tracker (connection sequence), then the stream tracker (stream sequence) of the frame's
//! stream, created at its first frame. Duplicates and stale frames stop here, counted apart
//! (in no drop and in no loss).

use std::time::Instant;

use uctel_protocol::frame::FrameHeader;
use uctel_protocol::stream::StreamName;
use uctel_protocol::tracker::{Observation, SequenceTracker};

use super::stream::StreamState;
use super::{is_after, ConnectionIngest, FrameOutcome, MAX_STREAMS_PER_CONNECTION};
use crate::outputs::Delivery;
use crate::telemetry::DropReason;

impl<D: Delivery> ConnectionIngest<D> {
    /// Tracks a checked frame: connection sequence, then stream sequence; afterwards the
    /// frame's stream has its state and the frame is to be delivered.
    ///
    /// # Errors
    /// The frame's outcome when it goes no further: `Stale` (either sequence settled
    /// already), `Duplicate` (stream sequence seen), or `Dropped(LimitExceeded)` for a new
    /// stream beyond [`MAX_STREAMS_PER_CONNECTION`] (counted before tracking).
    pub(super) fn track(&mut self, header: &FrameHeader, now: Instant) -> Result<(), FrameOutcome> {
        self.track_connection(header, now)?;
        self.open_stream(header.stream_id)?;
        self.track_stream(header, now)
    }

    /// The connection sequence. Connection sequences start at 0 each epoch: a first frame at
    /// c > 0 leaves 0..c missing (they may still arrive out of order). Moves the credit
    /// point (`consumed`) to the highest sequence processed.
    ///
    /// # Errors
    /// `Stale`: the frame's connection sequence is settled already (received or lost),
    /// counted in `frames_stale_total` of its stream.
    fn track_connection(&mut self, header: &FrameHeader, now: Instant) -> Result<(), FrameOutcome> {
        let conn_obs = self
            .conn
            .observe_from_at(self.epoch, 0, header.conn_seq, now);
        match conn_obs {
            Observation::First if self.epoch_changed() => self.tel.connection_resets_epoch.inc(),
            Observation::Resync { .. } => self.tel.connection_resets_dropout.inc(),
            _ => {}
        }
        if let Observation::Stale { .. } = conn_obs {
            // Its connection sequence is settled already (received or lost): counted apart,
            // in no drop and in no loss.
            match self.streams.get(&header.stream_id) {
                Some(stream) => stream.tel.frames_stale.inc(),
                None => self.tel.stream(header.stream_id).frames_stale.inc(),
            }
            return Err(FrameOutcome::Stale);
        }
        if self.consumed.is_none_or(|c| is_after(header.conn_seq, c)) {
            self.consumed = Some(header.conn_seq);
        }
        // The connection's loss is brought up to date only where the transport's drops are
        // folded first (`handle_timeout`, `report`, the end of the session): see
        // `update_conn_lost`.
        Ok(())
    }

    /// Creates the state of stream `stream_id` at its first frame on this connection.
    ///
    /// # Errors
    /// `Dropped(LimitExceeded)`, counted, for a stream beyond
    /// [`MAX_STREAMS_PER_CONNECTION`] (or an invalid tracker configuration).
    fn open_stream(&mut self, stream_id: u32) -> Result<(), FrameOutcome> {
        if self.streams.contains_key(&stream_id) {
            return Ok(());
        }
        if self.streams.len() >= MAX_STREAMS_PER_CONNECTION {
            return Err(self.drop(
                DropReason::LimitExceeded,
                &format_args!(
                    "stream {} beyond {MAX_STREAMS_PER_CONNECTION} streams per connection",
                    StreamName(stream_id)
                ),
            ));
        }
        let Ok(tracker) = SequenceTracker::new(self.tracker_config) else {
            return Err(self.drop(DropReason::LimitExceeded, &"invalid tracker configuration"));
        };
        self.streams.insert(
            stream_id,
            StreamState::new(tracker, self.tel.stream(stream_id)),
        );
        Ok(())
    }

    /// The stream sequence. Streams start at stream sequence 0 in every epoch: a first frame
    /// at s > 0 leaves 0..s missing, lost once they leave the window (or the session ends).
    /// Counts late frames and resets (epoch change, resync).
    ///
    /// # Errors
    /// `Duplicate` or `Stale`, each counted in its stream's counter.
    fn track_stream(&mut self, header: &FrameHeader, now: Instant) -> Result<(), FrameOutcome> {
        let epoch_changed = self.epoch_changed();
        let Some(stream) = self.streams.get_mut(&header.stream_id) else {
            // `open_stream` created it.
            return Err(FrameOutcome::Dropped(DropReason::LimitExceeded));
        };
        let obs = stream
            .tracker
            .observe_from_at(self.epoch, 0, header.stream_seq, now);
        if obs.reset_reason().is_some() {
            // The old segment is settled as a whole.
            stream.settle_records(true);
        }
        match obs {
            Observation::First => {
                if epoch_changed {
                    stream.tel.resets_epoch.inc();
                }
            }
            Observation::InOrder | Observation::Gap { .. } => {}
            Observation::Late => stream.tel.frames_late.inc(),
            Observation::Duplicate => {
                stream.tel.frames_duplicate.inc();
                return Err(FrameOutcome::Duplicate);
            }
            Observation::Stale { reason } => {
                stream.tel.frames_stale.inc();
                tracing::debug!(
                    agent = %self.agent,
                    stream = %StreamName(header.stream_id),
                    stream_seq = header.stream_seq,
                    ?reason,
                    "stale frame discarded (its sequence is settled already)"
                );
                return Err(FrameOutcome::Stale);
            }
            Observation::Resync { .. } => stream.tel.resets_resync.inc(),
            Observation::EpochReset { .. } => stream.tel.resets_epoch.inc(),
        }
        stream.max_record_count = stream.max_record_count.max(header.record_count);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;

    #[test]
    fn gaps_late_duplicates_and_tail_add_up() {
        let mut r = rig();
        // Sent stream seqs 0..=9 on conn seqs 0..=9; 2, 5 lost; 7 arrives late; 3 twice;
        // 8 and 9 lost at the tail.
        for s in [0u64, 1, 3, 3, 4, 6, 7] {
            let _ = r.ingest.on_send(&frame(s, 1, s, s + 1), now());
        }
        let _ = r.ingest.on_send(&frame(2, 1, 2, 3), now()); // late
        let summary = r.ingest.close(&Goodbye {
            final_conn_seq: Some(9),
            streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(9),
                final_record_count: 10,
            }],
            ..Default::default()
        });
        let l = summary.streams[0].1;
        assert_eq!(l.accepted, 7);
        assert_eq!(l.duplicate, 1);
        assert_eq!(l.late, 1);
        assert_eq!(l.lost, 3); // 5, 8, 9
        assert_eq!(10, l.accepted + l.lost + l.dropped_after_tracking);
        assert_eq!(l.records_received, 7);
        assert_eq!(l.records_lost, 3);
        assert_eq!(summary.conn_received + summary.conn_lost, 10);
    }

    /// The reorder finding: frames reordered inside the window, none lost. The exported
    /// loss counters stay 0 at every step (they used to count each reordered frame lost and
    /// keep it), and the sum holds after Goodbye.
    #[test]
    fn reordered_frames_are_never_counted_lost() {
        let mut r = rig();
        let order = [0u64, 2, 1, 3, 5, 4, 6, 9, 7, 8];
        for (i, s) in order.iter().enumerate() {
            let c = i as u64;
            let out = r.ingest.on_send(&frame(c, 1, *s, s + 1), now());
            assert!(matches!(out, FrameOutcome::Accepted { .. }), "{out:?}");
            assert_eq!(
                exported(&r, "uctel_collector_frames_lost_total", "metrics"),
                0
            );
            assert_eq!(
                exported(&r, "uctel_collector_records_lost_total", "metrics"),
                0
            );
            let _ = r.ingest.report();
            assert_eq!(
                exported(&r, "uctel_collector_frames_lost_total", "metrics"),
                0,
                "after report"
            );
        }
        assert_eq!(
            exported(&r, "uctel_collector_frames_late_total", "metrics"),
            4
        );
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(9),
            streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(9),
                final_record_count: 10,
            }],
            ..Default::default()
        });
        let l = s.streams[0].1;
        assert_eq!((l.accepted, l.lost, l.late, l.records_lost), (10, 0, 4, 0));
        assert_eq!((s.conn_received, s.conn_lost), (10, 0));
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            0
        );
        assert_eq!(
            exported(&r, "uctel_collector_frames_received_total", "metrics"),
            10
        );
    }

    /// A skipped frame is counted lost once it leaves the reorder window, and a copy that
    /// arrives after that is stale: in `frames_stale_total`, not in any drop or loss.
    #[test]
    fn loss_is_counted_when_the_window_passes_and_stale_frames_are_apart() {
        let mut r = rig(); // reorder window 64 (the default)
        let _ = r.ingest.on_send(&frame(0, 1, 0, 1), now());
        // Stream and connection sequence 1 never arrive (yet).
        for s in 2..=64u64 {
            let _ = r.ingest.on_send(&frame(s, 1, s, s + 1), now());
        }
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            0
        );
        assert_eq!(exported(&r, "uctel_collector_frames_missing", "metrics"), 1);
        let _ = r.ingest.on_send(&frame(65, 1, 65, 66), now());
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            1
        );
        assert_eq!(exported(&r, "uctel_collector_frames_missing", "metrics"), 0);
        // Its records are known at once from the next frame, 2: its cumulative count less
        // its own record (2 is received, not settled yet).
        assert_eq!(
            exported(&r, "uctel_collector_records_lost_total", "metrics"),
            1
        );
        let _ = r.ingest.on_send(&frame(66, 1, 66, 67), now());
        assert_eq!(
            exported(&r, "uctel_collector_records_lost_total", "metrics"),
            1
        );
        // Now it arrives: stale, counted apart, not delivered.
        let out = r.ingest.on_send(&frame(1, 1, 1, 2), now());
        assert_eq!(out, FrameOutcome::Stale);
        assert_eq!(
            exported(&r, "uctel_collector_frames_stale_total", "metrics"),
            1
        );
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            1
        );
        let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
        assert!(!text.contains("stale_frame"), "stale frames are not drops");
    }

    /// The finding of the fault matrix: a stream's first frame arriving after its second was
    /// counted lost at once and then discarded as stale. Now it is missing, then late.
    #[test]
    fn a_reordered_first_frame_is_late_not_lost() {
        let mut r = rig();
        let out = r.ingest.on_send(&frame(1, 1, 1, 2), now());
        assert!(matches!(out, FrameOutcome::Accepted { .. }), "{out:?}");
        assert_eq!(exported(&r, "uctel_collector_frames_missing", "metrics"), 1);
        let out = r.ingest.on_send(&frame(0, 1, 0, 1), now());
        assert!(matches!(out, FrameOutcome::Accepted { .. }), "{out:?}");
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(1),
            streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(1),
                final_record_count: 2,
            }],
            ..Default::default()
        });
        let l = s.streams[0].1;
        assert_eq!((l.accepted, l.lost, l.late, l.records_lost), (2, 0, 1, 0));
        assert_eq!((s.conn_received, s.conn_lost), (2, 0));
        assert_eq!(
            exported(&r, "uctel_collector_frames_stale_total", "metrics"),
            0
        );
        assert_eq!(
            exported(&r, "uctel_collector_frames_lost_total", "metrics"),
            0
        );
    }

    #[test]
    fn a_new_epoch_of_a_known_agent_counts_one_reset_per_stream_and_connection() {
        let resets = |r: &Rig| {
            let text = String::from_utf8(r.telemetry.render().unwrap()).unwrap();
            let get = |series: &str| {
                text.lines()
                    .find(|l| l.starts_with(series))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            (
                get("uctel_collector_stream_resets_total{agent=\"a1\",reason=\"epoch_change\",stream=\"metrics\"}"),
                get("uctel_collector_stream_resets_total{agent=\"a1\",reason=\"epoch_change\",stream=\"logs\"}"),
                get("uctel_collector_connection_resets_total{agent=\"a1\",reason=\"epoch_change\"}"),
                get("uctel_collector_frames_lost_total{agent=\"a1\",stream=\"metrics\"}"),
            )
        };
        // Seen before in another epoch: one reset per stream at its first frame, one for the
        // connection, none for later frames, and no loss.
        let mut r = rig();
        r.ingest.set_previous_epoch(Some(EPOCH ^ 1));
        for c in 0..6u64 {
            let _ = r
                .ingest
                .on_send(&frame(c, 1 + (c % 2) as u32, c / 2, c / 2 + 1), now());
        }
        assert_eq!(resets(&r), (1, 1, 1, 0));
        // A first connection, or the same epoch again: no reset.
        for previous in [None, Some(EPOCH)] {
            let mut r = rig();
            r.ingest.set_previous_epoch(previous);
            for c in 0..4u64 {
                let _ = r
                    .ingest
                    .on_send(&frame(c, 1 + (c % 2) as u32, c / 2, c / 2 + 1), now());
            }
            assert_eq!(resets(&r), (0, 0, 0, 0), "{previous:?}");
        }
    }

    #[test]
    fn leading_loss_and_unseen_streams_count() {
        let mut r = rig();
        let _ = r.ingest.on_send(&frame(4, 1, 4, 5), now());
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(4),
            streams: vec![
                StreamFinal {
                    stream_id: 1,
                    final_stream_seq: Some(4),
                    final_record_count: 5,
                },
                StreamFinal {
                    stream_id: 2,
                    final_stream_seq: Some(1),
                    final_record_count: 2,
                },
            ],
            ..Default::default()
        });
        let by_id: HashMap<u32, StreamLedger> = s.streams.into_iter().collect();
        assert_eq!(by_id[&1].lost, 4);
        assert_eq!(by_id[&1].accepted, 1);
        assert_eq!(by_id[&2].lost, 2);
        assert_eq!(by_id[&2].records_lost, 2);
    }

    /// One frame a second: the frame after a gap arrives, and no frame after that. The
    /// missing frame (connection and stream) is lost once the later frame is a second old,
    /// at the worker's sweep (`handle_timeout`), with its record; not after 100 frames. When
    /// it still arrives it is stale, counted once.
    #[test]
    fn a_gap_on_a_slow_stream_is_lost_after_the_reorder_time() {
        let mut r = rig();
        let t0 = now();
        let sec = Duration::from_secs(1);
        assert!(matches!(
            r.ingest.on_send(&frame(0, 1, 0, 1), t0),
            FrameOutcome::Accepted { .. }
        ));
        let _ = r.ingest.on_send(&frame(2, 1, 2, 3), t0 + sec);
        assert_eq!(r.ingest.poll_timeout(), Some(t0 + 2 * sec));
        r.ingest.handle_timeout(t0 + sec + sec / 2);
        let t = r.telemetry.agent("a1").stream(1);
        assert_eq!((t.frames_lost.get(), t.records_lost.get()), (0, 0));
        assert_eq!(t.frames_missing.get(), 1);
        r.ingest.handle_timeout(t0 + 2 * sec);
        assert_eq!((t.frames_lost.get(), t.records_lost.get()), (1, 1));
        assert_eq!(t.frames_missing.get(), 0);
        assert_eq!(r.ingest.poll_timeout(), None);
        assert_eq!(r.ingest.report().conn_lost, 1);
        let conn = r.telemetry.agent("a1").connection_frames_lost;
        assert_eq!(conn.get(), 1);
        // It arrives after all: stale, neither received nor taken back.
        assert_eq!(
            r.ingest.on_send(&frame(1, 1, 1, 2), t0 + 3 * sec),
            FrameOutcome::Stale
        );
        assert_eq!((t.frames_lost.get(), t.records_lost.get()), (1, 1));
        assert_eq!(t.frames_received.get(), 2);
        let s = r.ingest.close(&Goodbye {
            final_conn_seq: Some(2),
            streams: vec![StreamFinal {
                stream_id: 1,
                final_stream_seq: Some(2),
                final_record_count: 3,
            }],
            ..Default::default()
        });
        let l = s.streams[0].1;
        assert_eq!(
            (l.accepted, l.lost, l.records_received, l.records_lost),
            (2, 1, 2, 1)
        );
        assert_eq!((s.conn_received, s.conn_lost), (2, 1));
        assert_eq!(
            (t.frames_lost.get(), t.records_lost.get(), conn.get()),
            (1, 1, 1)
        );
    }

    /// `track` opens the stream's state at its first frame and lets it through, moving the
    /// credit point; a stream sequence seen already is a duplicate, stopped and counted in
    /// its stream.
    #[test]
    fn track_opens_the_stream_and_stops_duplicates() {
        let mut r = rig();
        let t = now();
        let header = |conn_seq, stream_seq| FrameHeader {
            conn_seq,
            stream_seq,
            record_count: 9,
            epoch: EPOCH,
            ..FrameHeader::new(FrameKind::Metrics, 4)
        };
        assert_eq!(r.ingest.track(&header(0, 0), t), Ok(()));
        let stream = &r.ingest.streams[&4];
        assert_eq!((stream.accepted, stream.max_record_count), (0, 9));
        assert_eq!(r.ingest.consumed(), Some(0));
        assert_eq!(
            r.ingest.track(&header(1, 0), t),
            Err(FrameOutcome::Duplicate)
        );
        let tel = r.telemetry.agent("a1").stream(4);
        assert_eq!(tel.frames_duplicate.get(), 1);
        assert_eq!(r.ingest.track(&header(2, 1), t), Ok(()));
        assert_eq!(r.ingest.consumed(), Some(2));
    }

    /// A stream beyond [`MAX_STREAMS_PER_CONNECTION`] is dropped `limit_exceeded` before
    /// tracking, and gets no state.
    #[test]
    fn track_drops_a_stream_beyond_the_limit() {
        let mut r = rig();
        let t = now();
        for id in 0..MAX_STREAMS_PER_CONNECTION as u32 {
            assert_eq!(r.ingest.open_stream(id), Ok(()));
        }
        let extra = MAX_STREAMS_PER_CONNECTION as u32;
        let header = FrameHeader {
            epoch: EPOCH,
            ..FrameHeader::new(FrameKind::Heartbeat, extra)
        };
        assert_eq!(
            r.ingest.track(&header, t),
            Err(FrameOutcome::Dropped(DropReason::LimitExceeded))
        );
        assert!(!r.ingest.streams.contains_key(&extra));
        assert_eq!(r.ingest.summary().dropped_before_tracking, 1);
    }
}
