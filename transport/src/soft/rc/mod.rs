//! The sans-IO RoCEv2 Reliable Connection engine: one [`RcQp`] per queue pair.
//!
//! No sockets, no threads, no clock of its own. The owner feeds inbound packets with
//! [`RcQp::receive`], pulls outbound packets (requests and acknowledgements) with
//! [`RcQp::poll_transmit`], asks when to wake with [`RcQp::poll_timeout`] and reports that the
//! time came with [`RcQp::handle_timeout`]. Every call that depends on time takes `now`. The
//! API mirrors [`UcQp`](crate::soft::engine::UcQp); both hold one
//! [`QpCore`](crate::soft::qp) (state machine, post checks, flush, error events, WRITE
//! placement and SEND scatter, request layout) and share its WR, CQ and error types; this
//! module adds the PSN window, ACK/NAK, retransmission and RNR. Requester and completer are in
//! `requester.rs`, the responder in `responder.rs`. The packets are
//! [`RcPacketRepr`](crate::soft::packet::RcPacketRepr)s (RC opcodes `0x00..=0x0b` and
//! ACKNOWLEDGE `0x11`). Only SEND, SEND_WITH_IMM, RDMA WRITE and RDMA WRITE_WITH_IMM are
//! implemented; RDMA READ and atomics are not.
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
//!   timer of its syndrome (IBTA Table 45,
//!   [`rnr_timer_micros`](crate::soft::packet::rnr_timer_micros)), then resends from `p` (rxe
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

mod requester;
mod responder;

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use crate::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, RcCounters, UcDropReason, WcStatus,
};
use crate::soft::packet::{AethSyndrome, RcOpcode};
use crate::soft::psn::Psn;
pub use crate::soft::qp::QpConfig as RcQpConfig;
use crate::soft::qp::{
    CompletionSink, ModifyError, PostRefusal, QpCore, RecvRefusal, RecvWqe, SendEntry, SendWqe,
};

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

impl SendEntry for Pending {
    fn wqe(&self) -> &SendWqe {
        &self.wqe
    }
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

/// One RC queue pair: the shared [`QpCore`](crate::soft::qp) (state machine, queues,
/// placement, error bookkeeping) plus the RC requester (PSN window, retry budgets, timers),
/// completer and responder (MSN, NAK state, response queue).
pub struct RcQp {
    core: QpCore<Pending>,
    min_rnr_timer: u8,
    timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    // requester
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
    msn: u32,
    sent_psn_nak: bool,
    responses: VecDeque<Response>,
    /// The RC counters; their `qp` part stays zero (the shared counters live in the core).
    counters: RcStats,
}

impl fmt::Debug for RcQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcQp")
            .field("qpn", &format_args!("{:#08x}", self.core.qpn()))
            .field("state", &self.core.state)
            .field("dest_qpn", &format_args!("{:#08x}", self.core.dest_qpn))
            .field("sq", &self.core.sq.len())
            .field("una", &format_args!("{}", self.una))
            .field("snd", &format_args!("{}", self.snd))
            .field("sq_psn", &format_args!("{}", self.sq_psn))
            .field("rq", &self.core.rq.len())
            .field("epsn", &format_args!("{}", self.core.epsn))
            .field("msn", &self.msn)
            .field("responses", &self.responses.len())
            .finish_non_exhaustive()
    }
}

impl RcQp {
    /// A QP in RESET.
    pub fn new(cfg: RcQpConfig) -> Self {
        Self {
            core: QpCore::new(cfg),
            min_rnr_timer: 0,
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
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
            msn: 0,
            sent_psn_nak: false,
            responses: VecDeque::new(),
            counters: RcStats::default(),
        }
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.core.qpn()
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.core.state
    }

    /// The peer's QP number (valid from RTR).
    pub fn dest_qpn(&self) -> u32 {
        self.core.dest_qpn
    }

    /// Path MTU in bytes (valid from RTR).
    pub fn path_mtu(&self) -> u32 {
        self.core.mtu
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
        self.core.epsn.value()
    }

    /// The responder's message sequence number: messages completed, modulo 2^24.
    pub fn msn(&self) -> u32 {
        self.msn
    }

    /// Counters.
    pub fn stats(&self) -> RcStats {
        RcStats {
            qp: self.core.stats,
            ..self.counters
        }
    }

    /// Why the QP moved to ERROR on its own, if it did.
    pub fn error_cause(&self) -> Option<QpErrorCause> {
        self.core.error_cause
    }

    /// Takes the cause of an ERROR transition not yet reported (for an async event).
    pub fn take_error_event(&mut self) -> Option<QpErrorCause> {
        self.core.take_error_event()
    }

    /// Takes whether a CQ overflow happened since the last call.
    pub fn take_cq_overflow(&mut self) -> bool {
        self.core.take_cq_overflow()
    }

    /// Send WRs not yet completed (posted, in flight or waiting for their ACK).
    pub fn sq_len(&self) -> usize {
        self.core.sq.len()
    }

    /// Posted receive WRs.
    pub fn rq_len(&self) -> usize {
        self.core.rq.len()
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
        self.core.state == QpState::Rts
            && self.rnr_until.is_none()
            && self.snd != self.sq_psn
            && (self.snd - self.una) < MAX_UNACKED_PSNS as i32
    }

    /// Whether the QP is in ERROR with WRs still to flush.
    pub fn needs_flush(&self) -> bool {
        self.core.needs_flush()
    }

    /// Takes receive WRs from `srq` instead of an own queue (created on an SRQ; before any
    /// WR is posted).
    pub(crate) fn use_srq(&mut self, srq: std::sync::Arc<crate::soft::qp::SrqQueue>) {
        self.core.rq = crate::soft::qp::RecvQueue::Shared { srq, held: None };
    }

    /// Counts a drop detected outside the engine (e.g. a source address mismatch).
    pub fn count_drop(&mut self, reason: UcDropReason) {
        self.core.count_drop(reason);
    }

    // -- state machine -----------------------------------------------------------------------

    /// RESET → INIT with the QP access flags.
    ///
    /// # Errors
    /// [`ModifyError`] unless in RESET.
    pub fn modify_to_init(&mut self, access: AccessFlags) -> Result<(), ModifyError> {
        self.core.modify_to_init(access)
    }

    /// INIT → RTR: peer QPN, expected PSN, path MTU, RNR timer code for RNR NAKs.
    ///
    /// # Errors
    /// [`ModifyError`] unless in INIT.
    pub fn modify_to_rtr(&mut self, attr: RcRtrAttr) -> Result<(), ModifyError> {
        self.core
            .modify_to_rtr(attr.dest_qpn, attr.rq_psn, attr.path_mtu)?;
        self.min_rnr_timer = attr.min_rnr_timer & 0x1f;
        self.msn = 0;
        self.sent_psn_nak = false;
        Ok(())
    }

    /// RTR → RTS: first send PSN, ACK timeout exponent, retry counts.
    ///
    /// # Errors
    /// [`ModifyError`] unless in RTR.
    pub fn modify_to_rts(&mut self, attr: RcRtsAttr) -> Result<(), ModifyError> {
        self.core.modify_to_rts()?;
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
        Ok(())
    }

    /// Any state → ERROR on request; WRs are flushed by [`RcQp::flush`]. Timers stop; queued
    /// responses may still be pulled (a NAK that announced the error).
    pub fn modify_to_error(&mut self) {
        self.core.state = QpState::Error;
        self.retrans_deadline = None;
        self.rnr_until = None;
    }

    /// Any state → RESET: queues, responses, counters of progress and the error cause are
    /// cleared.
    pub fn modify_to_reset(&mut self) {
        self.core.reset();
        self.responses.clear();
        self.retrans_deadline = None;
        self.rnr_until = None;
        self.nak_retry_psn = None;
        self.failed_wr = None;
        self.sent_psn_nak = false;
    }

    fn fail(&mut self, cause: QpErrorCause) {
        self.modify_to_error();
        self.core.record_failure(cause);
    }

    // -- posting -----------------------------------------------------------------------------

    /// Queues a send WR and gives it its PSNs (one per MTU of payload, at least one). Needs
    /// RTS and room in the send queue; a WR stays in the queue until it is acknowledged.
    ///
    /// # Errors
    /// [`PostRefusal`].
    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostRefusal> {
        self.core.check_post_send(&wqe)?;
        let npkts = wqe.length().div_ceil(self.core.mtu).max(1);
        self.core.sq.push_back(Pending {
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
        self.core.post_recv(wqe)
    }

    /// In ERROR: completes queued WRs, send queue into `scq`, receive queue into `rcq`, until a
    /// CQ is full. Send WRs complete with [`WcStatus::WrFlushError`], except one that failed
    /// on a timer (retry exceeded) or a local memory error, which completes with that status.
    /// Returns whether everything was flushed.
    pub fn flush(&mut self, scq: &mut dyn CompletionSink, rcq: &mut dyn CompletionSink) -> bool {
        if self.core.state != QpState::Error {
            return true;
        }
        let failed = self.failed_wr;
        let flushed = self.core.flush_sq(scq, |p| match failed {
            Some((psn, status)) if psn == p.first_psn => status,
            _ => WcStatus::WrFlushError,
        });
        if !flushed {
            return false;
        }
        self.failed_wr = None;
        self.core.flush_rq(rcq)
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
        if self.core.state != QpState::Rts {
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
        self.counters.timeouts += 1;
        if self.retry_left == 0 {
            self.counters.retry_exceeded += 1;
            self.failed_wr = self
                .core
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SendOpcode;

    /// The request opcode for packet `first`/`last` of a WR, as the requester picks it.
    fn request_opcode(opcode: SendOpcode, first: bool, last: bool) -> RcOpcode {
        RcOpcode::from_uc(crate::soft::qp::request_opcode(opcode, first, last))
    }

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
