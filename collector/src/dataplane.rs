//! The receive data path (DESIGN.md §4): per agent connection a UC QP with its own registered
//! ring, one completion-poller thread and one worker thread for all connections, and a
//! lock-free SPSC queue (`ringbuf`) of descriptors between them.
//!
//! ```text
//!  NIC / soft device ──WC──► poller thread ──Descriptor──► SPSC (ringbuf) ──► worker thread
//!   (ring slot written,        re-posts zero-length          full = counted      copies slot or
//!    receive WR consumed)      receive WRs, counts           drop, never         buffer, validates,
//!                              transport drops, QP errors    blocks the poller   tracks, stores
//! ```
//!
//! * **Write-with-immediate**: the receive queue holds zero-length receive WRs; each
//!   completion carries the ImmDt (low 32 bits of the connection sequence); the poller
//!   re-posts a WR at once; the worker copies slot `c mod slots` and checks it
//!   ([`crate::ingest`]).
//! * **Send**: the receive queue holds `send_buffers` buffers of `max_frame_bytes`; the worker
//!   copies the buffer and re-posts it.
//! * The ring MR is registered LOCAL_WRITE | REMOTE_WRITE (never REMOTE_READ: the API cannot
//!   express it) with its own rkey.
//! * Every 100 ms (every second while no completion arrived since the last time) the
//!   poller folds the QP's silent-drop counters (UC responder rules) into
//!   `frames_dropped_total{reason}` and checks the QP state: a QP in ERROR is counted
//!   (`qp_errors_total`) and the control plane rebuilds the connection. The same fold takes
//!   the device's async events ([`crate::rdma_events`]): a `qp_fatal` or `cq_error` naming a
//!   connection's QP or CQ fails that connection at once.
//!
//! **Idle means asleep** (DESIGN.md §2). Both threads spin (polling, yielding the core) for
//! at most [`SPIN_AFTER_WORK`] after their last work, then block: the poller arms every CQ on
//! one [`CompletionChannel`] (`ibv_req_notify_cq`), polls them once more and sleeps in
//! [`CompletionChannel::wait`] until a completion arrives, the session list changes or the
//! next stats fold is due; the worker parks (`std::thread::park`) until the poller
//! has queued descriptors or a command arrives (every sender unparks it). A collector with
//! no traffic wakes only for the stats folds, once a second.
//!
//! **The descriptor queue cannot fill with frames sent within credits.** Each connection
//! reserves room for its credit window (the frames its agent may have outstanding, DESIGN.md
//! §4): the queue holds the sum of the windows of all registered connections plus
//! `ring.descriptor_queue` shared descriptors, and grows when a connection registers (a new,
//! larger ring buffer; the worker finishes the old one first, so order is kept). An agent
//! within its credits has at most its window of frames not yet consumed, hence at most that
//! many descriptors queued, so its descriptors always fit. Descriptors beyond a connection's
//! window (an agent ignoring credits) take shared room; when none is left they are dropped
//! and counted as `queue_full` for that agent, so one agent cannot take another's room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::HeapRb;
use tokio::sync::{oneshot, Notify};
use uctel_protocol::control::{DataPath, Goodbye, Heartbeat, Report};
use uctel_protocol::seq::Seq;
use uctel_transport::api::{
    AccessFlags, CompletionChannel, CompletionQueue, Device, DropCounters, MemoryRegion,
    QpEndpoint, QpState, QueuePair, RecvWr, Sge, UcDropReason, WcOpcode, WcStatus, WorkCompletion,
};

use crate::ingest::{CloseSummary, ConnectionIngest};
use crate::telemetry::{AgentTelemetry, DropReason, Telemetry};

/// How often the poller folds transport counters and checks QP states.
const STATS_EVERY: Duration = Duration::from_millis(100);
/// How often the poller folds them while no completion arrived since the last fold (an idle
/// collector wakes this often; silent drops without completions are counted this late).
const IDLE_STATS_EVERY: Duration = Duration::from_secs(1);
/// Completions polled per CQ per round.
const POLL_BATCH: usize = 64;
/// Descriptors popped per worker round.
const WORK_BATCH: usize = 64;
/// Growth of the descriptor queue beyond what it must hold (amortizes reallocation while
/// many agents connect): at least a quarter of its capacity.
const QUEUE_GROWTH_DIVISOR: usize = 4;
/// How long the poller and the worker keep polling (yielding the core between rounds)
/// after their last work before they block: a burst's next frames are taken without a
/// wake-up, and an idle collector sleeps.
pub const SPIN_AFTER_WORK: Duration = Duration::from_micros(50);
/// The poller's idle sleep when the device gave it no completion channel (it then polls).
const FALLBACK_SLEEP: Duration = Duration::from_millis(1);
/// The worker's longest park: a safety net only, every sender unparks it.
const WORKER_PARK: Duration = Duration::from_secs(1);

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

/// One agent connection's QP, CQs and memory, shared by the control task, the poller and the
/// worker.
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
    /// The UC QP.
    pub qp: QueuePair,
    recv_cq: CompletionQueue,
    send_cq: CompletionQueue,
    /// The ring (REMOTE_WRITE) the agent writes frames into.
    pub ring: MemoryRegion,
    bufs: MemoryRegion,
    tel: AgentTelemetry,
    /// Highest connection sequence the worker consumed, +1 (0 = none yet).
    consumed_plus_one: AtomicU64,
    /// Frames the poller dropped (queue full, error completions, transport drops) that the
    /// worker has not yet folded into the connection accounting.
    poller_dropped: AtomicU64,
    /// Descriptors queued and not yet processed.
    in_flight: AtomicI64,
    /// Set when the QP went to ERROR; `failed_notify` wakes the control task.
    failed: AtomicBool,
    /// Wakes the control task on failure.
    pub failed_notify: Notify,
}

impl Session {
    /// Creates the PD, CQs, ring MR, Send buffers and the UC QP, and fills the receive
    /// queue for `data_path`. The QP is left in INIT; [`Session::connect`] moves it to RTS.
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
        let qp = pd
            .create_qp(&uctel_transport::api::QpInitAttr {
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
            recv_cq,
            send_cq,
            ring,
            bufs,
            tel,
            consumed_plus_one: AtomicU64::new(0),
            poller_dropped: AtomicU64::new(0),
            in_flight: AtomicI64::new(0),
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

/// What the poller hands the worker: small and `Copy` (12 bytes: the queue holds one per
/// frame of every connection's credit window).
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
    /// A larger descriptor queue: read it once the current one is finished.
    Queue(ringbuf::HeapCons<Descriptor>),
    Report(u32, oneshot::Sender<Option<Report>>),
    /// The highest connection sequence consumed so far (no side effect).
    Consumed(u32, oneshot::Sender<Option<u64>>),
    /// The agent's heartbeat (the sequences it had sent by then).
    Heartbeat(u32, Heartbeat),
    Close(u32, Option<Goodbye>, oneshot::Sender<Option<CloseSummary>>),
    Pause(bool),
}

#[derive(Default)]
struct PollerList {
    sessions: Vec<Arc<Session>>,
    generation: u64,
    /// Descriptors reserved: the credit windows of registered connections.
    reserved: usize,
    /// Shared descriptors on top of the reservations (`ring.descriptor_queue`).
    shared: usize,
    /// Capacity of the newest descriptor queue.
    capacity: usize,
    /// The producer of a larger queue, for the poller to switch to.
    next_queue: Option<ringbuf::HeapProd<Descriptor>>,
}

/// The running poller and worker threads.
#[derive(Debug)]
pub struct DataPlane {
    device: Device,
    list: Arc<Mutex<PollerListDebug>>,
    poller_seen: Arc<AtomicU64>,
    worker_tx: mpsc::Sender<WorkerCmd>,
    /// Unparked after every command and by the poller after queuing descriptors.
    worker: Thread,
    /// Where the poller sleeps; woken when the session list changes and at stop.
    channel: Option<CompletionChannel>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
}

/// `PollerList` with a `Debug` that does not print sessions.
struct PollerListDebug(PollerList);

impl std::fmt::Debug for PollerListDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} sessions", self.0.sessions.len())
    }
}

impl std::fmt::Debug for WorkerCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkerCmd::Register(..) => "Register",
            WorkerCmd::Queue(..) => "Queue",
            WorkerCmd::Report(..) => "Report",
            WorkerCmd::Consumed(..) => "Consumed",
            WorkerCmd::Heartbeat(..) => "Heartbeat",
            WorkerCmd::Close(..) => "Close",
            WorkerCmd::Pause(..) => "Pause",
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DataPlane {
    /// Starts the poller and worker threads over `device`. `shared` is the number of
    /// descriptors the queue holds on top of the credit windows of registered connections
    /// (`ring.descriptor_queue`; see the module docs).
    ///
    /// # Errors
    /// The OS refused to spawn a thread.
    pub fn start(
        device: Device,
        shared: usize,
        telemetry: Telemetry,
    ) -> std::io::Result<DataPlane> {
        let shared = shared.max(2);
        let rb = HeapRb::<Descriptor>::new(shared);
        let (prod, cons) = rb.split();
        let list = Arc::new(Mutex::new(PollerListDebug(PollerList {
            shared,
            capacity: shared,
            ..PollerList::default()
        })));
        let shared_used = Arc::new(AtomicU64::new(0));
        let poller_seen = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (worker_tx, worker_rx) = mpsc::channel();
        let channel = match device.create_comp_channel() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "no completion channel: the poller polls every {FALLBACK_SLEEP:?} while idle");
                None
            }
        };
        let worker = Worker {
            queues: Queues(std::collections::VecDeque::from([cons])),
            shared_used: shared_used.clone(),
            rx: worker_rx,
            sessions: HashMap::new(),
            stop: stop.clone(),
            paused: false,
            scratch: Vec::new(),
        };
        let t2 = std::thread::Builder::new()
            .name("uctel-worker".into())
            .spawn(move || worker.run())?;
        let worker_thread = t2.thread().clone();
        let poller = Poller {
            device: device.clone(),
            list: list.clone(),
            seen: poller_seen.clone(),
            stop: stop.clone(),
            prod,
            shared: shared as u64,
            shared_used,
            telemetry,
            device_drops: DropCounters::default(),
            channel: channel.clone(),
            worker: worker_thread.clone(),
        };
        let t1 = match std::thread::Builder::new()
            .name("uctel-poller".into())
            .spawn(move || poller.run())
        {
            Ok(t) => t,
            Err(e) => {
                stop.store(true, Ordering::Release);
                worker_thread.unpark();
                let _ = t2.join();
                return Err(e);
            }
        };
        Ok(DataPlane {
            device,
            list,
            poller_seen,
            worker_tx,
            worker: worker_thread,
            channel,
            stop,
            threads: Mutex::new(vec![t1, t2]),
            next_id: AtomicU64::new(1),
        })
    }

    /// The transport device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Hands `cmd` to the worker and unparks it.
    fn to_worker(&self, cmd: WorkerCmd) -> Result<(), mpsc::SendError<WorkerCmd>> {
        let sent = self.worker_tx.send(cmd);
        self.worker.unpark();
        sent
    }

    /// Wakes the poller from its completion-channel sleep (the session list changed).
    fn wake_poller(&self) {
        if let Some(c) = &self.channel {
            c.wake();
        }
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed) as u32
    }

    /// Hands a connected session to the worker, then to the poller (in that order, so the
    /// worker knows the session before its first descriptor), reserving its credit window in
    /// the descriptor queue (a larger queue replaces the current one when needed).
    pub fn register(&self, session: Arc<Session>, ingest: ConnectionIngest) {
        let window = session.geometry.credit_window as usize;
        let _ = self.to_worker(WorkerCmd::Register(session.clone(), Box::new(ingest)));
        let mut l = lock(&self.list);
        l.0.reserved = l.0.reserved.saturating_add(window);
        let needed = l.0.reserved.saturating_add(l.0.shared);
        if needed > l.0.capacity {
            let capacity = needed.max(
                l.0.capacity
                    .saturating_add(l.0.capacity / QUEUE_GROWTH_DIVISOR),
            );
            let (prod, cons) = HeapRb::<Descriptor>::new(capacity).split();
            // The worker has the consumer before the poller can push (it takes the producer
            // under this lock); a producer replaced before the poller took it is dropped
            // unused, and the worker skips its empty queue.
            let _ = self.to_worker(WorkerCmd::Queue(cons));
            l.0.next_queue = Some(prod);
            l.0.capacity = capacity;
            tracing::debug!(
                capacity,
                reserved = l.0.reserved,
                "descriptor queue grown for the credit windows of connected agents"
            );
        }
        l.0.sessions.push(session);
        l.0.generation += 1;
        drop(l);
        self.wake_poller();
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
    /// completion queue, poller) when the `Goodbye` arrives; settling then would count it
    /// lost.
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
        let _ = self.to_worker(WorkerCmd::Heartbeat(id, heartbeat));
    }

    /// Removes a session: the poller polls its CQ a last time and forgets it, the worker
    /// processes everything queued, settles tail loss from `goodbye` (if the agent said
    /// goodbye; from its last heartbeat otherwise) and forgets it. Returns the connection's
    /// accounting.
    pub async fn close(&self, id: u32, goodbye: Option<Goodbye>) -> Option<CloseSummary> {
        let (target, window) = {
            let mut l = lock(&self.list);
            let window: usize =
                l.0.sessions
                    .iter()
                    .filter(|s| s.id == id)
                    .map(|s| s.geometry.credit_window as usize)
                    .sum();
            l.0.sessions.retain(|s| s.id != id);
            l.0.generation += 1;
            (l.0.generation, window)
        };
        self.wake_poller();
        // The reservation is released once the worker has drained the queue (below).
        let summary = self.close_session(id, goodbye, target).await;
        let mut l = lock(&self.list);
        l.0.reserved = l.0.reserved.saturating_sub(window);
        summary
    }

    async fn close_session(
        &self,
        id: u32,
        goodbye: Option<Goodbye>,
        target: u64,
    ) -> Option<CloseSummary> {
        // Wait for the poller to take the new list (it polls removed sessions a last time).
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.poller_seen.load(Ordering::Acquire) < target && Instant::now() < deadline {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (tx, rx) = oneshot::channel();
        self.to_worker(WorkerCmd::Close(id, goodbye, tx)).ok()?;
        rx.await.ok().flatten()
    }

    /// Test hook: pause (true) or resume (false) the worker, leaving the poller running, to
    /// provoke ring overruns. Never needed in production.
    pub fn pause_worker(&self, paused: bool) {
        let _ = self.to_worker(WorkerCmd::Pause(paused));
    }

    /// Stops both threads and waits for them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_poller();
        self.worker.unpark();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Poller {
    device: Device,
    list: Arc<Mutex<PollerListDebug>>,
    seen: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    prod: ringbuf::HeapProd<Descriptor>,
    /// Shared descriptors (beyond the credit windows) allowed in the queue.
    shared: u64,
    /// Shared descriptors in use: Σ over connections of max(0, in flight − window).
    shared_used: Arc<AtomicU64>,
    telemetry: Telemetry,
    device_drops: DropCounters,
    /// Where the poller sleeps when every CQ is empty (`None`: it polls every
    /// [`FALLBACK_SLEEP`]).
    channel: Option<CompletionChannel>,
    /// The worker, unparked after descriptors were queued.
    worker: Thread,
}

struct Polled {
    session: Arc<Session>,
    qp_drops: DropCounters,
}

impl Poller {
    fn run(mut self) {
        let mut sessions: Vec<Polled> = Vec::new();
        let mut generation = 0u64;
        let mut wcs = vec![WorkCompletion::default(); POLL_BATCH];
        let mut last_stats = Instant::now();
        let mut idle_since: Option<Instant> = None;
        let mut warned = false;
        // A completion arrived since the last stats fold.
        let mut active = false;
        while !self.stop.load(Ordering::Acquire) {
            let (current, g) = {
                let mut l = lock(&self.list);
                if l.0.generation != generation {
                    if let Some(prod) = l.0.next_queue.take() {
                        // Dropping the old producer tells the worker that queue is finished.
                        self.prod = prod;
                    }
                    (Some(l.0.sessions.clone()), l.0.generation)
                } else {
                    (None, generation)
                }
            };
            if let Some(current) = current {
                // Last poll of removed sessions, then forget them.
                let (keep, removed): (Vec<Polled>, Vec<Polled>) = sessions
                    .into_iter()
                    .partition(|p| current.iter().any(|s| s.id == p.session.id));
                for mut p in removed {
                    while self.poll_one(&mut p, &mut wcs) > 0 {}
                    self.fold_qp_stats(&mut p);
                }
                sessions = keep;
                for s in current {
                    if !sessions.iter().any(|p| p.session.id == s.id) {
                        sessions.push(Polled {
                            session: s,
                            qp_drops: DropCounters::default(),
                        });
                    }
                }
                generation = g;
                self.seen.store(generation, Ordering::Release);
            }
            let got = self.poll_all(&mut sessions, &mut wcs);
            active |= got > 0;
            let stats_every = if active {
                STATS_EVERY
            } else {
                IDLE_STATS_EVERY
            };
            if last_stats.elapsed() >= stats_every {
                last_stats = Instant::now();
                active = false;
                self.fold_async_events(&sessions);
                for p in &mut sessions {
                    self.fold_qp_stats(p);
                }
                self.fold_device_stats();
            }
            if got > 0 {
                idle_since = None;
                continue;
            }
            // Nothing this round: keep polling for a while after the last work, then sleep.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SPIN_AFTER_WORK {
                std::thread::yield_now();
                continue;
            }
            // A completion while asleep makes the next fold due after STATS_EVERY.
            let timeout = stats_every.saturating_sub(last_stats.elapsed());
            if !timeout.is_zero() {
                self.sleep(&mut sessions, &mut wcs, timeout, &mut warned);
            }
        }
    }

    /// Polls every session's CQs once; unparks the worker when descriptors were queued.
    fn poll_all(&mut self, sessions: &mut [Polled], wcs: &mut [WorkCompletion]) -> usize {
        let mut got = 0;
        for p in sessions.iter_mut() {
            got += self.poll_one(p, wcs);
        }
        if got > 0 {
            self.worker.unpark();
        }
        got
    }

    /// Arms every CQ on the completion channel, polls them once more (a completion that
    /// arrived before its CQ was armed raises no notification), and sleeps until a
    /// completion, a change of the session list, or `timeout`.
    fn sleep(
        &mut self,
        sessions: &mut [Polled],
        wcs: &mut [WorkCompletion],
        timeout: Duration,
        warned: &mut bool,
    ) {
        let Some(channel) = self.channel.clone() else {
            std::thread::sleep(FALLBACK_SLEEP.min(timeout));
            return;
        };
        let mut failure = None;
        for p in sessions.iter() {
            for cq in [&p.session.recv_cq, &p.session.send_cq] {
                if let Err(e) = channel.req_notify(cq) {
                    failure = Some(e);
                }
            }
        }
        if self.poll_all(sessions, wcs) > 0 {
            return;
        }
        let failure = match failure {
            Some(e) => Some(e),
            None => channel.wait(timeout).err(),
        };
        if let Some(e) = failure {
            if !*warned {
                tracing::warn!(error = %e, "completion channel failed; the poller polls every {FALLBACK_SLEEP:?} while idle");
                *warned = true;
            }
            std::thread::sleep(FALLBACK_SLEEP.min(timeout));
        }
    }

    /// Polls one session's CQs once; returns the completions handled.
    fn poll_one(&mut self, p: &mut Polled, wcs: &mut [WorkCompletion]) -> usize {
        let s = p.session.clone();
        // Send CQ: the collector posts no sends; drain it so it can never overflow.
        let _ = s.send_cq.poll(wcs);
        let n = s.recv_cq.poll(wcs);
        let mut repost_zero = 0usize;
        for wc in wcs.iter().take(n) {
            if wc.status != WcStatus::Success {
                if wc.status != WcStatus::WrFlushError {
                    s.poller_dropped.fetch_add(1, Ordering::AcqRel);
                    s.tel.drop_frames(
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
                            s.poller_dropped.fetch_add(1, Ordering::AcqRel);
                            s.tel.drop_frames(
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
                    // fails the worker's buffer read and is counted there.
                    buf: u16::try_from(wc.wr_id).unwrap_or(u16::MAX),
                },
                WcOpcode::Send | WcOpcode::RdmaWrite => continue,
            };
            // Within the connection's credit window the descriptor has reserved room; beyond
            // it, it needs shared room.
            let window = s.geometry.credit_window;
            let beyond_window = acquire_slot(&s.in_flight, window, &self.shared_used);
            let full = if beyond_window && self.shared_used.load(Ordering::Acquire) > self.shared {
                Some("no shared room left for descriptors beyond the agent's credit window")
            } else if self.prod.try_push(desc).is_err() {
                Some("descriptor queue full")
            } else {
                None
            };
            if let Some(why) = full {
                release_slot(&s.in_flight, window, &self.shared_used);
                s.poller_dropped.fetch_add(1, Ordering::AcqRel);
                s.tel.drop_frames(
                    DropReason::QueueFull,
                    1,
                    &format_args!(
                        "{why} (queue of {}, credit window {}, {} shared)",
                        self.prod.capacity(),
                        s.geometry.credit_window,
                        self.shared
                    ),
                );
                if let Descriptor::Send { buf, .. } = desc {
                    let _ = s.post_buffer(u64::from(buf));
                }
            } else {
                s.tel.ring_slots_in_use.inc();
            }
        }
        if repost_zero > 0 {
            let wrs: Vec<RecvWr<'_>> = (0..repost_zero).map(|_| RecvWr::zero_length(0)).collect();
            if let Err(e) = s.qp.post_recv(&wrs) {
                tracing::debug!(agent = %s.agent, error = %e, "re-posting receive WRs failed");
            }
        }
        n
    }

    fn fold_qp_stats(&mut self, p: &mut Polled) {
        let s = &p.session;
        let now = s.qp.stats().drops;
        for (reason, count) in now.iter() {
            let before = p.qp_drops.get(reason);
            if count > before {
                let delta = count - before;
                if reason != UcDropReason::QpError {
                    s.poller_dropped.fetch_add(delta, Ordering::AcqRel);
                }
                s.tel.drop_frames(
                    DropReason::Transport(reason),
                    delta,
                    &format_args!("UC responder on QP {:#x}", s.qp.qp_num()),
                );
            }
        }
        p.qp_drops = now;
        if s.qp.state() == QpState::Error {
            s.mark_failed();
        }
    }

    /// Counts the device's async events and fails the connections they name
    /// ([`crate::rdma_events`]).
    fn fold_async_events(&self, sessions: &[Polled]) {
        let count = |device: &str, ev: &_| self.telemetry.rdma_async_event(device, ev);
        for ev in crate::rdma_events::drain(&self.device, count) {
            for p in sessions {
                let s = &p.session;
                let cqs = [s.recv_cq.handle(), s.send_cq.handle()];
                if crate::rdma_events::ends_connection(&ev, s.qp.qp_num(), cqs) {
                    s.mark_failed();
                }
            }
        }
    }

    fn fold_device_stats(&mut self) {
        let now = self.device.stats().drops;
        for (reason, count) in now.iter() {
            let before = self.device_drops.get(reason);
            if count > before {
                self.telemetry
                    .transport_packets_dropped(reason, count - before);
            }
        }
        self.device_drops = now;
    }
}

struct WorkerSession {
    session: Arc<Session>,
    ingest: ConnectionIngest,
}

/// One more descriptor in flight for `s`; true when it is beyond the connection's credit
/// window (it then counts in `shared_used`). With [`release_slot`] this keeps
/// `shared_used == Σ max(0, in_flight − window)`: each call moves `in_flight` by one and
/// `shared_used` by exactly the change of that connection's term.
fn acquire_slot(in_flight: &AtomicI64, window: u32, shared_used: &AtomicU64) -> bool {
    let window = i64::from(window);
    let before = in_flight.fetch_add(1, Ordering::AcqRel);
    let beyond = before >= window;
    if beyond {
        shared_used.fetch_add(1, Ordering::AcqRel);
    }
    beyond
}

/// One descriptor of `s` less in flight (see [`acquire_slot`]).
fn release_slot(in_flight: &AtomicI64, window: u32, shared_used: &AtomicU64) {
    let window = i64::from(window);
    let before = in_flight.fetch_sub(1, Ordering::AcqRel);
    if before > window {
        shared_used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The worker's side of the descriptor queue: the current consumer and, after a growth,
/// the consumers of larger queues, read in order.
struct Queues(std::collections::VecDeque<ringbuf::HeapCons<Descriptor>>);

impl Queues {
    /// Pops up to `out.len()` descriptors, in the order the poller pushed them.
    fn pop_slice(&mut self, out: &mut [Descriptor]) -> usize {
        loop {
            let newer = self.0.len() > 1;
            let Some(front) = self.0.front_mut() else {
                return 0;
            };
            let n = front.pop_slice(out);
            if n > 0 || !newer || front.write_is_held() {
                return n;
            }
            // The poller moved on (it dropped this producer after its last push, which is
            // visible now): take what is left, then go to the next queue.
            let n = front.pop_slice(out);
            if n > 0 {
                return n;
            }
            self.0.pop_front();
        }
    }
}

struct Worker {
    queues: Queues,
    shared_used: Arc<AtomicU64>,
    rx: mpsc::Receiver<WorkerCmd>,
    sessions: HashMap<u32, WorkerSession>,
    stop: Arc<AtomicBool>,
    paused: bool,
    scratch: Vec<u8>,
}

impl Worker {
    fn run(mut self) {
        let mut batch = [Descriptor::WriteImm { session: 0, imm: 0 }; WORK_BATCH];
        let mut idle_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            while let Ok(cmd) = self.rx.try_recv() {
                self.command(cmd);
            }
            if self.paused {
                // Test hook: the resume command unparks.
                std::thread::park_timeout(WORKER_PARK);
                continue;
            }
            let n = self.queues.pop_slice(&mut batch);
            if n > 0 {
                for d in batch.iter().take(n) {
                    self.process(*d);
                }
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SPIN_AFTER_WORK {
                std::thread::yield_now();
                continue;
            }
            // Descriptors queued or a command sent after the checks above unpark us, also
            // before we get here (the unpark token is kept), so no wake-up is lost.
            std::thread::park_timeout(WORKER_PARK);
        }
    }

    fn drain(&mut self) {
        let mut batch = [Descriptor::WriteImm { session: 0, imm: 0 }; WORK_BATCH];
        loop {
            let n = self.queues.pop_slice(&mut batch);
            if n == 0 {
                return;
            }
            for d in batch.iter().take(n) {
                self.process(*d);
            }
        }
    }

    fn command(&mut self, cmd: WorkerCmd) {
        match cmd {
            WorkerCmd::Register(session, ingest) => {
                self.sessions.insert(
                    session.id,
                    WorkerSession {
                        session,
                        ingest: *ingest,
                    },
                );
            }
            WorkerCmd::Heartbeat(id, hb) => {
                if let Some(ws) = self.sessions.get_mut(&id) {
                    ws.ingest.on_heartbeat(&hb);
                }
            }
            WorkerCmd::Report(id, reply) => {
                let report = self.sessions.get_mut(&id).map(|ws| {
                    fold_poller_drops(ws);
                    ws.ingest.report()
                });
                let _ = reply.send(report);
            }
            WorkerCmd::Consumed(id, reply) => {
                let _ = reply.send(self.sessions.get(&id).and_then(|ws| ws.ingest.consumed()));
            }
            WorkerCmd::Close(id, goodbye, reply) => {
                self.drain();
                let summary = self.sessions.remove(&id).map(|mut ws| {
                    fold_poller_drops(&mut ws);
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
            WorkerCmd::Queue(cons) => self.queues.0.push_back(cons),
            WorkerCmd::Pause(p) => self.paused = p,
        }
    }

    fn process(&mut self, d: Descriptor) {
        let now = Instant::now();
        let Some(ws) = self.sessions.get_mut(&d.session()) else {
            // The poller only queues descriptors of registered sessions and the worker forgets
            // a session only after draining the queue, so this is unreachable in practice.
            tracing::debug!(session = d.session(), "descriptor of an unknown session");
            return;
        };
        release_slot(
            &ws.session.in_flight,
            ws.session.geometry.credit_window,
            &self.shared_used,
        );
        ws.session.tel.ring_slots_in_use.dec();
        fold_poller_drops(ws);
        let g = ws.session.geometry;
        match d {
            Descriptor::WriteImm { imm, .. } => {
                let conn_seq = ws.ingest.conn_seq_for_imm(imm);
                let slot = conn_seq % u64::from(g.slots.max(1));
                let len = g.slot_bytes as usize;
                self.scratch.resize(len, 0);
                if let Err(e) = ws
                    .session
                    .ring
                    .read_at(slot as usize * len, &mut self.scratch[..len])
                {
                    ws.ingest
                        .drop_before_tracking(DropReason::MalformedFrame, 1, &e);
                } else {
                    let _ = ws.ingest.on_slot(conn_seq, &self.scratch[..len], now);
                }
            }
            Descriptor::Send { buf, len, .. } => {
                let size = g.max_frame_bytes as usize;
                let len = (len as usize).min(size);
                self.scratch.resize(len, 0);
                let read = ws
                    .session
                    .bufs
                    .read_at(usize::from(buf) * size, &mut self.scratch[..len]);
                if let Err(e) = ws.session.post_buffer(u64::from(buf)) {
                    tracing::debug!(agent = %ws.session.agent, error = %e, "re-posting a receive buffer failed");
                }
                match read {
                    Ok(()) => {
                        let _ = ws.ingest.on_send(&self.scratch[..len], now);
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
}

fn fold_poller_drops(ws: &mut WorkerSession) {
    let n = ws.session.poller_dropped.swap(0, Ordering::AcqRel);
    if n > 0 {
        ws.ingest.note_dropped_before_tracking(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_is_twelve_bytes() {
        // The queue holds one per frame of every connection's credit window.
        assert_eq!(std::mem::size_of::<Descriptor>(), 12);
    }

    fn imm(i: u32) -> Descriptor {
        Descriptor::WriteImm { session: 1, imm: i }
    }

    fn pop_all(q: &mut Queues) -> Vec<u32> {
        let mut out = Vec::new();
        let mut batch = [imm(0); 3];
        loop {
            let n = q.pop_slice(&mut batch);
            if n == 0 {
                return out;
            }
            for d in batch.iter().take(n) {
                if let Descriptor::WriteImm { imm, .. } = d {
                    out.push(*imm);
                }
            }
        }
    }

    /// After a growth the worker reads the old queue to its end, skips a queue that was
    /// replaced before it was used, then reads the new one: the poller's order is kept.
    #[test]
    fn grown_queues_are_read_in_push_order() {
        let (mut p1, c1) = HeapRb::<Descriptor>::new(4).split();
        let (p2, c2) = HeapRb::<Descriptor>::new(8).split();
        let (mut p3, c3) = HeapRb::<Descriptor>::new(16).split();
        let mut q = Queues(std::collections::VecDeque::from([c1]));
        for i in 0..3 {
            p1.try_push(imm(i)).unwrap();
        }
        q.0.push_back(c2);
        q.0.push_back(c3);
        drop(p2); // replaced before the poller took it
        assert_eq!(pop_all(&mut q), vec![0, 1, 2]);
        // The poller still holds the first producer: the worker waits on that queue.
        p1.try_push(imm(3)).unwrap();
        p3.try_push(imm(5)).unwrap();
        assert_eq!(pop_all(&mut q), vec![3]);
        p1.try_push(imm(4)).unwrap();
        drop(p1);
        assert_eq!(pop_all(&mut q), vec![4, 5]);
        assert_eq!(q.0.len(), 1);
        p3.try_push(imm(6)).unwrap();
        assert_eq!(pop_all(&mut q), vec![6]);
    }

    proptest::proptest! {
        /// Any interleaving of descriptors queued and processed for two connections keeps
        /// the shared count at Σ max(0, in flight − window), and a connection within its
        /// window never touches it.
        #[test]
        fn shared_room_counts_only_descriptors_beyond_the_window(
            ops in proptest::collection::vec((0usize..2, proptest::bool::ANY), 0..200),
        ) {
            let windows = [3u32, 5];
            let in_flight = [AtomicI64::new(0), AtomicI64::new(0)];
            let shared = AtomicU64::new(0);
            for (c, add) in ops {
                let before = in_flight[c].load(Ordering::Acquire);
                if add {
                    let beyond = acquire_slot(&in_flight[c], windows[c], &shared);
                    proptest::prop_assert_eq!(beyond, before >= i64::from(windows[c]));
                } else if before > 0 {
                    release_slot(&in_flight[c], windows[c], &shared);
                }
                let expected: i64 = (0..2)
                    .map(|i| (in_flight[i].load(Ordering::Acquire) - i64::from(windows[i])).max(0))
                    .sum();
                proptest::prop_assert_eq!(shared.load(Ordering::Acquire) as i64, expected);
            }
        }
    }
}
