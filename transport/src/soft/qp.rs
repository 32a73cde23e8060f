//! `QpCore`: what a UC queue pair ([`UcQp`](crate::soft::engine::UcQp)) and an RC queue
//! pair ([`RcQp`](crate::soft::rc::RcQp)) share, and the WR, CQ and error types of both.
//!
//! Both engines hold one `QpCore` and keep only what differs: UC its resync-and-drop responder
//! and its one-pass requester; RC its PSN window, ACK/NAK, retransmission and RNR timers.
//! The core holds
//!
//! * the QP state machine of IBTA 10.3.1 as `ibv_modify_qp(3)` drives it: RESET → INIT (QP
//!   access flags) → RTR (peer QPN, expected PSN, path MTU) → RTS, any state → ERROR or RESET
//!   (rxe `rxe_qp.c`, `rxe_qp_from_attr()`); a transition off the path is a [`ModifyError`];
//! * the post checks (`ibv_post_send(3)`: RTS, room, the IBTA message limit;
//!   `ibv_post_recv(3)`: not RESET, room), as rxe's `rxe_post_send()` / `post_one_recv()`;
//! * flush-to-error: in ERROR every queued WR completes with [`WcStatus::WrFlushError`]
//!   (IBTA 10.3.1, rxe `flush_send_queue()` / `flush_recv_queue()`);
//! * the async error event (`IBV_EVENT_QP_FATAL` with a [`QpErrorCause`]) of an ERROR
//!   transition the QP took on its own, and the CQ overflow flag (`IBV_EVENT_CQ_ERR`);
//! * the responder checks both transports run alike (rxe `rxe_resp.c`): the state and P_Key
//!   gate, `check_length`, the RETH check and placement of an RDMA WRITE (`check_rkey`,
//!   `write_data_in`), the scatter of a SEND into the head receive WR (`send_data_in`);
//! * the requester's segmentation at the path MTU and the request packet layout (rxe
//!   `rxe_req.c`: `next_opcode()`, `init_req_packet()`, `finish_packet()`), over either
//!   opcode set ([`BthOpcode`]).
//!
//! Counters of the shared kind ([`QpStats`]) live in the core; each transport adds its own.

use std::collections::VecDeque;

use crate::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, SendOpcode, UcDropReason, WcOpcode, WcStatus,
    WorkCompletion, IBTA_MAX_MSG_SIZE, QPN_MASK,
};
use crate::soft::memory::{LocalAccessError, MemoryTable};
use crate::soft::packet::{
    pad_for, BthOpcode, BthRepr, ImmDt, Opcode, RethRepr, DEFAULT_PKEY, ICRC_LEN,
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
    /// Message length in bytes (0 without an SGE).
    pub(crate) fn length(&self) -> u32 {
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

/// QP sizes, fixed at creation (`ibv_qp_init_attr.cap`), for UC and RC alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
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
    /// The QP takes its receive WRs from a shared receive queue (`ibv_post_recv` on such a
    /// QP fails with `EINVAL`): post to the SRQ.
    OnSrq,
}

/// An entry of a send queue: the WR itself (UC) or the WR with its PSN range (RC).
pub(crate) trait SendEntry: Copy {
    /// The work request.
    fn wqe(&self) -> &SendWqe;
}

impl SendEntry for SendWqe {
    fn wqe(&self) -> &SendWqe {
        self
    }
}

/// Message being assembled by the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inbound {
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

/// Why a request failed a responder check, by the class of its NAK on RC (IBTA 9.7.5.2.8):
/// an invalid request (opcode sequence, length) or a remote access error (rkey, access
/// rights, bounds). UC drops the message under the reason either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestFault {
    /// NAK invalid request on RC.
    Invalid(UcDropReason),
    /// NAK remote access error on RC.
    Access(UcDropReason),
}

impl RequestFault {
    /// The drop reason counted for it.
    pub(crate) fn reason(self) -> UcDropReason {
        match self {
            RequestFault::Invalid(r) | RequestFault::Access(r) => r,
        }
    }
}

/// An RDMA WRITE after one packet was placed: bytes still expected and the DMA length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WriteProgress {
    /// Bytes of the message still expected.
    pub(crate) resid: u32,
    /// DMA length of the whole message (the RETH's).
    pub(crate) length: u32,
}

/// Why a request packet could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BuildError {
    /// A BTH field out of range (cannot happen: fields are masked); a local QP operation
    /// error.
    Header,
    /// The WR's local memory is gone or too short; a local protection error.
    Memory,
}

/// Whether a BTH P_Key matches the default partition: equal low 15 bits and at least one side
/// a full member (IBTA 10.9.3; rxe `pkey_match`).
fn pkey_matches(pkey: u16) -> bool {
    (pkey & 0x7fff) == (DEFAULT_PKEY & 0x7fff) && (pkey & 0x8000 != 0 || DEFAULT_PKEY & 0x8000 != 0)
}

/// The QP error cause of a SEND that could not be scattered into its receive WR.
pub(crate) fn scatter_cause(reason: UcDropReason) -> QpErrorCause {
    if reason == UcDropReason::MessageTooLong {
        QpErrorCause::MessageTooLong
    } else {
        QpErrorCause::BadReceiveWr
    }
}

/// The receive WRs of a shared receive queue ([`crate::api::SharedReceiveQueue`]), which any
/// number of QPs of one device take from, oldest first (IBTA 10.2.9).
#[derive(Debug)]
pub(crate) struct SrqQueue {
    /// Capacity in WRs.
    pub(crate) max_wr: u32,
    pub(crate) wrs: std::sync::Mutex<VecDeque<RecvWqe>>,
}

impl SrqQueue {
    pub(crate) fn new(max_wr: u32) -> Self {
        Self {
            max_wr,
            wrs: std::sync::Mutex::new(VecDeque::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<RecvWqe>> {
        self.wrs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// WRs posted, not yet taken.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Queues a WR unless the SRQ holds `max_wr`.
    ///
    /// # Errors
    /// [`RecvRefusal::Full`] with the depth.
    pub(crate) fn post(&self, wqe: RecvWqe) -> Result<(), RecvRefusal> {
        let mut q = self.lock();
        if q.len() >= self.max_wr as usize {
            return Err(RecvRefusal::Full(self.max_wr));
        }
        q.push_back(wqe);
        Ok(())
    }

    fn pop(&self) -> Option<RecvWqe> {
        self.lock().pop_front()
    }
}

/// Where a QP's receive WRs come from: its own queue, or a shared receive queue. A QP on an
/// SRQ holds at most one WR of it at a time, `held`: taken at the first packet that needs one
/// and kept until its message completes (rxe `qp->resp.wqe` from `get_srq_wqe`); only that WR
/// is flushed when the QP moves to ERROR, the SRQ's own WRs stay for the other QPs.
#[derive(Clone, Debug)]
pub(crate) enum RecvQueue {
    /// `ibv_qp_init_attr.srq == NULL`.
    Own(VecDeque<RecvWqe>),
    /// On a shared receive queue.
    Shared {
        /// The SRQ.
        srq: std::sync::Arc<SrqQueue>,
        /// The WR this QP took and has not completed.
        held: Option<RecvWqe>,
    },
}

impl RecvQueue {
    /// The head WR, taking one from the SRQ into `held` when none is held.
    pub(crate) fn front(&mut self) -> Option<RecvWqe> {
        match self {
            RecvQueue::Own(q) => q.front().copied(),
            RecvQueue::Shared { srq, held } => {
                if held.is_none() {
                    *held = srq.pop();
                }
                *held
            }
        }
    }

    /// Takes the head WR (the held one first).
    pub(crate) fn pop_front(&mut self) -> Option<RecvWqe> {
        match self {
            RecvQueue::Own(q) => q.pop_front(),
            RecvQueue::Shared { srq, held } => held.take().or_else(|| srq.pop()),
        }
    }

    /// Whether no WR is available.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            RecvQueue::Own(q) => q.is_empty(),
            RecvQueue::Shared { srq, held } => held.is_none() && srq.len() == 0,
        }
    }

    /// WRs this QP could take (for its own queue: posted; on an SRQ: the held one plus the
    /// SRQ's).
    pub(crate) fn len(&self) -> usize {
        match self {
            RecvQueue::Own(q) => q.len(),
            RecvQueue::Shared { srq, held } => usize::from(held.is_some()) + srq.len(),
        }
    }

    /// Whether a QP in ERROR has no receive WR of its own left to flush.
    pub(crate) fn nothing_to_flush(&self) -> bool {
        match self {
            RecvQueue::Own(q) => q.is_empty(),
            RecvQueue::Shared { held, .. } => held.is_none(),
        }
    }

    /// The head WR to flush (never one still in the SRQ).
    fn flush_front(&self) -> Option<RecvWqe> {
        match self {
            RecvQueue::Own(q) => q.front().copied(),
            RecvQueue::Shared { held, .. } => *held,
        }
    }

    /// Forgets this QP's WRs (RESET); an SRQ's WRs stay.
    pub(crate) fn clear(&mut self) {
        match self {
            RecvQueue::Own(q) => q.clear(),
            RecvQueue::Shared { held, .. } => *held = None,
        }
    }
}

/// What UC and RC queue pairs share: state machine, queues, responder placement, error
/// bookkeeping and the shared counters. `W` is the send queue entry ([`SendEntry`]).
#[derive(Clone)]
pub(crate) struct QpCore<W> {
    pub(crate) cfg: QpConfig,
    pub(crate) state: QpState,
    pub(crate) access: AccessFlags,
    pub(crate) dest_qpn: u32,
    /// Path MTU in bytes.
    pub(crate) mtu: u32,
    pub(crate) sq: VecDeque<W>,
    pub(crate) rq: RecvQueue,
    /// Next PSN the responder expects.
    pub(crate) epsn: Psn,
    pub(crate) inbound: Option<Inbound>,
    pub(crate) stats: QpStats,
    pub(crate) error_cause: Option<QpErrorCause>,
    pending_event: Option<QpErrorCause>,
    pub(crate) cq_overflowed: bool,
}

impl<W: SendEntry> QpCore<W> {
    /// A QP in RESET; the QPN is masked to 24 bits.
    pub(crate) fn new(cfg: QpConfig) -> Self {
        Self {
            cfg: QpConfig {
                qpn: cfg.qpn & QPN_MASK,
                ..cfg
            },
            state: QpState::Reset,
            access: AccessFlags::NONE,
            dest_qpn: 0,
            mtu: Mtu::Mtu1024.bytes(),
            sq: VecDeque::new(),
            rq: RecvQueue::Own(VecDeque::new()),
            epsn: Psn::ZERO,
            inbound: None,
            stats: QpStats::default(),
            error_cause: None,
            pending_event: None,
            cq_overflowed: false,
        }
    }

    /// QP number.
    pub(crate) fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    /// Takes the cause of an ERROR transition not yet reported (for an async event).
    pub(crate) fn take_error_event(&mut self) -> Option<QpErrorCause> {
        self.pending_event.take()
    }

    /// Takes whether a CQ overflow happened since the last call.
    pub(crate) fn take_cq_overflow(&mut self) -> bool {
        std::mem::take(&mut self.cq_overflowed)
    }

    /// Whether the QP is in ERROR with WRs still to flush.
    pub(crate) fn needs_flush(&self) -> bool {
        self.state == QpState::Error && !(self.sq.is_empty() && self.rq.nothing_to_flush())
    }

    /// Counts a drop detected outside the engine (e.g. a source address mismatch).
    pub(crate) fn count_drop(&mut self, reason: UcDropReason) {
        self.stats.packets_received += 1;
        self.stats.drops.inc(reason);
    }

    // -- state machine -----------------------------------------------------------------------

    fn require(&self, from: QpState, to: QpState) -> Result<(), ModifyError> {
        if self.state == from {
            Ok(())
        } else {
            Err(ModifyError {
                qpn: self.cfg.qpn,
                from: self.state,
                to,
            })
        }
    }

    /// RESET → INIT with the QP access flags (`qp_access_flags`).
    ///
    /// # Errors
    /// [`ModifyError`] unless in RESET.
    pub(crate) fn modify_to_init(&mut self, access: AccessFlags) -> Result<(), ModifyError> {
        self.require(QpState::Reset, QpState::Init)?;
        self.access = access;
        self.state = QpState::Init;
        Ok(())
    }

    /// INIT → RTR: peer QPN (masked to 24 bits), expected PSN, path MTU; no message in
    /// progress.
    ///
    /// # Errors
    /// [`ModifyError`] unless in INIT.
    pub(crate) fn modify_to_rtr(
        &mut self,
        dest_qpn: u32,
        rq_psn: u32,
        path_mtu: Mtu,
    ) -> Result<(), ModifyError> {
        self.require(QpState::Init, QpState::Rtr)?;
        self.dest_qpn = dest_qpn & QPN_MASK;
        self.epsn = Psn::new(rq_psn);
        self.mtu = path_mtu.bytes();
        self.inbound = None;
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR → RTS; the transport sets its send PSN and timers.
    ///
    /// # Errors
    /// [`ModifyError`] unless in RTR.
    pub(crate) fn modify_to_rts(&mut self) -> Result<(), ModifyError> {
        self.require(QpState::Rtr, QpState::Rts)?;
        self.state = QpState::Rts;
        Ok(())
    }

    /// Any state → RESET: both queues emptied without completions (ibverbs semantics), no
    /// message in progress, the error cause forgotten.
    pub(crate) fn reset(&mut self) {
        self.state = QpState::Reset;
        self.sq.clear();
        self.rq.clear();
        self.inbound = None;
        self.error_cause = None;
        self.pending_event = None;
    }

    /// Records why the QP moved to ERROR on its own (the caller made the transition): the
    /// first cause is kept and raised once as an async event.
    pub(crate) fn record_failure(&mut self, cause: QpErrorCause) {
        if self.error_cause.is_none() {
            self.error_cause = Some(cause);
            self.pending_event = Some(cause);
        }
    }

    // -- posting and flushing ----------------------------------------------------------------

    /// The checks of `ibv_post_send(3)`: RTS, room in the send queue, a message no longer than
    /// [`IBTA_MAX_MSG_SIZE`].
    ///
    /// # Errors
    /// [`PostRefusal`].
    pub(crate) fn check_post_send(&self, wqe: &SendWqe) -> Result<(), PostRefusal> {
        if self.state != QpState::Rts {
            return Err(PostRefusal::State(self.state));
        }
        if self.sq.len() >= self.cfg.max_send_wr as usize {
            return Err(PostRefusal::Full(self.cfg.max_send_wr));
        }
        if wqe.length() > IBTA_MAX_MSG_SIZE {
            return Err(PostRefusal::TooLong(wqe.length()));
        }
        Ok(())
    }

    /// Queues a receive WR. Allowed in INIT, RTR, RTS and ERROR (then flushed).
    ///
    /// # Errors
    /// [`RecvRefusal`].
    pub(crate) fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), RecvRefusal> {
        if self.state == QpState::Reset {
            return Err(RecvRefusal::State(self.state));
        }
        let RecvQueue::Own(rq) = &mut self.rq else {
            return Err(RecvRefusal::OnSrq);
        };
        if rq.len() >= self.cfg.max_recv_wr as usize {
            return Err(RecvRefusal::Full(self.cfg.max_recv_wr));
        }
        rq.push_back(wqe);
        Ok(())
    }

    /// A completion of this QP.
    pub(crate) fn wc(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm,
            qp_num: self.cfg.qpn,
        }
    }

    /// Pushes `wc` into `cq`; a full CQ loses it and sets the CQ overflow flag. Returns
    /// whether it was queued.
    pub(crate) fn push_wc(&mut self, cq: &mut dyn CompletionSink, wc: WorkCompletion) -> bool {
        if cq.push(wc).is_err() {
            self.cq_overflowed = true;
            return false;
        }
        true
    }

    /// The WC of send WR `w` ending with `status` and no data (an error or a flush).
    pub(crate) fn send_error_wc(&self, w: &W, status: WcStatus) -> WorkCompletion {
        let wqe = w.wqe();
        self.wc(wqe.wr_id, status, wqe.opcode.wc_opcode(), 0, None)
    }

    /// Flushes the send queue into `scq`, each WR with the status `status_of` gives it, until
    /// `scq` is full. Returns whether the queue is empty.
    pub(crate) fn flush_sq(
        &mut self,
        scq: &mut dyn CompletionSink,
        mut status_of: impl FnMut(&W) -> WcStatus,
    ) -> bool {
        while let Some(w) = self.sq.front() {
            let wc = self.send_error_wc(w, status_of(w));
            if scq.push(wc).is_err() {
                return false;
            }
            self.sq.pop_front();
        }
        true
    }

    /// Flushes the receive queue into `rcq` with [`WcStatus::WrFlushError`] until `rcq` is
    /// full. Returns whether the queue is empty.
    pub(crate) fn flush_rq(&mut self, rcq: &mut dyn CompletionSink) -> bool {
        while let Some(w) = self.rq.flush_front() {
            let wc = self.wc(w.wr_id, WcStatus::WrFlushError, WcOpcode::Recv, 0, None);
            if rcq.push(wc).is_err() {
                return false;
            }
            self.rq.pop_front();
        }
        true
    }

    // -- responder ---------------------------------------------------------------------------

    /// Counts an inbound packet and lets it in if the QP receives (RTR or RTS) and its P_Key
    /// matches (IBTA 10.9.3).
    ///
    /// # Errors
    /// The drop reason, already counted: `qp_not_ready` (RESET, INIT), `qp_error` (ERROR),
    /// `bad_pkey`.
    pub(crate) fn admit(&mut self, pkey: u16) -> Result<(), UcDropReason> {
        self.stats.packets_received += 1;
        let refused = match self.state {
            QpState::Rtr | QpState::Rts => None,
            QpState::Reset | QpState::Init => Some(UcDropReason::QpNotReady),
            QpState::Error => Some(UcDropReason::QpError),
        };
        let refused = refused.or_else(|| (!pkey_matches(pkey)).then_some(UcDropReason::BadPkey));
        match refused {
            Some(reason) => {
                self.stats.drops.inc(reason);
                Err(reason)
            }
            None => Ok(()),
        }
    }

    /// rxe `check_length`: ONLY ≤ MTU, FIRST and MIDDLE exactly one MTU, LAST 1..=MTU bytes of
    /// payload; `op` is the packet's shape.
    pub(crate) fn length_ok(&self, op: Opcode, len: usize) -> bool {
        let mtu = self.mtu as usize;
        if op.is_only() {
            len <= mtu
        } else if op.is_first() || op.is_middle() {
            len == mtu
        } else {
            len != 0 && len <= mtu
        }
    }

    /// rxe `check_rkey` and `write_data_in` for one RDMA WRITE packet of shape `op`: the RETH
    /// on FIRST/ONLY (DMA length ≤ 2^31, rkey, access and bounds unless zero-length) starts the
    /// message; the payload must be one MTU while more than one remains, else exactly the
    /// rest; it is placed at the next virtual address. Updates the message in progress.
    ///
    /// # Errors
    /// [`RequestFault`]; the message in progress is left for the caller to drop.
    pub(crate) fn place_write(
        &mut self,
        op: Opcode,
        reth: Option<RethRepr>,
        payload: &[u8],
        mem: &dyn MemoryTable,
    ) -> Result<WriteProgress, RequestFault> {
        let len = payload.len() as u32;
        if op.has_reth() {
            let reth = reth.ok_or(RequestFault::Invalid(UcDropReason::BadLength))?;
            if reth.dma_len > IBTA_MAX_MSG_SIZE {
                return Err(RequestFault::Invalid(UcDropReason::BadLength));
            }
            if reth.dma_len != 0 {
                mem.check_remote_write(reth.rkey, reth.virtual_addr, u64::from(reth.dma_len))
                    .map_err(RequestFault::Access)?;
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
            return Err(RequestFault::Invalid(UcDropReason::OpcodeSequence));
        };
        let consistent = if resid > self.mtu {
            len == self.mtu
        } else {
            len == resid
        };
        if !consistent {
            return Err(RequestFault::Invalid(UcDropReason::BadLength));
        }
        if len > 0 {
            mem.remote_write(rkey, va, payload)
                .map_err(RequestFault::Access)?;
        }
        let resid = resid - len;
        self.inbound = Some(Inbound::Write {
            va: va.wrapping_add(u64::from(len)),
            rkey,
            resid,
            length,
        });
        Ok(WriteProgress { resid, length })
    }

    /// rxe `copy_data` failure (`RESPST_ERR_MALFORMED_WQE`, class A): the head receive WR
    /// `wqe` leaves the queue and completes with [`WcStatus::LocalQpOperationError`] (lost,
    /// with the overflow flag, if `rcq` is full). The caller moves the QP to ERROR.
    pub(crate) fn fail_receive_wr(&mut self, wqe: &RecvWqe, rcq: &mut dyn CompletionSink) {
        self.rq.pop_front();
        let wc = self.wc(
            wqe.wr_id,
            WcStatus::LocalQpOperationError,
            WcOpcode::Recv,
            0,
            None,
        );
        self.push_wc(rcq, wc);
    }

    /// Posts the receive completion of a message. A full `rcq` (IBTA class G, rxe
    /// `RESPST_ERR_CQ_OVERFLOW`) loses it: counted as `cq_overflow`, the overflow flag set;
    /// the caller moves the QP to ERROR. Returns whether it was queued.
    pub(crate) fn complete_receive(
        &mut self,
        wc: WorkCompletion,
        rcq: &mut dyn CompletionSink,
    ) -> bool {
        if self.push_wc(rcq, wc) {
            return true;
        }
        self.stats.drops.inc(UcDropReason::CqOverflow);
        false
    }
}

/// rxe `send_data_in`: scatters `payload` into receive WR `wqe` after the `received`
/// bytes already there.
///
/// # Errors
/// `message_too_long` when the buffer has no room, `bad_receive_wr` when its memory is
/// gone or lacks LOCAL_WRITE.
pub(crate) fn scatter_send(
    wqe: &RecvWqe,
    received: u32,
    payload: &[u8],
    mem: &dyn MemoryTable,
) -> Result<(), UcDropReason> {
    if payload.is_empty() {
        return Ok(());
    }
    let len = payload.len() as u32;
    let capacity = wqe.sge.map_or(0, |s| s.length);
    let fits = received.checked_add(len).is_some_and(|end| end <= capacity);
    match wqe.sge {
        Some(sge) if fits => match sge.offset.checked_add(received as usize) {
            Some(off) => mem
                .scatter(sge.lkey, off, payload)
                .map_err(|_| UcDropReason::BadReceiveWr),
            None => Err(UcDropReason::BadReceiveWr),
        },
        _ => Err(UcDropReason::MessageTooLong),
    }
}

// -- requester --------------------------------------------------------------------------------

/// The request opcode shape of packet `first`/`last` of a WR (rxe `next_opcode()`): ONLY for
/// a one-packet message, else FIRST, MIDDLE…, LAST; `_WITH_IMMEDIATE` on the packet that ends
/// a message with an immediate. RC takes the same shape ([`RcOpcode::from_uc`]).
///
/// [`RcOpcode::from_uc`]: crate::soft::packet::RcOpcode::from_uc
pub(crate) fn request_opcode(opcode: SendOpcode, first: bool, last: bool) -> Opcode {
    let (is_write, with_imm) = match opcode {
        SendOpcode::Send => (false, false),
        SendOpcode::SendWithImm { .. } => (false, true),
        SendOpcode::RdmaWrite { .. } => (true, false),
        SendOpcode::RdmaWriteWithImm { .. } => (true, true),
    };
    match (is_write, first, last, with_imm) {
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
    }
}

/// The BTH of a packet this QP sends: no solicited event, no MigReq, the default P_Key, no
/// congestion bits (as rxe sends on UC and RC); the pad count is set when the packet is laid
/// out.
pub(crate) fn request_bth<O: BthOpcode>(
    opcode: O,
    dest_qpn: u32,
    ack_req: bool,
    psn: Psn,
) -> BthRepr<O> {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req,
        psn,
    }
}

/// Lays out one request packet into `out` (cleared first): BTH (pad count from the payload),
/// the RETH on a WRITE FIRST/ONLY (virtual address, rkey, DMA length = message length), the
/// ImmDt on a `_WITH_IMMEDIATE` packet, `payload_len` bytes of `wqe`'s memory from offset
/// `sent`, pad and a zero ICRC placeholder for the device to seal. `shape` is the UC shape of
/// `bth.opcode`.
///
/// # Errors
/// [`BuildError`]; `out` is left empty.
pub(crate) fn emit_request<O: BthOpcode>(
    out: &mut Vec<u8>,
    bth: BthRepr<O>,
    shape: Opcode,
    wqe: &SendWqe,
    sent: u32,
    payload_len: u32,
    mem: &dyn MemoryTable,
) -> Result<(), BuildError> {
    out.clear();
    let total = wqe.length();
    let (reth, imm) = match wqe.opcode {
        SendOpcode::Send => (None, None),
        SendOpcode::SendWithImm { imm } => (None, Some(imm)),
        SendOpcode::RdmaWrite { remote_addr, rkey } => (Some((remote_addr, rkey)), None),
        SendOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => (Some((remote_addr, rkey)), Some(imm)),
    };
    let pad = pad_for(payload_len as usize);
    let bth = BthRepr {
        pad_count: pad,
        ..bth
    };
    let bth_bytes = bth.to_bytes().map_err(|_| BuildError::Header)?;
    out.extend_from_slice(&bth_bytes);
    if let (true, Some((virtual_addr, rkey))) = (shape.has_reth(), reth) {
        RethRepr {
            virtual_addr,
            rkey,
            dma_len: total,
        }
        .emit(out);
    }
    if let (true, Some(i)) = (shape.has_immdt(), imm) {
        out.extend_from_slice(&ImmDt(i).to_bytes());
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
            return Err(BuildError::Memory);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::memory::MrTable;

    fn core() -> QpCore<SendWqe> {
        QpCore::new(QpConfig {
            qpn: 0x0100_0007,
            max_send_wr: 1,
            max_recv_wr: 1,
        })
    }

    fn send(wr_id: u64) -> SendWqe {
        SendWqe {
            wr_id,
            opcode: SendOpcode::Send,
            sge: None,
            signaled: true,
        }
    }

    #[test]
    fn the_state_machine_takes_only_the_ibta_path() {
        let mut qp = core();
        assert_eq!(qp.qpn(), 7, "QPN masked to 24 bits");
        let err = qp.modify_to_rts().unwrap_err();
        assert_eq!((err.from, err.to), (QpState::Reset, QpState::Rts));
        assert!(qp.modify_to_rtr(1, 0, Mtu::Mtu256).is_err());
        qp.modify_to_init(AccessFlags::REMOTE_WRITE).unwrap();
        assert!(qp.modify_to_init(AccessFlags::NONE).is_err());
        assert_eq!(
            qp.check_post_send(&send(1)),
            Err(PostRefusal::State(QpState::Init))
        );
        qp.post_recv(RecvWqe {
            wr_id: 2,
            sge: None,
        })
        .unwrap();
        assert_eq!(
            qp.post_recv(RecvWqe {
                wr_id: 3,
                sge: None
            }),
            Err(RecvRefusal::Full(1))
        );
        qp.modify_to_rtr(0x0100_0009, 0x0100_0005, Mtu::Mtu256)
            .unwrap();
        assert_eq!((qp.dest_qpn, qp.epsn, qp.mtu), (9, Psn::new(5), 256));
        qp.modify_to_rts().unwrap();
        qp.check_post_send(&send(1)).unwrap();
        qp.sq.push_back(send(1));
        assert_eq!(qp.check_post_send(&send(4)), Err(PostRefusal::Full(1)));
        qp.reset();
        assert_eq!((qp.state, qp.sq.len(), qp.rq.len()), (QpState::Reset, 0, 0));
        assert_eq!(
            qp.post_recv(RecvWqe {
                wr_id: 5,
                sge: None
            }),
            Err(RecvRefusal::State(QpState::Reset))
        );
    }

    #[test]
    fn errors_are_raised_once_and_flushes_stop_at_a_full_cq() {
        let mut qp = core();
        qp.modify_to_init(AccessFlags::NONE).unwrap();
        qp.post_recv(RecvWqe {
            wr_id: 8,
            sge: None,
        })
        .unwrap();
        qp.sq.push_back(send(1));
        qp.state = QpState::Error;
        qp.record_failure(QpErrorCause::RetryExceeded);
        qp.record_failure(QpErrorCause::RemoteNak);
        assert_eq!(qp.error_cause, Some(QpErrorCause::RetryExceeded));
        assert_eq!(qp.take_error_event(), Some(QpErrorCause::RetryExceeded));
        assert_eq!(qp.take_error_event(), None, "raised once");
        assert!(qp.needs_flush());
        let mut full = VecCq::new(0);
        assert!(!qp.flush_sq(&mut full, |_| WcStatus::WrFlushError));
        assert_eq!(qp.sq.len(), 1, "a WR whose WC found no room stays queued");
        let mut scq = VecCq::new(4);
        let mut rcq = VecCq::new(4);
        assert!(qp.flush_sq(&mut scq, |w| if w.wr_id == 1 {
            WcStatus::RetryExceededError
        } else {
            WcStatus::WrFlushError
        }));
        assert!(qp.flush_rq(&mut rcq));
        let (s, r) = (scq.pop().unwrap(), rcq.pop().unwrap());
        assert_eq!(
            (s.wr_id, s.status, s.qp_num),
            (1, WcStatus::RetryExceededError, 7)
        );
        assert_eq!(
            (r.wr_id, r.status, r.opcode),
            (8, WcStatus::WrFlushError, WcOpcode::Recv)
        );
        assert!(!qp.needs_flush());
    }

    #[test]
    fn admit_counts_every_packet_and_every_refusal() {
        let mut qp = core();
        assert_eq!(qp.admit(DEFAULT_PKEY), Err(UcDropReason::QpNotReady));
        qp.modify_to_init(AccessFlags::NONE).unwrap();
        qp.modify_to_rtr(1, 0, Mtu::Mtu256).unwrap();
        assert_eq!(
            qp.admit(0x7fff),
            Ok(()),
            "limited member meets a full member"
        );
        assert_eq!(qp.admit(0x1234), Err(UcDropReason::BadPkey));
        qp.state = QpState::Error;
        assert_eq!(qp.admit(DEFAULT_PKEY), Err(UcDropReason::QpError));
        assert_eq!(qp.stats.packets_received, 4);
        assert_eq!(qp.stats.drops.total(), 3);
    }

    #[test]
    fn a_write_starts_at_its_reth_and_checks_the_rkey() {
        let mem = MrTable::new();
        let mut qp = core();
        qp.modify_to_init(AccessFlags::REMOTE_WRITE).unwrap();
        qp.modify_to_rtr(1, 0, Mtu::Mtu256).unwrap();
        assert_eq!(
            qp.place_write(Opcode::RdmaWriteMiddle, None, &[0; 256], &mem),
            Err(RequestFault::Invalid(UcDropReason::OpcodeSequence))
        );
        assert_eq!(
            qp.place_write(Opcode::RdmaWriteOnly, None, &[], &mem),
            Err(RequestFault::Invalid(UcDropReason::BadLength)),
            "no RETH"
        );
        let reth = RethRepr {
            virtual_addr: 0x1000,
            rkey: 0x42,
            dma_len: 0,
        };
        assert_eq!(
            qp.place_write(Opcode::RdmaWriteOnly, Some(reth), &[], &mem),
            Ok(WriteProgress {
                resid: 0,
                length: 0
            }),
            "a zero-length WRITE needs no rkey"
        );
        let reth = RethRepr {
            dma_len: 300,
            ..reth
        };
        assert!(matches!(
            qp.place_write(Opcode::RdmaWriteFirst, Some(reth), &[0; 256], &mem),
            Err(RequestFault::Access(_))
        ));
    }
}
