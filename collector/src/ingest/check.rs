//! Step 1 of a frame, *check* (module documentation of `ingest`, steps 1 and 2): the slot
//! check of a Write-with-immediate completion, then the frame checks every frame passes
//! before its sequences are trusted. A frame that fails one is dropped before tracking,
//! counted under its reason ([`ConnectionIngest::drop_before_tracking`]).

use std::time::Instant;

use uctel_protocol::frame::{peek_conn_seq, Frame, FrameError, FrameHeader};
use uctel_protocol::stream::StreamName;

use super::{is_after, ConnectionIngest, FrameOutcome, PathKind};
use crate::outputs::Delivery;
use crate::telemetry::DropReason;

impl<D: Delivery> ConnectionIngest<D> {
    /// A Write-with-immediate completion announced connection sequence `conn_seq`; `slot`
    /// holds the bytes copied from slot `conn_seq mod slots`.
    ///
    /// The slot's header must carry `conn_seq` (DESIGN.md §4): a later sequence means the
    /// agent lapped the ring (`ring_overrun`), anything else is `imm_mismatch`, no header at
    /// all `malformed_frame`; such a slot is never accepted as data.
    pub fn on_slot(&mut self, conn_seq: u64, slot: &[u8], now: Instant) -> FrameOutcome {
        match peek_conn_seq(slot) {
            None => self.drop(
                DropReason::MalformedFrame,
                &format_args!("slot for conn_seq {conn_seq} holds no frame header"),
            ),
            Some(h) if h == conn_seq => self.on_frame(slot, PathKind::Ring, now),
            Some(h) if is_after(h, conn_seq) => self.drop(
                DropReason::RingOverrun,
                &format_args!("slot for conn_seq {conn_seq} already holds conn_seq {h}"),
            ),
            Some(h) => self.drop(
                DropReason::ImmMismatch,
                &format_args!("immediate announced conn_seq {conn_seq}, slot holds {h}"),
            ),
        }
    }

    /// The frame checks, in order: header view (`malformed_frame`), CRC32C (`torn_slot` on
    /// the ring, `crc_mismatch` on Send), size against `max_frame_bytes` (`limit_exceeded`),
    /// epoch (`epoch_mismatch`) and, on a connection with an RC lane, the lane of the
    /// frame's stream (`wrong_lane`, DESIGN.md §8b).
    ///
    /// Returns the checked frame (a view into `bytes`) and its header.
    ///
    /// # Errors
    /// The outcome of a frame that failed a check: `Dropped` under its reason, already
    /// counted as dropped before tracking.
    pub(super) fn check<'a>(
        &mut self,
        bytes: &'a [u8],
        path: PathKind,
    ) -> Result<(Frame<&'a [u8]>, FrameHeader), FrameOutcome> {
        let frame = match Frame::new_checked(bytes) {
            Ok(f) => f,
            Err(e) => return Err(self.drop(DropReason::MalformedFrame, &e)),
        };
        if let Err(e) = frame.check_crc() {
            let reason = match path {
                PathKind::Ring => DropReason::TornSlot,
                PathKind::Send => DropReason::CrcMismatch,
            };
            return Err(self.drop(reason, &e));
        }
        if frame.frame_len() > self.limits.max_frame_bytes {
            let e = FrameError::TooLarge {
                frame_len: frame.frame_len(),
                max_frame_bytes: self.limits.max_frame_bytes,
            };
            return Err(self.drop(DropReason::LimitExceeded, &e));
        }
        let header = frame.header();
        if header.epoch != self.epoch {
            let detail = format!(
                "frame epoch {:#x}, connection epoch {:#x}",
                header.epoch, self.epoch
            );
            return Err(self.drop(DropReason::EpochMismatch, &detail));
        }
        if let Some((rc_streams, only)) = &self.lane_streams {
            if rc_streams.contains(&header.stream_id) != *only {
                let detail = format_args!(
                    "stream {} travels on the connection's other lane",
                    StreamName(header.stream_id)
                );
                return Err(self.drop(DropReason::WrongLane, &detail));
            }
        }
        Ok((frame, header))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;

    #[test]
    fn ring_overrun_and_imm_mismatch_never_accepted() {
        let mut r = rig();
        let _ = r.ingest.on_slot(0, &slot(&frame(0, 1, 0, 1)), now());
        // Announced conn_seq 1 but the slot was already overwritten by 1 + slots.
        let out = r
            .ingest
            .on_slot(1, &slot(&frame(1025, 1, 1025, 1026)), now());
        assert_eq!(out, FrameOutcome::Dropped(DropReason::RingOverrun));
        // Announced 2 but the slot still holds an older frame.
        let out = r.ingest.on_slot(2, &slot(&frame(0, 1, 0, 1)), now());
        assert_eq!(out, FrameOutcome::Dropped(DropReason::ImmMismatch));
        let t = r.ingest.telemetry();
        assert_eq!(t.frames_dropped(DropReason::RingOverrun), 1);
        assert_eq!(t.frames_dropped(DropReason::ImmMismatch), 1);
        assert_eq!(r.ingest.ledger()[0].1.accepted, 1);
    }

    #[test]
    fn torn_slots_and_corruption_are_counted() {
        let mut r = rig();
        let mut f = frame(0, 1, 0, 1);
        let last = f.len() - 1;
        f[last] ^= 0x40;
        assert_eq!(
            r.ingest.on_slot(0, &slot(&f), now()),
            FrameOutcome::Dropped(DropReason::TornSlot)
        );
        assert_eq!(
            r.ingest.on_send(&f, now()),
            FrameOutcome::Dropped(DropReason::CrcMismatch)
        );
        assert_eq!(
            r.ingest.on_send(b"garbage that is not a frame", now()),
            FrameOutcome::Dropped(DropReason::MalformedFrame)
        );
        assert_eq!(
            r.ingest.on_slot(5, &[0u8; 4096], now()),
            FrameOutcome::Dropped(DropReason::MalformedFrame)
        );
        let t = r.ingest.telemetry();
        assert_eq!(t.frames_dropped(DropReason::TornSlot), 1);
        assert_eq!(t.frames_dropped(DropReason::CrcMismatch), 1);
        assert_eq!(t.frames_dropped(DropReason::MalformedFrame), 2);
    }

    #[test]
    fn wrong_epoch_dropped() {
        let mut r = rig();
        let header = FrameHeader {
            epoch: EPOCH + 1,
            ..FrameHeader::new(FrameKind::Heartbeat, 1)
        };
        let f = build_frame(&header, &[]).unwrap();
        assert_eq!(
            r.ingest.on_send(&f, now()),
            FrameOutcome::Dropped(DropReason::EpochMismatch)
        );
    }

    /// `check` hands back the frame and its header when every check passes, and drops a
    /// frame of a stream that travels on the other lane (`wrong_lane`) before tracking.
    #[test]
    fn check_passes_a_good_frame_and_drops_one_of_the_other_lane() {
        let mut r = rig();
        let f = frame(3, 1, 2, 5);
        let (checked, header) = r.ingest.check(&f, PathKind::Send).unwrap();
        assert_eq!(
            (header.conn_seq, header.stream_id, header.stream_seq),
            (3, 1, 2)
        );
        assert_eq!(checked.header(), header);
        // This ingest takes only stream 7 (an RC lane's).
        r.ingest.set_lane_streams(vec![7], true);
        let out = r.ingest.check(&f, PathKind::Send).err();
        assert_eq!(out, Some(FrameOutcome::Dropped(DropReason::WrongLane)));
        let t = r.ingest.telemetry();
        assert_eq!(t.frames_dropped(DropReason::WrongLane), 1);
        // Dropped before tracking: the connection tracker never saw it.
        let s = r.ingest.summary();
        assert_eq!((s.conn_received, s.dropped_before_tracking), (0, 1));
        // The UC lane's ingest (all streams but 7) takes it.
        r.ingest.set_lane_streams(vec![7], false);
        assert!(r.ingest.check(&f, PathKind::Send).is_ok());
    }

    /// A frame over `max_frame_bytes` is `limit_exceeded`, before tracking.
    #[test]
    fn check_drops_a_frame_over_the_size_limit() {
        let mut r = rig();
        r.ingest.limits.max_frame_bytes = 64;
        let out = r.ingest.check(&frame(0, 1, 0, 1), PathKind::Ring).err();
        assert_eq!(out, Some(FrameOutcome::Dropped(DropReason::LimitExceeded)));
        assert_eq!(r.ingest.summary().dropped_before_tracking, 1);
    }
}
