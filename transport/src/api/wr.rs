//! Work requests and completions: [`Sge`], [`SendWr`] / [`SendOpcode`], [`RecvWr`] and
//! [`WorkCompletion`] with its [`WcStatus`] and [`WcOpcode`] (`struct ibv_send_wr`,
//! `struct ibv_recv_wr`, `struct ibv_wc` of `libibverbs/verbs.h`, the UC subset).

use std::fmt;

use super::mr::MemoryRegion;

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
    /// `IBV_WC_RETRY_EXC_ERR`: RC only; the transport retry counter was used up (timeouts or
    /// PSN sequence NAKs). The QP is in ERROR afterwards.
    RetryExceededError,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RC only; the RNR retry counter was used up.
    RnrRetryExceededError,
    /// `IBV_WC_REM_INV_REQ_ERR`: RC only; the responder NAKed the request as invalid.
    RemoteInvalidRequestError,
    /// `IBV_WC_REM_ACCESS_ERR`: RC only; the responder NAKed a remote access error.
    RemoteAccessError,
    /// `IBV_WC_REM_OP_ERR`: RC only; the responder NAKed a remote operational error.
    RemoteOperationError,
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
            Self::RetryExceededError => "retry_exceeded_error",
            Self::RnrRetryExceededError => "rnr_retry_exceeded_error",
            Self::RemoteInvalidRequestError => "remote_invalid_request_error",
            Self::RemoteAccessError => "remote_access_error",
            Self::RemoteOperationError => "remote_operation_error",
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
