//! Control-plane messages: handshake, heartbeats, loss reports and goodbye (DESIGN.md §6).
//! One file because it is one concept: the prost mirror of `control.proto`'s message set.
//!
//! Sans-IO: this module turns [`ControlMessage`]s into bytes and bytes back into messages; the
//! TCP connection belongs to the agent and the collector.
//!
//! * **Schema.** `protocol/proto/control.proto` is the published schema; the types below are
//!   its `prost` mirror, field for field and tag for tag.
//! * **Framing.** A 4-byte big-endian length of the protobuf bytes that follow (the prefix
//!   itself not counted), then one protobuf-encoded [`ControlMessage`]. A length above
//!   [`MAX_CONTROL_MESSAGE_BYTES`] (or the decoder's own limit) is an error as soon as the
//!   prefix arrives, before any body is buffered. [`encode_message`] writes a frame;
//!   [`ControlDecoder`] reads frames from a byte stream in any chunking.
//! * **Validation.** Both directions run [`ControlMessage::validate`]: fixed-size fields (GID,
//!   nonce, HMAC), 24-bit QPN/PSN, IBTA path MTUs, string lengths, ring geometry. The typed
//!   accessors ([`QpEndpoint::gid_array`], [`Challenge::nonce_array`]) still return `Option`
//!   rather than rely on that.
//! * **Authentication.** [`proof`] is HMAC-SHA256 (RFC 2104 with SHA-256, test vectors of
//!   RFC 4231) of the pre-shared token over a transcript that binds the collector's nonce, the
//!   agent id and the epoch; [`verify_proof`] compares in constant time. The token never goes
//!   on the wire.

use bytes::{Buf, BytesMut};
use hmac::{Hmac, Mac};
use prost::Message as _;
use sha2::{Digest, Sha256};
use thiserror::Error;

mod counters;
mod credit_word;
mod dict_ack;
mod lane;
mod probe;
use counters::check_agent_counters;
pub use counters::{
    AgentCounters, AgentDropReason, AgentStreamDropped, AgentStreamSent, MAX_AGENT_COUNTER_ENTRIES,
};
pub use credit_word::{CreditMr, CreditWord, CreditWrites, CREDIT_MR_BYTES, CREDIT_WORD_BYTES};
pub use dict_ack::{DictAck, FEATURE_SERIES_DICTIONARY, KNOWN_FEATURES};
pub use lane::{LaneReport, RcLane, RcLaneRequest};
pub use probe::{Probe, ProbeAnswer};

/// Control protocol version carried in [`Hello::protocol_version`].
pub const PROTOCOL_VERSION: u32 = 1;
/// Bytes of the length prefix in front of every control message.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Default and largest protobuf size of one control message (64 KiB), prefix excluded.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 64 * 1024;
/// Bytes of a [`Challenge::nonce`].
pub const NONCE_BYTES: usize = 32;
/// Bytes of a [`Proof::hmac`] (SHA-256 output).
pub const PROOF_BYTES: usize = 32;
/// Bytes of a GID (IBTA: 128-bit global identifier).
pub const GID_BYTES: usize = 16;
/// Largest `agent_id` / `collector_id`, bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 128;
/// Largest `hostname`, bytes of UTF-8 (RFC 1035 name limit plus slack).
pub const MAX_HOSTNAME_BYTES: usize = 255;
/// Largest human-readable `detail`, bytes of UTF-8.
pub const MAX_DETAIL_BYTES: usize = 1024;
/// Path MTUs a [`QpEndpoint::mtu`] may name (IBTA `enum ibv_mtu`: 256 to 4096 bytes).
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];
/// Largest QPN and PSN: both are 24-bit fields of the BTH (IBTA §9.2).
pub const MAX_24_BIT: u32 = (1 << 24) - 1;
/// Most streams one lane may name ([`RcLaneRequest::stream_ids`]).
pub const MAX_LANE_STREAMS: usize = 64;

/// Domain-separation label that opens the proof transcript.
const PROOF_LABEL: &[u8] = b"uctel-control-v1/proof";

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

/// Which transport a QP runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Transport {
    /// Not set; refused by validation.
    Unspecified = 0,
    /// User-space RoCEv2 UC over UDP.
    Soft = 1,
    /// Kernel/NIC RDMA through ibverbs.
    Verbs = 2,
}

impl Transport {
    /// The configuration spelling: `soft` or `verbs` (`unspecified` for 0).
    pub const fn as_str(self) -> &'static str {
        match self {
            Transport::Unspecified => "unspecified",
            Transport::Soft => "soft",
            Transport::Verbs => "verbs",
        }
    }
}

/// How frames reach the collector (DESIGN.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DataPath {
    /// Not set; refused by validation.
    Unspecified = 0,
    /// RDMA WRITE with immediate into ring slot `conn_seq mod slots`.
    WriteWithImm = 1,
    /// SEND into posted receive buffers.
    Send = 2,
}

/// One side of a UC QP: what the peer needs for RESET → INIT → RTR → RTS.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct QpEndpoint {
    /// RoCE v2 GID, [`GID_BYTES`] bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub gid: Vec<u8>,
    /// Queue pair number, 24 bits.
    #[prost(uint32, tag = "2")]
    pub qpn: u32,
    /// Initial PSN, 24 bits.
    #[prost(uint32, tag = "3")]
    pub psn: u32,
    /// Path MTU in bytes, one of [`PATH_MTUS`].
    #[prost(uint32, tag = "4")]
    pub mtu: u32,
    /// Soft transport: UDP socket address `ip:port` (`[v6]:port`); verbs: empty.
    #[prost(string, tag = "5")]
    pub udp_addr: String,
}

impl QpEndpoint {
    /// The GID as an array; `None` unless it is exactly [`GID_BYTES`] long.
    pub fn gid_array(&self) -> Option<[u8; GID_BYTES]> {
        self.gid.as_slice().try_into().ok()
    }

    /// The parsed UDP address; `None` when empty or not a socket address.
    pub fn udp_socket_addr(&self) -> Option<std::net::SocketAddr> {
        self.udp_addr.parse().ok()
    }
}

/// Agent → collector: first message on a connection.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Hello {
    /// Control protocol version ([`PROTOCOL_VERSION`]).
    #[prost(uint32, tag = "1")]
    pub protocol_version: u32,
    /// Agent identity, 1..=[`MAX_ID_BYTES`] bytes; selects the pre-shared token.
    #[prost(string, tag = "2")]
    pub agent_id: String,
    /// Host name, at most [`MAX_HOSTNAME_BYTES`] bytes.
    #[prost(string, tag = "3")]
    pub hostname: String,
    /// Random per agent start or reconnect; stamped on every frame.
    #[prost(uint64, tag = "4")]
    pub epoch: u64,
    /// [`Transport`] of the agent's QP.
    #[prost(enumeration = "Transport", tag = "5")]
    pub transport: i32,
    /// [`DataPath`]s the agent can drive, at least one.
    #[prost(enumeration = "DataPath", repeated, tag = "6")]
    pub capabilities: Vec<i32>,
    /// The agent's UC QP.
    #[prost(message, optional, tag = "7")]
    pub qp: Option<QpEndpoint>,
    /// Frames per second the agent expects to send at most in a sustained way (all streams
    /// together), from its configuration; the collector sizes this agent's ring from it
    /// (rate × report interval, with a floor, DESIGN.md §4). `None`: the collector's largest
    /// ring.
    #[prost(uint32, optional, tag = "8")]
    pub expected_frames_per_second: Option<u32>,
    /// The agent's RC lane (DESIGN.md §8b), when some of its streams asked for
    /// `reliability: rc`; `None`: every stream travels on the UC QP.
    #[prost(message, optional, tag = "9")]
    pub rc_lane: Option<RcLaneRequest>,
    /// The agent's credit word region ([`CreditMr`], DESIGN.md §4): the collector may grant
    /// credit by RDMA WRITE into it. `None`: an agent that takes credits from `Report`s only.
    #[prost(message, optional, tag = "10")]
    pub credit_mr: Option<CreditMr>,
    /// Optional features the agent can use, one bit each ([`FEATURE_SERIES_DICTIONARY`]);
    /// unknown bits are ignored.
    #[prost(uint32, tag = "11")]
    pub features: u32,
}

/// Collector → agent: prove you hold the token.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Challenge {
    /// [`NONCE_BYTES`] random bytes, fresh per connection ([`random_nonce`]).
    #[prost(bytes = "vec", tag = "1")]
    pub nonce: Vec<u8>,
    /// Collector identity, at most [`MAX_ID_BYTES`] bytes.
    #[prost(string, tag = "2")]
    pub collector_id: String,
}

impl Challenge {
    /// The nonce as an array; `None` unless it is exactly [`NONCE_BYTES`] long.
    pub fn nonce_array(&self) -> Option<[u8; NONCE_BYTES]> {
        self.nonce.as_slice().try_into().ok()
    }
}

/// Agent → collector: the answer to a [`Challenge`].
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Proof {
    /// [`proof`] output, [`PROOF_BYTES`] bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub hmac: Vec<u8>,
}

/// Collector → agent: accepted; where and how to write frames.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Welcome {
    /// The collector's UC QP.
    #[prost(message, optional, tag = "1")]
    pub qp: Option<QpEndpoint>,
    /// Virtual address of the ring (RETH VA of slot 0).
    #[prost(uint64, tag = "2")]
    pub ring_addr: u64,
    /// rkey of the ring's MR (REMOTE_WRITE only).
    #[prost(uint32, tag = "3")]
    pub rkey: u32,
    /// Slots in the ring, ≥ 1.
    #[prost(uint32, tag = "4")]
    pub slots: u32,
    /// Bytes per slot, ≥ `max_frame_bytes`.
    #[prost(uint32, tag = "5")]
    pub slot_bytes: u32,
    /// Largest frame, header included, ≥ the 64-byte frame header.
    #[prost(uint32, tag = "6")]
    pub max_frame_bytes: u32,
    /// Frames the agent may have outstanding beyond the consumed sequence, `1..=slots`.
    #[prost(uint32, tag = "7")]
    pub credit_window: u32,
    /// Heartbeat period, milliseconds, ≥ 1.
    #[prost(uint32, tag = "8")]
    pub heartbeat_interval_ms: u32,
    /// Report period, milliseconds, ≥ 1.
    #[prost(uint32, tag = "9")]
    pub report_interval_ms: u32,
    /// The [`DataPath`] the collector chose among the agent's capabilities.
    #[prost(enumeration = "DataPath", tag = "10")]
    pub data_path: i32,
    /// The first credit grant of a collector with a collector-wide credit budget
    /// ([`CreditGrant`]): frames with connection sequence below `limit`
    /// may be sent. `None`: credits are `credit_window` beyond the consumed sequence only.
    #[prost(message, optional, tag = "11")]
    pub credit_grant: Option<CreditGrant>,
    /// The RC lane, when the agent asked for one ([`Hello::rc_lane`]).
    #[prost(message, optional, tag = "12")]
    pub rc_lane: Option<RcLane>,
    /// The collector writes credit words into the agent's [`Hello::credit_mr`]
    /// ([`CreditWrites`]); `None`: credits travel in `Report`s only.
    #[prost(message, optional, tag = "13")]
    pub credit_writes: Option<CreditWrites>,
    /// The features of [`Hello::features`] the collector takes on this connection (a
    /// subset of the agent's bits it knows); 0 from a collector that predates the field.
    #[prost(uint32, tag = "14")]
    pub features: u32,
}

/// Collector → agent, in `Welcome` and `Report`s: how far the agent may send (DESIGN.md §4,
/// collector-wide credit budget). The agent sends a frame with connection sequence `c` only
/// while `c < limit` (and within `credit_window` beyond the consumed sequence). A later grant
/// replaces an earlier one, and may lower the limit (a window given back); the agent
/// acknowledges the grant it applies in its next [`Heartbeat`] (`credit_grant_applied`), so
/// the collector knows which limits it may still use.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct CreditGrant {
    /// Grant counter of this connection, +1 each time the limit changes.
    #[prost(uint64, tag = "1")]
    pub sequence: u64,
    /// First connection sequence the agent may not send yet.
    #[prost(uint64, tag = "2")]
    pub limit: u64,
}

/// Why the collector refused an agent. A closed set: it labels the refusal counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RefuseReason {
    /// Not set (or a value from a newer version).
    Unspecified = 0,
    /// No token is configured for this agent id.
    UnknownAgent = 1,
    /// The proof did not verify.
    BadProof = 2,
    /// `protocol_version` not supported.
    VersionMismatch = 3,
    /// Transport or data paths not supported.
    TransportMismatch = 4,
    /// The collector is at its agent or resource limit.
    Busy = 5,
    /// A message arrived out of order or did not validate.
    ProtocolError = 6,
    /// The handshake did not finish in time.
    HandshakeTimeout = 7,
    /// Another agent with the same agent id is connected and alive: this one is kept out
    /// (instead of the two replacing each other for ever). The agent should log it once
    /// and retry at its longest backoff.
    DuplicateAgentId = 8,
    /// The collector is draining (leaving its pool for an upgrade or a restart): it takes
    /// no new agents. The agent tries the next collector of its pool at once.
    Draining = 9,
}

impl RefuseReason {
    /// Every reason, in label order.
    pub const ALL: [RefuseReason; 10] = [
        RefuseReason::Unspecified,
        RefuseReason::UnknownAgent,
        RefuseReason::BadProof,
        RefuseReason::VersionMismatch,
        RefuseReason::TransportMismatch,
        RefuseReason::Busy,
        RefuseReason::ProtocolError,
        RefuseReason::HandshakeTimeout,
        RefuseReason::DuplicateAgentId,
        RefuseReason::Draining,
    ];

    /// The Prometheus label value, e.g. `bad_proof`.
    pub const fn label(self) -> &'static str {
        match self {
            RefuseReason::Unspecified => "unspecified",
            RefuseReason::UnknownAgent => "unknown_agent",
            RefuseReason::BadProof => "bad_proof",
            RefuseReason::VersionMismatch => "version_mismatch",
            RefuseReason::TransportMismatch => "transport_mismatch",
            RefuseReason::Busy => "busy",
            RefuseReason::ProtocolError => "protocol_error",
            RefuseReason::HandshakeTimeout => "handshake_timeout",
            RefuseReason::DuplicateAgentId => "duplicate_agent_id",
            RefuseReason::Draining => "draining",
        }
    }
}

/// Collector → agent: refused; the collector closes the connection after sending it.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Refuse {
    /// [`RefuseReason`]; unknown values read as `Unspecified` through `reason()`.
    #[prost(enumeration = "RefuseReason", tag = "1")]
    pub reason: i32,
    /// Human-readable detail, at most [`MAX_DETAIL_BYTES`] bytes.
    #[prost(string, tag = "2")]
    pub detail: String,
}

/// Either direction, every `heartbeat_interval_ms`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Heartbeat {
    /// Sender's heartbeat counter, +1 each.
    #[prost(uint64, tag = "1")]
    pub sequence: u64,
    /// Sender's wall clock, nanoseconds since the Unix epoch.
    #[prost(uint64, tag = "2")]
    pub timestamp_ns: u64,
    /// Agent → collector: the last connection sequence sent on the data path before this
    /// heartbeat; `None` when nothing was sent yet (and always from the collector). If the
    /// session ends without a `Goodbye`, frames up to here are known to have been sent, so
    /// the unknown tail is bounded by one heartbeat interval (DESIGN.md §6).
    #[prost(uint64, optional, tag = "3")]
    pub sent_conn_seq: Option<u64>,
    /// Agent → collector: per stream, the last stream sequence and cumulative record count
    /// sent before this heartbeat (the fields of a `Goodbye`'s `StreamFinal`).
    #[prost(message, repeated, tag = "4")]
    pub sent_streams: Vec<StreamFinal>,
    /// Agent → collector: the sequence of the last [`CreditGrant`] the agent applied; it no
    /// longer sends under any earlier grant. `None` from a collector, or an agent without
    /// grants.
    #[prost(uint64, optional, tag = "5")]
    pub credit_grant_applied: Option<u64>,
    /// Agent → collector: frames that found no credit since the previous heartbeat (waiting
    /// or dropped as `no_credit`) — the agent wants a larger window. An agent sends a
    /// heartbeat early when it runs out of credit with frames to send, or applies a grant
    /// that lowered its limit.
    #[prost(uint64, optional, tag = "6")]
    pub frames_without_credit: Option<u64>,
    /// Agent → collector: the last connection sequence sent on the RC lane before this
    /// heartbeat (as `sent_conn_seq` for the UC QP); `sent_streams` lists the streams of
    /// both lanes.
    #[prost(uint64, optional, tag = "7")]
    pub rc_sent_conn_seq: Option<u64>,
    /// Agent → collector: as `frames_without_credit`, for the RC lane's window (the
    /// collector answers with an early report, as for the UC lane; the RC lane has no share
    /// of the credit budget, so this never counts as budget want).
    #[prost(uint64, optional, tag = "8")]
    pub rc_frames_without_credit: Option<u64>,
    /// Agent → collector: the agent's own send and drop counters ([`AgentCounters`]),
    /// cumulative since the agent process started. They travel here, on the control
    /// connection, and not only in the agent's self-metrics on the `metrics` stream, so a
    /// drop can never hide the count of itself: a `no_credit` drop starves the data path,
    /// never the control connection. `None` from a collector or an older agent.
    #[prost(message, optional, tag = "9")]
    pub agent_counters: Option<AgentCounters>,
}

/// Delivery of one stream as the collector saw it (cumulative since the connection began).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamReport {
    /// Stream id of the frame header.
    #[prost(uint32, tag = "1")]
    pub stream_id: u32,
    /// Frames received (distinct, late included).
    #[prost(uint64, tag = "2")]
    pub received: u64,
    /// Frames lost (not arrived late).
    #[prost(uint64, tag = "3")]
    pub lost: u64,
    /// Frames that arrived after being counted lost.
    #[prost(uint64, tag = "4")]
    pub late: u64,
    /// Duplicate frames.
    #[prost(uint64, tag = "5")]
    pub duplicate: u64,
    /// RFC 3550 A.3 loss fraction of the last report interval, `0.0..=1.0`.
    #[prost(double, tag = "6")]
    pub loss_fraction: f64,
}

/// Collector → agent, every `report_interval_ms`: delivery and credits.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Report {
    /// Highest connection sequence consumed from the ring; the agent may have
    /// `credit_window` frames beyond it in flight (DESIGN.md §4).
    #[prost(uint64, tag = "1")]
    pub consumed_conn_seq: u64,
    /// Per-stream delivery.
    #[prost(message, repeated, tag = "2")]
    pub streams: Vec<StreamReport>,
    /// Connection-sequence frames received (cumulative).
    #[prost(uint64, tag = "3")]
    pub conn_received: u64,
    /// Connection-sequence frames lost (cumulative).
    #[prost(uint64, tag = "4")]
    pub conn_lost: u64,
    /// RFC 3550 A.3 loss fraction of the connection sequence in the last interval.
    #[prost(double, tag = "5")]
    pub conn_loss_fraction: f64,
    /// A new credit grant ([`CreditGrant`]), when the limit changed since the last one.
    #[prost(message, optional, tag = "6")]
    pub credit_grant: Option<CreditGrant>,
    /// The RC lane's delivery, on a connection with one; `streams` lists the streams of
    /// both lanes. Its credit is `credit_window` beyond its consumed sequence.
    #[prost(message, optional, tag = "7")]
    pub rc_lane: Option<LaneReport>,
}

/// The last state of one stream at goodbye.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StreamFinal {
    /// Stream id of the frame header.
    #[prost(uint32, tag = "1")]
    pub stream_id: u32,
    /// Last stream sequence sent in this epoch; `None` when the stream sent nothing.
    #[prost(uint64, optional, tag = "2")]
    pub final_stream_seq: Option<u64>,
    /// Cumulative record count carried by the stream's last frame.
    #[prost(uint64, tag = "3")]
    pub final_record_count: u64,
}

/// Why a side said goodbye.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum GoodbyeReason {
    /// Not set (or a value from a newer version).
    Unspecified = 0,
    /// Orderly shutdown.
    Shutdown = 1,
    /// Going away and coming back with a new epoch.
    Reconnect = 2,
    /// A local error forces the connection down.
    Error = 3,
    /// Collector → agent: the collector is draining. The agent ends the epoch as at
    /// shutdown (its last frames, then its own `Goodbye` with the final sequences, so the
    /// tail is exact) and connects to the next collector of its pool at once. The collector
    /// keeps the session until that `Goodbye` or its drain timeout.
    Drain = 4,
}

/// Either direction: the connection ends; from the agent it carries the final sequences so
/// the collector can account tail loss ([`crate::tracker::SequenceTracker::close`]).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Goodbye {
    /// Last connection sequence sent; `None` when no frame was sent.
    #[prost(uint64, optional, tag = "1")]
    pub final_conn_seq: Option<u64>,
    /// Final state per stream.
    #[prost(message, repeated, tag = "2")]
    pub streams: Vec<StreamFinal>,
    /// [`GoodbyeReason`].
    #[prost(enumeration = "GoodbyeReason", tag = "3")]
    pub reason: i32,
    /// Human-readable detail, at most [`MAX_DETAIL_BYTES`] bytes.
    #[prost(string, tag = "4")]
    pub detail: String,
    /// Agent → collector: last connection sequence sent on the RC lane; `None` when the
    /// lane sent nothing (or there is none). `streams` lists the streams of both lanes.
    #[prost(uint64, optional, tag = "5")]
    pub rc_final_conn_seq: Option<u64>,
}

/// The envelope: every control-channel frame carries exactly one of these.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ControlMessage {
    /// The message; `None` fails validation.
    #[prost(oneof = "Body", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16")]
    pub body: Option<Body>,
}

/// The `oneof body` of a [`ControlMessage`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Body {
    /// Agent → collector.
    #[prost(message, tag = "1")]
    Hello(Hello),
    /// Collector → agent.
    #[prost(message, tag = "2")]
    Challenge(Challenge),
    /// Agent → collector.
    #[prost(message, tag = "3")]
    Proof(Proof),
    /// Collector → agent.
    #[prost(message, tag = "4")]
    Welcome(Welcome),
    /// Collector → agent.
    #[prost(message, tag = "5")]
    Refuse(Refuse),
    /// Either direction.
    #[prost(message, tag = "6")]
    Heartbeat(Heartbeat),
    /// Collector → agent.
    #[prost(message, tag = "7")]
    Report(Report),
    /// Either direction.
    #[prost(message, tag = "8")]
    Goodbye(Goodbye),
    /// Agent → collector, alone on a probe connection.
    #[prost(message, tag = "9")]
    Probe(Probe),
    /// Collector → agent, the answer to a [`Probe`].
    #[prost(message, tag = "10")]
    ProbeAnswer(ProbeAnswer),
    /// Collector → agent, only after both announced [`FEATURE_SERIES_DICTIONARY`].
    #[prost(message, tag = "16")]
    DictAck(DictAck),
}

impl Body {
    /// The message name as in the schema, e.g. `"Hello"`.
    pub const fn name(&self) -> &'static str {
        match self {
            Body::Hello(_) => "Hello",
            Body::Challenge(_) => "Challenge",
            Body::Proof(_) => "Proof",
            Body::Welcome(_) => "Welcome",
            Body::Refuse(_) => "Refuse",
            Body::Heartbeat(_) => "Heartbeat",
            Body::Report(_) => "Report",
            Body::Goodbye(_) => "Goodbye",
            Body::Probe(_) => "Probe",
            Body::ProbeAnswer(_) => "ProbeAnswer",
            Body::DictAck(_) => "DictAck",
        }
    }
}

macro_rules! into_envelope {
    ($($ty:ident),*) => {$(
        impl From<$ty> for ControlMessage {
            fn from(m: $ty) -> Self {
                ControlMessage { body: Some(Body::$ty(m)) }
            }
        }
    )*};
}
into_envelope!(Hello, Challenge, Proof, Welcome, Refuse, Heartbeat, Report, Goodbye);
into_envelope!(Probe, ProbeAnswer, DictAck);

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// A message that breaks a rule of the schema (named by message and field).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {message}.{field}: {problem}")]
pub struct InvalidMessage {
    /// Message name, e.g. `Hello`.
    pub message: &'static str,
    /// Field name, e.g. `qp.psn`.
    pub field: &'static str,
    /// What is wrong, with the offending value.
    pub problem: String,
}

fn invalid(message: &'static str, field: &'static str, problem: String) -> InvalidMessage {
    InvalidMessage {
        message,
        field,
        problem,
    }
}

fn check_len(
    message: &'static str,
    field: &'static str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<(), InvalidMessage> {
    if value.len() < min || value.len() > max {
        return Err(invalid(
            message,
            field,
            format!("{} bytes, allowed {min}..={max}", value.len()),
        ));
    }
    Ok(())
}

fn check_exact(
    message: &'static str,
    field: &'static str,
    value: &[u8],
    len: usize,
) -> Result<(), InvalidMessage> {
    if value.len() != len {
        return Err(invalid(
            message,
            field,
            format!("{} bytes, expected {len}", value.len()),
        ));
    }
    Ok(())
}

fn check_fraction(
    message: &'static str,
    field: &'static str,
    value: f64,
) -> Result<(), InvalidMessage> {
    if !(0.0..=1.0).contains(&value) {
        return Err(invalid(
            message,
            field,
            format!("{value} outside 0.0..=1.0"),
        ));
    }
    Ok(())
}

fn check_data_path(
    message: &'static str,
    field: &'static str,
    value: i32,
) -> Result<(), InvalidMessage> {
    match DataPath::try_from(value) {
        Ok(DataPath::WriteWithImm | DataPath::Send) => Ok(()),
        _ => Err(invalid(
            message,
            field,
            format!("data path {value} is not write_with_imm (1) or send (2)"),
        )),
    }
}

/// Field names of a message's `qp` in validation errors.
const QP_FIELDS: [&str; 5] = ["qp.gid", "qp.qpn", "qp.psn", "qp.mtu", "qp.udp_addr"];
/// Field names of a message's `rc_lane.qp` in validation errors.
const RC_QP_FIELDS: [&str; 5] = [
    "rc_lane.qp.gid",
    "rc_lane.qp.qpn",
    "rc_lane.qp.psn",
    "rc_lane.qp.mtu",
    "rc_lane.qp.udp_addr",
];

impl QpEndpoint {
    /// Check GID length, 24-bit QPN and PSN, path MTU, and that `udp_addr` parses when set.
    ///
    /// # Errors
    /// [`InvalidMessage`] naming `message` and the field.
    pub fn validate(&self, message: &'static str) -> Result<(), InvalidMessage> {
        self.validate_fields(message, QP_FIELDS)
    }

    /// [`QpEndpoint::validate`] for an endpoint whose fields are named `fields` in errors
    /// (gid, qpn, psn, mtu, udp_addr).
    fn validate_fields(
        &self,
        message: &'static str,
        fields: [&'static str; 5],
    ) -> Result<(), InvalidMessage> {
        let [gid, qpn, psn, mtu, udp_addr] = fields;
        check_exact(message, gid, &self.gid, GID_BYTES)?;
        if self.qpn > MAX_24_BIT {
            return Err(invalid(
                message,
                qpn,
                format!("{:#x} exceeds 24 bits", self.qpn),
            ));
        }
        if self.psn > MAX_24_BIT {
            return Err(invalid(
                message,
                psn,
                format!("{:#x} exceeds 24 bits", self.psn),
            ));
        }
        if !PATH_MTUS.contains(&self.mtu) {
            return Err(invalid(
                message,
                mtu,
                format!("{} is not one of {PATH_MTUS:?}", self.mtu),
            ));
        }
        if !self.udp_addr.is_empty() && self.udp_socket_addr().is_none() {
            return Err(invalid(
                message,
                udp_addr,
                format!("{:?} is not ip:port", self.udp_addr),
            ));
        }
        Ok(())
    }
}

impl Hello {
    /// Check the rules of the schema; see [`ControlMessage::validate`].
    ///
    /// # Errors
    /// [`InvalidMessage`] naming the field.
    pub fn validate(&self) -> Result<(), InvalidMessage> {
        const M: &str = "Hello";
        if self.protocol_version == 0 {
            return Err(invalid(M, "protocol_version", "0 is not a version".into()));
        }
        check_len(M, "agent_id", &self.agent_id, 1, MAX_ID_BYTES)?;
        check_len(M, "hostname", &self.hostname, 0, MAX_HOSTNAME_BYTES)?;
        let transport = Transport::try_from(self.transport).unwrap_or(Transport::Unspecified);
        if transport == Transport::Unspecified {
            return Err(invalid(
                M,
                "transport",
                format!("{} is not soft (1) or verbs (2)", self.transport),
            ));
        }
        if self.capabilities.is_empty() {
            return Err(invalid(M, "capabilities", "no data path".into()));
        }
        for &c in &self.capabilities {
            check_data_path(M, "capabilities", c)?;
        }
        let Some(qp) = &self.qp else {
            return Err(invalid(M, "qp", "missing".into()));
        };
        check_agent_qp(qp, transport, QP_FIELDS)?;
        credit_word::check_mr(self.credit_mr.as_ref())?;
        let Some(lane) = &self.rc_lane else {
            return Ok(());
        };
        let Some(rc_qp) = &lane.qp else {
            return Err(invalid(M, "rc_lane.qp", "missing".into()));
        };
        check_agent_qp(rc_qp, transport, RC_QP_FIELDS)?;
        if lane.stream_ids.is_empty() || lane.stream_ids.len() > MAX_LANE_STREAMS {
            return Err(invalid(
                M,
                "rc_lane.stream_ids",
                format!(
                    "{} streams, allowed 1..={MAX_LANE_STREAMS}",
                    lane.stream_ids.len()
                ),
            ));
        }
        let mut ids = lane.stream_ids.clone();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(
                M,
                "rc_lane.stream_ids",
                format!("stream {} named twice", w[0]),
            ));
        }
        Ok(())
    }
}

/// An agent's QP endpoint in [`Hello`]: valid, with `udp_addr` set for the soft transport and
/// empty for verbs (`fields` name its fields in errors).
fn check_agent_qp(
    qp: &QpEndpoint,
    transport: Transport,
    fields: [&'static str; 5],
) -> Result<(), InvalidMessage> {
    const M: &str = "Hello";
    qp.validate_fields(M, fields)?;
    let udp_field = fields[4];
    match (transport, qp.udp_addr.is_empty()) {
        (Transport::Soft, true) => Err(invalid(
            M,
            udp_field,
            "the soft transport needs ip:port".into(),
        )),
        (Transport::Verbs, false) => Err(invalid(
            M,
            udp_field,
            "must be empty for the verbs transport".into(),
        )),
        _ => Ok(()),
    }
}

impl Welcome {
    /// Check the rules of the schema; see [`ControlMessage::validate`].
    ///
    /// # Errors
    /// [`InvalidMessage`] naming the field.
    pub fn validate(&self) -> Result<(), InvalidMessage> {
        const M: &str = "Welcome";
        let Some(qp) = &self.qp else {
            return Err(invalid(M, "qp", "missing".into()));
        };
        qp.validate(M)?;
        if self.slots == 0 {
            return Err(invalid(M, "slots", "0 slots".into()));
        }
        let header = crate::frame::HEADER_LEN as u64;
        if u64::from(self.max_frame_bytes) < header {
            return Err(invalid(
                M,
                "max_frame_bytes",
                format!(
                    "{} is below the {header}-byte frame header",
                    self.max_frame_bytes
                ),
            ));
        }
        if self.slot_bytes < self.max_frame_bytes {
            return Err(invalid(
                M,
                "slot_bytes",
                format!(
                    "{} is below max_frame_bytes {}",
                    self.slot_bytes, self.max_frame_bytes
                ),
            ));
        }
        if self.credit_window == 0 || self.credit_window > self.slots {
            return Err(invalid(
                M,
                "credit_window",
                format!("{} outside 1..={} (slots)", self.credit_window, self.slots),
            ));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(invalid(M, "heartbeat_interval_ms", "0 ms".into()));
        }
        if self.report_interval_ms == 0 {
            return Err(invalid(M, "report_interval_ms", "0 ms".into()));
        }
        check_data_path(M, "data_path", self.data_path)?;
        credit_word::check_writes(self.credit_writes.as_ref())?;
        let Some(lane) = &self.rc_lane else {
            return Ok(());
        };
        let Some(qp) = &lane.qp else {
            return Err(invalid(M, "rc_lane.qp", "missing".into()));
        };
        qp.validate_fields(M, RC_QP_FIELDS)?;
        if lane.slots == 0 {
            return Err(invalid(M, "rc_lane.slots", "0 slots".into()));
        }
        if lane.credit_window == 0 || lane.credit_window > lane.slots {
            return Err(invalid(
                M,
                "rc_lane.credit_window",
                format!("{} outside 1..={} (slots)", lane.credit_window, lane.slots),
            ));
        }
        Ok(())
    }
}

impl ControlMessage {
    /// The body's message name, `"(empty)"` without a body.
    pub fn name(&self) -> &'static str {
        self.body.as_ref().map_or("(empty)", Body::name)
    }

    /// Check every rule of the schema that protobuf cannot express:
    ///
    /// * a body is present;
    /// * `Hello`: version ≠ 0, `agent_id` 1..=128 bytes, `hostname` ≤ 255 bytes, a known
    ///   transport, ≥ 1 known data path, a valid `qp` whose `udp_addr` is set for `soft` and
    ///   empty for `verbs`; an `rc_lane` has such a `qp` too and 1..=64 distinct stream ids;
    /// * `QpEndpoint`: 16-byte GID, 24-bit QPN and PSN, MTU in [`PATH_MTUS`], `udp_addr`
    ///   empty or `ip:port`;
    /// * `Challenge`: 32-byte nonce, `collector_id` ≤ 128 bytes; `Proof`: 32-byte HMAC;
    /// * `Welcome`: valid `qp`, `slots ≥ 1`, `max_frame_bytes ≥ 64` (frame header),
    ///   `slot_bytes ≥ max_frame_bytes`, `credit_window` in `1..=slots`, intervals ≥ 1 ms, a
    ///   known data path; an `rc_lane` has a valid `qp`, `slots ≥ 1` and its window in
    ///   `1..=slots`;
    /// * `Refuse`/`Goodbye`: `detail` ≤ 1024 bytes (unknown reasons are accepted for forward
    ///   compatibility and read as `Unspecified`);
    /// * `Report`: loss fractions in `0.0..=1.0` (the RC lane's included);
    /// * `Heartbeat`: at most [`MAX_AGENT_COUNTER_ENTRIES`] entries in `agent_counters`.
    ///
    /// # Errors
    /// [`InvalidMessage`] naming the message and field.
    pub fn validate(&self) -> Result<(), InvalidMessage> {
        let Some(body) = &self.body else {
            return Err(invalid("ControlMessage", "body", "missing".into()));
        };
        match body {
            Body::Hello(m) => m.validate(),
            Body::Challenge(m) => {
                check_exact("Challenge", "nonce", &m.nonce, NONCE_BYTES)?;
                check_len(
                    "Challenge",
                    "collector_id",
                    &m.collector_id,
                    0,
                    MAX_ID_BYTES,
                )
            }
            Body::Proof(m) => check_exact("Proof", "hmac", &m.hmac, PROOF_BYTES),
            Body::Welcome(m) => m.validate(),
            Body::Refuse(m) => check_len("Refuse", "detail", &m.detail, 0, MAX_DETAIL_BYTES),
            Body::Heartbeat(m) => check_agent_counters("Heartbeat", m.agent_counters.as_ref()),
            Body::Report(m) => {
                check_fraction("Report", "conn_loss_fraction", m.conn_loss_fraction)?;
                if let Some(lane) = &m.rc_lane {
                    check_fraction(
                        "Report",
                        "rc_lane.conn_loss_fraction",
                        lane.conn_loss_fraction,
                    )?;
                }
                m.streams.iter().try_for_each(|s| {
                    check_fraction("Report", "streams.loss_fraction", s.loss_fraction)
                })
            }
            Body::Goodbye(m) => check_len("Goodbye", "detail", &m.detail, 0, MAX_DETAIL_BYTES),
            Body::Probe(_) | Body::ProbeAnswer(_) | Body::DictAck(_) => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Framing
// ---------------------------------------------------------------------------------------------

/// Why [`encode_message`] wrote nothing.
#[derive(Debug, Error)]
pub enum EncodeError {
    /// The message breaks a schema rule.
    #[error("cannot encode {name}: {source}")]
    Invalid {
        /// Message name.
        name: &'static str,
        /// The rule broken.
        #[source]
        source: InvalidMessage,
    },
    /// The protobuf encoding is longer than [`MAX_CONTROL_MESSAGE_BYTES`].
    #[error("{name} encodes to {len} bytes, above the {max}-byte control message limit")]
    TooLarge {
        /// Message name.
        name: &'static str,
        /// Protobuf bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// prost could not write into the buffer (cannot happen with a `Vec`).
    #[error("cannot encode {name}: {source}")]
    Buffer {
        /// Message name.
        name: &'static str,
        /// prost's error.
        #[source]
        source: prost::EncodeError,
    },
}

/// Why a control message could not be read.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// The length prefix announces more than the decoder's limit.
    #[error("control message length {len} exceeds the {max}-byte limit")]
    TooLarge {
        /// Announced protobuf bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The input ended inside a frame.
    #[error("control message truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes of the whole frame (prefix included), or of the prefix if it is incomplete.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The bytes are not a protobuf `ControlMessage`.
    #[error("control message of {len} bytes is not valid protobuf: {source}")]
    Protobuf {
        /// Protobuf bytes.
        len: usize,
        /// prost's error.
        #[source]
        source: prost::DecodeError,
    },
    /// The message breaks a schema rule.
    #[error(transparent)]
    Invalid(#[from] InvalidMessage),
}

/// Append one framed message (4-byte big-endian length, then protobuf) to `out`. On error
/// `out` is unchanged.
///
/// # Errors
/// [`EncodeError::Invalid`] when [`ControlMessage::validate`] fails, [`EncodeError::TooLarge`]
/// above [`MAX_CONTROL_MESSAGE_BYTES`].
pub fn encode_message(msg: &ControlMessage, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let name = msg.name();
    msg.validate()
        .map_err(|source| EncodeError::Invalid { name, source })?;
    let len = msg.encoded_len();
    let prefix = match u32::try_from(len) {
        Ok(prefix) if len <= MAX_CONTROL_MESSAGE_BYTES => prefix,
        _ => {
            return Err(EncodeError::TooLarge {
                name,
                len,
                max: MAX_CONTROL_MESSAGE_BYTES,
            })
        }
    };
    let start = out.len();
    out.reserve(LENGTH_PREFIX_BYTES + len);
    out.extend_from_slice(&prefix.to_be_bytes());
    msg.encode(out).map_err(|source| {
        out.truncate(start);
        EncodeError::Buffer { name, source }
    })
}

/// Reads framed control messages from a byte stream.
///
/// Two ways to feed it: [`decode`](Self::decode) works on a caller-owned [`BytesMut`] (the
/// shape of `tokio_util::codec::Decoder::decode`, so a codec is a one-line wrapper), and
/// [`push`](Self::push) + [`next_message`](Self::next_message) buffer `&[u8]` chunks
/// internally. After any error the stream has lost its framing: close the connection.
#[derive(Debug)]
pub struct ControlDecoder {
    max_message_bytes: usize,
    buf: BytesMut,
}

impl Default for ControlDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlDecoder {
    /// A decoder with the [`MAX_CONTROL_MESSAGE_BYTES`] limit.
    pub fn new() -> Self {
        Self::with_max_message_bytes(MAX_CONTROL_MESSAGE_BYTES)
    }

    /// A decoder with a smaller limit (values above [`MAX_CONTROL_MESSAGE_BYTES`] are lowered
    /// to it).
    pub fn with_max_message_bytes(max_message_bytes: usize) -> Self {
        Self {
            max_message_bytes: max_message_bytes.min(MAX_CONTROL_MESSAGE_BYTES),
            buf: BytesMut::new(),
        }
    }

    /// The limit in force (protobuf bytes per message).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Take one complete message from the front of `src`: `Ok(None)` (and `src` untouched)
    /// until a whole frame is there; on success the frame is removed from `src`.
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`] as soon as the prefix exceeds the limit,
    /// [`DecodeError::Protobuf`] / [`DecodeError::Invalid`] for a bad body (the frame is
    /// consumed).
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ControlMessage>, DecodeError> {
        let Some(len) = self.frame_len(src)? else {
            return Ok(None);
        };
        let total = LENGTH_PREFIX_BYTES + len;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(LENGTH_PREFIX_BYTES);
        let body = src.split_to(len);
        decode_body(&body).map(Some)
    }

    /// Append a chunk read from the connection to the internal buffer.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete message from the internal buffer, `Ok(None)` if more bytes are
    /// needed. Errors as [`decode`](Self::decode).
    ///
    /// # Errors
    /// See [`decode`](Self::decode).
    pub fn next_message(&mut self) -> Result<Option<ControlMessage>, DecodeError> {
        let mut buf = std::mem::take(&mut self.buf);
        let out = self.decode(&mut buf);
        self.buf = buf;
        out
    }

    /// Bytes buffered internally and not yet returned as a message.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The peer closed the connection: fine between messages, an error inside one.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] when a partial frame is buffered.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        Err(DecodeError::Truncated {
            needed: self.needed(&self.buf),
            available: self.buf.len(),
        })
    }

    fn frame_len(&self, src: &[u8]) -> Result<Option<usize>, DecodeError> {
        let Some(prefix) = src.first_chunk::<LENGTH_PREFIX_BYTES>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.max_message_bytes {
            return Err(DecodeError::TooLarge {
                len,
                max: self.max_message_bytes,
            });
        }
        Ok(Some(len))
    }

    fn needed(&self, src: &[u8]) -> usize {
        match src.first_chunk::<LENGTH_PREFIX_BYTES>() {
            Some(prefix) => {
                LENGTH_PREFIX_BYTES.saturating_add(u32::from_be_bytes(*prefix) as usize)
            }
            None => LENGTH_PREFIX_BYTES,
        }
    }
}

/// Decode exactly one framed message from the front of `buf`; returns it and the bytes it
/// took (prefix included). Uses the [`MAX_CONTROL_MESSAGE_BYTES`] limit.
///
/// # Errors
/// [`DecodeError::Truncated`] if `buf` holds less than a whole frame, otherwise as
/// [`ControlDecoder::decode`].
pub fn decode_frame(buf: &[u8]) -> Result<(ControlMessage, usize), DecodeError> {
    let decoder = ControlDecoder::new();
    let truncated = || DecodeError::Truncated {
        needed: decoder.needed(buf),
        available: buf.len(),
    };
    let len = decoder.frame_len(buf)?.ok_or_else(truncated)?;
    let total = LENGTH_PREFIX_BYTES + len;
    let body = buf.get(LENGTH_PREFIX_BYTES..total).ok_or_else(truncated)?;
    Ok((decode_body(body)?, total))
}

fn decode_body(body: &[u8]) -> Result<ControlMessage, DecodeError> {
    let msg = ControlMessage::decode(body).map_err(|source| DecodeError::Protobuf {
        len: body.len(),
        source,
    })?;
    msg.validate()?;
    Ok(msg)
}

// ---------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------

type HmacSha256 = Hmac<Sha256>;

/// SHA-256 block size: the HMAC key block length (RFC 2104 `B`).
const SHA256_BLOCK_BYTES: usize = 64;

/// Why [`random_nonce`] failed.
#[derive(Debug, Error)]
#[error("operating system random source failed: {0}")]
pub struct NonceError(#[source] rand::Error);

/// A fresh [`NONCE_BYTES`]-byte nonce from the operating system's random source.
///
/// # Errors
/// [`NonceError`] if the OS random source fails.
pub fn random_nonce() -> Result<[u8; NONCE_BYTES], NonceError> {
    use rand::RngCore as _;
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut nonce)
        .map_err(NonceError)?;
    Ok(nonce)
}

/// RFC 2104 key block: keys longer than the block are hashed, then zero-padded to `B`.
/// Building it here makes HMAC construction infallible (`Mac::new` takes a full block)
/// while staying the standard HMAC of `token` (checked against RFC 4231 in the tests).
fn keyed_mac(token: &[u8]) -> HmacSha256 {
    let mut block = [0u8; SHA256_BLOCK_BYTES];
    if token.len() > SHA256_BLOCK_BYTES {
        let digest = Sha256::digest(token);
        for (b, d) in block.iter_mut().zip(digest.iter()) {
            *b = *d;
        }
    } else {
        for (b, t) in block.iter_mut().zip(token) {
            *b = *t;
        }
    }
    <HmacSha256 as hmac::digest::KeyInit>::new(&block.into())
}

fn transcript_mac(
    token: &[u8],
    nonce: &[u8; NONCE_BYTES],
    agent_id: &str,
    epoch: u64,
) -> HmacSha256 {
    let mut mac = keyed_mac(token);
    mac.update(PROOF_LABEL);
    mac.update(&[0]);
    mac.update(nonce);
    // agent_id is at most MAX_ID_BYTES on the wire; saturate rather than wrap for longer input.
    let id_len = u32::try_from(agent_id.len()).unwrap_or(u32::MAX);
    mac.update(&id_len.to_be_bytes());
    mac.update(agent_id.as_bytes());
    mac.update(&epoch.to_be_bytes());
    mac
}

/// The agent's answer to a challenge: HMAC-SHA256 keyed with the pre-shared `token` over
///
/// ```text
/// "uctel-control-v1/proof" || 0x00 || nonce (32 bytes)
///   || u32 big-endian byte length of agent_id || agent_id (UTF-8) || u64 big-endian epoch
/// ```
///
/// Binding the nonce stops replay across connections; binding `agent_id` and `epoch` stops a
/// proof from being reused for another identity or another agent incarnation. The label
/// separates this use of the token from any other.
pub fn proof(
    token: &[u8],
    nonce: &[u8; NONCE_BYTES],
    agent_id: &str,
    epoch: u64,
) -> [u8; PROOF_BYTES] {
    transcript_mac(token, nonce, agent_id, epoch)
        .finalize()
        .into_bytes()
        .into()
}

/// Check a [`Proof::hmac`] against the expected [`proof`] in constant time (`hmac`'s
/// `verify_slice`); a proof of the wrong length is rejected.
#[must_use]
pub fn verify_proof(
    token: &[u8],
    nonce: &[u8; NONCE_BYTES],
    agent_id: &str,
    epoch: u64,
    candidate: &[u8],
) -> bool {
    transcript_mac(token, nonce, agent_id, epoch)
        .verify_slice(candidate)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn hmac_of(token: &[u8], data: &[u8]) -> String {
        let mut mac = keyed_mac(token);
        mac.update(data);
        hex(&mac.finalize().into_bytes())
    }

    #[test]
    fn keyed_mac_is_standard_hmac_sha256() {
        // RFC 4231 test case 1 (short key).
        assert_eq!(
            hmac_of(&[0x0b; 20], b"Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // RFC 4231 test case 2 (key shorter than the block).
        assert_eq!(
            hmac_of(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // RFC 4231 test case 6 (131-byte key, hashed first).
        assert_eq!(
            hmac_of(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        // A key of exactly one block is used as is.
        let block_key = [0x42u8; 64];
        let mut reference = match <HmacSha256 as Mac>::new_from_slice(&block_key) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        reference.update(b"x");
        assert_eq!(
            hmac_of(&block_key, b"x"),
            hex(&reference.finalize().into_bytes())
        );
    }

    #[test]
    fn heartbeat_agent_counters_round_trip_and_are_bounded() {
        let counters = |n: usize| AgentCounters {
            counters_epoch: 0xfeed,
            sent: vec![AgentStreamSent {
                stream_id: 1,
                frames: 10,
                records: 400,
            }],
            dropped: (0..n)
                .map(|i| AgentStreamDropped {
                    stream_id: 1,
                    reason: AgentDropReason::ALL[i % AgentDropReason::ALL.len()] as i32,
                    frames: 3,
                    records: 120,
                })
                .collect(),
        };
        let hb = Heartbeat {
            sequence: 4,
            agent_counters: Some(counters(8)),
            ..Heartbeat::default()
        };
        let m: ControlMessage = hb.clone().into();
        assert!(m.validate().is_ok());
        let bytes = m.encode_to_vec();
        let back = match ControlMessage::decode(bytes.as_slice()) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(back.body, Some(Body::Heartbeat(hb)));
        // A heartbeat of an older agent (no counters) decodes with none.
        let old = Heartbeat {
            sequence: 1,
            ..Heartbeat::default()
        };
        let back = ControlMessage::decode(ControlMessage::from(old).encode_to_vec().as_slice());
        assert!(matches!(
            back.map(|m| m.body),
            Ok(Some(Body::Heartbeat(Heartbeat {
                agent_counters: None,
                ..
            })))
        ));
        let big: ControlMessage = Heartbeat {
            agent_counters: Some(counters(MAX_AGENT_COUNTER_ENTRIES)),
            ..Heartbeat::default()
        }
        .into();
        let e = big
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("agent_counters"), "{e:?}");
        // Received from a peer that does not validate: refused by the decoder.
        let body = big.encode_to_vec();
        let mut framed = u32::try_from(body.len())
            .unwrap_or(0)
            .to_be_bytes()
            .to_vec();
        framed.extend(&body);
        assert!(matches!(
            decode_frame(&framed),
            Err(DecodeError::Invalid(_))
        ));
        assert_eq!(AgentDropReason::NoCredit.label(), "no_credit");
    }

    #[test]
    fn body_names() {
        let m: ControlMessage = Heartbeat::default().into();
        assert_eq!(m.name(), "Heartbeat");
        assert_eq!(ControlMessage::default().name(), "(empty)");
        assert_eq!(RefuseReason::BadProof.label(), "bad_proof");
        assert_eq!(Transport::Soft.as_str(), "soft");
    }
}
