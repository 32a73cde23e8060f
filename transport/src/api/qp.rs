//! [`QueuePair`] (`struct ibv_qp`, UC or RC), its creation attributes [`QpInitAttr`] with
//! the transport service [`QpType`] and the RC knobs [`RcAttr`], its backend trait
//! [`QpOps`], and [`post_send_batch`]: the WR lists of many QPs handed over together.

use std::fmt;
use std::sync::Arc;

use super::cq::CompletionQueue;
use super::error::{ConnectError, PostRecvError, PostSendError};
use super::stats::QpStats;
use super::types::{AccessFlags, Mtu, QpEndpoint, QpState};
use super::wr::{RecvWr, SendWr};

/// The RC connection attributes (`ibv_modify_qp(3)` RTR and RTS masks of an `IBV_QPT_RC` QP),
/// with the meaning IBTA gives them. Applied by [`QueuePair::connect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcAttr {
    /// Local ACK timeout exponent: the requester retransmits when no ACK came within
    /// 4.096 µs × 2^`timeout` (IBTA 9.7.6.1.3, `IBV_QP_TIMEOUT`); 0 disables the timer, 1..=31.
    pub timeout: u8,
    /// Retries after a timeout or a PSN sequence NAK before the WR fails with
    /// `RetryExceededError` and the QP moves to ERROR, 0..=7 (`IBV_QP_RETRY_CNT`). The soft
    /// transport reads 7 as seven retries (IBTA); rxe retries forever at 7.
    pub retry_cnt: u8,
    /// Retries after RNR NAKs, 0..=7, 7 = forever (IBTA 9.7.5.2.8, `IBV_QP_RNR_RETRY`).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP's responder announces (5 bits, IBTA Table 45,
    /// `IBV_QP_MIN_RNR_TIMER`): how long the peer waits before resending.
    pub min_rnr_timer: u8,
    /// RDMA READ / atomic requests this QP may have outstanding as requester
    /// (`IBV_QP_MAX_QP_RD_ATOMIC`). uctel issues none; verbs requires a value.
    pub max_rd_atomic: u8,
    /// RDMA READ / atomic requests accepted as responder (`IBV_QP_MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
}

impl Default for RcAttr {
    /// `timeout` 14 (≈ 67 ms), `retry_cnt` 7, `rnr_retry` 7 (forever), `min_rnr_timer` 12
    /// (0.64 ms), one READ/atomic each way (what `ibv_rc_pingpong` and perftest use).
    fn default() -> Self {
        Self {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

impl RcAttr {
    /// Checks the field ranges (IBTA bit widths).
    ///
    /// # Errors
    /// A message naming the first field out of range.
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("timeout", self.timeout, 31),
            ("retry_cnt", self.retry_cnt, 7),
            ("rnr_retry", self.rnr_retry, 7),
            ("min_rnr_timer", self.min_rnr_timer, 31),
        ];
        for (name, value, max) in fields {
            if value > max {
                return Err(format!("{name} {value} is out of range 0..={max}"));
            }
        }
        Ok(())
    }
}

/// The transport service of a QP (`enum ibv_qp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QpType {
    /// Unreliable Connection (`IBV_QPT_UC`): no ACK, no retransmission; a lost packet loses
    /// its message, counted by the receiver's sequence tracking.
    #[default]
    Uc,
    /// Reliable Connection (`IBV_QPT_RC`): ACKed, retransmitted by the requester (IBTA 9.7),
    /// with these connection attributes.
    Rc(RcAttr),
}

impl QpType {
    /// `"uc"` or `"rc"`, for labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Uc => "uc",
            Self::Rc(_) => "rc",
        }
    }
}

/// Attributes of a new QP (`struct ibv_qp_init_attr` + the INIT access flags).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// UC or RC (with its connection attributes).
    pub qp_type: QpType,
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

/// A UC or RC queue pair (`struct ibv_qp`). Cheap to clone (shared); `Send + Sync`; destroyed when the
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

    /// UC or RC, as created.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type()
    }

    /// Current state. A soft QP that moved to ERROR on its own also raised an
    /// [`AsyncEvent::QpFatal`](super::AsyncEvent::QpFatal); a verbs device may report an RC
    /// QP's exhausted retries only by the error completion and this state (rxe's completer
    /// moves the QP to ERROR without an event).
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
    /// RD atomics (ibv_modify_qp(3) UC masks); an RC QP also applies its [`RcAttr`].
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
    /// (UC: until its last packet is on the wire; RC: until it is acknowledged). A signaled
    /// WR completes in the send CQ with [`WcOpcode::Send`] or [`WcOpcode::RdmaWrite`] once on
    /// the wire (UC) or acknowledged (RC); an RC WR whose retries ran out completes with
    /// `RetryExceededError` / `RnrRetryExceededError` and the QP moves to ERROR.
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

/// One QP's WR list in a [`post_send_batch`].
#[derive(Clone, Copy, Debug)]
pub struct QpSendList<'q, 'a> {
    /// The QP the WRs are posted on.
    pub qp: &'q QueuePair,
    /// Its WRs, in order (one `ibv_send_wr` list, `next`-linked on verbs).
    pub wrs: &'q [SendWr<'a>],
}

/// Posts the WR lists of many QPs as one submission where the transport can: every list is
/// queued on its QP with [`QueuePair::post_send`]'s rules and errors, and transmission of
/// them all starts once per device afterwards.
///
/// * Soft transport: the WRs of every QP of one device are queued first, then one transmit
///   pass packetises them all and hands the datagrams to the link together: on UDP one
///   `sendmmsg(2)` per `SoftConfig::batch` datagrams, whatever
///   their destinations (`sendmmsg` takes a destination per message; `UDP_SEGMENT` would need
///   one destination and is used only for runs to one peer). Posting the lists one by one
///   costs one transmit pass, and one system call, per QP.
/// * Verbs: a WR list belongs to one QP (IBTA §11.4.1.1, `ibv_post_send(3)`), so the batch is
///   one `ibv_post_send` of the `next`-linked list per QP: one doorbell per QP, never one for
///   several QPs. The gain over posting one WR at a time is the WRs of one QP sharing its
///   doorbell.
///
/// Returns one result per list, in order (a refused list does not stop the others).
pub fn post_send_batch(lists: &[QpSendList<'_, '_>]) -> Vec<Result<(), PostSendError>> {
    let results = lists
        .iter()
        .map(|l| l.qp.inner.post_send_queued(l.wrs))
        .collect();
    // One transmit start per device: the first QP of each transmit group rings for all.
    let mut rung: Vec<usize> = Vec::new();
    for l in lists {
        let group = l.qp.inner.transmit_group();
        if group != 0 && !rung.contains(&group) {
            rung.push(group);
            l.qp.inner.start_transmit();
        }
    }
    results
}

/// A UC or RC queue pair. See [`QueuePair`].
pub trait QpOps: Send + Sync + fmt::Debug {
    /// See [`QueuePair::qp_num`].
    fn qp_num(&self) -> u32;
    /// See [`QueuePair::qp_type`].
    fn qp_type(&self) -> QpType;
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
    /// Queues `wrs` as [`QpOps::post_send`] does, but may leave their transmission to
    /// [`QpOps::start_transmit`] ([`post_send_batch`]). The default posts at once.
    fn post_send_queued(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        self.post_send(wrs)
    }
    /// Identifies the transmit path this QP shares with others (its device); 0 when
    /// [`QpOps::post_send_queued`] already transmits (the default).
    fn transmit_group(&self) -> usize {
        0
    }
    /// Starts transmitting what [`QpOps::post_send_queued`] left queued on every QP of this
    /// QP's [`QpOps::transmit_group`]. The default does nothing.
    fn start_transmit(&self) {}
    /// See [`QueuePair::post_recv`].
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError>;
    /// See [`QueuePair::stats`].
    fn stats(&self) -> QpStats;
}
