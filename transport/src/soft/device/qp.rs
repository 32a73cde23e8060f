//! Soft QP handles ([`SoftQp`]): creation (a QPN, an engine in INIT, a random first PSN),
//! connect (RTR + RTS, the route to the peer), and posting WR lists with ibverbs `bad_wr`
//! semantics; the engine ([`crate::soft::engine::UcQp`] or [`crate::soft::rc::RcQp`]) does
//! the rest.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::backend::QpOps;
use crate::api::{
    gid_from_ip, AccessFlags, CompletionQueue, ConnectError, CreateQpError, Mtu, PostRecvError,
    PostRecvErrorKind, PostSendError, PostSendErrorKind, QpEndpoint, QpInitAttr, QpState, QpStats,
    QpType, RecvWr, SendWr, Sge, PSN_MASK, QPN_MASK,
};
use crate::soft::engine::{LocalSge, PostRefusal, RecvRefusal, RecvWqe, RtrAttr, SendWqe};
use crate::soft::qp::SrqQueue;
use crate::sync::lock;

use super::config::{MAX_QP_WR, SOFT_MAX_MSG_SIZE};
use super::cq::SoftCq;
use super::mr::SoftMrHandle;
use super::service::QpEngine;
use super::shared::{canonical_ip, CqSink, QpCore, QpSlot, Shared};

/// A soft UC or RC QP handle; destroys the QP when dropped.
#[derive(Debug)]
pub struct SoftQp {
    pub(super) slot: Arc<QpSlot>,
    pub(super) shared: Arc<Shared>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut qps = self
            .shared
            .qps
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        qps.remove(&self.slot.qpn);
        drop(qps);
        self.shared
            .rc_qps
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.slot.qpn);
    }
}

pub(super) fn soft_mr<'a>(shared: &Shared, sge: &Sge<'a>) -> Option<&'a SoftMrHandle> {
    let h = sge.mr.backend().as_any().downcast_ref::<SoftMrHandle>()?;
    Arc::ptr_eq(&h.table, &shared.mrs).then_some(h)
}

impl SoftQp {
    /// Creates a UC or RC QP on `shared`'s device and moves it to INIT (`attr` as in
    /// [`ProtectionDomain::create_qp`](crate::api::ProtectionDomain::create_qp)): checks the
    /// queue depths and that both CQs are this device's, takes the next free QPN (from 0x11,
    /// wrapping below 2^24) and a random first send PSN.
    ///
    /// With `srq` the QP takes its receive WRs from that shared receive queue and
    /// `attr.max_recv_wr` is not checked (rxe `rxe_qp_chk_cap` with `has_srq`).
    pub(super) fn create(
        shared: &Arc<Shared>,
        attr: &QpInitAttr<'_>,
        srq: Option<Arc<SrqQueue>>,
    ) -> Result<Arc<SoftQp>, CreateQpError> {
        for (queue, depth) in [
            ("send queue", attr.max_send_wr),
            ("receive queue", attr.max_recv_wr),
        ] {
            if srq.is_some() && queue == "receive queue" {
                continue;
            }
            if depth == 0 || depth > MAX_QP_WR {
                return Err(CreateQpError::InvalidDepth {
                    queue,
                    depth,
                    max: MAX_QP_WR,
                });
            }
        }
        let cq_of = |cq: &CompletionQueue, which: &'static str| {
            cq.backend()
                .as_any()
                .downcast_ref::<SoftCq>()
                .filter(|c| std::ptr::eq(c.device.as_ptr(), Arc::as_ptr(shared)))
                .map(|c| Arc::clone(&c.inner))
                .ok_or(CreateQpError::ForeignCq { which })
        };
        if let QpType::Rc(rc) = &attr.qp_type {
            rc.validate()
                .map_err(|detail| CreateQpError::Device { detail })?;
        }
        let send_cq = cq_of(attr.send_cq, "send")?;
        let recv_cq = cq_of(attr.recv_cq, "recv")?;
        let max_mtu = attr.max_mtu.map_or(shared.mtu, |m| m.min(shared.mtu));
        let mut qps = shared.qps.write().unwrap_or_else(PoisonError::into_inner);
        let qpn = {
            let mut next = lock(&shared.next_qpn);
            let mut found = None;
            for _ in 0..=QPN_MASK {
                let candidate = *next;
                *next = if candidate >= QPN_MASK {
                    0x11
                } else {
                    candidate + 1
                };
                if !qps.contains_key(&candidate) {
                    found = Some(candidate);
                    break;
                }
            }
            found.ok_or(CreateQpError::NoQpn)?
        };
        let mut engine = QpEngine::new(attr.qp_type, qpn, attr.max_send_wr, attr.max_recv_wr);
        if let Some(srq) = srq {
            engine.use_srq(srq);
        }
        engine
            .modify_to_init(attr.access)
            .map_err(|e| CreateQpError::Device {
                detail: e.to_string(),
            })?;
        let slot = Arc::new(QpSlot {
            qpn,
            sq_psn: rand::random::<u32>() & PSN_MASK,
            max_mtu,
            core: Mutex::new(QpCore {
                engine,
                remote: None,
                src: shared.local,
                src_override: None,
            }),
            send_cq,
            recv_cq,
            changed: std::sync::atomic::AtomicBool::new(false),
        });
        qps.insert(qpn, Arc::clone(&slot));
        drop(qps);
        if attr.qp_type != QpType::Uc {
            shared
                .rc_qps
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(qpn, Arc::clone(&slot));
        }
        Ok(Arc::new(SoftQp {
            slot,
            shared: Arc::clone(shared),
        }))
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.slot.qpn
    }

    fn qp_type(&self) -> QpType {
        lock(&self.slot.core).engine.qp_type()
    }

    fn state(&self) -> QpState {
        lock(&self.slot.core).engine.state()
    }

    fn local_endpoint(&self) -> QpEndpoint {
        let addr = self.shared.advertised;
        QpEndpoint {
            gid: gid_from_ip(canonical_ip(addr.ip())),
            qpn: self.slot.qpn,
            psn: self.slot.sq_psn,
            mtu: self.slot.max_mtu.bytes(),
            udp_addr: Some(addr),
        }
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        let qpn = self.slot.qpn;
        let invalid = |detail: String| ConnectError::InvalidEndpoint { qpn, detail };
        if remote.qpn > QPN_MASK {
            return Err(invalid(format!("QPN {:#x} exceeds 24 bits", remote.qpn)));
        }
        if remote.psn > PSN_MASK {
            return Err(invalid(format!("PSN {:#x} exceeds 24 bits", remote.psn)));
        }
        let remote_mtu = Mtu::from_bytes(remote.mtu)
            .ok_or_else(|| invalid(format!("MTU {} is not an IB MTU", remote.mtu)))?;
        let path_mtu = remote_mtu.min(self.slot.max_mtu);
        let dest = remote.destination();
        if dest.ip().is_unspecified() || dest.port() == 0 {
            return Err(invalid(format!("destination {dest} is not routable")));
        }
        let (src, src_override) =
            self.shared
                .source_for(dest)
                .map_err(|e| ConnectError::Modify {
                    qpn,
                    target: QpState::Rtr,
                    detail: format!("no source address towards {dest}: {e}"),
                })?;
        let mut core = lock(&self.slot.core);
        let state = core.engine.state();
        if state != QpState::Init {
            return Err(ConnectError::InvalidState { qpn, state });
        }
        core.engine
            .connect(
                RtrAttr {
                    dest_qpn: remote.qpn,
                    rq_psn: remote.psn,
                    path_mtu,
                },
                self.slot.sq_psn,
            )
            .map_err(|(target, e)| ConnectError::Modify {
                qpn,
                target,
                detail: e.to_string(),
            })?;
        core.remote = Some(dest);
        core.src = src;
        core.src_override = src_override;
        drop(core);
        self.shared.tx_hint.store(true, Ordering::Release);
        Ok(())
    }

    fn modify_to_error(&self) {
        {
            let mut core = lock(&self.slot.core);
            core.engine.modify_to_error();
            core.engine.flush(
                &mut CqSink(&self.slot.send_cq),
                &mut CqSink(&self.slot.recv_cq),
            );
        }
        self.shared.flush_hint.store(true, Ordering::Release);
        self.shared.note_cq_overflow(&self.slot);
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        let result = self.post_send_queued(wrs);
        // Send what was posted, also when a later WR of the list was refused.
        self.shared.kick_tx();
        result
    }

    fn transmit_group(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// One transmit pass for the WRs queued on every QP of this device: their packets go to
    /// the link together (one `sendmmsg` per link batch on UDP).
    fn start_transmit(&self) {
        self.shared.kick_tx();
    }

    fn post_send_queued(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        let qpn = self.slot.qpn;
        let fail = |posted: usize, kind: PostSendErrorKind| PostSendError { qpn, posted, kind };
        let result = (|| {
            let mut core = lock(&self.slot.core);
            for (i, wr) in wrs.iter().enumerate() {
                let sge = match &wr.sge {
                    None => None,
                    Some(s) => {
                        let lkey = s.mr.lkey();
                        let Some(h) = soft_mr(&self.shared, s) else {
                            return Err(fail(i, PostSendErrorKind::ForeignMr { lkey }));
                        };
                        if !s.in_bounds() {
                            return Err(fail(
                                i,
                                PostSendErrorKind::SgeOutOfBounds {
                                    lkey,
                                    offset: s.offset,
                                    length: s.length,
                                    mr_len: h.mr.len(),
                                },
                            ));
                        }
                        Some(LocalSge {
                            lkey: h.mr.key(),
                            offset: s.offset,
                            length: s.length,
                        })
                    }
                };
                let length = wr.length();
                if length > SOFT_MAX_MSG_SIZE {
                    return Err(fail(
                        i,
                        PostSendErrorKind::MessageTooLong {
                            length,
                            max: SOFT_MAX_MSG_SIZE,
                        },
                    ));
                }
                let wqe = SendWqe {
                    wr_id: wr.wr_id,
                    opcode: wr.opcode,
                    sge,
                    signaled: wr.signaled,
                };
                core.engine.post_send(wqe).map_err(|r| {
                    fail(
                        i,
                        match r {
                            PostRefusal::State(state) => PostSendErrorKind::InvalidState { state },
                            PostRefusal::Full(depth) => PostSendErrorKind::Full { depth },
                            PostRefusal::TooLong(length) => PostSendErrorKind::MessageTooLong {
                                length,
                                max: SOFT_MAX_MSG_SIZE,
                            },
                        },
                    )
                })?;
            }
            Ok(())
        })();
        // The WRs are in the send queue (the lock is released): the next scan must see them.
        self.shared.tx_hint.store(true, Ordering::Release);
        self.shared.flush_hint.store(true, Ordering::Release);
        result
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        let qpn = self.slot.qpn;
        let fail = |posted: usize, kind: PostRecvErrorKind| PostRecvError { qpn, posted, kind };
        let mut core = lock(&self.slot.core);
        let result = (|| {
            for (i, wr) in wrs.iter().enumerate() {
                let wqe = recv_wqe(&self.shared, wr).map_err(|k| fail(i, k))?;
                core.engine
                    .post_recv(wqe)
                    .map_err(|r| fail(i, recv_refusal(r)))?;
            }
            Ok(())
        })();
        self.shared.flush_now(&self.slot, &mut core);
        drop(core);
        self.shared.note_cq_overflow(&self.slot);
        result
    }

    fn stats(&self) -> QpStats {
        lock(&self.slot.core).engine.stats()
    }
}

/// The engine's refusal as the API's error kind.
pub(super) fn recv_refusal(r: RecvRefusal) -> PostRecvErrorKind {
    match r {
        RecvRefusal::Full(depth) => PostRecvErrorKind::Full { depth },
        RecvRefusal::State(state) => PostRecvErrorKind::InvalidState { state },
        RecvRefusal::OnSrq => PostRecvErrorKind::OnSrq,
    }
}

/// Checks a receive WR's scatter entry (an MR of this device, LOCAL_WRITE, in bounds) and
/// makes it the engine's WR.
pub(super) fn recv_wqe(shared: &Shared, wr: &RecvWr<'_>) -> Result<RecvWqe, PostRecvErrorKind> {
    let sge = match &wr.sge {
        None => None,
        Some(s) => {
            let lkey = s.mr.lkey();
            let Some(h) = soft_mr(shared, s) else {
                return Err(PostRecvErrorKind::ForeignMr { lkey });
            };
            if !h.mr.access().contains(AccessFlags::LOCAL_WRITE) {
                return Err(PostRecvErrorKind::NoLocalWrite { lkey });
            }
            if !s.in_bounds() {
                return Err(PostRecvErrorKind::SgeOutOfBounds {
                    lkey,
                    offset: s.offset,
                    length: s.length,
                    mr_len: h.mr.len(),
                });
            }
            Some(LocalSge {
                lkey: h.mr.key(),
                offset: s.offset,
                length: s.length,
            })
        }
    };
    Ok(RecvWqe {
        wr_id: wr.wr_id,
        sge,
    })
}
