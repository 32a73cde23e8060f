//! The receive data path (DESIGN.md §4): per agent connection a UC QP with its own registered
//! ring, and one worker thread for all connections that polls their CQs and processes each
//! completion where it finds it.
//!
//! ```text
//!  NIC / soft device ──WC──► worker thread: poll CQ, re-post zero-length receive WRs,
//!   (ring slot written,       copy slot or buffer, validate, track, store; count
//!    receive WR consumed)     transport drops, error completions, QP errors
//! ```
//!
//! On the soft transport with `progress: worker` (the default) the worker also runs the device:
//! each round starts with one [`Device::drive`] (receive a batch from the socket, ICRC, UC
//! responder, ring writes, CQ pushes) before the polls, so a frame goes from the socket to
//! the store without leaving the thread, and its ring slot is still in the core's cache when
//! the worker copies it (with a device thread the copy took the cache misses of a slot just
//! written on the other core; BENCHMARKS.md). Idle, the completion channel's wait sleeps on
//! the socket.
//!
//! A frame crosses no thread between its completion and the store: a separate poller
//! thread handing descriptors to the worker through a queue cost a hand-off per frame (a
//! queue slot, two atomic counters and a gauge update on each side, a wake-up) and a core's
//! share of spinning, and bought nothing, since the worker's processing is what bounds the
//! rate (BENCHMARKS.md). The verbs design stays as rdma-core intends: one thread per CQ set,
//! a completion channel to sleep on when idle.
//!
//! * **Write-with-immediate**: the receive queue holds zero-length receive WRs; each
//!   completion carries the ImmDt (low 32 bits of the connection sequence); the worker
//!   re-posts a WR per completion after each poll and copies slot `c mod slots` and checks
//!   it ([`crate::ingest`]).
//! * **Send**: the receive queue holds `send_buffers` buffers of `max_frame_bytes`; the worker
//!   copies the buffer and re-posts it.
//! * The ring MR is registered LOCAL_WRITE | REMOTE_WRITE (never REMOTE_READ: the API cannot
//!   express it) with its own rkey.
//! * Every 100 ms (every second while no completion, and on a driven device no packet,
//!   arrived since the last time, and no frame is missing) the
//!   worker folds the QP's silent-drop counters (UC responder rules) into
//!   `frames_dropped_total{reason}` and checks the QP state: a QP in ERROR is counted
//!   (`qp_errors_total`) and the control plane rebuilds the connection. The same fold takes
//!   the device's async events ([`crate::rdma_events`]): a `qp_fatal` or `cq_error` naming a
//!   connection's QP or CQ fails that connection at once. Then it counts as lost the
//!   missing frames whose reorder time ran out (`reorder_window_seconds`,
//!   [`ConnectionIngest::handle_timeout`]), so a gap on a slow stream is counted within
//!   that time plus 0.1 s even when no further frame arrives.
//! * Commands from the control plane (register, report, heartbeat, close) reach the worker
//!   through a channel and wake it; it runs them between polls, so a report sees every
//!   completion polled before it and a close polls the connection's CQs a last time.
//!
//! **Idle means asleep** (DESIGN.md §2). The worker spins (polling, yielding the core) for at
//! most [`SPIN_AFTER_WORK`] after its last work (not at all on a driven soft device, whose
//! rounds under a steady stream are paced by `COALESCE_WAIT` instead), then arms every CQ
//! on one [`CompletionChannel`] (`ibv_req_notify_cq`), polls them once more and sleeps in
//! [`CompletionChannel::wait`] until a completion arrives, a command is sent or the next
//! stats fold is due. A collector with no traffic (and no frame missing) wakes only for the
//! stats folds, once a second.
//!
//! **Completions wait only for a paused worker** (a test hook that provokes ring overruns),
//! and then never more than each connection's credit window (the frames its agent may have
//! outstanding, DESIGN.md §4) plus `ring.descriptor_queue` shared ones: completions beyond
//! a connection's window take shared room, and when none is left they are dropped and
//! counted as `queue_full` for that agent, so an agent ignoring its credits cannot take
//! another's room.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};
use uctel_protocol::control::{DataPath, Goodbye, Heartbeat, Report};
use uctel_protocol::seq::Seq;
use uctel_transport::api::{
    AccessFlags, CompletionChannel, CompletionQueue, Device, DropCounters, MemoryRegion,
    QpEndpoint, QpState, QpType, QueuePair, RcAttr, RcCounters, RecvWr, Sge, UcDropReason,
    WcOpcode, WcStatus, WorkCompletion,
};

use crate::ingest::{CloseSummary, ConnectionIngest};
use crate::telemetry::{AgentTelemetry, DropReason, RcLaneTelemetry, Telemetry};

/// How often the worker folds transport counters and checks QP states.
const STATS_EVERY: Duration = Duration::from_millis(100);
/// How often the worker folds them while no completion arrived since the last fold (an idle
/// collector wakes this often; silent drops without completions are counted this late).
const IDLE_STATS_EVERY: Duration = Duration::from_secs(1);
/// Completions polled per CQ per round.
const POLL_BATCH: usize = 64;
/// Zero-length receive WRs re-posted for the Write-with-immediate completions of one poll.
const ZERO_LENGTH_WRS: [RecvWr<'static>; POLL_BATCH] = [RecvWr {
    wr_id: 0,
    sge: None,
}; POLL_BATCH];
/// How long the worker keeps polling (yielding the core between rounds) after its last
/// work before it blocks: a burst's next frames are taken without a
/// wake-up, and an idle collector sleeps. Not on a driven soft device: there an empty
/// round costs a `recvmmsg` that finds nothing and a `sched_yield`, and spinning took about
/// a fifth of the worker's CPU at a million frames per second (7.3 frames per receive
/// instead of 61, BENCHMARKS.md), so the worker sleeps after its first empty round and the
/// device's socket wakes it.
pub const SPIN_AFTER_WORK: Duration = Duration::from_micros(50);
/// Longest wait of [`DataPlane::pause_worker`] for the worker to apply a pause (it does
/// between rounds, within milliseconds).
const PAUSE_APPLIED_WITHIN: Duration = Duration::from_secs(10);
/// A round of a driven soft device that received packets, but fewer than this, after a
/// round that received some too, is followed by a [`COALESCE_WAIT`] pause.
const COALESCE_BELOW_PACKETS: usize = 32;
/// Interrupt moderation for a driven soft device (a NIC's `rx-usecs`): under a steady
/// stream, a round that found only a few packets waits this long before the next, so the
/// socket gathers a batch and each `recvmmsg` and round spreads its cost over hundreds of
/// packets instead of a handful. At about a million frames per second the worker made 3 to
/// 6 thousand `recvmmsg` calls per second instead of 60 to 220 thousand and took about a
/// fifth less CPU per frame (BENCHMARKS.md). A light stream is not delayed: the round after
/// a wake-up finds its packets with no round before it that received any. The frames
/// waiting meanwhile (about 100 at a million per second) are a small part of the credit
/// budget the socket buffer is sized for.
const COALESCE_WAIT: Duration = Duration::from_micros(50);
/// What one [`Worker::poll_all`] moved.
#[derive(Clone, Copy, Debug)]
struct Round {
    /// Packets a driven soft device received and sent (0 on other devices).
    packets: usize,
    /// Completions taken from the CQs.
    completions: usize,
}

impl Round {
    fn moved_anything(self) -> bool {
        self.packets + self.completions > 0
    }
}

/// Whether a round of a driven device that received `packets`, after a round that received
/// some (`receiving`), is followed by a [`COALESCE_WAIT`] pause.
fn pause_after(packets: usize, receiving: bool) -> bool {
    receiving && packets > 0 && packets < COALESCE_BELOW_PACKETS
}

/// A `driven` soft device receives again after this many sessions' CQs were polled: with
/// 10,000 agents one round of polls takes milliseconds, and a receive per round let the
/// socket overflow (BENCHMARKS.md).
const DRIVE_EVERY_SESSIONS: usize = 64;
/// Most receive rounds of a driven device when a session closes (a round takes up to
/// `transport.soft.batch` datagrams, 64 by default: 4,096 rounds hold more than the credit
/// budget of a 32 MiB socket buffer).
const CLOSE_DRIVES: usize = 4096;
/// The worker's idle sleep when the device gave it no completion channel (it then polls).
const FALLBACK_SLEEP: Duration = Duration::from_millis(1);

/// Errors creating a connection's transport resources.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A verb failed.
    #[error("{what}: {detail}")]
    Verb {
        /// Which step (`alloc_pd`, `reg_mr ring`, `create_qp`, `connect`, ...).
        what: &'static str,
        /// The transport's error.
        detail: String,
    },
}

fn verb<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> ResourceError {
    move |e| ResourceError::Verb {
        what,
        detail: e.to_string(),
    }
}

/// Bytes of a connection's source region for the credit words it writes into the agent's
/// memory (`crate::control::credit_write`): 16 words, one per 64-byte line.
pub const CREDIT_SOURCE_BYTES: usize = 16 * 64;

/// Sizes of one connection's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Ring slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
    /// Largest frame (Send buffers have this size).
    pub max_frame_bytes: u32,
    /// Send receive buffers.
    pub send_buffers: u32,
    /// The credit window granted in `Welcome`: frames the agent may have outstanding; the
    /// descriptor queue reserves this many descriptors for the connection.
    pub credit_window: u32,
}

/// One agent connection's QP, CQs and memory, shared by the control task and the worker.
#[derive(Debug)]
pub struct Session {
    /// Data-plane id (unique per collector run).
    pub id: u32,
    /// The agent's id.
    pub agent: String,
    /// The data path in use.
    pub data_path: DataPath,
    /// Sizes.
    pub geometry: Geometry,
    /// The QP: UC, or RC for an agent's RC lane (DESIGN.md §8b).
    pub qp: QueuePair,
    /// The RC lane's counters (`None` on a UC QP).
    rc: Option<RcLaneTelemetry>,
    recv_cq: CompletionQueue,
    send_cq: CompletionQueue,
    /// The ring (REMOTE_WRITE) the agent writes frames into.
    pub ring: MemoryRegion,
    bufs: MemoryRegion,
    /// Source of the credit words written into the agent's memory
    /// (`crate::control::credit_write`), in the QP's protection domain.
    pub credit_src: MemoryRegion,
    tel: AgentTelemetry,
    /// Highest connection sequence the worker consumed, +1 (0 = none yet).
    consumed_plus_one: AtomicU64,
    /// Set when the QP went to ERROR; `failed_notify` wakes the control task.
    failed: AtomicBool,
    /// Wakes the control task on failure.
    pub failed_notify: Notify,
}

impl Session {
    /// Creates the PD, CQs, ring MR, Send buffers and the QP (UC; RC with `rc`'s attributes
    /// for an agent's RC lane, whose counters `rc` also carries), and fills the receive
    /// queue for `data_path`. The QP is left in INIT; [`Session::connect`] moves it to RTS.
    /// On RC a full receive queue is flow control, not loss: the responder answers RNR NAK
    /// and the agent's QP retries (IBTA 9.7.5.2.8).
    ///
    /// # Errors
    /// [`ResourceError`] naming the verb that failed.
    pub fn create(
        id: u32,
        agent: &str,
        device: &Device,
        data_path: DataPath,
        geometry: Geometry,
        tel: AgentTelemetry,
        rc: Option<(RcAttr, RcLaneTelemetry)>,
    ) -> Result<Session, ResourceError> {
        let pd = device.alloc_pd().map_err(verb("alloc_pd"))?;
        let rq_depth = match data_path {
            DataPath::Send => geometry.send_buffers,
            _ => geometry.slots,
        }
        .clamp(1, 1 << 16);
        let recv_cq = device
            .create_cq(rq_depth.saturating_add(64))
            .map_err(verb("create_cq recv"))?;
        let send_cq = device.create_cq(16).map_err(verb("create_cq send"))?;
        let ring_len = geometry.slots as usize * geometry.slot_bytes as usize;
        let ring = pd
            .reg_mr(
                ring_len,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(verb("reg_mr ring"))?;
        let bufs_len = match data_path {
            DataPath::Send => geometry.send_buffers as usize * geometry.max_frame_bytes as usize,
            _ => 1,
        };
        let bufs = pd
            .reg_mr(bufs_len, AccessFlags::LOCAL_WRITE)
            .map_err(verb("reg_mr send buffers"))?;
        let credit_src = pd
            .reg_mr(CREDIT_SOURCE_BYTES, AccessFlags::LOCAL_WRITE)
            .map_err(verb("reg_mr credit words"))?;
        let qp = pd
            .create_qp(&uctel_transport::api::QpInitAttr {
                qp_type: rc
                    .as_ref()
                    .map_or(QpType::Uc, |(attr, _)| QpType::Rc(*attr)),
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                max_send_wr: 16,
                max_recv_wr: rq_depth,
                access: AccessFlags::REMOTE_WRITE,
                max_mtu: None,
            })
            .map_err(verb("create_qp"))?;
        let session = Session {
            id,
            agent: agent.to_string(),
            data_path,
            geometry,
            qp,
            rc: rc.map(|(_, t)| t),
            recv_cq,
            send_cq,
            ring,
            bufs,
            credit_src,
            tel,
            consumed_plus_one: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failed_notify: Notify::new(),
        };
        match data_path {
            DataPath::Send => {
                for i in 0..geometry.send_buffers {
                    session
                        .post_buffer(u64::from(i))
                        .map_err(verb("post_recv"))?;
                }
            }
            _ => {
                let wrs: Vec<RecvWr<'_>> = (0..rq_depth).map(|_| RecvWr::zero_length(0)).collect();
                session.qp.post_recv(&wrs).map_err(verb("post_recv"))?;
            }
        }
        Ok(session)
    }

    /// The local endpoint to put in `Welcome`.
    pub fn local_endpoint(&self) -> QpEndpoint {
        self.qp.local_endpoint()
    }

    /// Connects the QP to the agent's endpoint (INIT → RTR → RTS).
    ///
    /// # Errors
    /// [`ResourceError`] when the transport refuses the endpoint.
    pub fn connect(&self, remote: &QpEndpoint) -> Result<(), ResourceError> {
        self.qp.connect(remote).map_err(verb("connect"))
    }

    fn post_buffer(&self, index: u64) -> Result<(), uctel_transport::api::PostRecvError> {
        let size = self.geometry.max_frame_bytes;
        let offset = index as usize * size as usize;
        let sge = Sge::new(&self.bufs, offset, size);
        self.qp.post_recv(&[RecvWr::new(index, sge)])
    }

    /// The credit point: highest connection sequence the worker consumed.
    pub fn consumed(&self) -> Option<u64> {
        self.consumed_plus_one
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// True once the QP went to ERROR.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    fn mark_failed(&self) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            self.tel.qp_errors.inc();
            tracing::warn!(agent = %self.agent, qpn = self.qp.qp_num(), "QP in ERROR; rebuilding the connection");
            self.failed_notify.notify_one();
        }
    }
}

/// A completion the worker could not process at once (it is paused): small and `Copy` (12
/// bytes; at most one per frame of every connection's credit window, plus the shared room).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Descriptor {
    /// Write-with-immediate completed: the ImmDt.
    WriteImm { session: u32, imm: u32 },
    /// Send completed into buffer `buf` (below `send_buffers` ≤ 65 536), `len` bytes.
    Send { session: u32, len: u32, buf: u16 },
}

impl Descriptor {
    fn session(self) -> u32 {
        match self {
            Descriptor::WriteImm { session, .. } | Descriptor::Send { session, .. } => session,
        }
    }
}

enum WorkerCmd {
    Register(Arc<Session>, Box<ConnectionIngest>),
    Report(u32, oneshot::Sender<Option<Report>>),
    /// The highest connection sequence consumed so far (no side effect).
    Consumed(u32, oneshot::Sender<Option<u64>>),
    /// The agent's heartbeat (the sequences it had sent by then).
    Heartbeat(u32, Box<Heartbeat>),
    Close(u32, Option<Goodbye>, oneshot::Sender<Option<CloseSummary>>),
    /// Pause or resume, and say so once applied.
    Pause(bool, std::sync::mpsc::Sender<()>),
}

impl std::fmt::Debug for WorkerCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkerCmd::Register(..) => "Register",
            WorkerCmd::Report(..) => "Report",
            WorkerCmd::Consumed(..) => "Consumed",
            WorkerCmd::Heartbeat(..) => "Heartbeat",
            WorkerCmd::Close(..) => "Close",
            WorkerCmd::Pause(..) => "Pause",
        })
    }
}

/// The running worker thread.
#[derive(Debug)]
pub struct DataPlane {
    device: Device,
    worker_tx: mpsc::Sender<WorkerCmd>,
    /// Unparked after every command (its sleep without a completion channel).
    worker: Thread,
    /// Where the worker sleeps; woken after every command and at stop.
    channel: Option<CompletionChannel>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DataPlane {
    /// Starts the worker thread over `device`. `shared` is the number of completions that
    /// may wait for a paused worker on top of the credit windows of registered connections
    /// (`ring.descriptor_queue`; see the module docs).
    ///
    /// # Errors
    /// The OS refused to spawn a thread.
    pub fn start(
        device: Device,
        shared: usize,
        telemetry: Telemetry,
    ) -> std::io::Result<DataPlane> {
        let stop = Arc::new(AtomicBool::new(false));
        let (worker_tx, worker_rx) = mpsc::channel();
        let channel = match device.create_comp_channel() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "no completion channel: the worker polls every {FALLBACK_SLEEP:?} while idle");
                None
            }
        };
        let worker = Worker {
            device: device.clone(),
            rx: worker_rx,
            sessions: HashMap::new(),
            stop: stop.clone(),
            paused: false,
            scratch: Vec::new(),
            pending: Pending {
                queue: VecDeque::new(),
                shared: shared.max(2) as u64,
                shared_used: 0,
            },
            telemetry,
            device_drops: DropCounters::default(),
            channel: channel.clone(),
            wcs: vec![WorkCompletion::default(); POLL_BATCH],
        };
        let thread = std::thread::Builder::new()
            .name("uctel-worker".into())
            .spawn(move || worker.run())?;
        Ok(DataPlane {
            device,
            worker_tx,
            worker: thread.thread().clone(),
            channel,
            stop,
            thread: Mutex::new(Some(thread)),
            next_id: AtomicU64::new(1),
        })
    }

    /// The transport device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Hands `cmd` to the worker and wakes it.
    fn to_worker(&self, cmd: WorkerCmd) -> Result<(), mpsc::SendError<WorkerCmd>> {
        let sent = self.worker_tx.send(cmd);
        self.wake();
        sent
    }

    /// Wakes the worker from its completion-channel sleep (or its park without one).
    fn wake(&self) {
        if let Some(c) = &self.channel {
            c.wake();
        }
        self.worker.unpark();
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed) as u32
    }

    /// Hands a connected session to the worker, which polls its CQs from then on.
    pub fn register(&self, session: Arc<Session>, ingest: ConnectionIngest) {
        let _ = self.to_worker(WorkerCmd::Register(session, Box::new(ingest)));
    }

    /// The `Report` for the agent (computed by the worker, which owns the trackers).
    pub async fn report(&self, id: u32) -> Option<Report> {
        let (tx, rx) = oneshot::channel();
        self.to_worker(WorkerCmd::Report(id, tx)).ok()?;
        rx.await.ok().flatten()
    }

    /// Waits until the worker has consumed connection sequence `last` of session `id` (the
    /// last frame an agent's `Goodbye` names; `None`: it sent none) or a later one, for at
    /// most `within`. True when it did. On a loaded host the last UC frame, sent before the
    /// `Goodbye` on the control connection, can still be in the receive path (socket,
    /// completion queue) when the `Goodbye` arrives; settling then would count it lost.
    pub async fn wait_consumed(&self, id: u32, last: Option<u64>, within: Duration) -> bool {
        let Some(last) = last else { return true };
        let deadline = Instant::now() + within;
        loop {
            let (tx, rx) = oneshot::channel();
            if self.to_worker(WorkerCmd::Consumed(id, tx)).is_err() {
                return false;
            }
            let consumed = rx.await.ok().flatten();
            if consumed.is_some_and(|c| !Seq::new(last).is_after(Seq::new(c))) {
                return true;
            }
            if Instant::now() >= deadline || self.stop.load(Ordering::Acquire) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Hands the agent's heartbeat to the worker (in order with the frames before it): the
    /// sequences it carries settle the session if it ends without a `Goodbye`.
    pub fn heartbeat(&self, id: u32, heartbeat: Heartbeat) {
        let _ = self.to_worker(WorkerCmd::Heartbeat(id, Box::new(heartbeat)));
    }

    /// Removes a session: the worker polls its CQs a last time, processes every completion
    /// still waiting, settles tail loss from `goodbye` (if the agent said goodbye; from its
    /// last heartbeat otherwise) and forgets it. Returns the connection's accounting.
    pub async fn close(&self, id: u32, goodbye: Option<Goodbye>) -> Option<CloseSummary> {
        let (tx, rx) = oneshot::channel();
        self.to_worker(WorkerCmd::Close(id, goodbye, tx)).ok()?;
        rx.await.ok().flatten()
    }

    /// Test hook: pause (true) or resume (false) the worker's processing; it keeps polling
    /// the CQs and re-posting receive WRs, and the completions wait (`ring_slots_in_use`),
    /// so an agent ignoring its credits laps the ring. Never needed in production. Returns
    /// once the worker has applied it (at most after `PAUSE_APPLIED_WITHIN`, 10 s), so frames
    /// sent afterwards find it paused; frames received before are processed as usual.
    pub fn pause_worker(&self, paused: bool) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.to_worker(WorkerCmd::Pause(paused, tx)).is_ok() {
            let _ = rx.recv_timeout(PAUSE_APPLIED_WITHIN);
        }
    }

    /// Stops the worker and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One connection as the worker holds it.
struct WorkerSession {
    session: Arc<Session>,
    ingest: ConnectionIngest,
    /// The QP's silent-drop counters at the last fold.
    qp_drops: DropCounters,
    /// Its RC counters at the last fold (RC lane only).
    qp_rc: RcCounters,
    /// Its completions waiting in [`Pending`].
    pending: u64,
}

/// Completions waiting while the worker is paused, in the order they were polled.
struct Pending {
    queue: VecDeque<Descriptor>,
    /// Completions allowed beyond the connections' credit windows.
    shared: u64,
    /// Σ over connections of max(0, pending − window).
    shared_used: u64,
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

struct Worker {
    device: Device,
    rx: mpsc::Receiver<WorkerCmd>,
    sessions: HashMap<u32, WorkerSession>,
    stop: Arc<AtomicBool>,
    paused: bool,
    scratch: Vec<u8>,
    pending: Pending,
    telemetry: Telemetry,
    device_drops: DropCounters,
    /// Where the worker sleeps when every CQ is empty (`None`: it polls every
    /// [`FALLBACK_SLEEP`]).
    channel: Option<CompletionChannel>,
    wcs: Vec<WorkCompletion>,
}

impl Worker {
    fn run(mut self) {
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

    /// Drives a `driven` soft device (a no-op on other devices) before every
    /// [`DRIVE_EVERY_SESSIONS`] sessions and polls every session's CQs once; returns the
    /// packets the device moved and the completions taken.
    fn poll_all(&mut self) -> Round {
        let mut round = Round {
            packets: self.device.drive(),
            completions: 0,
        };
        let queue = self.paused || !self.pending.queue.is_empty();
        for (i, ws) in self.sessions.values_mut().enumerate() {
            if i > 0 && i % DRIVE_EVERY_SESSIONS == 0 {
                round.packets += self.device.drive();
            }
            round.completions += poll_one(
                ws,
                &mut self.wcs,
                &mut self.pending,
                &mut self.scratch,
                queue,
            );
        }
        round
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
        for ws in self.sessions.values() {
            for cq in [&ws.session.recv_cq, &ws.session.send_cq] {
                if let Err(e) = channel.req_notify(cq) {
                    failure = Some(e);
                }
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

    /// Folds every QP's and the device's drop counters and the async events, checks QP
    /// states, then settles each connection's missing frames whose reorder time ran out by
    /// `now` ([`ConnectionIngest::handle_timeout`], after the drops: see there). Returns
    /// whether a frame is still missing somewhere (a reorder-time deadline is pending).
    fn fold_stats(&mut self, now: Instant) -> bool {
        let count = |device: &str, ev: &_| self.telemetry.rdma_async_event(device, ev);
        for ev in crate::rdma_events::drain(&self.device, count) {
            for ws in self.sessions.values() {
                let s = &ws.session;
                let cqs = [s.recv_cq.handle(), s.send_cq.handle()];
                if crate::rdma_events::ends_connection(&ev, s.qp.qp_num(), cqs) {
                    s.mark_failed();
                }
            }
        }
        let mut pending = false;
        for ws in self.sessions.values_mut() {
            fold_qp_stats(ws);
            ws.ingest.handle_timeout(now);
            pending |= ws.ingest.poll_timeout().is_some();
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
                self.sessions.insert(
                    session.id,
                    WorkerSession {
                        session,
                        ingest: *ingest,
                        qp_drops: DropCounters::default(),
                        qp_rc: RcCounters::default(),
                        pending: 0,
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
                // Last poll of its CQs; what waits is processed, paused or not. A driven
                // device first takes what waits in the socket, a batch per round, until the
                // socket is empty (or CLOSE_DRIVES rounds: more than the credit budget).
                for _ in 0..CLOSE_DRIVES {
                    if let Some(ws) = self.sessions.get_mut(&id) {
                        while poll_one(
                            ws,
                            &mut self.wcs,
                            &mut self.pending,
                            &mut self.scratch,
                            true,
                        ) > 0
                        {}
                    }
                    if self.device.drive() == 0 {
                        break;
                    }
                }
                self.drain_pending();
                let summary = self.sessions.remove(&id).map(|mut ws| {
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
}

/// Polls one session's CQs once and processes each completion where it is found, or
/// queues it when `queue` (the worker is paused, or completions wait before it); returns
/// the completions taken.
fn poll_one(
    ws: &mut WorkerSession,
    wcs: &mut [WorkCompletion],
    pending: &mut Pending,
    scratch: &mut Vec<u8>,
    queue: bool,
) -> usize {
    let s = ws.session.clone();
    // Send CQ: the collector posts no sends; drain it so it can never overflow.
    let _ = s.send_cq.poll(wcs);
    let n = s.recv_cq.poll(wcs);
    if n == 0 {
        return 0;
    }
    // One clock read per poll: each completion of it was there by now.
    let now = Instant::now();
    let mut repost_zero = 0u32;
    for wc in wcs.iter().take(n) {
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
            continue;
        }
        let desc = match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                repost_zero += 1;
                match wc.imm {
                    Some(imm) => Descriptor::WriteImm { session: s.id, imm },
                    None => {
                        ws.ingest.drop_before_tracking(
                            DropReason::WcError,
                            1,
                            &"Write-with-immediate completion without immediate",
                        );
                        continue;
                    }
                }
            }
            WcOpcode::Recv => Descriptor::Send {
                session: s.id,
                len: wc.byte_len,
                // Buffers are numbered below `send_buffers` (≤ 65 536); anything else
                // fails the buffer read and is counted there.
                buf: u16::try_from(wc.wr_id).unwrap_or(u16::MAX),
            },
            WcOpcode::Send | WcOpcode::RdmaWrite => continue,
        };
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
    }
    if repost_zero > 0 {
        if let Err(e) = s.qp.post_recv(&ZERO_LENGTH_WRS[..repost_zero as usize]) {
            tracing::debug!(agent = %s.agent, error = %e, "re-posting receive WRs failed");
        }
    }
    n
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
