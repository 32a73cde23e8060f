//! UC and RC queue pairs ([`VerbsQp`], the API's [`QpOps`]): connecting (INIT → RTR → RTS
//! with the attributes ibv_modify_qp(3) names for the QP's type; RC adds the responder's
//! `max_dest_rd_atomic` and `min_rnr_timer` in RTR and the requester's `timeout`, `retry_cnt`,
//! `rnr_retry` and `max_rd_atomic` in RTS, from [`RcAttr`]), posting send and receive WR lists
//! with ibverbs `bad_wr` semantics, and the signaling of unsignaled sends.
//!
//! An RC QP's retransmission, ACKs and NAKs are the device's (IBTA 9.7): the transport only
//! sees their outcome, a send completion once the WR is acknowledged, or
//! `IBV_WC_RETRY_EXC_ERR` / `IBV_WC_RNR_RETRY_EXC_ERR` and the QP in ERROR when the retries
//! ran out. The device counts retransmissions per port, not per QP (rxe: `hw_counters`), so
//! [`QpStats::rc`](crate::api::QpStats::rc) stays zero here.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::api::backend::QpOps;
use crate::api::{
    ip_from_gid, ConnectError, Mtu, PostRecvError, PostRecvErrorKind, PostSendError,
    PostSendErrorKind, QpEndpoint, QpState, QpStats, QpType, RcAttr, RecvWr, SendOpcode, SendWr,
    PSN_MASK, QPN_MASK, ROCE_V2_UDP_PORT,
};
use crate::sync::lock;

use super::codes::{mtu_to_ibv, qp_mask, state_from_code, wr_opcode};
use super::ffi::{self, SendWrRaw};
use super::mr::{resolve_sge, SgeProblem};
use super::shared::{plan_signal, QpShared};
use super::srq::build_recv;

/// GRH hop limit of RoCE v2 packets (the IP TTL rxe and mlx5 put on the wire; perftest uses 64
/// as well).
pub(super) const HOP_LIMIT: u8 = 64;

/// A UC or RC queue pair ([`QpOps`]).
#[derive(Debug)]
pub(super) struct VerbsQp {
    pub(super) shared: Arc<QpShared>,
}

impl VerbsQp {
    pub(super) fn send_error(&self, posted: usize, kind: PostSendErrorKind) -> PostSendError {
        PostSendError {
            qpn: self.shared.qp.qpn(),
            posted,
            kind,
        }
    }

    pub(super) fn recv_error(&self, posted: usize, kind: PostRecvErrorKind) -> PostRecvError {
        PostRecvError {
            qpn: self.shared.qp.qpn(),
            posted,
            kind,
        }
    }

    /// Maps a provider's refusal of a WR. `ENOMEM` is a full queue (ibv_post_send(3)); other
    /// errors mean the QP is not in a state that accepts WRs.
    pub(super) fn state_for_errno(&self, e: &io::Error) -> QpState {
        let s = self
            .shared
            .qp
            .query_state()
            .map(state_from_code)
            .unwrap_or(QpState::Error);
        tracing::debug!(qpn = self.shared.qp.qpn(), error = %e, state = %s, "WR refused by the provider");
        s
    }

    /// Checks one send WR and converts it (unsignaled; the caller decides signaling). Returns
    /// the raw WR and the number of packets it makes at `mtu` bytes per packet.
    pub(super) fn build_send(
        &self,
        wr: &SendWr<'_>,
        mtu: u64,
    ) -> Result<(SendWrRaw, u64), PostSendErrorKind> {
        let s = &self.shared;
        let sge = match &wr.sge {
            None => None,
            Some(sge) => Some(resolve_sge(sge, &s.pd, false).map_err(|p| match p {
                SgeProblem::Foreign { lkey } | SgeProblem::NoLocalWrite { lkey } => {
                    PostSendErrorKind::ForeignMr { lkey }
                }
                SgeProblem::OutOfBounds {
                    lkey,
                    offset,
                    length,
                    mr_len,
                } => PostSendErrorKind::SgeOutOfBounds {
                    lkey,
                    offset,
                    length,
                    mr_len,
                },
            })?),
        };
        let length = wr.length();
        if length > s.dev.max_msg_size {
            return Err(PostSendErrorKind::MessageTooLong {
                length,
                max: s.dev.max_msg_size,
            });
        }
        let (opcode, imm, remote_addr, rkey) = match wr.opcode {
            SendOpcode::Send => (wr_opcode::SEND, 0, 0, 0),
            SendOpcode::SendWithImm { imm } => (wr_opcode::SEND_WITH_IMM, imm, 0, 0),
            SendOpcode::RdmaWrite { remote_addr, rkey } => {
                (wr_opcode::RDMA_WRITE, 0, remote_addr, rkey)
            }
            SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (wr_opcode::RDMA_WRITE_WITH_IMM, imm, remote_addr, rkey),
        };
        let packets = u64::from(length).div_ceil(mtu).max(1);
        let raw = SendWrRaw {
            wr_id: wr.wr_id,
            opcode,
            sge,
            signaled: false,
            imm,
            remote_addr,
            rkey,
        };
        Ok((raw, packets))
    }

    pub(super) fn connect_inner(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        let s = &self.shared;
        let qpn = s.qp.qpn();
        let state = s.cached_state();
        if state != QpState::Init {
            return Err(ConnectError::InvalidState { qpn, state });
        }
        let bad = |detail: String| ConnectError::InvalidEndpoint { qpn, detail };
        let remote_mtu = Mtu::from_bytes(remote.mtu)
            .ok_or_else(|| bad(format!("MTU {} is not an IB MTU", remote.mtu)))?;
        if remote.qpn > QPN_MASK || remote.qpn == 0 {
            return Err(bad(format!(
                "QPN {:#x} is not a 24-bit QP number",
                remote.qpn
            )));
        }
        if remote.psn > PSN_MASK {
            return Err(bad(format!("PSN {:#x} exceeds 24 bits", remote.psn)));
        }
        if let Some(addr) = remote.udp_addr {
            let gid_ip = ip_from_gid(remote.gid);
            if addr.port() != ROCE_V2_UDP_PORT || addr.ip() != gid_ip {
                return Err(bad(format!(
                    "UDP address {addr}: an RDMA device sends RoCEv2 only to port {ROCE_V2_UDP_PORT} of \
                     the GID's address {gid_ip}"
                )));
            }
        }
        let path_mtu = remote_mtu.min(s.local_mtu);
        let rc: Option<RcAttr> = match s.qp_type {
            QpType::Uc => None,
            QpType::Rc(a) => Some(a),
        };
        let (rtr_mask, rts_mask) = match rc {
            None => (qp_mask::RTR, qp_mask::RTS),
            Some(_) => (qp_mask::RTR_RC, qp_mask::RTS_RC),
        };
        // What the RC masks add, for error messages.
        let (rtr_rc, rts_rc) = rc.map_or_else(Default::default, |a| {
            (
                format!(
                    ", max_dest_rd_atomic {}, min_rnr_timer {}",
                    a.max_dest_rd_atomic, a.min_rnr_timer
                ),
                format!(
                    ", timeout {}, retry_cnt {}, rnr_retry {}, max_rd_atomic {}",
                    a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic
                ),
            )
        });
        let rtr = ffi::RtrAttr {
            port: s.dev.port,
            dgid: remote.gid,
            sgid_index: u8::try_from(s.dev.gid.index).unwrap_or(u8::MAX),
            hop_limit: HOP_LIMIT,
            path_mtu: mtu_to_ibv(path_mtu),
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            rc,
        };
        s.qp.modify_to_rtr(&rtr).map_err(|e| ConnectError::Modify {
            qpn,
            target: QpState::Rtr,
            detail: format!(
                "ibv_modify_qp({} QP, mask {}; dgid {}, sgid_index {}, path_mtu {}, dest_qp_num {:#x}, \
                 rq_psn {:#x}{rtr_rc}): {e}",
                s.qp_type.as_str(),
                qp_mask::names(rtr_mask),
                ip_from_gid(remote.gid),
                s.dev.gid.index,
                path_mtu.bytes(),
                remote.qpn,
                remote.psn
            ),
        })?;
        s.set_state(QpState::Rtr);
        s.qp.modify_to_rts(s.psn, rc.as_ref())
            .map_err(|e| ConnectError::Modify {
                qpn,
                target: QpState::Rts,
                detail: format!(
                    "ibv_modify_qp({} QP, mask {}; sq_psn {:#x}{rts_rc}): {e} (the QP stays in RTR)",
                    s.qp_type.as_str(),
                    qp_mask::names(rts_mask),
                    s.psn
                ),
            })?;
        s.path_mtu_bytes
            .store(u64::from(path_mtu.bytes()), Ordering::Release);
        s.set_state(QpState::Rts);
        Ok(())
    }
}

impl QpOps for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.shared.qp.qpn()
    }

    fn state(&self) -> QpState {
        // The device may have moved the QP to ERROR on its own (CQ overrun, bad receive WR).
        match self.shared.qp.query_state() {
            Ok(code) => {
                let s = state_from_code(code);
                self.shared.set_state(s);
                s
            }
            Err(_) => self.shared.cached_state(),
        }
    }

    fn qp_type(&self) -> QpType {
        self.shared.qp_type
    }

    fn local_endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            gid: self.shared.dev.gid.gid,
            qpn: self.shared.qp.qpn(),
            psn: self.shared.psn,
            mtu: self.shared.local_mtu.bytes(),
            udp_addr: None,
        }
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        self.connect_inner(remote)
    }

    fn modify_to_error(&self) {
        if let Err(e) = self.shared.qp.modify_to_error() {
            tracing::warn!(qpn = self.shared.qp.qpn(), error = %e, "ibv_modify_qp(ERR) failed");
        }
        self.shared.set_state(QpState::Error);
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        let s = &self.shared;
        let state = s.cached_state();
        if state != QpState::Rts {
            return Err(self.send_error(0, PostSendErrorKind::InvalidState { state }));
        }
        let mtu = s.path_mtu_bytes.load(Ordering::Acquire).max(1);
        let force_every = s.force_signal_every();
        let mut guard = lock(&s.send);
        let track = &mut *guard;
        let mut done = 0usize;
        for chunk in wrs.chunks(ffi::POST_BATCH) {
            track.raw.clear();
            track.pending.clear();
            let (mut run, mut run_packets) = (track.run, track.run_packets);
            let mut invalid = None;
            for wr in chunk {
                match self.build_send(wr, mtu) {
                    Ok((raw, packets)) => {
                        let mark = plan_signal(
                            &mut run,
                            &mut run_packets,
                            wr.signaled,
                            packets,
                            force_every,
                        );
                        track.raw.push(SendWrRaw {
                            signaled: mark.is_some(),
                            ..raw
                        });
                        track.pending.push((mark, run, run_packets));
                    }
                    Err(kind) => {
                        invalid = Some(kind);
                        break;
                    }
                }
            }
            // Post what was valid (ibverbs bad_wr semantics: WRs before the bad one go out).
            let result = s.qp.post_send(&track.raw);
            let posted = match &result {
                Ok(()) => track.raw.len(),
                Err((p, _)) => *p,
            };
            for (mark, _, _) in track.pending.iter().take(posted) {
                if let Some(m) = mark {
                    track.marks.push_back(*m);
                }
            }
            if let Some((_, r, p)) = posted.checked_sub(1).and_then(|i| track.pending.get(i)) {
                (track.run, track.run_packets) = (*r, *p);
            }
            let at = done + posted;
            if let Err((_, e)) = result {
                return Err(if e.raw_os_error() == Some(libc::ENOMEM) {
                    self.send_error(
                        at,
                        PostSendErrorKind::Full {
                            depth: s.max_send_wr,
                        },
                    )
                } else {
                    let state = self.state_for_errno(&e);
                    self.send_error(at, PostSendErrorKind::InvalidState { state })
                });
            }
            if let Some(kind) = invalid {
                return Err(self.send_error(at, kind));
            }
            done = at;
        }
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        let s = &self.shared;
        if s.on_srq {
            return Err(self.recv_error(0, PostRecvErrorKind::OnSrq));
        }
        let mut raw = lock(&s.recv_scratch);
        let mut done = 0usize;
        for chunk in wrs.chunks(ffi::POST_BATCH) {
            raw.clear();
            let mut invalid = None;
            for wr in chunk {
                match build_recv(wr, &s.pd) {
                    Ok(r) => raw.push(r),
                    Err(kind) => {
                        invalid = Some(kind);
                        break;
                    }
                }
            }
            let result = s.qp.post_recv(&raw);
            let posted = match &result {
                Ok(()) => raw.len(),
                Err((p, _)) => *p,
            };
            let at = done + posted;
            if let Err((_, e)) = result {
                return Err(if e.raw_os_error() == Some(libc::ENOMEM) {
                    self.recv_error(
                        at,
                        PostRecvErrorKind::Full {
                            depth: s.max_recv_wr,
                        },
                    )
                } else {
                    let state = self.state_for_errno(&e);
                    self.recv_error(at, PostRecvErrorKind::InvalidState { state })
                });
            }
            if let Some(kind) = invalid {
                return Err(self.recv_error(at, kind));
            }
            done = at;
        }
        Ok(())
    }

    fn stats(&self) -> QpStats {
        let c = &self.shared.stats;
        let sent = c.messages_sent.load(Ordering::Relaxed);
        let completed = c.messages_completed.load(Ordering::Relaxed);
        QpStats {
            packets_sent: c.packets_sent.load(Ordering::Relaxed),
            messages_sent: sent,
            messages_completed: completed,
            ..QpStats::default()
        }
    }
}
