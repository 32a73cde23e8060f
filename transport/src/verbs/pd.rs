//! Protection domains ([`VerbsPd`]): registering memory, creating shared receive queues and
//! UC and RC QPs (RESET → INIT), with or without an SRQ.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};

use crate::api::backend::{MrOps, PdOps, QpOps, SrqOps};
use crate::api::{
    AccessFlags, CreateQpError, CreateSrqError, QpInitAttr, QpState, QpType, RegMrError,
    SharedReceiveQueue, PSN_MASK,
};
use crate::sync::lock;

use super::codes::{access_bits, qp_mask, state_code};
use super::cq::verbs_cq;
use super::ffi;
use super::mr::VerbsMr;
use super::qp::VerbsQp;
use super::shared::{DevShared, QpCounters, QpShared, SendTrack, SrqShared};
use super::srq::VerbsSrq;

/// A protection domain ([`PdOps`]).
#[derive(Debug)]
pub(super) struct VerbsPd {
    pub(super) pd: Arc<ffi::Pd>,
    pub(super) dev: Arc<DevShared>,
}

impl fmt::Debug for ffi::Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.context().name())
            .finish_non_exhaustive()
    }
}

impl VerbsPd {
    /// `create_qp` and `create_qp_with_srq`: checks, `ibv_create_qp` (with `srq` when
    /// given), RESET → INIT, and the QP's registration for completions and async events.
    fn create_qp_on(
        &self,
        attr: &QpInitAttr<'_>,
        srq: Option<&Arc<SrqShared>>,
    ) -> Result<Arc<dyn QpOps>, CreateQpError> {
        let max = self.dev.max_qp_wr;
        for (queue, depth) in [
            ("send queue", attr.max_send_wr),
            ("receive queue", attr.max_recv_wr),
        ] {
            // On an SRQ the QP has no receive queue: max_recv_wr is ignored
            // (ibv_create_qp(3); rxe `rxe_qp_chk_cap` with `has_srq`).
            if srq.is_some() && queue == "receive queue" {
                continue;
            }
            if depth == 0 || depth > max {
                return Err(CreateQpError::InvalidDepth { queue, depth, max });
            }
        }
        // RC attributes are checked here, before the device sees them, as on the soft
        // transport; they are applied in `connect` (RTR and RTS masks of an RC QP).
        let rc = match &attr.qp_type {
            QpType::Uc => false,
            QpType::Rc(a) => {
                a.validate().map_err(|e| CreateQpError::Device {
                    detail: format!("RC attributes: {e}"),
                })?;
                true
            }
        };
        let send_cq =
            verbs_cq(attr.send_cq, &self.dev).ok_or(CreateQpError::ForeignCq { which: "send" })?;
        let recv_cq =
            verbs_cq(attr.recv_cq, &self.dev).ok_or(CreateQpError::ForeignCq { which: "recv" })?;
        let (qp, max_send_wr, max_recv_wr) = ffi::Qp::new(
            &self.pd,
            (&send_cq.cq, &recv_cq.cq),
            srq.map(|q| &q.srq),
            (attr.max_send_wr, attr.max_recv_wr),
            rc,
        )
        .map_err(|e| CreateQpError::Device {
            detail: format!(
                "ibv_create_qp({}{}): {e}",
                if rc { "IBV_QPT_RC" } else { "IBV_QPT_UC" },
                match srq {
                    Some(q) => format!(", srq {}", q.srq.handle()),
                    None => String::new(),
                }
            ),
        })?;
        let qpn = qp.qpn();
        qp.modify_to_init(self.dev.port, access_bits(attr.access))
            .map_err(|e| CreateQpError::Device {
                detail: format!(
                    "QP {qpn:#08x} ({}): ibv_modify_qp(INIT, mask {}): {e}",
                    attr.qp_type.as_str(),
                    qp_mask::names(qp_mask::INIT)
                ),
            })?;
        let mtu = attr
            .max_mtu
            .map_or(self.dev.active_mtu, |m| m.min(self.dev.active_mtu));
        let shared = Arc::new(QpShared {
            qp,
            qp_type: attr.qp_type,
            dev: Arc::clone(&self.dev),
            pd: Arc::clone(&self.pd),
            psn: rand::random::<u32>() & PSN_MASK,
            local_mtu: mtu,
            path_mtu_bytes: AtomicU64::new(u64::from(mtu.bytes())),
            max_send_wr,
            max_recv_wr,
            on_srq: srq.is_some(),
            state: AtomicU8::new(state_code(QpState::Init)),
            send: Mutex::new(SendTrack {
                raw: Vec::with_capacity(ffi::POST_BATCH),
                pending: Vec::with_capacity(ffi::POST_BATCH),
                ..SendTrack::default()
            }),
            recv_scratch: Mutex::new(Vec::with_capacity(ffi::POST_BATCH)),
            stats: QpCounters::default(),
        });
        let weak = Arc::downgrade(&shared);
        lock(&self.dev.qps).insert(qpn, weak.clone());
        for cq in [send_cq, recv_cq] {
            let mut qps = lock(&cq.qps);
            // CQs outlive the QPs of one connection: forget the destroyed ones.
            qps.retain(|_, w| w.strong_count() > 0);
            qps.insert(qpn, weak.clone());
        }
        Ok(Arc::new(VerbsQp { shared }))
    }
}

impl PdOps for VerbsPd {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError> {
        let max = usize::try_from(self.dev.max_mr_size).unwrap_or(usize::MAX);
        if len == 0 || len > max {
            return Err(RegMrError::InvalidLength { len, max });
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(RegMrError::InvalidAccess { access });
        }
        let mr =
            ffi::Mr::new(&self.pd, len, access_bits(access)).map_err(|e| RegMrError::Device {
                len,
                detail: format!("ibv_reg_mr: {e}"),
            })?;
        Ok(Arc::new(VerbsMr { mr, access }))
    }

    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError> {
        self.create_qp_on(attr, None)
    }

    fn create_srq(&self, max_wr: u32) -> Result<Arc<dyn SrqOps>, CreateSrqError> {
        let max = self.dev.max_srq_wr;
        if self.dev.max_srq == 0 || max == 0 {
            return Err(CreateSrqError::Unsupported);
        }
        if max_wr == 0 || max_wr > max {
            return Err(CreateSrqError::InvalidDepth { depth: max_wr, max });
        }
        let srq = ffi::Srq::new(&self.pd, max_wr).map_err(|e| CreateSrqError::Device {
            detail: format!("ibv_create_srq(max_wr {max_wr}, max_sge 1): {e}"),
        })?;
        let handle = srq.handle();
        let shared = Arc::new(SrqShared {
            srq,
            pd: Arc::clone(&self.pd),
            limit_events: AtomicU64::new(0),
            error_events: AtomicU64::new(0),
            recv_scratch: Mutex::new(Vec::with_capacity(ffi::POST_BATCH)),
            dev: Arc::clone(&self.dev),
        });
        lock(&self.dev.srqs).insert(handle, Arc::downgrade(&shared));
        tracing::debug!(device = %self.dev.ctx.name(), srq = handle, max_wr = shared.srq.max_wr(), "SRQ created");
        Ok(Arc::new(VerbsSrq { shared }))
    }

    fn create_qp_with_srq(
        &self,
        attr: &QpInitAttr<'_>,
        srq: &SharedReceiveQueue,
    ) -> Result<Arc<dyn QpOps>, CreateQpError> {
        let v = srq
            .backend()
            .as_any()
            .downcast_ref::<VerbsSrq>()
            .filter(|v| Arc::ptr_eq(v.shared.pd.context(), &self.dev.ctx))
            .ok_or_else(|| CreateQpError::Device {
                detail: "the SRQ belongs to another device".into(),
            })?;
        if !Arc::ptr_eq(&v.shared.pd, &self.pd) {
            return Err(CreateQpError::Device {
                detail: "the SRQ belongs to another protection domain (IBTA 10.2.9: an SRQ \
                         serves the QPs of its PD)"
                    .into(),
            });
        }
        self.create_qp_on(attr, Some(&v.shared))
    }
}
