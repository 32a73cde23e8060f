//! [`QueuePair`] (`struct ibv_qp`, UC only), its creation attributes [`QpInitAttr`] and its
//! backend trait [`QpOps`].

use std::fmt;
use std::sync::Arc;

use super::cq::CompletionQueue;
use super::error::{ConnectError, PostRecvError, PostSendError};
use super::stats::QpStats;
use super::types::{AccessFlags, Mtu, QpEndpoint, QpState};
use super::wr::{RecvWr, SendWr};

/// Attributes of a new UC QP (`struct ibv_qp_init_attr` + the INIT access flags).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// CQ receiving send completions.
    pub send_cq: &'a CompletionQueue,
    /// CQ receiving receive completions. Size it ≥ `max_recv_wr` and poll it fast: an overflow
    /// moves the QP to ERROR.
    pub recv_cq: &'a CompletionQueue,
    /// Send queue depth: outstanding (not yet on the wire) send WRs.
    pub max_send_wr: u32,
    /// Receive queue depth: posted, not yet consumed receive WRs.
    pub max_recv_wr: u32,
    /// QP access flags set in INIT (`qp_access_flags`): REMOTE_WRITE to accept inbound RDMA
    /// WRITE; without it inbound writes are dropped (`access_denied`).
    pub access: AccessFlags,
    /// Largest path MTU this QP offers in its endpoint; `None` = the port's active MTU.
    pub max_mtu: Option<Mtu>,
}

/// A UC queue pair (`struct ibv_qp`). Cheap to clone (shared); `Send + Sync`; destroyed when the
/// last clone is dropped.
#[derive(Clone, Debug)]
pub struct QueuePair {
    inner: Arc<dyn QpOps>,
}

impl QueuePair {
    /// Wraps a transport's QP implementation.
    pub fn from_backend(inner: Arc<dyn QpOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn QpOps> {
        &self.inner
    }

    /// The QP number (24 bits).
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }

    /// Current state. A QP that moved to ERROR on its own also raised an
    /// [`AsyncEvent::QpFatal`](super::AsyncEvent::QpFatal).
    pub fn state(&self) -> QpState {
        self.inner.state()
    }

    /// What the peer needs to connect to this QP (send it over the control channel).
    pub fn local_endpoint(&self) -> QpEndpoint {
        self.inner.local_endpoint()
    }

    /// Connects to `remote`: INIT → RTR (dest QPN = `remote.qpn`, expected PSN = `remote.psn`,
    /// path MTU = min of both MTUs, address from `remote.gid` / `remote.udp_addr`) → RTS (send
    /// PSN = this QP's [`QpEndpoint::psn`]). UC needs nothing else: no timeout, retry counts or
    /// RD atomics (ibv_modify_qp(3) UC masks).
    ///
    /// # Errors
    /// [`ConnectError::InvalidState`] unless the QP is in INIT; [`ConnectError::InvalidEndpoint`]
    /// for a bad MTU/QPN/PSN; [`ConnectError::Modify`] when the transport refuses.
    pub fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        self.inner.connect(remote)
    }

    /// Moves the QP to ERROR (`ibv_modify_qp(IBV_QPS_ERR)`): outstanding WRs complete with
    /// [`WcStatus::WrFlushError`]. Use before tearing a connection down.
    ///
    /// [`WcStatus::WrFlushError`]: super::WcStatus::WrFlushError
    pub fn modify_to_error(&self) {
        self.inner.modify_to_error()
    }

    /// Posts a list of send WRs (`ibv_post_send`).
    ///
    /// Rules: the QP must be in RTS; each SGE must lie inside an MR of this device; the message
    /// must not exceed [`PortAttr::max_msg_size`]; at most `max_send_wr` WRs may be outstanding
    /// (a WR stays outstanding until its last packet is on the wire). A signaled WR completes
    /// in the send CQ with [`WcOpcode::Send`] or [`WcOpcode::RdmaWrite`] once on the wire.
    ///
    /// # Errors
    /// [`PostSendError`] naming the first rejected WR (`posted` WRs before it were accepted):
    /// [`PostSendErrorKind::Full`] (cheap, retry later), `InvalidState`, `SgeOutOfBounds`,
    /// `ForeignMr`, `MessageTooLong`.
    ///
    /// [`PortAttr::max_msg_size`]: crate::api::PortAttr::max_msg_size
    /// [`WcOpcode::Send`]: super::WcOpcode::Send
    /// [`WcOpcode::RdmaWrite`]: super::WcOpcode::RdmaWrite
    /// [`PostSendErrorKind::Full`]: super::PostSendErrorKind::Full
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        self.inner.post_send(wrs)
    }

    /// Posts a list of receive WRs (`ibv_post_recv`).
    ///
    /// Rules: allowed in INIT, RTR, RTS and ERROR (in ERROR the WR is flushed); each SGE must
    /// lie inside an MR of this device registered with LOCAL_WRITE; at most `max_recv_wr` WRs
    /// may be posted. Inbound SENDs and RDMA WRITE_WITH_IMMs consume WRs in posting order.
    ///
    /// # Errors
    /// [`PostRecvError`] naming the first rejected WR: [`PostRecvErrorKind::Full`] (cheap),
    /// `InvalidState`, `SgeOutOfBounds`, `NoLocalWrite`, `ForeignMr`.
    ///
    /// [`PostRecvErrorKind::Full`]: super::PostRecvErrorKind::Full
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        self.inner.post_recv(wrs)
    }

    /// Counters of this QP, including silent drops by [`UcDropReason`](super::UcDropReason).
    pub fn stats(&self) -> QpStats {
        self.inner.stats()
    }
}

/// A UC queue pair. See [`QueuePair`].
pub trait QpOps: Send + Sync + fmt::Debug {
    /// See [`QueuePair::qp_num`].
    fn qp_num(&self) -> u32;
    /// See [`QueuePair::state`].
    fn state(&self) -> QpState;
    /// See [`QueuePair::local_endpoint`].
    fn local_endpoint(&self) -> QpEndpoint;
    /// See [`QueuePair::connect`].
    fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError>;
    /// See [`QueuePair::modify_to_error`].
    fn modify_to_error(&self);
    /// See [`QueuePair::post_send`].
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError>;
    /// See [`QueuePair::post_recv`].
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError>;
    /// See [`QueuePair::stats`].
    fn stats(&self) -> QpStats;
}
