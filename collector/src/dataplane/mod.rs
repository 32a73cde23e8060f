//! The receive data path (DESIGN.md §4): per agent connection a UC QP with its own registered
//! ring, and one worker thread for all connections. All QPs complete into one shared CQ of
//! the worker and the Write-with-immediate QPs take their (zero-length) receive WRs from one
//! shared receive queue (DESIGN.md §6, issue 42), so a round costs what arrived, not how
//! many agents are connected: the worker polls one CQ, finds each completion's connection by
//! its QP number (`wc.qp_num`), and folds the QP counters only of the QPs the device lists as
//! changed ([`Device::take_changed_qps`]).
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
//!   it ([`crate::ingest`]). The WRs are the shared receive queue's ([`SharedQueues`]): it
//!   holds as many as the connections on it would hold in queues of their own (Σ of their
//!   `slots`), topped up after every round.
//! * **Send**: the QP's own receive queue holds `send_buffers` buffers of `max_frame_bytes`
//!   (in the connection's MR); the worker copies the buffer and re-posts it. RC lanes keep an
//!   own receive queue too (RNR flow control per lane). Both complete into the shared CQ.
//! * A connection takes room on the shared CQ for every receive WR it may complete; when
//!   the CQ has no room left (or the device refused a shared CQ), the connection gets CQs
//!   and a receive queue of its own and the worker polls them every round, as before. A
//!   device without SRQs, or one that refuses a UC QP on its SRQ (ibv_create_qp(3) allows
//!   an SRQ only on RC and UD; rxe and mlx5 accept UC, DESIGN.md §6), gets a receive queue
//!   per connection on the shared CQ (logged once). `connection_queues{queues}` and the
//!   `queues=` field of `agent connected` say which ([`QueueMode`]).
//! * The ring MR is registered LOCAL_WRITE | REMOTE_WRITE (never REMOTE_READ: the API cannot
//!   express it) with its own rkey.
//! * Every 100 ms (every second while no completion, and on a driven device no packet,
//!   arrived since the last time, and no frame is missing) the
//!   worker folds the silent-drop counters (UC responder rules) of the QPs the device lists
//!   as changed (all QPs on a device that cannot tell) into
//!   `frames_dropped_total{reason}` and checks the QP state: a QP in ERROR is counted
//!   (`qp_errors_total`) and the control plane rebuilds the connection. The same fold takes
//!   the device's async events ([`crate::rdma_events`]): a `qp_fatal` or `cq_error` naming a
//!   connection's QP or CQ fails that connection at once. Then it counts as lost the
//!   missing frames whose reorder time ran out (only connections that received a frame since
//!   the last fold or still miss one are visited) (`reorder_window_seconds`,
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
    QpEndpoint, QpType, QueuePair, RcAttr, RecvWr, Sge, WorkCompletion,
};

use crate::ingest::{CloseSummary, ConnectionIngest};
use crate::telemetry::{AgentTelemetry, RcLaneTelemetry, Telemetry};

mod queues;
mod worker;

pub use queues::{QueueMode, SharedQueues};
use worker::{Pending, Worker};

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
    /// What this connection took from the worker's shared queues (`None`: CQs and a receive
    /// queue of its own, polled every round).
    shared: Option<(Arc<SharedQueues>, queues::Reservation)>,
    /// Where its completions and receive WRs go, and its `connection_queues` gauge
    /// (incremented while the session lives).
    queue_mode: (QueueMode, prometheus::IntGauge),
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

impl Drop for Session {
    fn drop(&mut self) {
        if let Some((q, r)) = self.shared.take() {
            q.release(r);
        }
        self.queue_mode.1.dec();
    }
}

impl Session {
    /// Creates the CQs (or takes room on the worker's shared ones), ring MR, Send buffers
    /// and the QP (UC; RC with `rc`'s attributes for an agent's RC lane, whose counters `rc`
    /// also carries) on `plane`'s device, and fills the receive queue for `data_path` (a UC
    /// Write-with-immediate QP: the shared receive queue, see the module docs). The QP is
    /// left in INIT; [`Session::connect`] moves it to RTS. On RC a full receive queue is flow
    /// control, not loss: the responder answers RNR NAK and the agent's QP retries (IBTA
    /// 9.7.5.2.8).
    ///
    /// # Errors
    /// [`ResourceError`] naming the verb that failed.
    pub fn create(
        id: u32,
        agent: &str,
        plane: &DataPlane,
        data_path: DataPath,
        geometry: Geometry,
        tel: AgentTelemetry,
        rc: Option<(RcAttr, RcLaneTelemetry)>,
    ) -> Result<Session, ResourceError> {
        let device = &plane.device;
        let rq_depth = match data_path {
            DataPath::Send => geometry.send_buffers,
            _ => geometry.slots,
        }
        .clamp(1, 1 << 16);
        let wants_srq = data_path != DataPath::Send && rc.is_none();
        let mut shared = plane.queues.as_ref().and_then(|q| {
            q.reserve(u64::from(rq_depth), wants_srq)
                .map(|r| (Arc::clone(q), r))
        });
        let pd = match &plane.queues {
            Some(q) => q.pd.clone(),
            None => device.alloc_pd().map_err(verb("alloc_pd"))?,
        };
        let (recv_cq, send_cq) = match &shared {
            Some((q, _)) => (q.recv_cq.clone(), q.send_cq.clone()),
            None => (
                device
                    .create_cq(rq_depth.saturating_add(64))
                    .map_err(verb("create_cq recv"))?,
                device.create_cq(16).map_err(verb("create_cq send"))?,
            ),
        };
        let mut srq = shared
            .as_ref()
            .filter(|(_, r)| r.on_srq)
            .and_then(|(q, _)| q.srq.clone());
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
        let attr = uctel_transport::api::QpInitAttr {
            qp_type: rc
                .as_ref()
                .map_or(QpType::Uc, |(attr, _)| QpType::Rc(*attr)),
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            max_send_wr: 16,
            max_recv_wr: rq_depth,
            access: AccessFlags::REMOTE_WRITE,
            max_mtu: None,
        };
        let qp = match srq.as_ref().map(|q| pd.create_qp_with_srq(&attr, q)) {
            Some(Ok(qp)) => qp,
            Some(Err(e)) => {
                // ibv_create_qp(3) allows an SRQ only on RC and UD QPs; a provider that
                // enforces it refuses our UC QP: this and every later connection keep a
                // receive queue of their own (DESIGN.md §6).
                if let Some((q, r)) = &mut shared {
                    q.leave_srq(r, &e);
                }
                srq = None;
                pd.create_qp(&attr).map_err(verb("create_qp"))?
            }
            None => pd.create_qp(&attr).map_err(verb("create_qp"))?,
        };
        let mode = match &shared {
            Some((_, r)) if r.on_srq => QueueMode::SharedCqSrq,
            Some(_) => QueueMode::SharedCq,
            None => QueueMode::Own,
        };
        let queue_gauge = plane.telemetry.connection_queues(mode.as_str());
        queue_gauge.inc();
        let session = Session {
            id,
            agent: agent.to_string(),
            data_path,
            geometry,
            qp,
            rc: rc.map(|(_, t)| t),
            recv_cq,
            send_cq,
            shared,
            queue_mode: (mode, queue_gauge),
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
                match (&srq, &session.shared) {
                    (Some(srq), Some((q, _))) => {
                        let posted = srq.post_recv(&wrs);
                        let n = posted.as_ref().map_or_else(|e| e.posted, |()| wrs.len());
                        q.posted(n as u64);
                        posted.map_err(verb("post_srq_recv"))?;
                    }
                    _ => session.qp.post_recv(&wrs).map_err(verb("post_recv"))?,
                }
            }
        }
        Ok(session)
    }

    /// Whether the connection's completions go to the worker's shared CQ.
    fn on_shared_cq(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether the connection's QP takes its receive WRs from the shared receive queue.
    pub fn on_srq(&self) -> bool {
        self.shared.as_ref().is_some_and(|(_, r)| r.on_srq)
    }

    /// Where the connection's completions and receive WRs go.
    pub fn queue_mode(&self) -> QueueMode {
        self.queue_mode.0
    }

    /// The handle of the SRQ the QP takes its receive WRs from (`None`: its own queue).
    fn srq_handle(&self) -> Option<u32> {
        self.shared
            .as_ref()
            .filter(|(_, r)| r.on_srq)
            .and_then(|(q, _)| q.srq_handle())
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
    /// The worker's shared CQs and SRQ (`None`: each connection has queues of its own).
    queues: Option<Arc<SharedQueues>>,
    /// The collector's metrics (`connection_queues` of new sessions).
    telemetry: Telemetry,
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
        let queues = SharedQueues::open(&device).map(Arc::new);
        let worker = Worker {
            device: device.clone(),
            queues: queues.clone(),
            rx: worker_rx,
            sessions: HashMap::new(),
            by_qpn: HashMap::new(),
            own_cqs: Vec::new(),
            strays: Vec::new(),
            watch: Vec::new(),
            changed: Vec::new(),
            stop: stop.clone(),
            paused: false,
            scratch: Vec::new(),
            pending: Pending {
                queue: VecDeque::new(),
                shared: shared.max(2) as u64,
                shared_used: 0,
            },
            telemetry: telemetry.clone(),
            device_drops: DropCounters::default(),
            channel: channel.clone(),
            wcs: vec![WorkCompletion::default(); POLL_BATCH],
        };
        let thread = std::thread::Builder::new()
            .name("uctel-worker".into())
            .spawn(move || worker.run())?;
        Ok(DataPlane {
            device,
            queues,
            telemetry,
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

    /// The worker's shared CQs and SRQ (`None` when the device refused them).
    pub fn shared_queues(&self) -> Option<&SharedQueues> {
        self.queues.as_deref()
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

#[cfg(test)]
mod tests;
