//! Step 4 of a frame, *account* (module documentation of `ingest`, "Accounting per
//! stream"): the tracked frame's fate in its stream's ledger. A delivered frame is accepted
//! with its records (replayed ones included, so they are never lost); a frame whose payload
//! failed to decode counts as received by the tracker and dropped after tracking, under
//! `limit_exceeded` or `malformed_payload`. Either way the frame waits in the stream's
//! unsettled frames until its sequence is settled.

use uctel_protocol::frame::FrameHeader;
use uctel_protocol::payload::{PayloadError, RecordError};

use super::deliver::Delivered;
use super::{ConnectionIngest, FrameOutcome};
use crate::outputs::Delivery;
use crate::telemetry::DropReason;

/// The drop reason of a payload that failed to decode: a batch limit or a record's limit is
/// `limit_exceeded`, anything else `malformed_payload`.
pub(super) fn payload_drop_reason(e: &PayloadError) -> DropReason {
    match e {
        PayloadError::Batch(_)
        | PayloadError::Record {
            source: RecordError::Limit(_),
            ..
        } => DropReason::LimitExceeded,
        _ => DropReason::MalformedPayload,
    }
}

impl<D: Delivery> ConnectionIngest<D> {
    /// Accounts the tracked frame `header` with what delivering it gave, and returns its
    /// outcome: `Accepted` (records saturated at `u32::MAX`) or `Dropped` under the
    /// payload's reason (counted in `frames_dropped_total`).
    pub(super) fn account(
        &mut self,
        header: &FrameHeader,
        delivered: Result<Delivered, PayloadError>,
    ) -> FrameOutcome {
        let Some(stream) = self.streams.get_mut(&header.stream_id) else {
            // `track` created the stream's state; it is never removed.
            return FrameOutcome::Dropped(DropReason::LimitExceeded);
        };
        match delivered {
            Ok(Delivered { records, replayed }) => {
                stream.accepted += 1;
                stream.records_received = stream.records_received.saturating_add(records);
                stream.tel.frames_received.inc();
                stream.tel.records_received.inc_by(records);
                if replayed > 0 {
                    stream.records_replayed = stream.records_replayed.saturating_add(replayed);
                    stream.tel.records_replayed.inc_by(replayed);
                }
                // Replayed records are accounted for (not lost) with their frame.
                stream.track(
                    header.stream_seq,
                    header.record_count,
                    records.saturating_add(replayed),
                    true,
                );
                stream.sync();
                FrameOutcome::Accepted {
                    records: u32::try_from(records).unwrap_or(u32::MAX),
                }
            }
            Err(e) => {
                let reason = payload_drop_reason(&e);
                stream.dropped_after_tracking += 1;
                stream.track(header.stream_seq, header.record_count, 0, false);
                stream.sync();
                self.tel.drop_frames(reason, 1, &e);
                FrameOutcome::Dropped(reason)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;

    #[test]
    fn bad_payload_is_dropped_after_tracking_and_accounted() {
        let mut r = rig();
        let _ = r.ingest.on_send(&frame(0, 1, 0, 1), now());
        let header = FrameHeader {
            epoch: EPOCH,
            conn_seq: 1,
            stream_seq: 1,
            record_count: 2,
            ..FrameHeader::new(FrameKind::Metrics, 1)
        };
        let bad = build_frame(&header, &[0xff, 0xff, 0xff]).unwrap();
        assert_eq!(
            r.ingest.on_send(&bad, now()),
            FrameOutcome::Dropped(DropReason::MalformedPayload)
        );
        let _ = r.ingest.on_send(&frame(2, 1, 2, 3), now());
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
        assert_eq!((l.accepted, l.lost, l.dropped_after_tracking), (2, 0, 1));
        assert_eq!(l.records_lost, 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any delivery pattern (loss, duplicates, reordering within a window, a bad payload)
        /// settles to `sent == accepted + lost + dropped_after_tracking` per stream, and to
        /// the records sent, after `Goodbye`.
        #[test]
        fn accounting_identity_holds_for_any_delivery(
            sent in 1u64..300,
            fate in proptest::collection::vec(0u8..10, 300),
            swaps in proptest::collection::vec((0usize..300, 0usize..8), 0..40),
        ) {
            let mut r = rig();
            // Frames alternate between streams 1 and 2; conn_seq = index.
            let mut seqs = [0u64; 3];
            let mut frames = Vec::new();
            for c in 0..sent {
                let stream = 1 + (c % 2) as u32;
                let s = seqs[stream as usize];
                seqs[stream as usize] += 1;
                frames.push(frame(c, stream, s, s + 1));
            }
            // Fate: 0-1 lost, 2 duplicated, 3 corrupted (CRC), otherwise delivered once.
            let mut wire: Vec<Vec<u8>> = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                match fate[i] {
                    0 | 1 => {}
                    2 => {
                        wire.push(f.clone());
                        wire.push(f.clone());
                    }
                    3 => {
                        let mut bad = f.clone();
                        let last = bad.len() - 1;
                        bad[last] ^= 1;
                        wire.push(bad);
                    }
                    _ => wire.push(f.clone()),
                }
            }
            for (i, d) in swaps {
                let j = i.saturating_add(d);
                if i < wire.len() && j < wire.len() {
                    wire.swap(i, j);
                }
            }
            for w in &wire {
                let _ = r.ingest.on_send(w, now());
            }
            let streams: Vec<StreamFinal> = (1..=2u32)
                .filter(|s| seqs[*s as usize] > 0)
                .map(|s| StreamFinal {
                    stream_id: s,
                    final_stream_seq: Some(seqs[s as usize] - 1),
                    final_record_count: seqs[s as usize],
                })
                .collect();
            let summary = r.ingest.close(&Goodbye {
                final_conn_seq: Some(sent - 1),
                streams,
                ..Default::default()
            });
            for (id, l) in &summary.streams {
                let n = seqs[*id as usize];
                proptest::prop_assert_eq!(n, l.accepted + l.lost + l.dropped_after_tracking, "stream {} {:?}", id, l);
                proptest::prop_assert_eq!(n, l.records_received + l.records_lost, "records {} {:?}", id, l);
            }
            proptest::prop_assert_eq!(summary.conn_received + summary.conn_lost, sent);
        }
    }

    /// `account` books a delivered frame as accepted with its records and replays, and a
    /// failed one as dropped after tracking under the payload's reason.
    #[test]
    fn account_books_accepted_and_dropped_frames() {
        let mut r = rig();
        let t = now();
        let header = |stream_seq, record_count| FrameHeader {
            stream_seq,
            conn_seq: stream_seq,
            record_count,
            epoch: EPOCH,
            ..FrameHeader::new(FrameKind::Logs, 2)
        };
        assert_eq!(r.ingest.track(&header(0, 5), t), Ok(()));
        let delivered = Ok(Delivered {
            records: 3,
            replayed: 2,
        });
        assert_eq!(
            r.ingest.account(&header(0, 5), delivered),
            FrameOutcome::Accepted { records: 3 }
        );
        assert_eq!(r.ingest.track(&header(1, 6), t), Ok(()));
        let bad = Err(payload::PayloadError::HeartbeatPayload { len: 1 });
        assert_eq!(
            r.ingest.account(&header(1, 6), bad),
            FrameOutcome::Dropped(DropReason::MalformedPayload)
        );
        let l = r.ingest.ledger()[0].1;
        assert_eq!(
            (
                l.accepted,
                l.dropped_after_tracking,
                l.records_received,
                l.records_replayed
            ),
            (1, 1, 3, 2)
        );
        let tel = r.ingest.telemetry();
        assert_eq!(tel.frames_dropped(DropReason::MalformedPayload), 1);
    }

    #[test]
    fn payload_errors_map_to_their_drop_reasons() {
        use uctel_protocol::limits::{Limit, LimitError};
        let over = LimitError {
            limit: Limit::RecordsPerFrame,
            value: 9,
            bound: 1,
        };
        let batch = PayloadError::Batch(over);
        assert_eq!(payload_drop_reason(&batch), DropReason::LimitExceeded);
        let record = PayloadError::Record {
            index: 0,
            source: RecordError::Limit(over),
        };
        assert_eq!(payload_drop_reason(&record), DropReason::LimitExceeded);
        let heartbeat = PayloadError::HeartbeatPayload { len: 1 };
        assert_eq!(
            payload_drop_reason(&heartbeat),
            DropReason::MalformedPayload
        );
    }
}
