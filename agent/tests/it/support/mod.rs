//! A minimal in-process collector for the agent's session tests, built from the same
//! pieces as the real one (control framing and proof of `uctel_protocol::control`, the soft
//! transport, `decode_frame`): it authenticates, registers a ring, posts receive buffers,
//! decodes every frame that arrives, reports consumed sequences and records the `Goodbye`.
//! It checks the wire rules the agent must follow (slot = conn_seq mod slots, immediate =
//! low 32 bits of conn_seq, CRC, epoch) and counts violations instead of hiding them.
//!
//! When the agent's `Hello` asks for an RC lane (DESIGN.md §8b) and `offer_rc_lane` is set,
//! it also creates an RC QP with a ring and receive buffers of its own, offers it in
//! `Welcome.rc_lane`, keeps the lane's frames apart (`Session::rc_frames`) and reports the
//! lane's consumed sequence in `Report.rc_lane`.

#![allow(dead_code)]

pub mod capture;

/// An agent configuration for the session tests, against the collector at `control`: host
/// and self metrics every 0.2 s, the log files `dir/*.log` from the beginning, state in
/// `dir/state`, fast reconnects, then `streams` (the body of the `streams:` section, keys
/// indented by two spaces) and `extra` (more top-level YAML).
pub fn agent_config(
    control: SocketAddr,
    dir: &std::path::Path,
    streams: &str,
    extra: &str,
) -> uctel_agent::config::AgentConfig {
    let text = format!(
        "\
agent_id: test-agent
collector:
  control: {control}
  reconnect_initial_seconds: 0.05
  reconnect_max_seconds: 0.2
auth:
  token: test-token
sources:
  host_metrics:
    interval_seconds: 0.2
  self_metrics:
    interval_seconds: 0.2
  logs:
    - path: {dir}/*.log
      start_at: beginning
      poll_interval_seconds: 0.02
      glob_interval_seconds: 0.05
  state_directory: {dir}/state
streams:
{streams}{extra}",
        dir = dir.display()
    );
    uctel_agent::config::AgentConfig::from_yaml("test.yaml", &text)
        .unwrap_or_else(|e| panic!("{e}"))
}

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use uctel_agent::control::ControlConn;
use uctel_protocol::control::{
    self, Body, Challenge, Goodbye, Heartbeat, Hello, LaneReport, Refuse, RefuseReason, Report,
    StreamReport, Welcome,
};
use uctel_protocol::frame::{decode_frame, DecodedFrame, Payload};
use uctel_protocol::limits::Limits;
use uctel_transport::api::{
    AccessFlags, CompletionQueue, Device, MemoryRegion, QpInitAttr, QpType, QueuePair, RcAttr,
    RecvWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use uctel_transport::device::DeviceConfig;
use uctel_transport::soft::device::SoftConfig;
use uctel_transport::soft::udp::UdpConfig;

/// How the fake collector behaves.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub token: Vec<u8>,
    /// Power of two, so `imm mod slots == conn_seq mod slots`.
    pub slots: u32,
    pub slot_bytes: u32,
    pub credit_window: u32,
    pub recv_buffers: u32,
    pub report_interval: Duration,
    pub heartbeat_interval_ms: u32,
    /// Send no Reports at all (credits never come back).
    pub silent: bool,
    /// Refuse this many connections (bad proof) before accepting.
    pub refuse_first: u32,
    /// Say Goodbye after this many frames on the first welcomed connection.
    pub goodbye_after_frames: Option<u64>,
    /// The data path chosen in `Welcome`.
    pub data_path: control::DataPath,
    /// Path MTU of the collector's QP, bytes.
    pub mtu_bytes: u32,
    /// Offer an RC lane when the agent asks for one (a collector that supports it).
    pub offer_rc_lane: bool,
    /// Move the RC lane's QP to ERROR once this many frames arrived on it (the collector's
    /// side of the lane dies: the agent's retransmissions go unanswered).
    pub kill_rc_lane_after_frames: Option<u64>,
    /// Answer every heartbeat that names frames without credit (the agent asking for
    /// credit) with a `Report` at once, as the real collector answers it with an early one
    /// (`Session::asks_answered`).
    pub answer_credit_asks: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            token: b"test-token".to_vec(),
            slots: 256,
            slot_bytes: 4096,
            credit_window: 192,
            recv_buffers: 256,
            report_interval: Duration::from_millis(50),
            heartbeat_interval_ms: 1000,
            silent: false,
            refuse_first: 0,
            goodbye_after_frames: None,
            data_path: control::DataPath::WriteWithImm,
            mtu_bytes: 4096,
            offer_rc_lane: true,
            kill_rc_lane_after_frames: None,
            answer_credit_asks: false,
        }
    }
}

/// What one connection delivered.
#[derive(Debug, Default)]
pub struct Session {
    pub hello: Option<Hello>,
    pub refused: bool,
    pub frames: Vec<(WcOpcode, DecodedFrame)>,
    /// Frames that arrived on the RC lane's QP.
    pub rc_frames: Vec<(WcOpcode, DecodedFrame)>,
    /// The RC lane offered in `Welcome`.
    pub rc_offered: bool,
    /// Frames whose slot, immediate, CRC or epoch broke a rule.
    pub violations: Vec<String>,
    pub goodbye: Option<Goodbye>,
    pub we_said_goodbye: bool,
    pub heartbeats: u64,
    /// The last heartbeat the agent sent.
    pub last_heartbeat: Option<Heartbeat>,
    /// Reports sent at the report interval.
    pub interval_reports: u64,
    /// Reports sent to answer a heartbeat asking for credit (`answer_credit_asks`).
    pub asks_answered: u64,
}

impl Session {
    /// The messages of the log records in the session's frames, in the order the frames
    /// arrived.
    pub fn log_messages(&self) -> Vec<String> {
        log_messages(self.frames.iter().map(|(_, f)| f))
    }

    pub fn records(&self, stream_id: u32) -> u64 {
        self.frames
            .iter()
            .filter(|(_, f)| f.header.stream_id == stream_id)
            .map(|(_, f)| f.payload.record_count() as u64)
            .sum()
    }
}

pub struct FakeCollector {
    pub addr: SocketAddr,
    pub sessions: mpsc::UnboundedReceiver<Session>,
}

impl FakeCollector {
    /// The next connection to end (waits for it); panics when the collector stopped.
    pub async fn session(&mut self) -> Session {
        self.sessions
            .recv()
            .await
            .unwrap_or_else(|| panic!("no session"))
    }
}

/// The messages of the log records in `frames`, in the order given.
pub fn log_messages<'a>(frames: impl IntoIterator<Item = &'a DecodedFrame>) -> Vec<String> {
    frames
        .into_iter()
        .filter_map(|f| match &f.payload {
            Payload::Logs(b) => Some(b.records.iter().map(|r| r.message.clone())),
            _ => None,
        })
        .flatten()
        .collect()
}

pub async fn start(cfg: FakeConfig) -> FakeCollector {
    start_on("127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")), cfg).await
}

pub async fn start_on(addr: SocketAddr, cfg: FakeConfig) -> FakeCollector {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let refuse = n < cfg.refuse_first;
            let goodbye = if n == cfg.refuse_first {
                cfg.goodbye_after_frames
            } else {
                None
            };
            n += 1;
            let s = serve(ControlConn::new(stream), &cfg, refuse, goodbye).await;
            if tx.send(s).is_err() {
                return;
            }
        }
    });
    FakeCollector { addr, sessions: rx }
}

async fn serve(
    mut conn: ControlConn,
    cfg: &FakeConfig,
    refuse: bool,
    goodbye_after: Option<u64>,
) -> Session {
    let mut s = Session::default();
    let Ok(msg) = conn.recv().await else { return s };
    let Some(Body::Hello(hello)) = msg.body else {
        return s;
    };
    s.hello = Some(hello.clone());
    let nonce = [7u8; control::NONCE_BYTES];
    if conn
        .send(Challenge {
            nonce: nonce.to_vec(),
            collector_id: "fake".into(),
        })
        .await
        .is_err()
    {
        return s;
    }
    let Ok(msg) = conn.recv().await else { return s };
    let Some(Body::Proof(proof)) = msg.body else {
        return s;
    };
    let ok = control::verify_proof(
        &cfg.token,
        &nonce,
        &hello.agent_id,
        hello.epoch,
        &proof.hmac,
    );
    if !ok || refuse {
        s.refused = true;
        let _ = conn
            .send(Refuse {
                reason: RefuseReason::BadProof as i32,
                detail: "test refusal".into(),
            })
            .await;
        return s;
    }

    // Data plane: soft device, ring, receive buffers, QP connected to the agent's; an RC
    // lane likewise when asked for and offered.
    let dev = Device::open(&DeviceConfig::Soft(SoftConfig {
        name: "fake-collector".into(),
        udp: UdpConfig {
            bind: "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
            ..UdpConfig::default()
        },
        mtu_bytes: cfg.mtu_bytes,
        ..SoftConfig::default()
    }))
    .unwrap_or_else(|e| panic!("open: {e}"));
    let Some(mut uc) = Lane::new(&dev, cfg, QpType::Uc, hello.qp.as_ref()) else {
        return s;
    };
    let mut rc = match &hello.rc_lane {
        Some(l) if cfg.offer_rc_lane => {
            let Some(lane) = Lane::new(&dev, cfg, QpType::Rc(RcAttr::default()), l.qp.as_ref())
            else {
                return s;
            };
            Some(lane)
        }
        _ => None,
    };
    s.rc_offered = rc.is_some();
    let welcome = Welcome {
        qp: Some(uc.endpoint()),
        ring_addr: uc.ring.addr(),
        rkey: uc.ring.rkey(),
        slots: cfg.slots,
        slot_bytes: cfg.slot_bytes,
        max_frame_bytes: cfg.slot_bytes,
        credit_window: cfg.credit_window,
        heartbeat_interval_ms: cfg.heartbeat_interval_ms,
        report_interval_ms: cfg.report_interval.as_millis() as u32,
        data_path: cfg.data_path as i32,
        rc_lane: rc.as_ref().map(|l| control::RcLane {
            qp: Some(l.endpoint()),
            ring_addr: l.ring.addr(),
            rkey: l.ring.rkey(),
            slots: cfg.slots,
            credit_window: cfg.credit_window,
        }),
        ..Default::default()
    };
    if conn.send(welcome).await.is_err() {
        return s;
    }

    let limits = Limits {
        max_frame_bytes: cfg.slot_bytes as usize,
        ..Limits::default()
    };
    let epoch = hello.epoch;
    let mut report_tick = tokio::time::interval(cfg.report_interval);
    loop {
        uc.poll(cfg, &limits, epoch, &mut s.violations);
        if let Some(l) = rc.as_mut() {
            l.poll(cfg, &limits, epoch, &mut s.violations);
            if cfg
                .kill_rc_lane_after_frames
                .is_some_and(|n| l.frames.len() as u64 >= n)
            {
                l.qp.modify_to_error();
            }
        }
        if let Some(limit) = goodbye_after {
            if (uc.frames.len() + rc.as_ref().map_or(0, |l| l.frames.len())) as u64 >= limit
                && !s.we_said_goodbye
            {
                s.we_said_goodbye = true;
                let _ = conn
                    .send(Goodbye {
                        rc_final_conn_seq: None,
                        final_conn_seq: None,
                        streams: vec![],
                        reason: control::GoodbyeReason::Shutdown as i32,
                        detail: "fake collector going away".into(),
                    })
                    .await;
                s.frames = uc.frames;
                s.rc_frames = rc.map(|l| l.frames).unwrap_or_default();
                return s;
            }
        }
        tokio::select! {
            msg = conn.recv() => match msg {
                Ok(m) => match m.body {
                    Some(Body::Heartbeat(h)) => {
                        s.heartbeats += 1;
                        let asks = h.frames_without_credit.is_some_and(|n| n > 0);
                        s.last_heartbeat = Some(h);
                        if asks && cfg.answer_credit_asks {
                            // Before the first frame arrived, a report of nothing: it gives
                            // no credit but lets the agent ask again.
                            uc.poll(cfg, &limits, epoch, &mut s.violations);
                            let r = report(&uc, rc.as_ref()).unwrap_or_default();
                            s.asks_answered += 1;
                            let _ = conn.send(r).await;
                        }
                    }
                    Some(Body::Goodbye(g)) => {
                        // Frames posted before the Goodbye may still be in flight: drain.
                        for _ in 0..200 {
                            let n = uc.poll(cfg, &limits, epoch, &mut s.violations)
                                + rc.as_mut().map_or(0, |l| l.poll(cfg, &limits, epoch, &mut s.violations));
                            let uc_done = g.final_conn_seq.is_none_or(|f| uc.consumed.is_some_and(|c| c >= f));
                            let rc_done = g.rc_final_conn_seq.is_none_or(|f| {
                                rc.as_ref().is_some_and(|l| l.consumed.is_some_and(|c| c >= f))
                            });
                            if n == 0 && uc_done && rc_done {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        s.goodbye = Some(g);
                        s.frames = uc.frames;
                        s.rc_frames = rc.map(|l| l.frames).unwrap_or_default();
                        return s;
                    }
                    _ => {}
                },
                Err(_) => {
                    s.frames = uc.frames;
                    s.rc_frames = rc.map(|l| l.frames).unwrap_or_default();
                    return s;
                }
            },
            _ = report_tick.tick() => {
                if !cfg.silent {
                    if let Some(r) = report(&uc, rc.as_ref()) {
                        s.interval_reports += 1;
                        let _ = conn.send(r).await;
                    }
                }
            }
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
}

/// A `Report` of what arrived on `uc` (and `rc`): consumed sequences, per stream received
/// and lost; `None` before the first frame.
fn report(uc: &Lane, rc: Option<&Lane>) -> Option<Report> {
    let c = uc.consumed?;
    let mut streams = Vec::new();
    for id in [1u32, 2, 3] {
        let mine: Vec<&DecodedFrame> = uc
            .frames
            .iter()
            .chain(rc.iter().flat_map(|l| l.frames.iter()))
            .map(|(_, f)| f)
            .filter(|f| f.header.stream_id == id)
            .collect();
        let received = mine.len() as u64;
        let highest = mine
            .iter()
            .map(|f| f.header.stream_seq + 1)
            .max()
            .unwrap_or(0);
        if id == 3 && received == 0 {
            continue;
        }
        streams.push(StreamReport {
            stream_id: id,
            received,
            lost: highest.saturating_sub(received),
            late: 0,
            duplicate: 0,
            loss_fraction: 0.0,
        });
    }
    Some(Report {
        consumed_conn_seq: c,
        streams,
        conn_received: uc.frames.len() as u64,
        conn_lost: (c + 1).saturating_sub(uc.frames.len() as u64),
        conn_loss_fraction: 0.0,
        rc_lane: rc.map(|l| LaneReport {
            consumed_conn_seq: l.consumed,
            conn_received: l.frames.len() as u64,
            conn_lost: l
                .consumed
                .map_or(0, |c| (c + 1).saturating_sub(l.frames.len() as u64)),
            conn_loss_fraction: 0.0,
        }),
        ..Default::default()
    })
}

/// One lane of the fake collector: a QP connected to the agent's, its ring, receive buffers,
/// and what arrived on it.
struct Lane {
    qp: QueuePair,
    cq: CompletionQueue,
    ring: MemoryRegion,
    bufs: MemoryRegion,
    consumed: Option<u64>,
    frames: Vec<(WcOpcode, DecodedFrame)>,
    wcs: Vec<WorkCompletion>,
    slot_buf: Vec<u8>,
}

impl Lane {
    fn new(
        dev: &Device,
        cfg: &FakeConfig,
        qp_type: QpType,
        agent: Option<&control::QpEndpoint>,
    ) -> Option<Lane> {
        let pd = dev.alloc_pd().unwrap_or_else(|e| panic!("{e}"));
        let cq = dev.create_cq(4096).unwrap_or_else(|e| panic!("{e}"));
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &cq,
                recv_cq: &cq,
                max_send_wr: 4,
                max_recv_wr: cfg.recv_buffers,
                access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                max_mtu: None,
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let ring = pd
            .reg_mr(
                (cfg.slots * cfg.slot_bytes) as usize,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let bufs = pd
            .reg_mr(
                (cfg.recv_buffers * cfg.slot_bytes) as usize,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..cfg.recv_buffers {
            let sge = Sge::new(&bufs, (i * cfg.slot_bytes) as usize, cfg.slot_bytes);
            qp.post_recv(&[RecvWr::new(u64::from(i), sge)])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let aqp = agent?;
        let remote = uctel_transport::api::QpEndpoint {
            gid: aqp.gid_array().unwrap_or([0; 16]),
            qpn: aqp.qpn,
            psn: aqp.psn,
            mtu: aqp.mtu,
            udp_addr: aqp.udp_socket_addr(),
        };
        qp.connect(&remote)
            .unwrap_or_else(|e| panic!("connect: {e}"));
        Some(Lane {
            qp,
            cq,
            ring,
            bufs,
            consumed: None,
            frames: Vec::new(),
            wcs: vec![WorkCompletion::default(); 256],
            slot_buf: vec![0u8; cfg.slot_bytes as usize],
        })
    }

    fn endpoint(&self) -> control::QpEndpoint {
        let me = self.qp.local_endpoint();
        control::QpEndpoint {
            gid: me.gid.to_vec(),
            qpn: me.qpn,
            psn: me.psn,
            mtu: me.mtu,
            udp_addr: me.udp_addr.map(|a| a.to_string()).unwrap_or_default(),
        }
    }

    /// Takes every completion: decodes the frame, checks the wire rules, reposts the
    /// receive buffer. Returns the completions taken.
    fn poll(
        &mut self,
        cfg: &FakeConfig,
        limits: &Limits,
        epoch: u64,
        violations: &mut Vec<String>,
    ) -> usize {
        let mut total = 0;
        loop {
            let n = self.cq.poll(&mut self.wcs);
            total += n;
            for wc in self.wcs.iter().take(n) {
                if wc.status != WcStatus::Success {
                    violations.push(format!("completion status {:?}", wc.status));
                    continue;
                }
                let decoded = match wc.opcode {
                    WcOpcode::RecvRdmaWithImm => {
                        let imm = wc.imm.unwrap_or(0);
                        let slot = u64::from(imm) % u64::from(cfg.slots);
                        let off = (slot * u64::from(cfg.slot_bytes)) as usize;
                        let _ = self.ring.read_at(off, &mut self.slot_buf);
                        match decode_frame(&self.slot_buf, limits) {
                            Ok(f) => {
                                if f.header.conn_seq as u32 != imm {
                                    violations.push(format!(
                                        "imm {imm} vs conn_seq {}",
                                        f.header.conn_seq
                                    ));
                                }
                                Some(f)
                            }
                            Err(e) => {
                                violations.push(format!("slot {slot}: {e}"));
                                None
                            }
                        }
                    }
                    WcOpcode::Recv => {
                        let mut b = vec![0u8; wc.byte_len as usize];
                        let off = (wc.wr_id as u32 * cfg.slot_bytes) as usize;
                        let _ = self.bufs.read_at(off, &mut b);
                        match decode_frame(&b, limits) {
                            Ok(f) => Some(f),
                            Err(e) => {
                                violations.push(format!("send buffer: {e}"));
                                None
                            }
                        }
                    }
                    _ => None,
                };
                if let Some(f) = decoded {
                    if f.header.epoch != epoch {
                        violations.push(format!("epoch {} vs hello {epoch}", f.header.epoch));
                    }
                    self.consumed = Some(
                        self.consumed
                            .map_or(f.header.conn_seq, |c| c.max(f.header.conn_seq)),
                    );
                    self.frames.push((wc.opcode, f));
                }
                // Repost the receive buffer.
                if matches!(wc.opcode, WcOpcode::RecvRdmaWithImm | WcOpcode::Recv) {
                    let i = wc.wr_id as u32;
                    let sge = Sge::new(&self.bufs, (i * cfg.slot_bytes) as usize, cfg.slot_bytes);
                    let _ = self.qp.post_recv(&[RecvWr::new(wc.wr_id, sge)]);
                }
            }
            if n < self.wcs.len() {
                return total;
            }
        }
    }
}

/// The test kubelet (a `podresources/v1` server built from the vendored upstream proto):
/// the one the end-to-end tests use (`uctel-tests`' `kubelet` module), compiled here too.
#[path = "../../../../tests/src/kubelet.rs"]
pub mod kubelet;

/// The real agent binary in `--dry-run` with the configuration `cfg`, run by setpriv(1) as
/// user and group `nobody` (65534, no supplementary groups) with `caps` (setpriv
/// arguments, e.g. `--ambient-caps=+syslog`), for `seconds`, then stopped with SIGTERM;
/// returns its stdout frames (one JSON object per line) and its stderr. `cfg` and every
/// path it names must be readable by `nobody`.
pub fn dry_run_as_nobody(
    cfg: &std::path::Path,
    caps: &[&str],
    seconds: u64,
) -> (Vec<serde_json::Value>, String) {
    let child = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(caps)
        .arg(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--config")
        .arg(cfg)
        .args(["--dry-run", "--log-level", "warn"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv: {e}"));
    std::thread::sleep(Duration::from_secs(seconds));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let frames = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (frames, String::from_utf8_lossy(&out.stderr).into_owned())
}
