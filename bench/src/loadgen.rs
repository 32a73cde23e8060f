//! The load generator: `K` emulated agents, each a real agent as far as the collector can
//! tell.
//!
//! * **Control plane**: one TCP connection per agent with the real handshake
//!   ([`client_handshake`]: `Hello` → `Challenge` → HMAC `Proof` → `Welcome`), heartbeats,
//!   the collector's `Report`s taken as credits, and a `Goodbye` with the final sequences at
//!   the end so the collector settles tail loss. All connections run on one current-thread
//!   tokio runtime (thread `gen-control`).
//! * **Data plane**: one soft RoCEv2 UC QP per agent on soft devices of the transport crate
//!   (busy-poll mode, up to `qps_per_device` QPs sharing one UDP socket, as QPs of one host
//!   share UDP port 4791). Frames from the [`FrameTemplate`] are stamped per send and posted as
//!   RDMA WRITE_WITH_IMM to slot `conn_seq mod slots` of the agent's ring with the low 32 bits
//!   of `conn_seq` as the immediate (DESIGN.md §4), never more than the credit window ahead of
//!   the collector's consumed sequence. One thread (`gen-data`) posts for all agents
//!   round-robin, `post_batch` WRs per agent per turn.
//!
//! * **Series dictionary** (a [`FrameForm::MetricsDict`] template): each agent announces
//!   [`FEATURE_SERIES_DICTIONARY`] in its `Hello` as the agent does, insists on the
//!   collector's `Welcome` taking it, sends the template's prelude frames (its series with
//!   their definitions in band) until the collector's `DictAck` covers every series, then
//!   only the values-only steady-state frame: no frame references an entry the collector has
//!   not acknowledged. Every frame's header carries the stream's true cumulative record
//!   count, and the `Goodbye` the total.
//!
//! Differences from the real agent, on purpose: frames are re-headed from one template
//! instead of being framed from fresh samples (the agent's framing cost is measured separately
//! in the agent-cost run), and one thread drives all agents.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::TcpStream;
use tokio::sync::watch;
use uctel_common::control::{client_handshake, ControlChannel};
use uctel_protocol::control::{
    self as wire, Body, DataPath, Goodbye, GoodbyeReason, Heartbeat, Hello, StreamFinal, Transport,
    Welcome, FEATURE_SERIES_DICTIONARY,
};
use uctel_protocol::frame::conn_seq_immediate;
use uctel_transport::api::{
    AccessFlags, CompletionQueue, Device, MemoryRegion, QpEndpoint, QpInitAttr, QpType, QueuePair,
    SendWr, Sge, WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::udp::UdpConfig;

use crate::daemon::mtu_for;
use crate::workload::{FrameForm, FrameTemplate};

/// How the generator runs.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Emulated agents.
    pub agents: usize,
    /// The collector's control-plane address.
    pub control: SocketAddr,
    /// The pre-shared token.
    pub token: String,
    /// Frames to send.
    pub frame: Arc<FrameTemplate>,
    /// QPs per soft device (per UDP socket).
    pub qps_per_device: usize,
    /// Send queue depth and source buffers per agent.
    pub sq_depth: usize,
    /// WRs posted per agent per turn.
    pub post_batch: usize,
    /// Handshakes run concurrently.
    pub connect_parallelism: usize,
    /// `Some(gap)`: each agent sends at most one frame per `gap` (at least 1 ms), and frame
    /// `c` is stamped `start + c × gap`, so every series of an agent gets strictly
    /// increasing millisecond timestamps (the remote-write row). `None`: flat out, stamped
    /// with the send time.
    pub pace: Option<Duration>,
    /// `Hello.expected_frames_per_second` of every agent (the collector sizes rings from
    /// it); `None`: not announced, the collector's largest ring.
    pub expected_fps: Option<u32>,
    /// `Some(n)`: instead of sending flat out, `n` synchronized bursts: every agent posts its
    /// whole credit (window and grant) in one pass of the data thread, then nothing until
    /// every posted frame is reported consumed (or a second passed), then the next burst.
    pub bursts: Option<u32>,
    /// Offer credit writes into each agent's memory (`Hello.credit_mr`, DESIGN.md §4); the
    /// data thread reads an agent's credit word when it finds it out of credit.
    pub credit_writes: bool,
}

/// Why the generator could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A transport verb failed.
    #[error("{what}: {detail}")]
    Transport {
        /// Which step.
        what: &'static str,
        /// The transport's error.
        detail: String,
    },
    /// Agents could not connect.
    #[error("{failed} of {agents} agents failed the handshake; first error: {first}")]
    Handshake {
        /// Failed agents.
        failed: usize,
        /// All agents.
        agents: usize,
        /// The first error.
        first: String,
    },
    /// Runtime or thread setup failed.
    #[error("{0}")]
    Setup(String),
}

fn transport<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> LoadError {
    move |e| LoadError::Transport {
        what,
        detail: e.to_string(),
    }
}

/// Where an agent's frames go.
#[derive(Clone, Copy, Debug)]
struct Ring {
    addr: u64,
    rkey: u32,
    slots: u32,
    slot_bytes: u32,
    window: u32,
}

/// One emulated agent, shared by the control task and the data thread.
#[derive(Debug)]
struct Agent {
    id: String,
    epoch: u64,
    /// Index of the generator device the QP lives on (QPNs are unique per device only).
    device: usize,
    qp: QueuePair,
    src: MemoryRegion,
    ring: OnceLock<Ring>,
    /// Collector's consumed connection sequence + 1 (0 = nothing consumed yet).
    credit: AtomicU64,
    /// Next connection sequence to send (= frames posted so far).
    next: AtomicU64,
    /// Frames completed on the send CQ.
    completed: AtomicU64,
    /// Send completions with an error status.
    errors: AtomicU64,
    /// Reports received.
    reports: AtomicU64,
    /// The collector-wide budget's limit (first connection sequence not yet granted);
    /// `u64::MAX` until a grant arrives (a collector without grants).
    limit: AtomicU64,
    /// Sequence of the grant applied last (`u64::MAX`: none).
    grant: AtomicU64,
    /// The data thread found the limit reached since the last report.
    starved: AtomicBool,
    /// Wakes the control task to say so (an early heartbeat).
    starved_wake: tokio::sync::Notify,
    /// `Hello.expected_frames_per_second`.
    expected_fps: Option<u32>,
    /// The credit word region (REMOTE_WRITE), offered in `Hello` when `offer_writes`.
    credit_mr: MemoryRegion,
    offer_writes: bool,
    /// The collector agreed to write credit words (`Welcome.credit_writes`).
    writes: AtomicBool,
    /// Announce the series dictionary in `Hello` (a dictionary template).
    wants_dict: bool,
    /// The collector's `DictAck`: every series id below this is known.
    dict_known: AtomicU32,
    /// Records (samples) in the frames posted so far: the stream's cumulative count.
    records: AtomicU64,
}

impl Agent {
    /// Reads the credit word the collector wrote (DESIGN.md §4) and applies it: the consumed
    /// point and the grant, forward only.
    fn read_word(&self) {
        let mut b = [0u8; wire::CREDIT_WORD_BYTES];
        if self.credit_mr.read_at(0, &mut b).is_err() {
            return;
        }
        let Some(w) = wire::CreditWord::decode(&b).filter(|w| w.generation == self.epoch) else {
            return;
        };
        let before = self.credit.fetch_max(w.consumed_next, Ordering::AcqRel);
        let cur = self.grant.load(Ordering::Acquire);
        let newer = cur == u64::MAX || w.grant_sequence > cur;
        let _ = self.apply_grant(Some(w.grant()));
        if newer || w.consumed_next > before {
            self.starved.store(false, Ordering::Release);
        }
    }

    /// Applies a credit grant; true when it lowered the limit.
    fn apply_grant(&self, g: Option<wire::CreditGrant>) -> bool {
        let Some(g) = g else { return false };
        let cur = self.grant.load(Ordering::Acquire);
        if cur != u64::MAX && g.sequence <= cur {
            return false;
        }
        let old = self.limit.swap(g.limit, Ordering::AcqRel);
        self.grant.store(g.sequence, Ordering::Release);
        g.limit < old && old != u64::MAX
    }

    fn heartbeat(&self, sequence: u64, starved: bool) -> Heartbeat {
        let g = self.grant.load(Ordering::Acquire);
        Heartbeat {
            sequence,
            timestamp_ns: now_ns(),
            sent_conn_seq: self.next.load(Ordering::Acquire).checked_sub(1),
            credit_grant_applied: (g != u64::MAX).then_some(g),
            frames_without_credit: Some(u64::from(starved)),
            ..Heartbeat::default()
        }
    }
}

/// Counters of the data thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct DataStats {
    /// `post_send` calls that posted at least one WR.
    pub post_calls: u64,
    /// Turns in which no agent could post (all waiting for credits or completions).
    pub idle_rounds: u64,
    /// `post_send` refusals (send queue full).
    pub refused: u64,
    /// Synchronized bursts started (burst mode).
    pub bursts: u64,
}

/// Burst mode: quiet time after every frame of a burst was consumed, for the collector's
/// reports to hand out the next grants before the next burst.
const BURST_SETTLE: Duration = Duration::from_millis(300);

/// A running generator.
#[derive(Debug)]
pub struct LoadGen {
    agents: Arc<Vec<Arc<Agent>>>,
    devices: Arc<Vec<(Device, CompletionQueue)>>,
    // The agents' QPs need a receive CQ; nothing arrives on it.
    _recv_cqs: Vec<CompletionQueue>,
    frame: Arc<FrameTemplate>,
    sq_depth: usize,
    post_batch: usize,
    pace: Option<Duration>,
    bursts: Option<u32>,
    finish: watch::Sender<bool>,
    control: Option<JoinHandle<Vec<String>>>,
    data_stop: Arc<AtomicBool>,
    data: Option<JoinHandle<DataStats>>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl LoadGen {
    /// Creates the devices and QPs, runs every handshake, connects every QP, and returns
    /// with all agents connected (data not flowing yet: [`LoadGen::start_sending`]).
    ///
    /// # Errors
    /// [`LoadError`] when a resource cannot be created or any handshake fails.
    pub fn connect(cfg: &LoadConfig) -> Result<LoadGen, LoadError> {
        let per_device = cfg.qps_per_device.max(1);
        let n_devices = cfg.agents.div_ceil(per_device).max(1);
        let frame_len = cfg.frame.len();
        let sq = u32::try_from(cfg.sq_depth.clamp(1, 4096)).unwrap_or(64);
        let mut devices = Vec::with_capacity(n_devices);
        let mut pds = Vec::with_capacity(n_devices);
        let mut recv_cqs = Vec::with_capacity(n_devices);
        for d in 0..n_devices {
            let soft = SoftDevice::open(&SoftConfig {
                name: format!("gen{d}"),
                udp: UdpConfig {
                    // As the agent: sends with UDP_SEGMENT, no 64 KiB UDP_GRO slots.
                    recv_buffer_bytes: Some(256 << 10),
                    gro: false,
                    ..UdpConfig::bound_to(SocketAddr::from(([127, 0, 0, 1], 0)))
                },
                mtu_bytes: mtu_for(frame_len),
                progress: ProgressMode::BusyPoll,
                ..SoftConfig::default()
            })
            .map_err(transport("opening a generator soft device"))?;
            let dev = Device::from(soft);
            let depth = u32::try_from(per_device).unwrap_or(1).saturating_mul(sq) + 64;
            let send_cq = dev.create_cq(depth).map_err(transport("create_cq"))?;
            recv_cqs.push(dev.create_cq(16).map_err(transport("create_cq"))?);
            pds.push(dev.alloc_pd().map_err(transport("alloc_pd"))?);
            devices.push((dev, send_cq));
        }
        let mut agents = Vec::with_capacity(cfg.agents);
        for i in 0..cfg.agents {
            let d = i / per_device;
            let (_, send_cq) = &devices[d];
            let qp = pds[d]
                .create_qp(&QpInitAttr {
                    qp_type: QpType::Uc,
                    send_cq,
                    recv_cq: &recv_cqs[d],
                    max_send_wr: sq,
                    max_recv_wr: 1,
                    access: if cfg.credit_writes {
                        AccessFlags::REMOTE_WRITE
                    } else {
                        AccessFlags::NONE
                    },
                    max_mtu: None,
                })
                .map_err(transport("create_qp"))?;
            let src = pds[d]
                .reg_mr(frame_len * sq as usize, AccessFlags::LOCAL_WRITE)
                .map_err(transport("reg_mr"))?;
            let credit_mr = pds[d]
                .reg_mr(
                    wire::CREDIT_MR_BYTES as usize,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                )
                .map_err(transport("reg_mr credit word"))?;
            agents.push(Arc::new(Agent {
                id: format!("bench-{i:05}"),
                epoch: rand::random::<u64>() | 1,
                device: d,
                qp,
                src,
                ring: OnceLock::new(),
                credit: AtomicU64::new(0),
                next: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                reports: AtomicU64::new(0),
                limit: AtomicU64::new(u64::MAX),
                grant: AtomicU64::new(u64::MAX),
                starved: AtomicBool::new(false),
                starved_wake: tokio::sync::Notify::new(),
                expected_fps: cfg.expected_fps,
                credit_mr,
                offer_writes: cfg.credit_writes,
                writes: AtomicBool::new(false),
                wants_dict: cfg.frame.form() == FrameForm::MetricsDict,
                dict_known: AtomicU32::new(0),
                records: AtomicU64::new(0),
            }));
        }
        let agents = Arc::new(agents);
        let (finish, finish_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let control = {
            let agents = agents.clone();
            let addr = cfg.control;
            let token = cfg.token.clone();
            let parallel = cfg.connect_parallelism.max(1);
            std::thread::Builder::new()
                .name("gen-control".into())
                .spawn(move || control_thread(agents, addr, token, parallel, ready_tx, finish_rx))
                .map_err(|e| LoadError::Setup(e.to_string()))?
        };
        let mut failed = 0;
        let mut first = None;
        for _ in 0..cfg.agents {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failed += 1;
                    first.get_or_insert(e);
                }
                Err(_) => {
                    failed += 1;
                    first.get_or_insert("control thread ended".into());
                    break;
                }
            }
        }
        let gen = LoadGen {
            agents,
            devices: Arc::new(devices),
            _recv_cqs: recv_cqs,
            frame: cfg.frame.clone(),
            sq_depth: sq as usize,
            post_batch: cfg.post_batch.max(1),
            pace: cfg.pace,
            bursts: cfg.bursts,
            finish,
            control: Some(control),
            data_stop: Arc::new(AtomicBool::new(false)),
            data: None,
        };
        if failed > 0 {
            return Err(LoadError::Handshake {
                failed,
                agents: cfg.agents,
                first: first.unwrap_or_default(),
            });
        }
        Ok(gen)
    }

    /// The ring slots the collector gave each agent, by agent id.
    pub fn ring_slots(&self) -> std::collections::HashMap<String, u32> {
        self.agents
            .iter()
            .filter_map(|a| a.ring.get().map(|r| (a.id.clone(), r.slots)))
            .collect()
    }

    /// Agent ids, in order.
    pub fn agent_ids(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.id.clone()).collect()
    }

    /// Starts the data thread.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start_sending(&mut self) -> Result<(), LoadError> {
        let agents = self.agents.clone();
        let devices = self.devices.clone();
        let frame = self.frame.clone();
        let stop = self.data_stop.clone();
        let sq = self.sq_depth;
        let batch = self.post_batch;
        let pace = self.pace;
        let bursts = self.bursts;
        let h = std::thread::Builder::new()
            .name("gen-data".into())
            .spawn(move || {
                data_thread(
                    &agents,
                    &devices,
                    &frame,
                    Plan {
                        sq,
                        post_batch: batch,
                        pace,
                        bursts,
                    },
                    &stop,
                )
            })
            .map_err(|e| LoadError::Setup(e.to_string()))?;
        self.data = Some(h);
        Ok(())
    }

    /// Frames posted so far, per agent.
    pub fn sent(&self) -> Vec<u64> {
        self.agents
            .iter()
            .map(|a| a.next.load(Ordering::Acquire))
            .collect()
    }

    /// Records (samples) in the frames posted so far, all agents.
    pub fn records_sent(&self) -> u64 {
        self.agents
            .iter()
            .map(|a| a.records.load(Ordering::Acquire))
            .sum()
    }

    /// Agents whose whole series dictionary the collector acknowledged (those that send the
    /// values-only frame); every agent for a protobuf template.
    pub fn dict_acknowledged(&self) -> usize {
        let need = self.frame.dict_entries();
        self.agents
            .iter()
            .filter(|a| a.dict_known.load(Ordering::Acquire) >= need)
            .count()
    }

    /// Send completions with an error status, all agents.
    pub fn completion_errors(&self) -> u64 {
        self.agents
            .iter()
            .map(|a| a.errors.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops posting; returns the data thread's counters.
    pub fn stop_sending(&mut self) -> DataStats {
        self.data_stop.store(true, Ordering::Release);
        self.data
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    /// Waits until the collector's reports show every posted frame consumed, or `timeout`.
    /// Returns whether it did.
    pub fn wait_consumed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // Drive the devices so queued packets leave.
            let mut wcs = vec![WorkCompletion::default(); 64];
            for (_, cq) in self.devices.iter() {
                let _ = cq.poll(&mut wcs);
            }
            let done = self.agents.iter().all(|a| {
                let next = a.next.load(Ordering::Acquire);
                next == 0 || a.credit.load(Ordering::Acquire) >= next
            });
            if done {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends every agent's `Goodbye` (final connection and stream sequences) and closes the
    /// control connections. Returns the errors the control tasks met, if any.
    pub fn finish(mut self) -> Vec<String> {
        let _ = self.stop_sending();
        let _ = self.finish.send(true);
        self.control
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_else(|| vec!["control thread panicked".into()])
    }
}

impl Drop for LoadGen {
    fn drop(&mut self) {
        self.data_stop.store(true, Ordering::Release);
        let _ = self.finish.send(true);
        if let Some(h) = self.data.take() {
            let _ = h.join();
        }
        if let Some(h) = self.control.take() {
            let _ = h.join();
        }
    }
}

/// How the data thread posts: send queue depth, WRs per agent per turn, pacing, bursts.
#[derive(Clone, Copy, Debug)]
struct Plan {
    sq: usize,
    post_batch: usize,
    pace: Option<Duration>,
    bursts: Option<u32>,
}

fn data_thread(
    agents: &[Arc<Agent>],
    devices: &[(Device, CompletionQueue)],
    frame: &FrameTemplate,
    plan: Plan,
    stop: &AtomicBool,
) -> DataStats {
    let Plan {
        sq,
        post_batch,
        pace,
        bursts,
    } = plan;
    // Paced: frame c of every agent is due at `start + c × gap` and stamped with that time
    // (whole milliseconds, so every series' timestamps strictly increase).
    let gap_ns = pace.map(|g| {
        u64::try_from(g.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000)
    });
    let start_ns = now_ns() / 1_000_000 * 1_000_000;
    let mut stats = DataStats::default();
    let len = frame.len();
    let need_dict = frame.dict_entries();
    let mut scratch = vec![0u8; len];
    let mut wcs = vec![WorkCompletion::default(); 256];
    let qpn_to_agent: HashMap<(usize, u32), usize> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| ((a.device, a.qp.qp_num()), i))
        .collect();
    // Per-agent mirror of the atomics, owned by this thread.
    let mut next: Vec<u64> = vec![0; agents.len()];
    let mut completed: Vec<u64> = vec![0; agents.len()];
    let mut records: Vec<u64> = vec![0; agents.len()];
    let mut prelude_next: Vec<usize> = vec![0; agents.len()];
    // Burst mode: post everything every agent may send in one pass, then wait until all of
    // it is consumed and the grants have settled (BURST_SETTLE), then the next burst.
    let mut bursts_left = bursts.unwrap_or(0);
    let mut settled_since: Option<Instant> = Some(Instant::now());
    while !stop.load(Ordering::Acquire) {
        let now = now_ns();
        let mut posted_any = false;
        let burst_now = match bursts {
            None => true,
            Some(_) => {
                let all_consumed = agents
                    .iter()
                    .enumerate()
                    .all(|(i, a)| a.credit.load(Ordering::Acquire) >= next[i]);
                if !all_consumed {
                    settled_since = None;
                } else if settled_since.is_none() {
                    settled_since = Some(Instant::now());
                }
                bursts_left > 0 && settled_since.is_some_and(|t| t.elapsed() >= BURST_SETTLE)
            }
        };
        if bursts.is_some() && burst_now {
            bursts_left -= 1;
            settled_since = None;
            stats.bursts += 1;
        }
        for (i, a) in agents.iter().enumerate() {
            if !burst_now {
                break;
            }
            let Some(ring) = a.ring.get() else { continue };
            let credit_end = |a: &Agent| {
                (a.credit.load(Ordering::Acquire) + u64::from(ring.window))
                    .min(a.limit.load(Ordering::Acquire))
            };
            if credit_end(a) <= next[i] && a.writes.load(Ordering::Acquire) {
                a.read_word();
            }
            let limit = a.limit.load(Ordering::Acquire);
            let credit_end = credit_end(a);
            let room_sq = (sq as u64).saturating_sub(next[i] - completed[i]);
            let room_credit = credit_end.saturating_sub(next[i]);
            if room_credit == 0 && limit <= next[i] && !a.starved.swap(true, Ordering::AcqRel) {
                a.starved_wake.notify_one();
            }
            let mut n = room_sq.min(room_credit);
            if bursts.is_none() {
                n = n.min(post_batch as u64);
            }
            if let Some(gap) = gap_ns {
                let due = (now.saturating_sub(start_ns) / gap + 1).saturating_sub(next[i]);
                n = n.min(due);
            }
            if n == 0 {
                continue;
            }
            let mut wrs = Vec::with_capacity(n as usize);
            let mut wr_records: Vec<u32> = Vec::with_capacity(n as usize);
            let mut ok = true;
            // The values-only frame once every series is acknowledged; the prelude (values
            // with their definitions) until then.
            let steady = a.dict_known.load(Ordering::Acquire) >= need_dict;
            let mut before = records[i];
            for k in 0..n {
                let c = next[i] + k;
                let slot = (c % sq as u64) as usize;
                // The stream sequence equals the connection sequence: one stream per agent.
                let stamp = gap_ns.map_or(now, |gap| start_ns + c * gap);
                let piece = (!steady).then(|| {
                    prelude_next[i] += 1;
                    prelude_next[i] - 1
                });
                let written = frame.write_piece(&mut scratch, piece, a.epoch, c, c, before, stamp);
                let Some((flen, r)) = written
                    .ok()
                    .filter(|&(flen, _)| a.src.write_at(slot * len, &scratch[..flen]).is_ok())
                else {
                    ok = false;
                    break;
                };
                before += u64::from(r);
                wr_records.push(r);
                let remote = ring.addr + (c % u64::from(ring.slots)) * u64::from(ring.slot_bytes);
                wrs.push(SendWr::write_with_imm(
                    c,
                    Some(Sge::new(
                        &a.src,
                        slot * len,
                        u32::try_from(flen).unwrap_or(u32::MAX),
                    )),
                    remote,
                    ring.rkey,
                    conn_seq_immediate(c),
                ));
            }
            if !ok || wrs.is_empty() {
                continue;
            }
            let posted = match a.qp.post_send(&wrs) {
                Ok(()) => wrs.len() as u64,
                Err(e) => {
                    stats.refused += 1;
                    e.posted as u64
                }
            };
            if posted > 0 {
                let posted_records: u64 = wr_records
                    .iter()
                    .take(posted as usize)
                    .map(|&r| u64::from(r))
                    .sum();
                records[i] += posted_records;
                a.records.store(records[i], Ordering::Release);
                next[i] += posted;
                a.next.store(next[i], Ordering::Release);
                stats.post_calls += 1;
                posted_any = true;
            }
        }
        let mut reaped = 0;
        for (d, (_, cq)) in devices.iter().enumerate() {
            loop {
                let got = cq.poll(&mut wcs);
                for wc in wcs.iter().take(got) {
                    if let Some(&i) = qpn_to_agent.get(&(d, wc.qp_num)) {
                        completed[i] += 1;
                        if wc.status != WcStatus::Success {
                            agents[i].errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                reaped += got;
                if got < wcs.len() {
                    break;
                }
            }
        }
        for (i, a) in agents.iter().enumerate() {
            a.completed.store(completed[i], Ordering::Relaxed);
        }
        if !posted_any && reaped == 0 {
            stats.idle_rounds += 1;
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    stats
}

fn control_thread(
    agents: Arc<Vec<Arc<Agent>>>,
    addr: SocketAddr,
    token: String,
    parallel: usize,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
    finish: watch::Receiver<bool>,
) -> Vec<String> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            for _ in agents.iter() {
                let _ = ready.send(Err(format!("tokio runtime: {e}")));
            }
            return vec![e.to_string()];
        }
    };
    rt.block_on(async move {
        let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut tasks = tokio::task::JoinSet::new();
        for a in agents.iter() {
            let a = a.clone();
            let token = token.clone();
            let ready = ready.clone();
            let finish = finish.clone();
            let permits = permits.clone();
            tasks.spawn(async move {
                let ch = {
                    let _permit = permits.acquire().await;
                    connect_agent(&a, addr, &token).await
                };
                match ch {
                    Ok(ch) => {
                        let _ = ready.send(Ok(()));
                        session(&a, ch, finish).await
                    }
                    Err(e) => {
                        let _ = ready.send(Err(format!("{}: {e}", a.id)));
                        Err(e)
                    }
                }
            });
        }
        drop(ready);
        let mut errors = Vec::new();
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(e.to_string()),
            }
        }
        errors
    })
}

async fn connect_agent(
    a: &Agent,
    addr: SocketAddr,
    token: &str,
) -> Result<ControlChannel<TcpStream>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut ch = ControlChannel::new(stream);
    let ep = a.qp.local_endpoint();
    let hello = Hello {
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: a.id.clone(),
        hostname: format!("host-{}", a.id),
        epoch: a.epoch,
        transport: Transport::Soft as i32,
        rc_lane: None,
        capabilities: vec![DataPath::WriteWithImm as i32],
        qp: Some(wire::QpEndpoint {
            gid: ep.gid.to_vec(),
            qpn: ep.qpn,
            psn: ep.psn,
            mtu: ep.mtu,
            udp_addr: ep.udp_addr.map(|x| x.to_string()).unwrap_or_default(),
        }),
        expected_frames_per_second: a.expected_fps,
        credit_mr: a.offer_writes.then(|| wire::CreditMr {
            addr: a.credit_mr.addr(),
            rkey: a.credit_mr.rkey(),
            length: wire::CREDIT_MR_BYTES,
        }),
        // A dictionary template's agents announce the series dictionary, as the agent does.
        features: if a.wants_dict {
            FEATURE_SERIES_DICTIONARY
        } else {
            0
        },
    };
    let welcome = client_handshake(&mut ch, hello, token.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    if a.wants_dict && welcome.features & FEATURE_SERIES_DICTIONARY == 0 {
        return Err("the collector's Welcome did not take the series dictionary".into());
    }
    connect_qp(a, &welcome)?;
    Ok(ch)
}

fn connect_qp(a: &Agent, w: &Welcome) -> Result<(), String> {
    if w.data_path != DataPath::WriteWithImm as i32 {
        return Err(format!("collector chose data path {}", w.data_path));
    }
    let qp = w.qp.as_ref().ok_or("Welcome without a QP endpoint")?;
    let remote = QpEndpoint {
        gid: qp.gid_array().ok_or("GID is not 16 bytes")?,
        qpn: qp.qpn,
        psn: qp.psn,
        mtu: qp.mtu,
        udp_addr: qp.udp_socket_addr(),
    };
    a.qp.connect(&remote).map_err(|e| e.to_string())?;
    let _ = a.ring.set(Ring {
        addr: w.ring_addr,
        rkey: w.rkey,
        slots: w.slots.max(1),
        slot_bytes: w.slot_bytes,
        window: w.credit_window.max(1),
    });
    a.apply_grant(w.credit_grant);
    a.writes.store(w.credit_writes.is_some(), Ordering::Release);
    Ok(())
}

async fn session(
    a: &Agent,
    mut ch: ControlChannel<TcpStream>,
    mut finish: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut hb = tokio::time::interval(Duration::from_secs(1));
    hb.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            msg = ch.recv() => match msg {
                Ok(Some(m)) => match m.body {
                    Some(Body::Report(r)) => {
                        if r.conn_received > 0 {
                            a.credit.fetch_max(r.consumed_conn_seq.saturating_add(1), Ordering::AcqRel);
                        }
                        a.reports.fetch_add(1, Ordering::Relaxed);
                        let lowered = a.apply_grant(r.credit_grant);
                        a.starved.store(false, Ordering::Release);
                        if lowered {
                            // The collector counts the older limit until it hears this.
                            ch.send(a.heartbeat(seq, false))
                                .await
                                .map_err(|e| format!("{}: heartbeat: {e}", a.id))?;
                        }
                    }
                    Some(Body::DictAck(d)) if d.epoch == a.epoch && d.stream_id == 1 => {
                        a.dict_known.fetch_max(d.known_up_to, Ordering::AcqRel);
                    }
                    Some(Body::Goodbye(g)) => {
                        return Err(format!("{}: collector said goodbye: {}", a.id, g.detail));
                    }
                    _ => {}
                },
                Ok(None) => return Err(format!("{}: control connection closed", a.id)),
                Err(e) => return Err(format!("{}: {e}", a.id)),
            },
            _ = hb.tick() => {
                seq += 1;
                ch.send(a.heartbeat(seq, a.starved.load(Ordering::Acquire)))
                    .await
                    .map_err(|e| format!("{}: heartbeat: {e}", a.id))?;
            }
            () = a.starved_wake.notified() => {
                ch.send(a.heartbeat(seq, true))
                    .await
                    .map_err(|e| format!("{}: heartbeat: {e}", a.id))?;
            }
            changed = finish.changed() => {
                if changed.is_err() || *finish.borrow() {
                    break;
                }
            }
        }
    }
    let sent = a.next.load(Ordering::Acquire);
    let last = sent.checked_sub(1);
    let goodbye = Goodbye {
        final_conn_seq: last,
        rc_final_conn_seq: None,
        streams: vec![StreamFinal {
            stream_id: 1,
            final_stream_seq: last,
            final_record_count: a.records.load(Ordering::Acquire),
        }],
        reason: GoodbyeReason::Shutdown as i32,
        detail: "benchmark finished".into(),
    };
    ch.send(goodbye)
        .await
        .map_err(|e| format!("{}: goodbye: {e}", a.id))?;
    // Wait for the collector to close its side (it settles the tail first).
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = ch.recv().await {}
    })
    .await;
    ch.shutdown().await;
    Ok(())
}
