//! `rxe_uc`: UC (or RC) traffic between two processes through the uctel transport API, for
//! the Soft-RoCE VM suite (`tests/rxe/`). One process receives and checks, the other sends.
//! Either side runs on the verbs transport (a kernel rxe device) or on the soft transport
//! (RoCEv2 in user space over UDP), so the same program proves verbs ↔ verbs and soft ↔ kernel
//! interop.
//!
//! ```text
//! rxe_uc recv --listen IP:PORT [options]     create a QP, wait for the sender, check messages
//! rxe_uc send --connect IP:PORT [options]    connect and send
//! rxe_uc cq-overflow [options]   two connected QPs in one process; the receiver's CQ is left
//!                                unpolled until it overflows: expects the CQ error event and
//!                                the QP in ERROR, refusing further sends
//! rxe_uc port-events [options]   prints READY, then waits for the device port to go down and
//!                                up again (the caller toggles the netdev): expects both events
//! rxe_uc srq-many [options]      --qps N pairs of QPs in one process: N senders on one send
//!                                CQ, N receivers on one receive CQ and one shared receive
//!                                queue; --count rounds of one message per sender (send-imm
//!                                or write-imm); every completion's qp_num must name the
//!                                receiver its immediate says, every message arrive once,
//!                                whole; then the SRQ limit event (armed, then crossed)
//!
//! --transport verbs|soft   transport of this side (default verbs)
//! --qp uc|rc               QP type (default uc); both sides must agree (sent in the endpoint
//!                          exchange, a mismatch fails both). With rc the receiver requires
//!                          every message exactly once and in order (a gap, a duplicate or a
//!                          reordering fails), and a sender is done once every WR completed,
//!                          which on RC means acknowledged
//! --timeout N, --retry-cnt N, --rnr-retry N
//!                          rc: ACK timeout exponent, retry counts (default: RcAttr::default(),
//!                          timeout 14, retry_cnt 7, rnr_retry 7)
//! --device NAME            verbs: RDMA device (default: the first)
//! --local-ip IP            verbs: use the RoCE v2 GID of this address
//! --bind IP:PORT           soft: UDP address to bind (RoCEv2 port 4791 to talk to rxe)
//! --op send|send-imm|write|write-imm   (default write-imm; `write` is checked in the
//!                          receiver's ring once the sender is done, at most 1024 messages)
//! --size BYTES             message size (default 1024)
//! --count N                messages (default 100; srq-many: per QP)
//! --qps N                  srq-many: QP pairs (default 64)
//! --hold FROM:LEN          recv: post no receive WR for messages FROM..FROM+LEN, which must
//!                          then be dropped silently by the responder and show up as a gap
//! --drop-middle FROM:EVERY soft: lose the first MIDDLE packet of messages FROM, FROM+EVERY,
//!                          … (counted by FIRST/ONLY packets): the sender drops it before its
//!                          UDP socket, the receiver right after its socket, as a lossy wire
//!                          would; the RESULT line counts them (`link_dropped=`)
//! --drop-percent P         soft: lose P % of the datagrams at random in both directions,
//!                          next to the UDP socket (the soft transport's fault injector), as
//!                          a lossy wire would; the RESULT line counts them (`fault_dropped=`)
//! --seed N                 seed of --drop-percent (default 1)
//! --expect-lost FROM:EVERY recv: exactly messages FROM, FROM+EVERY, … (and a --hold range)
//!                          must be missing; every other one must arrive whole
//! --observe-loss           recv: report which messages were lost (`lost_seqs=`) without
//!                          failing on it (for a kernel whose loss behaviour is observed)
//! --bench                  send: as fast as the send queue allows, print the message rate
//! --timeout-ms MS          give up after this long without progress (default 10000)
//! ```
//!
//! Endpoints travel over a TCP connection as text lines (QPN, PSN, GID, MTU, the QP type, and
//! for write-imm the receive ring's address and rkey). Every message carries its sequence number:
//! in the immediate (send-imm, write-imm) and in its first 8 bytes; the rest of the payload is
//! a pattern derived from the sequence, checked byte for byte by the receiver. Immediates,
//! `byte_len` and byte totals are checked end to end; a gap in the sequence is a lost message.
//!
//! Output: `RESULT ok|fail <key=value…>` (exit status 0 or 1), and with `--bench` on the sender
//! `BENCH <name> <rate> msg/s`. The receiver's line names the missing sequence numbers as
//! ranges (`lost_seqs=10,50-51,90`) when any are missing. On the soft transport with `--qp rc`
//! both lines carry the QP's RC counters (`rc_packets_retransmitted=`, `rc_timeouts=`,
//! `rc_naks_sent=`, `rc_naks_received=`, `rc_duplicates=`, …).

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AccessFlags, AsyncEvent, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpEndpoint,
    QpInitAttr, QpState, QpStats, QpType, QueuePair, RcAttr, RecvWr, SendWr, Sge, TransportKind,
    WcOpcode, WcStatus, WorkCompletion,
};
use uctel_transport::device::{DeviceConfig, VerbsConfig};
use uctel_transport::soft::device::{SoftConfig, SoftDevice};
use uctel_transport::soft::fault::{FaultConfig, FaultDirection, FaultStats};
use uctel_transport::soft::link::{Datagram, Link};
use uctel_transport::soft::udp::{UdpConfig, UdpLink};

/// Send queue depth (perftest's default TX depth).
const SQ_DEPTH: u32 = 128;
/// Receive queue depth.
const RQ_DEPTH: u32 = 1024;
/// Write-imm ring slots at the receiver.
const RING_SLOTS: u64 = 1024;
/// Bytes at the start of a payload holding the sequence number.
const SEQ_BYTES: usize = 8;

type Result<T> = std::result::Result<T, String>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    /// RDMA WRITE without immediate: no receive WR, no completion at the receiver, which
    /// checks its ring after the sender is done.
    Write,
    WriteImm,
}

impl Op {
    fn parse(s: &str) -> Result<Self> {
        match s {
            "send" => Ok(Self::Send),
            "send-imm" => Ok(Self::SendImm),
            "write" => Ok(Self::Write),
            "write-imm" => Ok(Self::WriteImm),
            _ => Err(format!(
                "unknown --op {s:?} (send, send-imm, write, write-imm)"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::SendImm => "send-imm",
            Self::Write => "write",
            Self::WriteImm => "write-imm",
        }
    }
}

#[derive(Debug)]
struct Args {
    role: String,
    addr: SocketAddr,
    transport: TransportKind,
    device: Option<String>,
    local_ip: Option<IpAddr>,
    bind: Option<SocketAddr>,
    op: Op,
    size: usize,
    count: u64,
    hold: Option<(u64, u64)>,
    drop_middle: Option<Every>,
    expect_lost: Option<Every>,
    observe_loss: bool,
    bench: bool,
    timeout: Duration,
    /// `--qp rc`.
    rc: bool,
    /// `--timeout`, `--retry-cnt`, `--rnr-retry` over `RcAttr::default()`.
    rc_attr: RcAttr,
    rc_flags: bool,
    drop_percent: Option<f64>,
    seed: u64,
    /// `--qps` (srq-many).
    qps: usize,
}

impl Args {
    fn qp_type(&self) -> QpType {
        if self.rc {
            QpType::Rc(self.rc_attr)
        } else {
            QpType::Uc
        }
    }
}

/// Messages `from`, `from + every`, `from + 2 * every`, …
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Every {
    from: u64,
    every: u64,
}

impl Every {
    fn parse(v: &str) -> Result<Self> {
        let (f, e) = v.split_once(':').ok_or("expected FROM:EVERY")?;
        let from = f.parse::<u64>().map_err(|e| e.to_string())?;
        let every = e.parse::<u64>().map_err(|e| e.to_string())?;
        if every == 0 {
            return Err("EVERY must be at least 1".to_owned());
        }
        Ok(Self { from, every })
    }

    fn contains(self, seq: u64) -> bool {
        seq >= self.from && (seq - self.from) % self.every == 0
    }
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let role = it
        .next()
        .ok_or("usage: rxe_uc recv|send [options] (see the source)")?;
    let mut a = Args {
        role,
        addr: SocketAddr::from(([127, 0, 0, 1], 18600)),
        transport: TransportKind::Verbs,
        device: None,
        local_ip: None,
        bind: None,
        op: Op::WriteImm,
        size: 1024,
        count: 100,
        hold: None,
        drop_middle: None,
        expect_lost: None,
        observe_loss: false,
        bench: false,
        timeout: Duration::from_secs(10),
        rc: false,
        rc_attr: RcAttr::default(),
        rc_flags: false,
        drop_percent: None,
        seed: 1,
        qps: 64,
    };
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            a.bench = true;
            continue;
        }
        if flag == "--observe-loss" {
            a.observe_loss = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {v}: {e}");
        match flag.as_str() {
            "--listen" | "--connect" => a.addr = v.parse().map_err(|e| bad(&e))?,
            "--transport" => {
                a.transport = match v.as_str() {
                    "verbs" => TransportKind::Verbs,
                    "soft" => TransportKind::Soft,
                    _ => return Err(bad(&"expected verbs or soft")),
                }
            }
            "--device" => a.device = Some(v),
            "--local-ip" => a.local_ip = Some(v.parse().map_err(|e| bad(&e))?),
            "--bind" => a.bind = Some(v.parse().map_err(|e| bad(&e))?),
            "--op" => a.op = Op::parse(&v)?,
            "--size" => a.size = v.parse().map_err(|e| bad(&e))?,
            "--count" => a.count = v.parse().map_err(|e| bad(&e))?,
            "--timeout-ms" => a.timeout = Duration::from_millis(v.parse().map_err(|e| bad(&e))?),
            "--drop-middle" => a.drop_middle = Some(Every::parse(&v).map_err(|e| bad(&e))?),
            "--expect-lost" => a.expect_lost = Some(Every::parse(&v).map_err(|e| bad(&e))?),
            "--qp" => {
                a.rc = match v.as_str() {
                    "uc" => false,
                    "rc" => true,
                    _ => return Err(bad(&"expected uc or rc")),
                }
            }
            "--timeout" | "--retry-cnt" | "--rnr-retry" => {
                let n: u8 = v.parse().map_err(|e| bad(&e))?;
                match flag.as_str() {
                    "--timeout" => a.rc_attr.timeout = n,
                    "--retry-cnt" => a.rc_attr.retry_cnt = n,
                    _ => a.rc_attr.rnr_retry = n,
                }
                a.rc_flags = true;
            }
            "--drop-percent" => {
                let p: f64 = v.parse().map_err(|e| bad(&e))?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(bad(&"expected a percentage 0..=100"));
                }
                a.drop_percent = Some(p);
            }
            "--seed" => a.seed = v.parse().map_err(|e| bad(&e))?,
            "--qps" => a.qps = v.parse().map_err(|e| bad(&e))?,
            "--hold" => {
                let (f, l) = v.split_once(':').ok_or_else(|| bad(&"expected FROM:LEN"))?;
                a.hold = Some((
                    f.parse().map_err(|e| bad(&e))?,
                    l.parse().map_err(|e| bad(&e))?,
                ));
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.size < SEQ_BYTES {
        return Err(format!("--size must be at least {SEQ_BYTES}"));
    }
    if a.count == 0 {
        return Err("--count must be at least 1".to_owned());
    }
    if a.drop_middle.is_some() && a.transport != TransportKind::Soft {
        return Err("--drop-middle needs --transport soft".to_owned());
    }
    if a.drop_percent.is_some() && a.transport != TransportKind::Soft {
        return Err("--drop-percent needs --transport soft".to_owned());
    }
    if a.drop_percent.is_some() && a.drop_middle.is_some() {
        return Err("--drop-percent and --drop-middle exclude each other".to_owned());
    }
    if a.rc_flags && !a.rc {
        return Err("--timeout, --retry-cnt and --rnr-retry need --qp rc".to_owned());
    }
    a.rc_attr
        .validate()
        .map_err(|e| format!("RC attributes: {e}"))?;
    // RC delivers every message exactly once: there is nothing to lose on purpose, and a held
    // receive range would only be RNR NAKed and retried.
    if a.rc && (a.hold.is_some() || a.expect_lost.is_some() || a.observe_loss) {
        return Err("--hold, --expect-lost and --observe-loss are UC only".to_owned());
    }
    Ok(a)
}

/// Byte `i` of message `seq`: the sequence number (little endian) in the first 8 bytes, then a
/// pattern that differs per message and per position.
fn pattern_byte(seq: u64, i: usize) -> u8 {
    if i < SEQ_BYTES {
        seq.to_le_bytes().get(i).copied().unwrap_or(0)
    } else {
        (seq as u8)
            .wrapping_mul(31)
            .wrapping_add(i as u8)
            .wrapping_add((i >> 8) as u8)
    }
}

fn fill(buf: &mut [u8], seq: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seq, i);
    }
}

/// The first byte where `buf` differs from message `seq`'s payload.
fn first_mismatch(buf: &[u8], seq: u64) -> Option<usize> {
    buf.iter()
        .enumerate()
        .position(|(i, b)| *b != pattern_byte(seq, i))
}

// ---------------------------------------------------------------------------------------------
// Transport setup
// ---------------------------------------------------------------------------------------------

struct Side {
    device: Device,
    pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qp: QueuePair,
    /// Packets [`MiddleDrop`] dropped (`--drop-middle`).
    link_dropped: Option<Arc<AtomicU64>>,
    /// The fault injector's counters (`--drop-percent`).
    faults: Option<Arc<FaultStats>>,
}

/// `--drop-middle`: a [`Link`] around the soft device's UDP socket that loses the first MIDDLE
/// packet of the chosen messages, in one direction, as a lossy wire would. Messages are
/// numbered by their FIRST/ONLY packets (opcode byte of the BTH, the first byte of the UDP
/// payload), which is their sequence number here: one QP per device, and neither the soft
/// transport nor a veth pair reorders.
struct MiddleDrop {
    inner: UdpLink,
    /// Drop on `send` (true) or on `recv` (false).
    on_send: bool,
    which: Every,
    state: MessageState,
    dropped: Arc<AtomicU64>,
}

/// Where [`MiddleDrop`] is in the packet stream.
#[derive(Clone, Copy, Debug, Default)]
struct MessageState {
    /// FIRST/ONLY packets seen; the current message is `started - 1`.
    started: u64,
    /// The current message already lost its packet.
    done: bool,
}

/// UC opcodes (IBTA 9.2; the first byte of the BTH).
const UC_SEND_FIRST: u8 = 0x20;
const UC_SEND_MIDDLE: u8 = 0x21;
const UC_SEND_ONLY: u8 = 0x24;
const UC_SEND_ONLY_IMM: u8 = 0x25;
const UC_WRITE_FIRST: u8 = 0x26;
const UC_WRITE_MIDDLE: u8 = 0x27;
const UC_WRITE_ONLY: u8 = 0x2a;
const UC_WRITE_ONLY_IMM: u8 = 0x2b;

impl MessageState {
    /// Takes the next datagram `d` into account; whether it is to be dropped.
    fn drops(&mut self, d: &Datagram, which: Every) -> bool {
        match d.payload.first().copied() {
            Some(
                UC_SEND_FIRST | UC_SEND_ONLY | UC_SEND_ONLY_IMM | UC_WRITE_FIRST | UC_WRITE_ONLY
                | UC_WRITE_ONLY_IMM,
            ) => {
                self.started += 1;
                self.done = false;
                false
            }
            Some(UC_SEND_MIDDLE | UC_WRITE_MIDDLE)
                if !self.done && self.started > 0 && which.contains(self.started - 1) =>
            {
                self.done = true;
                true
            }
            _ => false,
        }
    }
}

impl Link for MiddleDrop {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn send(&mut self, batch: &[Datagram]) -> std::io::Result<usize> {
        if !self.on_send {
            return self.inner.send(batch);
        }
        // Runs of kept datagrams go out as batches. A datagram the socket does not take now
        // comes back in a later batch, so the state is rewound to just after the last one
        // taken.
        let mut i = 0;
        while i < batch.len() {
            let before = self.state;
            let mut j = i;
            while let Some(d) = batch.get(j) {
                if self.state.drops(d, self.which) {
                    break;
                }
                j += 1;
            }
            let run = batch.get(i..j).unwrap_or_default();
            let taken = if run.is_empty() {
                0
            } else {
                self.inner.send(run)?
            };
            if taken < run.len() {
                self.state = before;
                for d in run.iter().take(taken) {
                    self.state.drops(d, self.which);
                }
                return Ok(i + taken);
            }
            i = j;
            if i < batch.len() {
                // batch[i] is the packet to lose.
                self.dropped.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(i)
    }

    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        timeout: Option<Duration>,
    ) -> std::io::Result<usize> {
        loop {
            let start = out.len();
            let n = self.inner.recv(out, max, timeout)?;
            if self.on_send || n == 0 {
                return Ok(n);
            }
            let got: Vec<Datagram> = out.drain(start..).collect();
            for d in got {
                if self.state.drops(&d, self.which) {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    self.inner.recycle(d.payload);
                } else {
                    out.push(d);
                }
            }
            let kept = out.len() - start;
            // A blocking receive returns only once it hands something out.
            if kept > 0 || timeout.is_some() {
                return Ok(kept);
            }
        }
    }

    fn recv_discarded(&self) -> u64 {
        self.inner.recv_discarded()
    }

    fn recycle(&mut self, payload: Vec<u8>) {
        self.inner.recycle(payload);
    }
}

fn open(a: &Args) -> Result<Side> {
    let cfg = match a.transport {
        TransportKind::Verbs => DeviceConfig::Verbs(VerbsConfig {
            device: a.device.clone(),
            local_ip: a.local_ip,
            ..VerbsConfig::default()
        }),
        TransportKind::Soft => {
            let mut c = SoftConfig {
                name: "soft0".to_owned(),
                ..SoftConfig::default()
            };
            if let Some(b) = a.bind {
                c.udp.bind = b;
            }
            // The soft device wraps its UDP link in the fault injector: each datagram is
            // exposed to the drop once per direction it takes (data out, ACKs in, and so on).
            c.faults = a.drop_percent.map(|p| FaultConfig {
                drop_ratio: p / 100.0,
                seed: a.seed,
                direction: FaultDirection::Both,
                ..FaultConfig::default()
            });
            DeviceConfig::Soft(c)
        }
    };
    let mut link_dropped = None;
    let mut faults = None;
    let device = match (&cfg, a.drop_middle) {
        (DeviceConfig::Soft(c), Some(which)) => {
            // SoftDevice::open, with MiddleDrop between the engine and the socket.
            let udp = UdpLink::bind(UdpConfig {
                batch: c.batch,
                ..c.udp.clone()
            })
            .map_err(|e| format!("open: bind {}: {e}", c.udp.bind))?;
            let dropped = Arc::new(AtomicU64::new(0));
            link_dropped = Some(Arc::clone(&dropped));
            let link = MiddleDrop {
                inner: udp,
                on_send: a.role == "send",
                which,
                state: MessageState::default(),
                dropped,
            };
            SoftDevice::with_link(c, Box::new(link))
                .map(Device::from)
                .map_err(|e| format!("open: {e}"))?
        }
        (DeviceConfig::Soft(c), None) if c.faults.is_some() => {
            let soft = SoftDevice::open(c).map_err(|e| format!("open: {e}"))?;
            faults = soft.fault_stats();
            Device::from(soft)
        }
        _ => Device::open(&cfg).map_err(|e| format!("open: {e}"))?,
    };
    let pd = device.alloc_pd().map_err(|e| e.to_string())?;
    let send_cq = device.create_cq(SQ_DEPTH * 2).map_err(|e| e.to_string())?;
    let recv_cq = device.create_cq(RQ_DEPTH * 2).map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: a.qp_type(),
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            max_send_wr: SQ_DEPTH,
            max_recv_wr: RQ_DEPTH,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            max_mtu: None,
        })
        .map_err(|e| e.to_string())?;
    let attr = device.port_attr();
    eprintln!(
        "{} {}: device {} {} QPN {:#x} GID {} MTU {}",
        a.role,
        device.kind(),
        device.name(),
        qp.qp_type().as_str(),
        qp.qp_num(),
        uctel_transport::api::ip_from_gid(attr.gid),
        attr.active_mtu
    );
    Ok(Side {
        device,
        pd,
        send_cq,
        recv_cq,
        qp,
        link_dropped,
        faults,
    })
}

/// What the soft side adds to its RESULT line: the RC QP's counters (`--qp rc`) and the
/// datagrams the fault injector dropped (`--drop-percent`).
fn soft_extras(a: &Args, s: &Side, qs: &QpStats) -> String {
    let mut out = String::new();
    if a.transport == TransportKind::Soft && a.rc {
        let rc = &qs.rc;
        out.push_str(&format!(
            " rc_packets_retransmitted={} rc_timeouts={} rc_naks_sent={} rc_naks_received={} \
             rc_duplicates={} rc_rnr_naks_sent={} rc_rnr_naks_received={} rc_retry_exceeded={}",
            rc.packets_retransmitted,
            rc.timeouts,
            rc.naks_sent,
            rc.naks_received,
            rc.duplicates,
            rc.rnr_naks_sent,
            rc.rnr_naks_received,
            rc.retry_exceeded
        ));
    }
    if let Some(f) = &s.faults {
        let c = f.snapshot();
        out.push_str(&format!(
            " fault_inputs={} fault_dropped={} fault_passed={}",
            f.inputs(),
            c.dropped,
            c.passed
        ));
    }
    out
}

/// The `qp=uc|rc` word of HELLO and WELCOME, checked against this side's `--qp`.
fn check_qp_word(a: &Args, words: &[String], peer: &str) -> Result<()> {
    let mine = a.qp_type().as_str();
    let theirs = words
        .iter()
        .find_map(|w| w.strip_prefix("qp="))
        .unwrap_or("uc (not announced)");
    if theirs != mine {
        return Err(format!(
            "QP type mismatch: this {} side has --qp {mine}, the {peer} --qp {theirs}; both \
             sides must use the same --qp",
            a.role
        ));
    }
    Ok(())
}

/// Waits for completions on `cq`: the verbs completion channel when `block` (no spinning), a
/// short sleep on the soft transport (its progress thread does the work), a spin otherwise.
fn wait_cq(cq: &CompletionQueue, kind: TransportKind, block: bool) -> Result<()> {
    match kind {
        TransportKind::Verbs if block => {
            #[cfg(feature = "verbs")]
            uctel_transport::verbs::wait_for_completion(cq, Duration::from_millis(50))
                .map_err(|e| e.to_string())?;
            #[cfg(not(feature = "verbs"))]
            let _ = cq;
        }
        TransportKind::Verbs => std::hint::spin_loop(),
        TransportKind::Soft => std::thread::sleep(Duration::from_micros(50)),
    }
    Ok(())
}

/// Counts idle rounds of a polling loop so that slow checks (asynchronous events, clocks) run
/// only every [`Idle::EVERY`] rounds: in the TCG guest the clock source is an emulated HPET,
/// where every `clock_gettime` is a system call plus device emulation, and an `Instant::now()`
/// per spin would slow the data path being measured.
#[derive(Debug, Default)]
struct Idle {
    rounds: u64,
}

impl Idle {
    const EVERY: u64 = 4096;

    /// Whether this idle round should run the slow checks: every round when the loop blocks
    /// between rounds anyway, every [`Idle::EVERY`] rounds when it spins.
    fn tick(&mut self, blocking: bool) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        blocking || self.rounds % Self::EVERY == 0
    }
}

/// Fails on any asynchronous event (QP fatal, CQ error, port change).
fn check_events(dev: &Device) -> Result<()> {
    if let Some(ev) = dev.poll_async_event() {
        return Err(format!("async event: {ev:?}"));
    }
    Ok(())
}

fn encode_endpoint(ep: &QpEndpoint) -> String {
    let gid: String = ep.gid.iter().map(|b| format!("{b:02x}")).collect();
    let udp = ep
        .udp_addr
        .map_or_else(|| "-".to_owned(), |a| a.to_string());
    format!("{gid} {} {} {} {udp}", ep.qpn, ep.psn, ep.mtu)
}

fn decode_endpoint(words: &[&str]) -> Result<QpEndpoint> {
    let [gid, qpn, psn, mtu, udp] = words else {
        return Err(format!("bad endpoint {words:?}"));
    };
    let mut g = [0u8; 16];
    if gid.len() != 32 {
        return Err(format!("bad GID {gid}"));
    }
    for (i, b) in g.iter_mut().enumerate() {
        let hex = gid.get(2 * i..2 * i + 2).ok_or("bad GID")?;
        *b = u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
    }
    let num = |s: &str| s.parse::<u32>().map_err(|e| format!("{s}: {e}"));
    Ok(QpEndpoint {
        gid: g,
        qpn: num(qpn)?,
        psn: num(psn)?,
        mtu: num(mtu)?,
        udp_addr: if *udp == "-" {
            None
        } else {
            Some(udp.parse().map_err(|e| format!("{udp}: {e}"))?)
        },
    })
}

struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Control {
    fn new(s: TcpStream, timeout: Duration) -> Result<Self> {
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let writer = s.try_clone().map_err(|e| e.to_string())?;
        Ok(Self {
            reader: BufReader::new(s),
            writer,
        })
    }

    fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.writer, "{line}").map_err(|e| format!("control send: {e}"))
    }

    fn recv(&mut self) -> Result<Vec<String>> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| format!("control recv: {e}"))?;
        if n == 0 {
            return Err("control connection closed".to_owned());
        }
        Ok(line.split_whitespace().map(str::to_owned).collect())
    }

    /// Hands the reading side to a thread that forwards each line; keeps the writing side.
    fn split(self) -> (ControlWriter, mpsc::Receiver<Result<Vec<String>>>) {
        let (tx, rx) = mpsc::channel();
        let Control { mut reader, writer } = self;
        let _ = reader.get_ref().set_read_timeout(None);
        std::thread::spawn(move || loop {
            let line = read_words(&mut reader);
            let stop = line.is_err();
            if tx.send(line).is_err() || stop {
                return;
            }
        });
        (ControlWriter { writer }, rx)
    }

    fn expect(&mut self, word: &str) -> Result<Vec<String>> {
        let w = self.recv()?;
        if w.first().map(String::as_str) != Some(word) {
            return Err(format!("expected {word}, got {w:?}"));
        }
        Ok(w)
    }
}

/// Reads one control line and splits it into words.
fn read_words(reader: &mut BufReader<TcpStream>) -> Result<Vec<String>> {
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .map_err(|e| format!("control recv: {e}"))?;
    if n == 0 {
        return Err("control connection closed".to_owned());
    }
    Ok(line.split_whitespace().map(str::to_owned).collect())
}

struct ControlWriter {
    writer: TcpStream,
}

impl ControlWriter {
    fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.writer, "{line}").map_err(|e| format!("control send: {e}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Receiver
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct RecvTally {
    received: u64,
    bytes: u64,
    imm_checked: u64,
    payload_checked: u64,
    /// Highest sequence seen + 1.
    next_expected: u64,
    lost: u64,
    gaps: u64,
    errors: Vec<String>,
    /// Per sequence number below `--count`: it arrived.
    seen: Vec<bool>,
    /// RC: every message exactly once and in order; anything else is an error.
    strict: bool,
    /// RC: messages that arrived out of place (gap, duplicate or reordering).
    order_errors: u64,
}

impl RecvTally {
    fn record_seq(&mut self, seq: u64) {
        if self.strict && seq != self.next_expected {
            self.order_errors += 1;
            let what = if seq > self.next_expected {
                "a gap"
            } else if self
                .seen
                .get(usize::try_from(seq).unwrap_or(usize::MAX))
                .copied()
                .unwrap_or(false)
            {
                "a duplicate"
            } else {
                "a reordering"
            };
            self.errors.push(format!(
                "RC: message {seq} arrived where {} was due ({what})",
                self.next_expected
            ));
        }
        if let Some(s) = usize::try_from(seq).ok().and_then(|i| self.seen.get_mut(i)) {
            *s = true;
        }
        if seq > self.next_expected {
            self.lost += seq - self.next_expected;
            self.gaps += 1;
        } else if seq < self.next_expected {
            self.errors.push(format!(
                "sequence went back: {seq} after {}",
                self.next_expected
            ));
        }
        self.next_expected = self.next_expected.max(seq + 1);
    }
}

struct Receiver<'a> {
    a: &'a Args,
    s: &'a Side,
    /// Receive buffers (send ops) or the write-imm ring.
    mr: MemoryRegion,
    slot: usize,
    /// Receive WRs posted and not consumed.
    posted: u64,
    /// Receive WRs this phase may still post.
    budget: u64,
    next_wr_id: u64,
    tally: RecvTally,
    idle: Idle,
}

impl<'a> Receiver<'a> {
    /// Posts receive WRs until the receive queue is full or the phase's budget is spent.
    fn post(&mut self) -> Result<()> {
        while self.budget > 0 && self.posted < u64::from(RQ_DEPTH) {
            let n = self.budget.min(u64::from(RQ_DEPTH) - self.posted).min(32);
            let ids: Vec<u64> = (self.next_wr_id..self.next_wr_id + n).collect();
            let slot_of = |id: u64| (id % u64::from(RQ_DEPTH)) as usize * self.slot;
            let list: Vec<RecvWr<'_>> = ids
                .iter()
                .map(|id| match self.a.op {
                    Op::WriteImm | Op::Write => RecvWr::zero_length(*id),
                    Op::Send | Op::SendImm => {
                        RecvWr::new(*id, Sge::new(&self.mr, slot_of(*id), self.slot as u32))
                    }
                })
                .collect();
            self.s.qp.post_recv(&list).map_err(|e| e.to_string())?;
            self.next_wr_id += n;
            self.budget -= n;
            self.posted += n;
        }
        Ok(())
    }

    fn on_completion(&mut self, wc: &WorkCompletion) {
        self.posted = self.posted.saturating_sub(1);
        let t = &mut self.tally;
        if self.a.op == Op::Write {
            t.errors.push(format!(
                "receive completion {wc:?} for an RDMA WRITE without immediate"
            ));
            return;
        }
        if wc.status != WcStatus::Success {
            t.errors.push(format!(
                "completion wr_id {} status {}",
                wc.wr_id, wc.status
            ));
            return;
        }
        let size = self.a.size;
        let mut buf = vec![0u8; size];
        let want_op = match self.a.op {
            Op::WriteImm | Op::Write => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Recv,
        };
        if wc.opcode != want_op {
            t.errors
                .push(format!("opcode {:?}, expected {want_op:?}", wc.opcode));
        }
        if wc.byte_len as usize != size {
            t.errors.push(format!("byte_len {} != {size}", wc.byte_len));
        }
        t.received += 1;
        t.bytes += u64::from(wc.byte_len);
        let seq = match (self.a.op, wc.imm) {
            (Op::Send, None) => {
                let off = (wc.wr_id % u64::from(RQ_DEPTH)) as usize * self.slot;
                let mut head = [0u8; SEQ_BYTES];
                if self.mr.read_at(off, &mut head).is_err() {
                    t.errors.push("read_at".to_owned());
                }
                u64::from_le_bytes(head)
            }
            (Op::Send, Some(imm)) => {
                t.errors
                    .push(format!("unexpected immediate {imm:#x} on a plain send"));
                return;
            }
            (_, Some(imm)) => {
                t.imm_checked += 1;
                u64::from(imm)
            }
            (_, None) => {
                t.errors
                    .push(format!("wr_id {}: immediate missing", wc.wr_id));
                return;
            }
        };
        t.record_seq(seq);
        let off = match self.a.op {
            Op::WriteImm | Op::Write => (seq % RING_SLOTS) as usize * self.slot,
            _ => (wc.wr_id % u64::from(RQ_DEPTH)) as usize * self.slot,
        };
        // With --bench the sender rewrites only the sequence bytes of a reused slot.
        if !self.a.bench {
            if self.mr.read_at(off, &mut buf).is_err() {
                t.errors.push(format!("read_at {off}"));
            } else if let Some(i) = first_mismatch(&buf, seq) {
                t.errors
                    .push(format!("message {seq}: payload differs at byte {i}"));
            } else {
                t.payload_checked += 1;
            }
        }
    }

    /// `--op write`: after the sender is done (and the quiet wait), every message must be in
    /// its ring slot; a slot that does not hold its message counts as lost.
    fn check_ring(&mut self) {
        let mut buf = vec![0u8; self.a.size];
        for seq in 0..self.a.count {
            let off = (seq % RING_SLOTS) as usize * self.slot;
            if self.mr.read_at(off, &mut buf).is_err() {
                self.tally.errors.push(format!("read_at {off}"));
                continue;
            }
            if first_mismatch(&buf, seq).is_none() {
                let t = &mut self.tally;
                t.received += 1;
                t.bytes += self.a.size as u64;
                t.payload_checked += 1;
                t.record_seq(seq);
            }
        }
    }

    /// One round: replenish the receive queue, take completions; waits on the CQ when there
    /// were none. Returns how many completions were taken.
    fn step(&mut self) -> Result<usize> {
        let mut wcs = [WorkCompletion::default(); 32];
        self.post()?;
        let n = self.s.recv_cq.poll(&mut wcs);
        for wc in wcs.iter().take(n) {
            self.on_completion(wc);
        }
        if n == 0 {
            if self.idle.tick(!self.a.bench) {
                check_events(&self.s.device)?;
            }
            wait_cq(&self.s.recv_cq, self.a.transport, !self.a.bench)?;
        }
        Ok(n)
    }

    /// Receives (keeping the receive queue full) until the sender reports `SENT` on the
    /// control connection.
    fn until_sent(&mut self, ctl: &mpsc::Receiver<Result<Vec<String>>>) -> Result<()> {
        loop {
            self.step()?;
            match ctl.try_recv() {
                Ok(Ok(w)) if w.first().map(String::as_str) == Some("SENT") => return Ok(()),
                Ok(Ok(w)) => return Err(format!("expected SENT, got {w:?}")),
                Ok(Err(e)) => return Err(e),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err("control connection closed".to_owned())
                }
            }
        }
    }

    /// Receives until `until` sequence numbers have been accounted for, or nothing arrives for
    /// `quiet` (called after the sender reported the phase sent).
    fn drain(&mut self, until: u64, quiet: Duration) -> Result<()> {
        let mut last = Instant::now();
        loop {
            if self.tally.next_expected >= until {
                return Ok(());
            }
            if self.step()? > 0 {
                last = Instant::now();
            } else if (self.idle.rounds % Idle::EVERY == 0 || !self.a.bench)
                && last.elapsed() >= quiet
            {
                return Ok(());
            }
        }
    }
}

fn run_recv(a: &Args) -> Result<String> {
    let listener = TcpListener::bind(a.addr).map_err(|e| format!("listen {}: {e}", a.addr))?;
    let s = open(a)?;
    let slot = a.size.next_multiple_of(64);
    if a.op == Op::Write && (a.count > RING_SLOTS || a.hold.is_some() || a.bench) {
        return Err(format!(
            "--op write: at most {RING_SLOTS} messages, no --hold, no --bench"
        ));
    }
    let slots = match a.op {
        Op::WriteImm | Op::Write => RING_SLOTS as usize,
        _ => RQ_DEPTH as usize,
    };
    let mr =
        s.pd.reg_mr(
            slot * slots,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .map_err(|e| e.to_string())?;
    let (stream, peer) = listener.accept().map_err(|e| e.to_string())?;
    eprintln!("recv: control connection from {peer}");
    let mut ctl = Control::new(stream, a.timeout)?;
    let hello = ctl.expect("HELLO")?;
    if let Err(e) = check_qp_word(a, &hello, "sender") {
        let _ = ctl.send(&format!("REFUSE {e}"));
        return Err(e);
    }
    let words: Vec<&str> = hello
        .iter()
        .skip(1)
        .filter(|w| !w.starts_with("qp="))
        .map(String::as_str)
        .collect();
    let remote = decode_endpoint(&words)?;
    let (hold_from, hold_len) = a.hold.unwrap_or((a.count, 0));
    let mut r = Receiver {
        a,
        s: &s,
        mr,
        slot,
        posted: 0,
        // RDMA WRITE without immediate consumes no receive WR.
        budget: if a.op == Op::Write {
            0
        } else {
            hold_from.min(a.count)
        },
        next_wr_id: 0,
        tally: RecvTally {
            seen: vec![false; usize::try_from(a.count).map_err(|e| e.to_string())?],
            strict: a.rc,
            ..RecvTally::default()
        },
        idle: Idle::default(),
    };
    r.post()?;
    s.qp.connect(&remote).map_err(|e| e.to_string())?;
    ctl.send(&format!(
        "WELCOME {} {} {} {} {} qp={}",
        encode_endpoint(&s.qp.local_endpoint()),
        r.mr.addr(),
        r.mr.rkey(),
        RING_SLOTS,
        slot,
        a.qp_type().as_str()
    ))?;
    let quiet = Duration::from_millis(if a.bench { 1000 } else { 500 });
    let (mut ctl, lines) = ctl.split();
    // Phase 1: everything, or up to the end of the held range.
    let end1 = (hold_from + hold_len).min(a.count);
    ctl.send(&format!("SEND 0 {end1}"))?;
    r.until_sent(&lines)?;
    r.drain(hold_from.min(a.count), quiet)?;
    let mut expected_lost = 0;
    if end1 < a.count || a.hold.is_some() {
        // The held messages found no receive WR: wait to be sure nothing else arrives, then
        // post for the rest.
        r.drain(u64::MAX, quiet)?;
        expected_lost = end1.saturating_sub(hold_from.min(a.count));
        r.budget = a.count - end1;
        r.post()?;
        ctl.send(&format!("SEND {end1} {}", a.count))?;
        r.until_sent(&lines)?;
        r.drain(a.count, quiet)?;
    }
    if a.op == Op::Write {
        r.check_ring();
    }
    ctl.send("END")?;
    let t = &mut r.tally;
    // Messages missing at the end count as lost too.
    t.lost += a.count.saturating_sub(t.next_expected);
    let qs = s.qp.stats();
    let ds = s.device.stats();
    let mut summary = format!(
        "role=recv transport={} qp={} op={} size={} count={} received={} lost={} gaps={} bytes={} \
         imm_checked={} payload_checked={} qp_messages_completed={} dev_rx_packets={}",
        a.transport,
        a.qp_type().as_str(),
        a.op.name(),
        a.size,
        a.count,
        t.received,
        t.lost,
        t.gaps,
        t.bytes,
        t.imm_checked,
        t.payload_checked,
        qs.messages_completed,
        ds.packets_received
    );
    if qs.drops.total() > 0 {
        summary.push_str(&format!(" qp_drops={:?}", qs.drops));
    }
    if a.transport == TransportKind::Soft {
        summary.push_str(&format!(
            " qp_psn_resyncs={} qp_packets_discarded={}",
            qs.psn_resyncs, qs.packets_discarded
        ));
        for (reason, n) in qs.drops.iter().filter(|(_, n)| *n > 0) {
            summary.push_str(&format!(" qp_drop_{reason}={n}"));
        }
    }
    if let Some(d) = &s.link_dropped {
        summary.push_str(&format!(" link_dropped={}", d.load(Ordering::Relaxed)));
    }
    summary.push_str(&soft_extras(a, &s, &qs));
    if a.rc {
        summary.push_str(&format!(" order_errors={}", t.order_errors));
    }
    let missing: Vec<u64> = (0..a.count)
        .filter(|q| !t.seen.get(*q as usize).copied().unwrap_or(false))
        .collect();
    if !missing.is_empty() {
        summary.push_str(&format!(" lost_seqs={}", ranges(&missing, 40)));
    }
    if !t.errors.is_empty() {
        let first: Vec<&String> = t.errors.iter().take(5).collect();
        return Err(format!(
            "{summary} errors={} first={first:?}",
            t.errors.len()
        ));
    }
    if t.bytes != t.received * a.size as u64 {
        return Err(format!("{summary}: byte total mismatch"));
    }
    let held = hold_from.min(a.count)..end1;
    if let (Some(pattern), false) = (a.expect_lost, a.observe_loss) {
        let expected = |q: u64| held.contains(&q) || pattern.contains(q);
        let unexpected: Vec<u64> = missing.iter().copied().filter(|q| !expected(*q)).collect();
        let arrived: Vec<u64> = (0..a.count)
            .filter(|q| expected(*q) && !missing.contains(q))
            .collect();
        if !unexpected.is_empty() || !arrived.is_empty() {
            return Err(format!(
                "{summary}: lost but not expected: [{}], expected lost but arrived: [{}]",
                ranges(&unexpected, 20),
                ranges(&arrived, 20)
            ));
        }
    } else if !a.bench && !a.observe_loss && t.lost != expected_lost {
        return Err(format!("{summary}: expected {expected_lost} lost"));
    }
    if a.bench && t.received + t.lost != a.count {
        return Err(format!("{summary}: received + lost != count"));
    }
    if a.rc && (t.received != a.count || t.lost != 0 || t.order_errors != 0) {
        return Err(format!(
            "{summary}: RC must deliver all {} messages exactly once, in order",
            a.count
        ));
    }
    if matches!(a.op, Op::SendImm | Op::WriteImm) && t.imm_checked != t.received {
        return Err(format!("{summary}: immediates missing"));
    }
    Ok(summary)
}

/// Sorted sequence numbers as ranges, `10,50-51,90`; after `max` ranges `,...+N` says how many
/// more numbers follow.
fn ranges(seqs: &[u64], max: usize) -> String {
    // (first, last) of each run of consecutive numbers.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &q in seqs {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == q => *hi = q,
            _ => runs.push((q, q)),
        }
    }
    let mut out: Vec<String> = runs
        .iter()
        .take(max)
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    let rest: u64 = runs.iter().skip(max).map(|&(lo, hi)| hi - lo + 1).sum();
    if rest > 0 {
        out.push(format!("...+{rest}"));
    }
    out.join(",")
}

// ---------------------------------------------------------------------------------------------
// Sender
// ---------------------------------------------------------------------------------------------

struct Sender<'a> {
    a: &'a Args,
    s: &'a Side,
    mr: MemoryRegion,
    remote_addr: u64,
    rkey: u32,
    slot: usize,
    /// Messages posted.
    posted: u64,
    /// All messages below this one are known on the wire (their slot may be reused).
    retired: u64,
    signal_every: u64,
    scratch: Vec<u8>,
    idle: Idle,
}

impl<'a> Sender<'a> {
    /// Reaps completions; when there were none, checks events and the progress deadline
    /// (`--timeout-ms` without a completion) and waits on the CQ.
    fn reap_or_wait(&mut self, last_progress: &mut Instant) -> Result<()> {
        let before = self.retired;
        if self.reap()? > 0 {
            if self.retired > before {
                *last_progress = Instant::now();
            }
            return Ok(());
        }
        if self.idle.tick(!self.a.bench) {
            check_events(&self.s.device)?;
            if last_progress.elapsed() > self.a.timeout {
                return Err(format!(
                    "no send completion for {:?}: {} of {} messages completed{}",
                    self.a.timeout,
                    self.retired,
                    self.posted,
                    if self.a.rc {
                        " (RC: completed = acknowledged)"
                    } else {
                        ""
                    }
                ));
            }
        }
        wait_cq(&self.s.send_cq, self.a.transport, !self.a.bench)
    }

    fn reap(&mut self) -> Result<usize> {
        let mut wcs = [WorkCompletion::default(); 32];
        let n = self.s.send_cq.poll(&mut wcs);
        for wc in wcs.iter().take(n) {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "send completion wr_id {} status {}",
                    wc.wr_id, wc.status
                ));
            }
            self.retired = self.retired.max(wc.wr_id + 1);
        }
        Ok(n)
    }

    fn send_range(&mut self, from: u64, to: u64) -> Result<()> {
        let window = u64::from(SQ_DEPTH);
        let mut seq = from;
        self.posted = self.posted.max(from);
        self.retired = self.retired.max(from);
        let mut last_progress = Instant::now();
        while seq < to {
            // A slot is rewritten only once its message completed (RC: was acknowledged, so
            // no retransmission reads it any more).
            if seq - self.retired >= window {
                self.reap_or_wait(&mut last_progress)?;
                continue;
            }
            let slot_off = (seq % window) as usize * self.slot;
            if !self.a.bench || seq < window {
                fill(&mut self.scratch, seq);
            } else {
                self.scratch
                    .get_mut(..SEQ_BYTES)
                    .ok_or("size")?
                    .copy_from_slice(&seq.to_le_bytes());
            }
            if !self.a.bench || seq < window {
                self.mr
                    .write_at(slot_off, &self.scratch)
                    .map_err(|e| e.to_string())?;
            } else {
                let head = self.scratch.get(..SEQ_BYTES).ok_or("size")?;
                self.mr
                    .write_at(slot_off, head)
                    .map_err(|e| e.to_string())?;
            }
            let sge = Some(Sge::new(&self.mr, slot_off, self.a.size as u32));
            let imm = seq as u32;
            let wr = match self.a.op {
                Op::Send => SendWr::send(seq, sge),
                Op::SendImm => SendWr::send_with_imm(seq, sge, imm),
                Op::Write => {
                    let off = (seq % RING_SLOTS) * self.slot as u64;
                    SendWr::write(seq, sge, self.remote_addr + off, self.rkey)
                }
                Op::WriteImm => {
                    let off = (seq % RING_SLOTS) * self.slot as u64;
                    SendWr::write_with_imm(seq, sge, self.remote_addr + off, self.rkey, imm)
                }
            };
            let signaled = (seq + 1) % self.signal_every == 0 || seq + 1 == to;
            match self.s.qp.post_send(&[wr.with_signaled(signaled)]) {
                Ok(()) => {
                    seq += 1;
                    self.posted = seq;
                }
                Err(e) if e.is_full() => self.reap_or_wait(&mut last_progress)?,
                Err(e) => return Err(e.to_string()),
            }
        }
        // Done once every WR completed: on the wire (UC) or acknowledged (RC).
        last_progress = Instant::now();
        while self.retired < to {
            self.reap_or_wait(&mut last_progress)?;
        }
        Ok(())
    }
}

fn run_send(a: &Args) -> Result<String> {
    let s = open(a)?;
    let slot = a.size.next_multiple_of(64);
    let mr =
        s.pd.reg_mr(slot * SQ_DEPTH as usize, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
    let stream = {
        let deadline = Instant::now() + a.timeout;
        loop {
            match TcpStream::connect(a.addr) {
                Ok(st) => break st,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("send: connect {}: {e}; retrying", a.addr);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(format!("connect {}: {e}", a.addr)),
            }
        }
    };
    let mut ctl = Control::new(stream, a.timeout)?;
    ctl.send(&format!(
        "HELLO {} qp={}",
        encode_endpoint(&s.qp.local_endpoint()),
        a.qp_type().as_str()
    ))?;
    let w = ctl.recv()?;
    if w.first().map(String::as_str) == Some("REFUSE") {
        return Err(format!("the receiver refused: {}", w[1..].join(" ")));
    }
    if w.first().map(String::as_str) != Some("WELCOME") {
        return Err(format!("expected WELCOME, got {w:?}"));
    }
    check_qp_word(a, &w, "receiver")?;
    let words: Vec<&str> = w.iter().map(String::as_str).collect();
    let ep = words.get(1..6).ok_or("short WELCOME")?;
    let remote = decode_endpoint(ep)?;
    let num = |i: usize| -> Result<u64> {
        words
            .get(i)
            .ok_or("short WELCOME")?
            .parse::<u64>()
            .map_err(|e| e.to_string())
    };
    let (remote_addr, rkey) = (num(6)?, u32::try_from(num(7)?).map_err(|e| e.to_string())?);
    s.qp.connect(&remote).map_err(|e| e.to_string())?;
    let mut tx = Sender {
        a,
        s: &s,
        mr,
        remote_addr,
        rkey,
        slot,
        posted: 0,
        retired: 0,
        signal_every: if a.bench { 64 } else { 16 },
        scratch: vec![0u8; a.size],
        idle: Idle::default(),
    };
    let mut elapsed = Duration::ZERO;
    let mut sent = 0u64;
    loop {
        let cmd = ctl.recv()?;
        match cmd.first().map(String::as_str) {
            Some("SEND") => {
                let from = cmd
                    .get(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or("bad SEND")?;
                let to = cmd
                    .get(2)
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or("bad SEND")?;
                let t0 = Instant::now();
                tx.send_range(from, to)?;
                elapsed += t0.elapsed();
                sent += to.saturating_sub(from);
                ctl.send(&format!("SENT {to}"))?;
            }
            Some("END") => break,
            other => return Err(format!("unexpected control message {other:?}")),
        }
    }
    let qs = s.qp.stats();
    let rate = sent as f64 / elapsed.as_secs_f64().max(1e-9);
    if a.bench {
        println!(
            "BENCH {}_{}_{}_msg_rate {rate:.0} msg/s",
            a.transport,
            a.op.name().replace('-', "_"),
            a.qp_type().as_str()
        );
    }
    if qs.messages_sent != sent && a.transport == TransportKind::Verbs {
        return Err(format!(
            "QP counted {} messages sent, the program {sent}",
            qs.messages_sent
        ));
    }
    let mut summary = format!(
        "role=send transport={} qp={} op={} size={} sent={sent} rate={rate:.0}msg/s \
         qp_messages_sent={} qp_packets_sent={} dev_tx_packets={}",
        a.transport,
        a.qp_type().as_str(),
        a.op.name(),
        a.size,
        qs.messages_sent,
        qs.packets_sent,
        s.device.stats().packets_sent
    );
    if let Some(d) = &s.link_dropped {
        summary.push_str(&format!(" link_dropped={}", d.load(Ordering::Relaxed)));
    }
    summary.push_str(&soft_extras(a, &s, &qs));
    Ok(summary)
}

// ---------------------------------------------------------------------------------------------
// Asynchronous events
// ---------------------------------------------------------------------------------------------

/// Collects asynchronous events until `done` says enough or the timeout passes.
fn collect_events(
    dev: &Device,
    timeout: Duration,
    mut done: impl FnMut(&[AsyncEvent]) -> bool,
) -> Vec<AsyncEvent> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while Instant::now() < deadline && !done(&seen) {
        match dev.poll_async_event() {
            Some(ev) => {
                eprintln!("async event: {ev:?}");
                seen.push(ev);
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    seen
}

/// A receive CQ that is never polled overflows; the device reports `CQ_ERR` and the QP that
/// could not complete moves to ERROR (IBTA class G; rxe `RESPST_ERR_CQ_OVERFLOW`). The
/// transport must surface both: the event, the QP state, and a refused `post_send`.
fn run_cq_overflow(a: &Args) -> Result<String> {
    let rx = open(a)?;
    let device = &rx.device;
    // The receiving QP gets a small CQ of its own.
    let small_cq = device.create_cq(8).map_err(|e| e.to_string())?;
    let depth = small_cq.depth();
    let wrs = depth + 16;
    let qp_rx = rx
        .pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &rx.send_cq,
            recv_cq: &small_cq,
            max_send_wr: SQ_DEPTH,
            max_recv_wr: wrs,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            max_mtu: None,
        })
        .map_err(|e| e.to_string())?;
    let ring = rx
        .pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let src = rx
        .pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let list: Vec<RecvWr<'_>> = (0..u64::from(wrs)).map(RecvWr::zero_length).collect();
    qp_rx.post_recv(&list).map_err(|e| e.to_string())?;
    qp_rx
        .connect(&rx.qp.local_endpoint())
        .map_err(|e| e.to_string())?;
    rx.qp
        .connect(&qp_rx.local_endpoint())
        .map_err(|e| e.to_string())?;
    let sge = Some(Sge::new(&src, 0, 64));
    let sends: Vec<SendWr<'_>> = (0..u64::from(wrs))
        .map(|i| SendWr::write_with_imm(i, sge, ring.addr(), ring.rkey(), i as u32))
        .collect();
    for chunk in sends.chunks(16) {
        rx.qp.post_send(chunk).map_err(|e| e.to_string())?;
    }
    let handle = small_cq.handle();
    let events = collect_events(device, a.timeout, |seen| {
        seen.iter()
            .any(|e| matches!(e, AsyncEvent::CqError { cq } if *cq == handle))
    });
    let state = qp_rx.state();
    let refused = qp_rx.post_send(&[SendWr::send(0, None)]);
    let summary = format!(
        "role=cq-overflow cq_depth={depth} writes={wrs} events={events:?} qp_state={state} post_send_after={}",
        match &refused {
            Ok(()) => "accepted".to_owned(),
            Err(e) => e.to_string(),
        }
    );
    if !events
        .iter()
        .any(|e| matches!(e, AsyncEvent::CqError { cq } if *cq == handle))
    {
        return Err(format!("{summary}: no CQ error event"));
    }
    if state != QpState::Error {
        return Err(format!("{summary}: the QP is not in ERROR"));
    }
    if refused.is_ok() {
        return Err(format!("{summary}: post_send on an ERROR QP was accepted"));
    }
    // Destroy the QPs before the MRs they wrote into: rxe 6.1 keeps a reference from a QP that
    // failed in the middle of an inbound RDMA WRITE to the target MR, and deregistering that MR
    // first blocks for rxe's pool cleanup timeout (about 50 s, "WARNING ... rxe_pool.c:255
    // __rxe_cleanup").
    drop(qp_rx);
    drop(rx);
    Ok(summary)
}

/// Waits for the port to go down and come back (the scenario toggles the netdev under rxe):
/// `IBV_EVENT_PORT_ERR` then `IBV_EVENT_PORT_ACTIVE`, surfaced as [`AsyncEvent::PortChange`].
fn run_port_events(a: &Args) -> Result<String> {
    let s = open(a)?;
    println!("READY");
    let _ = std::io::stdout().flush();
    let down_then_up = |seen: &[AsyncEvent]| {
        let down = seen
            .iter()
            .position(|e| matches!(e, AsyncEvent::PortChange { active: false, .. }));
        down.is_some_and(|d| {
            seen.iter()
                .skip(d)
                .any(|e| matches!(e, AsyncEvent::PortChange { active: true, .. }))
        })
    };
    let events = collect_events(&s.device, a.timeout, down_then_up);
    let summary = format!("role=port-events events={events:?}");
    if !down_then_up(&events) {
        return Err(format!("{summary}: expected port down then up"));
    }
    Ok(summary)
}

#[path = "rxe_uc_parts/srq_many.rs"]
mod srq_many;

fn main() -> ExitCode {
    let result = parse_args().and_then(|a| match a.role.as_str() {
        "recv" => run_recv(&a),
        "send" => run_send(&a),
        "cq-overflow" => run_cq_overflow(&a),
        "port-events" => run_port_events(&a),
        "srq-many" => srq_many::run(&a),
        r => Err(format!(
            "unknown role {r:?} (recv, send, cq-overflow, port-events, srq-many)"
        )),
    });
    match result {
        Ok(summary) => {
            println!("RESULT ok {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("RESULT fail {e}");
            ExitCode::FAILURE
        }
    }
}
