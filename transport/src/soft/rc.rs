//! The sans-IO RoCEv2 Reliable Connection engine: one [`RcQp`] per queue pair.
//!
//! One file because it is one concept: one RC QP's state machine, whose requester and
//! responder share its state, PSNs, timers and error transitions.
//!
//! No sockets, no threads, no clock of its own. The owner feeds inbound packets with
//! [`RcQp::receive`], pulls outbound packets (requests and acknowledgements) with
//! [`RcQp::poll_transmit`], asks when to wake with [`RcQp::poll_timeout`] and reports that the
//! time came with [`RcQp::handle_timeout`]. Every call that depends on time takes `now`. The
//! API mirrors [`UcQp`](crate::soft::engine::UcQp) and reuses its WR, CQ and error types; the
//! packets are [`RcPacketRepr`]s (RC opcodes `0x00..=0x0b` and ACKNOWLEDGE `0x11`). Only SEND,
//! SEND_WITH_IMM, RDMA WRITE and RDMA WRITE_WITH_IMM are implemented; RDMA READ and atomics are
//! not.
//!
//! # Requester (IBTA 9.7.2, 9.7.5.2, 9.7.6; rxe `rxe_req.c`, `rxe_comp.c`)
//!
//! * A send WR takes its PSNs when it is posted: one per packet, segmented at the path MTU
//!   exactly as the UC engine does. Packets are regenerated from the WR and local memory
//!   whenever they are (re)sent, so the engine keeps WRs, not packets, until they are ACKed
//!   (rxe does the same: `req_retry()` rewinds the WQE index and re-reads memory).
//! * AckReq is set on the last packet of every message and on the packet after more than
//!   [`MAX_PKT_PER_ACK`] packets without it (rxe `init_req_packet()`, `noack_pkts`).
//! * At most [`MAX_UNACKED_PSNS`] PSNs are in flight (rxe `RXE_MAX_UNACKED_PSNS`); beyond that
//!   the requester waits for ACKs.
//! * An ACK with PSN `p` acknowledges every PSN up to `p` (coalesced ACKs, IBTA 9.7.5.1.2);
//!   a send WR completes (a WC when signaled) once its last PSN is acknowledged, in order
//!   (rxe `do_complete()`). An ACK for a PSN older than the oldest unacknowledged one, or for
//!   a PSN never sent, is ignored (rxe `check_psn()` in `rxe_comp.c`: "ghost" and duplicate
//!   responses).
//! * A NAK (PSN sequence error) with PSN `p` acknowledges everything before `p` and rewinds
//!   the requester to `p` (go-back-N, IBTA 9.7.5.2.8, rxe `COMPST_ERROR_RETRY` →
//!   `req_retry()`); a second NAK for the same `p` without progress in between is ignored.
//!   *Deviation from rxe:* rxe's `started_retry` ignores every sequence NAK while a retry is
//!   under way, until a WQE completes; here only a repeat of the NAK already acted upon is
//!   ignored, so a NAK for a later gap found during the retry is followed at once.
//! * The retransmit timer (4.096 µs × 2^`timeout`, 0 = never, IBTA 9.7.6.1.3 / `ibv_modify_qp`
//!   `IBV_QP_TIMEOUT`) is armed when a request is sent and none is pending, re-armed on every
//!   ACK that makes progress while packets remain outstanding, and cleared when none does
//!   (rxe `update_state()`, `rxe_completer()`). On expiry the requester rewinds to the oldest
//!   unacknowledged PSN.
//! * Timeouts and sequence NAKs share the retry budget `retry_cnt`. When it is spent, the oldest
//!   outstanding WR completes with [`WcStatus::RetryExceededError`] and the QP moves to ERROR.
//!   *Deviations from rxe:* rxe treats `retry_cnt == 7` as "retry forever" like `rnr_retry`;
//!   IBTA gives the infinite value only to the RNR counter (9.7.5.2.8 vs 9.7.6.1.3), so here 7
//!   means seven retries. rxe restores both budgets (`reset_retry_counters()`) when a response
//!   passes a WQE's last PSN; here any response that acknowledges a new PSN restores them, so
//!   that a message longer than the window, acknowledged every [`MAX_PKT_PER_ACK`] packets,
//!   does not spend its budget across partial progress.
//! * An RNR NAK with PSN `p` acknowledges everything before `p`, stops transmission for the RNR
//!   timer of its syndrome (IBTA Table 45, [`rnr_timer_micros`]), then resends from `p` (rxe
//!   `COMPST_RNR_RETRY`, `rnr_nak_timer()`). `rnr_retry` 7 retries forever; otherwise each RNR
//!   NAK spends one and, with none left, the WR completes with
//!   [`WcStatus::RnrRetryExceededError`] and the QP moves to ERROR.
//! * Other NAKs (invalid request, remote access, remote operational error) complete the WR with
//!   [`WcStatus::RemoteInvalidRequestError`], [`WcStatus::RemoteAccessError`] or
//!   [`WcStatus::RemoteOperationError`] and move the QP to ERROR (IBTA 9.7.5.2.8 class B/C).
//! * The MSN of inbound ACKs is parsed but not used: SEND and WRITE completion follows PSNs, as
//!   in rxe's completer.
//!
//! # Responder (IBTA 9.7.5; rxe `rxe_resp.c`)
//!
//! Checks run in rxe's order: `check_psn`, `check_op_seq`, `check_op_valid`,
//! `check_resource`, `check_length`, `check_rkey`, then `execute` and `acknowledge`.
//!
//! * PSN equal to the expected one: processed. PSN behind (wrap-aware, [`Psn`]): a duplicate;
//!   it is not executed again and is answered with an ACK for the PSN before the expected one
//!   with the current MSN (rxe `duplicate_request()`, IBTA C9-105). PSN ahead: dropped; the
//!   first such packet of a gap is answered with one NAK (PSN sequence error) carrying the
//!   expected PSN, later ones are dropped silently until the expected PSN arrives (rxe
//!   `sent_psn_nak`).
//! * A SEND FIRST/ONLY or WRITE LAST/ONLY_WITH_IMMEDIATE without a posted receive WR is
//!   answered with an RNR NAK carrying the packet's PSN and the QP's `min_rnr_timer`; the
//!   expected PSN does not move (rxe `check_resource()` → `RESPST_ERR_RNR`). SEND MIDDLE/LAST
//!   use the receive WR their FIRST found.
//! * Opcode sequence, QP access and length errors are answered with NAK invalid request, rkey
//!   and bounds errors with NAK remote access error, and the responder moves to ERROR (class
//!   C, rxe `do_class_ac_error()`). A SEND longer than its receive buffer completes the WR with
//!   [`WcStatus::LocalQpOperationError`] as in the UC engine and is NAKed with remote
//!   operational error (rxe: `RESPST_ERR_MALFORMED_WQE`, `AETH_NAK_REM_OP_ERR`).
//! * After a packet is executed the expected PSN moves on; the MSN (24 bits, wrapping) grows
//!   by one per completed message (IBTA 9.7.5.1.1); when the packet has AckReq set, an ACK with
//!   its PSN and the MSN is queued (rxe `acknowledge()` → `send_ack()`).
//!
//! *Deviations from rxe:* rxe sends each response at once; here responses wait in a queue of
//! at most [`MAX_PENDING_RESPONSES`] that [`RcQp::poll_transmit`] drains before requests, and
//! an ACK queued right behind another ACK replaces it (the later one acknowledges everything
//! the earlier one did). A response that finds the queue full is dropped and counted
//! ([`RcStats::responses_dropped`]); the requester recovers by its timer. On a class C error
//! rxe completes the receive WR being filled with the error status; here it stays queued and is
//! flushed with [`WcStatus::WrFlushError`] like every other WR of the failed QP.
//!
//! Counters are in [`RcStats`]: the shared [`QpStats`] (packets, messages, drops by
//! [`UcDropReason`]) and the RC ones (retransmissions, timeouts, NAKs, duplicates).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, RcCounters, SendOpcode, UcDropReason,
    WcOpcode, WcStatus, WorkCompletion, IBTA_MAX_MSG_SIZE, PSN_MASK, QPN_MASK,
};
use crate::soft::engine::{
    CompletionSink, ModifyError, PostRefusal, RecvRefusal, RecvWqe, SendWqe,
};
use crate::soft::memory::{LocalAccessError, MemoryTable};
use crate::soft::packet::{
    pad_for, rnr_timer_micros, AethRepr, AethSyndrome, ImmDt, NakCode, RcBthRepr, RcOpcode,
    RcPacketRepr, RethRepr, ACK_CREDITS_UNLIMITED, DEFAULT_PKEY, ICRC_LEN,
};
use crate::soft::psn::Psn;

/// Most PSNs the requester has in flight (sent, not yet acknowledged); rxe
/// `RXE_MAX_UNACKED_PSNS`.
pub const MAX_UNACKED_PSNS: u32 = 128;

/// After more than this many packets without AckReq, the next one sets it; rxe
/// `RXE_MAX_PKT_PER_ACK`.
pub const MAX_PKT_PER_ACK: u32 = 64;

/// Most responses (ACK, NAK, RNR NAK) waiting for [`RcQp::poll_transmit`].
pub const MAX_PENDING_RESPONSES: usize = 64;

/// The `rnr_retry` value that retries forever (IBTA 9.7.5.2.8).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// The local ACK timeout for the `timeout` exponent: 4.096 µs × 2^`timeout` (IBTA 9.7.6.1.3,
/// `ibv_modify_qp(3)` `IBV_QP_TIMEOUT`); `None` for 0, which disables the timer. The exponent
/// is masked to 5 bits (the largest, 31, is about 2.4 hours).
pub const fn ack_timeout(timeout: u8) -> Option<Duration> {
    let exp = timeout & 0x1f;
    if exp == 0 {
        None
    } else {
        Some(Duration::from_nanos(4096u64 << exp))
    }
}

/// QP sizes, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcQpConfig {
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

/// The RTR attributes of an RC QP (`IBV_QP_AV | PATH_MTU | DEST_QPN | RQ_PSN |
/// MIN_RNR_TIMER`; `MAX_DEST_RD_ATOMIC` is meaningless without READ and atomics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcRtrAttr {
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// First PSN expected from the peer (low 24 bits).
    pub rq_psn: u32,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RNR timer code this responder puts in its RNR NAKs (5 bits, IBTA Table 45).
    pub min_rnr_timer: u8,
}

/// The RTS attributes of an RC QP (`IBV_QP_SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcRtsAttr {
    /// First send PSN (low 24 bits).
    pub sq_psn: u32,
    /// Local ACK timeout exponent ([`ack_timeout`]; 0 = no timer).
    pub timeout: u8,
    /// Retries after a timeout or PSN sequence NAK, 0..=7 (3 bits; larger values are cut to 7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs, 0..=7; [`RNR_RETRY_INFINITE`] retries forever.
    pub rnr_retry: u8,
}

/// Counters of one RC QP. All monotonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RcStats {
    /// The counters RC shares with UC. `packets_sent` counts every request and response
    /// packet pulled, retransmissions included; `messages_sent` counts each send WR once, when
    /// its last packet is first sent.
    pub qp: QpStats,
    /// Request packets sent again after a timeout, a sequence NAK or an RNR NAK.
    pub packets_retransmitted: u64,
    /// Retransmit timer expiries with packets outstanding.
    pub timeouts: u64,
    /// ACKs sent (responder), duplicates' re-ACKs included.
    pub acks_sent: u64,
    /// ACKs received that acknowledged at least one new PSN.
    pub acks_received: u64,
    /// Responses received that acknowledged nothing new or named a PSN never sent (ignored).
    pub stale_responses: u64,
    /// NAKs sent (responder), all codes.
    pub naks_sent: u64,
    /// NAKs received (requester), all codes.
    pub naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Send WRs failed with [`WcStatus::RetryExceededError`].
    pub retry_exceeded: u64,
    /// Send WRs failed with [`WcStatus::RnrRetryExceededError`].
    pub rnr_retry_exceeded: u64,
    /// Inbound requests with the expected PSN that were executed (data placed or scattered).
    pub requests_executed: u64,
    /// Inbound requests with a PSN behind the expected one (re-ACKed, not executed).
    pub duplicates: u64,
    /// Inbound requests with a PSN ahead of the expected one (dropped; the first of each gap
    /// NAKed).
    pub out_of_sequence: u64,
    /// Inbound requests answered with an RNR NAK (not executed).
    pub requests_rnr: u64,
    /// Responses dropped because the response queue was full.
    pub responses_dropped: u64,
}

impl RcStats {
    /// The shared counters with [`QpStats::rc`] filled from these.
    pub fn qp_stats(&self) -> QpStats {
        QpStats {
            rc: RcCounters {
                packets_retransmitted: self.packets_retransmitted,
                timeouts: self.timeouts,
                naks_sent: self.naks_sent,
                naks_received: self.naks_received,
                rnr_naks_sent: self.rnr_naks_sent,
                rnr_naks_received: self.rnr_naks_received,
                retry_exceeded: self.retry_exceeded,
                rnr_retry_exceeded: self.rnr_retry_exceeded,
                duplicates: self.duplicates,
            },
            ..self.qp
        }
    }

    /// Inbound requests accounted for: executed, duplicate, out of sequence or RNR NAKed.
    /// This plus [`RcStats::responses_accounted`] plus `qp.drops.total()` equals
    /// `qp.packets_received` (tests check the sum), except that a request whose receive WC
    /// found the CQ full counts both as executed and under `cq_overflow`.
    pub fn requests_accounted(&self) -> u64 {
        self.requests_executed + self.duplicates + self.out_of_sequence + self.requests_rnr
    }

    /// Inbound responses accounted for: ACKs that made progress, NAKs, RNR NAKs and stale
    /// responses.
    pub fn responses_accounted(&self) -> u64 {
        self.acks_received + self.naks_received + self.rnr_naks_received + self.stale_responses
    }
}

/// What happened to one inbound packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RcRxOutcome {
    /// A request was executed; its message continues.
    Accepted,
    /// A request completed its message (data placed; a receive WC posted when one is due).
    Completed,
    /// A request with an old PSN: re-ACKed, not executed.
    Duplicate,
    /// A request with a PSN ahead of the expected one: dropped (NAKed if first of its gap).
    OutOfSequence,
    /// A request that needed a receive WR and found none: RNR NAKed.
    ReceiverNotReady,
    /// A request was dropped (and NAKed, the QP in ERROR, where IBTA says so) for this reason.
    Dropped(UcDropReason),
    /// A response acknowledged new PSNs or started a retry.
    Response,
    /// A response that acknowledged nothing new (duplicate, late or ghost): ignored.
    StaleResponse,
}

/// What one pulled packet was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcTxInfo {
    /// Its opcode.
    pub opcode: RcOpcode,
    /// Its PSN.
    pub psn: u32,
    /// Payload bytes.
    pub payload_len: u32,
    /// Whether it asks for an ACK.
    pub ack_req: bool,
    /// For a request: whether this PSN was sent before.
    pub retransmission: bool,
    /// For a response: its syndrome.
    pub syndrome: Option<AethSyndrome>,
}

/// A posted send WR with its PSN range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    wqe: SendWqe,
    first_psn: Psn,
    npkts: u32,
}

impl Pending {
    fn length(&self) -> u32 {
        self.wqe.sge.map_or(0, |s| s.length)
    }

    /// PSN after the last one.
    fn end_psn(&self) -> Psn {
        self.first_psn + self.npkts
    }

    /// Packet index of `psn` in this WR, if it is one of its PSNs.
    fn index_of(&self, psn: Psn) -> Option<u32> {
        let d = psn - self.first_psn;
        u32::try_from(d).ok().filter(|&k| k < self.npkts)
    }
}

/// A response waiting to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Response {
    syndrome: AethSyndrome,
    psn: Psn,
    msn: u32,
}

/// Message being assembled by the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inbound {
    Send {
        received: u32,
    },
    Write {
        va: u64,
        rkey: u32,
        resid: u32,
        length: u32,
    },
}

/// One RC queue pair: requester, completer, responder and state machine.
pub struct RcQp {
    cfg: RcQpConfig,
    state: QpState,
    access: AccessFlags,
    dest_qpn: u32,
    mtu: u32,
    min_rnr_timer: u8,
    timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    // requester
    sq: VecDeque<Pending>,
    /// PSN the next posted WR starts at.
    sq_psn: Psn,
    /// Oldest unacknowledged PSN.
    una: Psn,
    /// Next PSN to (re)send.
    snd: Psn,
    /// One past the highest PSN ever sent.
    hw: Psn,
    noack_pkts: u32,
    retry_left: u8,
    rnr_retry_left: u8,
    retrans_deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// PSN of the last sequence NAK acted upon, until progress is made.
    nak_retry_psn: Option<Psn>,
    /// A WR (by first PSN) to complete with this status when flushed.
    failed_wr: Option<(Psn, WcStatus)>,
    // responder
    rq: VecDeque<RecvWqe>,
    epsn: Psn,
    msn: u32,
    sent_psn_nak: bool,
    inbound: Option<Inbound>,
    responses: VecDeque<Response>,
    // bookkeeping
    stats: RcStats,
    error_cause: Option<QpErrorCause>,
    pending_event: Option<QpErrorCause>,
    cq_overflowed: bool,
}

impl fmt::Debug for RcQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcQp")
            .field("qpn", &format_args!("{:#08x}", self.cfg.qpn))
            .field("state", &self.state)
            .field("dest_qpn", &format_args!("{:#08x}", self.dest_qpn))
            .field("sq", &self.sq.len())
            .field("una", &format_args!("{}", self.una))
            .field("snd", &format_args!("{}", self.snd))
            .field("sq_psn", &format_args!("{}", self.sq_psn))
            .field("rq", &self.rq.len())
            .field("epsn", &format_args!("{}", self.epsn))
            .field("msn", &self.msn)
            .field("responses", &self.responses.len())
            .finish_non_exhaustive()
    }
}

/// Whether a BTH P_Key matches the default partition (IBTA 10.9.3; rxe `pkey_match`).
fn pkey_matches(pkey: u16) -> bool {
    (pkey & 0x7fff) == (DEFAULT_PKEY & 0x7fff) && (pkey & 0x8000 != 0 || DEFAULT_PKEY & 0x8000 != 0)
}

/// The request opcode for packet `k` of a WR.
fn request_opcode(opcode: SendOpcode, first: bool, last: bool) -> RcOpcode {
    let (is_write, with_imm) = match opcode {
        SendOpcode::Send => (false, false),
        SendOpcode::SendWithImm { .. } => (false, true),
        SendOpcode::RdmaWrite { .. } => (true, false),
        SendOpcode::RdmaWriteWithImm { .. } => (true, true),
    };
    match (is_write, first, last, with_imm) {
        (false, true, true, false) => RcOpcode::SendOnly,
        (false, true, true, true) => RcOpcode::SendOnlyWithImmediate,
        (false, true, false, _) => RcOpcode::SendFirst,
        (false, false, false, _) => RcOpcode::SendMiddle,
        (false, false, true, false) => RcOpcode::SendLast,
        (false, false, true, true) => RcOpcode::SendLastWithImmediate,
        (true, true, true, false) => RcOpcode::RdmaWriteOnly,
        (true, true, true, true) => RcOpcode::RdmaWriteOnlyWithImmediate,
        (true, true, false, _) => RcOpcode::RdmaWriteFirst,
        (true, false, false, _) => RcOpcode::RdmaWriteMiddle,
        (true, false, true, false) => RcOpcode::RdmaWriteLast,
        (true, false, true, true) => RcOpcode::RdmaWriteLastWithImmediate,
    }
}

impl RcQp {
    /// A QP in RESET.
    pub fn new(cfg: RcQpConfig) -> Self {
        Self {
            cfg: RcQpConfig {
                qpn: cfg.qpn & QPN_MASK,
                ..cfg
            },
            state: QpState::Reset,
            access: AccessFlags::NONE,
            dest_qpn: 0,
            mtu: Mtu::Mtu1024.bytes(),
            min_rnr_timer: 0,
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
            sq: VecDeque::new(),
            sq_psn: Psn::ZERO,
            una: Psn::ZERO,
            snd: Psn::ZERO,
            hw: Psn::ZERO,
            noack_pkts: 0,
            retry_left: 0,
            rnr_retry_left: 0,
            retrans_deadline: None,
            rnr_until: None,
            nak_retry_psn: None,
            failed_wr: None,
            rq: VecDeque::new(),
            epsn: Psn::ZERO,
            msn: 0,
            sent_psn_nak: false,
            inbound: None,
            responses: VecDeque::new(),
            stats: RcStats::default(),
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

    /// PSN the next posted send WR starts at (24 bits).
    pub fn sq_psn(&self) -> u32 {
        self.sq_psn.value()
    }

    /// Oldest PSN sent or to be sent and not yet acknowledged (24 bits).
    pub fn unacked_psn(&self) -> u32 {
        self.una.value()
    }

    /// Next PSN the responder expects (24 bits).
    pub fn expected_psn(&self) -> u32 {
        self.epsn.value()
    }

    /// The responder's message sequence number: messages completed, modulo 2^24.
    pub fn msn(&self) -> u32 {
        self.msn
    }

    /// Counters.
    pub fn stats(&self) -> RcStats {
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

    /// Takes whether a CQ overflow happened since the last call.
    pub fn take_cq_overflow(&mut self) -> bool {
        std::mem::take(&mut self.cq_overflowed)
    }

    /// Send WRs not yet completed (posted, in flight or waiting for their ACK).
    pub fn sq_len(&self) -> usize {
        self.sq.len()
    }

    /// Posted receive WRs.
    pub fn rq_len(&self) -> usize {
        self.rq.len()
    }

    /// Responses waiting to be sent.
    pub fn pending_responses(&self) -> usize {
        self.responses.len()
    }

    /// Whether [`RcQp::poll_transmit`] would produce a packet now: a response is queued, or in
    /// RTS a request is due, the window has room and no RNR wait runs.
    pub fn wants_transmit(&self) -> bool {
        !self.responses.is_empty() || self.request_due()
    }

    fn request_due(&self) -> bool {
        self.state == QpState::Rts
            && self.rnr_until.is_none()
            && self.snd != self.sq_psn
            && (self.snd - self.una) < MAX_UNACKED_PSNS as i32
    }

    /// Whether the QP is in ERROR with WRs still to flush.
    pub fn needs_flush(&self) -> bool {
        self.state == QpState::Error && !(self.sq.is_empty() && self.rq.is_empty())
    }

    /// Counts a drop detected outside the engine (e.g. a source address mismatch).
    pub fn count_drop(&mut self, reason: UcDropReason) {
        self.stats.qp.packets_received += 1;
        self.stats.qp.drops.inc(reason);
    }

    // -- state machine -----------------------------------------------------------------------

    fn transition_error(&self, to: QpState) -> ModifyError {
        ModifyError {
            qpn: self.cfg.qpn,
            from: self.state,
            to,
        }
    }

    /// RESET → INIT with the QP access flags.
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

    /// INIT → RTR: peer QPN, expected PSN, path MTU, RNR timer code for RNR NAKs.
    ///
    /// # Errors
    /// [`ModifyError`] unless in INIT.
    pub fn modify_to_rtr(&mut self, attr: RcRtrAttr) -> Result<(), ModifyError> {
        if self.state != QpState::Init {
            return Err(self.transition_error(QpState::Rtr));
        }
        self.dest_qpn = attr.dest_qpn & QPN_MASK;
        self.epsn = Psn::new(attr.rq_psn);
        self.mtu = attr.path_mtu.bytes();
        self.min_rnr_timer = attr.min_rnr_timer & 0x1f;
        self.msn = 0;
        self.sent_psn_nak = false;
        self.inbound = None;
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR → RTS: first send PSN, ACK timeout exponent, retry counts.
    ///
    /// # Errors
    /// [`ModifyError`] unless in RTR.
    pub fn modify_to_rts(&mut self, attr: RcRtsAttr) -> Result<(), ModifyError> {
        if self.state != QpState::Rtr {
            return Err(self.transition_error(QpState::Rts));
        }
        let psn = Psn::new(attr.sq_psn);
        self.sq_psn = psn;
        self.una = psn;
        self.snd = psn;
        self.hw = psn;
        self.noack_pkts = 0;
        self.timeout = ack_timeout(attr.timeout);
        self.retry_cnt = attr.retry_cnt.min(7);
        self.rnr_retry = attr.rnr_retry.min(7);
        self.retry_left = self.retry_cnt;
        self.rnr_retry_left = self.rnr_retry;
        self.state = QpState::Rts;
        Ok(())
    }

    /// Any state → ERROR on request; WRs are flushed by [`RcQp::flush`]. Timers stop; queued
    /// responses may still be pulled (a NAK that announced the error).
    pub fn modify_to_error(&mut self) {
        self.state = QpState::Error;
        self.retrans_deadline = None;
        self.rnr_until = None;
    }

    /// Any state → RESET: queues, responses, counters of progress and the error cause are
    /// cleared.
    pub fn modify_to_reset(&mut self) {
        self.state = QpState::Reset;
        self.sq.clear();
        self.rq.clear();
        self.responses.clear();
        self.inbound = None;
        self.retrans_deadline = None;
        self.rnr_until = None;
        self.nak_retry_psn = None;
        self.failed_wr = None;
        self.sent_psn_nak = false;
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

    /// Queues a send WR and gives it its PSNs (one per MTU of payload, at least one). Needs
    /// RTS and room in the send queue; a WR stays in the queue until it is acknowledged.
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
        let len = wqe.sge.map_or(0, |s| s.length);
        if len > IBTA_MAX_MSG_SIZE {
            return Err(PostRefusal::TooLong(len));
        }
        let npkts = len.div_ceil(self.mtu).max(1);
        self.sq.push_back(Pending {
            wqe,
            first_psn: self.sq_psn,
            npkts,
        });
        self.sq_psn += npkts;
        Ok(())
    }

    /// Queues a receive WR. Allowed in INIT, RTR, RTS and ERROR (flushed by [`RcQp::flush`]).
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

    /// In ERROR: completes queued WRs, send queue into `scq`, receive queue into `rcq`, until a
    /// CQ is full. Send WRs complete with [`WcStatus::WrFlushError`], except one that failed
    /// on a timer (retry exceeded) or a local memory error, which completes with that status.
    /// Returns whether everything was flushed.
    pub fn flush(&mut self, scq: &mut dyn CompletionSink, rcq: &mut dyn CompletionSink) -> bool {
        if self.state != QpState::Error {
            return true;
        }
        while let Some(p) = self.sq.front().copied() {
            let status = match self.failed_wr {
                Some((psn, status)) if psn == p.first_psn => status,
                _ => WcStatus::WrFlushError,
            };
            let wc = WorkCompletion {
                wr_id: p.wqe.wr_id,
                status,
                opcode: p.wqe.opcode.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: self.cfg.qpn,
            };
            if scq.push(wc).is_err() {
                return false;
            }
            self.sq.pop_front();
        }
        self.failed_wr = None;
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

    // -- timers ------------------------------------------------------------------------------

    /// When the engine next needs [`RcQp::handle_timeout`]: the end of an RNR wait or the
    /// retransmit deadline, whichever is first; `None` when no timer runs.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.rnr_until, self.retrans_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers that are due at `now`. An RNR wait that ended lets transmission resume
    /// from the RNR NAKed PSN. An expired retransmit timer with packets outstanding spends one
    /// retry and rewinds to the oldest unacknowledged PSN, or, with no retry left, fails the
    /// oldest WR with [`WcStatus::RetryExceededError`] (its WC comes from [`RcQp::flush`])
    /// and moves the QP to ERROR (rxe `retransmit_timer()`, `COMPST_ERROR_RETRY`).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state != QpState::Rts {
            self.retrans_deadline = None;
            self.rnr_until = None;
            return;
        }
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.retrans_deadline.is_none_or(|t| t > now) {
            return;
        }
        self.retrans_deadline = None;
        if self.una == self.hw {
            // Nothing outstanding: a late expiry.
            return;
        }
        self.stats.timeouts += 1;
        if self.retry_left == 0 {
            self.stats.retry_exceeded += 1;
            self.failed_wr = self
                .sq
                .front()
                .map(|p| (p.first_psn, WcStatus::RetryExceededError));
            self.fail(QpErrorCause::RetryExceeded);
            return;
        }
        self.retry_left -= 1;
        self.nak_retry_psn = None;
        self.snd = self.una;
    }

    // -- requester ---------------------------------------------------------------------------

    /// Builds the next outbound packet into `out` (cleared first): a queued response if any
    /// (BTH + AETH), else in RTS the request at the send PSN (BTH, RETH, ImmDt, payload, pad),
    /// each with a zero ICRC placeholder for the device to seal. Returns `None` when there is
    /// nothing to send: no response, no request due, the window of [`MAX_UNACKED_PSNS`] full or
    /// an RNR wait running. A WR whose memory is gone fails with
    /// [`WcStatus::LocalProtectionError`] (its WC comes from [`RcQp::flush`]) and the QP moves to
    /// ERROR.
    ///
    /// Sending a request arms the retransmit timer at `now` if it is not running.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn MemoryTable,
        out: &mut Vec<u8>,
    ) -> Option<RcTxInfo> {
        out.clear();
        if self.state == QpState::Reset {
            return None;
        }
        if let Some(resp) = self.responses.pop_front() {
            return self.emit_response(resp, out);
        }
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if !self.request_due() {
            return None;
        }
        let psn = self.snd;
        let pending = *self.sq.iter().find(|p| p.index_of(psn).is_some())?;
        let k = pending.index_of(psn)?;
        let total = pending.length();
        let sent = k.saturating_mul(self.mtu).min(total);
        let payload_len = (total - sent).min(self.mtu);
        let first = k == 0;
        let last = k + 1 == pending.npkts;
        let opcode = request_opcode(pending.wqe.opcode, first, last);
        let (reth, imm) = match pending.wqe.opcode {
            SendOpcode::Send => (None, None),
            SendOpcode::SendWithImm { imm } => (None, Some(imm)),
            SendOpcode::RdmaWrite { remote_addr, rkey } => (
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
                Some(RethRepr {
                    virtual_addr: remote_addr,
                    rkey,
                    dma_len: total,
                }),
                Some(imm),
            ),
        };
        // rxe init_req_packet(): AckReq on END, or when more than RXE_MAX_PKT_PER_ACK packets
        // went without it.
        let ack_req = if opcode.is_end() {
            true
        } else {
            let before = self.noack_pkts;
            self.noack_pkts += 1;
            before > MAX_PKT_PER_ACK
        };
        if ack_req {
            self.noack_pkts = 0;
        }
        let pad = pad_for(payload_len as usize);
        let bth = RcBthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: pad,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: self.dest_qpn,
            ack_req,
            psn,
        };
        let Ok(bth_bytes) = bth.to_bytes() else {
            // dest_qpn and psn are 24-bit by construction; fail the WR if it ever happens.
            self.fail_wr(pending.first_psn, WcStatus::LocalQpOperationError);
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
            let gathered = match (
                pending.wqe.sge,
                out.get_mut(start..start + payload_len as usize),
            ) {
                (Some(sge), Some(dst)) => match sge.offset.checked_add(sent as usize) {
                    Some(off) => mem.gather(sge.lkey, off, dst),
                    None => Err(LocalAccessError::OutOfBounds),
                },
                _ => Err(LocalAccessError::OutOfBounds),
            };
            if gathered.is_err() {
                out.clear();
                self.fail_wr(pending.first_psn, WcStatus::LocalProtectionError);
                return None;
            }
        }
        let retransmission = (psn - self.hw) < 0;
        if retransmission {
            self.stats.packets_retransmitted += 1;
        } else {
            self.hw = psn.next();
            if last {
                self.stats.qp.messages_sent += 1;
            }
        }
        self.snd = psn.next();
        self.stats.qp.packets_sent += 1;
        if self.retrans_deadline.is_none() {
            self.retrans_deadline = self.timeout.map(|t| now + t);
        }
        Some(RcTxInfo {
            opcode,
            psn: psn.value(),
            payload_len,
            ack_req,
            retransmission,
            syndrome: None,
        })
    }

    fn fail_wr(&mut self, first_psn: Psn, status: WcStatus) {
        self.failed_wr = Some((first_psn, status));
        self.fail(QpErrorCause::LocalProtection);
    }

    fn emit_response(&mut self, resp: Response, out: &mut Vec<u8>) -> Option<RcTxInfo> {
        let repr = RcPacketRepr {
            bth: RcBthRepr {
                opcode: RcOpcode::Acknowledge,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qpn: self.dest_qpn,
                ack_req: false,
                psn: resp.psn,
            },
            reth: None,
            aeth: Some(AethRepr {
                syndrome: resp.syndrome,
                msn: resp.msn & PSN_MASK,
            }),
            imm: None,
            payload: &[],
        };
        if repr.emit(out).is_err() {
            // All fields are masked to their widths; nothing to send if it ever fails.
            out.clear();
            return None;
        }
        self.stats.qp.packets_sent += 1;
        match resp.syndrome {
            AethSyndrome::Ack { .. } => self.stats.acks_sent += 1,
            AethSyndrome::RnrNak { .. } => self.stats.rnr_naks_sent += 1,
            AethSyndrome::Nak(_) => self.stats.naks_sent += 1,
        }
        Some(RcTxInfo {
            opcode: RcOpcode::Acknowledge,
            psn: resp.psn.value(),
            payload_len: 0,
            ack_req: false,
            retransmission: false,
            syndrome: Some(resp.syndrome),
        })
    }

    /// Completer: acknowledges every PSN before `upto` (exclusive) and completes the WRs that
    /// ends. Returns whether anything new was acknowledged.
    fn acknowledge_before(
        &mut self,
        upto: Psn,
        now: Instant,
        scq: &mut dyn CompletionSink,
    ) -> bool {
        if (upto - self.una) <= 0 {
            return false;
        }
        self.una = upto;
        if (self.snd - upto) < 0 {
            self.snd = upto;
        }
        while let Some(p) = self.sq.front().copied() {
            if (upto - p.end_psn()) < 0 {
                break;
            }
            self.sq.pop_front();
            if p.wqe.signaled {
                let wc = WorkCompletion {
                    wr_id: p.wqe.wr_id,
                    status: WcStatus::Success,
                    opcode: p.wqe.opcode.wc_opcode(),
                    byte_len: p.length(),
                    imm: None,
                    qp_num: self.cfg.qpn,
                };
                if scq.push(wc).is_err() {
                    self.cq_overflowed = true;
                    self.fail(QpErrorCause::SendCqOverflow);
                    return true;
                }
            }
        }
        // Progress restores the retry budgets (rxe reset_retry_counters() runs when a WQE
        // completes; see the module docs) and restarts the timer if packets remain outstanding.
        self.retry_left = self.retry_cnt;
        self.rnr_retry_left = self.rnr_retry;
        self.nak_retry_psn = None;
        self.retrans_deadline = if self.una == self.hw {
            None
        } else {
            self.timeout.map(|t| now + t)
        };
        true
    }

    /// Fails the oldest outstanding WR with `status` now (its WC into `scq`) and moves the QP
    /// to ERROR.
    fn fail_head(&mut self, status: WcStatus, cause: QpErrorCause, scq: &mut dyn CompletionSink) {
        if let Some(p) = self.sq.pop_front() {
            let wc = WorkCompletion {
                wr_id: p.wqe.wr_id,
                status,
                opcode: p.wqe.opcode.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: self.cfg.qpn,
            };
            if scq.push(wc).is_err() {
                self.cq_overflowed = true;
            }
        }
        self.fail(cause);
    }

    fn receive_response(
        &mut self,
        now: Instant,
        pkt: &RcPacketRepr<'_>,
        scq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let Some(aeth) = pkt.aeth else {
            self.stats.qp.drops.inc(UcDropReason::Malformed);
            return RcRxOutcome::Dropped(UcDropReason::Malformed);
        };
        if self.state != QpState::Rts {
            self.stats.stale_responses += 1;
            return RcRxOutcome::StaleResponse;
        }
        let psn = pkt.bth.psn;
        // rxe check_psn() (completer): a response must name a PSN in [una, hw).
        let from_una = psn - self.una;
        let in_flight = self.hw - self.una;
        if from_una < 0 || from_una >= in_flight {
            self.stats.stale_responses += 1;
            return RcRxOutcome::StaleResponse;
        }
        match aeth.syndrome {
            AethSyndrome::Ack { .. } => {
                if self.acknowledge_before(psn.next(), now, scq) {
                    self.stats.acks_received += 1;
                }
                RcRxOutcome::Response
            }
            AethSyndrome::RnrNak { timer } => {
                self.stats.rnr_naks_received += 1;
                self.acknowledge_before(psn, now, scq);
                if self.state != QpState::Rts {
                    return RcRxOutcome::Response;
                }
                if self.rnr_retry != RNR_RETRY_INFINITE {
                    if self.rnr_retry_left == 0 {
                        self.stats.rnr_retry_exceeded += 1;
                        self.fail_head(
                            WcStatus::RnrRetryExceededError,
                            QpErrorCause::RnrRetryExceeded,
                            scq,
                        );
                        return RcRxOutcome::Response;
                    }
                    self.rnr_retry_left -= 1;
                }
                self.snd = psn;
                self.retrans_deadline = None;
                self.rnr_until =
                    Some(now + Duration::from_micros(u64::from(rnr_timer_micros(timer))));
                RcRxOutcome::Response
            }
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                self.stats.naks_received += 1;
                self.acknowledge_before(psn, now, scq);
                if self.state != QpState::Rts || self.nak_retry_psn == Some(psn) {
                    return RcRxOutcome::Response;
                }
                if self.retry_left == 0 {
                    self.stats.retry_exceeded += 1;
                    self.fail_head(
                        WcStatus::RetryExceededError,
                        QpErrorCause::RetryExceeded,
                        scq,
                    );
                    return RcRxOutcome::Response;
                }
                self.retry_left -= 1;
                self.nak_retry_psn = Some(psn);
                self.snd = psn;
                RcRxOutcome::Response
            }
            AethSyndrome::Nak(code) => {
                self.stats.naks_received += 1;
                self.acknowledge_before(psn, now, scq);
                if self.state != QpState::Rts {
                    return RcRxOutcome::Response;
                }
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemoteInvalidRequestError,
                    NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                    _ => WcStatus::RemoteOperationError,
                };
                self.fail_head(status, QpErrorCause::RemoteNak, scq);
                RcRxOutcome::Response
            }
        }
    }

    // -- responder ---------------------------------------------------------------------------

    fn queue_response(&mut self, syndrome: AethSyndrome, psn: Psn) {
        let resp = Response {
            syndrome,
            psn,
            msn: self.msn,
        };
        if let (AethSyndrome::Ack { .. }, Some(back)) = (syndrome, self.responses.back_mut()) {
            if matches!(back.syndrome, AethSyndrome::Ack { .. }) {
                *back = resp;
                return;
            }
        }
        if self.responses.len() >= MAX_PENDING_RESPONSES {
            self.stats.responses_dropped += 1;
            return;
        }
        self.responses.push_back(resp);
    }

    fn ack(&mut self, psn: Psn) {
        self.queue_response(
            AethSyndrome::Ack {
                credits: ACK_CREDITS_UNLIMITED,
            },
            psn,
        );
    }

    /// Class C error (rxe `do_class_ac_error()`): NAK with the expected PSN, responder to
    /// ERROR.
    fn nak_error(&mut self, code: NakCode, reason: UcDropReason) -> RcRxOutcome {
        self.nak_error_with(code, reason, QpErrorCause::RequestError)
    }

    fn nak_error_with(
        &mut self,
        code: NakCode,
        reason: UcDropReason,
        cause: QpErrorCause,
    ) -> RcRxOutcome {
        self.stats.qp.drops.inc(reason);
        self.inbound = None;
        self.queue_response(AethSyndrome::Nak(code), self.epsn);
        self.fail(cause);
        RcRxOutcome::Dropped(reason)
    }

    /// Processes one inbound packet addressed to this QP (ICRC-checked, demultiplexed by
    /// destination QPN): a request (responder side) or an ACKNOWLEDGE (completer side; send WRs
    /// complete into `scq`). Receive WCs go to `rcq`. See the module docs for the rules.
    pub fn receive(
        &mut self,
        now: Instant,
        pkt: &RcPacketRepr<'_>,
        mem: &dyn MemoryTable,
        scq: &mut dyn CompletionSink,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        self.stats.qp.packets_received += 1;
        match self.state {
            QpState::Rtr | QpState::Rts => {}
            QpState::Reset | QpState::Init => {
                self.stats.qp.drops.inc(UcDropReason::QpNotReady);
                return RcRxOutcome::Dropped(UcDropReason::QpNotReady);
            }
            QpState::Error => {
                self.stats.qp.drops.inc(UcDropReason::QpError);
                return RcRxOutcome::Dropped(UcDropReason::QpError);
            }
        }
        if !pkey_matches(pkt.bth.pkey) {
            self.stats.qp.drops.inc(UcDropReason::BadPkey);
            return RcRxOutcome::Dropped(UcDropReason::BadPkey);
        }
        let op = pkt.bth.opcode;
        if !op.is_request() {
            return self.receive_response(now, pkt, scq);
        }
        let psn = pkt.bth.psn;

        // check_psn (RC).
        let diff = psn - self.epsn;
        if diff > 0 {
            self.stats.out_of_sequence += 1;
            if !self.sent_psn_nak {
                self.sent_psn_nak = true;
                self.queue_response(AethSyndrome::Nak(NakCode::PsnSequenceError), self.epsn);
            }
            return RcRxOutcome::OutOfSequence;
        }
        if diff < 0 {
            // duplicate_request(): SEND and WRITE are acknowledged again, not re-executed.
            self.stats.duplicates += 1;
            let prev = self.epsn + PSN_MASK; // the expected PSN - 1, modulo 2^24
            self.ack(prev);
            return RcRxOutcome::Duplicate;
        }
        self.sent_psn_nak = false;

        // check_op_seq (RC): no resync; a wrong opcode is an invalid request.
        let seq_ok = match self.inbound {
            None => op.is_start(),
            Some(Inbound::Send { .. }) => op.is_send() && !op.is_start(),
            Some(Inbound::Write { .. }) => op.is_write() && !op.is_start(),
        };
        if !seq_ok {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        }

        // check_op_valid (RC): WRITE needs REMOTE_WRITE on the QP (rxe answers
        // RESPST_ERR_UNSUPPORTED_OPCODE: NAK invalid request).
        if op.is_write() && !self.access.contains(AccessFlags::REMOTE_WRITE) {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::AccessDenied);
        }

        // check_resource: SEND FIRST/ONLY and WRITE LAST/ONLY_WITH_IMMEDIATE need a receive WR;
        // without one, RNR NAK and wait for the retry (the PSN does not move).
        let needs_rwr = (op.is_send() && op.is_start()) || (op.is_write() && op.has_immdt());
        if needs_rwr && self.rq.is_empty() {
            self.stats.requests_rnr += 1;
            self.queue_response(
                AethSyndrome::RnrNak {
                    timer: self.min_rnr_timer,
                },
                psn,
            );
            return RcRxOutcome::ReceiverNotReady;
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
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::BadLength);
        }
        let len = len as u32;

        if op.is_write() {
            return self.execute_write(pkt, psn, len, mem, rcq);
        }
        self.execute_send(pkt, psn, len, mem, rcq)
    }

    fn execute_write(
        &mut self,
        pkt: &RcPacketRepr<'_>,
        psn: Psn,
        len: u32,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let op = pkt.bth.opcode;
        // check_rkey: RETH on FIRST/ONLY.
        if op.has_reth() {
            let Some(reth) = pkt.reth else {
                return self.nak_error(NakCode::InvalidRequest, UcDropReason::BadLength);
            };
            if reth.dma_len > IBTA_MAX_MSG_SIZE {
                return self.nak_error(NakCode::InvalidRequest, UcDropReason::BadLength);
            }
            if reth.dma_len != 0 {
                if let Err(reason) =
                    mem.check_remote_write(reth.rkey, reth.virtual_addr, u64::from(reth.dma_len))
                {
                    return self.nak_error(NakCode::RemoteAccessError, reason);
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
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        };
        let consistent = if resid > self.mtu {
            len == self.mtu
        } else {
            len == resid
        };
        if !consistent {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::BadLength);
        }
        if len > 0 {
            if let Err(reason) = mem.remote_write(rkey, va, pkt.payload) {
                return self.nak_error(NakCode::RemoteAccessError, reason);
            }
        }
        let resid = resid - len;
        self.inbound = Some(Inbound::Write {
            va: va.wrapping_add(u64::from(len)),
            rkey,
            resid,
            length,
        });
        self.epsn = psn.next();
        self.stats.requests_executed += 1;
        if !op.is_end() {
            self.acknowledge(pkt, psn);
            return RcRxOutcome::Accepted;
        }
        self.inbound = None;
        if !op.has_immdt() {
            return self.message_done(pkt, psn, None, rcq);
        }
        let Some(wqe) = self.rq.pop_front() else {
            // check_resource made sure there is one.
            return self.nak_error(NakCode::RemoteOperationalError, UcDropReason::NoReceiveWr);
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: length,
            imm: pkt.imm,
            qp_num: self.cfg.qpn,
        };
        self.message_done(pkt, psn, Some(wc), rcq)
    }

    fn execute_send(
        &mut self,
        pkt: &RcPacketRepr<'_>,
        psn: Psn,
        len: u32,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let op = pkt.bth.opcode;
        if op.is_start() {
            self.inbound = Some(Inbound::Send { received: 0 });
        }
        let Some(Inbound::Send { received }) = self.inbound else {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        };
        let Some(wqe) = self.rq.front().copied() else {
            return self.nak_error(NakCode::RemoteOperationalError, UcDropReason::NoReceiveWr);
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
                // with IBV_WC_LOC_QP_OP_ERR, the requester gets NAK remote operational error,
                // the QP moves to ERROR.
                self.rq.pop_front();
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
                let cause = if reason == UcDropReason::MessageTooLong {
                    QpErrorCause::MessageTooLong
                } else {
                    QpErrorCause::BadReceiveWr
                };
                return self.nak_error_with(NakCode::RemoteOperationalError, reason, cause);
            }
        }
        let received = received + len;
        self.epsn = psn.next();
        self.stats.requests_executed += 1;
        if !op.is_end() {
            self.inbound = Some(Inbound::Send { received });
            self.acknowledge(pkt, psn);
            return RcRxOutcome::Accepted;
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
        self.message_done(pkt, psn, Some(wc), rcq)
    }

    /// rxe `acknowledge()`: an ACK for a packet that asks for one.
    fn acknowledge(&mut self, pkt: &RcPacketRepr<'_>, psn: Psn) {
        if pkt.bth.ack_req {
            self.ack(psn);
        }
    }

    /// A message ended: MSN + 1, the receive WC if one is due, then the ACK.
    fn message_done(
        &mut self,
        pkt: &RcPacketRepr<'_>,
        psn: Psn,
        wc: Option<WorkCompletion>,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        self.msn = (self.msn + 1) & PSN_MASK;
        if let Some(wc) = wc {
            if rcq.push(wc).is_err() {
                // IBTA class G / rxe RESPST_ERR_CQ_OVERFLOW: the completion is lost and the QP
                // moves to ERROR without a response; the requester's timer gives up in turn.
                self.stats.qp.drops.inc(UcDropReason::CqOverflow);
                self.cq_overflowed = true;
                self.fail(QpErrorCause::RecvCqOverflow);
                return RcRxOutcome::Dropped(UcDropReason::CqOverflow);
            }
        }
        self.stats.qp.messages_completed += 1;
        self.acknowledge(pkt, psn);
        RcRxOutcome::Completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_follows_the_exponent() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(ack_timeout(31), Some(Duration::from_nanos(4096u64 << 31)));
        assert_eq!(ack_timeout(32), None, "masked to 5 bits");
    }

    #[test]
    fn request_opcodes_cover_every_shape() {
        let op = SendOpcode::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        assert_eq!(
            request_opcode(op, true, true),
            RcOpcode::RdmaWriteOnlyWithImmediate
        );
        assert_eq!(
            request_opcode(op, false, true),
            RcOpcode::RdmaWriteLastWithImmediate
        );
        assert_eq!(
            request_opcode(SendOpcode::Send, false, false),
            RcOpcode::SendMiddle
        );
    }
}
