//! The second lane of a connection, over an RC QP (DESIGN.md §8b): what the agent asks for
//! in `Hello` ([`RcLaneRequest`]), where the lane writes ([`RcLane`], in `Welcome`) and its
//! delivery ([`LaneReport`], in `Report`).

use super::QpEndpoint;

/// Agent → collector, in [`Hello`](super::Hello): the second lane of a connection, over an RC QP
/// (DESIGN.md §8b). A lane has its own connection sequence, ring, credit window and consumed
/// point; a stream travels on exactly one lane.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RcLaneRequest {
    /// The agent's RC QP (same transport and address rules as [`Hello::qp`](super::Hello::qp)).
    #[prost(message, optional, tag = "1")]
    pub qp: Option<QpEndpoint>,
    /// Header stream ids of the streams this lane carries: at least one, distinct, at most
    /// [`MAX_LANE_STREAMS`](super::MAX_LANE_STREAMS). Every other stream travels on the UC QP.
    #[prost(uint32, repeated, tag = "2")]
    pub stream_ids: Vec<u32>,
}

/// Collector → agent, in [`Welcome`](super::Welcome): where the RC lane writes. Slot size, frame
/// size and data path are the connection's ([`Welcome`](super::Welcome)).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RcLane {
    /// The collector's RC QP.
    #[prost(message, optional, tag = "1")]
    pub qp: Option<QpEndpoint>,
    /// Virtual address of the lane's ring (RETH VA of slot 0).
    #[prost(uint64, tag = "2")]
    pub ring_addr: u64,
    /// rkey of the lane's ring MR (REMOTE_WRITE only).
    #[prost(uint32, tag = "3")]
    pub rkey: u32,
    /// Slots in the lane's ring, ≥ 1.
    #[prost(uint32, tag = "4")]
    pub slots: u32,
    /// Frames the lane may have outstanding beyond its consumed sequence, `1..=slots`. The
    /// RC lane takes no share of the collector-wide budget: a datagram the collector's socket
    /// drops is retransmitted, not lost, so its window is its ring.
    #[prost(uint32, tag = "5")]
    pub credit_window: u32,
}

/// Collector → agent, in [`Report`](super::Report): the RC lane's connection-sequence delivery.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct LaneReport {
    /// Highest connection sequence of the lane consumed from its ring; `None` before the
    /// first frame.
    #[prost(uint64, optional, tag = "1")]
    pub consumed_conn_seq: Option<u64>,
    /// Frames received on the lane (cumulative).
    #[prost(uint64, tag = "2")]
    pub conn_received: u64,
    /// Frames missing on the lane (cumulative): on RC only what a lane could not deliver
    /// before its QP ran out of retries.
    #[prost(uint64, tag = "3")]
    pub conn_lost: u64,
    /// RFC 3550 A.3 loss fraction of the lane in the last interval, `0.0..=1.0`.
    #[prost(double, tag = "4")]
    pub conn_loss_fraction: f64,
}
