//! The sans-IO RoCEv2 Unreliable Connection engine: one [`UcQp`] per queue pair.
//!
//! No sockets, no threads, no clock. The owner (the soft device, or a test wiring two engines
//! back to back) feeds inbound packets with [`UcQp::receive`] and pulls outbound packets with
//! [`UcQp::poll_transmit`]; memory goes through a [`MemoryTable`], completions through a
//! [`CompletionSink`]. UC has no timers (no ACK, no retransmission, no RNR retry: rxe arms its
//! retransmit and RNR timers only for RC QPs, `rxe_qp.c`), so the engine needs no `now` and
//! never asks to be woken.
//!
//! # Requester (IBTA 9.7.2, rxe `rxe_req.c`)
//!
//! A send WR is segmented at the path MTU into ONLY, or FIRST, MIDDLE…, LAST packets; FIRST and
//! MIDDLE carry exactly one MTU, LAST 1..=MTU bytes. RDMA WRITE puts a RETH (virtual address,
//! rkey, DMA length = message length) on its FIRST/ONLY packet; the immediate rides on the
//! LAST/ONLY packet. Every packet takes the next 24-bit PSN ([`Psn`], wrapping at 2^24; IBTA
//! 9.7.1). BTH bits are as rxe sends them on UC (checked against `rxe-uc-golden.pcap`): SE = 0,
//! M = 0, AckReq = 0, P_Key 0xffff. A WR completes (signaled: a WC in the send CQ) when its last packet is pulled.
//!
//! # Responder (IBTA 9.7.5 responder error classes D, D1 and G for UC; rxe `rxe_resp.c`)
//!
//! Checks run in rxe's order — PSN (`check_psn`), opcode sequence (`check_op_seq`), QP access
//! (`check_op_valid`), receive WR (`check_resource`), lengths (`check_length`), RETH
//! (`check_rkey`) — then the packet is executed:
//!
//! * PSN: a packet with the expected PSN continues; a FIRST/ONLY with another PSN resyncs (the
//!   responder adopts it); a MIDDLE/LAST with another PSN dooms its message (`psn_gap`), and
//!   the rest of the message is discarded until the next FIRST/ONLY.
//! * A FIRST/ONLY arriving while a message is being assembled (its LAST was lost) discards the
//!   partial message (`cut_short`) and reuses its receive WR (nothing was consumed), then is
//!   processed as the start of a new message. *Deviation from rxe:* rxe's
//!   `do_class_d1e_error()` also drops the interrupting packet, and for an RDMA WRITE in
//!   progress (no receive WR held) it does not reset `resp.opcode`, so later FIRST/ONLY packets
//!   keep failing `check_op_seq`. The engine follows the IBTA text rxe's comment quotes ("This
//!   packet may be the start of a new message and could be valid") and DESIGN.md §2.
//! * SEND (all packets) and WRITE LAST/ONLY_WITH_IMMEDIATE need a posted receive WR; with none
//!   the message is dropped silently (`no_receive_wr`; UC has no RNR NAK). WRITE_WITH_IMM may
//!   use a zero-length receive WR.
//! * RDMA WRITE needs REMOTE_WRITE on the QP and on the MR, a known rkey and
//!   `va + dma_len` inside the MR (`access_denied`, `bad_rkey`, `out_of_bounds`); a zero-length
//!   WRITE skips the rkey check (rxe: "A zero-byte op is not required to set an addr or
//!   rkey"). Data is placed packet by packet, as a NIC does; a dropped multi-packet WRITE may
//!   have placed its earlier packets.
//! * Lengths: ONLY ≤ MTU, FIRST/MIDDLE = MTU, LAST 1..=MTU, WRITE payloads consistent with the
//!   RETH DMA length, DMA length ≤ 2^31 (`bad_length`).
//! * A SEND longer than its receive buffer: as rxe, the WR completes with
//!   [`WcStatus::LocalQpOperationError`] and the QP moves to ERROR (`message_too_long`).
//! * Receive CQ overflow: the WR is consumed, its completion lost, the QP moves to ERROR
//!   (`cq_overflow`, IBTA class G).
//!
//! Drops are counted per message (see [`UcDropReason`]); the packets of an already doomed
//! message are counted in [`QpStats::packets_discarded`].

use std::collections::VecDeque;
use std::fmt;

use crate::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, SendOpcode, UcDropReason, WcOpcode, WcStatus,
    WorkCompletion, IBTA_MAX_MSG_SIZE, QPN_MASK,
};
use crate::soft::memory::{LocalAccessError, MemoryTable};
use crate::soft::packet::{
    pad_for, BthRepr, ImmDt, Opcode, PacketRepr, RethRepr, DEFAULT_PKEY, ICRC_LEN,
};
use crate::soft::psn::Psn;

/// Where completions go: a CQ of the device, or a test vector.
pub trait CompletionSink {
    /// Adds `wc`.
    ///
    /// # Errors
    /// [`CqFull`] when the queue holds its capacity; the completion is lost and the caller's
    /// QP moves to ERROR.
    fn push(&mut self, wc: WorkCompletion) -> Result<(), CqFull>;
}

/// The CQ was full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqFull;

/// A bounded in-memory completion queue, the [`CompletionSink`] tests use.
#[derive(Clone, Debug, Default)]
pub struct VecCq {
    /// Completions, oldest first.
    pub wcs: VecDeque<WorkCompletion>,
    /// Capacity.
    pub depth: usize,
}

impl VecCq {
    /// An empty queue holding at most `depth` completions.
    pub fn new(depth: usize) -> Self {
        Self {
            wcs: VecDeque::new(),
            depth,
        }
    }

    /// Takes the oldest completion.
    pub fn pop(&mut self) -> Option<WorkCompletion> {
        self.wcs.pop_front()
    }
}

impl CompletionSink for VecCq {
    fn push(&mut self, wc: WorkCompletion) -> Result<(), CqFull> {
        if self.wcs.len() >= self.depth {
            return Err(CqFull);
        }
        self.wcs.push_back(wc);
        Ok(())
    }
}

/// A resolved scatter/gather element: `length` bytes at `offset` of the region `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSge {
    /// The region's lkey.
    pub lkey: u32,
    /// Byte offset in the region.
    pub offset: usize,
    /// Length in bytes.
    pub length: u32,
}

/// A send WR as queued in the send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWqe {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Operation.
    pub opcode: SendOpcode,
    /// Local data (`None` = zero-length message).
    pub sge: Option<LocalSge>,
    /// Produce a send completion.
    pub signaled: bool,
}

impl SendWqe {
    fn length(&self) -> u32 {
        self.sge.map_or(0, |s| s.length)
    }
}

/// A receive WR as queued in the receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWqe {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Receive buffer (`None` = zero-length WR).
    pub sge: Option<LocalSge>,
}

/// QP sizes and access, fixed at creation / INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UcQpConfig {
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

/// The RTR attributes of a UC QP (ibv_modify_qp(3): `IBV_QP_AV | PATH_MTU | DEST_QPN |
/// RQ_PSN`; the address vector is the device's business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// First PSN expected from the peer (its low 24 bits, as in a BTH).
    pub rq_psn: u32,
    /// Path MTU.
    pub path_mtu: Mtu,
}

/// A state transition was not allowed (IBTA 10.3.1 QP state diagram).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("QP {qpn:#08x}: transition {from} -> {to} not allowed")]
pub struct ModifyError {
    /// QP number.
    pub qpn: u32,
    /// Current state.
    pub from: QpState,
    /// Requested state.
    pub to: QpState,
}

/// Why the engine refused a WR (the device adds the list position).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostRefusal {
    /// The QP state does not allow it.
    State(QpState),
    /// The queue is full; the depth.
    Full(u32),
    /// Message longer than [`IBTA_MAX_MSG_SIZE`].
    TooLong(u32),
}

/// Why the engine refused a receive WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvRefusal {
    /// The QP is in RESET.
    State(QpState),
    /// The queue is full; the depth.
    Full(u32),
}

/// What happened to one inbound packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// Accepted; its message continues.
    Accepted,
    /// Its message completed (data placed; a receive WC posted when one is due).
    Completed,
    /// Its message was dropped and counted under this reason.
    Dropped(UcDropReason),
    /// Discarded as part of a message that was already dropped.
    Discarded,
}

/// What one pulled packet was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxInfo {
    /// Its opcode.
    pub opcode: Opcode,
    /// Its PSN.
    pub psn: u32,
    /// Payload bytes.
    pub payload_len: u32,
}

/// Message being assembled by the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inbound {
    /// A SEND; bytes already scattered into the head receive WR.
    Send { received: u32 },
    /// An RDMA WRITE: next virtual address, rkey, bytes still expected, total DMA length.
    Write {
        va: u64,
        rkey: u32,
        resid: u32,
        length: u32,
    },
}

/// One UC queue pair: requester, responder and state machine.
pub struct UcQp {
    cfg: UcQpConfig,
    state: QpState,
    access: AccessFlags,
    dest_qpn: u32,
    mtu: u32,
    // requester
    sq: VecDeque<SendWqe>,
    sq_psn: Psn,
    sq_sent: u32,
    // responder
    rq: VecDeque<RecvWqe>,
    epsn: Psn,
    drop_msg: bool,
    inbound: Option<Inbound>,
    // bookkeeping
    stats: QpStats,
    error_cause: Option<QpErrorCause>,
    pending_event: Option<QpErrorCause>,
    cq_overflowed: bool,
}

impl fmt::Debug for UcQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcQp")
            .field("qpn", &format_args!("{:#08x}", self.cfg.qpn))
            .field("state", &self.state)
            .field("dest_qpn", &format_args!("{:#08x}", self.dest_qpn))
            .field("mtu", &self.mtu)
            .field("sq", &self.sq.len())
            .field("sq_psn", &format_args!("{}", self.sq_psn))
            .field("rq", &self.rq.len())
            .field("epsn", &format_args!("{}", self.epsn))
            .field("drop_msg", &self.drop_msg)
            .finish_non_exhaustive()
    }
}

/// Whether a BTH P_Key matches the default partition: equal low 15 bits and at least one side
/// a full member (IBTA 10.9.3; rxe `pkey_match`).
fn pkey_matches(pkey: u16) -> bool {
    (pkey & 0x7fff) == (DEFAULT_PKEY & 0x7fff) && (pkey & 0x8000 != 0 || DEFAULT_PKEY & 0x8000 != 0)
}

impl UcQp {
    /// A QP in RESET.
    pub fn new(cfg: UcQpConfig) -> Self {
        Self {
            cfg: UcQpConfig {
                qpn: cfg.qpn & QPN_MASK,
                ..cfg
            },
            state: QpState::Reset,
            access: AccessFlags::NONE,
            dest_qpn: 0,
            mtu: Mtu::Mtu1024.bytes(),
            sq: VecDeque::new(),
            sq_psn: Psn::ZERO,
            sq_sent: 0,
            rq: VecDeque::new(),
            epsn: Psn::ZERO,
            drop_msg: false,
            inbound: None,
            stats: QpStats::default(),
            error_cause: None,
            pending_event: None,
            cq_overflowed: false,
        }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The peer's QP number (valid from RTR).
    pub fn dest_qpn(&self) -> u32 {
        self.dest_qpn
    }

    /// Path MTU in bytes (valid from RTR).
    pub fn path_mtu(&self) -> u32 {
        self.mtu
    }

    /// Next PSN the requester sends (24 bits).
    pub fn sq_psn(&self) -> u32 {
        self.sq_psn.value()
    }

    /// Next PSN the responder expects (24 bits).
    pub fn expected_psn(&self) -> u32 {
        self.epsn.value()
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }

    /// Why the QP moved to ERROR on its own, if it did.
    pub fn error_cause(&self) -> Option<QpErrorCause> {
        self.error_cause
    }

    /// Takes the cause of an ERROR transition not yet reported (for an async event).
    pub fn take_error_event(&mut self) -> Option<QpErrorCause> {
        self.pending_event.take()
    }

    /// Takes whether a CQ overflow happened since the last call (for an async CQ event).
    pub fn take_cq_overflow(&mut self) -> bool {
        std::mem::take(&mut self.cq_overflowed)
    }

    /// Outstanding send WRs.
    pub fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// Posted receive WRs.
    pub fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// Whether [`UcQp::poll_transmit`] may produce a packet.
    pub fn wants_transmit(&self) -> bool {
        self.state == QpState::Rts && !self.sq.is_empty()
    }

    /// Whether the QP is in ERROR with WRs still to flush.
    pub fn needs_flush(&self) -> bool {
        self.state == QpState::Error && !(self.sq.is_empty() && self.rq.is_empty())
    }

    /// Counts a drop detected outside the engine (e.g. a source address mismatch).
    pub fn count_drop(&mut self, reason: UcDropReason) {
        self.stats.packets_received += 1;
        self.stats.drops.inc(reason);
    }

    // -- state machine -----------------------------------------------------------------------

    fn transition_error(&self, to: QpState) -> ModifyError {
        ModifyError {
            qpn: self.cfg.qpn,
            from: self.state,
            to,
        }
    }

    /// RESET → INIT with the QP access flags (`qp_access_flags`).
    ///
    /// # Errors
    /// [`ModifyError`] unless in RESET.
    pub fn modify_to_init(&mut self, access: AccessFlags) -> Result<(), ModifyError> {
        if self.state != QpState::Reset {
            return Err(self.transition_error(QpState::Init));
        }
        self.access = access;
        self.state = QpState::Init;
        Ok(())
    }

    /// INIT → RTR: peer QPN, expected PSN, path MTU.
    ///
    /// # Errors
    /// [`ModifyError`] unless in INIT.
    pub fn modify_to_rtr(&mut self, attr: RtrAttr) -> Result<(), ModifyError> {
        if self.state != QpState::Init {
            return Err(self.transition_error(QpState::Rtr));
        }
        self.dest_qpn = attr.dest_qpn & QPN_MASK;
        self.epsn = Psn::new(attr.rq_psn);
        self.mtu = attr.path_mtu.bytes();
        self.drop_msg = false;
        self.inbound = None;
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR → RTS with the first send PSN (its low 24 bits).
    ///
    /// # Errors
    /// [`ModifyError`] unless in RTR.
    pub fn modify_to_rts(&mut self, sq_psn: u32) -> Result<(), ModifyError> {
        if self.state != QpState::Rtr {
            return Err(self.transition_error(QpState::Rts));
        }
        self.sq_psn = Psn::new(sq_psn);
        self.sq_sent = 0;
        self.state = QpState::Rts;
        Ok(())
    }

    /// Any state → ERROR on request (`ibv_modify_qp(IBV_QPS_ERR)`); WRs are flushed by
    /// [`UcQp::flush`]. No async event is raised for a requested transition.
    pub fn modify_to_error(&mut self) {
        self.state = QpState::Error;
        self.inbound = None;
        self.drop_msg = false;
    }

    /// Any state → RESET: queues are emptied without completions (ibverbs semantics).
    pub fn modify_to_reset(&mut self) {
        self.state = QpState::Reset;
        self.sq.clear();
        self.rq.clear();
        self.sq_sent = 0;
        self.inbound = None;
        self.drop_msg = false;
        self.error_cause = None;
        self.pending_event = None;
    }

    fn fail(&mut self, cause: QpErrorCause) {
        self.modify_to_error();
        if self.error_cause.is_none() {
            self.error_cause = Some(cause);
            self.pending_event = Some(cause);
        }
    }

    // -- posting -----------------------------------------------------------------------------

    /// Queues a send WR. Needs RTS and room in the send queue. SGE bounds and keys are checked
    /// by the caller (the device knows the MR); the engine re-resolves the lkey when it builds
    /// packets and completes the WR with [`WcStatus::LocalProtectionError`] if it is gone.
    ///
    /// # Errors
    /// [`PostRefusal`].
    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostRefusal> {
        if self.state != QpState::Rts {
            return Err(PostRefusal::State(self.state));
        }
        if self.sq.len() >= self.cfg.max_send_wr as usize {
            return Err(PostRefusal::Full(self.cfg.max_send_wr));
        }
        if wqe.length() > IBTA_MAX_MSG_SIZE {
            return Err(PostRefusal::TooLong(wqe.length()));
        }
        self.sq.push_back(wqe);
        Ok(())
    }

    /// Queues a receive WR. Allowed in INIT, RTR, RTS and ERROR (flushed by [`UcQp::flush`]).
    ///
    /// # Errors
    /// [`RecvRefusal`].
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), RecvRefusal> {
        if self.state == QpState::Reset {
            return Err(RecvRefusal::State(self.state));
        }
        if self.rq.len() >= self.cfg.max_recv_wr as usize {
            return Err(RecvRefusal::Full(self.cfg.max_recv_wr));
        }
        self.rq.push_back(wqe);
        Ok(())
    }

    /// In ERROR: completes queued WRs with [`WcStatus::WrFlushError`] (send queue into `scq`,
    /// receive queue into `rcq`) until a CQ is full. Returns whether everything was flushed.
    pub fn flush(&mut self, scq: &mut dyn CompletionSink, rcq: &mut dyn CompletionSink) -> bool {
        if self.state != QpState::Error {
            return true;
        }
        while let Some(w) = self.sq.front().copied() {
            let wc = WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus::WrFlushError,
                opcode: w.opcode.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: self.cfg.qpn,
            };
            if scq.push(wc).is_err() {
                return false;
            }
            self.sq.pop_front();
        }
        self.sq_sent = 0;
        while let Some(w) = self.rq.front().copied() {
            let wc = WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qp_num: self.cfg.qpn,
            };
            if rcq.push(wc).is_err() {
                return false;
            }
            self.rq.pop_front();
        }
        true
    }

    // -- requester ---------------------------------------------------------------------------

    /// Builds the next outbound packet into `out` (cleared first): BTH, RETH, ImmDt, payload,
    /// pad and a zero ICRC placeholder for the device to seal. Returns `None` when there is
    /// nothing to send (not RTS, empty send queue) or the head WR failed (its memory is gone:
    /// it completes with [`WcStatus::LocalProtectionError`] and the QP moves to ERROR).
    ///
    /// When the packet ends its WR, the WR leaves the send queue and, if signaled, completes
    /// into `scq`; a full `scq` moves the QP to ERROR (the packet is still returned).
    pub fn poll_transmit(
        &mut self,
        mem: &dyn MemoryTable,
        out: &mut Vec<u8>,
        scq: &mut dyn CompletionSink,
    ) -> Option<TxInfo> {
        out.clear();
        if self.state != QpState::Rts {
            return None;
        }
        let wqe = *self.sq.front()?;
        let total = wqe.length();
        let sent = self.sq_sent.min(total);
        let remaining = total - sent;
        let first = sent == 0;
        let last = remaining <= self.mtu;
        let payload_len = remaining.min(self.mtu);
        let (with_imm, is_write, reth, imm) = match wqe.opcode {
            SendOpcode::Send => (false, false, None, None),
            SendOpcode::SendWithImm { imm } => (true, false, None, Some(imm)),
            SendOpcode::RdmaWrite { remote_addr, rkey } => (
                false,
                true,
                Some(RethRepr {
                    virtual_addr: remote_addr,
                    rkey,
                    dma_len: total,
                }),
                None,
            ),
            SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (
                true,
                true,
                Some(RethRepr {
                    virtual_addr: remote_addr,
                    rkey,
                    dma_len: total,
                }),
                Some(imm),
            ),
        };
        let opcode = match (is_write, first, last, with_imm) {
            (false, true, true, false) => Opcode::SendOnly,
            (false, true, true, true) => Opcode::SendOnlyWithImmediate,
            (false, true, false, _) => Opcode::SendFirst,
            (false, false, false, _) => Opcode::SendMiddle,
            (false, false, true, false) => Opcode::SendLast,
            (false, false, true, true) => Opcode::SendLastWithImmediate,
            (true, true, true, false) => Opcode::RdmaWriteOnly,
            (true, true, true, true) => Opcode::RdmaWriteOnlyWithImmediate,
            (true, true, false, _) => Opcode::RdmaWriteFirst,
            (true, false, false, _) => Opcode::RdmaWriteMiddle,
            (true, false, true, false) => Opcode::RdmaWriteLast,
            (true, false, true, true) => Opcode::RdmaWriteLastWithImmediate,
        };
        let pad = pad_for(payload_len as usize);
        let bth = BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: pad,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: self.dest_qpn,
            ack_req: false,
            psn: self.sq_psn,
        };
        let Ok(bth_bytes) = bth.to_bytes() else {
            // dest_qpn and psn are masked to 24 bits, so this cannot fail; treat it as a local
            // QP operation error if it ever does.
            self.complete_send_error(WcStatus::LocalQpOperationError, scq);
            return None;
        };
        out.extend_from_slice(&bth_bytes);
        if opcode.has_reth() {
            if let Some(r) = reth {
                r.emit(out);
            }
        }
        if opcode.has_immdt() {
            if let Some(i) = imm {
                out.extend_from_slice(&ImmDt(i).to_bytes());
            }
        }
        let start = out.len();
        out.resize(
            start + payload_len as usize + usize::from(pad) + ICRC_LEN,
            0,
        );
        if payload_len > 0 {
            let gathered = match (wqe.sge, out.get_mut(start..start + payload_len as usize)) {
                (Some(sge), Some(dst)) => match sge.offset.checked_add(sent as usize) {
                    Some(off) => mem.gather(sge.lkey, off, dst),
                    None => Err(LocalAccessError::OutOfBounds),
                },
                _ => Err(LocalAccessError::OutOfBounds),
            };
            if gathered.is_err() {
                out.clear();
                self.complete_send_error(WcStatus::LocalProtectionError, scq);
                return None;
            }
        }
        let psn = self.sq_psn;
        self.sq_psn = psn.next();
        self.stats.packets_sent += 1;
        if last {
            self.sq.pop_front();
            self.sq_sent = 0;
            self.stats.messages_sent += 1;
            if wqe.signaled {
                let wc = WorkCompletion {
                    wr_id: wqe.wr_id,
                    status: WcStatus::Success,
                    opcode: wqe.opcode.wc_opcode(),
                    byte_len: total,
                    imm: None,
                    qp_num: self.cfg.qpn,
                };
                if scq.push(wc).is_err() {
                    self.cq_overflowed = true;
                    self.fail(QpErrorCause::SendCqOverflow);
                }
            }
        } else {
            self.sq_sent = sent + payload_len;
        }
        Some(TxInfo {
            opcode,
            psn: psn.value(),
            payload_len,
        })
    }

    fn complete_send_error(&mut self, status: WcStatus, scq: &mut dyn CompletionSink) {
        if let Some(w) = self.sq.pop_front() {
            let wc = WorkCompletion {
                wr_id: w.wr_id,
                status,
                opcode: w.opcode.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: self.cfg.qpn,
            };
            if scq.push(wc).is_err() {
                self.cq_overflowed = true;
            }
        }
        self.sq_sent = 0;
        self.fail(QpErrorCause::LocalProtection);
    }

    // -- responder ---------------------------------------------------------------------------

    fn drop_message(&mut self, reason: UcDropReason) -> RxOutcome {
        self.inbound = None;
        self.drop_msg = true;
        self.stats.drops.inc(reason);
        RxOutcome::Dropped(reason)
    }

    /// Processes one inbound packet addressed to this QP (already ICRC-checked and demultiplexed
    /// by destination QPN). See the module docs for the rules.
    pub fn receive(
        &mut self,
        pkt: &PacketRepr<'_>,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RxOutcome {
        self.stats.packets_received += 1;
        match self.state {
            QpState::Rtr | QpState::Rts => {}
            QpState::Reset | QpState::Init => {
                self.stats.drops.inc(UcDropReason::QpNotReady);
                return RxOutcome::Dropped(UcDropReason::QpNotReady);
            }
            QpState::Error => {
                self.stats.drops.inc(UcDropReason::QpError);
                return RxOutcome::Dropped(UcDropReason::QpError);
            }
        }
        if !pkey_matches(pkt.bth.pkey) {
            self.stats.drops.inc(UcDropReason::BadPkey);
            return RxOutcome::Dropped(UcDropReason::BadPkey);
        }
        let op = pkt.bth.opcode;
        let psn = pkt.bth.psn;
        let start = op.is_start();

        // check_psn (UC): resync on FIRST/ONLY, doom the message otherwise.
        let psn_ok = psn == self.epsn;
        if self.drop_msg || !psn_ok {
            if start {
                if !psn_ok {
                    self.stats.psn_resyncs += 1;
                }
                self.drop_msg = false;
            } else if self.drop_msg {
                self.epsn = psn.next();
                self.stats.packets_discarded += 1;
                return RxOutcome::Discarded;
            } else {
                self.epsn = psn.next();
                return self.drop_message(UcDropReason::PsnGap);
            }
        }
        // From here on the packet has taken its place in the PSN sequence; the next expected
        // PSN follows it whether or not the message survives (so that `psn_resyncs` counts
        // only PSNs missing on the wire).
        self.epsn = psn.next();

        // check_op_seq (UC).
        match (self.inbound, start) {
            (Some(_), true) => {
                // The message in progress lost its LAST: discard it, reuse its receive WR
                // (nothing was consumed), and treat this packet as a new message.
                self.inbound = None;
                self.stats.drops.inc(UcDropReason::CutShort);
            }
            (Some(Inbound::Send { .. }), false) if !op.is_send() => {
                return self.drop_message(UcDropReason::OpcodeSequence);
            }
            (Some(Inbound::Write { .. }), false) if !op.is_write() => {
                return self.drop_message(UcDropReason::OpcodeSequence);
            }
            (None, false) => return self.drop_message(UcDropReason::OpcodeSequence),
            _ => {}
        }

        // check_op_valid (UC): RDMA WRITE needs REMOTE_WRITE on the QP.
        if op.is_write() && !self.access.contains(AccessFlags::REMOTE_WRITE) {
            return self.drop_message(UcDropReason::AccessDenied);
        }

        // check_resource: SEND packets and WRITE LAST/ONLY_WITH_IMMEDIATE need a receive WR.
        let needs_rwr = op.is_send() || (op.is_write() && op.has_immdt());
        if needs_rwr && self.rq.is_empty() {
            return self.drop_message(UcDropReason::NoReceiveWr);
        }

        // check_length.
        let len = pkt.payload.len();
        let mtu = self.mtu as usize;
        let len_ok = if op.is_only() {
            len <= mtu
        } else if op.is_first() || op.is_middle() {
            len == mtu
        } else {
            len != 0 && len <= mtu
        };
        if !len_ok {
            return self.drop_message(UcDropReason::BadLength);
        }
        let len = len as u32;

        // check_rkey (WRITE): RETH on FIRST/ONLY, then per-packet length against the rest.
        if op.is_write() {
            if op.has_reth() {
                let Some(reth) = pkt.reth else {
                    return self.drop_message(UcDropReason::BadLength);
                };
                if reth.dma_len > IBTA_MAX_MSG_SIZE {
                    return self.drop_message(UcDropReason::BadLength);
                }
                if reth.dma_len != 0 {
                    if let Err(reason) = mem.check_remote_write(
                        reth.rkey,
                        reth.virtual_addr,
                        u64::from(reth.dma_len),
                    ) {
                        return self.drop_message(reason);
                    }
                }
                self.inbound = Some(Inbound::Write {
                    va: reth.virtual_addr,
                    rkey: reth.rkey,
                    resid: reth.dma_len,
                    length: reth.dma_len,
                });
            }
            let Some(Inbound::Write {
                va,
                rkey,
                resid,
                length,
            }) = self.inbound
            else {
                return self.drop_message(UcDropReason::OpcodeSequence);
            };
            let consistent = if resid > self.mtu {
                len == self.mtu
            } else {
                len == resid
            };
            if !consistent {
                return self.drop_message(UcDropReason::BadLength);
            }
            // execute: place the payload.
            if len > 0 {
                if let Err(reason) = mem.remote_write(rkey, va, pkt.payload) {
                    return self.drop_message(reason);
                }
            }
            let resid = resid - len;
            self.inbound = Some(Inbound::Write {
                va: va.wrapping_add(u64::from(len)),
                rkey,
                resid,
                length,
            });
            if !op.is_end() {
                return RxOutcome::Accepted;
            }
            if resid != 0 {
                // An END packet before the DMA length was reached (rxe: length check).
                return self.drop_message(UcDropReason::BadLength);
            }
            self.inbound = None;
            if !op.has_immdt() {
                self.stats.messages_completed += 1;
                return RxOutcome::Completed;
            }
            let Some(wqe) = self.rq.pop_front() else {
                return self.drop_message(UcDropReason::NoReceiveWr);
            };
            let wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: length,
                imm: pkt.imm,
                qp_num: self.cfg.qpn,
            };
            return self.complete_recv(wc, rcq);
        }

        // SEND: scatter into the head receive WR.
        if start {
            self.inbound = Some(Inbound::Send { received: 0 });
        }
        let received = match self.inbound {
            Some(Inbound::Send { received }) => received,
            _ => return self.drop_message(UcDropReason::OpcodeSequence),
        };
        let Some(wqe) = self.rq.front().copied() else {
            return self.drop_message(UcDropReason::NoReceiveWr);
        };
        if len > 0 {
            let capacity = wqe.sge.map_or(0, |s| s.length);
            let fits = received.checked_add(len).is_some_and(|end| end <= capacity);
            let scattered = match wqe.sge {
                Some(sge) if fits => match sge.offset.checked_add(received as usize) {
                    Some(off) => mem
                        .scatter(sge.lkey, off, pkt.payload)
                        .map_err(|_| UcDropReason::BadReceiveWr),
                    None => Err(UcDropReason::BadReceiveWr),
                },
                _ => Err(UcDropReason::MessageTooLong),
            };
            if let Err(reason) = scattered {
                // rxe: copy_data fails → RESPST_ERR_MALFORMED_WQE → class A: the WR completes
                // with IBV_WC_LOC_QP_OP_ERR and the QP moves to ERROR.
                self.rq.pop_front();
                self.inbound = None;
                self.stats.drops.inc(reason);
                let wc = WorkCompletion {
                    wr_id: wqe.wr_id,
                    status: WcStatus::LocalQpOperationError,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                };
                if rcq.push(wc).is_err() {
                    self.cq_overflowed = true;
                }
                self.fail(if reason == UcDropReason::MessageTooLong {
                    QpErrorCause::MessageTooLong
                } else {
                    QpErrorCause::BadReceiveWr
                });
                return RxOutcome::Dropped(reason);
            }
        }
        let received = received + len;
        if !op.is_end() {
            self.inbound = Some(Inbound::Send { received });
            return RxOutcome::Accepted;
        }
        self.inbound = None;
        self.rq.pop_front();
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: received,
            imm: pkt.imm,
            qp_num: self.cfg.qpn,
        };
        self.complete_recv(wc, rcq)
    }

    fn complete_recv(&mut self, wc: WorkCompletion, rcq: &mut dyn CompletionSink) -> RxOutcome {
        if rcq.push(wc).is_err() {
            // IBTA class G / rxe RESPST_ERR_CQ_OVERFLOW: the WR is consumed, the completion
            // lost, the QP moves to ERROR.
            self.stats.drops.inc(UcDropReason::CqOverflow);
            self.cq_overflowed = true;
            self.fail(QpErrorCause::RecvCqOverflow);
            return RxOutcome::Dropped(UcDropReason::CqOverflow);
        }
        self.stats.messages_completed += 1;
        RxOutcome::Completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::memory::MrTable;

    fn connected(qpn: u32, dest: u32, psn: u32, epsn: u32, mtu: Mtu) -> UcQp {
        let mut qp = UcQp::new(UcQpConfig {
            qpn,
            max_send_wr: 16,
            max_recv_wr: 16,
        });
        qp.modify_to_init(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        qp.modify_to_rtr(RtrAttr {
            dest_qpn: dest,
            rq_psn: epsn,
            path_mtu: mtu,
        })
        .unwrap();
        qp.modify_to_rts(psn).unwrap();
        qp
    }

    #[test]
    fn state_machine_allows_only_the_uc_path() {
        let mut qp = UcQp::new(UcQpConfig {
            qpn: 7,
            max_send_wr: 1,
            max_recv_wr: 1,
        });
        assert!(qp
            .modify_to_rtr(RtrAttr {
                dest_qpn: 1,
                rq_psn: 0,
                path_mtu: Mtu::Mtu256
            })
            .is_err());
        assert!(qp.modify_to_rts(0).is_err());
        qp.modify_to_init(AccessFlags::NONE).unwrap();
        assert!(qp.modify_to_init(AccessFlags::NONE).is_err());
        assert_eq!(
            qp.post_send(SendWqe {
                wr_id: 1,
                opcode: SendOpcode::Send,
                sge: None,
                signaled: true
            }),
            Err(PostRefusal::State(QpState::Init))
        );
        qp.modify_to_rtr(RtrAttr {
            dest_qpn: 1,
            rq_psn: 0,
            path_mtu: Mtu::Mtu256,
        })
        .unwrap();
        qp.modify_to_rts(0).unwrap();
        assert_eq!(qp.state(), QpState::Rts);
        qp.modify_to_error();
        assert_eq!(qp.state(), QpState::Error);
        qp.modify_to_reset();
        assert_eq!(qp.state(), QpState::Reset);
    }

    #[test]
    fn zero_length_send_is_one_only_packet() {
        let mem = MrTable::new();
        let mut a = connected(1, 2, 10, 0, Mtu::Mtu256);
        let mut b = connected(2, 1, 0, 10, Mtu::Mtu256);
        let mut scq = VecCq::new(4);
        let mut rcq = VecCq::new(4);
        a.post_send(SendWqe {
            wr_id: 9,
            opcode: SendOpcode::SendWithImm { imm: 77 },
            sge: None,
            signaled: true,
        })
        .unwrap();
        b.post_recv(RecvWqe {
            wr_id: 5,
            sge: None,
        })
        .unwrap();
        let mut buf = Vec::new();
        let info = a.poll_transmit(&mem, &mut buf, &mut scq).unwrap();
        assert_eq!(info.opcode, Opcode::SendOnlyWithImmediate);
        let mut buf2 = Vec::new();
        assert!(a.poll_transmit(&mem, &mut buf2, &mut scq).is_none());
        assert!(buf2.is_empty());
        a.post_send(SendWqe {
            wr_id: 10,
            opcode: SendOpcode::Send,
            sge: None,
            signaled: false,
        })
        .unwrap();
        a.poll_transmit(&mem, &mut buf2, &mut scq).unwrap();
        let pkt = PacketRepr::parse(&buf).unwrap();
        assert_eq!(b.receive(&pkt, &mem, &mut rcq), RxOutcome::Completed);
        let wc = rcq.pop().unwrap();
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len, wc.imm),
            (5, WcOpcode::Recv, 0, Some(77))
        );
        assert_eq!(scq.pop().unwrap().wr_id, 9);
        assert!(scq.pop().is_none(), "unsignaled WR completes silently");
    }
}
