//! The worker thread of [`super::DataPlane`]: its rounds (drive the device, poll the shared
//! CQ and the CQs of connections with queues of their own, top the SRQ up), its sleep on the
//! completion channel, the commands of the control plane and the stats folds (see the
//! module docs of [`super`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AsyncEvent, CompletionChannel, Device, DropCounters, QpState, RcCounters, UcDropReason,
    WcOpcode, WcStatus, WorkCompletion,
};

use super::{
    pause_after, Descriptor, Round, Session, SharedQueues, WorkerCmd, CLOSE_DRIVES, COALESCE_WAIT,
    DRIVE_EVERY_SESSIONS, FALLBACK_SLEEP, IDLE_STATS_EVERY, POLL_BATCH, SPIN_AFTER_WORK,
    STATS_EVERY, ZERO_LENGTH_WRS,
};
use crate::ingest::ConnectionIngest;
use crate::telemetry::{DropReason, Telemetry};

/// A driven device receives again after this many full batches polled from the shared CQ
/// in one round (a burst of 10,000 agents' frames is polled in several batches; the socket
/// must not wait for all of them).
const DRIVE_EVERY_BATCHES: usize = 8;
/// Most zero-length WRs posted to the SRQ per round (the rest in the next rounds).
const SRQ_TOP_UP_PER_ROUND: u64 = 4096;

/// One connection as the worker holds it.
pub(super) struct WorkerSession {
    session: Arc<Session>,
    ingest: ConnectionIngest,
    /// The QP's silent-drop counters at the last fold.
    qp_drops: DropCounters,
    /// Its RC counters at the last fold (RC lane only).
    qp_rc: RcCounters,
    /// Its completions waiting in [`Pending`].
    pending: u64,
    /// Listed in [`Worker::watch`]: it received something since the last stats fold, or a
    /// frame of it is still missing.
    watched: bool,
}

/// Completions waiting while the worker is paused, in the order they were polled.
pub(super) struct Pending {
    pub(super) queue: VecDeque<Descriptor>,
    /// Completions allowed beyond the connections' credit windows.
    pub(super) shared: u64,
    /// Σ over connections of max(0, pending − window).
    pub(super) shared_used: u64,
}

impl Pending {
    /// Queues `d` of `ws`; false (nothing queued) when it is beyond the connection's credit
    /// window and the shared room is taken. Keeps `shared_used` at
    /// Σ max(0, pending − window): each call moves one connection's `pending` by one and
    /// `shared_used` by exactly the change of that connection's term.
    fn push(&mut self, ws: &mut WorkerSession, d: Descriptor) -> bool {
        let window = u64::from(ws.session.geometry.credit_window);
        if !self.admit(&mut ws.pending, window) {
            return false;
        }
        self.queue.push_back(d);
        true
    }

    /// One completion of `ws` taken off the queue (see [`Pending::push`]).
    fn popped(&mut self, ws: &mut WorkerSession) {
        let window = u64::from(ws.session.geometry.credit_window);
        self.release(&mut ws.pending, window);
    }

    /// One more waiting completion of a connection with `pending` waiting and credit
    /// window `window`, if there is room for it.
    fn admit(&mut self, pending: &mut u64, window: u64) -> bool {
        if *pending >= window {
            if self.shared_used >= self.shared {
                return false;
            }
            self.shared_used += 1;
        }
        *pending += 1;
        true
    }

    /// One waiting completion less (see [`Pending::admit`]).
    fn release(&mut self, pending: &mut u64, window: u64) {
        if *pending > window {
            self.shared_used -= 1;
        }
        *pending = pending.saturating_sub(1);
    }
}

pub(super) struct Worker {
    pub(super) device: Device,
    /// The shared CQs and SRQ (`None`: every connection has queues of its own).
    pub(super) queues: Option<Arc<SharedQueues>>,
    pub(super) rx: mpsc::Receiver<WorkerCmd>,
    pub(super) sessions: HashMap<u32, WorkerSession>,
    /// Session id by QP number (every session): how a completion or a changed QP finds its
    /// connection.
    pub(super) by_qpn: HashMap<u32, u32>,
    /// The sessions with CQs of their own, polled every round.
    pub(super) own_cqs: Vec<u32>,
    /// Completions of the shared CQ whose QP was not registered yet when polled (its
    /// `Register` command was still in the channel); handled after the next commands.
    pub(super) strays: Vec<WorkCompletion>,
    /// Sessions to visit at the next stats fold ([`WorkerSession::watched`]).
    pub(super) watch: Vec<u32>,
    /// Scratch for [`Device::take_changed_qps`].
    pub(super) changed: Vec<u32>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) paused: bool,
    pub(super) scratch: Vec<u8>,
    pub(super) pending: Pending,
    pub(super) telemetry: Telemetry,
    pub(super) device_drops: DropCounters,
    /// Where the worker sleeps when every CQ is empty (`None`: it polls every
    /// [`FALLBACK_SLEEP`]).
    pub(super) channel: Option<CompletionChannel>,
    pub(super) wcs: Vec<WorkCompletion>,
}

/// Lists `ws` (id `id`) for the next stats fold, once.
fn watch(ws: &mut WorkerSession, id: u32, list: &mut Vec<u32>) {
    if !ws.watched {
        ws.watched = true;
        list.push(id);
    }
}

impl Worker {
    pub(super) fn run(mut self) {
        let mut last_stats = Instant::now();
        let mut idle_since: Option<Instant> = None;
        let mut warned = false;
        // A completion arrived since the last stats fold.
        let mut active = false;
        // The last round of a driven device received packets (see `COALESCE_WAIT`).
        let mut receiving = false;
        let spin = if self.device.is_driven() {
            Duration::ZERO
        } else {
            SPIN_AFTER_WORK
        };
        while !self.stop.load(Ordering::Acquire) {
            while let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
            }
            self.retry_strays();
            if !self.paused {
                self.drain_pending();
            }
            let round = self.poll_all();
            active |= round.moved_anything();
            let stats_every = if active {
                STATS_EVERY
            } else {
                IDLE_STATS_EVERY
            };
            if last_stats.elapsed() >= stats_every {
                last_stats = Instant::now();
                // Frames still missing keep the folds at STATS_EVERY: their reorder time
                // runs out without any further completion.
                active = self.fold_stats(last_stats);
            }
            if pause_after(round.packets, receiving) {
                std::thread::sleep(COALESCE_WAIT);
            }
            receiving = round.packets > 0;
            if round.moved_anything() {
                idle_since = None;
                continue;
            }
            // Nothing this round: keep polling for a while after the last work, then sleep.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < spin {
                std::thread::yield_now();
                continue;
            }
            // A completion while asleep makes the next fold due after STATS_EVERY.
            let timeout = stats_every.saturating_sub(last_stats.elapsed());
            if !timeout.is_zero() {
                self.sleep(timeout, &mut warned);
            }
        }
    }

    /// Drives a `driven` soft device (a no-op on other devices), polls the shared CQ until
    /// it is empty (driving again every [`DRIVE_EVERY_BATCHES`] full batches) and the CQs of
    /// the sessions with their own (driving before every [`DRIVE_EVERY_SESSIONS`] of them),
    /// and tops the SRQ up; returns the packets the device moved and the completions taken.
    fn poll_all(&mut self) -> Round {
        let mut round = Round {
            packets: self.device.drive(),
            completions: 0,
        };
        let queue = self.paused || !self.pending.queue.is_empty();
        round.completions += self.poll_shared(queue, &mut round.packets);
        for (i, id) in self.own_cqs.iter().enumerate() {
            if i > 0 && i % DRIVE_EVERY_SESSIONS == 0 {
                round.packets += self.device.drive();
            }
            if let Some(ws) = self.sessions.get_mut(id) {
                round.completions += poll_one(
                    ws,
                    &mut self.wcs,
                    &mut self.pending,
                    &mut self.scratch,
                    queue,
                    &mut self.watch,
                );
            }
        }
        self.top_up_srq();
        round
    }

    /// Polls the shared receive CQ until it is empty (and drains the shared send CQ); each
    /// completion goes to its session by QP number, processed at once or queued when
    /// `queue`. Returns the completions taken.
    fn poll_shared(&mut self, queue: bool, packets: &mut usize) -> usize {
        let Some(q) = self.queues.clone() else {
            return 0;
        };
        // The collector posts no sends; drain the send CQ so it can never overflow.
        let _ = q.send_cq.poll(&mut self.wcs);
        let mut total = 0;
        let mut batches = 0;
        let mut srq_done = 0u64;
        loop {
            let n = q.recv_cq.poll(&mut self.wcs);
            if n == 0 {
                break;
            }
            // One clock read per poll: each completion of it was there by now.
            let now = Instant::now();
            for k in 0..n {
                let wc = self.wcs[k];
                let id = self.by_qpn.get(&wc.qp_num).copied();
                let Some(id) = id.filter(|id| self.sessions.contains_key(id)) else {
                    self.strays.push(wc);
                    continue;
                };
                srq_done += u64::from(self.handle_shared(id, wc, queue, now));
            }
            total += n;
            if n < self.wcs.len() {
                break;
            }
            batches += 1;
            if batches % DRIVE_EVERY_BATCHES == 0 {
                *packets += self.device.drive();
            }
        }
        q.consumed(srq_done);
        total
    }

    /// One completion of the shared CQ for session `id` (registered); returns whether the
    /// session is on the SRQ (the completion took one of its WRs).
    fn handle_shared(&mut self, id: u32, wc: WorkCompletion, queue: bool, now: Instant) -> bool {
        let Some(ws) = self.sessions.get_mut(&id) else {
            return false;
        };
        watch(ws, id, &mut self.watch);
        let zero = handle_wc(ws, &wc, &mut self.pending, &mut self.scratch, queue, now);
        if zero && !ws.session.on_srq() {
            // An RC lane's own receive queue (Write-with-immediate).
            if let Err(e) = ws.session.qp.post_recv(&ZERO_LENGTH_WRS[..1]) {
                tracing::debug!(agent = %ws.session.agent, error = %e, "re-posting a receive WR failed");
            }
        }
        ws.session.on_srq()
    }

    /// Handles the completions of sessions that were not registered when they were polled;
    /// those of a session that is still unknown (it was closed: its last frames came after
    /// its close) are dropped with a debug log, as a closed connection's CQ was before.
    fn retry_strays(&mut self) {
        if self.strays.is_empty() {
            return;
        }
        let queue = self.paused || !self.pending.queue.is_empty();
        let now = Instant::now();
        let mut srq_done = 0u64;
        for wc in std::mem::take(&mut self.strays) {
            match self.by_qpn.get(&wc.qp_num).copied() {
                Some(id) => srq_done += u64::from(self.handle_shared(id, wc, queue, now)),
                None => {
                    tracing::debug!(qpn = wc.qp_num, status = %wc.status, "completion of a QP no session holds");
                    // It took a WR of the SRQ if it was a receive on a QP of it: the
                    // top-up replaces it at most once (the count never goes below 0).
                    srq_done += 1;
                }
            }
        }
        if let Some(q) = &self.queues {
            q.consumed(srq_done);
        }
    }

    /// Posts zero-length WRs to the SRQ until it holds its target (at most
    /// [`SRQ_TOP_UP_PER_ROUND`] per round).
    fn top_up_srq(&mut self) {
        let Some(q) = &self.queues else { return };
        let Some(srq) = &q.srq else { return };
        let mut left = q.srq_deficit().min(SRQ_TOP_UP_PER_ROUND);
        while left > 0 {
            let n = left.min(POLL_BATCH as u64) as usize;
            match srq.post_recv(&ZERO_LENGTH_WRS[..n]) {
                Ok(()) => q.posted(n as u64),
                Err(e) => {
                    q.posted(e.posted as u64);
                    tracing::debug!(error = %e, "posting to the shared receive queue failed");
                    return;
                }
            }
            left -= n as u64;
        }
        q.arm_limit_when_full();
    }

    /// Arms every CQ on the completion channel, polls them once more (a completion that
    /// arrived before its CQ was armed raises no notification), and sleeps until a
    /// completion, a command, or `timeout`.
    fn sleep(&mut self, timeout: Duration, warned: &mut bool) {
        let Some(channel) = self.channel.clone() else {
            std::thread::park_timeout(FALLBACK_SLEEP.min(timeout));
            return;
        };
        let mut failure = None;
        let shared = self.queues.iter().flat_map(|q| [&q.recv_cq, &q.send_cq]);
        let own = self
            .own_cqs
            .iter()
            .filter_map(|id| self.sessions.get(id))
            .flat_map(|ws| [&ws.session.recv_cq, &ws.session.send_cq]);
        for cq in shared.chain(own) {
            if let Err(e) = channel.req_notify(cq) {
                failure = Some(e);
            }
        }
        if self.poll_all().moved_anything() {
            return;
        }
        // A command sent after the loop's check wakes the channel, also before this wait
        // (the wake-up is kept), so none is missed.
        let failure = match failure {
            Some(e) => Some(e),
            None => channel.wait(timeout).err(),
        };
        if let Some(e) = failure {
            if !*warned {
                tracing::warn!(error = %e, "completion channel failed; the worker polls every {FALLBACK_SLEEP:?} while idle");
                *warned = true;
            }
            std::thread::park_timeout(FALLBACK_SLEEP.min(timeout));
        }
    }

    /// Processes every waiting completion, in order.
    fn drain_pending(&mut self) {
        while let Some(d) = self.pending.queue.pop_front() {
            let Some(ws) = self.sessions.get_mut(&d.session()) else {
                // A session leaves only after its completions were processed.
                tracing::debug!(session = d.session(), "completion of an unknown session");
                continue;
            };
            self.pending.popped(ws);
            ws.session.tel.ring_slots_in_use.dec();
            process(ws, d, &mut self.scratch, Instant::now());
        }
    }

    /// Folds the drop counters of the QPs the device lists as changed (every QP's on a
    /// device that cannot tell) and the device's, takes the async events, checks QP states,
    /// then settles the missing frames whose reorder time ran out by `now`
    /// ([`ConnectionIngest::handle_timeout`], after the drops: see there) of the sessions
    /// that received something since the last fold or still miss a frame. Returns whether a
    /// frame is still missing somewhere (a reorder-time deadline is pending).
    fn fold_stats(&mut self, now: Instant) -> bool {
        let count = |device: &str, ev: &_| self.telemetry.rdma_async_event(device, ev);
        for ev in crate::rdma_events::drain(&self.device, count) {
            if let Some(q) = &self.queues {
                match ev {
                    AsyncEvent::SrqLimitReached { srq } if q.srq_handle() == Some(srq) => {
                        q.limit_reached();
                    }
                    AsyncEvent::SrqError { srq } if q.srq_handle() == Some(srq) => q.srq_failed(),
                    _ => {}
                }
            }
            for ws in self.sessions.values() {
                let s = &ws.session;
                let cqs = [s.recv_cq.handle(), s.send_cq.handle()];
                if crate::rdma_events::ends_connection(&ev, s.qp.qp_num(), cqs, s.srq_handle()) {
                    s.mark_failed();
                }
            }
        }
        self.changed.clear();
        if self.device.take_changed_qps(&mut self.changed) {
            for qpn in &self.changed {
                let Some(&id) = self.by_qpn.get(qpn) else {
                    continue;
                };
                if let Some(ws) = self.sessions.get_mut(&id) {
                    fold_qp_stats(ws);
                    watch(ws, id, &mut self.watch);
                }
            }
        } else {
            for (&id, ws) in self.sessions.iter_mut() {
                fold_qp_stats(ws);
                watch(ws, id, &mut self.watch);
            }
        }
        let mut pending = false;
        for id in std::mem::take(&mut self.watch) {
            let Some(ws) = self.sessions.get_mut(&id) else {
                continue;
            };
            ws.watched = false;
            ws.ingest.handle_timeout(now);
            if ws.ingest.poll_timeout().is_some() {
                pending = true;
                watch(ws, id, &mut self.watch);
            }
        }
        let drops = self.device.stats().drops;
        for (reason, count) in drops.iter() {
            let before = self.device_drops.get(reason);
            if count > before {
                self.telemetry
                    .transport_packets_dropped(reason, count - before);
            }
        }
        self.device_drops = drops;
        pending
    }

    fn command(&mut self, cmd: WorkerCmd) {
        match cmd {
            WorkerCmd::Register(session, ingest) => {
                let id = session.id;
                self.by_qpn.insert(session.qp.qp_num(), id);
                if !session.on_shared_cq() {
                    self.own_cqs.push(id);
                }
                self.sessions.insert(
                    id,
                    WorkerSession {
                        session,
                        ingest: *ingest,
                        qp_drops: DropCounters::default(),
                        qp_rc: RcCounters::default(),
                        pending: 0,
                        watched: false,
                    },
                );
            }
            WorkerCmd::Heartbeat(id, hb) => {
                if let Some(ws) = self.sessions.get_mut(&id) {
                    ws.ingest.on_heartbeat(&hb);
                }
            }
            WorkerCmd::Report(id, reply) => {
                // The QP's drops first: the connection's loss counts only gaps no drop
                // explains (`ConnectionIngest::handle_timeout`).
                let report = self.sessions.get_mut(&id).map(|ws| {
                    fold_qp_stats(ws);
                    ws.ingest.report()
                });
                let _ = reply.send(report);
            }
            WorkerCmd::Consumed(id, reply) => {
                let _ = reply.send(self.sessions.get(&id).and_then(|ws| ws.ingest.consumed()));
            }
            WorkerCmd::Close(id, goodbye, reply) => {
                self.last_polls(id);
                let summary = self.sessions.remove(&id).map(|mut ws| {
                    self.by_qpn.remove(&ws.session.qp.qp_num());
                    self.own_cqs.retain(|&o| o != id);
                    fold_qp_stats(&mut ws);
                    match goodbye {
                        Some(g) => ws.ingest.close(&g),
                        None => {
                            let _ = ws.ingest.report();
                            ws.ingest.end_without_goodbye()
                        }
                    }
                });
                let _ = reply.send(summary);
            }
            WorkerCmd::Pause(p, applied) => {
                self.paused = p;
                let _ = applied.send(());
            }
        }
    }

    /// The last polls of closing session `id`'s completions; what waits is processed,
    /// paused or not. A driven device first takes what waits in the socket, a batch per
    /// round, until the socket is empty (or [`CLOSE_DRIVES`] rounds: more than the credit
    /// budget). On the shared CQ the other sessions' completions polled meanwhile are
    /// processed (or queued) as in any round.
    fn last_polls(&mut self, id: u32) {
        let own = self.own_cqs.contains(&id);
        for _ in 0..CLOSE_DRIVES {
            if own {
                if let Some(ws) = self.sessions.get_mut(&id) {
                    while poll_one(
                        ws,
                        &mut self.wcs,
                        &mut self.pending,
                        &mut self.scratch,
                        true,
                        &mut self.watch,
                    ) > 0
                    {}
                }
            } else {
                let mut packets = 0;
                let queue = self.paused || !self.pending.queue.is_empty();
                while self.poll_shared(queue, &mut packets) > 0 {}
                self.retry_strays();
            }
            if self.device.drive() == 0 {
                break;
            }
        }
        self.drain_pending();
        self.top_up_srq();
    }
}

/// Polls one session's own CQs once and processes each completion where it is found, or
/// queues it when `queue` (the worker is paused, or completions wait before it); lists the
/// session in `watch` when it took any; returns the completions taken.
fn poll_one(
    ws: &mut WorkerSession,
    wcs: &mut [WorkCompletion],
    pending: &mut Pending,
    scratch: &mut Vec<u8>,
    queue: bool,
    watch_list: &mut Vec<u32>,
) -> usize {
    let s = ws.session.clone();
    // Send CQ: the collector posts no sends; drain it so it can never overflow.
    let _ = s.send_cq.poll(wcs);
    let n = s.recv_cq.poll(wcs);
    if n == 0 {
        return 0;
    }
    watch(ws, s.id, watch_list);
    // One clock read per poll: each completion of it was there by now.
    let now = Instant::now();
    let mut repost_zero = 0usize;
    for wc in wcs.iter().take(n) {
        repost_zero += usize::from(handle_wc(ws, wc, pending, scratch, queue, now));
    }
    if repost_zero > 0 {
        if let Err(e) = s.qp.post_recv(&ZERO_LENGTH_WRS[..repost_zero]) {
            tracing::debug!(agent = %s.agent, error = %e, "re-posting receive WRs failed");
        }
    }
    n
}

/// Handles one receive completion `wc` of `ws`, taken off its CQ by `now`: counts an error
/// completion, processes the frame at once, or queues it when `queue` (counted as
/// `queue_full` when there is no room). Returns whether it consumed a zero-length receive
/// WR (a Write-with-immediate) that the caller re-posts.
fn handle_wc(
    ws: &mut WorkerSession,
    wc: &WorkCompletion,
    pending: &mut Pending,
    scratch: &mut Vec<u8>,
    queue: bool,
    now: Instant,
) -> bool {
    let s = ws.session.clone();
    if wc.status != WcStatus::Success {
        if wc.status != WcStatus::WrFlushError {
            ws.ingest.drop_before_tracking(
                DropReason::WcError,
                1,
                &format_args!("receive completion status {}", wc.status),
            );
        }
        if s.qp.state() == QpState::Error {
            s.mark_failed();
        }
        return false;
    }
    let desc = match wc.opcode {
        WcOpcode::RecvRdmaWithImm => match wc.imm {
            Some(imm) => Descriptor::WriteImm { session: s.id, imm },
            None => {
                ws.ingest.drop_before_tracking(
                    DropReason::WcError,
                    1,
                    &"Write-with-immediate completion without immediate",
                );
                return true;
            }
        },
        WcOpcode::Recv => Descriptor::Send {
            session: s.id,
            len: wc.byte_len,
            // Buffers are numbered below `send_buffers` (≤ 65 536); anything else
            // fails the buffer read and is counted there.
            buf: u16::try_from(wc.wr_id).unwrap_or(u16::MAX),
        },
        WcOpcode::Send | WcOpcode::RdmaWrite => return false,
    };
    let zero = matches!(desc, Descriptor::WriteImm { .. });
    if !queue {
        process(ws, desc, scratch, now);
    } else if pending.push(ws, desc) {
        s.tel.ring_slots_in_use.inc();
    } else {
        ws.ingest.drop_before_tracking(
            DropReason::QueueFull,
            1,
            &format_args!(
                "no shared room left for completions beyond the agent's credit window \
                 while the worker is paused (credit window {}, {} shared)",
                s.geometry.credit_window, pending.shared
            ),
        );
        if let Descriptor::Send { buf, .. } = desc {
            let _ = s.post_buffer(u64::from(buf));
        }
    }
    zero
}

fn fold_qp_stats(ws: &mut WorkerSession) {
    let s = ws.session.clone();
    let stats = s.qp.stats();
    if let Some(rc) = &s.rc {
        rc.add(&ws.qp_rc, &stats.rc);
        ws.qp_rc = stats.rc;
    }
    let now = stats.drops;
    for (reason, count) in now.iter() {
        let before = ws.qp_drops.get(reason);
        if count > before {
            let delta = count - before;
            let detail = format_args!(
                "{} responder on QP {:#x}",
                if s.rc.is_some() { "RC" } else { "UC" },
                s.qp.qp_num()
            );
            if reason == UcDropReason::QpError {
                // Not a frame of this connection's sequence: counted, not in its ledger.
                s.tel
                    .drop_frames(DropReason::Transport(reason), delta, &detail);
            } else {
                ws.ingest
                    .drop_before_tracking(DropReason::Transport(reason), delta, &detail);
            }
        }
    }
    ws.qp_drops = now;
    if s.qp.state() == QpState::Error {
        s.mark_failed();
    }
}

/// Processes completion `d` of `ws`, taken off its CQ by `now`: copies the ring slot or Send
/// buffer, hands it to the ingest, re-posts the buffer, and publishes the credit point.
fn process(ws: &mut WorkerSession, d: Descriptor, scratch: &mut Vec<u8>, now: Instant) {
    let g = ws.session.geometry;
    match d {
        Descriptor::WriteImm { imm, .. } => {
            let conn_seq = ws.ingest.conn_seq_for_imm(imm);
            let slot = conn_seq % u64::from(g.slots.max(1));
            let len = g.slot_bytes as usize;
            scratch.resize(len, 0);
            if let Err(e) = ws
                .session
                .ring
                .read_at(slot as usize * len, &mut scratch[..len])
            {
                ws.ingest
                    .drop_before_tracking(DropReason::MalformedFrame, 1, &e);
            } else {
                let _ = ws.ingest.on_slot(conn_seq, &scratch[..len], now);
            }
        }
        Descriptor::Send { buf, len, .. } => {
            let size = g.max_frame_bytes as usize;
            let len = (len as usize).min(size);
            scratch.resize(len, 0);
            let read = ws
                .session
                .bufs
                .read_at(usize::from(buf) * size, &mut scratch[..len]);
            if let Err(e) = ws.session.post_buffer(u64::from(buf)) {
                tracing::debug!(agent = %ws.session.agent, error = %e, "re-posting a receive buffer failed");
            }
            match read {
                Ok(()) => {
                    let _ = ws.ingest.on_send(&scratch[..len], now);
                }
                Err(e) => ws
                    .ingest
                    .drop_before_tracking(DropReason::MalformedFrame, 1, &e),
            }
        }
    }
    if let Some(c) = ws.ingest.consumed() {
        ws.session
            .consumed_plus_one
            .store(c.wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::COALESCE_BELOW_PACKETS;

    #[test]
    fn only_a_thin_round_within_a_stream_pauses() {
        // A thin round after a receiving one: the stream goes on, let the socket gather.
        assert!(pause_after(5, true));
        assert!(pause_after(COALESCE_BELOW_PACKETS - 1, true));
        // The first round after a wake-up (a light stream), a full round, an empty one.
        assert!(!pause_after(5, false));
        assert!(!pause_after(COALESCE_BELOW_PACKETS, true));
        assert!(!pause_after(0, true));
    }

    #[test]
    fn a_descriptor_is_twelve_bytes() {
        // At most one waits per frame of every connection's credit window.
        assert_eq!(std::mem::size_of::<Descriptor>(), 12);
    }

    proptest::proptest! {
        /// Any interleaving of completions queued and processed for two connections keeps
        /// the shared count at Σ max(0, pending − window), a connection within its window
        /// is never refused, and one beyond it is refused exactly when the shared room is
        /// taken.
        #[test]
        fn shared_room_counts_only_completions_beyond_the_window(
            ops in proptest::collection::vec((0usize..2, proptest::bool::ANY), 0..200),
        ) {
            let windows = [3u64, 5];
            let shared = 4u64;
            let mut pending = Pending { queue: VecDeque::new(), shared, shared_used: 0 };
            let mut count = [0u64; 2];
            for (c, add) in ops {
                let before = count[c];
                let used = pending.shared_used;
                if add {
                    let queued = pending.admit(&mut count[c], windows[c]);
                    let expected = before < windows[c] || used < shared;
                    proptest::prop_assert_eq!(queued, expected);
                } else if before > 0 {
                    pending.release(&mut count[c], windows[c]);
                }
                let expected: u64 = (0..2).map(|i| count[i].saturating_sub(windows[i])).sum();
                proptest::prop_assert_eq!(pending.shared_used, expected);
                proptest::prop_assert!(pending.shared_used <= shared);
            }
        }
    }
}
