//! How a soft device makes progress: one round sends what the QPs have queued, receives a
//! batch from the link and runs the receive path on each datagram (see the module docs of
//! [`crate::soft::device`]); the idle rule decides between another round and a sleep; the
//! progress thread of thread mode and the busy-poll drive loop are built from rounds.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::api::UcDropReason;
use crate::soft::icrc;
use crate::soft::link::{Datagram, DatagramView, Readiness};
use crate::sync::lock;
use crate::wake::{deadline_after, sleep_until, WakeFd};

use super::service::ParsedPacket;
use super::shared::{canonical_ip, CqSink, LinkState, QpSlot, Shared};

/// Most packets pulled from one QP per round, for fairness between QPs.
pub(super) const PER_QP_BURST: usize = 64;

/// What an idle round of the device waits for (see [`Shared::idle_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IdleWait {
    /// There is work now: another round.
    Now,
    /// Sleep on the link's descriptor and the wake eventfd, until `until` at the latest.
    Sleep { until: Option<Instant> },
    /// The link cannot be slept on from outside: wait in its `recv` for `wait`.
    InLink,
}

/// Outcome of one [`SoftDevice::progress`](super::SoftDevice::progress) round.
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
    /// Pulls packets from every QP with pending send WRs into `ls.tx`, up to one batch.
    pub(super) fn pull_packets(&self, ls: &mut LinkState) {
        if !self.tx_hint.swap(false, Ordering::AcqRel) {
            return;
        }
        let slots = self.snapshot_qps();
        let now = Instant::now();
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
                        now,
                        self.mrs.as_ref(),
                        &mut buf,
                        &mut CqSink(&slot.send_cq),
                    );
                    if !pulled {
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
                if burst > 0 {
                    if let Some(t) = core.engine.poll_timeout() {
                        // Sent outside the progress thread (a post), the packet may have
                        // armed a timer the sleeping thread does not know of.
                        self.note_timer(t);
                    }
                }
                self.note_events(slot, &mut core);
            }
        }
        if ls.tx.len() >= self.batch {
            // Stopped at a full batch: some QP may have more to send.
            self.tx_hint.store(true, Ordering::Release);
        }
    }

    /// Runs the RC QPs' timers that are due (retransmit, end of an RNR wait) and returns the
    /// earliest one still running. A timer that fired may have made a QP ready to send (a
    /// rewind: the transmit hint is set) or failed it (retry exceeded: its WRs are flushed
    /// here, the `RetryExceededError` completion first, so a failure found just before the
    /// thread sleeps is not left waiting for the next datagram).
    pub(super) fn run_timers(&self) -> Option<Instant> {
        let slots: Vec<Arc<QpSlot>> = {
            let rc = self.rc_qps.read().unwrap_or_else(PoisonError::into_inner);
            if rc.is_empty() {
                return None;
            }
            rc.values().cloned().collect()
        };
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for slot in slots {
            let mut core = lock(&slot.core);
            if core.engine.poll_timeout().is_some_and(|t| t <= now) {
                core.engine.handle_timeout(now);
                if core.engine.wants_transmit() {
                    self.tx_hint.store(true, Ordering::Release);
                }
                self.flush_now(&slot, &mut core);
                self.note_events(&slot, &mut core);
            }
            if let Some(t) = core.engine.poll_timeout() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// Sends queued packets and pulls more until the link would block or nothing is left.
    pub(super) fn pump_tx(&self, ls: &mut LinkState) -> usize {
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
                    if n > 0 {
                        self.counters.link_sends.fetch_add(1, Ordering::Relaxed);
                    }
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
    pub(super) fn kick_tx(&self) {
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

    /// What to wait for after a round that moved nothing: another round when work is
    /// pending, a sleep on the link (bounded while the socket refuses packets or a flush
    /// waits for room in a CQ), or a wait inside the link's `recv`.
    pub(super) fn idle_wait(&self) -> IdleWait {
        let wait = self.idle_wait_inner();
        let planned = match wait {
            IdleWait::Sleep { until } => until.map_or(u64::MAX, |t| self.timer_nanos(t).max(1)),
            IdleWait::Now | IdleWait::InLink => 0,
        };
        self.planned_wake.store(planned, Ordering::Release);
        wait
    }

    fn idle_wait_inner(&self) -> IdleWait {
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
        drop(ls);
        // Announce the sleep before looking at the timers: a post that arms one after this
        // wakes the thread (`Shared::note_timer`); one armed before is found by the scan.
        self.planned_wake.store(u64::MAX, Ordering::Release);
        let timer = self.run_timers();
        if self.tx_hint.load(Ordering::Acquire) {
            // A timer fired and a QP has packets to resend.
            return IdleWait::Now;
        }
        // A flush a timer could not finish (a full CQ) is retried after a bounded wait.
        let retry = retry || self.flush_hint.load(Ordering::Acquire);
        let earliest = |until: Option<Instant>| match (until, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match readiness {
            Readiness::Now => IdleWait::Now,
            Readiness::Opaque => IdleWait::InLink,
            Readiness::Idle { until } if retry => {
                let soon = deadline_after(self.wait);
                IdleWait::Sleep {
                    until: earliest(match (until, soon) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }),
                }
            }
            Readiness::Idle { until } => IdleWait::Sleep {
                until: earliest(until),
            },
        }
    }

    /// Busy-poll mode: drives the device until `wake` is signalled (an armed CQ got a
    /// completion, or someone called `wake`) or `deadline` passes, sleeping on the link while
    /// nothing arrives. Returns whether it was woken.
    pub(super) fn drive_until(&self, wake: &WakeFd, deadline: Option<Instant>) -> io::Result<bool> {
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
    pub(super) fn progress(&self, wait: Option<Duration>, block_on_link: bool) -> ProgressReport {
        let mut report = ProgressReport::default();
        self.run_timers();
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
        // Each datagram is processed where the link received it (a view into its receive
        // buffers, copied only into the ring or receive buffer it is for), with the link
        // held: a thread posting a send meanwhile finds it busy and leaves the send to the
        // pump at the end of this round. One clock read for the round, at its first
        // datagram: every datagram of one receive arrived by then (a clock read per packet
        // was 3 % of a busy receive thread).
        let mut now = None;
        let received = ls.link.recv_each(self.batch, wait, &mut |d| {
            self.receive(d, *now.get_or_insert_with(Instant::now));
        });
        // Datagrams the link discarded (longer than its buffer) are not RoCEv2 packets.
        let discarded = ls.link.recv_discarded();
        if discarded > ls.discarded {
            lock(&self.counters.drops).add(UcDropReason::Malformed, discarded - ls.discarded);
            ls.discarded = discarded;
        }
        match received {
            Ok(n) => {
                report.received = n;
                self.counters
                    .packets_received
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.link_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(device = %self.name, error = %e, "link recv failed");
                drop(ls);
                // Do not spin on a broken link.
                if let Some(w) = wait.filter(|w| !w.is_zero()) {
                    std::thread::sleep(w);
                }
                self.flush_failed();
                return report;
            }
        }
        self.flush_failed();
        report.sent += self.pump_tx(&mut ls);
        report
    }

    pub(super) fn flush_failed(&self) {
        if !self.flush_hint.swap(false, Ordering::AcqRel) {
            return;
        }
        for slot in self.snapshot_qps() {
            let mut core = lock(&slot.core);
            if core.engine.needs_flush() {
                self.flush_now(&slot, &mut core);
                self.note_events(&slot, &mut core);
            }
        }
    }

    /// The receive path for one datagram (see the module docs), received by `now`.
    pub(super) fn receive(&self, d: DatagramView<'_>, now: Instant) {
        let Ok(pkt) = ParsedPacket::parse(d.payload) else {
            self.count_device_drop(UcDropReason::Malformed);
            return;
        };
        let dst = d.local.unwrap_or(self.local);
        if icrc::verify(d.payload, d.peer, dst).is_err() {
            self.count_device_drop(UcDropReason::BadIcrc);
            return;
        }
        let slot = {
            let qps = self.qps.read().unwrap_or_else(PoisonError::into_inner);
            qps.get(&pkt.dest_qpn()).cloned()
        };
        let Some(slot) = slot else {
            self.count_device_drop(UcDropReason::UnknownQpn);
            return;
        };
        let mut core = lock(&slot.core);
        if let Some(remote) = core.remote {
            if canonical_ip(remote.ip()) != canonical_ip(d.peer.ip()) {
                core.engine.count_drop(UcDropReason::AddressMismatch);
                drop(core);
                self.mark_changed(&slot);
                return;
            }
        }
        let changed = core.engine.receive(
            now,
            &pkt,
            self.mrs.as_ref(),
            &mut CqSink(&slot.send_cq),
            &mut CqSink(&slot.recv_cq),
        );
        if changed {
            self.mark_changed(&slot);
        }
        if core.engine.is_rc() && core.engine.wants_transmit() {
            // An ACK to send, or requests to resend after a NAK.
            self.tx_hint.store(true, Ordering::Release);
        }
        self.flush_now(&slot, &mut core);
        self.note_events(&slot, &mut core);
    }
}

/// The NIC of a thread-mode device: rounds while they move packets, then a sleep until the
/// link or a post needs it (see the module docs). Holds the device only during a round.
pub(super) fn progress_thread(
    weak: &Weak<Shared>,
    wake: &WakeFd,
    link_fd: Option<&OwnedFd>,
    name: &str,
) {
    while let Some(shared) = weak.upgrade() {
        // Awake: a post that arms an RC timer now needs no wake (`Shared::note_timer`); the
        // next idle wait looks at every timer before it sleeps.
        shared.planned_wake.store(0, Ordering::Release);
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
