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
    /// `IBV_EVENT_DEVICE_FATAL`: the RDMA device failed; every object on it is unusable and
    /// the device must be closed and opened again (verbs transport).
    DeviceFatal,
}
