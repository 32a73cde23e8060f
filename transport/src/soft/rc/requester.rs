//! The RC requester and completer (IBTA 9.7.2, 9.7.5.2, 9.7.6; rxe `rxe_req.c`,
//! `rxe_comp.c`): pulling requests and queued responses, and acting on inbound ACKs, NAKs and
//! RNR NAKs. The rules are in the parent module's docs.

use std::time::{Duration, Instant};

use crate::api::{QpErrorCause, QpState, UcDropReason, WcStatus, PSN_MASK};
use crate::soft::memory::MemoryTable;
use crate::soft::packet::{
    rnr_timer_micros, AethRepr, AethSyndrome, NakCode, RcOpcode, RcPacketRepr,
};
use crate::soft::psn::Psn;
use crate::soft::qp::{
    emit_request, request_bth, request_opcode as request_shape, BuildError, CompletionSink,
};

use super::{RcQp, RcRxOutcome, RcTxInfo, Response, MAX_PKT_PER_ACK, RNR_RETRY_INFINITE};

impl RcQp {
    /// Builds the next outbound packet into `out` (cleared first): a queued response if any
    /// (BTH + AETH), else in RTS the request at the send PSN (BTH, RETH, ImmDt, payload, pad),
    /// each with a zero ICRC placeholder for the device to seal. Returns `None` when there is
    /// nothing to send: no response, no request due, the window of
    /// [`MAX_UNACKED_PSNS`](super::MAX_UNACKED_PSNS) full or an RNR wait running. A WR whose
    /// memory is gone fails with [`WcStatus::LocalProtectionError`] (its WC comes from
    /// [`RcQp::flush`]) and the QP moves to ERROR.
    ///
    /// Sending a request arms the retransmit timer at `now` if it is not running.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn MemoryTable,
        out: &mut Vec<u8>,
    ) -> Option<RcTxInfo> {
        out.clear();
        if self.core.state == QpState::Reset {
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
        let pending = *self.core.sq.iter().find(|p| p.index_of(psn).is_some())?;
        let k = pending.index_of(psn)?;
        let mtu = self.core.mtu;
        let total = pending.length();
        let sent = k.saturating_mul(mtu).min(total);
        let payload_len = (total - sent).min(mtu);
        let last = k + 1 == pending.npkts;
        let shape = request_shape(pending.wqe.opcode, k == 0, last);
        let opcode = RcOpcode::from_uc(shape);
        let ack_req = self.next_ack_req(opcode.is_end());
        let bth = request_bth(opcode, self.core.dest_qpn, ack_req, psn);
        if let Err(e) = emit_request(out, bth, shape, &pending.wqe, sent, payload_len, mem) {
            let status = match e {
                // dest_qpn and psn are 24-bit by construction; fail the WR if it ever happens.
                BuildError::Header => WcStatus::LocalQpOperationError,
                BuildError::Memory => WcStatus::LocalProtectionError,
            };
            self.fail_wr(pending.first_psn, status);
            return None;
        }
        let retransmission = (psn - self.hw) < 0;
        if retransmission {
            self.counters.packets_retransmitted += 1;
        } else {
            self.hw = psn.next();
            if last {
                self.core.stats.messages_sent += 1;
            }
        }
        self.snd = psn.next();
        self.core.stats.packets_sent += 1;
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

    /// rxe `init_req_packet()`: AckReq on END, or when more than [`MAX_PKT_PER_ACK`] packets
    /// went without it.
    fn next_ack_req(&mut self, end: bool) -> bool {
        let ack_req = if end {
            true
        } else {
            let before = self.noack_pkts;
            self.noack_pkts += 1;
            before > MAX_PKT_PER_ACK
        };
        if ack_req {
            self.noack_pkts = 0;
        }
        ack_req
    }

    fn fail_wr(&mut self, first_psn: Psn, status: WcStatus) {
        self.failed_wr = Some((first_psn, status));
        self.fail(QpErrorCause::LocalProtection);
    }

    fn emit_response(&mut self, resp: Response, out: &mut Vec<u8>) -> Option<RcTxInfo> {
        let repr = RcPacketRepr {
            bth: request_bth(RcOpcode::Acknowledge, self.core.dest_qpn, false, resp.psn),
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
        self.core.stats.packets_sent += 1;
        match resp.syndrome {
            AethSyndrome::Ack { .. } => self.counters.acks_sent += 1,
            AethSyndrome::RnrNak { .. } => self.counters.rnr_naks_sent += 1,
            AethSyndrome::Nak(_) => self.counters.naks_sent += 1,
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
        while let Some(p) = self.core.sq.front().copied() {
            if (upto - p.end_psn()) < 0 {
                break;
            }
            self.core.sq.pop_front();
            if p.wqe.signaled {
                let wc = self.core.wc(
                    p.wqe.wr_id,
                    WcStatus::Success,
                    p.wqe.opcode.wc_opcode(),
                    p.length(),
                    None,
                );
                if !self.core.push_wc(scq, wc) {
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
        if let Some(p) = self.core.sq.pop_front() {
            let wc = self.core.send_error_wc(&p, status);
            self.core.push_wc(scq, wc);
        }
        self.fail(cause);
    }

    /// Completer: an inbound ACKNOWLEDGE (already admitted by state and P_Key).
    pub(super) fn receive_response(
        &mut self,
        now: Instant,
        pkt: &RcPacketRepr<'_>,
        scq: &mut dyn CompletionSink,
    ) -> RcRxOutcome {
        let Some(aeth) = pkt.aeth else {
            self.core.stats.drops.inc(UcDropReason::Malformed);
            return RcRxOutcome::Dropped(UcDropReason::Malformed);
        };
        if self.core.state != QpState::Rts {
            self.counters.stale_responses += 1;
            return RcRxOutcome::StaleResponse;
        }
        let psn = pkt.bth.psn;
        // rxe check_psn() (completer): a response must name a PSN in [una, hw).
        let from_una = psn - self.una;
        let in_flight = self.hw - self.una;
        if from_una < 0 || from_una >= in_flight {
            self.counters.stale_responses += 1;
            return RcRxOutcome::StaleResponse;
        }
        match aeth.syndrome {
            AethSyndrome::Ack { .. } => {
                if self.acknowledge_before(psn.next(), now, scq) {
                    self.counters.acks_received += 1;
                }
            }
            AethSyndrome::RnrNak { timer } => self.on_rnr_nak(psn, timer, now, scq),
            AethSyndrome::Nak(NakCode::PsnSequenceError) => self.on_sequence_nak(psn, now, scq),
            AethSyndrome::Nak(code) => {
                self.counters.naks_received += 1;
                self.acknowledge_before(psn, now, scq);
                if self.core.state == QpState::Rts {
                    let status = match code {
                        NakCode::InvalidRequest => WcStatus::RemoteInvalidRequestError,
                        NakCode::RemoteAccessError => WcStatus::RemoteAccessError,
                        _ => WcStatus::RemoteOperationError,
                    };
                    self.fail_head(status, QpErrorCause::RemoteNak, scq);
                }
            }
        }
        RcRxOutcome::Response
    }

    /// rxe `COMPST_RNR_RETRY`: acknowledge what precedes `psn`, spend an RNR retry (unless
    /// infinite) and wait the RNR timer before resending from `psn`.
    fn on_rnr_nak(&mut self, psn: Psn, timer: u8, now: Instant, scq: &mut dyn CompletionSink) {
        self.counters.rnr_naks_received += 1;
        self.acknowledge_before(psn, now, scq);
        if self.core.state != QpState::Rts {
            return;
        }
        if self.rnr_retry != RNR_RETRY_INFINITE {
            if self.rnr_retry_left == 0 {
                self.counters.rnr_retry_exceeded += 1;
                self.fail_head(
                    WcStatus::RnrRetryExceededError,
                    QpErrorCause::RnrRetryExceeded,
                    scq,
                );
                return;
            }
            self.rnr_retry_left -= 1;
        }
        self.snd = psn;
        self.retrans_deadline = None;
        self.rnr_until = Some(now + Duration::from_micros(u64::from(rnr_timer_micros(timer))));
    }

    /// rxe `COMPST_ERROR_RETRY` on a PSN sequence NAK: acknowledge what precedes `psn` and go
    /// back to it, once per NAK, spending a retry.
    fn on_sequence_nak(&mut self, psn: Psn, now: Instant, scq: &mut dyn CompletionSink) {
        self.counters.naks_received += 1;
        self.acknowledge_before(psn, now, scq);
        if self.core.state != QpState::Rts || self.nak_retry_psn == Some(psn) {
            return;
        }
        if self.retry_left == 0 {
            self.counters.retry_exceeded += 1;
            self.fail_head(
                WcStatus::RetryExceededError,
                QpErrorCause::RetryExceeded,
                scq,
            );
            return;
        }
        self.retry_left -= 1;
        self.nak_retry_psn = Some(psn);
        self.snd = psn;
    }
}
