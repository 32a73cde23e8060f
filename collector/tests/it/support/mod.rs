//! The collector's test double of an agent: a minimal test agent for the collector's
//! acceptance tests, with a real soft RoCEv2 UC device over loopback UDP (optionally with the
//! seeded fault injector), the protocol framer, and the control handshake of
//! `uctel_common::control`. It can misbehave on purpose (ignore credits, send bad frames)
//! where the tests need it. Also the collector configuration the tests start from, and the
//! harness pieces of `uctel-testkit` they use, re-exported under their old names.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::net::TcpStream;
use uctel_common::control::{client_handshake, ControlChannel, HandshakeError};
use uctel_protocol::control::{
    self as wire, Body, DataPath, Goodbye, GoodbyeReason, Heartbeat, Hello, StreamFinal, Transport,
    Welcome,
};
use uctel_protocol::framer::{BuiltFrame, Framer};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{Label, LogRecord, Metric, MetricType, Severity};
use uctel_transport::api::{
    AccessFlags, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpEndpoint, QpInitAttr,
    QpType, QueuePair, RcAttr, SendWr, Sge, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::fault::FaultConfig;
use uctel_transport::soft::udp::UdpConfig;

pub const TOKEN: &str = "test-token-0123456789";
/// Send buffers of the test agent (frames in flight on its side).
const SEND_SLOTS: u64 = 64;
/// Bound on every wait loop (the harness's one deadline).
pub use uctel_testkit::wait::DEADLINE;

/// A collector configuration on ephemeral loopback ports.
pub fn collector_config(dir: &Path) -> uctel_collector::config::Config {
    let text = format!(
        "\
listen:
  control: 127.0.0.1:0
  metrics: 127.0.0.1:0
transport:
  kind: soft
  soft:
    bind: 127.0.0.1:0
    mtu_bytes: 4096
ring:
  slots: 256
  slot_bytes: 4096
  credit_margin_slots: 64
  send_buffers: 256
  descriptor_queue: 4096
auth:
  shared:
    token: {TOKEN}
control:
  heartbeat_interval_seconds: 2
  report_interval_seconds: 0.02
  handshake_timeout_seconds: 5
logs:
  sink: file
  file:
    path: {}
",
        dir.join("logs.jsonl").display()
    );
    uctel_common::config::from_str("test.yaml", &text).expect("test config is valid")
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// How the test agent connects.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub agent_id: String,
    pub token: String,
    pub protocol_version: u32,
    pub capabilities: Vec<DataPath>,
    pub faults: Option<FaultConfig>,
    /// Send without waiting for credits (to lap the ring on purpose).
    pub ignore_credits: bool,
    /// Stream ids to put on an RC lane (DESIGN.md §8b); empty: no RC lane.
    pub rc_streams: Vec<u32>,
    /// Offer a credit word region at `Hello` (`Hello.credit_mr`, DESIGN.md §4): the
    /// collector then writes the agent's credit into it ([`TestAgent::credit_word`]).
    pub credit_mr: bool,
}

impl AgentOptions {
    pub fn new(agent_id: &str) -> Self {
        Self {
            agent_id: agent_id.to_string(),
            token: TOKEN.to_string(),
            protocol_version: wire::PROTOCOL_VERSION,
            capabilities: vec![DataPath::WriteWithImm, DataPath::Send],
            faults: None,
            ignore_credits: false,
            rc_streams: Vec::new(),
            credit_mr: false,
        }
    }
}

pub struct TestAgent {
    pub soft: SoftDevice,
    device: Device,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    ch: ControlChannel<TcpStream>,
    pub welcome: Welcome,
    pub epoch: u64,
    opts: AgentOptions,
    next_conn_seq: u64,
    posted: u64,
    completed: u64,
    consumed: Option<u64>,
    last_heartbeat: Instant,
    hb_seq: u64,
    pub reports: u64,
    /// The RC lane, when `AgentOptions::rc_streams` named streams.
    pub rc: Option<RcLaneSender>,
    /// The credit word region offered at `Hello` (`AgentOptions::credit_mr`).
    credit: Option<MemoryRegion>,
}

/// The test agent's RC lane: an RC QP on the agent's soft device with its own CQ, send
/// buffers, connection sequence and credits (`Welcome.rc_lane`, `Report.rc_lane`).
pub struct RcLaneSender {
    pub qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    pub lane: wire::RcLane,
    next_conn_seq: u64,
    posted: u64,
    completed: u64,
    consumed: Option<u64>,
}

impl RcLaneSender {
    /// Frames sent on the lane so far.
    pub fn conn_frames_sent(&self) -> u64 {
        self.next_conn_seq
    }

    fn poll(&mut self) {
        self.completed += drain_cq(&self.cq);
    }

    fn has_credit(&self) -> bool {
        let window = u64::from(self.lane.credit_window);
        match self.consumed {
            None => self.next_conn_seq < window,
            Some(c) => self.next_conn_seq <= c + window,
        }
    }
}

fn drain_cq(cq: &CompletionQueue) -> u64 {
    let mut wcs = [WorkCompletion::default(); 64];
    let mut total = 0;
    loop {
        let n = cq.poll(&mut wcs);
        total += n as u64;
        if n < wcs.len() {
            return total;
        }
    }
}

/// Where a lane's frames go on the collector (`Welcome` or `Welcome.rc_lane`).
#[derive(Clone, Copy)]
struct Ring {
    addr: u64,
    rkey: u32,
    slots: u32,
    slot_bytes: u32,
}

/// Writes `bytes` into send buffer `posted mod SEND_SLOTS` of the lane's MR and posts it on
/// its QP as the frame with connection sequence `c`: Write-with-immediate into slot
/// `c mod slots` of `ring`, or a Send. Returns the completions drained while the send queue
/// was full.
fn post_frame(
    (qp, cq, mr): (&QueuePair, &CompletionQueue, &MemoryRegion),
    posted: u64,
    data_path: DataPath,
    ring: Ring,
    c: u64,
    bytes: &[u8],
) -> u64 {
    let buf = (posted % SEND_SLOTS) as usize * 4096;
    mr.write_at(buf, bytes).expect("write send buffer");
    let sge = Sge::new(mr, buf, bytes.len() as u32);
    let wr = match data_path {
        DataPath::WriteWithImm => SendWr::write_with_imm(
            c,
            Some(sge),
            ring.addr + (c % u64::from(ring.slots)) * u64::from(ring.slot_bytes),
            ring.rkey,
            c as u32,
        ),
        _ => SendWr::send(c, Some(sge)),
    };
    let start = Instant::now();
    let mut completed = 0;
    loop {
        match qp.post_send(&[wr]) {
            Ok(()) => return completed,
            Err(e) if e.is_full() => {
                completed += drain_cq(cq);
                assert!(start.elapsed() < DEADLINE, "send queue stuck");
                std::thread::yield_now();
            }
            Err(e) => panic!("post_send: {e}"),
        }
    }
}

fn soft_device(faults: Option<FaultConfig>) -> SoftDevice {
    let config = SoftConfig {
        udp: UdpConfig::bound_to("127.0.0.1:0".parse().expect("addr")),
        progress: ProgressMode::BusyPoll,
        mtu_bytes: 4096,
        faults,
        ..SoftConfig::default()
    };
    SoftDevice::open(&config).expect("open the agent's soft device")
}

impl TestAgent {
    /// Connects and completes the handshake.
    pub async fn connect(
        control: SocketAddr,
        opts: AgentOptions,
    ) -> Result<TestAgent, HandshakeError> {
        let soft = soft_device(opts.faults.clone());
        let device = Device::from(soft.clone());
        let pd = device.alloc_pd().expect("pd");
        let cq = device.create_cq(1024).expect("cq");
        let mr = pd
            .reg_mr(SEND_SLOTS as usize * 4096, AccessFlags::LOCAL_WRITE)
            .expect("mr");
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Uc,
                send_cq: &cq,
                recv_cq: &cq,
                max_send_wr: SEND_SLOTS as u32,
                max_recv_wr: 1,
                // The collector's credit writes need REMOTE_WRITE on the QP.
                access: if opts.credit_mr {
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
                } else {
                    AccessFlags::LOCAL_WRITE
                },
                max_mtu: None,
            })
            .expect("qp");
        let credit = opts.credit_mr.then(|| {
            pd.reg_mr(
                wire::CREDIT_MR_BYTES as usize,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .expect("credit mr")
        });
        let ep: QpEndpoint = qp.local_endpoint();
        // The RC lane's QP, CQ and send buffers (its own: RC completions come with ACKs).
        let rc_parts = (!opts.rc_streams.is_empty()).then(|| {
            let cq = device.create_cq(1024).expect("rc cq");
            let mr = pd
                .reg_mr(SEND_SLOTS as usize * 4096, AccessFlags::LOCAL_WRITE)
                .expect("rc mr");
            let qp = pd
                .create_qp(&QpInitAttr {
                    qp_type: QpType::Rc(RcAttr::default()),
                    send_cq: &cq,
                    recv_cq: &cq,
                    max_send_wr: SEND_SLOTS as u32,
                    max_recv_wr: 1,
                    access: AccessFlags::LOCAL_WRITE,
                    max_mtu: None,
                })
                .expect("rc qp");
            (qp, cq, mr)
        });
        let wire_ep = |ep: QpEndpoint| wire::QpEndpoint {
            gid: ep.gid.to_vec(),
            qpn: ep.qpn,
            psn: ep.psn,
            mtu: ep.mtu,
            udp_addr: ep.udp_addr.map(|a| a.to_string()).unwrap_or_default(),
        };
        let rc_lane = rc_parts.as_ref().map(|(qp, ..)| wire::RcLaneRequest {
            qp: Some(wire_ep(qp.local_endpoint())),
            stream_ids: opts.rc_streams.clone(),
        });
        let epoch = rand::random::<u64>() | 1;
        let hello = Hello {
            protocol_version: opts.protocol_version,
            agent_id: opts.agent_id.clone(),
            hostname: format!("{}.test", opts.agent_id),
            epoch,
            transport: Transport::Soft as i32,
            capabilities: opts.capabilities.iter().map(|c| *c as i32).collect(),
            qp: Some(wire_ep(ep)),
            rc_lane,
            credit_mr: credit.as_ref().map(|mr| wire::CreditMr {
                addr: mr.addr(),
                rkey: mr.rkey(),
                length: wire::CREDIT_MR_BYTES,
            }),
            ..Default::default()
        };
        let stream = TcpStream::connect(control).await.expect("connect control");
        let mut ch = ControlChannel::new(stream);
        let welcome = client_handshake(&mut ch, hello, opts.token.as_bytes()).await?;
        let remote = |wq: &wire::QpEndpoint| QpEndpoint {
            gid: wq.gid_array().expect("gid"),
            qpn: wq.qpn,
            psn: wq.psn,
            mtu: wq.mtu,
            udp_addr: wq.udp_socket_addr(),
        };
        qp.connect(&remote(welcome.qp.as_ref().expect("welcome qp")))
            .expect("connect QP to the collector");
        let rc = rc_parts.map(|(qp, cq, mr)| {
            let lane = welcome
                .rc_lane
                .clone()
                .expect("Welcome carries the RC lane");
            qp.connect(&remote(lane.qp.as_ref().expect("rc lane qp")))
                .expect("connect the RC QP to the collector");
            RcLaneSender {
                qp,
                cq,
                mr,
                lane,
                next_conn_seq: 0,
                posted: 0,
                completed: 0,
                consumed: None,
            }
        });
        Ok(TestAgent {
            soft,
            device,
            _pd: pd,
            cq,
            qp,
            mr,
            ch,
            welcome,
            epoch,
            opts,
            next_conn_seq: 0,
            posted: 0,
            completed: 0,
            consumed: None,
            last_heartbeat: Instant::now(),
            hb_seq: 0,
            reports: 0,
            rc,
            credit,
        })
    }

    /// The credit word the collector wrote into the region offered at `Hello` (after
    /// receiving what arrived); `None` before the first write or without the region.
    pub fn credit_word(&self) -> Option<wire::CreditWord> {
        let mr = self.credit.as_ref()?;
        self.soft.progress();
        let mut bytes = [0u8; wire::CREDIT_WORD_BYTES];
        mr.read_at(0, &mut bytes).ok()?;
        wire::CreditWord::decode(&bytes).filter(|w| w.generation != 0)
    }

    pub fn data_path(&self) -> DataPath {
        DataPath::try_from(self.welcome.data_path).expect("data path")
    }

    /// Frames sent on the connection so far.
    pub fn conn_frames_sent(&self) -> u64 {
        self.next_conn_seq
    }

    fn poll_send_cq(&mut self) {
        self.completed += drain_cq(&self.cq);
    }

    /// Reads control messages that are already there (reports move credits), and sends a
    /// heartbeat when one is due.
    async fn service_control(&mut self, wait: Duration) {
        if self.last_heartbeat.elapsed() > Duration::from_millis(500) {
            self.hb_seq += 1;
            let _ = self
                .ch
                .send(Heartbeat {
                    sequence: self.hb_seq,
                    timestamp_ns: now_ns(),
                    ..Heartbeat::default()
                })
                .await;
            self.last_heartbeat = Instant::now();
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.ch.recv()).await {
                Ok(Ok(Some(m))) => {
                    if let Some(Body::Report(r)) = m.body {
                        self.reports += 1;
                        if r.conn_received > 0 {
                            self.consumed = Some(r.consumed_conn_seq);
                        }
                        if let (Some(rc), Some(l)) = (self.rc.as_mut(), r.rc_lane) {
                            rc.consumed = l.consumed_conn_seq.or(rc.consumed);
                        }
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => panic!("control connection lost"),
                Err(_) => return,
            }
        }
    }

    fn has_credit(&self) -> bool {
        if self.opts.ignore_credits {
            return true;
        }
        let window = u64::from(self.welcome.credit_window);
        match self.consumed {
            None => self.next_conn_seq < window,
            Some(c) => self.next_conn_seq <= c + window,
        }
    }

    /// Stamps `frame` with the next connection sequence and posts it (waiting for a credit
    /// and a free send buffer).
    pub async fn send(&mut self, frame: BuiltFrame) {
        let start = Instant::now();
        loop {
            self.poll_send_cq();
            if self.has_credit() && self.posted - self.completed < SEND_SLOTS {
                break;
            }
            assert!(start.elapsed() < DEADLINE, "no credit within {DEADLINE:?}");
            self.service_control(Duration::from_millis(2)).await;
        }
        let c = self.next_conn_seq;
        let bytes = frame.into_stamped(self.epoch, c);
        self.post_raw(c, &bytes);
        self.next_conn_seq += 1;
        if c % 64 == 0 {
            self.service_control(Duration::ZERO).await;
        }
    }

    /// Sends many frames, posting up to 32 WRs per `post_send` (one `sendmmsg` batch) while
    /// credits and send buffers allow.
    pub async fn send_many(&mut self, frames: Vec<BuiltFrame>) {
        let mut frames = frames.into_iter().peekable();
        let start = Instant::now();
        while frames.peek().is_some() {
            self.poll_send_cq();
            let window = if self.opts.ignore_credits {
                u64::MAX
            } else {
                let w = u64::from(self.welcome.credit_window);
                match self.consumed {
                    None => w.saturating_sub(self.next_conn_seq),
                    Some(c) => (c + w + 1).saturating_sub(self.next_conn_seq),
                }
            };
            let free = SEND_SLOTS - (self.posted - self.completed);
            let n = window.min(free).min(32);
            if n == 0 {
                assert!(start.elapsed() < DEADLINE, "no credit within {DEADLINE:?}");
                self.service_control(Duration::from_millis(1)).await;
                continue;
            }
            let mut stamped = Vec::new();
            for f in frames.by_ref().take(n as usize) {
                let c = self.next_conn_seq;
                self.next_conn_seq += 1;
                stamped.push((c, f.into_stamped(self.epoch, c)));
            }
            let mut offsets = Vec::with_capacity(stamped.len());
            for (i, (_, bytes)) in stamped.iter().enumerate() {
                let buf = ((self.posted + i as u64) % SEND_SLOTS) as usize * 4096;
                self.mr.write_at(buf, bytes).expect("write send buffer");
                offsets.push(buf);
            }
            let w = &self.welcome;
            let data_path = self.data_path();
            let mr = &self.mr;
            let wrs: Vec<SendWr<'_>> = stamped
                .iter()
                .zip(&offsets)
                .map(|((c, bytes), buf)| {
                    let sge = Sge::new(mr, *buf, bytes.len() as u32);
                    match data_path {
                        DataPath::WriteWithImm => {
                            let slot = c % u64::from(w.slots);
                            SendWr::write_with_imm(
                                *c,
                                Some(sge),
                                w.ring_addr + slot * u64::from(w.slot_bytes),
                                w.rkey,
                                *c as u32,
                            )
                        }
                        _ => SendWr::send(*c, Some(sge)),
                    }
                })
                .collect();
            let mut rest: &[SendWr<'_>] = &wrs;
            while !rest.is_empty() {
                match self.qp.post_send(rest) {
                    Ok(()) => rest = &[],
                    Err(e) if e.is_full() => {
                        rest = rest.get(e.posted..).unwrap_or(&[]);
                        self.completed += drain_cq(&self.cq);
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("post_send: {e}"),
                }
            }
            self.posted += wrs.len() as u64;
            self.service_control(Duration::ZERO).await;
        }
    }

    /// Posts raw bytes as the frame with connection sequence `c` (no stamping: tests use it
    /// for malformed frames). Does not advance the connection sequence.
    pub fn post_raw(&mut self, c: u64, bytes: &[u8]) {
        let w = &self.welcome;
        let ring = Ring {
            addr: w.ring_addr,
            rkey: w.rkey,
            slots: w.slots,
            slot_bytes: w.slot_bytes,
        };
        let data_path = self.data_path();
        self.completed += post_frame(
            (&self.qp, &self.cq, &self.mr),
            self.posted,
            data_path,
            ring,
            c,
            bytes,
        );
        self.posted += 1;
        self.poll_send_cq();
    }

    /// Stamps `frame` with the RC lane's next connection sequence and posts it there
    /// (waiting for the lane's credit and a free send buffer). Panics without an RC lane.
    pub async fn send_rc(&mut self, frame: BuiltFrame) {
        let start = Instant::now();
        loop {
            let rc = self.rc.as_mut().expect("an RC lane");
            rc.poll();
            if rc.has_credit() && rc.posted - rc.completed < SEND_SLOTS {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no RC credit within {DEADLINE:?}"
            );
            self.service_control(Duration::from_millis(2)).await;
        }
        let data_path = self.data_path();
        let epoch = self.epoch;
        let rc = self.rc.as_mut().expect("an RC lane");
        let c = rc.next_conn_seq;
        let bytes = frame.into_stamped(epoch, c);
        let ring = Ring {
            addr: rc.lane.ring_addr,
            rkey: rc.lane.rkey,
            slots: rc.lane.slots,
            slot_bytes: self.welcome.slot_bytes,
        };
        rc.completed += post_frame(
            (&rc.qp, &rc.cq, &rc.mr),
            rc.posted,
            data_path,
            ring,
            c,
            &bytes,
        );
        rc.posted += 1;
        rc.next_conn_seq += 1;
        rc.poll();
        if c % 64 == 0 {
            self.service_control(Duration::ZERO).await;
        }
    }

    /// Marks `n` raw frames as consuming connection sequences (after `post_raw`).
    pub fn advance_conn_seq(&mut self, n: u64) {
        self.next_conn_seq += n;
    }

    /// Waits until every posted WR is on the wire.
    /// On the RC lane that is every frame acknowledged (the busy-poll soft device runs the
    /// retransmit timer while it is polled).
    pub async fn flush(&mut self) {
        let start = Instant::now();
        let rc_pending =
            |rc: &Option<RcLaneSender>| rc.as_ref().is_some_and(|r| r.completed < r.posted);
        while self.completed < self.posted || rc_pending(&self.rc) {
            self.poll_send_cq();
            if let Some(rc) = self.rc.as_mut() {
                rc.poll();
            }
            assert!(start.elapsed() < DEADLINE, "send completions missing");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Sends one heartbeat and reads nothing (an agent that stopped reading its control
    /// connection). False once the write fails.
    pub async fn heartbeat_without_reading(&mut self) -> bool {
        self.hb_seq += 1;
        let beat = Heartbeat {
            sequence: self.hb_seq,
            timestamp_ns: now_ns(),
            ..Heartbeat::default()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), self.ch.send(beat)).await,
            Ok(Ok(()))
        )
    }

    /// Waits for at least one more Report.
    pub async fn wait_report(&mut self) {
        let seen = self.reports;
        let start = Instant::now();
        while self.reports == seen {
            assert!(start.elapsed() < DEADLINE, "no Report");
            self.service_control(Duration::from_millis(20)).await;
        }
    }

    /// Reads until the collector closes the connection; returns its `Goodbye`, if it sent one.
    pub async fn wait_closed(&mut self) -> Option<Goodbye> {
        let mut last = None;
        let start = Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_millis(100), self.ch.recv()).await {
                Ok(Ok(Some(m))) => {
                    if let Some(Body::Goodbye(g)) = m.body {
                        last = Some(g);
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => return last,
                Err(_) => {}
            }
            assert!(
                start.elapsed() < DEADLINE,
                "collector kept the connection open"
            );
        }
    }

    /// Sends `Goodbye` with the final sequences and closes.
    pub async fn goodbye(mut self, streams: Vec<StreamFinal>) {
        self.flush().await;
        let final_conn_seq = self.next_conn_seq.checked_sub(1);
        self.ch
            .send(Goodbye {
                rc_final_conn_seq: self
                    .rc
                    .as_ref()
                    .and_then(|r| r.next_conn_seq.checked_sub(1)),
                final_conn_seq,
                streams,
                reason: GoodbyeReason::Shutdown as i32,
                detail: "test done".into(),
            })
            .await
            .expect("send goodbye");
        // Wait for the collector to close the connection (it settles the tail first).
        let start = Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_millis(100), self.ch.recv()).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) | Ok(Err(_)) => break,
                Err(_) => {}
            }
            assert!(
                start.elapsed() < DEADLINE,
                "collector kept the connection open"
            );
        }
        let _ = &self.device;
    }
}

/// A metric stream: one gauge frame per step.
pub struct MetricStream {
    pub framer: Framer<Metric>,
}

impl MetricStream {
    pub fn new(stream_id: u32) -> Self {
        Self {
            framer: Framer::new(stream_id, 0, Limits::default()).expect("framer"),
        }
    }

    /// One frame with `n` samples: `test_value{stream,series}` gauges and a counter.
    pub fn frame(&mut self, step: u64, n: usize) -> BuiltFrame {
        let stream = self.framer.stream_id().to_string();
        for i in 0..n {
            let m = Metric {
                name: "uctel_test_value".into(),
                help: "A test gauge.".into(),
                r#type: MetricType::Gauge as i32,
                labels: vec![
                    Label {
                        name: "stream".into(),
                        value: stream.clone(),
                    },
                    Label {
                        name: "series".into(),
                        value: i.to_string(),
                    },
                ],
                value: step as f64,
                ..Default::default()
            };
            let _ = self.framer.push(&m, now_ns());
        }
        self.framer.flush().expect("a frame")
    }

    pub fn final_state(&self) -> StreamFinal {
        StreamFinal {
            stream_id: self.framer.stream_id(),
            final_stream_seq: self.framer.next_stream_seq().checked_sub(1),
            final_record_count: self.framer.record_count(),
        }
    }
}

/// A log stream: one frame of `n` records per step.
pub struct LogStream {
    pub framer: Framer<LogRecord>,
}

impl LogStream {
    pub fn new(stream_id: u32) -> Self {
        Self {
            framer: Framer::new(stream_id, 0, Limits::default()).expect("framer"),
        }
    }

    pub fn frame(&mut self, step: u64, n: usize) -> BuiltFrame {
        for i in 0..n {
            let r = LogRecord {
                timestamp_ns: now_ns(),
                severity: Severity::Info as i32,
                source: "/var/log/test.log".into(),
                message: format!("line {step}.{i}"),
                ..Default::default()
            };
            let _ = self.framer.push(&r, now_ns());
        }
        self.framer.flush().expect("a frame")
    }

    pub fn final_state(&self) -> StreamFinal {
        StreamFinal {
            stream_id: self.framer.stream_id(),
            final_stream_seq: self.framer.next_stream_seq().checked_sub(1),
            final_record_count: self.framer.record_count(),
        }
    }
}

// The one wait, exposition parser, HTTP GET and promtool of the workspace (each test file
// uses some of them).
#[allow(unused_imports)]
pub use uctel_testkit::{exposition::sample, http::http_get, promtool::promtool, wait::eventually};
