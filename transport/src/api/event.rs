//! Asynchronous events (`ibv_get_async_event`): [`AsyncEvent`] and why a QP failed
//! ([`QpErrorCause`]).

/// Why a QP moved to ERROR on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpErrorCause {
    /// The receive CQ overflowed (IBTA class G).
    RecvCqOverflow,
    /// The send CQ overflowed.
    SendCqOverflow,
    /// An inbound SEND did not fit its receive buffer (rxe: class A, `IBV_WC_LOC_QP_OP_ERR`).
    MessageTooLong,
    /// A receive WR's buffer became unusable.
    BadReceiveWr,
    /// A send WR's memory region became unusable (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// RC requester: the retransmit timer or PSN sequence NAKs used up `retry_cnt`
    /// (`IBV_WC_RETRY_EXC_ERR`; IBTA 9.7.6.1.3, rxe `rxe_comp.c` `COMPST_ERROR_RETRY`).
    RetryExceeded,
    /// RC requester: RNR NAKs used up `rnr_retry` (`IBV_WC_RNR_RETRY_EXC_ERR`; IBTA
    /// 9.7.5.2.8, rxe `rxe_comp.c` `COMPST_RNR_RETRY`).
    RnrRetryExceeded,
    /// RC requester: the responder answered with an invalid request, remote access or remote
    /// operational error NAK (IBTA 9.7.5.2.8).
    RemoteNak,
    /// RC responder: an inbound request failed a check that IBTA class C answers with a NAK
    /// and an ERROR transition (9.7.5.2.8; rxe `do_class_ac_error`).
    RequestError,
    /// Reported by an RDMA device, which gives no cause (verbs `IBV_EVENT_QP_FATAL`,
    /// `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`).
    Device,
}

/// Asynchronous events (`ibv_get_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP moved to ERROR.
    QpFatal {
        /// The QP.
        qpn: u32,
        /// Why.
        cause: QpErrorCause,
    },
    /// `IBV_EVENT_CQ_ERR`: a completion could not be added because the CQ was full.
    CqError {
        /// The CQ's handle number ([`CompletionQueue::handle`](super::CompletionQueue::handle)).
        cq: u32,
    },
    /// `IBV_EVENT_PORT_ACTIVE` / `IBV_EVENT_PORT_ERR`: the device port went up or down
    /// (verbs transport; QPs on a port that went down stop carrying traffic).
    PortChange {
        /// Port number (1-based).
        port: u32,
        /// Whether the port is now ACTIVE.
        active: bool,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer receive WRs than the limit armed with
    /// [`SharedReceiveQueue::arm_limit`](super::SharedReceiveQueue::arm_limit) remain on the
    /// SRQ; the limit is disarmed until armed again (ibv_modify_srq(3), IBTA vol. 1 10.2.9).
    /// Nothing is lost by the event itself: it says the SRQ runs low (verbs transport).
    SrqLimitReached {
        /// The SRQ's handle ([`SharedReceiveQueue::handle`](super::SharedReceiveQueue::handle)).
        srq: u32,
    },
    /// `IBV_EVENT_SRQ_ERR`: the SRQ failed; the QPs created on it receive nothing more
    /// (ibv_get_async_event(3); verbs transport).
    SrqError {
        /// The SRQ's handle.
        srq: u32,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the RDMA device failed; every object on it is unusable and
    /// the device must be closed and opened again (verbs transport).
    DeviceFatal,
}
