//! The RC responder (IBTA 9.7.5; rxe `rxe_resp.c`): `check_psn`, `check_op_seq`,
//! `check_op_valid`, `check_resource`, `check_length`, `check_rkey`, `execute` and
//! `acknowledge`, and the response queue. The rules are in the parent module's docs.

use std::time::Instant;

use crate::api::{
    AccessFlags, QpErrorCause, UcDropReason, WcOpcode, WcStatus, WorkCompletion, PSN_MASK,
};
use crate::soft::memory::MemoryTable;
use crate::soft::packet::{AethSyndrome, NakCode, RcPacketRepr, ACK_CREDITS_UNLIMITED};
use crate::soft::psn::Psn;
use crate::soft::qp::{scatter_cause, scatter_send, CompletionSink, Inbound, RequestFault};

use super::{RcQp, RcRxOutcome, Response, MAX_PENDING_RESPONSES};

impl RcQp {
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
            self.counters.responses_dropped += 1;
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
        self.core.stats.drops.inc(reason);
        self.core.inbound = None;
        self.queue_response(AethSyndrome::Nak(code), self.core.epsn);
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
        if let Err(reason) = self.core.admit(pkt.bth.pkey) {
            return RcRxOutcome::Dropped(reason);
        }
        let op = pkt.bth.opcode;
        // A request has the shape of a UC opcode; ACKNOWLEDGE has none.
        let Some(shape) = op.uc_shape() else {
            return self.receive_response(now, pkt, scq);
        };
        let psn = pkt.bth.psn;

        // check_psn (RC).
        let diff = psn - self.core.epsn;
        if diff > 0 {
            self.counters.out_of_sequence += 1;
            if !self.sent_psn_nak {
                self.sent_psn_nak = true;
                self.queue_response(AethSyndrome::Nak(NakCode::PsnSequenceError), self.core.epsn);
            }
            return RcRxOutcome::OutOfSequence;
        }
        if diff < 0 {
            // duplicate_request(): SEND and WRITE are acknowledged again, not re-executed.
            self.counters.duplicates += 1;
            let prev = self.core.epsn + PSN_MASK; // the expected PSN - 1, modulo 2^24
            self.ack(prev);
            return RcRxOutcome::Duplicate;
        }
        self.sent_psn_nak = false;

        // check_op_seq (RC): no resync; a wrong opcode is an invalid request.
        let seq_ok = match self.core.inbound {
            None => op.is_start(),
            Some(Inbound::Send { .. }) => op.is_send() && !op.is_start(),
            Some(Inbound::Write { .. }) => op.is_write() && !op.is_start(),
        };
        if !seq_ok {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        }

        // check_op_valid (RC): WRITE needs REMOTE_WRITE on the QP (rxe answers
        // RESPST_ERR_UNSUPPORTED_OPCODE: NAK invalid request).
        if op.is_write() && !self.core.access.contains(AccessFlags::REMOTE_WRITE) {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::AccessDenied);
        }

        // check_resource: SEND FIRST/ONLY and WRITE LAST/ONLY_WITH_IMMEDIATE need a receive WR;
        // without one, RNR NAK and wait for the retry (the PSN does not move).
        let needs_rwr = (op.is_send() && op.is_start()) || (op.is_write() && op.has_immdt());
        if needs_rwr && self.core.rq.is_empty() {
            self.counters.requests_rnr += 1;
            self.queue_response(
                AethSyndrome::RnrNak {
                    timer: self.min_rnr_timer,
                },
                psn,
            );
            return RcRxOutcome::ReceiverNotReady;
        }

        if !self.core.length_ok(shape, pkt.payload.len()) {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::BadLength);
        }
        if op.is_write() {
            return self.execute_write(pkt, psn, mem, rcq);
        }
        self.execute_send(pkt, psn, mem, rcq)
    }

    fn execute_write(
        &mut self,
        pkt: &RcPacketRepr<'_>,
        psn: Psn,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let op = pkt.bth.opcode;
        let Some(shape) = op.uc_shape() else {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        };
        // check_rkey and placement.
        let progress = match self.core.place_write(shape, pkt.reth, pkt.payload, mem) {
            Ok(p) => p,
            Err(RequestFault::Invalid(reason)) => {
                return self.nak_error(NakCode::InvalidRequest, reason)
            }
            Err(RequestFault::Access(reason)) => {
                return self.nak_error(NakCode::RemoteAccessError, reason)
            }
        };
        self.core.epsn = psn.next();
        self.counters.requests_executed += 1;
        if !op.is_end() {
            self.acknowledge(pkt, psn);
            return RcRxOutcome::Accepted;
        }
        self.core.inbound = None;
        if !op.has_immdt() {
            return self.message_done(pkt, psn, None, rcq);
        }
        let Some(wqe) = self.core.rq.pop_front() else {
            // check_resource made sure there is one.
            return self.nak_error(NakCode::RemoteOperationalError, UcDropReason::NoReceiveWr);
        };
        let wc = self.core.wc(
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            progress.length,
            pkt.imm,
        );
        self.message_done(pkt, psn, Some(wc), rcq)
    }

    fn execute_send(
        &mut self,
        pkt: &RcPacketRepr<'_>,
        psn: Psn,
        mem: &dyn MemoryTable,
        rcq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let op = pkt.bth.opcode;
        if op.is_start() {
            self.core.inbound = Some(Inbound::Send { received: 0 });
        }
        let Some(Inbound::Send { received }) = self.core.inbound else {
            return self.nak_error(NakCode::InvalidRequest, UcDropReason::OpcodeSequence);
        };
        let Some(wqe) = self.core.rq.front() else {
            return self.nak_error(NakCode::RemoteOperationalError, UcDropReason::NoReceiveWr);
        };
        if let Err(reason) = scatter_send(&wqe, received, pkt.payload, mem) {
            // rxe: copy_data fails → RESPST_ERR_MALFORMED_WQE → class A: the WR completes
            // with IBV_WC_LOC_QP_OP_ERR, the requester gets NAK remote operational error,
            // the QP moves to ERROR.
            self.core.fail_receive_wr(&wqe, rcq);
            let cause = scatter_cause(reason);
            return self.nak_error_with(NakCode::RemoteOperationalError, reason, cause);
        }
        let received = received + pkt.payload.len() as u32;
        self.core.epsn = psn.next();
        self.counters.requests_executed += 1;
        if !op.is_end() {
            self.core.inbound = Some(Inbound::Send { received });
            self.acknowledge(pkt, psn);
            return RcRxOutcome::Accepted;
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
            if !self.core.complete_receive(wc, rcq) {
                // IBTA class G / rxe RESPST_ERR_CQ_OVERFLOW: the completion is lost and the QP
                // moves to ERROR without a response; the requester's timer gives up in turn.
                self.fail(QpErrorCause::RecvCqOverflow);
                return RcRxOutcome::Dropped(UcDropReason::CqOverflow);
            }
        }
        self.core.stats.messages_completed += 1;
        self.acknowledge(pkt, psn);
        RcRxOutcome::Completed
    }
}
