//! The state every handle of one soft device shares ([`Shared`]): the link, the QPs by number
//! ([`QpSlot`]: the engine plus the device's routing of it), the CQs' storage ([`CqInner`]),
//! counters and asynchronous events. The rounds that move packets are in `progress.rs`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::api::{AsyncEvent, DropCounters, Mtu, UcDropReason, WorkCompletion};
use crate::soft::engine::{CompletionSink, CqFull};
use crate::soft::fault::FaultStats;
use crate::soft::link::{Datagram, Link};
use crate::soft::memory::MrTable;
use crate::sync::lock;
use crate::wake::WakeFd;

use super::service::QpEngine;

/// Most asynchronous events kept; later ones are discarded until the queue is read.
pub(super) const MAX_EVENTS: usize = 4096;

/// An IPv4-mapped IPv6 address as IPv4.
pub(super) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[derive(Debug)]
pub(super) struct CqInner {
    pub(super) handle: u32,
    pub(super) depth: usize,
    pub(super) wcs: Mutex<VecDeque<WorkCompletion>>,
    pub(super) overflowed: AtomicBool,
    /// Armed by [`CompletionChannel::req_notify`](crate::api::CompletionChannel::req_notify):
    /// the next completion signals `channel` and disarms.
    pub(super) armed: AtomicBool,
    /// The eventfd of the completion channel this CQ was last armed on.
    pub(super) channel: Mutex<Option<Arc<WakeFd>>>,
}

impl CqInner {
    pub(super) fn new(handle: u32, depth: usize) -> CqInner {
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
    pub(super) fn notify(&self) {
        if self.armed.load(Ordering::Acquire) && self.armed.swap(false, Ordering::AcqRel) {
            if let Some(ch) = lock(&self.channel).as_ref() {
                ch.wake();
            }
        }
    }
}

/// A [`CompletionSink`] over a shared CQ (locks per completion, so a QP whose send and
/// receive CQ are the same CQ never holds it twice).
pub(super) struct CqSink<'a>(pub(super) &'a CqInner);

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

#[derive(Debug)]
pub(super) struct QpCore {
    pub(super) engine: QpEngine,
    /// Where packets go (the peer's UDP address), from RTR.
    pub(super) remote: Option<SocketAddr>,
    /// Source address for sending and for the ICRC pseudo header.
    pub(super) src: SocketAddr,
    /// Explicit source for the link (`Datagram::local`) when bound to a wildcard address.
    pub(super) src_override: Option<SocketAddr>,
}

#[derive(Debug)]
pub(super) struct QpSlot {
    pub(super) qpn: u32,
    pub(super) sq_psn: u32,
    pub(super) max_mtu: Mtu,
    pub(super) core: Mutex<QpCore>,
    pub(super) send_cq: Arc<CqInner>,
    pub(super) recv_cq: Arc<CqInner>,
    /// Listed in [`Shared::changed`] and not yet taken.
    pub(super) changed: AtomicBool,
}

/// Most QP numbers [`ChangedQps`] lists; beyond it the list gives way to "every QP" (a
/// device whose changes nobody takes stays bounded).
pub(super) const MAX_CHANGED: usize = 1 << 16;

/// The QPs whose counters or state may have changed since [`crate::api::Device::take_changed_qps`]
/// was last called: the ready list of QP statistics.
#[derive(Debug, Default)]
pub(super) struct ChangedQps {
    pub(super) qpns: Vec<u32>,
    /// More than [`MAX_CHANGED`] were marked: the next take names every QP.
    pub(super) overflowed: bool,
}

/// Link, transmit queue and buffers; one lock, held while talking to the link.
pub(super) struct LinkState {
    pub(super) link: Box<dyn Link>,
    pub(super) tx: Vec<Datagram>,
    pub(super) spare: Vec<Vec<u8>>,
    /// `link.recv_discarded()` already counted as `malformed`.
    pub(super) discarded: u64,
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
pub(super) struct Counters {
    pub(super) packets_received: AtomicU64,
    pub(super) packets_sent: AtomicU64,
    /// [`crate::soft::link::Link::send`] calls that handed over at least one datagram.
    pub(super) link_sends: AtomicU64,
    pub(super) link_errors: AtomicU64,
    pub(super) drops: Mutex<DropCounters>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) mtu: Mtu,
    pub(super) batch: usize,
    /// No progress thread (`busy_poll` or `driven`): `post_send` sends at once and a
    /// completion channel's `wait` drives the device.
    pub(super) busy_poll: bool,
    /// `driven`: [`crate::api::Device::drive`] runs a round; `poll_cq` does not.
    pub(super) driven: bool,
    pub(super) wait: Duration,
    pub(super) local: SocketAddr,
    pub(super) advertised: SocketAddr,
    pub(super) mrs: Arc<MrTable>,
    pub(super) qps: RwLock<HashMap<u32, Arc<QpSlot>>>,
    /// The RC QPs of `qps` (the ones with timers), so that a round runs their timers without
    /// visiting every UC QP.
    pub(super) rc_qps: RwLock<HashMap<u32, Arc<QpSlot>>>,
    pub(super) next_qpn: Mutex<u32>,
    pub(super) next_cq: AtomicU32,
    /// Some QP may have send WRs to packetise: set after every `post_send` and `connect`
    /// and when a transmit scan stopped at a full batch; cleared by the scan. Lets a
    /// receive-only device (the collector) skip the scan of every QP in each round.
    pub(super) tx_hint: AtomicBool,
    /// Some QP may be in ERROR with WRs left to flush (a flush stopped at a full CQ, or a
    /// send or post outside the receive path failed it); cleared by [`Shared::flush_failed`].
    pub(super) flush_hint: AtomicBool,
    pub(super) link: Mutex<LinkState>,
    /// A duplicate of the link's [`Link::wait_fd`], to sleep on without holding `link`.
    pub(super) link_fd: Option<Arc<OwnedFd>>,
    /// Wakes the progress thread (thread mode only).
    pub(super) wake: Option<Arc<WakeFd>>,
    pub(super) counters: Counters,
    pub(super) events: Mutex<VecDeque<AsyncEvent>>,
    pub(super) fault_stats: Mutex<Option<Arc<FaultStats>>>,
    /// The UDP socket's granted receive buffer ([`crate::api::PortAttr::recv_buffer_bytes`]).
    pub(super) recv_buffer_bytes: Mutex<Option<usize>>,
    /// Origin of [`Shared::planned_wake`].
    pub(super) timer_epoch: Instant,
    /// When the progress thread's sleep ends at the latest, nanoseconds after `timer_epoch`:
    /// `u64::MAX` asleep without a deadline, 0 awake. A post that arms an RC timer earlier
    /// than this wakes the thread, which then sleeps no longer than the timer.
    pub(super) planned_wake: AtomicU64,
    /// QPs whose counters or state may have changed (see [`Shared::mark_changed`]).
    pub(super) changed: Mutex<ChangedQps>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The progress thread may be asleep: it wakes, finds the device gone and stops.
        self.wake_thread();
    }
}

impl Shared {
    /// Lists `slot` in [`Shared::changed`] (once until taken): a drop was counted on it, it
    /// moved to ERROR, or (RC) its counters moved.
    pub(super) fn mark_changed(&self, slot: &QpSlot) {
        if slot.changed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut c = lock(&self.changed);
        if c.overflowed {
            return;
        }
        if c.qpns.len() >= MAX_CHANGED {
            c.overflowed = true;
            c.qpns = Vec::new();
        } else {
            c.qpns.push(slot.qpn);
        }
    }

    /// Appends to `out` the QPs listed in [`Shared::changed`] (every QP after an overflow)
    /// and clears their marks (before the caller reads them: a change after this is listed
    /// again).
    pub(super) fn take_changed(&self, out: &mut Vec<u32>) {
        let taken = std::mem::take(&mut *lock(&self.changed));
        let qps = self.qps.read().unwrap_or_else(PoisonError::into_inner);
        if taken.overflowed {
            for (qpn, slot) in qps.iter() {
                slot.changed.store(false, Ordering::Release);
                out.push(*qpn);
            }
            return;
        }
        for qpn in taken.qpns {
            if let Some(slot) = qps.get(&qpn) {
                slot.changed.store(false, Ordering::Release);
            }
            out.push(qpn);
        }
    }

    pub(super) fn count_device_drop(&self, reason: UcDropReason) {
        lock(&self.counters.drops).inc(reason);
    }

    pub(super) fn push_event(&self, ev: AsyncEvent) {
        let mut q = lock(&self.events);
        if q.len() < MAX_EVENTS {
            q.push_back(ev);
        }
        tracing::warn!(device = %self.name, event = ?ev, "soft RDMA async event");
    }

    /// Raises events for a QP that failed or overflowed a CQ since the last check.
    pub(super) fn note_events(&self, slot: &QpSlot, core: &mut QpCore) {
        if let Some(cause) = core.engine.take_error_event() {
            self.mark_changed(slot);
            self.push_event(AsyncEvent::QpFatal {
                qpn: slot.qpn,
                cause,
            });
        }
        if core.engine.take_cq_overflow() {
            self.note_cq_overflow(slot);
        }
    }

    /// Flushes a QP in ERROR into its CQs now; when a CQ is full, leaves the rest for a later
    /// round (`flush_hint`).
    pub(super) fn flush_now(&self, slot: &QpSlot, core: &mut QpCore) {
        if core.engine.needs_flush() {
            core.engine
                .flush(&mut CqSink(&slot.send_cq), &mut CqSink(&slot.recv_cq));
            if core.engine.needs_flush() {
                self.flush_hint.store(true, Ordering::Release);
            }
        }
    }

    pub(super) fn note_cq_overflow(&self, slot: &QpSlot) {
        for cq in [&slot.send_cq, &slot.recv_cq] {
            if cq.overflowed.swap(false, Ordering::Relaxed) {
                self.push_event(AsyncEvent::CqError { cq: cq.handle });
            }
        }
    }

    /// The source address packets to `dest` leave from, and the explicit source to give the
    /// link when it is bound to a wildcard address.
    pub(super) fn source_for(
        &self,
        dest: SocketAddr,
    ) -> io::Result<(SocketAddr, Option<SocketAddr>)> {
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

    pub(super) fn snapshot_qps(&self) -> Vec<Arc<QpSlot>> {
        self.qps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Nanoseconds from `timer_epoch` to `t` (0 before it).
    pub(super) fn timer_nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.timer_epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// An RC timer now runs until `t`: wakes the progress thread if it sleeps past it.
    pub(super) fn note_timer(&self, t: Instant) {
        let at = self.timer_nanos(t).max(1);
        if at < self.planned_wake.load(Ordering::Acquire) {
            self.planned_wake.store(0, Ordering::Release);
            self.wake_thread();
        }
    }

    /// Wakes the progress thread if it sleeps (thread mode; a no-op in busy-poll mode).
    pub(super) fn wake_thread(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
    }
}
