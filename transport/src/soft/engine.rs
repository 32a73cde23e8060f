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

use std::fmt;

use crate::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, UcDropReason, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::soft::memory::MemoryTable;
use crate::soft::packet::{Opcode, PacketRepr};
use crate::soft::psn::Psn;
pub use crate::soft::qp::QpConfig as UcQpConfig;
use crate::soft::qp::{
    emit_request, request_bth, request_opcode, scatter_cause, scatter_send, BuildError, Inbound,
    QpCore,
};
pub use crate::soft::qp::{
    CompletionSink, CqFull, LocalSge, ModifyError, PostRefusal, RecvRefusal, RecvWqe, SendWqe,
    VecCq,
};

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

/// One UC queue pair: the shared [`QpCore`](crate::soft::qp) (state machine, queues,
/// placement, error bookkeeping) plus what UC alone has: a send PSN and segmentation offset,
/// and the responder's "message doomed" flag (no ACK, no retry).
pub struct UcQp {
    core: QpCore<SendWqe>,
    // requester
    sq_psn: Psn,
    sq_sent: u32,
    // responder: the message in progress is dropped until the next FIRST/ONLY.
    drop_msg: bool,
}

impl fmt::Debug for UcQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UcQp")
            .field("qpn", &format_args!("{:#08x}", self.core.qpn()))
            .field("state", &self.core.state)
            .field("dest_qpn", &format_args!("{:#08x}", self.core.dest_qpn))
            .field("mtu", &self.core.mtu)
            .field("sq", &self.core.sq.len())
            .field("sq_psn", &format_args!("{}", self.sq_psn))
            .field("rq", &self.core.rq.len())
            .field("epsn", &format_args!("{}", self.core.epsn))
            .field("drop_msg", &self.drop_msg)
            .finish_non_exhaustive()
    }
}

impl UcQp {
    /// A QP in RESET.
    pub fn new(cfg: UcQpConfig) -> Self {
        Self {
            core: QpCore::new(cfg),
            sq_psn: Psn::ZERO,
            sq_sent: 0,
            drop_msg: false,
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

    /// Next PSN the requester sends (24 bits).
    pub fn sq_psn(&self) -> u32 {
        self.sq_psn.value()
    }

    /// Next PSN the responder expects (24 bits).
    pub fn expected_psn(&self) -> u32 {
        self.core.epsn.value()
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.core.stats
    }

    /// Why the QP moved to ERROR on its own, if it did.
    pub fn error_cause(&self) -> Option<QpErrorCause> {
        self.core.error_cause
    }

    /// Takes the cause of an ERROR transition not yet reported (for an async event).
    pub fn take_error_event(&mut self) -> Option<QpErrorCause> {
        self.core.take_error_event()
    }

    /// Takes whether a CQ overflow happened since the last call (for an async CQ event).
    pub fn take_cq_overflow(&mut self) -> bool {
        self.core.take_cq_overflow()
    }

    /// Outstanding send WRs.
    pub fn sq_len(&self) -> usize {
        self.core.sq.len()
    }

    /// Posted receive WRs.
    pub fn rq_len(&self) -> usize {
        self.core.rq.len()
    }

    /// Whether [`UcQp::poll_transmit`] may produce a packet.
    pub fn wants_transmit(&self) -> bool {
        self.core.state == QpState::Rts && !self.core.sq.is_empty()
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

    /// Messages dropped so far, all reasons (cheap: to tell whether a packet added one).
    pub(crate) fn drops_total(&self) -> u64 {
        self.core.stats.drops.total()
    }

    /// Counts a drop detected outside the engine (e.g. a source address mismatch).
    pub fn count_drop(&mut self, reason: UcDropReason) {
        self.core.count_drop(reason);
    }

    // -- state machine -----------------------------------------------------------------------

    /// RESET → INIT with the QP access flags (`qp_access_flags`).
    ///
    /// # Errors
    /// [`ModifyError`] unless in RESET.
    pub fn modify_to_init(&mut self, access: AccessFlags) -> Result<(), ModifyError> {
        self.core.modify_to_init(access)
    }

    /// INIT → RTR: peer QPN, expected PSN, path MTU.
    ///
    /// # Errors
    /// [`ModifyError`] unless in INIT.
    pub fn modify_to_rtr(&mut self, attr: RtrAttr) -> Result<(), ModifyError> {
        self.core
            .modify_to_rtr(attr.dest_qpn, attr.rq_psn, attr.path_mtu)?;
        self.drop_msg = false;
        Ok(())
    }

    /// RTR → RTS with the first send PSN (its low 24 bits).
    ///
    /// # Errors
    /// [`ModifyError`] unless in RTR.
    pub fn modify_to_rts(&mut self, sq_psn: u32) -> Result<(), ModifyError> {
        self.core.modify_to_rts()?;
        self.sq_psn = Psn::new(sq_psn);
        self.sq_sent = 0;
        Ok(())
    }

    /// Any state → ERROR on request (`ibv_modify_qp(IBV_QPS_ERR)`); WRs are flushed by
    /// [`UcQp::flush`]. No async event is raised for a requested transition.
    pub fn modify_to_error(&mut self) {
        self.core.state = QpState::Error;
        self.core.inbound = None;
        self.drop_msg = false;
    }

    /// Any state → RESET: queues are emptied without completions (ibverbs semantics).
    pub fn modify_to_reset(&mut self) {
        self.core.reset();
        self.sq_sent = 0;
        self.drop_msg = false;
    }

    fn fail(&mut self, cause: QpErrorCause) {
        self.modify_to_error();
        self.core.record_failure(cause);
    }

    // -- posting -----------------------------------------------------------------------------

    /// Queues a send WR. Needs RTS and room in the send queue. SGE bounds and keys are checked
    /// by the caller (the device knows the MR); the engine re-resolves the lkey when it builds
    /// packets and completes the WR with [`WcStatus::LocalProtectionError`] if it is gone.
    ///
    /// # Errors
    /// [`PostRefusal`].
    pub fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostRefusal> {
        self.core.check_post_send(&wqe)?;
        self.core.sq.push_back(wqe);
        Ok(())
    }

    /// Queues a receive WR. Allowed in INIT, RTR, RTS and ERROR (flushed by [`UcQp::flush`]).
    ///
    /// # Errors
    /// [`RecvRefusal`].
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), RecvRefusal> {
        self.core.post_recv(wqe)
    }

    /// In ERROR: completes queued WRs with [`WcStatus::WrFlushError`] (send queue into `scq`,
    /// receive queue into `rcq`) until a CQ is full. Returns whether everything was flushed.
    pub fn flush(&mut self, scq: &mut dyn CompletionSink, rcq: &mut dyn CompletionSink) -> bool {
        if self.core.state != QpState::Error {
            return true;
        }
        if !self.core.flush_sq(scq, |_| WcStatus::WrFlushError) {
            return false;
        }
        self.sq_sent = 0;
        self.core.flush_rq(rcq)
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
        if self.core.state != QpState::Rts {
            return None;
        }
        let wqe = *self.core.sq.front()?;
        let mtu = self.core.mtu;
        let total = wqe.length();
        let sent = self.sq_sent.min(total);
        let remaining = total - sent;
        let last = remaining <= mtu;
        let payload_len = remaining.min(mtu);
        let opcode = request_opcode(wqe.opcode, sent == 0, last);
        // BTH bits as rxe sends them on UC: AckReq 0 (no ACKs on UC).
        let bth = request_bth(opcode, self.core.dest_qpn, false, self.sq_psn);
        if let Err(e) = emit_request(out, bth, opcode, &wqe, sent, payload_len, mem) {
            self.complete_send_error(
                match e {
                    // dest_qpn and psn are masked to 24 bits, so this cannot happen; treat it
                    // as a local QP operation error if it ever does.
                    BuildError::Header => WcStatus::LocalQpOperationError,
                    BuildError::Memory => WcStatus::LocalProtectionError,
                },
                scq,
            );
            return None;
        }
        let psn = self.sq_psn;
        self.sq_psn = psn.next();
        self.core.stats.packets_sent += 1;
        if last {
            self.core.sq.pop_front();
            self.sq_sent = 0;
            self.core.stats.messages_sent += 1;
            if wqe.signaled {
                let wc = self.core.wc(
                    wqe.wr_id,
                    WcStatus::Success,
                    wqe.opcode.wc_opcode(),
                    total,
                    None,
                );
                if !self.core.push_wc(scq, wc) {
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
        if let Some(w) = self.core.sq.pop_front() {
            let wc = self.core.send_error_wc(&w, status);
            self.core.push_wc(scq, wc);
        }
        self.sq_sent = 0;
        self.fail(QpErrorCause::LocalProtection);
    }

    // -- responder ---------------------------------------------------------------------------

    fn drop_message(&mut self, reason: UcDropReason) -> RxOutcome {
        self.core.inbound = None;
        self.drop_msg = true;
        self.core.stats.drops.inc(reason);
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
        if let Err(reason) = self.core.admit(pkt.bth.pkey) {
            return RxOutcome::Dropped(reason);
        }
        let op = pkt.bth.opcode;
        let start = op.is_start();
        if let Some(outcome) = self.check_psn(pkt.bth.psn, start) {
            return outcome;
        }
        // From here on the packet has taken its place in the PSN sequence; the next expected
        // PSN follows it whether or not the message survives (so that `psn_resyncs` counts
        // only PSNs missing on the wire).
        self.core.epsn = pkt.bth.psn.next();

        // check_op_seq (UC).
        match (self.core.inbound, start) {
            (Some(_), true) => {
                // The message in progress lost its LAST: discard it, reuse its receive WR
                // (nothing was consumed), and treat this packet as a new message.
                self.core.inbound = None;
                self.core.stats.drops.inc(UcDropReason::CutShort);
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
        if op.is_write() && !self.core.access.contains(AccessFlags::REMOTE_WRITE) {
            return self.drop_message(UcDropReason::AccessDenied);
        }

        // check_resource: SEND packets and WRITE LAST/ONLY_WITH_IMMEDIATE need a receive WR.
        let needs_rwr = op.is_send() || (op.is_write() && op.has_immdt());
        if needs_rwr && self.core.rq.is_empty() {
            return self.drop_message(UcDropReason::NoReceiveWr);
        }

        if !self.core.length_ok(op, pkt.payload.len()) {
            return self.drop_message(UcDropReason::BadLength);
        }
        if op.is_write() {
            return self.receive_write(pkt, mem, rcq);
        }
        self.receive_send(pkt, mem, rcq)
    }

    /// check_psn (UC): a packet off the expected PSN resyncs on FIRST/ONLY and dooms its
    /// message otherwise; the packets of a doomed message are discarded until the next
    /// FIRST/ONLY. `None` lets the packet go on.
    fn check_psn(&mut self, psn: Psn, start: bool) -> Option<RxOutcome> {
        let psn_ok = psn == self.core.epsn;
        if !self.drop_msg && psn_ok {
            return None;
        }
        if start {
            if !psn_ok {
                self.core.stats.psn_resyncs += 1;
            }
            self.drop_msg = false;
            return None;
        }
        self.core.epsn = psn.next();
        if self.drop_msg {
            self.core.stats.packets_discarded += 1;
            return Some(RxOutcome::Discarded);
        }
        Some(self.drop_message(UcDropReason::PsnGap))
    }

    /// check_rkey and execute for an RDMA WRITE packet: data is placed packet by packet.
    fn receive_write(
        &mut self,
        pkt: &PacketRepr<'_>,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RxOutcome {
        let op = pkt.bth.opcode;
        let progress = match self.core.place_write(op, pkt.reth, pkt.payload, mem) {
            Ok(p) => p,
            Err(fault) => return self.drop_message(fault.reason()),
        };
        if !op.is_end() {
            return RxOutcome::Accepted;
        }
        if progress.resid != 0 {
            // An END packet before the DMA length was reached (rxe: length check).
            return self.drop_message(UcDropReason::BadLength);
        }
        self.core.inbound = None;
        if !op.has_immdt() {
            self.core.stats.messages_completed += 1;
            return RxOutcome::Completed;
        }
        let Some(wqe) = self.core.rq.pop_front() else {
            return self.drop_message(UcDropReason::NoReceiveWr);
        };
        let wc = self.core.wc(
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            progress.length,
            pkt.imm,
        );
        self.complete_recv(wc, rcq)
    }

    /// Execute for a SEND packet: scatter into the head receive WR.
    fn receive_send(
        &mut self,
        pkt: &PacketRepr<'_>,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RxOutcome {
        let op = pkt.bth.opcode;
        if op.is_start() {
            self.core.inbound = Some(Inbound::Send { received: 0 });
        }
        let Some(Inbound::Send { received }) = self.core.inbound else {
            return self.drop_message(UcDropReason::OpcodeSequence);
        };
        let Some(wqe) = self.core.rq.front() else {
            return self.drop_message(UcDropReason::NoReceiveWr);
        };
        if let Err(reason) = scatter_send(&wqe, received, pkt.payload, mem) {
            // rxe: copy_data fails → RESPST_ERR_MALFORMED_WQE → class A: the WR completes
            // with IBV_WC_LOC_QP_OP_ERR and the QP moves to ERROR.
            self.core.inbound = None;
            self.core.stats.drops.inc(reason);
            self.core.fail_receive_wr(&wqe, rcq);
            self.fail(scatter_cause(reason));
            return RxOutcome::Dropped(reason);
        }
        let received = received + pkt.payload.len() as u32;
        if !op.is_end() {
            self.core.inbound = Some(Inbound::Send { received });
            return RxOutcome::Accepted;
        }
        self.core.inbound = None;
        self.core.rq.pop_front();
        let wc = self.core.wc(
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            received,
            pkt.imm,
        );
        self.complete_recv(wc, rcq)
    }

    fn complete_recv(&mut self, wc: WorkCompletion, rcq: &mut dyn CompletionSink) -> RxOutcome {
        if !self.core.complete_receive(wc, rcq) {
            // IBTA class G / rxe RESPST_ERR_CQ_OVERFLOW: the WR is consumed, the completion
            // lost, the QP moves to ERROR.
            self.fail(QpErrorCause::RecvCqOverflow);
            return RxOutcome::Dropped(UcDropReason::CqOverflow);
        }
        self.core.stats.messages_completed += 1;
        RxOutcome::Completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SendOpcode;
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
