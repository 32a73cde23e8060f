//! The soft protection domain ([`SoftPd`]): registers MRs and creates QPs.

use std::sync::Arc;

use crate::api::backend::{MrOps, PdOps, QpOps, SrqOps};
use crate::api::{
    AccessFlags, CreateQpError, CreateSrqError, QpInitAttr, RegMrError, SharedReceiveQueue,
};
use crate::soft::qp::SrqQueue;

use super::mr::SoftMrHandle;
use super::qp::SoftQp;
use super::shared::Shared;
use super::srq::{SoftSrq, MAX_SRQ_WR};

/// A soft protection domain (the soft device has one key space; see [`crate::soft::memory`]).
#[derive(Debug)]
pub struct SoftPd {
    pub(super) shared: Arc<Shared>,
}

impl PdOps for SoftPd {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError> {
        let mr = self.shared.mrs.register(len, access)?;
        Ok(Arc::new(SoftMrHandle {
            mr,
            table: Arc::clone(&self.shared.mrs),
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError> {
        SoftQp::create(&self.shared, attr, None).map(|qp| qp as Arc<dyn QpOps>)
    }

    fn create_srq(&self, max_wr: u32) -> Result<Arc<dyn SrqOps>, CreateSrqError> {
        if max_wr == 0 || max_wr > MAX_SRQ_WR {
            return Err(CreateSrqError::InvalidDepth {
                depth: max_wr,
                max: MAX_SRQ_WR,
            });
        }
        Ok(Arc::new(SoftSrq {
            queue: Arc::new(SrqQueue::new(max_wr)),
            shared: Arc::clone(&self.shared),
        }))
    }

    fn create_qp_with_srq(
        &self,
        attr: &QpInitAttr<'_>,
        srq: &SharedReceiveQueue,
    ) -> Result<Arc<dyn QpOps>, CreateQpError> {
        let soft = srq
            .backend()
            .as_any()
            .downcast_ref::<SoftSrq>()
            .filter(|s| Arc::ptr_eq(&s.shared, &self.shared))
            .ok_or_else(|| CreateQpError::Device {
                detail: "the SRQ belongs to another device".into(),
            })?;
        SoftQp::create(&self.shared, attr, Some(Arc::clone(&soft.queue)))
            .map(|qp| qp as Arc<dyn QpOps>)
    }
}
