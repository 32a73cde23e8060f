//! The RC lane of an agent connection (DESIGN.md §8b).
//!
//! An agent that put some streams on `reliability: rc` asks for a second lane in its
//! `Hello`: an RC QP beside the UC one. The lane has its own connection sequence, ring,
//! ingest (connection tracker, stream trackers of its streams) and consumed point, so an RC
//! frame held back by a retransmit timeout is never judged against the UC lane's sequence.
//! Its credit is its own window (its ring): the RC QP retransmits what a socket drops, so the
//! lane takes no share of the collector-wide budget.
//!
//! The agent's `Heartbeat` and `Goodbye` name both lanes in one message
//! (`rc_sent_conn_seq`, `rc_final_conn_seq`, the streams of both); [`RcLane::split_heartbeat`]
//! and [`RcLane::split_goodbye`] hand each ingest its own part, and a `Report` carries the
//! lane's delivery in `rc_lane` with its streams beside the UC lane's.

use std::net::IpAddr;
use std::sync::Arc;

use uctel_protocol::control::{
    self as wire, DataPath, Goodbye, Heartbeat, LaneReport, Report, StreamFinal,
};
use uctel_transport::api::{QpEndpoint, RcAttr};

use super::handshake::advertised_endpoint;
use crate::dataplane::{Geometry, ResourceError, Session};
use crate::ingest::{CloseSummary, ConnectionIngest};
use crate::shared::Shared;
use crate::telemetry::AgentTelemetry;

/// One agent connection's RC lane, registered with the data plane.
#[derive(Debug)]
pub(super) struct RcLane {
    /// Its data-plane session id.
    pub(super) id: u32,
    /// Its RC QP and ring.
    pub(super) session: Arc<Session>,
    /// Header stream ids the agent put on the lane.
    streams: Vec<u32>,
}

impl RcLane {
    /// Creates the lane's RC QP (default [`RcAttr`]: the collector only responds) and ring
    /// with `geometry`, connects it to the agent's RC QP `remote`, and hands it with
    /// `ingest` (which counts its gaps in `rc_gap_frames_total`) to the worker.
    ///
    /// # Errors
    /// [`ResourceError`] naming the verb that failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        shared: &Shared,
        agent: &str,
        remote: &QpEndpoint,
        streams: &[u32],
        data_path: DataPath,
        geometry: Geometry,
        mut ingest: ConnectionIngest,
        tel: AgentTelemetry,
    ) -> Result<RcLane, ResourceError> {
        let id = shared.plane.next_session_id();
        let rc = shared.telemetry.rc_lane(agent);
        ingest.set_rc_lane(rc.gap_frames.clone());
        ingest.set_lane_streams(streams.to_vec(), true);
        let session = Session::create(
            id,
            agent,
            shared.plane.device(),
            data_path,
            geometry,
            tel,
            Some((RcAttr::default(), rc)),
        )?;
        session.connect(remote)?;
        let session = Arc::new(session);
        shared.plane.register(session.clone(), ingest);
        Ok(RcLane {
            id,
            session,
            streams: streams.to_vec(),
        })
    }

    /// The lane as `Welcome` announces it (`local_ip`: the address the agent reached us on).
    pub(super) fn welcome(&self, local_ip: IpAddr) -> wire::RcLane {
        let g = self.session.geometry;
        wire::RcLane {
            qp: Some(advertised_endpoint(self.session.local_endpoint(), local_ip)),
            ring_addr: self.session.ring.addr(),
            rkey: self.session.ring.rkey(),
            slots: g.slots,
            credit_window: g.credit_window,
        }
    }

    /// The agent's heartbeat as the UC lane's ingest sees it and as this lane's does
    /// ([`split_heartbeat`]).
    pub(super) fn split_heartbeat(&self, hb: Heartbeat) -> (Heartbeat, Heartbeat) {
        split_heartbeat(&self.streams, hb)
    }

    /// The agent's `Goodbye` as each lane's ingest sees it ([`split_goodbye`]).
    pub(super) fn split_goodbye(&self, g: Goodbye) -> (Goodbye, Goodbye) {
        split_goodbye(&self.streams, g)
    }

    /// Adds the lane's delivery (`rc`, its ingest's report) to the UC lane's `report`: its
    /// streams beside the UC lane's, its connection sequence in `rc_lane`.
    pub(super) fn merge_report(report: &mut Report, rc: Report) {
        report.streams.extend(rc.streams);
        report.streams.sort_by_key(|s| s.stream_id);
        report.rc_lane = Some(LaneReport {
            consumed_conn_seq: (rc.conn_received > 0).then_some(rc.consumed_conn_seq),
            conn_received: rc.conn_received,
            conn_lost: rc.conn_lost,
            conn_loss_fraction: rc.conn_loss_fraction,
        });
    }
}

/// `streams` split into those in `rc_streams` (the RC lane's) and the others (the UC lane's).
fn by_lane(rc_streams: &[u32], streams: &[StreamFinal]) -> (Vec<StreamFinal>, Vec<StreamFinal>) {
    streams
        .iter()
        .cloned()
        .partition(|s| rc_streams.contains(&s.stream_id))
}

/// A heartbeat naming both lanes, split into the UC lane's (its sequence, credit fields and
/// the streams not in `rc_streams`) and the RC lane's (`rc_sent_conn_seq` as its sent
/// sequence, the streams in `rc_streams`).
fn split_heartbeat(rc_streams: &[u32], hb: Heartbeat) -> (Heartbeat, Heartbeat) {
    let (rc, uc) = by_lane(rc_streams, &hb.sent_streams);
    let rc = Heartbeat {
        sequence: hb.sequence,
        timestamp_ns: hb.timestamp_ns,
        sent_conn_seq: hb.rc_sent_conn_seq,
        sent_streams: rc,
        ..Heartbeat::default()
    };
    let uc = Heartbeat {
        sent_streams: uc,
        rc_sent_conn_seq: None,
        ..hb
    };
    (uc, rc)
}

/// A `Goodbye` naming both lanes, split as [`split_heartbeat`] splits a heartbeat
/// (`rc_final_conn_seq` becomes the RC lane's final sequence).
fn split_goodbye(rc_streams: &[u32], g: Goodbye) -> (Goodbye, Goodbye) {
    let (rc, uc) = by_lane(rc_streams, &g.streams);
    let rc = Goodbye {
        final_conn_seq: g.rc_final_conn_seq,
        streams: rc,
        reason: g.reason,
        detail: String::new(),
        rc_final_conn_seq: None,
    };
    let uc = Goodbye {
        streams: uc,
        rc_final_conn_seq: None,
        ..g
    };
    (uc, rc)
}

/// Adds the lane's accounting `rc` to the UC lane's `summary` (streams of both lanes,
/// connection figures summed).
pub(super) fn merge_summary(summary: &mut CloseSummary, rc: CloseSummary) {
    summary.streams.extend(rc.streams);
    summary.streams.sort_by_key(|(id, _)| *id);
    summary.conn_received += rc.conn_received;
    summary.conn_lost += rc.conn_lost;
    summary.dropped_before_tracking += rc.dropped_before_tracking;
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::control::StreamReport;

    fn fin(stream_id: u32, seq: u64) -> StreamFinal {
        StreamFinal {
            stream_id,
            final_stream_seq: Some(seq),
            final_record_count: seq * 10,
        }
    }

    #[test]
    fn summaries_and_reports_merge_both_lanes() {
        let mut uc = Report {
            consumed_conn_seq: 40,
            conn_received: 41,
            streams: vec![StreamReport {
                stream_id: 1,
                received: 41,
                ..StreamReport::default()
            }],
            ..Report::default()
        };
        let rc = Report {
            consumed_conn_seq: 9,
            conn_received: 10,
            streams: vec![StreamReport {
                stream_id: 2,
                received: 10,
                ..StreamReport::default()
            }],
            ..Report::default()
        };
        RcLane::merge_report(&mut uc, rc);
        assert_eq!(uc.consumed_conn_seq, 40);
        let ids: Vec<u32> = uc.streams.iter().map(|s| s.stream_id).collect();
        assert_eq!(ids, [1, 2]);
        let lane = uc.rc_lane.expect("lane report");
        assert_eq!((lane.consumed_conn_seq, lane.conn_received), (Some(9), 10));
        // Nothing received yet on the lane: no consumed point.
        let mut uc = Report::default();
        RcLane::merge_report(&mut uc, Report::default());
        assert_eq!(uc.rc_lane.map(|l| l.consumed_conn_seq), Some(None));

        let mut a = CloseSummary {
            conn_received: 5,
            conn_lost: 1,
            ..CloseSummary::default()
        };
        merge_summary(
            &mut a,
            CloseSummary {
                conn_received: 7,
                dropped_before_tracking: 2,
                ..CloseSummary::default()
            },
        );
        assert_eq!(
            (a.conn_received, a.conn_lost, a.dropped_before_tracking),
            (12, 1, 2)
        );
    }

    #[test]
    fn heartbeats_and_goodbyes_split_by_stream() {
        let streams = [2u32];
        let hb = Heartbeat {
            rc_frames_without_credit: None,
            sequence: 7,
            timestamp_ns: 99,
            sent_conn_seq: Some(100),
            rc_sent_conn_seq: Some(30),
            sent_streams: vec![fin(1, 100), fin(2, 30), fin(3, 4)],
            credit_grant_applied: Some(3),
            frames_without_credit: Some(1),
            agent_counters: None,
        };
        let (uc, rc) = split_heartbeat(&streams, hb);
        assert_eq!(uc.sent_conn_seq, Some(100));
        assert_eq!(uc.credit_grant_applied, Some(3));
        assert_eq!(uc.rc_sent_conn_seq, None);
        let ids: Vec<u32> = uc.sent_streams.iter().map(|s| s.stream_id).collect();
        assert_eq!(ids, [1, 3]);
        assert_eq!(rc.sent_conn_seq, Some(30));
        assert_eq!(rc.sent_streams, [fin(2, 30)]);
        assert_eq!(rc.credit_grant_applied, None);

        let g = Goodbye {
            final_conn_seq: Some(100),
            rc_final_conn_seq: None,
            streams: vec![fin(1, 100), fin(2, 30)],
            reason: 1,
            detail: "bye".into(),
        };
        let (uc, rc) = split_goodbye(&streams, g);
        assert_eq!((uc.final_conn_seq, uc.detail.as_str()), (Some(100), "bye"));
        assert_eq!(uc.streams, [fin(1, 100)]);
        assert_eq!((rc.final_conn_seq, rc.reason), (None, 1));
        assert_eq!(rc.streams, [fin(2, 30)]);
    }
}
