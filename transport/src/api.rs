//! The verbs-shaped transport API shared by every uctel transport.
//!
//! Agent and collector code is written once against this module and runs unchanged on the
//! **soft** transport (RoCEv2 UC in user space over UDP, [`crate::soft`]) and on the **verbs**
//! transport (real RDMA through `rdma-sys`). The shapes follow ibverbs (`libibverbs/verbs.h` in
//! rdma-core) so that the verbs implementation is a thin mapping:
//!
//! | here | ibverbs |
//! |---|---|
//! | [`Device::open`] | `ibv_open_device` + `ibv_query_port` / `ibv_query_gid` |
//! | [`Device::alloc_pd`] | `ibv_alloc_pd` |
//! | [`ProtectionDomain::reg_mr`] | allocate + `ibv_reg_mr` |
//! | [`Device::create_cq`] | `ibv_create_cq` |
//! | [`ProtectionDomain::create_qp`] | `ibv_create_qp(IBV_QPT_UC)` + `ibv_modify_qp(INIT)` |
//! | [`QueuePair::connect`] | `ibv_modify_qp(RTR)` + `ibv_modify_qp(RTS)` |
//! | [`QueuePair::post_send`] / [`QueuePair::post_recv`] | `ibv_post_send` / `ibv_post_recv` (WR lists) |
//! | [`CompletionQueue::poll`] | `ibv_poll_cq` |
//! | [`Device::create_comp_channel`] | `ibv_create_comp_channel` (+ an eventfd for [`CompletionChannel::wake`]) |
//! | [`CompletionChannel::req_notify`] / [`CompletionChannel::wait`] | `ibv_req_notify_cq` / `ibv_get_cq_event` + `ibv_ack_cq_events` |
//! | [`Device::poll_async_event`] | `ibv_get_async_event` (non-blocking) |
//!
//! # Dispatch: concrete handles over object-safe backend traits
//!
//! The public handles ([`Device`], [`ProtectionDomain`], [`MemoryRegion`], [`CompletionQueue`],
//! [`QueuePair`]) are concrete, cheaply clonable types. Each one wraps an `Arc<dyn …Ops>` from
//! [`backend`], which a transport implements. The transport is chosen at run time from
//! configuration ([`DeviceConfig`], typically mapped from YAML) and everything above it is one
//! non-generic code path: no type parameters leak into agent or collector structs. The price is
//! one virtual call per verb (`post_send`, `poll_cq`), which is noise next to the work each verb
//! does (the soft transport builds and checksums packets; the verbs transport rings a doorbell).
//!
//! # Rules that hold on every transport
//!
//! * UC only: SEND and RDMA WRITE, each optionally with a 32-bit immediate; no READ, no atomics,
//!   no ACK/NAK, no retransmission. A send completion means "handed to the wire", never
//!   "delivered".
//! * A QP is created in INIT (so receive WRs can be posted before the peer starts sending) and
//!   reaches RTS with [`QueuePair::connect`]. Any QP can fall into ERROR (for example when its
//!   receive CQ overflows); that is observable with [`QueuePair::state`] and as an
//!   [`AsyncEvent`]. A QP in ERROR is not repaired: tear the connection down and build a new QP.
//! * Memory regions are owned by the transport and accessed with [`MemoryRegion::read_at`] /
//!   [`MemoryRegion::write_at`] (the workspace denies `unsafe` outside the verbs module, so no
//!   slices into NIC-visible memory are handed out). Access flags never include REMOTE_READ:
//!   rings are write-only to the remote side.
//! * Every silently dropped inbound message is counted with a [`UcDropReason`] (see
//!   [`QueuePair::stats`] and [`Device::stats`]); the verbs transport fills what the hardware
//!   exposes.

use std::any::Any;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

/// The UDP destination port of RoCEv2 (IANA-assigned, IBTA annex A17).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Mask of a 24-bit PSN or QPN (IBTA 9.2 BTH).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Largest message a UC QP accepts: 2^31 bytes (IBTA 9.4.4 / rxe rejects RETH lengths above
/// 2^31, "IBA C9-94"). Transports may advertise less in [`PortAttr::max_msg_size`].
pub const MAX_MSG_SIZE: u32 = 1 << 31;

// ---------------------------------------------------------------------------------------------
// Small value types
// ---------------------------------------------------------------------------------------------

/// Which transport implementation is behind a [`Device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// RoCEv2 UC in user space over UDP ([`crate::soft`]).
    Soft,
    /// Real RDMA through libibverbs.
    Verbs,
}

impl TransportKind {
    /// Lower-case name, as used in configuration files and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Soft => "soft",
            Self::Verbs => "verbs",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Memory and QP access rights (`enum ibv_access_flags`, same bit values).
///
/// REMOTE_READ and the atomics are deliberately not representable: UC carries neither, and
/// uctel rings must never be readable by the remote side.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local read (always implied).
    pub const NONE: Self = Self(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the transport may write into the region (needed by receive
    /// buffers and by any region that is the target of RDMA WRITE).
    pub const LOCAL_WRITE: Self = Self(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: the remote side may RDMA WRITE into the region (on an MR) or
    /// through the QP (on a QP). IBTA 10.6.3.1: REMOTE_WRITE requires LOCAL_WRITE.
    pub const REMOTE_WRITE: Self = Self(2);

    /// Raw `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Self::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Self::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if parts.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&parts.join("|"))
        }
    }
}

/// IB path MTU (IBTA 9.7.5.1 / `enum ibv_mtu`): the payload bytes per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256`).
    Mtu256,
    /// 512 bytes (`IBV_MTU_512`).
    Mtu512,
    /// 1024 bytes (`IBV_MTU_1024`); rxe's active MTU on a 1500-byte netdev.
    Mtu1024,
    /// 2048 bytes (`IBV_MTU_2048`).
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096`).
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            Self::Mtu256 => 256,
            Self::Mtu512 => 512,
            Self::Mtu1024 => 1024,
            Self::Mtu2048 => 2048,
            Self::Mtu4096 => 4096,
        }
    }

    /// The MTU of exactly `bytes` bytes, or `None` if `bytes` is not an IB MTU.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }

    /// The largest IB MTU not above `bytes`, or `None` if `bytes < 256`.
    pub const fn at_most(bytes: u32) -> Option<Self> {
        if bytes >= 4096 {
            Some(Self::Mtu4096)
        } else if bytes >= 2048 {
            Some(Self::Mtu2048)
        } else if bytes >= 1024 {
            Some(Self::Mtu1024)
        } else if bytes >= 512 {
            Some(Self::Mtu512)
        } else if bytes >= 256 {
            Some(Self::Mtu256)
        } else {
            None
        }
    }
}

/// QP state (`enum ibv_qp_state`; SQD and SQE are not used by UC here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing allowed.
    Reset,
    /// Receive WRs may be posted; inbound packets are dropped (`qp_not_ready`).
    Init,
    /// Ready to receive: inbound packets are processed; post_send is refused.
    Rtr,
    /// Ready to send and receive.
    Rts,
    /// Failed: outstanding WRs complete with [`WcStatus::WrFlushError`], inbound packets are
    /// dropped (`qp_error`), post_send is refused. Terminal for uctel: build a new QP.
    Error,
}

impl QpState {
    /// Upper-case name as in the IBTA spec.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Error => "ERROR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The RoCEv2 GID of an IP address: the IPv4-mapped IPv6 address for IPv4 (`::ffff:a.b.c.d`),
/// the address itself for IPv6 (IBTA annex A17, RoCEv2 GIDs).
pub fn gid_from_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCEv2 GID stands for (IPv4 for IPv4-mapped GIDs).
pub fn ip_from_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Everything the peer needs to connect to a local QP; exchanged on the control channel.
///
/// Fields as in the `ibv_modify_qp` RTR/RTS attributes of the other side: the peer uses
/// `qpn` as its `dest_qp_num`, `psn` as its `rq_psn`, `gid` for its address vector and
/// `min(mtu, own mtu)` as `path_mtu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// RoCEv2 GID of the local port (see [`gid_from_ip`]).
    pub gid: [u8; 16],
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// First PSN this QP will send (24 bits); the peer expects it.
    pub psn: u32,
    /// Largest path MTU this side supports, in bytes (256, 512, 1024, 2048 or 4096).
    pub mtu: u32,
    /// UDP address packets for this QP must be sent to. `Some` for the soft transport (it may
    /// listen on a port other than 4791); `None` means "the GID's IP address, port 4791", which
    /// is what kernel and hardware RoCEv2 devices use.
    pub udp_addr: Option<SocketAddr>,
}

impl QpEndpoint {
    /// The UDP address RoCEv2 packets for this endpoint go to: `udp_addr`, or the GID's IP
    /// address with port [`ROCE_V2_UDP_PORT`].
    pub fn destination(&self) -> SocketAddr {
        self.udp_addr
            .unwrap_or_else(|| SocketAddr::new(ip_from_gid(self.gid), ROCE_V2_UDP_PORT))
    }
}

/// Port attributes of an opened device (`ibv_query_port` + `ibv_query_gid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// RoCEv2 GID used for UC QPs.
    pub gid: [u8; 16],
    /// Active path MTU in bytes.
    pub active_mtu: u32,
    /// Largest message in bytes (`max_msg_sz`; rxe: 8 MiB).
    pub max_msg_size: u32,
    /// The UDP address the device receives RoCEv2 on (soft transport), `None` for verbs.
    pub udp_addr: Option<SocketAddr>,
}

// ---------------------------------------------------------------------------------------------
// Work requests and completions
// ---------------------------------------------------------------------------------------------

/// A scatter/gather element: `length` bytes at `offset` inside `mr` (`struct ibv_sge`, with the
/// address expressed as an offset into the region).
#[derive(Clone, Copy, Debug)]
pub struct Sge<'a> {
    /// The registered region holding the bytes.
    pub mr: &'a MemoryRegion,
    /// Byte offset inside `mr`.
    pub offset: usize,
    /// Number of bytes.
    pub length: u32,
}

impl<'a> Sge<'a> {
    /// `length` bytes at `offset` inside `mr`.
    pub fn new(mr: &'a MemoryRegion, offset: usize, length: u32) -> Self {
        Self { mr, offset, length }
    }

    /// Whether `offset + length` lies inside the region.
    pub fn in_bounds(&self) -> bool {
        self.offset
            .checked_add(self.length as usize)
            .is_some_and(|end| end <= self.mr.len())
    }
}

/// What a send WR does (`enum ibv_wr_opcode`, UC subset), with the fields each opcode needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOpcode {
    /// `IBV_WR_SEND`: channel semantics, consumes a receive WR at the peer.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: SEND with a 32-bit immediate delivered in the receive WC.
    SendWithImm {
        /// The immediate, as a host-order value (put on the wire big-endian).
        imm: u32,
    },
    /// `IBV_WR_RDMA_WRITE`: memory semantics, no receive WR and no completion at the peer.
    RdmaWrite {
        /// Remote virtual address (inside the peer's MR).
        remote_addr: u64,
        /// The peer MR's rkey.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: RDMA WRITE whose last packet consumes a receive WR at the
    /// peer (a zero-length one suffices) and completes it with the immediate.
    RdmaWriteWithImm {
        /// Remote virtual address (inside the peer's MR).
        remote_addr: u64,
        /// The peer MR's rkey.
        rkey: u32,
        /// The immediate, as a host-order value (put on the wire big-endian).
        imm: u32,
    },
}

impl SendOpcode {
    /// The completion opcode a signaled WR of this kind reports.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::Send | Self::SendWithImm { .. } => WcOpcode::Send,
            Self::RdmaWrite { .. } | Self::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        }
    }
}

/// A send work request (`struct ibv_send_wr`, one SGE).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation and its remote fields.
    pub opcode: SendOpcode,
    /// The local bytes to send; `None` sends a zero-length message.
    pub sge: Option<Sge<'a>>,
    /// `IBV_SEND_SIGNALED`: produce a completion in the send CQ when the message has been
    /// handed to the wire. Unsignaled WRs complete silently (their SQ slot is still freed).
    pub signaled: bool,
}

impl<'a> SendWr<'a> {
    /// A signaled SEND of `sge`.
    pub fn send(wr_id: u64, sge: Option<Sge<'a>>) -> Self {
        Self {
            wr_id,
            opcode: SendOpcode::Send,
            sge,
            signaled: true,
        }
    }

    /// A signaled SEND_WITH_IMM of `sge`.
    pub fn send_with_imm(wr_id: u64, sge: Option<Sge<'a>>, imm: u32) -> Self {
        Self {
            wr_id,
            opcode: SendOpcode::SendWithImm { imm },
            sge,
            signaled: true,
        }
    }

    /// A signaled RDMA_WRITE of `sge` to `remote_addr` under `rkey`.
    pub fn write(wr_id: u64, sge: Option<Sge<'a>>, remote_addr: u64, rkey: u32) -> Self {
        Self {
            wr_id,
            opcode: SendOpcode::RdmaWrite { remote_addr, rkey },
            sge,
            signaled: true,
        }
    }

    /// A signaled RDMA_WRITE_WITH_IMM of `sge` to `remote_addr` under `rkey`.
    pub fn write_with_imm(
        wr_id: u64,
        sge: Option<Sge<'a>>,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> Self {
        Self {
            wr_id,
            opcode: SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            sge,
            signaled: true,
        }
    }

    /// The same WR with `signaled` set as given.
    pub fn with_signaled(mut self, signaled: bool) -> Self {
        self.signaled = signaled;
        self
    }

    /// Message length in bytes (0 without an SGE).
    pub fn length(&self) -> u32 {
        self.sge.map_or(0, |s| s.length)
    }
}

/// A receive work request (`struct ibv_recv_wr`, at most one SGE).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an inbound SEND's payload lands. `None` is a zero-length receive WR: enough for
    /// RDMA WRITE_WITH_IMM (IBTA "RQ operation types": a WR without scatter list may carry the
    /// immediate) and for zero-length SENDs; a longer SEND into it is a length error.
    pub sge: Option<Sge<'a>>,
}

impl<'a> RecvWr<'a> {
    /// A receive WR for `sge`.
    pub fn new(wr_id: u64, sge: Sge<'a>) -> Self {
        Self {
            wr_id,
            sge: Some(sge),
        }
    }

    /// A zero-length receive WR (for RDMA WRITE_WITH_IMM).
    pub fn zero_length(wr_id: u64) -> Self {
        Self { wr_id, sge: None }
    }
}

/// Completion status (`enum ibv_wc_status`, the subset UC produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: a local length check failed (verbs hardware reports an inbound
    /// SEND larger than its receive buffer this way).
    LocalLengthError,
    /// `IBV_WC_LOC_QP_OP_ERR`: the WR could not be executed; rxe reports an inbound SEND larger
    /// than its receive buffer this way (`copy_data` → `RESPST_ERR_MALFORMED_WQE`, class A).
    /// The QP is in ERROR afterwards.
    LocalQpOperationError,
    /// `IBV_WC_LOC_PROT_ERR`: the WR's memory region is gone or lacks the needed access.
    LocalProtectionError,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP is in ERROR; the WR was not executed.
    WrFlushError,
    /// `IBV_WC_GENERAL_ERR`: anything else.
    GeneralError,
}

impl WcStatus {
    /// Lower-case name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocalLengthError => "local_length_error",
            Self::LocalQpOperationError => "local_qp_operation_error",
            Self::LocalProtectionError => "local_protection_error",
            Self::WrFlushError => "wr_flush_error",
            Self::GeneralError => "general_error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Completion opcode (`enum ibv_wc_opcode`, the UC subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`: a SEND or SEND_WITH_IMM WR completed on the send side.
    #[default]
    Send,
    /// `IBV_WC_RDMA_WRITE`: an RDMA_WRITE(_WITH_IMM) WR completed on the send side.
    RdmaWrite,
    /// `IBV_WC_RECV`: a receive WR consumed by an inbound SEND (with or without immediate).
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive WR consumed by an inbound RDMA WRITE_WITH_IMM.
    RecvRdmaWithImm,
}

/// A work completion (`struct ibv_wc`, the fields UC fills).
///
/// For error statuses only `wr_id`, `status` and `qp_num` are meaningful (as in ibverbs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed WR.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes: the message length for send completions and SEND receives; the RETH DMA length
    /// for RDMA WRITE_WITH_IMM receives (rxe `do_complete`: `qp->resp.length`).
    pub byte_len: u32,
    /// The immediate (`IBV_WC_WITH_IMM`), as the host-order value the sender posted.
    pub imm: Option<u32>,
    /// QP number the WR belonged to (`wc.qp_num`).
    pub qp_num: u32,
}

// ---------------------------------------------------------------------------------------------
// Drop accounting
// ---------------------------------------------------------------------------------------------

/// Why the responder silently discarded an inbound message or packet. One closed set for every
/// transport; [`UcDropReason::as_str`] gives the Prometheus label value.
///
/// Units: reasons counted by a QP ([`QpStats::drops`]) count **messages** (each message is
/// counted at most once, at the first packet that dooms it; the rest of a doomed message is
/// discarded and counted in [`QpStats::packets_discarded`]). Reasons counted by the device
/// before a QP is known ([`DeviceStats::drops`]: `malformed`, `bad_icrc`, `unknown_qpn`) count
/// **packets**. With uctel's one-packet frames both units are frames, so
/// `sent = completed + dropped + lost on the wire` holds exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UcDropReason {
    /// The UDP payload is not a well-formed UC RoCEv2 packet (too short, wrong BTH version,
    /// non-UC opcode, bad pad count, longer than the soft link's receive buffer). Device
    /// level.
    Malformed,
    /// The ICRC does not match (IBTA annex A17; rxe `rxe_icrc_check`). Device level.
    BadIcrc,
    /// No QP with the BTH destination QPN exists on this device. Device level.
    UnknownQpn,
    /// BTH P_Key does not match the default partition (rxe `check_keys`).
    BadPkey,
    /// The source IP is not the connected peer's (rxe `check_addr` for RC/UC).
    AddressMismatch,
    /// The QP is in RESET or INIT (rxe `hdr_check`: QP not ready).
    QpNotReady,
    /// The QP is in ERROR.
    QpError,
    /// A MIDDLE/LAST packet whose PSN is not the expected one: an earlier packet of its message
    /// was lost, so the whole message is dropped (rxe `check_psn`, UC case).
    PsnGap,
    /// A MIDDLE/LAST packet with the expected PSN that does not continue the message in
    /// progress (rxe `check_op_seq`, UC case).
    OpcodeSequence,
    /// A partially received message was cut short by a new FIRST/ONLY packet (its LAST was
    /// lost); the partial message is discarded and its receive WR reused (IBTA class D1, rxe
    /// `do_class_d1e_error`).
    CutShort,
    /// SEND or WRITE_WITH_IMM with no receive WR posted (no RNR NAK on UC; rxe `RESPST_ERR_RNR`
    /// "UD/UC – class D").
    NoReceiveWr,
    /// RETH rkey matches no MR on this device (rxe `check_rkey`).
    BadRkey,
    /// RETH virtual address + DMA length is not inside the MR (rxe `mr_check_range`).
    OutOfBounds,
    /// The QP or the target MR lacks REMOTE_WRITE (rxe `check_op_valid` / `lookup_mr`).
    AccessDenied,
    /// A packet's payload length is inconsistent with the path MTU or the RETH DMA length
    /// (rxe `check_length` / `check_rkey`, class D).
    BadLength,
    /// An inbound SEND is longer than the posted receive buffer. rxe completes the receive WR
    /// with `IBV_WC_LOC_QP_OP_ERR` and moves the QP to ERROR (`copy_data` returns `-EINVAL` →
    /// `RESPST_ERR_MALFORMED_WQE`, class A); the soft transport does the same.
    MessageTooLong,
    /// The receive WR's buffer is no longer usable (its MR was deregistered or lacks
    /// LOCAL_WRITE); completed with `IBV_WC_LOC_QP_OP_ERR`, QP to ERROR (rxe class A).
    BadReceiveWr,
    /// The receive CQ was full when the message completed: the completion is lost and the QP
    /// moves to ERROR (IBTA class G; rxe `RESPST_ERR_CQ_OVERFLOW`).
    CqOverflow,
}

impl UcDropReason {
    /// Number of reasons.
    pub const COUNT: usize = 18;

    /// Every reason, in declaration order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::Malformed,
        Self::BadIcrc,
        Self::UnknownQpn,
        Self::BadPkey,
        Self::AddressMismatch,
        Self::QpNotReady,
        Self::QpError,
        Self::PsnGap,
        Self::OpcodeSequence,
        Self::CutShort,
        Self::NoReceiveWr,
        Self::BadRkey,
        Self::OutOfBounds,
        Self::AccessDenied,
        Self::BadLength,
        Self::MessageTooLong,
        Self::BadReceiveWr,
        Self::CqOverflow,
    ];

    /// Snake-case name, stable, for the `reason` label of drop counters.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::BadIcrc => "bad_icrc",
            Self::UnknownQpn => "unknown_qpn",
            Self::BadPkey => "bad_pkey",
            Self::AddressMismatch => "address_mismatch",
            Self::QpNotReady => "qp_not_ready",
            Self::QpError => "qp_error",
            Self::PsnGap => "psn_gap",
            Self::OpcodeSequence => "opcode_sequence",
            Self::CutShort => "cut_short",
            Self::NoReceiveWr => "no_receive_wr",
            Self::BadRkey => "bad_rkey",
            Self::OutOfBounds => "out_of_bounds",
            Self::AccessDenied => "access_denied",
            Self::BadLength => "bad_length",
            Self::MessageTooLong => "message_too_long",
            Self::BadReceiveWr => "bad_receive_wr",
            Self::CqOverflow => "cq_overflow",
        }
    }

    /// Index into [`DropCounters`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for UcDropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One counter per [`UcDropReason`].
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct DropCounters([u64; UcDropReason::COUNT]);

impl DropCounters {
    /// Adds one to `reason`.
    pub fn inc(&mut self, reason: UcDropReason) {
        self.add(reason, 1);
    }

    /// Adds `n` to `reason`.
    pub fn add(&mut self, reason: UcDropReason, n: u64) {
        if let Some(c) = self.0.get_mut(reason.index()) {
            *c = c.saturating_add(n);
        }
    }

    /// The count for `reason`.
    pub fn get(&self, reason: UcDropReason) -> u64 {
        self.0.get(reason.index()).copied().unwrap_or(0)
    }

    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// `(reason, count)` for every reason, including zeros.
    pub fn iter(&self) -> impl Iterator<Item = (UcDropReason, u64)> + '_ {
        UcDropReason::ALL.iter().map(|r| (*r, self.get(*r)))
    }

    /// Element-wise sum.
    pub fn merged(mut self, other: &DropCounters) -> DropCounters {
        for r in UcDropReason::ALL {
            self.add(r, other.get(r));
        }
        self
    }
}

impl fmt::Debug for DropCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .filter(|(_, n)| *n != 0)
                    .map(|(r, n)| (r.as_str(), n)),
            )
            .finish()
    }
}

/// Per-QP counters ([`QueuePair::stats`]). All monotonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Packets handed to the wire.
    pub packets_sent: u64,
    /// Send WRs whose last packet was handed to the wire.
    pub messages_sent: u64,
    /// Inbound packets that reached this QP.
    pub packets_received: u64,
    /// Inbound messages that completed (placed, and a receive WC posted when one is due).
    pub messages_completed: u64,
    /// FIRST/ONLY packets accepted with a PSN other than the expected one (the responder
    /// resynchronised; the skipped PSNs were lost on the wire or belonged to dropped messages).
    pub psn_resyncs: u64,
    /// Inbound packets discarded because their message was already dropped (the rest of a
    /// message counted once in `drops`).
    pub packets_discarded: u64,
    /// Dropped inbound messages by reason.
    pub drops: DropCounters,
}

/// Device-wide counters ([`Device::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeviceStats {
    /// Datagrams received from the link.
    pub packets_received: u64,
    /// Datagrams handed to the link.
    pub packets_sent: u64,
    /// Packets dropped before reaching a QP (`malformed`, `bad_icrc`, `unknown_qpn`).
    pub drops: DropCounters,
}

/// Why a QP moved to ERROR on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpErrorCause {
    /// The receive CQ overflowed (IBTA class G).
    RecvCqOverflow,
    /// The send CQ overflowed.
    SendCqOverflow,
    /// An inbound SEND did not fit its receive buffer (rxe: class A, `IBV_WC_LOC_QP_OP_ERR`).
    MessageTooLong,
    /// A receive WR's buffer became unusable.
    BadReceiveWr,
    /// A send WR's memory region became unusable (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// Reported by an RDMA device, which gives no cause (verbs `IBV_EVENT_QP_FATAL`,
    /// `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`).
    Device,
}

/// Asynchronous events (`ibv_get_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP moved to ERROR.
    QpFatal {
        /// The QP.
        qpn: u32,
        /// Why.
        cause: QpErrorCause,
    },
    /// `IBV_EVENT_CQ_ERR`: a completion could not be added because the CQ was full.
    CqError {
        /// The CQ's handle number ([`CompletionQueue::handle`]).
        cq: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE` / `IBV_EVENT_PORT_ERR`: the device port went up or down
    /// (verbs transport; QPs on a port that went down stop carrying traffic).
    PortChange {
        /// Port number (1-based).
        port: u32,
        /// Whether the port is now ACTIVE.
        active: bool,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the RDMA device failed; every object on it is unusable and
    /// the device must be closed and opened again (verbs transport).
    DeviceFatal,
}

// ---------------------------------------------------------------------------------------------
// Errors (one per operation)
// ---------------------------------------------------------------------------------------------

/// [`Device::open`] failed.
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

/// [`Device::alloc_pd`] failed.
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

/// [`Device::create_cq`] failed.
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
/// [`CompletionChannel::wait`] failed.
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

/// [`ProtectionDomain::reg_mr`] failed.
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

/// [`ProtectionDomain::create_qp`] failed.
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
    #[error("creating a UC QP: {detail}")]
    Device {
        /// Detail.
        detail: String,
    },
}

/// [`QueuePair::connect`] failed; the QP keeps its previous state.
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

/// Why one WR of a [`QueuePair::post_send`] list was rejected.
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

/// Why one WR of a [`QueuePair::post_recv`] list was rejected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PostRecvErrorKind {
    /// post_recv needs INIT, RTR, RTS or ERROR (in ERROR the WR is flushed at once).
    #[error("QP is {state}, post_recv needs INIT, RTR, RTS or ERROR")]
    InvalidState {
        /// Current state.
        state: QpState,
    },
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

// ---------------------------------------------------------------------------------------------
// Backend traits
// ---------------------------------------------------------------------------------------------

/// Object-safe traits a transport implements; the public handles wrap them.
///
/// Implementations must be `Send + Sync`: handles are shared between a control thread
/// (connect, teardown) and a poller thread (post, poll). Every method documents its contract on
/// the corresponding public handle method.
pub mod backend {
    use super::*;

    /// An opened device. See [`Device`].
    pub trait DeviceOps: Send + Sync + fmt::Debug {
        /// See [`Device::name`].
        fn name(&self) -> &str;
        /// See [`Device::kind`].
        fn kind(&self) -> TransportKind;
        /// See [`Device::port_attr`].
        fn port_attr(&self) -> PortAttr;
        /// See [`Device::alloc_pd`].
        fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError>;
        /// See [`Device::create_cq`].
        fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError>;
        /// See [`Device::create_comp_channel`].
        fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError>;
        /// See [`Device::poll_async_event`].
        fn poll_async_event(&self) -> Option<AsyncEvent>;
        /// See [`Device::stats`].
        fn stats(&self) -> DeviceStats;
    }

    /// A protection domain. See [`ProtectionDomain`].
    pub trait PdOps: Send + Sync + fmt::Debug {
        /// See [`ProtectionDomain::reg_mr`].
        fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError>;
        /// See [`ProtectionDomain::create_qp`].
        fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError>;
    }

    /// A registered memory region. See [`MemoryRegion`].
    pub trait MrOps: Send + Sync + fmt::Debug {
        /// See [`MemoryRegion::addr`].
        fn addr(&self) -> u64;
        /// See [`MemoryRegion::len`].
        fn length(&self) -> usize;
        /// See [`MemoryRegion::lkey`].
        fn lkey(&self) -> u32;
        /// See [`MemoryRegion::rkey`].
        fn rkey(&self) -> u32;
        /// See [`MemoryRegion::access`].
        fn access(&self) -> AccessFlags;
        /// See [`MemoryRegion::read_at`].
        fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError>;
        /// See [`MemoryRegion::write_at`].
        fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError>;
        /// For the owning transport to recover its concrete type.
        fn as_any(&self) -> &dyn Any;
    }

    /// A completion queue. See [`CompletionQueue`].
    pub trait CqOps: Send + Sync + fmt::Debug {
        /// See [`CompletionQueue::depth`].
        fn depth(&self) -> u32;
        /// See [`CompletionQueue::handle`].
        fn handle(&self) -> u32;
        /// See [`CompletionQueue::poll`].
        fn poll(&self, wcs: &mut [WorkCompletion]) -> usize;
        /// For the owning transport to recover its concrete type.
        fn as_any(&self) -> &dyn Any;
    }

    /// A completion channel. See [`CompletionChannel`].
    pub trait CompChannelOps: Send + Sync + fmt::Debug {
        /// See [`CompletionChannel::req_notify`].
        fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError>;
        /// See [`CompletionChannel::wait`].
        fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError>;
        /// See [`CompletionChannel::wake`].
        fn wake(&self);
    }

    /// A UC queue pair. See [`QueuePair`].
    pub trait QpOps: Send + Sync + fmt::Debug {
        /// See [`QueuePair::qp_num`].
        fn qp_num(&self) -> u32;
        /// See [`QueuePair::state`].
        fn state(&self) -> QpState;
        /// See [`QueuePair::local_endpoint`].
        fn local_endpoint(&self) -> QpEndpoint;
        /// See [`QueuePair::connect`].
        fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError>;
        /// See [`QueuePair::modify_to_error`].
        fn modify_to_error(&self);
        /// See [`QueuePair::post_send`].
        fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError>;
        /// See [`QueuePair::post_recv`].
        fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError>;
        /// See [`QueuePair::stats`].
        fn stats(&self) -> QpStats;
    }
}

use backend::{CompChannelOps, CqOps, DeviceOps, MrOps, PdOps, QpOps};

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// Which device to open. Agent and collector map their YAML `transport:` section to this.
#[derive(Clone, Debug)]
pub enum DeviceConfig {
    /// The soft transport: RoCEv2 UC over a UDP socket.
    Soft(crate::soft::device::SoftConfig),
    /// The verbs transport.
    Verbs(VerbsConfig),
}

/// Configuration of the verbs transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// RDMA device name (`ibv_get_device_name`, e.g. `mlx5_0`, `rxe0`); `None` = the first.
    pub device: Option<String>,
    /// Port number (1-based, `ibv_query_port`).
    pub port_num: u8,
    /// GID table index; `None` = the RoCE v2 GID of `local_ip` (or the first RoCE v2 GID).
    pub gid_index: Option<u8>,
    /// Local IP address whose RoCE v2 GID to use when `gid_index` is `None`.
    pub local_ip: Option<IpAddr>,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            device: None,
            port_num: 1,
            gid_index: None,
            local_ip: None,
        }
    }
}

/// Attributes of a new UC QP (`struct ibv_qp_init_attr` + the INIT access flags).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// CQ receiving send completions.
    pub send_cq: &'a CompletionQueue,
    /// CQ receiving receive completions. Size it ≥ `max_recv_wr` and poll it fast: an overflow
    /// moves the QP to ERROR.
    pub recv_cq: &'a CompletionQueue,
    /// Send queue depth: outstanding (not yet on the wire) send WRs.
    pub max_send_wr: u32,
    /// Receive queue depth: posted, not yet consumed receive WRs.
    pub max_recv_wr: u32,
    /// QP access flags set in INIT (`qp_access_flags`): REMOTE_WRITE to accept inbound RDMA
    /// WRITE; without it inbound writes are dropped (`access_denied`).
    pub access: AccessFlags,
    /// Largest path MTU this QP offers in its endpoint; `None` = the port's active MTU.
    pub max_mtu: Option<Mtu>,
}

// ---------------------------------------------------------------------------------------------
// Public handles
// ---------------------------------------------------------------------------------------------

/// An opened transport device (`struct ibv_context` + port). Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<dyn DeviceOps>,
}

impl Device {
    /// Opens the device described by `config`.
    ///
    /// Soft: binds the UDP socket and, in [`crate::soft::device::ProgressMode::Thread`], starts
    /// the progress thread. Verbs: opens the named RDMA device.
    ///
    /// # Errors
    /// [`OpenError::Unsupported`] when the transport is not built in, [`OpenError::Io`] when the
    /// socket/device cannot be opened, [`OpenError::InvalidConfig`] for inconsistent settings.
    pub fn open(config: &DeviceConfig) -> Result<Device, OpenError> {
        match config {
            DeviceConfig::Soft(cfg) => crate::soft::device::SoftDevice::open(cfg).map(Device::from),
            #[cfg(feature = "verbs")]
            DeviceConfig::Verbs(cfg) => crate::verbs::open(cfg),
            #[cfg(not(feature = "verbs"))]
            #[cfg(feature = "verbs")]
            DeviceConfig::Verbs(cfg) => crate::verbs::open(cfg),
            #[cfg(not(feature = "verbs"))]
            DeviceConfig::Verbs(_) => Err(OpenError::Unsupported {
                kind: TransportKind::Verbs,
                detail: "the verbs transport is not built into this binary (cargo feature \
                         `verbs`)"
                    .to_owned(),
            }),
        }
    }

    /// Wraps a transport's device implementation.
    pub fn from_backend(inner: Arc<dyn DeviceOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn DeviceOps> {
        &self.inner
    }

    /// Device name (`rxe0`, `mlx5_0`, or the soft device's configured name).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Which transport this is.
    pub fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    /// Port attributes: GID, active MTU, maximum message size, UDP address.
    pub fn port_attr(&self) -> PortAttr {
        self.inner.port_attr()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`AllocPdError`] when the device refuses.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, AllocPdError> {
        Ok(ProtectionDomain {
            inner: self.inner.alloc_pd()?,
        })
    }

    /// Creates a completion queue holding up to `depth` completions (`ibv_create_cq`).
    ///
    /// A full CQ does not block the transport: the completion that does not fit is lost and the
    /// QP that produced it moves to ERROR ([`AsyncEvent::CqError`] + [`AsyncEvent::QpFatal`]).
    ///
    /// # Errors
    /// [`CreateCqError::InvalidDepth`] for 0 or above the device maximum.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, CreateCqError> {
        Ok(CompletionQueue {
            inner: self.inner.create_cq(depth)?,
        })
    }

    /// Creates a completion channel (`ibv_create_comp_channel`): a thread blocks on it until
    /// one of the CQs it armed with [`CompletionChannel::req_notify`] receives a completion,
    /// so a poller sleeps while there is nothing to do instead of spinning.
    ///
    /// # Errors
    /// [`CompChannelError::Device`] when the OS refuses (out of file descriptors).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, CompChannelError> {
        Ok(CompletionChannel {
            inner: self.inner.create_comp_channel()?,
        })
    }

    /// Takes the oldest pending asynchronous event, if any (non-blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.poll_async_event()
    }

    /// Device-wide counters (drops before a QP is known, packets in and out).
    pub fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

/// A protection domain (`struct ibv_pd`). MRs and QPs of one PD work together.
#[derive(Clone, Debug)]
pub struct ProtectionDomain {
    inner: Arc<dyn PdOps>,
}

impl ProtectionDomain {
    /// Wraps a transport's PD implementation.
    pub fn from_backend(inner: Arc<dyn PdOps>) -> Self {
        Self { inner }
    }

    /// Allocates `len` zeroed bytes and registers them (`ibv_reg_mr`) with `access`.
    ///
    /// The region's remote address is [`MemoryRegion::addr`]; offsets in [`Sge`] and in
    /// `read_at`/`write_at` are relative to it. The region is deregistered when the last clone
    /// of the handle is dropped; WRs still referencing it then complete with
    /// [`WcStatus::LocalProtectionError`] and inbound writes to it are dropped (`bad_rkey`).
    ///
    /// # Errors
    /// [`RegMrError::InvalidLength`] for 0 or too large, [`RegMrError::InvalidAccess`] for
    /// REMOTE_WRITE without LOCAL_WRITE, [`RegMrError::TooMany`] when keys run out.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion, RegMrError> {
        Ok(MemoryRegion {
            inner: self.inner.reg_mr(len, access)?,
        })
    }

    /// Creates a UC QP and moves it to INIT with `attr.access` (so receive WRs can be posted
    /// before [`QueuePair::connect`]). Its initial send PSN is random (24 bits).
    ///
    /// # Errors
    /// [`CreateQpError::InvalidDepth`], [`CreateQpError::ForeignCq`] when a CQ belongs to
    /// another device, [`CreateQpError::NoQpn`].
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair, CreateQpError> {
        Ok(QueuePair {
            inner: self.inner.create_qp(attr)?,
        })
    }
}

/// A registered memory region (`struct ibv_mr`) that owns its bytes. Cheap to clone (shared).
///
/// The transport (the "NIC") may write into the region at any time while the owner reads it;
/// [`MemoryRegion::read_at`] returns a snapshot of the bytes. Use RDMA WRITE_WITH_IMM so that
/// the receive completion tells when a slot is complete, and check the frame's own sequence and
/// CRC (DESIGN.md §4).
#[derive(Clone, Debug)]
pub struct MemoryRegion {
    inner: Arc<dyn MrOps>,
}

impl MemoryRegion {
    /// Wraps a transport's MR implementation.
    pub fn from_backend(inner: Arc<dyn MrOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn MrOps> {
        &self.inner
    }

    /// Virtual address of byte 0, as the remote side puts it in RETH.
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.length()
    }

    /// Whether the region is empty (never true for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key, used by [`Sge`] (implicitly through the handle).
    pub fn lkey(&self) -> u32 {
        self.inner.lkey()
    }

    /// Remote key the peer puts in RETH. Meaningful only with [`AccessFlags::REMOTE_WRITE`].
    pub fn rkey(&self) -> u32 {
        self.inner.rkey()
    }

    /// Access flags the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.inner.access()
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    ///
    /// # Errors
    /// [`MemoryAccessError`] when `offset + out.len()` exceeds the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        self.inner.read_at(offset, out)
    }

    /// Copies `data` into the region starting at `offset`.
    ///
    /// # Errors
    /// [`MemoryAccessError`] when `offset + data.len()` exceeds the region.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.inner.write_at(offset, data)
    }
}

/// A completion queue (`struct ibv_cq`). Cheap to clone (shared); `Send + Sync`.
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    inner: Arc<dyn CqOps>,
}

impl CompletionQueue {
    /// Wraps a transport's CQ implementation.
    pub fn from_backend(inner: Arc<dyn CqOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn CqOps> {
        &self.inner
    }

    /// Capacity in completions.
    pub fn depth(&self) -> u32 {
        self.inner.depth()
    }

    /// A number identifying this CQ within its device (used by [`AsyncEvent::CqError`]).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }

    /// Moves up to `wcs.len()` completions, oldest first, into `wcs` and returns how many
    /// (`ibv_poll_cq`). Never blocks.
    ///
    /// On the soft transport in busy-poll mode this call also drives the device (sends queued
    /// packets, receives and processes arrived ones) before taking completions.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        self.inner.poll(wcs)
    }
}

/// A completion channel (`struct ibv_comp_channel`): where a poller sleeps while its CQs are
/// empty. Cheap to clone (shared); `Send + Sync`.
///
/// The protocol is the one of ibv_get_cq_event(3), for any number of CQs of one device:
///
/// 1. poll every CQ until it is empty;
/// 2. [`req_notify`](CompletionChannel::req_notify) each CQ (one-shot: the next completion
///    added to it wakes the channel once);
/// 3. poll every CQ once more — a completion that arrived before the CQ was armed raises no
///    notification — and go back to 1 if any had one;
/// 4. [`wait`](CompletionChannel::wait), then go back to 1.
///
/// [`wake`](CompletionChannel::wake) makes a current or the next `wait` return at once, from
/// any thread (new work that is not a completion: a CQ to add, a shutdown).
///
/// Verbs: each CQ has its own `ibv_comp_channel`; `wait` sleeps in `poll(2)` on the channels
/// of the armed CQs and an eventfd, and takes and acknowledges their events. Soft: an armed
/// CQ signals the channel's eventfd when the device pushes a completion into it; on a device
/// in `busy_poll` mode `wait` also drives the device (it sleeps on the UDP socket).
#[derive(Clone, Debug)]
pub struct CompletionChannel {
    inner: Arc<dyn CompChannelOps>,
}

impl CompletionChannel {
    /// Wraps a transport's completion channel.
    pub fn from_backend(inner: Arc<dyn CompChannelOps>) -> Self {
        Self { inner }
    }

    /// Arms `cq` (`ibv_req_notify_cq(cq, 0)`): its next completion wakes this channel. One-shot;
    /// arming an armed CQ again is harmless.
    ///
    /// # Errors
    /// [`CompChannelError::ForeignCq`] for a CQ of another device; [`CompChannelError::Device`]
    /// when the device refuses.
    pub fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError> {
        self.inner.req_notify(cq)
    }

    /// Sleeps until an armed CQ received a completion, [`CompletionChannel::wake`] was called,
    /// or `timeout` passed. Returns `true` when woken (poll the CQs), `false` on timeout.
    /// Consumes the notifications; CQs must be armed again before the next wait. A wake-up
    /// may be spurious; the caller re-polls anyway.
    ///
    /// # Errors
    /// [`CompChannelError::Device`] when waiting fails (not for timeouts or signals).
    pub fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError> {
        self.inner.wait(timeout)
    }

    /// Makes a current or the next [`CompletionChannel::wait`] return `true` at once.
    pub fn wake(&self) {
        self.inner.wake();
    }
}

/// A UC queue pair (`struct ibv_qp`). Cheap to clone (shared); `Send + Sync`; destroyed when the
/// last clone is dropped.
#[derive(Clone, Debug)]
pub struct QueuePair {
    inner: Arc<dyn QpOps>,
}

impl QueuePair {
    /// Wraps a transport's QP implementation.
    pub fn from_backend(inner: Arc<dyn QpOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn QpOps> {
        &self.inner
    }

    /// The QP number (24 bits).
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }

    /// Current state. A QP that moved to ERROR on its own also raised an
    /// [`AsyncEvent::QpFatal`].
    pub fn state(&self) -> QpState {
        self.inner.state()
    }

    /// What the peer needs to connect to this QP (send it over the control channel).
    pub fn local_endpoint(&self) -> QpEndpoint {
        self.inner.local_endpoint()
    }

    /// Connects to `remote`: INIT → RTR (dest QPN = `remote.qpn`, expected PSN = `remote.psn`,
    /// path MTU = min of both MTUs, address from `remote.gid` / `remote.udp_addr`) → RTS (send
    /// PSN = this QP's [`QpEndpoint::psn`]). UC needs nothing else: no timeout, retry counts or
    /// RD atomics (ibv_modify_qp(3) UC masks).
    ///
    /// # Errors
    /// [`ConnectError::InvalidState`] unless the QP is in INIT; [`ConnectError::InvalidEndpoint`]
    /// for a bad MTU/QPN/PSN; [`ConnectError::Modify`] when the transport refuses.
    pub fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        self.inner.connect(remote)
    }

    /// Moves the QP to ERROR (`ibv_modify_qp(IBV_QPS_ERR)`): outstanding WRs complete with
    /// [`WcStatus::WrFlushError`]. Use before tearing a connection down.
    pub fn modify_to_error(&self) {
        self.inner.modify_to_error()
    }

    /// Posts a list of send WRs (`ibv_post_send`).
    ///
    /// Rules: the QP must be in RTS; each SGE must lie inside an MR of this device; the message
    /// must not exceed [`PortAttr::max_msg_size`]; at most `max_send_wr` WRs may be outstanding
    /// (a WR stays outstanding until its last packet is on the wire). A signaled WR completes
    /// in the send CQ with [`WcOpcode::Send`] or [`WcOpcode::RdmaWrite`] once on the wire.
    ///
    /// # Errors
    /// [`PostSendError`] naming the first rejected WR (`posted` WRs before it were accepted):
    /// [`PostSendErrorKind::Full`] (cheap, retry later), `InvalidState`, `SgeOutOfBounds`,
    /// `ForeignMr`, `MessageTooLong`.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        self.inner.post_send(wrs)
    }

    /// Posts a list of receive WRs (`ibv_post_recv`).
    ///
    /// Rules: allowed in INIT, RTR, RTS and ERROR (in ERROR the WR is flushed); each SGE must
    /// lie inside an MR of this device registered with LOCAL_WRITE; at most `max_recv_wr` WRs
    /// may be posted. Inbound SENDs and RDMA WRITE_WITH_IMMs consume WRs in posting order.
    ///
    /// # Errors
    /// [`PostRecvError`] naming the first rejected WR: [`PostRecvErrorKind::Full`] (cheap),
    /// `InvalidState`, `SgeOutOfBounds`, `NoLocalWrite`, `ForeignMr`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        self.inner.post_recv(wrs)
    }

    /// Counters of this QP, including silent drops by [`UcDropReason`].
    pub fn stats(&self) -> QpStats {
        self.inner.stats()
    }
}

impl From<Arc<dyn DeviceOps>> for Device {
    fn from(inner: Arc<dyn DeviceOps>) -> Self {
        Self { inner }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_round_trips_ipv4_and_ipv6() {
        let v4: IpAddr = "10.99.0.2".parse().unwrap();
        let gid = gid_from_ip(v4);
        assert_eq!(&gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(ip_from_gid(gid), v4);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(ip_from_gid(gid_from_ip(v6)), v6);
    }

    #[test]
    fn endpoint_destination_defaults_to_roce_port() {
        let ep = QpEndpoint {
            gid: gid_from_ip("10.0.0.1".parse().unwrap()),
            qpn: 0x11,
            psn: 0,
            mtu: 1024,
            udp_addr: None,
        };
        assert_eq!(ep.destination(), "10.0.0.1:4791".parse().unwrap());
    }

    #[test]
    fn mtu_conversions() {
        assert_eq!(Mtu::from_bytes(1024), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(1000), None);
        assert_eq!(Mtu::at_most(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::at_most(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::at_most(100), None);
    }

    #[test]
    fn drop_reason_names_are_unique_label_values() {
        let mut names: Vec<&str> = UcDropReason::ALL.iter().map(|r| r.as_str()).collect();
        for n in &names {
            assert!(
                n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{n}"
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), UcDropReason::COUNT);
        for (i, r) in UcDropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn drop_counters_count_by_reason() {
        let mut c = DropCounters::default();
        c.inc(UcDropReason::PsnGap);
        c.add(UcDropReason::NoReceiveWr, 3);
        assert_eq!(c.get(UcDropReason::PsnGap), 1);
        assert_eq!(c.get(UcDropReason::NoReceiveWr), 3);
        assert_eq!(c.total(), 4);
        let m = c.merged(&c);
        assert_eq!(m.total(), 8);
    }

    #[test]
    fn access_flags_compose() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(a.contains(AccessFlags::REMOTE_WRITE));
        assert!(!AccessFlags::LOCAL_WRITE.contains(AccessFlags::REMOTE_WRITE));
        assert_eq!(a.bits(), 3);
        assert_eq!(format!("{a:?}"), "LOCAL_WRITE|REMOTE_WRITE");
    }
}
