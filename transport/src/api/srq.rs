//! [`SharedReceiveQueue`] (`struct ibv_srq`) and its backend trait [`SrqOps`].
//!
//! One receive queue for many QPs (IBTA 10.2.9 "Shared Receive Queue"): an inbound SEND or
//! RDMA WRITE_WITH_IMM on any QP created on the SRQ
//! ([`ProtectionDomain::create_qp_with_srq`](super::ProtectionDomain::create_qp_with_srq))
//! takes the SRQ's oldest receive WR; the completion lands in that QP's receive CQ with the
//! QP's number in [`WorkCompletion::qp_num`](super::WorkCompletion::qp_num). A collector with
//! K agents then posts receive WRs at the rate frames arrive, into one queue, instead of
//! keeping K queues filled.
//!
//! rxe (`drivers/infiniband/sw/rxe/rxe_qp.c`, `rxe_qp_chk_init`) accepts an SRQ on RC, UC and
//! UD QPs alike (it only skips the receive-queue capacity checks when one is given), and its
//! responder (`rxe_resp.c`, `check_resource`) takes a WR from the SRQ (`get_srq_wqe`) for
//! every packet that needs one: SEND and RDMA WRITE_WITH_IMM. A QP that moves to ERROR
//! flushes only the WR it already took; the SRQ's WRs stay for the other QPs.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::error::PostRecvError;
use super::wr::RecvWr;

/// A shared receive queue (`struct ibv_srq`). Cheap to clone (shared); `Send + Sync`;
/// destroyed when the last clone (and the last QP created on it) is dropped.
#[derive(Clone, Debug)]
pub struct SharedReceiveQueue {
    inner: Arc<dyn SrqOps>,
}

impl SharedReceiveQueue {
    /// Wraps a transport's SRQ implementation.
    pub fn from_backend(inner: Arc<dyn SrqOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn SrqOps> {
        &self.inner
    }

    /// Capacity in receive WRs (`ibv_srq_attr.max_wr` as granted).
    pub fn max_wr(&self) -> u32 {
        self.inner.max_wr()
    }

    /// Receive WRs posted and not yet taken by a QP (soft: exact; verbs: not known to the
    /// library, `None`).
    pub fn posted(&self) -> Option<u32> {
        self.inner.posted()
    }

    /// A number identifying this SRQ within its device, as named by
    /// [`AsyncEvent::SrqLimitReached`](super::AsyncEvent::SrqLimitReached) and
    /// [`AsyncEvent::SrqError`](super::AsyncEvent::SrqError) (verbs: `ibv_srq.handle`; soft:
    /// 0, it raises no SRQ events).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }

    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the device raises one
    /// [`AsyncEvent::SrqLimitReached`](super::AsyncEvent::SrqLimitReached) once fewer than
    /// `limit` WRs remain posted, then disarms (IBTA vol. 1 10.2.9, ibv_modify_srq(3)).
    /// Returns `false` when the device has no limit events (soft) or refused (logged).
    pub fn arm_limit(&self, limit: u32) -> bool {
        self.inner.arm_limit(limit)
    }

    /// Posts a list of receive WRs (`ibv_post_srq_recv`), oldest first: the rules of
    /// [`QueuePair::post_recv`](super::QueuePair::post_recv) without a QP state (an SRQ has
    /// none); at most [`SharedReceiveQueue::max_wr`] may be posted.
    ///
    /// # Errors
    /// [`PostRecvError`] naming the first rejected WR: `Full` (cheap), `SgeOutOfBounds`,
    /// `NoLocalWrite`, `ForeignMr`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        self.inner.post_recv(wrs)
    }
}

/// A shared receive queue. See [`SharedReceiveQueue`].
pub trait SrqOps: Send + Sync + fmt::Debug {
    /// See [`SharedReceiveQueue::max_wr`].
    fn max_wr(&self) -> u32;
    /// See [`SharedReceiveQueue::posted`].
    fn posted(&self) -> Option<u32>;
    /// See [`SharedReceiveQueue::handle`]. Default: 0.
    fn handle(&self) -> u32 {
        0
    }
    /// See [`SharedReceiveQueue::arm_limit`]. Default: no limit events.
    fn arm_limit(&self, _limit: u32) -> bool {
        false
    }
    /// See [`SharedReceiveQueue::post_recv`].
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError>;
    /// For the owning transport to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
}
