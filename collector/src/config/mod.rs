//! The collector's YAML configuration (DESIGN.md §9): strict (`deny_unknown_fields`), units in
//! key names, every key optional with the default documented here, all problems reported at
//! once with file, line and key by [`uctel_common::config`].
//!
//! ```yaml
//! listen:
//!   control: 0.0.0.0:7400          # TCP control plane (agents connect here)
//!   metrics: :9470                 # Prometheus /metrics (":PORT": every interface)
//! transport:
//!   kind: soft                     # soft | verbs
//!   soft:
//!     bind: 0.0.0.0:4791           # UDP socket of the soft RoCEv2 device (RoCEv2 port)
//!     advertise_addr: 192.0.2.10:4791  # what agents send to when bind is a wildcard
//!     mtu_bytes: 4096
//!     recv_buffer_bytes: 33554432   # sets the credit budget
//!     send_buffer_bytes: 4194304
//!     fault:                       # optional fault injection (tests, demos)
//!       drop_ratio: 0.01
//!   verbs:
//!     device: mlx5_0               # default: the first device
//!     port: 1
//!     gid_index: 3                 # default: the RoCE v2 GID of local_ip
//!     local_ip: 192.0.2.10
//! ring:
//!   slots: 1024                    # largest ring; each agent's from its Hello rate
//!   min_slots: 64                  # smallest ring
//!   slot_bytes: 4096               # >= max_frame_bytes
//!   credit_margin_slots: 64        # agent may have slots - margin frames outstanding
//!   credit_budget_frames: 20000    # default: what the soft socket's receive buffer holds
//!   send_buffers: 256              # receive WRs with buffers, for the Send data path
//!   descriptor_queue: 8192         # completions waiting beyond the credit windows
//!   data_path: auto                # auto | write_with_imm | send
//! max_frame_bytes: 4096
//! auth:
//!   agents:
//!     - id: web-1
//!       token_file: /etc/uctel/web-1.token   # or token_env: VAR, or token: inline
//!   shared:                        # optional: any agent id presenting this token
//!     token_env: UCTEL_SHARED_TOKEN
//! control:
//!   heartbeat_interval_seconds: 5
//!   report_interval_seconds: 1
//!   dead_after_missed_heartbeats: 3
//!   handshake_timeout_seconds: 5
//! staleness_seconds: 300
//! series_cap_per_agent: 100000
//! metrics:
//!   expose_timestamps: true        # each sample with the agent's collection time
//!   agent_up_retention_seconds: 3600
//! max_dropout_frames: 3000
//! reorder_window_frames: 100
//! reorder_window_seconds: 1
//! logs:
//!   sink: file                     # file | stdout
//!   file:
//!     path: /var/lib/uctel/logs.jsonl
//!     max_file_bytes: 104857600
//!     max_files: 5
//! ```
//!
//! `docs/configuration.md` is generated from the types and doc comments below (their field
//! docs are the operators' reference) and takes its examples from the block above.
//!
//! Port choices: 7400 for control and 9470 for metrics are uctel's defaults (not registered
//! ports); 4791 is the IANA RoCEv2 port. On one host (loopback demo) the agent's soft device
//! binds its own UDP port, so only the collector uses 4791.

pub mod outputs;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uctel_common::config::reference::{Reference, Sources};
use uctel_common::config::{FaultSection, Problems, Validate};
use uctel_transport::soft::device::{self, SoftConfig};
use uctel_transport::soft::fault::{FaultConfig, FaultConfigError};
use uctel_transport::soft::udp::{self, UdpConfig};

/// The whole collector configuration.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listening addresses.
    pub listen: ListenConfig,
    /// The RDMA transport.
    pub transport: TransportConfig,
    /// Per-agent ring and receive queue sizing.
    pub ring: RingConfig,
    /// Largest frame accepted (header included), bytes. Default 4096 (one packet at the largest
    /// RoCE path MTU, `uctel_protocol::limits::Limits::max_frame_bytes`).
    pub max_frame_bytes: MaxFrameBytes,
    /// Agent authentication (required: list `agents`, set `shared`, or both; with neither, no
    /// agent could connect and the configuration is refused).
    pub auth: AuthConfig,
    /// Control-plane timing.
    pub control: ControlConfig,
    /// Series not updated for this long disappear from `/metrics`. Default 300 s (Prometheus
    /// marks series stale after 5 minutes without samples).
    pub staleness_seconds: Seconds<300>,
    /// Most series stored per agent; samples of further series are dropped and counted
    /// (`series_cap`). Default 100 000. A reload changes it live (a lower cap refuses new
    /// series only).
    pub series_cap_per_agent: SeriesCap,
    /// How `/metrics` exposes the agents' series and their liveness.
    pub metrics: MetricsConfig,
    /// A forward jump in a sequence larger than this is a resync, not loss (RFC 3550 A.1
    /// `MAX_DROPOUT`, default 3000).
    pub max_dropout_frames: Count<3000>,
    /// A backward step at most this large is a late frame; larger is stale (RFC 3550 A.1
    /// `MAX_MISORDER`, default 100). A missing frame is counted lost once this many later
    /// frames arrived, or `reorder_window_seconds` after the first later frame, whichever
    /// comes first.
    pub reorder_window_frames: Count<100>,
    /// The reorder window in time (RFC 8985 RACK's `reo_wnd`): a missing frame is counted
    /// lost once a later frame of its sequence arrived at least this long ago, even while
    /// fewer than `reorder_window_frames` later frames arrived, so loss on a slow stream
    /// shows in `frames_lost_total` within about this time plus 0.1 s (the collector's
    /// sweep) instead of after 100 frames. A frame that arrives after that is stale
    /// (`frames_stale_total`), not received. Default 1 s, far above the reordering of a
    /// network path or a NIC.
    pub reorder_window_seconds: Seconds<1>,
    /// Where received log records go.
    pub logs: LogsConfig,
    /// Outputs to other machines (Prometheus remote-write), beside `/metrics` and `logs`.
    pub outputs: outputs::OutputsConfig,
    /// The log filter, in the syntax of `--log-level` (`info`,
    /// `warn,uctel_collector::ingest=debug`). `--log-level` wins over it, and it wins over
    /// `RUST_LOG`. A reload (`SIGHUP`, `POST /-/reload`) applies it live (README "Reload").
    /// Default: `RUST_LOG`, else `info`.
    pub log_level: Option<String>,
}

/// `listen:` section. Addresses are `IP:PORT`, `[IPv6]:PORT`, or `:PORT` for every IPv4
/// interface (`uctel_common::listen`, like an exporter's `--web.listen-address=:9100`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// TCP address of the control plane. Default `0.0.0.0:7400`. Port 0 picks a free port.
    #[serde(deserialize_with = "uctel_common::listen::deserialize")]
    pub control: SocketAddr,
    /// TCP address of the `/metrics` endpoint. Default `0.0.0.0:9470`. Port 0 picks one.
    #[serde(deserialize_with = "uctel_common::listen::deserialize")]
    pub metrics: SocketAddr,
    /// Serve the endpoints that change the running collector on the metrics port (as
    /// Prometheus's `--web.enable-lifecycle` guards its `/-/reload` and `/-/quit`):
    /// `POST /-/drain` drains the collector, as `SIGUSR1` does; `POST /-/reload` reloads the
    /// configuration, as `SIGHUP` does; `PUT` and `DELETE /api/v1/log_level` change the log
    /// filter. Off by default, because anyone who can reach the port could then use them;
    /// without it they answer 403 (`GET /api/v1/log_level` always answers).
    pub enable_lifecycle: bool,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            control: SocketAddr::from(([0, 0, 0, 0], 7400)),
            metrics: SocketAddr::from(([0, 0, 0, 0], 9470)),
            enable_lifecycle: false,
        }
    }
}

/// Which transport implementation.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TransportKindConfig {
    /// RoCEv2 UC in user space over UDP.
    #[default]
    Soft,
    /// Real RDMA through libibverbs; needs a build with the `verbs` cargo feature
    /// (`cargo build -p uctel-collector --features verbs`): `--check-config` refuses it in a
    /// binary without.
    Verbs,
}

/// `transport:` section. Only the section named by `kind` is used.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TransportConfig {
    /// `soft` (default) or `verbs`.
    pub kind: TransportKindConfig,
    /// Soft transport settings: the UDP socket, advertised address, MTU, progress mode,
    /// optional fault injection.
    #[serde(
        deserialize_with = "deserialize_soft",
        serialize_with = "serialize_soft"
    )]
    pub soft: SoftConfig,
    /// Verbs transport settings.
    pub verbs: VerbsTransportConfig,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            kind: TransportKindConfig::default(),
            // The collector's own defaults (`progress: worker`), not the device's.
            soft: SoftConfig::from(&SoftSection::default()),
            verbs: VerbsTransportConfig::default(),
        }
    }
}

/// `transport.soft:` section: the soft RoCEv2 device (`uctel_transport::soft::device::SoftConfig`
/// with its UDP socket's settings in the same section).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SoftSection {
    /// UDP address of the soft RoCEv2 device: `IP:PORT`, `[IPv6]:PORT` or `:PORT` (every
    /// interface). Default `0.0.0.0:4791` (4791 is the IANA RoCEv2 port); port 0 picks a free
    /// port.
    #[serde(deserialize_with = "uctel_common::listen::deserialize")]
    pub bind: SocketAddr,
    /// Address agents send to when `bind` is a wildcard address; default the bind address.
    pub advertise_addr: Option<SocketAddr>,
    /// Largest path MTU offered: 256, 512, 1024, 2048 or 4096 (default, as the agent's).
    /// The QP uses the smaller of both sides'. The soft transport's packets are UDP
    /// datagrams, which IP fragments on a 1500-byte link: set 1024 (rxe's MTU on a
    /// 1500-byte netdev, and a RoCE NIC's there) where fragments are unwelcome; the agents'
    /// frames then hold a quarter as much, and their rings follow (the agent announces the
    /// frame rate it measured).
    pub mtu_bytes: u32,
    /// How the device makes progress.
    pub progress: ProgressSection,
    /// How long the device waits before retrying after the socket refused packets (and, on
    /// links it cannot sleep on, how long a round waits for datagrams), 1 to 1000000: the
    /// progress thread in `thread` mode, the worker's sleep in `worker` and `busy_poll`. An
    /// idle device sleeps on the socket regardless.
    pub progress_wait_microseconds: u64,
    /// Most datagrams sent or received per system call, 1 to 1024.
    pub batch: usize,
    /// Receive buffer (`SO_RCVBUF`, `SO_RCVBUFFORCE` where allowed, else capped at
    /// `net.core.rmem_max`) requested for the socket; `null` keeps the system's default.
    /// Default 32 MiB: it sets the credit budget (`ring.credit_budget_frames`, measured at
    /// start: about 29,000 datagrams of 1 KiB on a 6.x kernel, 29 ms at a million frames per
    /// second). Datagrams that find it full are lost (counted as frames lost).
    pub recv_buffer_bytes: Option<usize>,
    /// Send buffer (`SO_SNDBUF`) requested for the socket; `null` keeps the system's default.
    pub send_buffer_bytes: Option<usize>,
    /// Receive buffer per datagram; larger datagrams are dropped and counted. Default 9216
    /// (jumbo frames; the largest RoCE packet at MTU 4096 is 4132 bytes of UDP payload).
    pub max_datagram_bytes: usize,
    /// How the socket is waited on.
    pub poll_mode: PollModeSection,
    /// With an IPv6 wildcard `bind`: accept IPv6 only (`IPV6_V6ONLY`). Default false
    /// (dual-stack).
    pub only_v6: bool,
    /// UDP segmentation offload on send (`UDP_SEGMENT`, Linux `include/uapi/linux/udp.h`,
    /// `net/ipv4/udp_offload.c`): runs of same-size datagrams to one peer go to the kernel
    /// in one system call of up to 64 datagrams and 65,000 bytes. Default true; switched off
    /// by itself where the kernel refuses it.
    pub gso: bool,
    /// UDP receive offload (`UDP_GRO`, Linux `include/uapi/linux/udp.h`,
    /// `net/ipv4/udp_offload.c`): the kernel may hand several datagrams of one agent as one
    /// buffer, split back into datagrams; each receive slot is then 64 KiB. Default true;
    /// off where the kernel refuses it.
    pub gro: bool,
    /// Device name in logs and metric labels.
    pub name: String,
    /// Fault injection on the collector's datagrams (tests and demos). Off by default.
    pub fault: FaultSection,
}

/// `transport.soft.progress`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProgressSection {
    /// A background thread acts as the NIC: it sleeps while nothing arrives; the worker
    /// takes each completion from it (a hand-off between cores per frame).
    Thread,
    /// No thread: the data-plane worker drives the device as it polls each CQ; lowest
    /// latency, one core busy.
    BusyPoll,
    /// No thread: the data-plane worker drives the device once per round, then processes
    /// what it received where it polls the CQs — one thread from the socket to the store,
    /// no hand-off between cores. It never spins on an empty socket and sleeps on it when
    /// idle; under a steady stream a round that found only a few packets pauses 50 µs so
    /// the socket gathers a batch (frames wait up to about 0.1 ms longer). The default:
    /// 13–37 % more frames per collector CPU-second than `thread` in the same build at 10
    /// agents (BENCHMARKS.md).
    /// RC lanes' acknowledgements go out while the worker runs, so a worker stalled for
    /// longer than the agents' RC retry budget (`transport.rc`) ends their RC sessions.
    #[default]
    Worker,
}

/// `transport.soft.poll_mode`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PollModeSection {
    /// Sleep in `poll(2)` until a datagram arrives (default).
    #[default]
    Blocking,
    /// Spin on non-blocking `recvmmsg(2)`.
    BusyPoll,
}

/// The collector's default `transport.soft.mtu_bytes`: the agent's default too, so a
/// default pair frames a host collection in 4 KiB packets (RoCEv2 over the soft transport is
/// UDP, which IP fragments where a link's MTU is smaller).
pub const DEFAULT_MTU_BYTES: u32 = 4096;

/// The collector's default `transport.soft.recv_buffer_bytes`: the credit budget.
pub const DEFAULT_RECV_BUFFER_BYTES: usize = 32 << 20;

impl Default for SoftSection {
    fn default() -> Self {
        SoftSection {
            progress: ProgressSection::default(),
            recv_buffer_bytes: Some(DEFAULT_RECV_BUFFER_BYTES),
            mtu_bytes: DEFAULT_MTU_BYTES,
            ..SoftSection::from(&SoftConfig::default())
        }
    }
}

impl From<&SoftConfig> for SoftSection {
    fn from(c: &SoftConfig) -> Self {
        let f = c.faults.clone().unwrap_or_default();
        SoftSection {
            bind: c.udp.bind,
            advertise_addr: c.advertise_addr,
            mtu_bytes: c.mtu_bytes,
            progress: match c.progress {
                device::ProgressMode::Thread => ProgressSection::Thread,
                device::ProgressMode::BusyPoll => ProgressSection::BusyPoll,
                device::ProgressMode::Driven => ProgressSection::Worker,
            },
            progress_wait_microseconds: c.progress_wait_micros,
            batch: c.batch,
            recv_buffer_bytes: c.udp.recv_buffer_bytes,
            send_buffer_bytes: c.udp.send_buffer_bytes,
            max_datagram_bytes: c.udp.max_datagram_bytes,
            poll_mode: match c.udp.poll_mode {
                udp::PollMode::Blocking => PollModeSection::Blocking,
                udp::PollMode::BusyPoll => PollModeSection::BusyPoll,
            },
            only_v6: c.udp.only_v6,
            gso: c.udp.gso,
            gro: c.udp.gro,
            name: c.name.clone(),
            fault: FaultSection::from(&f),
        }
    }
}

impl From<&SoftSection> for SoftConfig {
    fn from(s: &SoftSection) -> Self {
        let f = &s.fault;
        let faults = FaultConfig::from(f);
        SoftConfig {
            name: s.name.clone(),
            udp: UdpConfig {
                bind: s.bind,
                recv_buffer_bytes: s.recv_buffer_bytes,
                send_buffer_bytes: s.send_buffer_bytes,
                batch: s.batch,
                max_datagram_bytes: s.max_datagram_bytes,
                poll_mode: match s.poll_mode {
                    PollModeSection::Blocking => udp::PollMode::Blocking,
                    PollModeSection::BusyPoll => udp::PollMode::BusyPoll,
                },
                only_v6: s.only_v6,
                gso: s.gso,
                gro: s.gro,
            },
            advertise_addr: s.advertise_addr,
            mtu_bytes: s.mtu_bytes,
            progress: match s.progress {
                ProgressSection::Thread => device::ProgressMode::Thread,
                ProgressSection::BusyPoll => device::ProgressMode::BusyPoll,
                ProgressSection::Worker => device::ProgressMode::Driven,
            },
            progress_wait_micros: s.progress_wait_microseconds,
            batch: s.batch,
            faults: (*f != FaultSection::default()).then_some(faults),
        }
    }
}

fn deserialize_soft<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SoftConfig, D::Error> {
    SoftSection::deserialize(d).map(|s| SoftConfig::from(&s))
}

fn serialize_soft<S: serde::Serializer>(c: &SoftConfig, s: S) -> Result<S::Ok, S::Error> {
    SoftSection::from(c).serialize(s)
}

/// `transport.verbs:` section (`uctel_transport::device::VerbsConfig`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VerbsTransportConfig {
    /// RDMA device name (`mlx5_0`, `rxe0`); default the first device.
    pub device: Option<String>,
    /// 1-based port number. Default 1.
    pub port: u8,
    /// GID table index; default the RoCE v2 GID of `local_ip`.
    pub gid_index: Option<u8>,
    /// Local IP address whose RoCE v2 GID to use.
    pub local_ip: Option<IpAddr>,
}

impl Default for VerbsTransportConfig {
    fn default() -> Self {
        Self {
            device: None,
            port: 1,
            gid_index: None,
            local_ip: None,
        }
    }
}

/// `ring:` section: what each agent connection gets.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RingConfig {
    /// Ring slots of the largest ring (frame `c` goes to slot `c mod slots`, DESIGN.md §4).
    /// Each agent's ring is sized from the rate it announces in `Hello`
    /// (`collector.expected_frames_per_second` × `control.report_interval_seconds` × 2,
    /// rounded up to a power of two) within `min_slots..=slots`; an agent that announces no
    /// rate gets this many. Default 1024.
    pub slots: u32,
    /// Ring slots of the smallest ring (at most `slots`: a larger value means `slots`).
    /// Memory per agent at the defaults: 64 slots × 4 KiB = 256 KiB of ring (pinned on
    /// verbs). Default 64.
    pub min_slots: u32,
    /// Bytes per slot; at least `max_frame_bytes`. Default 4096.
    pub slot_bytes: u32,
    /// Credit margin: an agent may have at most `slots − margin` frames outstanding in its
    /// ring of `slots` (DESIGN.md §4 credits), margin = the smaller of this and an eighth of
    /// its ring. Default 64.
    pub credit_margin_slots: u32,
    /// The collector-wide credit budget in frames (DESIGN.md §4): the frames all agents
    /// together may have in flight or still send. Default: on the soft transport, what the
    /// UDP socket's granted receive buffer holds (measured at start on a loopback socket of
    /// the same size, for full-size packets), so even a burst of every agent's whole window
    /// at the same instant cannot overflow it; on verbs, no shared limit (each connection's
    /// receive queue and CQ are sized to its own window). Raise
    /// `transport.soft.recv_buffer_bytes` (and `net.core.rmem_max`) to grow it.
    pub credit_budget_frames: Option<u64>,
    /// Receive WRs with `max_frame_bytes` buffers kept posted for the Send data path.
    /// Default 256. On that path the credit window is at most this many frames.
    pub send_buffers: u32,
    /// Completions that may wait for the data-plane worker beyond the credit windows of
    /// the connected agents, in completions (one per frame). The worker processes each
    /// completion where it polls it; completions wait only while it is paused (a test
    /// hook), each connection's window always has room, and only completions beyond it (an
    /// agent ignoring credits) take this shared room; when it is taken, such frames are
    /// dropped and counted as `queue_full`. Memory: 12 bytes per waiting completion.
    /// Default 8192.
    pub descriptor_queue: u32,
    /// Which data path to ask agents for (DESIGN.md §4): `auto` (default: Write-with-immediate
    /// when the agent offers it, else Send), `write_with_imm` or `send` (agents that do not
    /// offer it are refused with `transport_mismatch`).
    pub data_path: DataPathConfig,
}

/// `ring.data_path`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DataPathConfig {
    /// Write-with-immediate if offered, else Send.
    #[default]
    Auto,
    /// Only RDMA Write-with-immediate into the ring.
    WriteWithImm,
    /// Only Send into posted receive buffers.
    Send,
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            slots: 1024,
            min_slots: 64,
            slot_bytes: 4096,
            credit_margin_slots: 64,
            credit_budget_frames: None,
            send_buffers: 256,
            descriptor_queue: 8192,
            data_path: DataPathConfig::Auto,
        }
    }
}

impl RingConfig {
    /// The credit window of the largest ring: `slots - credit_margin_slots`.
    pub fn credit_window(&self) -> u32 {
        self.window_of(self.slots)
    }

    /// The credit window of a ring of `slots`: `slots − min(credit_margin_slots, slots / 8)`.
    pub fn window_of(&self, slots: u32) -> u32 {
        slots.saturating_sub(self.credit_margin_slots.min(slots / 8))
    }

    /// Slots of the ring of an agent announcing `frames_per_second` (`None`: the largest),
    /// with reports every `report_interval_seconds`: twice the frames of one report
    /// interval, rounded up to a power of two, within `min_slots..=slots`.
    pub fn slots_for(&self, frames_per_second: Option<u32>, report_interval_seconds: f64) -> u32 {
        let Some(rate) = frames_per_second else {
            return self.slots;
        };
        let per_interval = (f64::from(rate) * report_interval_seconds.max(0.0) * 2.0).ceil();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let need = if per_interval >= f64::from(self.slots) {
            self.slots
        } else {
            (per_interval as u32).max(1).next_power_of_two()
        };
        need.clamp(self.min_slots.min(self.slots), self.slots)
    }
}

/// Where a secret comes from: exactly one of the three keys.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSource {
    /// The token inline (avoid in files under version control).
    pub token: Option<String>,
    /// A file whose content (trailing whitespace trimmed) is the token.
    pub token_file: Option<PathBuf>,
    /// An environment variable holding the token.
    pub token_env: Option<String>,
}

/// A resolved pre-shared token. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl Token {
    /// The token bytes (HMAC key).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

impl TokenSource {
    /// Reads the token. Errors: none or several sources given, unreadable file, unset
    /// variable, empty token.
    pub fn resolve(&self) -> Result<Token, String> {
        let given = [
            self.token.is_some(),
            self.token_file.is_some(),
            self.token_env.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        if given != 1 {
            return Err(format!(
                "give exactly one of token, token_file, token_env (found {given})"
            ));
        }
        let raw = if let Some(t) = &self.token {
            t.clone()
        } else if let Some(path) = &self.token_file {
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read token_file {}: {e}", path.display()))?
        } else if let Some(var) = &self.token_env {
            std::env::var(var).map_err(|e| format!("token_env {var}: {e}"))?
        } else {
            String::new()
        };
        let trimmed = raw.trim_end();
        if trimmed.is_empty() {
            return Err("token is empty".to_string());
        }
        Ok(Token(trimmed.as_bytes().to_vec()))
    }
}

/// One known agent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentAuth {
    /// The agent id it presents in `Hello`.
    pub id: String,
    /// Its token.
    #[serde(default)]
    pub token: Option<String>,
    /// Its token, from a file.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Its token, from an environment variable.
    #[serde(default)]
    pub token_env: Option<String>,
}

impl AgentAuth {
    /// The token source of this entry.
    pub fn source(&self) -> TokenSource {
        TokenSource {
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            token_env: self.token_env.clone(),
        }
    }
}

/// `auth:` section. An agent is admitted if its id is listed with the token it proves, or if
/// it proves the shared token. With neither configured every agent is refused.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Per-agent tokens.
    pub agents: Vec<AgentAuth>,
    /// A token any agent id may prove.
    pub shared: Option<TokenSource>,
}

/// `control:` section, all in seconds (fractions allowed).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Heartbeat period in both directions. Default 5.
    pub heartbeat_interval_seconds: f64,
    /// Period of `Report`s to the agent (received, lost, consumed sequence = credits).
    /// Default 1; lower means credits return faster. Sessions report in groups of 64 on one
    /// phase of the interval (one wake-up serves a group), the groups spread over it.
    pub report_interval_seconds: f64,
    /// The connection is torn down after this many heartbeat periods of silence. Default 3.
    pub dead_after_missed_heartbeats: u32,
    /// Time allowed from TCP accept to `Welcome`. Default 5.
    pub handshake_timeout_seconds: f64,
    /// Most agents connected at once. A further agent is refused at once with `busy`, and
    /// an agent with a pool of collectors moves on to its next one. Default: no limit. A
    /// reload changes it live for the next connections (none connected is sent away).
    pub max_agents: Option<u32>,
    /// Longest drain (`SIGUSR1` or `POST /-/drain`): the collector refuses new agents with
    /// `draining`, tells every connected agent to move (each ends its epoch with a
    /// `Goodbye` and connects to its next collector), and exits when the last one has left
    /// or after this long, whichever comes first. Default 30.
    pub drain_timeout_seconds: f64,
    /// Grant credit by RDMA WRITE into the memory of agents that offer it (`Hello` names a
    /// region; DESIGN.md §4): the consumed point and grant are written at every report
    /// interval (a lost write is superseded by the next) and at once when an agent runs out
    /// of credit, and the agent reads them with no system call and no message. Agents that
    /// do not offer it get their credits in `Report`s as before. Default true.
    pub credit_writes: bool,
    /// While an agent's credits are written into its memory, its `Report` (delivery
    /// figures, loss fraction) goes every this many report intervals instead of every one
    /// (an agent with an RC lane keeps one per interval: the RC lane's credit is in it).
    /// Default 10.
    pub credit_writes_report_every_intervals: u32,
    /// Post the credit writes of all agents due in one round together (DESIGN.md §4): the
    /// writes that fall due within about a millisecond of each other (the sessions of one
    /// report group tick at one instant) go to the transport in one call of at most 256
    /// writes: on the soft transport one `sendmmsg` for up to `transport.soft.batch`
    /// of them, on verbs one `ibv_post_send` per agent's QP. An early write (an agent out of
    /// credit) waits at most 2 ms for its round. `false` posts each write on its own at
    /// once (one transmit pass, one system call each). Default true.
    pub credit_write_batching: bool,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_seconds: 5.0,
            report_interval_seconds: 1.0,
            dead_after_missed_heartbeats: 3,
            handshake_timeout_seconds: 5.0,
            max_agents: None,
            drain_timeout_seconds: 30.0,
            credit_writes: true,
            credit_writes_report_every_intervals: 10,
            credit_write_batching: true,
        }
    }
}

/// `metrics:` section: how `/metrics` exposes what the agents sent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Expose every agent sample with the time the agent collected it, in ms since the Unix
    /// epoch after the value (`node_load1{agent="web-1",instance="web-1"} 0.5 1700000000123`),
    /// as Prometheus federation does; Prometheus keeps it (`honor_timestamps`, true by
    /// default). Without it Prometheus stamps each sample with its scrape time, which is up
    /// to one collection interval later than when the value was read and moves with the
    /// scrape phase, so `rate()` over a few collection intervals is wrong by as much as a
    /// whole interval's increase (measured: samples collected every 5 s read through
    /// `rate(...[10s])` came out at 0.55 to 1.12 times the true rate; with the timestamps,
    /// 0.997 to 1.001). Times come from the agent's clock (the sample's own
    /// timestamp, else its frame's); keep agent clocks synchronised (NTP).
    /// What Prometheus does with timestamped samples: a sample older than its TSDB head
    /// accepts (about an hour behind its newest data) is dropped as out of bounds, one older
    /// than the series' last sample as out of order (a late frame, an agent clock stepped
    /// back), the same sample scraped again is ignored; each is counted by Prometheus
    /// (`prometheus_target_scrapes_sample_out_of_*_total`), never an error of the scrape.
    /// Series that leave `/metrics` get no staleness marker in Prometheus before 2.48 (set
    /// `track_timestamps_staleness: true` in the scrape job from 2.48 on): a gone agent's
    /// series then fade after Prometheus' 5-minute lookback; alert and count agents on
    /// `uctel_collector_agent_up`, which has no timestamp. `false` gives the scrape-time
    /// stamps. Default true.
    pub expose_timestamps: bool,
    /// After an agent's session ended (its `Goodbye`, its control connection lost, or
    /// `control.dead_after_missed_heartbeats` heartbeats missed) and no newer connection
    /// of it took over, its series leave `/metrics` at once and
    /// `uctel_collector_agent_up{agent}` drops to 0; the 0 stays this long, so an alert on
    /// it fires and is seen, then the series goes (agent ids that never return do not pile
    /// up). An agent that comes back is 1 again. Default 3600 (one hour).
    pub agent_up_retention_seconds: Seconds<3600>,
    /// Take metrics as values of series defined once per epoch (frame kind
    /// `metrics_dict`, `uctel_protocol::dict`) from agents that announce it in `Hello`:
    /// the collector says so in its `Welcome` and acknowledges the series it learnt
    /// (`DictAck`, at most once per report interval per stream, only when the number
    /// grew). `false`: agents keep sending `kind = metrics` frames, every series named in
    /// every frame. Default true.
    pub series_dictionary: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            expose_timestamps: true,
            agent_up_retention_seconds: Seconds::default(),
            series_dictionary: true,
        }
    }
}

/// Where log records go.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogSinkKind {
    /// JSON Lines on standard output (development).
    #[default]
    Stdout,
    /// JSON Lines files with size-based rotation.
    File,
}

/// `logs:` section.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogsConfig {
    /// `stdout` (default) or `file`.
    pub sink: LogSinkKind,
    /// Settings of the `file` sink.
    pub file: LogFileConfig,
}

/// `logs.file:` section.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogFileConfig {
    /// The active file; rotated files get `.1`, `.2`, ... (newest `.1`). Default
    /// `uctel-logs.jsonl` in the working directory.
    pub path: PathBuf,
    /// Rotate once the active file reaches this size, bytes. Default 100 MiB.
    pub max_file_bytes: u64,
    /// Rotated files kept (besides the active one). Default 5.
    pub max_files: u32,
}

impl Default for LogFileConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("uctel-logs.jsonl"),
            max_file_bytes: 100 * 1024 * 1024,
            max_files: 5,
        }
    }
}

// Small newtypes so that `#[serde(default)]` on the struct gives each scalar its own default.

/// Seconds with a compile-time default, fractions allowed.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct Seconds<const D: u64>(pub f64);

impl<const D: u64> Default for Seconds<D> {
    fn default() -> Self {
        Self(D as f64)
    }
}

impl<const D: u64> Seconds<D> {
    /// As a `Duration` (0 for negative or non-finite values, which validation rejects).
    pub fn duration(self) -> Duration {
        Duration::try_from_secs_f64(self.0).unwrap_or(Duration::ZERO)
    }
}

/// `max_frame_bytes` with its default of 4096.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct MaxFrameBytes(pub u32);

impl Default for MaxFrameBytes {
    fn default() -> Self {
        Self(4096)
    }
}

/// `series_cap_per_agent` with its default of 100 000.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SeriesCap(pub usize);

impl Default for SeriesCap {
    fn default() -> Self {
        Self(100_000)
    }
}

/// A count (`u64`) with a compile-time default.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Count<const D: u64>(pub u64);

impl<const D: u64> Default for Count<D> {
    fn default() -> Self {
        Self(D)
    }
}

/// Seconds given as `f64` must be finite and positive.
fn check_seconds(problems: &mut Problems, key: &str, value: f64) {
    if !value.is_finite() || value <= 0.0 || Duration::try_from_secs_f64(value).is_err() {
        problems.push(
            key,
            format!("must be a positive number of seconds, got {value}"),
        );
    }
}

/// Keys spelt otherwise before: the soft transport's keys as in the agent.
const RENAMED_KEYS: &[(&str, &str)] = &[
    ("transport.soft.faults", "transport.soft.fault"),
    (
        "transport.soft.fault.delay_ms",
        "transport.soft.fault.delay_milliseconds",
    ),
    ("transport.soft.udp.bind", "transport.soft.bind"),
    (
        "transport.soft.udp.recv_buffer_bytes",
        "transport.soft.recv_buffer_bytes",
    ),
    (
        "transport.soft.udp.send_buffer_bytes",
        "transport.soft.send_buffer_bytes",
    ),
    (
        "transport.soft.udp.max_datagram_bytes",
        "transport.soft.max_datagram_bytes",
    ),
    ("transport.soft.udp.batch", "transport.soft.batch"),
    ("transport.soft.udp.poll_mode", "transport.soft.poll_mode"),
    ("transport.soft.udp.only_v6", "transport.soft.only_v6"),
    (
        "transport.soft.progress_wait_micros",
        "transport.soft.progress_wait_microseconds",
    ),
];

impl Validate for Config {
    fn renamed_keys() -> &'static [(&'static str, &'static str)] {
        RENAMED_KEYS
    }

    fn validate(&self, p: &mut Problems) {
        self.outputs.validate(p);
        let frame = self.max_frame_bytes.0;
        let header = uctel_protocol::frame::HEADER_LEN as u32;
        if frame <= header {
            p.push(
                "max_frame_bytes",
                format!("must be more than the {header}-byte frame header"),
            );
        }
        self.validate_transport(p);
        self.validate_ring(p, frame);
        self.validate_auth(p);
        self.validate_timing(p);
        self.validate_logs(p);
        if let Some(level) = &self.log_level {
            if let Err(e) = uctel_common::logging::filter(level) {
                p.push("log_level", e.to_string());
            }
        }
    }
}

impl Config {
    /// `transport.*`: the soft transport's MTU, wait, batch and fault injection; the verbs
    /// transport only where built in.
    fn validate_transport(&self, p: &mut Problems) {
        if self.transport.kind == TransportKindConfig::Soft {
            let soft = &self.transport.soft;
            if uctel_transport::api::Mtu::from_bytes(soft.mtu_bytes).is_none() {
                p.push(
                    "transport.soft.mtu_bytes",
                    "must be an IB MTU: 256, 512, 1024, 2048 or 4096",
                );
            }
            if !(1..=1_000_000).contains(&soft.progress_wait_micros) {
                p.push(
                    "transport.soft.progress_wait_microseconds",
                    "must be from 1 to 1000000",
                );
            }
            if !(1..=1024).contains(&soft.batch) {
                p.push("transport.soft.batch", "must be from 1 to 1024");
            }
            match soft.faults.as_ref().map(FaultConfig::validate) {
                None | Some(Ok(())) => {}
                Some(Err(FaultConfigError::Ratio { field, value })) => p.push(
                    format!("transport.soft.fault.{field}"),
                    format!("must be a probability from 0 to 1, got {value}"),
                ),
                Some(Err(FaultConfigError::Reorder { ratio, window })) => p.push(
                    "transport.soft.fault.reorder_window",
                    format!(
                        "reordering needs both reorder_ratio and reorder_window above 0 (got \
                         {ratio} and {window})"
                    ),
                ),
            }
        }
        if self.transport.kind == TransportKindConfig::Verbs && !cfg!(feature = "verbs") {
            p.push(
                "transport.kind",
                "this uctel-collector was built without the verbs transport (cargo feature \
                 `verbs`)",
            );
        }
        if self.transport.verbs.port == 0 {
            p.push("transport.verbs.port", "ports are numbered from 1");
        }
    }

    /// `ring.*`: slots and their size against `max_frame_bytes` (`frame`), the memory region,
    /// credits and queues.
    fn validate_ring(&self, p: &mut Problems, frame: u32) {
        let r = &self.ring;
        if r.slots < 2 || r.slots > 1 << 16 {
            p.push(
                "ring.slots",
                "must be in 2..=65536 (one receive WR per slot; 65536 is the largest queue)",
            );
        }
        if r.slot_bytes < frame {
            p.push(
                "ring.slot_bytes",
                format!("must be at least max_frame_bytes ({frame})"),
            );
        }
        if u64::from(r.slots) * u64::from(r.slot_bytes) > 1 << 31 {
            p.push(
                "ring.slots",
                "slots * slot_bytes must not exceed 2 GiB (the largest UC message region)",
            );
        }
        if r.min_slots < 2 {
            p.push("ring.min_slots", "must be at least 2");
        }
        if r.credit_budget_frames == Some(0) {
            p.push("ring.credit_budget_frames", "must be at least 1 frame");
        }
        if r.credit_margin_slots >= r.slots {
            p.push(
                "ring.credit_margin_slots",
                format!("must be below ring.slots ({})", r.slots),
            );
        }
        if r.send_buffers == 0 || r.send_buffers > 1 << 16 {
            p.push("ring.send_buffers", "must be in 1..=65536");
        }
        if r.descriptor_queue < 2 {
            p.push("ring.descriptor_queue", "must be at least 2");
        }
    }

    /// `auth.*`: some agent can connect, agent ids unique, every key readable.
    fn validate_auth(&self, p: &mut Problems) {
        if self.auth.agents.is_empty() && self.auth.shared.is_none() {
            p.push(
                "auth",
                "no agent could connect: list auth.agents or set auth.shared",
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, a) in self.auth.agents.iter().enumerate() {
            if a.id.is_empty() || a.id.len() > 256 {
                p.push(format!("auth.agents[{i}].id"), "must be 1 to 256 bytes");
            }
            if !seen.insert(a.id.as_str()) {
                p.push(
                    format!("auth.agents[{i}].id"),
                    format!("agent id {:?} is listed twice", a.id),
                );
            }
            if let Err(e) = a.source().resolve() {
                p.push(format!("auth.agents[{i}]"), e);
            }
        }
        if let Some(shared) = &self.auth.shared {
            if let Err(e) = shared.resolve() {
                p.push("auth.shared", e);
            }
        }
    }

    /// `control.*` and the ingest's times and bounds (staleness, agent_up retention, series
    /// cap, dropout, reorder time).
    fn validate_timing(&self, p: &mut Problems) {
        let c = &self.control;
        check_seconds(
            p,
            "control.heartbeat_interval_seconds",
            c.heartbeat_interval_seconds,
        );
        check_seconds(
            p,
            "control.report_interval_seconds",
            c.report_interval_seconds,
        );
        check_seconds(
            p,
            "control.handshake_timeout_seconds",
            c.handshake_timeout_seconds,
        );
        if c.dead_after_missed_heartbeats == 0 {
            p.push("control.dead_after_missed_heartbeats", "must be at least 1");
        }
        if c.max_agents == Some(0) {
            p.push(
                "control.max_agents",
                "must be at least 1 (leave it out for no limit)",
            );
        }
        check_seconds(p, "control.drain_timeout_seconds", c.drain_timeout_seconds);
        check_seconds(p, "staleness_seconds", self.staleness_seconds.0);
        check_seconds(
            p,
            "metrics.agent_up_retention_seconds",
            self.metrics.agent_up_retention_seconds.0,
        );
        if self.series_cap_per_agent.0 == 0 {
            p.push("series_cap_per_agent", "must be at least 1");
        }
        if self.max_dropout_frames.0 == 0 {
            p.push("max_dropout_frames", "must be at least 1");
        }
        check_seconds(p, "reorder_window_seconds", self.reorder_window_seconds.0);
    }

    /// `logs.file.*` when logs go to a file: its path writable, its rotation bounds.
    fn validate_logs(&self, p: &mut Problems) {
        if self.logs.sink == LogSinkKind::File {
            let f = &self.logs.file;
            if f.path.as_os_str().is_empty() {
                p.push("logs.file.path", "must not be empty");
            } else if let Err(e) = check_path(&f.path) {
                p.push("logs.file.path", format!("cannot create {:?}: {e}", f.path));
            } else if let Err(e) = uctel_common::config::check_writable_file(&f.path) {
                p.push("logs.file.path", e);
            }
            if f.max_file_bytes < 4096 {
                p.push("logs.file.max_file_bytes", "must be at least 4096");
            }
            if f.max_files == 0 {
                p.push("logs.file.max_files", "must be at least 1");
            }
        }
    }
}

/// Loads and validates a collector configuration file.
///
/// # Errors
/// Every problem found, each with line and key path.
pub fn load(path: &std::path::Path) -> Result<Config, uctel_common::config::ConfigError> {
    uctel_common::config::load(path)
}

/// The keys that have no default or are off by default, for the reference's defaults (a
/// `remote_write` item, so that the reference shows its keys' defaults).
const REFERENCE_MINIMAL: &str = "\
auth:
  agents:
    - id: web-1
      token_file: /etc/uctel/web-1.token
  shared:
    token_env: UCTEL_SHARED_TOKEN
outputs:
  remote_write:
    - url: http://127.0.0.1:9090/api/v1/write
";

/// The configuration reference of the collector (`docs/configuration.md`,
/// `--print-default-config`), generated from these types and their doc comments.
pub fn reference() -> Reference {
    Reference::new::<Config>(Sources {
        daemon: "uctel-collector",
        rust: &[
            include_str!("mod.rs"),
            include_str!("outputs.rs"),
            uctel_common::config::SOURCE,
        ],
        minimal: REFERENCE_MINIMAL,
    })
}

/// Checks, without creating or changing anything, that a log file could be created at
/// `path`: it is not an existing directory, and the nearest existing ancestor of its
/// directory is a directory (the missing ones are created at open). Used by the
/// configuration check (`--check-config`) and before opening, so that a path under a regular
/// file reads "… is not a directory" rather than `create_dir_all`'s "File exists".
///
/// # Errors
/// [`io::ErrorKind::IsADirectory`] or [`io::ErrorKind::NotADirectory`] with a message naming
/// the offending path.
pub fn check_path(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it is a directory; name a file in it",
        ));
    }
    let mut dir = path.parent();
    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", d.display()),
                ))
            }
            Err(_) => dir = d.parent(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_common::config::from_str;

    const MINIMAL: &str = "auth:\n  shared:\n    token: s3cret\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c: Config = from_str("c.yaml", MINIMAL).unwrap();
        assert_eq!(c.listen.control.port(), 7400);
        assert_eq!(c.listen.metrics.port(), 9470);
        assert_eq!(c.transport.kind, TransportKindConfig::Soft);
        assert_eq!(c.transport.soft.udp.bind.port(), 4791);
        assert!(c.transport.soft.faults.is_none());
        assert_eq!(c.ring.credit_window(), 1024 - 64);
        assert_eq!(c.max_frame_bytes.0, 4096);
        assert_eq!(c.staleness_seconds.duration(), Duration::from_secs(300));
        assert_eq!(c.series_cap_per_agent.0, 100_000);
        assert_eq!(c.logs.sink, LogSinkKind::Stdout);
        let shared = c.auth.shared.unwrap().resolve().unwrap();
        assert_eq!(shared.as_bytes(), b"s3cret");
        assert_eq!(format!("{shared:?}"), "Token(<6 bytes>)");
    }

    #[test]
    fn every_problem_reported_with_line_and_key() {
        let text = "\
listen:
  control: 0.0.0.0:7400
  metric: 0.0.0.0:9470
transport:
  kind: infiniband
ring:
  slots: 1
  slot_bytes: 100
staleness_seconds: -1
auth:
  agents:
    - id: a
      token: x
      token_env: Y
";
        let err = from_str::<Config>("collector.yaml", text).unwrap_err();
        let shown = err.to_string();
        // Structural problems (serde) and semantic ones, all at once.
        assert!(
            shown.contains(
                "collector.yaml:3:3: listen.metric: unknown key; did you mean listen.metrics?"
            ),
            "{shown}"
        );
        assert!(
            shown.contains(
                "collector.yaml:5:9: transport.kind: expected soft or verbs, found infiniband"
            ),
            "{shown}"
        );
        let keys: Vec<_> = err.problems.iter().map(|p| p.key_path.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "listen.metric",
                "transport.kind",
                "ring.credit_margin_slots",
                "ring.slots",
                "ring.slot_bytes",
                "staleness_seconds",
                "auth.agents[0]"
            ],
            "{err}"
        );
        // A key left at its default is reported at its nearest ancestor in the file.
        assert_eq!(err.problems[2].line, Some(6));
        assert_eq!(err.problems[3].line, Some(7));
        assert!(err.problems[6].message.contains("exactly one"), "{err}");
    }

    #[test]
    fn the_soft_transport_keys_are_the_agents() {
        let text = format!(
            "{MINIMAL}transport:\n  soft:\n    bind: :4792\n    recv_buffer_bytes: 1048576\n    \
             progress_wait_microseconds: 100\n    fault:\n      drop_ratio: 0.5\n      \
             delay_milliseconds: 2\n"
        );
        let c: Config = from_str("c.yaml", &text).unwrap_or_else(|e| panic!("{e}"));
        let soft = &c.transport.soft;
        assert_eq!(soft.udp.bind, SocketAddr::from(([0, 0, 0, 0], 4792)));
        assert_eq!(soft.udp.recv_buffer_bytes, Some(1 << 20));
        assert_eq!(soft.progress_wait_micros, 100);
        let faults = soft.faults.clone().unwrap();
        assert_eq!((faults.drop_ratio, faults.delay_ms), (0.5, 2));
        // The old spellings are errors naming the key now used.
        let text = format!(
            "{MINIMAL}transport:\n  soft:\n    udp:\n      bind: 127.0.0.1:4791\n      batch: 8\n    \
             faults:\n      drop_ratio: 0.01\n    progress_wait_micros: 5\n"
        );
        let err = from_str::<Config>("c.yaml", &text).unwrap_err();
        let got: Vec<_> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key_path.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some(7),
                    "transport.soft.udp.bind",
                    "unknown key; did you mean transport.soft.bind?"
                ),
                (
                    Some(8),
                    "transport.soft.udp.batch",
                    "unknown key; did you mean transport.soft.batch?"
                ),
                (
                    Some(9),
                    "transport.soft.faults",
                    "unknown key; did you mean transport.soft.fault?"
                ),
                (
                    Some(11),
                    "transport.soft.progress_wait_micros",
                    "unknown key; did you mean transport.soft.progress_wait_microseconds?"
                ),
            ],
            "{err}"
        );
        // Defaults survive the mapping to the transport's configuration; the collector's
        // own default drives the device from the worker.
        let soft = Config::default().transport.soft;
        assert_eq!(soft, SoftConfig::from(&SoftSection::default()));
        assert_eq!(soft.progress, device::ProgressMode::Driven);
        assert_eq!(
            SoftSection::from(&soft),
            SoftSection::default(),
            "the mapping round-trips"
        );
    }

    #[test]
    fn verbs_needs_the_verbs_build() {
        let text = format!("{MINIMAL}transport:\n  kind: verbs\n");
        let loaded = from_str::<Config>("c.yaml", &text);
        if cfg!(feature = "verbs") {
            assert!(loaded.is_ok());
        } else {
            let err = loaded.unwrap_err();
            assert_eq!(err.problems.len(), 1, "{err}");
            assert_eq!(err.problems[0].key_path, "transport.kind");
            assert_eq!(err.problems[0].line, Some(5));
            assert!(err.problems[0]
                .message
                .contains("built without the verbs transport"));
        }
    }

    #[test]
    fn a_log_file_path_under_a_file_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("hostname");
        std::fs::write(&blocker, "h\n").unwrap();
        let text = format!(
            "{MINIMAL}logs:\n  sink: file\n  file:\n    path: {}\n",
            blocker.join("x.jsonl").display()
        );
        let err = from_str::<Config>("c.yaml", &text).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(err.problems[0].key_path, "logs.file.path");
        assert!(
            err.problems[0]
                .message
                .ends_with(&format!("{} is not a directory", blocker.display())),
            "{err}"
        );
        // A directory this user may not write to (only testable as another user than root).
        use std::os::unix::fs::PermissionsExt;
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        if std::fs::write(locked.join("probe"), "").is_err() {
            let text = format!(
                "{MINIMAL}logs:\n  sink: file\n  file:\n    path: {}\n",
                locked.join("x.jsonl").display()
            );
            let err = from_str::<Config>("c.yaml", &text).unwrap_err();
            assert!(
                err.problems[0].message.ends_with("Permission denied"),
                "{err}"
            );
        }
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The same path with the stdout sink is not used, so not checked.
        let text = text.replace("sink: file", "sink: stdout");
        assert!(from_str::<Config>("c.yaml", &text).is_ok());
    }

    #[test]
    fn listen_addresses_take_a_bare_port_and_bad_ports_are_named() {
        let text = format!("{MINIMAL}listen:\n  control: \":7401\"\n  metrics: :9471\n");
        let c: Config = from_str("c.yaml", &text).unwrap();
        assert_eq!(c.listen.control, SocketAddr::from(([0, 0, 0, 0], 7401)));
        assert_eq!(c.listen.metrics, SocketAddr::from(([0, 0, 0, 0], 9471)));
        let text = format!("{MINIMAL}listen:\n  control: :74000\n  metrics: 127.0.0.1\n");
        let err = from_str::<Config>("c.yaml", &text).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("c.yaml:5:12: listen.control: port 74000 in \":74000\" is out of range"),
            "{shown}"
        );
        assert!(
            shown.contains("listen.metrics: \"127.0.0.1\" has no port"),
            "{shown}"
        );
    }

    #[test]
    fn no_auth_is_a_problem() {
        let err = from_str::<Config>("c.yaml", "").unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].key_path, "auth");
    }

    #[test]
    fn token_sources() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t");
        std::fs::write(&file, "from-file\n").unwrap();
        let s = TokenSource {
            token_file: Some(file),
            ..Default::default()
        };
        assert_eq!(s.resolve().unwrap().as_bytes(), b"from-file");
        let missing = TokenSource {
            token_env: Some("UCTEL_TEST_SURELY_UNSET_VARIABLE".into()),
            ..Default::default()
        };
        assert!(missing.resolve().is_err());
        let none = TokenSource::default();
        assert!(none.resolve().unwrap_err().contains("exactly one"));
        let empty = TokenSource {
            token: Some("  ".into()),
            ..Default::default()
        };
        assert!(empty.resolve().is_err());
    }
}
