//! The lanes of an agent connection: the UC lane, and the RC lane (DESIGN.md §8b) when the
//! agent asks for one, as one list ([`Lanes`], UC first) that the session iterates.
//!
//! An agent that put some streams on `reliability: rc` asks for a second lane in its
//! `Hello`: an RC QP beside the UC one. The lane has its own connection sequence, ring,
//! ingest (connection tracker, stream trackers of its streams) and consumed point, so an RC
//! frame held back by a retransmit timeout is never judged against the UC lane's sequence.
//! Its credit is its own window (its ring): the RC QP retransmits what a socket drops, so the
//! lane takes no share of the collector-wide budget.
//!
//! The agent's `Heartbeat` and `Goodbye` name both lanes in one message
//! (`rc_sent_conn_seq`, `rc_final_conn_seq`, the streams of both); `split_heartbeat`
//! and `split_goodbye` hand each ingest its own part, and a `Report` carries the
//! lane's delivery in `rc_lane` with its streams beside the UC lane's.
//!
//! [`Lanes`] does each of these for every lane in turn: the heartbeat and the `Goodbye`
//! split into each lane's part, one `Report` of all lanes, the lanes' final frames waited
//! for, each lane closed and its accounting summed, the first lane whose QP went to ERROR. (The model: quinn-proto's packet number spaces, one array indexed by
//! space and iterated, rather than optional fields.)

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use uctel_protocol::control::{
    self as wire, DataPath, Goodbye, GoodbyeReason, Heartbeat, LaneReport, Report, StreamFinal,
};
use uctel_transport::api::{QpEndpoint, RcAttr};

use super::handshake::advertised_endpoint;
use super::state::Ending;
use crate::dataplane::{DataPlane, Geometry, ResourceError, Session};
use crate::ingest::{CloseSummary, ConnectionIngest};
use crate::shared::Shared;
use crate::telemetry::AgentTelemetry;

/// One lane of an agent connection: a QP and its ring, registered with the data plane.
#[derive(Debug)]
pub(super) struct Lane {
    /// Its data-plane session id.
    pub(super) id: u32,
    /// Its QP and ring.
    pub(super) session: Arc<Session>,
    /// `None` for the UC lane (every stream not on an RC lane); the header stream ids the
    /// agent put on an RC lane.
    rc_streams: Option<Vec<u32>>,
}

impl Lane {
    /// The UC lane: `session`, registered with the data plane under `id`.
    pub(super) fn uc(id: u32, session: Arc<Session>) -> Lane {
        Lane {
            id,
            session,
            rc_streams: None,
        }
    }

    /// Creates an RC lane's QP (default [`RcAttr`]: the collector only responds) and ring
    /// with `geometry`, connects it to the agent's RC QP `remote`, and hands it with
    /// `ingest` (which counts its gaps in `rc_gap_frames_total`) to the worker.
    ///
    /// # Errors
    /// [`ResourceError`] naming the verb that failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_rc(
        shared: &Shared,
        agent: &str,
        remote: &QpEndpoint,
        streams: &[u32],
        data_path: DataPath,
        geometry: Geometry,
        mut ingest: ConnectionIngest,
        tel: AgentTelemetry,
    ) -> Result<Lane, ResourceError> {
        let id = shared.plane.next_session_id();
        let rc = shared.telemetry.rc_lane(agent);
        ingest.set_rc_lane(rc.gap_frames.clone());
        ingest.set_lane_streams(streams.to_vec(), true);
        let session = Session::create(
            id,
            agent,
            &shared.plane,
            data_path,
            geometry,
            tel,
            Some((RcAttr::default(), rc)),
        )?;
        session.connect(remote)?;
        let session = Arc::new(session);
        shared.plane.register(session.clone(), ingest);
        Ok(Lane {
            id,
            session,
            rc_streams: Some(streams.to_vec()),
        })
    }

    /// Whether this is an RC lane.
    pub(super) fn is_rc(&self) -> bool {
        self.rc_streams.is_some()
    }

    /// The RC lane as `Welcome` announces it (`local_ip`: the address the agent reached us
    /// on).
    fn welcome(&self, local_ip: IpAddr) -> wire::RcLane {
        let g = self.session.geometry;
        wire::RcLane {
            qp: Some(advertised_endpoint(self.session.local_endpoint(), local_ip)),
            ring_addr: self.session.ring.addr(),
            rkey: self.session.ring.rkey(),
            slots: g.slots,
            credit_window: g.credit_window,
        }
    }

    /// How the session ends when this lane's QP went to ERROR.
    pub(super) fn failed_ending(&self) -> Ending {
        if self.is_rc() {
            (
                GoodbyeReason::Error,
                "the RC lane's QP went to the ERROR state; reconnect",
            )
        } else {
            (
                GoodbyeReason::Error,
                "QP went to the ERROR state; reconnect",
            )
        }
    }
}

/// An agent connection's lanes: the UC lane first, then the RC lane when the agent asked
/// for one. Never empty.
#[derive(Debug)]
pub(super) struct Lanes {
    list: Vec<Lane>,
}

impl Lanes {
    /// The lanes of a connection whose UC lane is `uc`.
    pub(super) fn new(uc: Lane) -> Lanes {
        Lanes { list: vec![uc] }
    }

    /// Adds an RC lane.
    pub(super) fn push(&mut self, rc: Lane) {
        self.list.push(rc);
    }

    /// The UC lane (its id is the connection's in the credit budget and the report cadence).
    pub(super) fn uc(&self) -> &Lane {
        &self.list[0]
    }

    /// The RC lane, if any.
    pub(super) fn rc(&self) -> Option<&Lane> {
        self.list.iter().find(|l| l.is_rc())
    }

    /// The RC lane as `Welcome` announces it.
    pub(super) fn welcome_rc(&self, local_ip: IpAddr) -> Option<wire::RcLane> {
        self.rc().map(|l| l.welcome(local_ip))
    }

    /// The stream ids on RC lanes.
    fn rc_streams(&self) -> Vec<u32> {
        self.list
            .iter()
            .filter_map(|l| l.rc_streams.as_deref())
            .flatten()
            .copied()
            .collect()
    }

    /// The agent's heartbeat as each lane's ingest sees it, by lane id ([`split_heartbeat`]).
    pub(super) fn split_heartbeat(&self, hb: Heartbeat) -> Vec<(u32, Heartbeat)> {
        if self.list.len() == 1 {
            return vec![(self.uc().id, hb)];
        }
        let all_rc = self.rc_streams();
        self.list
            .iter()
            .map(|l| match &l.rc_streams {
                None => (l.id, split_heartbeat(&all_rc, hb.clone()).0),
                Some(mine) => (l.id, split_heartbeat(mine, hb.clone()).1),
            })
            .collect()
    }

    /// The agent's `Goodbye` (none: it left without one) as each lane's ingest sees it, by
    /// lane id ([`split_goodbye`]).
    pub(super) fn split_goodbye(&self, g: Option<&Goodbye>) -> Vec<(u32, Option<Goodbye>)> {
        let all_rc = self.rc_streams();
        self.list
            .iter()
            .map(|l| {
                let part = g.map(|g| match &l.rc_streams {
                    None if self.list.len() == 1 => g.clone(),
                    None => split_goodbye(&all_rc, g.clone()).0,
                    Some(mine) => split_goodbye(mine, g.clone()).1,
                });
                (l.id, part)
            })
            .collect()
    }

    /// One report of every lane: the UC lane's, with each RC lane's delivery merged in
    /// ([`merge_report`]). `None` when the UC lane is closing.
    pub(super) async fn report(&self, plane: &DataPlane) -> Option<Report> {
        let mut report = plane.report(self.uc().id).await?;
        for l in self.list.iter().skip(1) {
            if let Some(rc) = plane.report(l.id).await {
                merge_report(&mut report, rc);
            }
        }
        Some(report)
    }

    /// Waits (at most `within` per lane) until each lane consumed the last frame the
    /// agent's `goodbye` names for it; false when one did not arrive in time.
    pub(super) async fn wait_consumed(
        &self,
        plane: &DataPlane,
        goodbye: &Goodbye,
        within: Duration,
    ) -> bool {
        let mut all = true;
        for (id, part) in self.split_goodbye(Some(goodbye)) {
            let last = part.and_then(|g| g.final_conn_seq);
            all &= plane.wait_consumed(id, last, within).await;
        }
        all
    }

    /// Closes every lane, each with its part of the agent's `goodbye`, and sums their
    /// accounting into the UC lane's ([`merge_summary`]). `None` when the UC lane was
    /// already closed.
    pub(super) async fn close(
        &self,
        plane: &DataPlane,
        goodbye: Option<&Goodbye>,
    ) -> Option<CloseSummary> {
        let mut parts = self.split_goodbye(goodbye).into_iter();
        let (uc, uc_goodbye) = parts.next()?;
        let summary = plane.close(uc, uc_goodbye).await;
        let mut rest = Vec::new();
        for (id, part) in parts {
            rest.extend(plane.close(id, part).await);
        }
        summary.map(|mut s| {
            for rc in rest {
                merge_summary(&mut s, rc);
            }
            s
        })
    }

    /// Resolves with the first lane whose QP went to ERROR.
    pub(super) async fn any_failed(&self) -> &Lane {
        let mut waits: Vec<_> = self
            .list
            .iter()
            .map(|l| Box::pin(l.session.failed_notify.notified()))
            .collect();
        let i = std::future::poll_fn(|cx| {
            for (i, w) in waits.iter_mut().enumerate() {
                if w.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(i);
                }
            }
            Poll::Pending
        })
        .await;
        &self.list[i]
    }
}

/// Adds an RC lane's delivery (`rc`, its ingest's report) to the UC lane's `report`: its
/// streams beside the UC lane's, its connection sequence in `rc_lane`.
fn merge_report(report: &mut Report, rc: Report) {
    report.streams.extend(rc.streams);
    report.streams.sort_by_key(|s| s.stream_id);
    report.rc_lane = Some(LaneReport {
        consumed_conn_seq: (rc.conn_received > 0).then_some(rc.consumed_conn_seq),
        conn_received: rc.conn_received,
        conn_lost: rc.conn_lost,
        conn_loss_fraction: rc.conn_loss_fraction,
    });
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
fn merge_summary(summary: &mut CloseSummary, rc: CloseSummary) {
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
        merge_report(&mut uc, rc);
        assert_eq!(uc.consumed_conn_seq, 40);
        let ids: Vec<u32> = uc.streams.iter().map(|s| s.stream_id).collect();
        assert_eq!(ids, [1, 2]);
        let lane = uc.rc_lane.expect("lane report");
        assert_eq!((lane.consumed_conn_seq, lane.conn_received), (Some(9), 10));
        // Nothing received yet on the lane: no consumed point.
        let mut uc = Report::default();
        merge_report(&mut uc, Report::default());
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
