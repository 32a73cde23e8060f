//! The verbs-shaped transport API shared by every uctel transport.
//!
//! Agent and collector code is written once against this module and runs unchanged on the
//! **soft** transport (RoCEv2 UC in user space over UDP, [`crate::soft`]) and on the **verbs**
//! transport (real RDMA through `rdma-sys`). The shapes follow ibverbs (`libibverbs/verbs.h` in
//! rdma-core) so that the verbs implementation is a thin mapping:
//!
//! | here | ibverbs |
//! |---|---|
//! | [`Device::open`] | `ibv_open_device` + `ibv_query_port` / `ibv_query_gid` |
//! | [`Device::alloc_pd`] | `ibv_alloc_pd` |
//! | [`ProtectionDomain::reg_mr`] | allocate + `ibv_reg_mr` |
//! | [`Device::create_cq`] | `ibv_create_cq` |
//! | [`ProtectionDomain::create_qp`] | `ibv_create_qp(IBV_QPT_UC / IBV_QPT_RC)` + `ibv_modify_qp(INIT)` |
//! | [`QueuePair::connect`] | `ibv_modify_qp(RTR)` + `ibv_modify_qp(RTS)` |
//! | [`QueuePair::post_send`] / [`QueuePair::post_recv`] | `ibv_post_send` / `ibv_post_recv` (WR lists) |
//! | [`CompletionQueue::poll`] | `ibv_poll_cq` |
//! | [`Device::create_comp_channel`] | `ibv_create_comp_channel` (+ an eventfd for [`CompletionChannel::wake`]) |
//! | [`CompletionChannel::req_notify`] / [`CompletionChannel::wait`] | `ibv_req_notify_cq` / `ibv_get_cq_event` + `ibv_ack_cq_events` |
//! | [`Device::poll_async_event`] | `ibv_get_async_event` (non-blocking) |
//!
//! # Dispatch: concrete handles over object-safe backend traits
//!
//! The public handles ([`Device`], [`ProtectionDomain`], [`MemoryRegion`], [`CompletionQueue`],
//! [`CompletionChannel`], [`QueuePair`]) are concrete, cheaply clonable types. Each one wraps an
//! `Arc<dyn …Ops>` ([`backend`]), which a transport implements. The transport is chosen at run
//! time from configuration ([`crate::device::DeviceConfig`], typically mapped from YAML) and
//! everything above it is one non-generic code path: no type parameters leak into agent or
//! collector structs. The price is one virtual call per verb (`post_send`, `poll_cq`), which is
//! noise next to the work each verb does (the soft transport builds and checksums packets; the
//! verbs transport rings a doorbell).
//!
//! The traits stay open (rather than a closed `enum Backend { Soft, Verbs }` in each handle)
//! because this module must not name the transports: it is the leaf both of them build on.
//! Where a transport needs its own type back from a handle it was given (the MR of an SGE, the
//! CQs of [`QpInitAttr`], a CQ to arm), [`MrOps::as_any`] / [`CqOps::as_any`] recover it, and a
//! failed downcast is exactly the `ForeignMr` / `ForeignCq` error an enum match would need too.
//!
//! # Rules that hold on every transport
//!
//! * UC (the default) and RC ([`QpType`]): SEND and RDMA WRITE, each optionally with a 32-bit
//!   immediate; no READ, no atomics. On UC there is no ACK/NAK and no retransmission, and a
//!   send completion means "handed to the wire", never "delivered"; on RC a send completion
//!   means "acknowledged by the responder" (IBTA 9.7), and the requester retransmits.
//! * A QP is created in INIT (so receive WRs can be posted before the peer starts sending) and
//!   reaches RTS with [`QueuePair::connect`]. Any QP can fall into ERROR (for example when its
//!   receive CQ overflows); that is observable with [`QueuePair::state`] and as an
//!   [`AsyncEvent`]. A QP in ERROR is not repaired: tear the connection down and build a new QP.
//! * Memory regions are owned by the transport and accessed with [`MemoryRegion::read_at`] /
//!   [`MemoryRegion::write_at`] (the workspace denies `unsafe` outside the verbs module, so no
//!   slices into NIC-visible memory are handed out). Access flags never include REMOTE_READ:
//!   rings are write-only to the remote side.
//! * Every silently dropped inbound message is counted with a [`UcDropReason`] (see
//!   [`QueuePair::stats`] and [`Device::stats`]); the verbs transport fills what the hardware
//!   exposes.
//!
//! # Layout
//!
//! One file per verbs object, each with its handle and its backend trait, as in the `sideway`
//! crate; the files depend on each other in one direction only (`types` ← `error`, `stats`,
//! `event` ← `mr` ← `wr` ← `cq` ← `qp` ← `pd` ← `context`):
//!
//! ```text
//! types.rs    constants (RoCEv2 port, PSN/QPN masks, IBTA message limit), TransportKind,
//!             AccessFlags, Mtu, QpState, GID <-> IP, QpEndpoint, PortAttr
//! error.rs    one error enum per operation
//! stats.rs    UcDropReason, DropCounters, QpStats, DeviceStats
//! event.rs    AsyncEvent, QpErrorCause
//! mr.rs       MemoryRegion + MrOps
//! wr.rs       Sge, SendWr / SendOpcode, RecvWr, WorkCompletion / WcStatus / WcOpcode
//! cq.rs       CompletionQueue + CqOps, CompletionChannel + CompChannelOps
//! qp.rs       QueuePair + QpOps, QpInitAttr, post_send_batch
//! pd.rs       ProtectionDomain + PdOps
//! context.rs  Device + DeviceOps
//! ```
//!
//! [`MrOps::as_any`]: backend::MrOps::as_any
//! [`CqOps::as_any`]: backend::CqOps::as_any

mod context;
mod cq;
mod error;
mod event;
mod mr;
mod pd;
mod qp;
mod srq;
mod stats;
mod types;
mod wr;

pub use context::Device;
pub use cq::{CompletionChannel, CompletionQueue};
pub use error::{
    AllocPdError, CompChannelError, ConnectError, CreateCqError, CreateQpError, CreateSrqError,
    MemoryAccessError, OpenError, PostRecvError, PostRecvErrorKind, PostSendError,
    PostSendErrorKind, RegMrError,
};
pub use event::{AsyncEvent, QpErrorCause};
pub use mr::MemoryRegion;
pub use pd::ProtectionDomain;
pub use qp::{post_send_batch, QpInitAttr, QpSendList, QpType, QueuePair, RcAttr};
pub use srq::SharedReceiveQueue;
pub use stats::{DeviceStats, DropCounters, QpStats, RcCounters, UcDropReason};
pub use types::{
    gid_from_ip, ip_from_gid, AccessFlags, Mtu, PortAttr, QpEndpoint, QpState, TransportKind,
    IBTA_MAX_MSG_SIZE, PSN_MASK, QPN_MASK, ROCE_V2_UDP_PORT,
};
pub use wr::{RecvWr, SendOpcode, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

/// Object-safe traits a transport implements; the public handles wrap them.
///
/// Implementations must be `Send + Sync`: handles are shared between a control thread
/// (connect, teardown) and a poller thread (post, poll). Every method documents its contract on
/// the corresponding public handle method. Each trait is defined beside its handle.
pub mod backend {
    pub use super::context::DeviceOps;
    pub use super::cq::{CompChannelOps, CqOps};
    pub use super::mr::MrOps;
    pub use super::pd::PdOps;
    pub use super::qp::QpOps;
    pub use super::srq::SrqOps;
}
