//! The verbs transport: the [`crate::api`] backend traits implemented on real RDMA devices
//! through libibverbs (`rdma-sys` 0.3.0), behind the `verbs` cargo feature. Without the feature
//! only [`VerbsConfig`] is compiled, so that configuration parses on every build.
//!
//! What the mapping does (sources: ibv_modify_qp(3), ibv_create_qp(3), ibv_post_send(3),
//! ibv_get_async_event(3), and the Linux rxe driver as verified in the Soft-RoCE VM suite):
//!
//! * Device by name (`VerbsConfig::device`), port by number; RoCE v2 GID chosen by type
//!   (`_ibv_query_gid_ex`, `IBV_GID_TYPE_ROCE_V2`) and by the configured local IP address
//!   (preferring an IPv4-mapped GID when no address is given), or an explicit GID index.
//! * UC and RC QPs (`IBV_QPT_UC`, `IBV_QPT_RC`), one SGE per WR, with a receive queue of
//!   their own or on a shared receive queue (`ibv_create_srq`, `max_sge` 1;
//!   `ibv_post_srq_recv`; the limit event armed with `ibv_modify_srq(IBV_SRQ_LIMIT)`). The
//!   man page ibv_create_qp(3) allows an SRQ only on RC and UD QPs, but libibverbs passes
//!   the request to the provider, and rxe (`rxe_qp_chk_init`) and mlx5 (`get_rx_type`)
//!   accept it on UC; a provider that refuses makes `create_qp_with_srq` fail with the
//!   errno, and the caller keeps a receive queue per QP (DESIGN.md §6). Any number of QPs
//!   may share one send and one receive CQ: a completion names its QP (`wc.qp_num`), and the
//!   CQ maps it back to the QP's bookkeeping. Destruction order: QPs before their SRQ before
//!   the PD (each child holds its parent). RESET→INIT
//!   (`STATE|PKEY_INDEX|PORT|ACCESS_FLAGS`, both types) at creation, INIT→RTR
//!   (`STATE|AV|PATH_MTU|DEST_QPN|RQ_PSN`, RC adds `MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER`) and
//!   RTR→RTS (`STATE|SQ_PSN`, RC adds `TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC`) in
//!   `connect`, the RC values from the QP's [`RcAttr`](crate::api::RcAttr), checked at
//!   creation; a GRH is always present (RoCE). RC delivery (ACK/NAK, retransmission, RNR) is
//!   the device's; a WR whose retries ran out completes with `RetryExceededError` /
//!   `RnrRetryExceededError` and the QP moves to ERROR.
//! * Unsignaled sends: the send queue slot of an unsignaled WR is only known free once a later
//!   signaled WR completes, so the transport signals one WR on its own at least every half send
//!   queue and hides those completions from the caller. The caller still sees exactly the
//!   completions it asked for (plus every error completion, as ibverbs reports them).
//! * CQs have their own completion channel: `wait_for_completion` blocks until a completion
//!   may be ready (`ibv_req_notify_cq` + `ibv_get_cq_event`, events acknowledged in batches).
//!   An API [`CompletionChannel`](crate::api::CompletionChannel) waits on many CQs at once:
//!   `req_notify` arms a CQ and remembers it, `wait` sleeps in `poll(2)` on the channels of the
//!   CQs armed since the last wait plus an eventfd (its `wake`), and takes the events of the
//!   readable ones. Keeping one `ibv_comp_channel` per CQ means every event is taken and
//!   acknowledged on the CQ it belongs to, and destroying a CQ never waits for another CQ's
//!   events.
//! * Asynchronous events are read non-blocking from the context's async fd; QP fatal events
//!   mark the QP's state ERROR; `IBV_EVENT_SRQ_LIMIT_REACHED` and `IBV_EVENT_SRQ_ERR` are
//!   counted on the SRQ, logged, and returned as `AsyncEvent::SrqLimitReached` /
//!   `AsyncEvent::SrqError`.
//! * No device at all (the host kernel has no RDMA, or no device is configured): `open` fails
//!   with `NO_DEVICE`, never panics.
//!
//! * Teardown order: destroy a QP before the MRs that were written into through it. rxe (Linux
//!   6.1) keeps a reference from a QP that failed in the middle of an inbound RDMA WRITE to the
//!   target MR, and `ibv_dereg_mr` on that MR then blocks for rxe's pool cleanup timeout (about
//!   50 s, found by the VM suite's CQ overflow scenario). MR handles do not keep QPs alive, so
//!   this order is the caller's to keep (drop the `QueuePair` first).
//!
//! Counters: the device does not tell a UC responder's silent drops per QP, nor an RC QP's
//! retransmissions, so [`QpStats::drops`] and `QpStats::rc` stay zero here (rxe counts RC
//! events per port, `hw_counters/rcvd_seq_err`, `completer_retry_err`, …); [`DeviceStats`] carries the port's packet counters from
//! sysfs (`hw_counters/sent_pkts`/`rcvd_pkts` on rxe, `counters/port_*_packets` elsewhere).
//!
//! # Layout
//!
//! ```text
//! config.rs   VerbsConfig (always compiled)
//! ffi.rs      every libibverbs object as an owned RAII type (children hold their parents in
//!             Arcs); the only file with `unsafe`, each block with a `// SAFETY:` note
//! codes.rs    verbs.h enum values (QP attribute masks included) and their mapping to the
//!             API types
//! shared.rs   DevShared, QpShared and SrqShared: what a device's objects share; the
//!             signaling plan
//! device.rs   open, device_names, VerbsDevice (DeviceOps), async events, sysfs counters
//! pd.rs       VerbsPd: reg_mr, create_srq, create_qp / create_qp_with_srq (UC or RC,
//!             RESET -> INIT)
//! srq.rs      VerbsSrq: post_srq_recv, arm_limit; receive WR conversion (QPs use it too)
//! mr.rs       VerbsMr, SGE resolution
//! qp.rs       VerbsQp: connect (INIT -> RTR -> RTS), post_send, post_recv
//! cq.rs       VerbsCq, VerbsCompChannel, wait_for_completion
//! ```
//!
//! The files depend on each other in one direction (`codes` ← `ffi` ← `shared` ← `mr` ← `srq`
//! ← `cq`, `qp` ← `pd` ← `device`).
//!
//! [`QpStats::drops`]: crate::api::QpStats::drops
//! [`DeviceStats`]: crate::api::DeviceStats

#[forbid(unsafe_code)]
mod config;

pub use config::VerbsConfig;

#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod codes;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod cq;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod device;
// All unsafe FFI of the workspace lives in this one module (workspace lint `unsafe_code =
// "deny"`): libibverbs is a C library, and its objects are wrapped once in `ffi` with RAII types
// so that the rest of the transport is safe code.
#[cfg(feature = "verbs")]
#[allow(unsafe_code)]
mod ffi;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod mr;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod pd;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod qp;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod shared;
#[cfg(feature = "verbs")]
#[forbid(unsafe_code)]
mod srq;

#[cfg(feature = "verbs")]
pub use cq::{wait_for_completion, WaitError};
#[cfg(feature = "verbs")]
pub use device::{device_names, open, VerbsDevice, NO_DEVICE};
