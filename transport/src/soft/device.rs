//! The soft device: the "NIC" that runs [`UcQp`] engines over a datagram [`Link`].
//!
//! One device owns one link (a UDP socket in production, [`crate::soft::link::MemoryLink`] in
//! tests, either optionally wrapped in the fault injector) and any number of UC QPs, CQs and
//! MRs. All QPs share the link, as all rxe QPs share UDP port 4791; inbound packets are
//! demultiplexed by BTH destination QPN.
//!
//! # Receive path (per datagram)
//!
//! 1. Parse BTH/RETH/ImmDt ([`PacketRepr::parse`]) — failure: `malformed` (device counter).
//!    A datagram the link discarded because it did not fit its receive buffer
//!    ([`Link::recv_discarded`]) is counted here too.
//! 2. Verify the ICRC over the pseudo IP/UDP header rebuilt from the datagram's addresses
//!    ([`icrc::verify`]) — failure: `bad_icrc`. (rxe checks the header before the ICRC; we
//!    check the ICRC first so that a corrupted QPN is not misreported as `unknown_qpn`.)
//! 3. Look up the destination QPN — unknown: `unknown_qpn`.
//! 4. Check the source IP against the connected peer (rxe `check_addr`) — `address_mismatch`.
//! 5. Hand the packet to the QP's engine, which places RDMA WRITE data into the target MR,
//!    scatters SEND data into receive buffers and pushes WCs into the receive CQ.
//!
//! # Send path
//!
//! `post_send` queues WRs in the engine; packets are pulled from every QP with pending WRs,
//! sealed (ICRC) and handed to the link in batches (`sendmmsg` on UDP). If the link takes
//! fewer datagrams than offered (socket buffer full) the rest wait in the device's transmit
//! queue and no more are pulled until it drains, so a WR's SQ slot is held until its packets
//! are with the device.
//!
//! # Progress modes ([`ProgressMode`])
//!
//! * **`thread`** — a background thread acts as the NIC: it sends queued packets, receives
//!   what arrived and processes it, round after round while there is work. When a round finds
//!   nothing it sleeps in `poll(2)` on the link's socket ([`Link::wait_fd`]) and an eventfd,
//!   without holding the link, so an idle device costs no CPU: the next datagram, or a post
//!   that could not send by itself, wakes it at once. `post_send` sends directly when the
//!   link is free; when the thread is in a round, the post wakes it and the thread sends. A
//!   link that cannot be waited on from outside ([`Readiness::Opaque`], e.g. the in-memory
//!   link of tests) is waited on in its `recv` for up to
//!   [`SoftConfig::progress_wait_micros`] per round instead, as is a socket that refused
//!   packets (retried after that long, or sooner when a datagram arrives). `poll_cq` only
//!   reads the CQ. The thread holds only a weak reference: the last handle dropped wakes it
//!   and it stops.
//! * **`busy_poll`** — no thread. `post_send` sends at once, and every [`CompletionQueue::poll`]
//!   (`poll_cq`) first drives the device once without blocking (send queued packets, receive
//!   one batch, process it, flush QPs in ERROR). Lowest latency and fully deterministic with a
//!   [`crate::soft::link::MemoryLink`]; the caller's poll loop is the NIC, so poll often, or
//!   sleep in [`CompletionChannel::wait`], which drives the device while it waits.
//!
//! # Sleeping on completions
//!
//! A [`SoftCompChannel`] is an eventfd. [`CompletionChannel::req_notify`] arms a CQ on it;
//! the device signals the eventfd when it pushes the next completion into an armed CQ (once
//! per arming, so a busy CQ costs one atomic load per completion and no system call).
//!
//! Both modes are `Send + Sync`: any thread may post, poll or connect.
//!
//! [`CompletionQueue::poll`]: crate::api::CompletionQueue::poll
//! [`CompletionChannel::wait`]: crate::api::CompletionChannel::wait
//! [`CompletionChannel::req_notify`]: crate::api::CompletionChannel::req_notify

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::api::backend::{CompChannelOps, CqOps, DeviceOps, MrOps, PdOps, QpOps};
use crate::api::{
    gid_from_ip, AccessFlags, AllocPdError, AsyncEvent, CompChannelError, CompletionQueue,
    ConnectError, CreateCqError, CreateQpError, Device, DeviceStats, DropCounters,
    MemoryAccessError, Mtu, OpenError, PortAttr, PostRecvError, PostRecvErrorKind, PostSendError,
    PostSendErrorKind, QpEndpoint, QpInitAttr, QpState, QpStats, RecvWr, RegMrError, SendWr, Sge,
    TransportKind, UcDropReason, WorkCompletion, PSN_MASK, QPN_MASK,
};
use crate::soft::engine::{
    CompletionSink, CqFull, LocalSge, PostRefusal, RecvRefusal, RecvWqe, RtrAttr, SendWqe, UcQp,
    UcQpConfig,
};
use crate::soft::fault::{FaultConfig, FaultInjector, FaultStats};
use crate::soft::icrc;
use crate::soft::link::{Datagram, Link, Readiness};
use crate::soft::memory::{MrTable, SoftMr};
use crate::soft::packet::PacketRepr;
use crate::soft::udp::{UdpConfig, UdpLink};
use crate::sync::lock;
use crate::wake::{deadline_after, sleep_until, WakeFd};

/// Largest CQ depth.
pub const MAX_CQ_DEPTH: u32 = 1 << 20;
/// Largest send or receive queue depth.
pub const MAX_QP_WR: u32 = 1 << 16;
/// Largest message the soft device accepts, in bytes ([`PortAttr::max_msg_size`]): 8 MiB, as rxe advertises (`RXE_PORT_MAX_MSG_SZ`), so that nothing built
/// on the soft transport relies on more than a kernel rxe peer accepts.
pub const SOFT_MAX_MSG_SIZE: u32 = 0x0080_0000;
/// Most asynchronous events kept; later ones are discarded until the queue is read.
const MAX_EVENTS: usize = 4096;
/// Most packets pulled from one QP per round, for fairness between QPs.
const PER_QP_BURST: usize = 64;

/// How the device makes progress. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// A background thread acts as the NIC.
    #[default]
    Thread,
    /// No thread: `poll_cq` drives the device.
    BusyPoll,
}

/// Configuration of a soft device (the `transport.soft` section of agent and collector YAML).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SoftConfig {
    /// Device name, for logs and metric labels.
    pub name: String,
    /// The UDP socket (bind address, buffers, batch size).
    pub udp: UdpConfig,
    /// Address peers should send to, when `udp.bind` is a wildcard address; `None` = the bind
    /// address.
    pub advertise_addr: Option<SocketAddr>,
    /// Active path MTU in bytes: 256, 512, 1024 (default; rxe's MTU on a 1500-byte netdev),
    /// 2048 or 4096.
    pub mtu_bytes: u32,
    /// Progress mode.
    pub progress: ProgressMode,
    /// Thread mode, in microseconds (1..=1000000): how long a round waits in the link's
    /// `recv` when the link cannot be slept on from outside (in-memory links), and after how
    /// long packets the socket refused are retried. An idle device sleeps without a timeout.
    pub progress_wait_micros: u64,
    /// Most datagrams sent or received per link call (1..=1024).
    pub batch: usize,
    /// Faults injected on the UDP link (testing and demos); `None` = none.
    pub faults: Option<FaultConfig>,
}

impl Default for SoftConfig {
    fn default() -> Self {
        Self {
            name: "soft0".to_owned(),
            udp: UdpConfig::default(),
            advertise_addr: None,
            mtu_bytes: Mtu::Mtu1024.bytes(),
            progress: ProgressMode::Thread,
            progress_wait_micros: 500,
            batch: 64,
            faults: None,
        }
    }
}

impl SoftConfig {
    fn validate(&self) -> Result<Mtu, OpenError> {
        let bad = |detail: String| OpenError::InvalidConfig {
            kind: TransportKind::Soft,
            detail,
        };
        let mtu = Mtu::from_bytes(self.mtu_bytes).ok_or_else(|| {
            bad(format!(
                "mtu_bytes {} is not 256, 512, 1024, 2048 or 4096",
                self.mtu_bytes
            ))
        })?;
        if !(1..=1_000_000).contains(&self.progress_wait_micros) {
            return Err(bad(format!(
                "progress_wait_micros {} outside 1..=1000000",
                self.progress_wait_micros
            )));
        }
        if !(1..=1024).contains(&self.batch) {
            return Err(bad(format!("batch {} outside 1..=1024", self.batch)));
        }
        if let Some(f) = &self.faults {
            f.validate().map_err(|e| bad(format!("faults: {e}")))?;
        }
        Ok(mtu)
    }
}

/// An IPv4-mapped IPv6 address as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

// ---------------------------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct CqInner {
    handle: u32,
    depth: usize,
    wcs: Mutex<VecDeque<WorkCompletion>>,
    overflowed: AtomicBool,
    /// Armed by [`CompletionChannel::req_notify`](crate::api::CompletionChannel::req_notify):
    /// the next completion signals `channel` and disarms.
    armed: AtomicBool,
    /// The eventfd of the completion channel this CQ was last armed on.
    channel: Mutex<Option<Arc<WakeFd>>>,
}

impl CqInner {
    fn new(handle: u32, depth: usize) -> CqInner {
        CqInner {
            handle,
            depth,
            wcs: Mutex::new(VecDeque::new()),
            overflowed: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            channel: Mutex::new(None),
        }
    }

    /// After a completion was pushed: signals the channel the CQ is armed on, once.
    ///
    /// Lost-wakeup freedom: the poller arms (`armed = true`) and then polls the CQ, taking
    /// `wcs`; a push takes `wcs` and then reads `armed`. Whichever takes the lock second sees
    /// the other's write: the poller finds the completion, or the push finds the CQ armed.
    fn notify(&self) {
        if self.armed.load(Ordering::Acquire) && self.armed.swap(false, Ordering::AcqRel) {
            if let Some(ch) = lock(&self.channel).as_ref() {
                ch.wake();
            }
        }
    }
}

/// A [`CompletionSink`] over a shared CQ (locks per completion, so a QP whose send and
/// receive CQ are the same CQ never holds it twice).
struct CqSink<'a>(&'a CqInner);

impl CompletionSink for CqSink<'_> {
    fn push(&mut self, wc: WorkCompletion) -> Result<(), CqFull> {
        {
            let mut q = lock(&self.0.wcs);
            if q.len() >= self.0.depth {
                self.0.overflowed.store(true, Ordering::Relaxed);
                return Err(CqFull);
            }
            q.push_back(wc);
        }
        self.0.notify();
        Ok(())
    }
}

/// A soft completion queue.
#[derive(Debug)]
pub struct SoftCq {
    inner: Arc<CqInner>,
    device: Weak<Shared>,
    busy_poll: bool,
}

impl CqOps for SoftCq {
    fn depth(&self) -> u32 {
        u32::try_from(self.inner.depth).unwrap_or(u32::MAX)
    }

    fn handle(&self) -> u32 {
        self.inner.handle
    }

    fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        if self.busy_poll {
            if let Some(dev) = self.device.upgrade() {
                dev.progress(Some(Duration::ZERO), false);
            }
        }
        let mut q = lock(&self.inner.wcs);
        let mut n = 0;
        for slot in wcs.iter_mut() {
            match q.pop_front() {
                Some(wc) => {
                    *slot = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A soft completion channel: an eventfd the device signals for armed CQs (see the module
/// docs). On a `busy_poll` device its `wait` drives the device while it waits.
#[derive(Debug)]
pub struct SoftCompChannel {
    wake: Arc<WakeFd>,
    device: Weak<Shared>,
}

impl CompChannelOps for SoftCompChannel {
    fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError> {
        let soft = cq
            .backend()
            .as_any()
            .downcast_ref::<SoftCq>()
            .filter(|c| Weak::ptr_eq(&c.device, &self.device))
            .ok_or(CompChannelError::ForeignCq {
                handle: cq.handle(),
            })?;
        {
            let mut ch = lock(&soft.inner.channel);
            if !ch.as_ref().is_some_and(|w| Arc::ptr_eq(w, &self.wake)) {
                *ch = Some(Arc::clone(&self.wake));
            }
        }
        soft.inner.armed.store(true, Ordering::Release);
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError> {
        let deadline = deadline_after(timeout);
        let io_err = |e: io::Error| CompChannelError::Device {
            what: "poll",
            detail: e.to_string(),
        };
        match self.device.upgrade() {
            Some(dev) if dev.busy_poll => dev.drive_until(&self.wake, deadline).map_err(io_err),
            _ => sleep_until(&self.wake, None, deadline)
                .map(|w| w.wake)
                .map_err(io_err),
        }
    }

    fn wake(&self) {
        self.wake.wake();
    }
}

// ---------------------------------------------------------------------------------------------
// Memory regions and protection domains
// ---------------------------------------------------------------------------------------------

/// A soft MR handle; deregisters its region when dropped.
#[derive(Debug)]
pub struct SoftMrHandle {
    mr: Arc<SoftMr>,
    table: Arc<MrTable>,
}

impl Drop for SoftMrHandle {
    fn drop(&mut self) {
        self.table.deregister(self.mr.key());
    }
}

impl MrOps for SoftMrHandle {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }
    fn length(&self) -> usize {
        self.mr.len()
    }
    fn lkey(&self) -> u32 {
        self.mr.key()
    }
    fn rkey(&self) -> u32 {
        self.mr.key()
    }
    fn access(&self) -> AccessFlags {
        self.mr.access()
    }
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        self.mr.read_at(offset, out)
    }
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        self.mr.write_at(offset, data)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A soft protection domain (the soft device has one key space; see [`crate::soft::memory`]).
#[derive(Debug)]
pub struct SoftPd {
    shared: Arc<Shared>,
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
        self.shared.create_qp(attr).map(|qp| qp as Arc<dyn QpOps>)
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct QpCore {
    engine: UcQp,
    /// Where packets go (the peer's UDP address), from RTR.
    remote: Option<SocketAddr>,
    /// Source address for sending and for the ICRC pseudo header.
    src: SocketAddr,
    /// Explicit source for the link (`Datagram::local`) when bound to a wildcard address.
    src_override: Option<SocketAddr>,
}

#[derive(Debug)]
struct QpSlot {
    qpn: u32,
    sq_psn: u32,
    max_mtu: Mtu,
    core: Mutex<QpCore>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
}

/// A soft UC QP handle; destroys the QP when dropped.
#[derive(Debug)]
pub struct SoftQp {
    slot: Arc<QpSlot>,
    shared: Arc<Shared>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut qps = self
            .shared
            .qps
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        qps.remove(&self.slot.qpn);
    }
}

fn soft_mr<'a>(shared: &Shared, sge: &Sge<'a>) -> Option<&'a SoftMrHandle> {
    let h = sge.mr.backend().as_any().downcast_ref::<SoftMrHandle>()?;
    Arc::ptr_eq(&h.table, &shared.mrs).then_some(h)
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.slot.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.slot.core).engine.state()
    }

    fn local_endpoint(&self) -> QpEndpoint {
        let addr = self.shared.advertised;
        QpEndpoint {
            gid: gid_from_ip(canonical_ip(addr.ip())),
            qpn: self.slot.qpn,
            psn: self.slot.sq_psn,
            mtu: self.slot.max_mtu.bytes(),
            udp_addr: Some(addr),
        }
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        let qpn = self.slot.qpn;
        let invalid = |detail: String| ConnectError::InvalidEndpoint { qpn, detail };
        if remote.qpn > QPN_MASK {
            return Err(invalid(format!("QPN {:#x} exceeds 24 bits", remote.qpn)));
        }
        if remote.psn > PSN_MASK {
            return Err(invalid(format!("PSN {:#x} exceeds 24 bits", remote.psn)));
        }
        let remote_mtu = Mtu::from_bytes(remote.mtu)
            .ok_or_else(|| invalid(format!("MTU {} is not an IB MTU", remote.mtu)))?;
        let path_mtu = remote_mtu.min(self.slot.max_mtu);
        let dest = remote.destination();
        if dest.ip().is_unspecified() || dest.port() == 0 {
            return Err(invalid(format!("destination {dest} is not routable")));
        }
        let (src, src_override) =
            self.shared
                .source_for(dest)
                .map_err(|e| ConnectError::Modify {
                    qpn,
                    target: QpState::Rtr,
                    detail: format!("no source address towards {dest}: {e}"),
                })?;
        let mut core = lock(&self.slot.core);
        let state = core.engine.state();
        if state != QpState::Init {
            return Err(ConnectError::InvalidState { qpn, state });
        }
        let modify = |target: QpState, e: crate::soft::engine::ModifyError| ConnectError::Modify {
            qpn,
            target,
            detail: e.to_string(),
        };
        core.engine
            .modify_to_rtr(RtrAttr {
                dest_qpn: remote.qpn,
                rq_psn: remote.psn,
                path_mtu,
            })
            .map_err(|e| modify(QpState::Rtr, e))?;
        core.engine
            .modify_to_rts(self.slot.sq_psn)
            .map_err(|e| modify(QpState::Rts, e))?;
        core.remote = Some(dest);
        core.src = src;
        core.src_override = src_override;
        drop(core);
        self.shared.tx_hint.store(true, Ordering::Release);
        Ok(())
    }

    fn modify_to_error(&self) {
        {
            let mut core = lock(&self.slot.core);
            core.engine.modify_to_error();
            core.engine.flush(
                &mut CqSink(&self.slot.send_cq),
                &mut CqSink(&self.slot.recv_cq),
            );
        }
        self.shared.flush_hint.store(true, Ordering::Release);
        self.shared.note_cq_overflow(&self.slot);
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        let qpn = self.slot.qpn;
        let fail = |posted: usize, kind: PostSendErrorKind| PostSendError { qpn, posted, kind };
        let result = (|| {
            let mut core = lock(&self.slot.core);
            for (i, wr) in wrs.iter().enumerate() {
                let sge = match &wr.sge {
                    None => None,
                    Some(s) => {
                        let lkey = s.mr.lkey();
                        let Some(h) = soft_mr(&self.shared, s) else {
                            return Err(fail(i, PostSendErrorKind::ForeignMr { lkey }));
                        };
                        if !s.in_bounds() {
                            return Err(fail(
                                i,
                                PostSendErrorKind::SgeOutOfBounds {
                                    lkey,
                                    offset: s.offset,
                                    length: s.length,
                                    mr_len: h.mr.len(),
                                },
                            ));
                        }
                        Some(LocalSge {
                            lkey: h.mr.key(),
                            offset: s.offset,
                            length: s.length,
                        })
                    }
                };
                let length = wr.length();
                if length > SOFT_MAX_MSG_SIZE {
                    return Err(fail(
                        i,
                        PostSendErrorKind::MessageTooLong {
                            length,
                            max: SOFT_MAX_MSG_SIZE,
                        },
                    ));
                }
                let wqe = SendWqe {
                    wr_id: wr.wr_id,
                    opcode: wr.opcode,
                    sge,
                    signaled: wr.signaled,
                };
                core.engine.post_send(wqe).map_err(|r| {
                    fail(
                        i,
                        match r {
                            PostRefusal::State(state) => PostSendErrorKind::InvalidState { state },
                            PostRefusal::Full(depth) => PostSendErrorKind::Full { depth },
                            PostRefusal::TooLong(length) => PostSendErrorKind::MessageTooLong {
                                length,
                                max: SOFT_MAX_MSG_SIZE,
                            },
                        },
                    )
                })?;
            }
            Ok(())
        })();
        // The WRs are in the send queue (the lock is released): the next scan must see them.
        self.shared.tx_hint.store(true, Ordering::Release);
        self.shared.flush_hint.store(true, Ordering::Release);
        // Send what was posted, also when a later WR of the list was refused.
        self.shared.kick_tx();
        result
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        let qpn = self.slot.qpn;
        let fail = |posted: usize, kind: PostRecvErrorKind| PostRecvError { qpn, posted, kind };
        let mut core = lock(&self.slot.core);
        let result = (|| {
            for (i, wr) in wrs.iter().enumerate() {
                let sge = match &wr.sge {
                    None => None,
                    Some(s) => {
                        let lkey = s.mr.lkey();
                        let Some(h) = soft_mr(&self.shared, s) else {
                            return Err(fail(i, PostRecvErrorKind::ForeignMr { lkey }));
                        };
                        if !h.mr.access().contains(AccessFlags::LOCAL_WRITE) {
                            return Err(fail(i, PostRecvErrorKind::NoLocalWrite { lkey }));
                        }
                        if !s.in_bounds() {
                            return Err(fail(
                                i,
                                PostRecvErrorKind::SgeOutOfBounds {
                                    lkey,
                                    offset: s.offset,
                                    length: s.length,
                                    mr_len: h.mr.len(),
                                },
                            ));
                        }
                        Some(LocalSge {
                            lkey: h.mr.key(),
                            offset: s.offset,
                            length: s.length,
                        })
                    }
                };
                core.engine
                    .post_recv(RecvWqe {
                        wr_id: wr.wr_id,
                        sge,
                    })
                    .map_err(|r| {
                        fail(
                            i,
                            match r {
                                RecvRefusal::Full(depth) => PostRecvErrorKind::Full { depth },
                                RecvRefusal::State(state) => {
                                    PostRecvErrorKind::InvalidState { state }
                                }
                            },
                        )
                    })?;
            }
            Ok(())
        })();
        if core.engine.needs_flush() {
            core.engine.flush(
                &mut CqSink(&self.slot.send_cq),
                &mut CqSink(&self.slot.recv_cq),
            );
            if core.engine.needs_flush() {
                self.shared.flush_hint.store(true, Ordering::Release);
            }
        }
        drop(core);
        self.shared.note_cq_overflow(&self.slot);
        result
    }

    fn stats(&self) -> QpStats {
        lock(&self.slot.core).engine.stats()
    }
}

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

/// Link, transmit queue and buffers; one lock, held while talking to the link.
struct LinkState {
    link: Box<dyn Link>,
    tx: Vec<Datagram>,
    rx: Vec<Datagram>,
    spare: Vec<Vec<u8>>,
    /// `link.recv_discarded()` already counted as `malformed`.
    discarded: u64,
}

impl fmt::Debug for LinkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkState")
            .field("local_addr", &self.link.local_addr())
            .field("tx", &self.tx.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Counters {
    packets_received: AtomicU64,
    packets_sent: AtomicU64,
    link_errors: AtomicU64,
    drops: Mutex<DropCounters>,
}

#[derive(Debug)]
struct Shared {
    name: String,
    mtu: Mtu,
    batch: usize,
    busy_poll: bool,
    wait: Duration,
    local: SocketAddr,
    advertised: SocketAddr,
    mrs: Arc<MrTable>,
    qps: RwLock<HashMap<u32, Arc<QpSlot>>>,
    next_qpn: Mutex<u32>,
    next_cq: AtomicU32,
    /// Some QP may have send WRs to packetise: set after every `post_send` and `connect`
    /// and when a transmit scan stopped at a full batch; cleared by the scan. Lets a
    /// receive-only device (the collector) skip the scan of every QP in each round.
    tx_hint: AtomicBool,
    /// Some QP may be in ERROR with WRs left to flush (a flush stopped at a full CQ, or a
    /// send or post outside the receive path failed it); cleared by [`Shared::flush_failed`].
    flush_hint: AtomicBool,
    link: Mutex<LinkState>,
    /// A duplicate of the link's [`Link::wait_fd`], to sleep on without holding `link`.
    link_fd: Option<Arc<OwnedFd>>,
    /// Wakes the progress thread (thread mode only).
    wake: Option<Arc<WakeFd>>,
    counters: Counters,
    events: Mutex<VecDeque<AsyncEvent>>,
    fault_stats: Mutex<Option<Arc<FaultStats>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The progress thread may be asleep: it wakes, finds the device gone and stops.
        self.wake_thread();
    }
}

/// What an idle round of the device waits for (see [`Shared::idle_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IdleWait {
    /// There is work now: another round.
    Now,
    /// Sleep on the link's descriptor and the wake eventfd, until `until` at the latest.
    Sleep { until: Option<Instant> },
    /// The link cannot be slept on from outside: wait in its `recv` for `wait`.
    InLink,
}

/// Outcome of one [`SoftDevice::progress`] round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressReport {
    /// Datagrams handed to the link.
    pub sent: usize,
    /// Datagrams received and processed.
    pub received: usize,
    /// Whether another thread held the link, so this round did nothing.
    pub busy: bool,
}

impl Shared {
    fn count_device_drop(&self, reason: UcDropReason) {
        lock(&self.counters.drops).inc(reason);
    }

    fn push_event(&self, ev: AsyncEvent) {
        let mut q = lock(&self.events);
        if q.len() < MAX_EVENTS {
            q.push_back(ev);
        }
        tracing::warn!(device = %self.name, event = ?ev, "soft RDMA async event");
    }

    /// Raises events for a QP that failed or overflowed a CQ since the last check.
    fn note_events(&self, slot: &QpSlot, core: &mut QpCore) {
        if let Some(cause) = core.engine.take_error_event() {
            self.push_event(AsyncEvent::QpFatal {
                qpn: slot.qpn,
                cause,
            });
        }
        if core.engine.take_cq_overflow() {
            self.note_cq_overflow(slot);
        }
    }

    fn note_cq_overflow(&self, slot: &QpSlot) {
        for cq in [&slot.send_cq, &slot.recv_cq] {
            if cq.overflowed.swap(false, Ordering::Relaxed) {
                self.push_event(AsyncEvent::CqError { cq: cq.handle });
            }
        }
    }

    /// The source address packets to `dest` leave from, and the explicit source to give the
    /// link when it is bound to a wildcard address.
    fn source_for(&self, dest: SocketAddr) -> io::Result<(SocketAddr, Option<SocketAddr>)> {
        if !self.local.ip().is_unspecified() {
            return Ok((self.local, None));
        }
        let dest = match (dest, self.local) {
            (SocketAddr::V4(v4), SocketAddr::V6(_)) => {
                SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            (d, _) => d,
        };
        let probe = UdpSocket::bind(SocketAddr::new(self.local.ip(), 0))?;
        probe.connect(dest)?;
        let src = SocketAddr::new(probe.local_addr()?.ip(), self.local.port());
        Ok((src, Some(src)))
    }

    fn create_qp(self: &Arc<Self>, attr: &QpInitAttr<'_>) -> Result<Arc<SoftQp>, CreateQpError> {
        for (queue, depth) in [
            ("send queue", attr.max_send_wr),
            ("receive queue", attr.max_recv_wr),
        ] {
            if depth == 0 || depth > MAX_QP_WR {
                return Err(CreateQpError::InvalidDepth {
                    queue,
                    depth,
                    max: MAX_QP_WR,
                });
            }
        }
        let cq_of = |cq: &crate::api::CompletionQueue, which: &'static str| {
            cq.backend()
                .as_any()
                .downcast_ref::<SoftCq>()
                .filter(|c| std::ptr::eq(c.device.as_ptr(), Arc::as_ptr(self)))
                .map(|c| Arc::clone(&c.inner))
                .ok_or(CreateQpError::ForeignCq { which })
        };
        let send_cq = cq_of(attr.send_cq, "send")?;
        let recv_cq = cq_of(attr.recv_cq, "recv")?;
        let max_mtu = attr.max_mtu.map_or(self.mtu, |m| m.min(self.mtu));
        let mut qps = self.qps.write().unwrap_or_else(PoisonError::into_inner);
        let qpn = {
            let mut next = lock(&self.next_qpn);
            let mut found = None;
            for _ in 0..=QPN_MASK {
                let candidate = *next;
                *next = if candidate >= QPN_MASK {
                    0x11
                } else {
                    candidate + 1
                };
                if !qps.contains_key(&candidate) {
                    found = Some(candidate);
                    break;
                }
            }
            found.ok_or(CreateQpError::NoQpn)?
        };
        let mut engine = UcQp::new(UcQpConfig {
            qpn,
            max_send_wr: attr.max_send_wr,
            max_recv_wr: attr.max_recv_wr,
        });
        engine
            .modify_to_init(attr.access)
            .map_err(|e| CreateQpError::Device {
                detail: e.to_string(),
            })?;
        let slot = Arc::new(QpSlot {
            qpn,
            sq_psn: rand::random::<u32>() & PSN_MASK,
            max_mtu,
            core: Mutex::new(QpCore {
                engine,
                remote: None,
                src: self.local,
                src_override: None,
            }),
            send_cq,
            recv_cq,
        });
        qps.insert(qpn, Arc::clone(&slot));
        Ok(Arc::new(SoftQp {
            slot,
            shared: Arc::clone(self),
        }))
    }

    fn snapshot_qps(&self) -> Vec<Arc<QpSlot>> {
        self.qps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Pulls packets from every QP with pending send WRs into `ls.tx`, up to one batch.
    fn pull_packets(&self, ls: &mut LinkState) {
        if !self.tx_hint.swap(false, Ordering::AcqRel) {
            return;
        }
        let slots = self.snapshot_qps();
        let mut progressed = true;
        while progressed && ls.tx.len() < self.batch {
            progressed = false;
            for slot in &slots {
                if ls.tx.len() >= self.batch {
                    break;
                }
                let mut core = lock(&slot.core);
                let Some(remote) = core.remote else { continue };
                let mut burst = 0;
                while burst < PER_QP_BURST
                    && ls.tx.len() < self.batch
                    && core.engine.wants_transmit()
                {
                    let mut buf = ls.spare.pop().unwrap_or_default();
                    let pulled = core.engine.poll_transmit(
                        self.mrs.as_ref(),
                        &mut buf,
                        &mut CqSink(&slot.send_cq),
                    );
                    if pulled.is_none() {
                        ls.spare.push(buf);
                        break;
                    }
                    if let Err(e) = icrc::seal(&mut buf, core.src, remote) {
                        // Only a family mismatch between source and destination can fail
                        // here; the packet could not be delivered anyway.
                        tracing::warn!(qpn = slot.qpn, error = %e, "cannot seal packet");
                        ls.spare.push(buf);
                        continue;
                    }
                    ls.tx.push(Datagram {
                        peer: remote,
                        local: core.src_override,
                        payload: buf,
                    });
                    burst += 1;
                    progressed = true;
                }
                if core.engine.needs_flush() {
                    self.flush_hint.store(true, Ordering::Release);
                }
                self.note_events(slot, &mut core);
            }
        }
        if ls.tx.len() >= self.batch {
            // Stopped at a full batch: some QP may have more to send.
            self.tx_hint.store(true, Ordering::Release);
        }
    }

    /// Sends queued packets and pulls more until the link would block or nothing is left.
    fn pump_tx(&self, ls: &mut LinkState) -> usize {
        let mut sent = 0;
        loop {
            if ls.tx.len() < self.batch {
                self.pull_packets(ls);
            }
            if ls.tx.is_empty() {
                return sent;
            }
            match ls.link.send(&ls.tx) {
                Ok(n) => {
                    let n = n.min(ls.tx.len());
                    sent += n;
                    self.counters
                        .packets_sent
                        .fetch_add(n as u64, Ordering::Relaxed);
                    for d in ls.tx.drain(..n) {
                        let mut p = d.payload;
                        p.clear();
                        ls.spare.push(p);
                    }
                    if !ls.tx.is_empty() {
                        // The link would block; keep the rest for the next round.
                        return sent;
                    }
                }
                Err(e) => {
                    self.counters.link_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = %self.name, error = %e, "link send failed");
                    return sent;
                }
            }
        }
    }

    /// Tries to send right away; if another thread holds the link it will send (the
    /// progress thread is woken for it, and to retry what the socket refused).
    fn kick_tx(&self) {
        match self.link.try_lock() {
            Ok(mut ls) => {
                self.pump_tx(&mut ls);
                if !ls.tx.is_empty() {
                    self.wake_thread();
                }
            }
            Err(_) => self.wake_thread(),
        }
    }

    /// Wakes the progress thread if it sleeps (thread mode; a no-op in busy-poll mode).
    fn wake_thread(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
    }

    /// What to wait for after a round that moved nothing: another round when work is
    /// pending, a sleep on the link (bounded while the socket refuses packets or a flush
    /// waits for room in a CQ), or a wait inside the link's `recv`.
    fn idle_wait(&self) -> IdleWait {
        let Ok(ls) = self.link.try_lock() else {
            // Another thread is using the link (a post sending): look again after it.
            return IdleWait::Now;
        };
        let readiness = match self.link_fd {
            Some(_) => ls.link.readiness(),
            None => Readiness::Opaque,
        };
        let retry = !ls.tx.is_empty() || self.flush_hint.load(Ordering::Acquire);
        if !retry && self.tx_hint.load(Ordering::Acquire) {
            return IdleWait::Now;
        }
        match readiness {
            Readiness::Now => IdleWait::Now,
            Readiness::Opaque => IdleWait::InLink,
            Readiness::Idle { until } if retry => {
                let soon = deadline_after(self.wait);
                IdleWait::Sleep {
                    until: match (until, soon) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                }
            }
            Readiness::Idle { until } => IdleWait::Sleep { until },
        }
    }

    /// Busy-poll mode: drives the device until `wake` is signalled (an armed CQ got a
    /// completion, or someone called `wake`) or `deadline` passes, sleeping on the link while
    /// nothing arrives. Returns whether it was woken.
    fn drive_until(&self, wake: &WakeFd, deadline: Option<Instant>) -> io::Result<bool> {
        loop {
            if wake.take() {
                return Ok(true);
            }
            let errors = self.counters.link_errors.load(Ordering::Relaxed);
            let report = self.progress(Some(Duration::ZERO), true);
            if wake.take() {
                return Ok(true);
            }
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            if expired {
                return Ok(false);
            }
            if report.received > 0 || report.sent > 0 {
                continue;
            }
            if self.counters.link_errors.load(Ordering::Relaxed) > errors {
                // Do not spin on a broken link.
                std::thread::sleep(self.wait);
                continue;
            }
            match self.idle_wait() {
                IdleWait::Now => {}
                IdleWait::InLink => {
                    let left = deadline.map_or(self.wait, |d| {
                        d.saturating_duration_since(Instant::now()).min(self.wait)
                    });
                    self.progress(Some(left), true);
                }
                IdleWait::Sleep { until } => {
                    let until = match (until, deadline) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let fd = self.link_fd.as_deref().map(AsFd::as_fd);
                    if sleep_until(wake, fd, until)?.wake {
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// One round: send, receive (waiting up to `wait`), process, flush failed QPs. With
    /// `block_on_link` the round waits for the link if another thread holds it (the progress
    /// thread); otherwise it returns at once with `busy` (poll_cq in busy-poll mode).
    fn progress(&self, wait: Option<Duration>, block_on_link: bool) -> ProgressReport {
        let mut report = ProgressReport::default();
        let mut rx = {
            let mut ls = match self.link.try_lock() {
                Ok(ls) => ls,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if block_on_link => lock(&self.link),
                Err(std::sync::TryLockError::WouldBlock) => {
                    report.busy = true;
                    return report;
                }
            };
            report.sent = self.pump_tx(&mut ls);
            let mut rx = std::mem::take(&mut ls.rx);
            let batch = self.batch;
            let received = ls.link.recv(&mut rx, batch, wait);
            // Datagrams the link discarded (longer than its buffer) are not RoCEv2 packets.
            let discarded = ls.link.recv_discarded();
            if discarded > ls.discarded {
                lock(&self.counters.drops).add(UcDropReason::Malformed, discarded - ls.discarded);
                ls.discarded = discarded;
            }
            if let Err(e) = received {
                self.counters.link_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(device = %self.name, error = %e, "link recv failed");
                drop(ls);
                // Do not spin on a broken link.
                if let Some(w) = wait.filter(|w| !w.is_zero()) {
                    std::thread::sleep(w);
                }
            }
            rx
        };
        report.received = rx.len();
        self.counters
            .packets_received
            .fetch_add(rx.len() as u64, Ordering::Relaxed);
        for d in &rx {
            self.receive(d);
        }
        self.flush_failed();
        if let Ok(mut ls) = self.link.try_lock() {
            // The payload buffers go back to the link for its next receive.
            for d in rx.drain(..) {
                ls.link.recycle(d.payload);
            }
            ls.rx = rx;
            report.sent += self.pump_tx(&mut ls);
        }
        report
    }

    fn flush_failed(&self) {
        if !self.flush_hint.swap(false, Ordering::AcqRel) {
            return;
        }
        for slot in self.snapshot_qps() {
            let mut core = lock(&slot.core);
            if core.engine.needs_flush() {
                core.engine
                    .flush(&mut CqSink(&slot.send_cq), &mut CqSink(&slot.recv_cq));
                if core.engine.needs_flush() {
                    // A CQ is full: try again next round.
                    self.flush_hint.store(true, Ordering::Release);
                }
                self.note_events(&slot, &mut core);
            }
        }
    }

    /// The receive path for one datagram (see the module docs).
    fn receive(&self, d: &Datagram) {
        let Ok(pkt) = PacketRepr::parse(&d.payload) else {
            self.count_device_drop(UcDropReason::Malformed);
            return;
        };
        let dst = d.local.unwrap_or(self.local);
        if icrc::verify(&d.payload, d.peer, dst).is_err() {
            self.count_device_drop(UcDropReason::BadIcrc);
            return;
        }
        let slot = {
            let qps = self.qps.read().unwrap_or_else(PoisonError::into_inner);
            qps.get(&pkt.bth.dest_qpn).cloned()
        };
        let Some(slot) = slot else {
            self.count_device_drop(UcDropReason::UnknownQpn);
            return;
        };
        let mut core = lock(&slot.core);
        if let Some(remote) = core.remote {
            if canonical_ip(remote.ip()) != canonical_ip(d.peer.ip()) {
                core.engine.count_drop(UcDropReason::AddressMismatch);
                return;
            }
        }
        core.engine
            .receive(&pkt, self.mrs.as_ref(), &mut CqSink(&slot.recv_cq));
        if core.engine.needs_flush() {
            core.engine
                .flush(&mut CqSink(&slot.send_cq), &mut CqSink(&slot.recv_cq));
            if core.engine.needs_flush() {
                self.flush_hint.store(true, Ordering::Release);
            }
        }
        self.note_events(&slot, &mut core);
    }
}

/// The soft RoCEv2 device. Cheap to clone; converts into [`Device`].
#[derive(Clone, Debug)]
pub struct SoftDevice {
    shared: Arc<Shared>,
}

impl SoftDevice {
    /// Binds the UDP socket of `config.udp` and starts the device.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for bad settings, [`OpenError::Io`] when the socket cannot
    /// be bound.
    pub fn open(config: &SoftConfig) -> Result<SoftDevice, OpenError> {
        config.validate()?;
        let udp = UdpConfig {
            batch: config.batch,
            ..config.udp.clone()
        };
        let link = UdpLink::bind(udp).map_err(|source| OpenError::Io {
            kind: TransportKind::Soft,
            name: format!("{} ({})", config.name, config.udp.bind),
            source,
        })?;
        match &config.faults {
            None => Self::with_link(config, Box::new(link)),
            Some(faults) => {
                let injector = FaultInjector::new(link, faults.clone()).map_err(|e| {
                    OpenError::InvalidConfig {
                        kind: TransportKind::Soft,
                        detail: format!("faults: {e}"),
                    }
                })?;
                let stats = injector.stats();
                let dev = Self::with_link(config, Box::new(injector))?;
                *lock(&dev.shared.fault_stats) = Some(stats);
                Ok(dev)
            }
        }
    }

    /// Counters of the fault injector [`SoftDevice::open`] installed for `config.faults`.
    pub fn fault_stats(&self) -> Option<Arc<FaultStats>> {
        lock(&self.shared.fault_stats).clone()
    }

    /// Starts a device over an existing link (a [`crate::soft::link::MemoryLink`] in tests, or
    /// any link wrapped in the fault injector). `config.udp` is ignored.
    ///
    /// # Errors
    /// [`OpenError::InvalidConfig`] for bad settings, [`OpenError::Io`] when the progress
    /// thread cannot be spawned.
    pub fn with_link(config: &SoftConfig, link: Box<dyn Link>) -> Result<SoftDevice, OpenError> {
        let mtu = config.validate()?;
        let local = link.local_addr();
        let advertised = config.advertise_addr.unwrap_or(local);
        let io_error = |source: io::Error| OpenError::Io {
            kind: TransportKind::Soft,
            name: config.name.clone(),
            source,
        };
        let link_fd = link
            .wait_fd()
            .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0))
            .transpose()
            .map_err(|e| io_error(e.into()))?
            .map(Arc::new);
        let thread = config.progress == ProgressMode::Thread;
        let wake = if thread {
            Some(Arc::new(WakeFd::new().map_err(io_error)?))
        } else {
            None
        };
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            mtu,
            batch: config.batch,
            busy_poll: config.progress == ProgressMode::BusyPoll,
            wait: Duration::from_micros(config.progress_wait_micros),
            local,
            advertised,
            mrs: Arc::new(MrTable::new()),
            qps: RwLock::new(HashMap::new()),
            next_qpn: Mutex::new(0x11),
            next_cq: AtomicU32::new(1),
            tx_hint: AtomicBool::new(true),
            flush_hint: AtomicBool::new(true),
            link: Mutex::new(LinkState {
                link,
                tx: Vec::with_capacity(config.batch),
                rx: Vec::with_capacity(config.batch),
                spare: Vec::new(),
                discarded: 0,
            }),
            link_fd: link_fd.clone(),
            wake: wake.clone(),
            counters: Counters::default(),
            events: Mutex::new(VecDeque::new()),
            fault_stats: Mutex::new(None),
        });
        if let (true, Some(wake)) = (thread, wake) {
            let weak = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name(format!("uctel-{}", config.name))
                .spawn({
                    let name = config.name.clone();
                    move || progress_thread(&weak, &wake, link_fd.as_deref(), &name)
                })
                .map_err(io_error)?;
        }
        Ok(SoftDevice { shared })
    }

    /// Drives the device once without blocking: sends queued packets, receives one batch and
    /// processes it, flushes QPs in ERROR. Busy-poll mode calls this from every `poll_cq`;
    /// tests call it directly.
    pub fn progress(&self) -> ProgressReport {
        self.shared.progress(Some(Duration::ZERO), true)
    }

    /// As [`SoftDevice::progress`], but waits up to `wait` for datagrams.
    pub fn progress_wait(&self, wait: Duration) -> ProgressReport {
        self.shared.progress(Some(wait), true)
    }

    /// The link's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Datagrams waiting in the device's transmit queue (taken from QPs, refused by the link).
    pub fn tx_backlog(&self) -> usize {
        lock(&self.shared.link).tx.len()
    }

    /// Link errors (failed `send`/`recv` calls) so far.
    pub fn link_errors(&self) -> u64 {
        self.shared.counters.link_errors.load(Ordering::Relaxed)
    }
}

/// The NIC of a thread-mode device: rounds while they move packets, then a sleep until the
/// link or a post needs it (see the module docs). Holds the device only during a round.
fn progress_thread(weak: &Weak<Shared>, wake: &WakeFd, link_fd: Option<&OwnedFd>, name: &str) {
    while let Some(shared) = weak.upgrade() {
        let errors = shared.counters.link_errors.load(Ordering::Relaxed);
        let report = shared.progress(Some(Duration::ZERO), true);
        if report.received > 0 || report.sent > 0 {
            continue;
        }
        let wait = shared.wait;
        if shared.counters.link_errors.load(Ordering::Relaxed) > errors {
            // Do not spin on a broken link.
            drop(shared);
            std::thread::sleep(wait);
            continue;
        }
        match shared.idle_wait() {
            IdleWait::Now => {}
            IdleWait::InLink => {
                shared.progress(Some(wait), true);
            }
            IdleWait::Sleep { until } => {
                drop(shared);
                if let Err(e) = sleep_until(wake, link_fd.map(AsFd::as_fd), until) {
                    tracing::debug!(device = name, error = %e, "poll failed");
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

impl From<SoftDevice> for Device {
    fn from(d: SoftDevice) -> Device {
        Device::from_backend(Arc::new(d))
    }
}

impl DeviceOps for SoftDevice {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Soft
    }

    fn port_attr(&self) -> PortAttr {
        PortAttr {
            gid: gid_from_ip(canonical_ip(self.shared.advertised.ip())),
            active_mtu: self.shared.mtu.bytes(),
            max_msg_size: SOFT_MAX_MSG_SIZE,
            udp_addr: Some(self.shared.advertised),
        }
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError> {
        Ok(Arc::new(SoftPd {
            shared: Arc::clone(&self.shared),
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError> {
        if depth == 0 || depth > MAX_CQ_DEPTH {
            return Err(CreateCqError::InvalidDepth {
                depth,
                max: MAX_CQ_DEPTH,
            });
        }
        let handle = self.shared.next_cq.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(SoftCq {
            inner: Arc::new(CqInner::new(handle, depth as usize)),
            device: Arc::downgrade(&self.shared),
            busy_poll: self.shared.busy_poll,
        }))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError> {
        let wake = WakeFd::new().map_err(|e| CompChannelError::Device {
            what: "eventfd",
            detail: e.to_string(),
        })?;
        Ok(Arc::new(SoftCompChannel {
            wake: Arc::new(wake),
            device: Arc::downgrade(&self.shared),
        }))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        lock(&self.shared.events).pop_front()
    }

    fn stats(&self) -> DeviceStats {
        let c = &self.shared.counters;
        DeviceStats {
            packets_received: c.packets_received.load(Ordering::Relaxed),
            packets_sent: c.packets_sent.load(Ordering::Relaxed),
            drops: *lock(&c.drops),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_deserializes_strictly_with_defaults() {
        let cfg: SoftConfig = serde_json::from_str(
            r#"{"udp": {"bind": "127.0.0.1:4791"}, "progress": "busy_poll", "mtu_bytes": 4096,
                "faults": {"drop_ratio": 0.01, "seed": 7}}"#,
        )
        .expect("valid config");
        assert_eq!(cfg.progress, ProgressMode::BusyPoll);
        assert_eq!(cfg.mtu_bytes, 4096);
        assert_eq!(cfg.name, "soft0");
        assert_eq!(cfg.faults.as_ref().map(|f| f.seed), Some(7));
        assert_eq!(cfg.validate().ok(), Some(Mtu::Mtu4096));
        assert!(
            serde_json::from_str::<SoftConfig>(r#"{"mtu": 1024}"#).is_err(),
            "unknown key"
        );
    }

    #[test]
    fn invalid_settings_are_reported() {
        for cfg in [
            SoftConfig {
                mtu_bytes: 1500,
                ..SoftConfig::default()
            },
            SoftConfig {
                batch: 0,
                ..SoftConfig::default()
            },
            SoftConfig {
                progress_wait_micros: 0,
                ..SoftConfig::default()
            },
            SoftConfig {
                faults: Some(FaultConfig {
                    drop_ratio: 2.0,
                    ..FaultConfig::default()
                }),
                ..SoftConfig::default()
            },
        ] {
            assert!(
                matches!(cfg.validate(), Err(OpenError::InvalidConfig { .. })),
                "{cfg:?}"
            );
        }
    }

    #[test]
    fn datagrams_longer_than_the_receive_buffer_count_as_malformed() {
        let config = SoftConfig {
            udp: UdpConfig::bound_to("127.0.0.1:0".parse().expect("addr")),
            progress: ProgressMode::BusyPoll,
            ..SoftConfig::default()
        };
        let dev = SoftDevice::open(&config).expect("open");
        let target = dev.local_addr();
        let peer = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let max = config.udp.max_datagram_bytes;
        for len in [max + 1, 20_000, 65_000] {
            peer.send_to(&vec![0x24; len], target).expect("send");
        }
        peer.send_to(&[0xff; 8], target).expect("send");
        let device = Device::from(dev.clone());
        let mut malformed = 0;
        for _ in 0..2000 {
            dev.progress_wait(Duration::from_millis(5));
            malformed = device.stats().drops.get(UcDropReason::Malformed);
            if malformed >= 4 {
                break;
            }
        }
        assert_eq!(malformed, 4);
    }

    #[test]
    fn device_handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SoftDevice>();
        check::<crate::api::Device>();
        check::<crate::api::QueuePair>();
        check::<crate::api::CompletionQueue>();
        check::<crate::api::MemoryRegion>();
    }
}
