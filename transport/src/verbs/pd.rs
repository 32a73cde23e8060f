//! Protection domains ([`VerbsPd`]): registering memory and creating UC and RC QPs (RESET →
//! INIT).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};

use crate::api::backend::{MrOps, PdOps, QpOps};
use crate::api::{AccessFlags, CreateQpError, QpInitAttr, QpState, QpType, RegMrError, PSN_MASK};
use crate::sync::lock;

use super::codes::{access_bits, qp_mask, state_code};
use super::cq::verbs_cq;
use super::ffi;
use super::mr::VerbsMr;
use super::qp::VerbsQp;
use super::shared::{DevShared, QpCounters, QpShared, SendTrack};

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
        let max = self.dev.max_qp_wr;
        for (queue, depth) in [
            ("send queue", attr.max_send_wr),
            ("receive queue", attr.max_recv_wr),
        ] {
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
            attr.max_send_wr,
            attr.max_recv_wr,
            rc,
        )
        .map_err(|e| CreateQpError::Device {
            detail: format!(
                "ibv_create_qp({}): {e}",
                if rc { "IBV_QPT_RC" } else { "IBV_QPT_UC" }
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
