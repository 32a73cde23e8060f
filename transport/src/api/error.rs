//! Errors, one enum per operation, each carrying its context (QPN, state, key, length).

use thiserror::Error;

use super::types::{AccessFlags, QpState, TransportKind};

/// [`Device::open`](super::Device::open) failed.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The transport is not compiled into this build or not available on this host.
    #[error("transport {kind} is not available: {detail}")]
    Unsupported {
        /// Which transport.
        kind: TransportKind,
        /// Why.
        detail: String,
    },
    /// The configuration is inconsistent.
    #[error("invalid {kind} device configuration: {detail}")]
    InvalidConfig {
        /// Which transport.
        kind: TransportKind,
        /// What is wrong.
        detail: String,
    },
    /// An operating-system call failed (binding the UDP socket, opening the verbs device).
    #[error("opening {kind} device {name:?}: {source}")]
    Io {
        /// Which transport.
        kind: TransportKind,
        /// Device name or address.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// [`Device::alloc_pd`](super::Device::alloc_pd) failed.
#[derive(Debug, Error)]
pub enum AllocPdError {
    /// The device refused (verbs: `ibv_alloc_pd` returned NULL).
    #[error("allocating a protection domain on {device}: {detail}")]
    Device {
        /// Device name.
        device: String,
        /// Detail.
        detail: String,
    },
}

/// [`Device::create_cq`](super::Device::create_cq) failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CreateCqError {
    /// `depth` is 0 or above the device maximum.
    #[error("CQ depth {depth} is outside 1..={max}")]
    InvalidDepth {
        /// Requested depth.
        depth: u32,
        /// Device maximum.
        max: u32,
    },
    /// The device refused.
    #[error("creating a CQ of depth {depth}: {detail}")]
    Device {
        /// Requested depth.
        depth: u32,
        /// Detail.
        detail: String,
    },
}

/// [`Device::create_comp_channel`], [`CompletionChannel::req_notify`] or
/// [`CompletionChannel::wait`](super::CompletionChannel::wait) failed.
///
/// [`Device::create_comp_channel`]: super::Device::create_comp_channel
/// [`CompletionChannel::req_notify`]: super::CompletionChannel::req_notify
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CompChannelError {
    /// The CQ belongs to another device or transport.
    #[error("CQ {handle} does not belong to this completion channel's device")]
    ForeignCq {
        /// The CQ's handle.
        handle: u32,
    },
    /// The device or the OS refused (creating the eventfd or channel, arming, polling).
    #[error("completion channel: {what}: {detail}")]
    Device {
        /// Which step (`eventfd`, `ibv_req_notify_cq`, `poll`, ...).
        what: &'static str,
        /// Detail.
        detail: String,
    },
}

/// [`ProtectionDomain::reg_mr`](super::ProtectionDomain::reg_mr) failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegMrError {
    /// `len` is 0 or above the device maximum.
    #[error("MR length {len} is outside 1..={max}")]
    InvalidLength {
        /// Requested length in bytes.
        len: usize,
        /// Device maximum.
        max: usize,
    },
    /// REMOTE_WRITE without LOCAL_WRITE (IBTA 10.6.3.1; `ibv_reg_mr` returns EINVAL).
    #[error("access {access:?}: REMOTE_WRITE requires LOCAL_WRITE")]
    InvalidAccess {
        /// Requested access.
        access: AccessFlags,
    },
    /// No more MR keys.
    #[error("no free MR key ({max} regions registered)")]
    TooMany {
        /// Maximum number of regions.
        max: usize,
    },
    /// The device refused.
    #[error("registering {len} bytes: {detail}")]
    Device {
        /// Requested length.
        len: usize,
        /// Detail.
        detail: String,
    },
}

/// [`ProtectionDomain::create_qp`](super::ProtectionDomain::create_qp) failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CreateQpError {
    /// A queue depth is 0 or above the device maximum.
    #[error("{queue} depth {depth} is outside 1..={max}")]
    InvalidDepth {
        /// "send queue" or "receive queue".
        queue: &'static str,
        /// Requested depth.
        depth: u32,
        /// Device maximum.
        max: u32,
    },
    /// A CQ belongs to another device or transport.
    #[error("the {which} CQ belongs to another device")]
    ForeignCq {
        /// "send" or "recv".
        which: &'static str,
    },
    /// All 2^24 QP numbers are in use.
    #[error("no free QP number")]
    NoQpn,
    /// The device refused.
    #[error("creating a QP: {detail}")]
    Device {
        /// Detail.
        detail: String,
    },
}

/// [`ProtectionDomain::create_srq`](super::ProtectionDomain::create_srq) failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CreateSrqError {
    /// `max_wr` is 0 or above the device maximum (`ibv_device_attr.max_srq_wr`).
    #[error("SRQ depth {depth} is outside 1..={max}")]
    InvalidDepth {
        /// Requested depth.
        depth: u32,
        /// Device maximum.
        max: u32,
    },
    /// The device or transport has no shared receive queues.
    #[error("this device has no shared receive queues")]
    Unsupported,
    /// The device refused (`ibv_create_srq` returned NULL).
    #[error("creating an SRQ: {detail}")]
    Device {
        /// Detail.
        detail: String,
    },
}

/// [`QueuePair::connect`](super::QueuePair::connect) failed; the QP keeps its previous state.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// The QP is not in INIT (connect drives INIT → RTR → RTS once).
    #[error("QP {qpn:#08x}: connect needs state INIT, QP is {state}")]
    InvalidState {
        /// Local QPN.
        qpn: u32,
        /// Current state.
        state: QpState,
    },
    /// The remote endpoint's MTU is not an IB MTU, or the QPN/PSN exceed 24 bits.
    #[error("QP {qpn:#08x}: invalid remote endpoint: {detail}")]
    InvalidEndpoint {
        /// Local QPN.
        qpn: u32,
        /// What is wrong.
        detail: String,
    },
    /// The transport refused (verbs: `ibv_modify_qp` failed; the missing attributes are named).
    #[error("QP {qpn:#08x}: modify to {target} failed: {detail}")]
    Modify {
        /// Local QPN.
        qpn: u32,
        /// State being entered.
        target: QpState,
        /// Detail.
        detail: String,
    },
}

/// Why one WR of a [`QueuePair::post_send`](super::QueuePair::post_send) list was rejected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PostSendErrorKind {
    /// post_send needs RTS.
    #[error("QP is {state}, post_send needs RTS")]
    InvalidState {
        /// Current state.
        state: QpState,
    },
    /// The send queue holds `depth` outstanding WRs. A cheap, expected outcome: poll the send
    /// CQ (or wait for the wire) and retry, or drop at the source.
    #[error("send queue full ({depth} WRs outstanding)")]
    Full {
        /// Send queue depth.
        depth: u32,
    },
    /// The SGE does not lie inside its MR.
    #[error("SGE offset {offset} + length {length} exceeds MR lkey {lkey:#x} of {mr_len} bytes")]
    SgeOutOfBounds {
        /// The MR's lkey.
        lkey: u32,
        /// SGE offset.
        offset: usize,
        /// SGE length.
        length: u32,
        /// MR length.
        mr_len: usize,
    },
    /// The SGE's MR belongs to another device/transport or was deregistered.
    #[error("MR lkey {lkey:#x} is not registered on this device")]
    ForeignMr {
        /// The MR's lkey.
        lkey: u32,
    },
    /// The message is longer than the port's `max_msg_size`.
    #[error("message of {length} bytes exceeds the maximum of {max}")]
    MessageTooLong {
        /// Requested length.
        length: u32,
        /// Maximum.
        max: u32,
    },
}

/// [`QueuePair::post_send`] rejected WR number `posted` of the list; WRs before it were posted
/// (ibverbs `bad_wr` semantics), the rejected one and those after it were not.
///
/// [`QueuePair::post_send`]: super::QueuePair::post_send
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("post_send on QP {qpn:#08x}: WR {posted} rejected: {kind}")]
pub struct PostSendError {
    /// Local QPN.
    pub qpn: u32,
    /// Number of WRs of the list that were posted before the failing one.
    pub posted: usize,
    /// Why the WR was rejected.
    #[source]
    pub kind: PostSendErrorKind,
}

impl PostSendError {
    /// Whether the send queue was full (the cheap, retryable outcome).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, PostSendErrorKind::Full { .. })
    }
}

/// Why one WR of a [`QueuePair::post_recv`](super::QueuePair::post_recv) list was rejected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PostRecvErrorKind {
    /// post_recv needs INIT, RTR, RTS or ERROR (in ERROR the WR is flushed at once).
    #[error("QP is {state}, post_recv needs INIT, RTR, RTS or ERROR")]
    InvalidState {
        /// Current state.
        state: QpState,
    },
    /// The QP takes its receive WRs from a shared receive queue: post them there
    /// (`ibv_post_recv` on such a QP fails with `EINVAL`).
    #[error("QP receives from a shared receive queue; post to the SRQ")]
    OnSrq,
    /// The receive queue is full. A cheap, expected outcome.
    #[error("receive queue full ({depth} WRs posted)")]
    Full {
        /// Receive queue depth.
        depth: u32,
    },
    /// The SGE does not lie inside its MR.
    #[error("SGE offset {offset} + length {length} exceeds MR lkey {lkey:#x} of {mr_len} bytes")]
    SgeOutOfBounds {
        /// The MR's lkey.
        lkey: u32,
        /// SGE offset.
        offset: usize,
        /// SGE length.
        length: u32,
        /// MR length.
        mr_len: usize,
    },
    /// The SGE's MR lacks LOCAL_WRITE.
    #[error("MR lkey {lkey:#x} lacks LOCAL_WRITE")]
    NoLocalWrite {
        /// The MR's lkey.
        lkey: u32,
    },
    /// The SGE's MR belongs to another device/transport or was deregistered.
    #[error("MR lkey {lkey:#x} is not registered on this device")]
    ForeignMr {
        /// The MR's lkey.
        lkey: u32,
    },
}

/// [`QueuePair::post_recv`] rejected WR number `posted` of the list (ibverbs `bad_wr`).
///
/// [`QueuePair::post_recv`]: super::QueuePair::post_recv
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("post_recv on QP {qpn:#08x}: WR {posted} rejected: {kind}")]
pub struct PostRecvError {
    /// Local QPN.
    pub qpn: u32,
    /// Number of WRs of the list that were posted before the failing one.
    pub posted: usize,
    /// Why the WR was rejected.
    #[source]
    pub kind: PostRecvErrorKind,
}

impl PostRecvError {
    /// Whether the receive queue was full (the cheap, retryable outcome).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, PostRecvErrorKind::Full { .. })
    }
}

/// [`MemoryRegion::read_at`] / [`MemoryRegion::write_at`] out of bounds.
///
/// [`MemoryRegion::read_at`]: super::MemoryRegion::read_at
/// [`MemoryRegion::write_at`]: super::MemoryRegion::write_at
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("MR lkey {lkey:#x}: {len} bytes at offset {offset} exceed its {mr_len} bytes")]
pub struct MemoryAccessError {
    /// The MR's lkey.
    pub lkey: u32,
    /// Requested offset.
    pub offset: usize,
    /// Requested length.
    pub len: usize,
    /// MR length.
    pub mr_len: usize,
}
