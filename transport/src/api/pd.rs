//! [`ProtectionDomain`] (`struct ibv_pd`) and its backend trait [`PdOps`].

use std::fmt;
use std::sync::Arc;

use super::error::{CreateQpError, CreateSrqError, RegMrError};
use super::mr::{MemoryRegion, MrOps};
use super::qp::{QpInitAttr, QpOps, QueuePair};
use super::srq::{SharedReceiveQueue, SrqOps};
use super::types::AccessFlags;

/// A protection domain (`struct ibv_pd`). MRs and QPs of one PD work together.
#[derive(Clone, Debug)]
pub struct ProtectionDomain {
    inner: Arc<dyn PdOps>,
}

impl ProtectionDomain {
    /// Wraps a transport's PD implementation.
    pub fn from_backend(inner: Arc<dyn PdOps>) -> Self {
        Self { inner }
    }

    /// Allocates `len` zeroed bytes and registers them (`ibv_reg_mr`) with `access`.
    ///
    /// The region's remote address is [`MemoryRegion::addr`]; offsets in [`Sge`](super::Sge) and in
    /// `read_at`/`write_at` are relative to it. The region is deregistered when the last clone
    /// of the handle is dropped; WRs still referencing it then complete with
    /// [`WcStatus::LocalProtectionError`] and inbound writes to it are dropped (`bad_rkey`).
    ///
    /// # Errors
    /// [`RegMrError::InvalidLength`] for 0 or too large, [`RegMrError::InvalidAccess`] for
    /// REMOTE_WRITE without LOCAL_WRITE, [`RegMrError::TooMany`] when keys run out.
    ///
    /// [`WcStatus::LocalProtectionError`]: super::WcStatus::LocalProtectionError
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion, RegMrError> {
        Ok(MemoryRegion::from_backend(self.inner.reg_mr(len, access)?))
    }

    /// Creates a UC or RC QP ([`QpInitAttr::qp_type`]) and moves it to INIT with `attr.access` (so receive WRs can be posted
    /// before [`QueuePair::connect`]). Its initial send PSN is random (24 bits).
    ///
    /// # Errors
    /// [`CreateQpError::InvalidDepth`], [`CreateQpError::ForeignCq`] when a CQ belongs to
    /// another device, [`CreateQpError::NoQpn`].
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair, CreateQpError> {
        Ok(QueuePair::from_backend(self.inner.create_qp(attr)?))
    }

    /// Creates a shared receive queue holding up to `max_wr` receive WRs (`ibv_create_srq`,
    /// one scatter entry per WR). See [`SharedReceiveQueue`] for the rules (IBTA 10.2.9).
    ///
    /// # Errors
    /// [`CreateSrqError::InvalidDepth`] for 0 or above the device maximum,
    /// [`CreateSrqError::Unsupported`] on a device without SRQs, [`CreateSrqError::Device`]
    /// when the device refuses.
    pub fn create_srq(&self, max_wr: u32) -> Result<SharedReceiveQueue, CreateSrqError> {
        Ok(SharedReceiveQueue::from_backend(
            self.inner.create_srq(max_wr)?,
        ))
    }

    /// Creates a QP as [`ProtectionDomain::create_qp`] does, whose receive WRs come from `srq`
    /// (`ibv_qp_init_attr.srq`): `attr.max_recv_wr` is ignored, [`QueuePair::post_recv`] is
    /// refused (post to the SRQ), and inbound SENDs and RDMA WRITE_WITH_IMMs take the SRQ's
    /// oldest WR (rxe `get_srq_wqe`).
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`]; [`CreateQpError::Device`] when `srq` belongs to
    /// another device or the device has no SRQs.
    pub fn create_qp_with_srq(
        &self,
        attr: &QpInitAttr<'_>,
        srq: &SharedReceiveQueue,
    ) -> Result<QueuePair, CreateQpError> {
        Ok(QueuePair::from_backend(
            self.inner.create_qp_with_srq(attr, srq)?,
        ))
    }
}

/// A protection domain. See [`ProtectionDomain`].
pub trait PdOps: Send + Sync + fmt::Debug {
    /// See [`ProtectionDomain::reg_mr`].
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError>;
    /// See [`ProtectionDomain::create_qp`].
    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError>;
    /// See [`ProtectionDomain::create_srq`]. Default: no SRQs.
    fn create_srq(&self, _max_wr: u32) -> Result<Arc<dyn SrqOps>, CreateSrqError> {
        Err(CreateSrqError::Unsupported)
    }
    /// See [`ProtectionDomain::create_qp_with_srq`]. Default: no SRQs.
    fn create_qp_with_srq(
        &self,
        _attr: &QpInitAttr<'_>,
        _srq: &SharedReceiveQueue,
    ) -> Result<Arc<dyn QpOps>, CreateQpError> {
        Err(CreateQpError::Device {
            detail: "this device has no shared receive queues".into(),
        })
    }
}
