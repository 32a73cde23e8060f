//! The agent's YAML configuration (DESIGN.md §9): typed, strict (`deny_unknown_fields`),
//! unit-suffixed keys, every problem reported at once with file, line and key by
//! [`uctel_common::config::load`].
//!
//! An example with every key that has no default (`--print-default-config` prints every
//! key at its default; `docs/configuration.md` is generated from the types and docs below,
//! and takes its examples from this block):
//!
//! ```yaml
//! agent_id: host-a                  # the `agent` label the collector puts on this agent's data
//! collector:
//!   control: collector.example:7400 # host:port of the collector's control plane (TCP)
//!   reconnect_max_seconds: 30
//! listen:
//!   metrics: 127.0.0.1:9471         # optional local /metrics with uctel_agent_* self-metrics
//! transport:
//!   kind: soft                      # soft | verbs
//!   soft:
//!     bind: 192.0.2.20:4791         # default: an ephemeral port on the control connection's address
//!     mtu_bytes: 4096
//!     fault: { drop_ratio: 0.01, seed: 1 }   # lab only
//!   verbs:
//!     device: mlx5_0
//!     port: 1
//!     gid_index: 3
//!   rc: { timeout: 14, retry_cnt: 7, rnr_retry: 7 }   # the RC QP of `reliability: rc` streams
//! auth:
//!   token_file: /etc/uctel/agent.token   # or `token: ...`
//! sources:
//!   host_metrics: { interval_seconds: 10 }
//!   logs:
//!     - path: /var/log/syslog*
//!       exclude: ["/var/log/*.gz"]
//!       severity: auto              # auto | none: detect each line's severity
//!       max_line_bytes: 2048
//!   state_directory: /var/lib/uctel-agent
//!   textfile: { directory: /var/lib/prometheus/node-exporter, interval_seconds: 15 }
//!   scrape:
//!     - url: http://127.0.0.1:9400/metrics   # dcgm-exporter
//!       job: dcgm
//!       metric_relabel: { keep: "DCGM_FI_.*" }
//! pacing: { frames_per_second: 20000, bytes_per_second: 50000000 }
//! streams:
//!   metrics: { data_path: write_with_imm, on_no_credit: wait, queue_records: 65536,
//!              buffer_while_disconnected_records: 16384 }   # held while disconnected
//!   logs: { data_path: send, on_no_credit: wait, queue_records: 8192, reliability: uc }
//! max_frame_bytes: 4096
//! ```
//!
//! The collector chooses one data path per connection in its `Welcome`; a stream configured
//! with the other one follows the collector's choice (and says so in the log).
//!
//! Field docs below are the reference documentation (`docs/configuration.md`): write them for
//! operators.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uctel_common::config::reference::{Reference, Sources};
use uctel_common::config::{FaultSection, Problems, Validate};
use uctel_transport::api::RcAttr;
use uctel_transport::soft::fault::{FaultConfig, FaultConfigError};

use crate::pacing::PacingLimits;
pub use crate::sources::sections::{
    HostMetricsSection, LogSection, LogSeverity, SelfMetricsSection, SourcesSection, StartAt,
    WakeScheduling,
};
use crate::stream::Stream;

/// Smallest `max_frame_bytes`: the 64-byte frame header plus a useful payload, and the
/// smallest RoCE path MTU (IBTA vol. 1 §9.7.4.1.1: 256 bytes).
pub const MIN_FRAME_BYTES: usize = 256;
/// Largest `max_frame_bytes`: one frame is one UC message; 64 KiB keeps a message to a few
/// packets at the 4096-byte path MTU even when operators choose multi-packet frames.
pub const MAX_FRAME_BYTES: usize = 65536;

/// The whole agent configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This agent's identity: the `agent` label the collector attaches to everything it
    /// receives from it, and the id the collector's auth table knows it by. 1–128 characters
    /// of `[A-Za-z0-9._-]`. Required, here or on the command line: `--agent-id` (or the
    /// environment variable `UCTEL_AGENT_ID`) takes the place of this key, so one file can
    /// serve a fleet. `change-me`, the packaged file's placeholder, is refused.
    pub agent_id: String,
    /// Where the collector is.
    pub collector: CollectorSection,
    /// Local listeners.
    #[serde(default)]
    pub listen: ListenSection,
    /// The data-path transport.
    #[serde(default)]
    pub transport: TransportSection,
    /// The pre-shared token proving this agent to the collector (DESIGN.md §6) (required:
    /// `token` or `token_file`).
    #[serde(default)]
    pub auth: AuthSection,
    /// What to collect.
    #[serde(default)]
    pub sources: SourcesSection,
    /// Send-rate limits.
    #[serde(default)]
    pub pacing: PacingSection,
    /// Per-stream settings.
    #[serde(default)]
    pub streams: StreamsSection,
    /// Largest frame the agent builds, header included, in bytes. Lowered per connection to
    /// the collector's `Welcome.max_frame_bytes` (and ring slot size) and, unless
    /// `multi_packet_frames` is on, to the path MTU, so a frame is one packet. Default 4096
    /// (one packet at the largest RoCE path MTU).
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// Let a frame span several packets (a multi-packet UC message) up to `max_frame_bytes`,
    /// so log lines longer than one packet arrive whole. The trade-off (DESIGN.md §3): on UC
    /// one lost packet loses the whole message, so at packet loss `p` a frame of `n` packets
    /// is lost with probability `1 − (1 − p)^n`, and every record in it with it (counted as
    /// lost, never cut). Off by default: every frame is one packet, and a line that does not
    /// fit one packet is refused by `--check-config` (`max_line_bytes`).
    #[serde(default)]
    pub multi_packet_frames: bool,
    /// The log filter, in the syntax of `--log-level` (`info`,
    /// `warn,uctel_agent::sources=debug`). `--log-level` wins over it, and it wins over
    /// `RUST_LOG`. A reload (`SIGHUP`, `POST /-/reload`) applies it live (README "Reload").
    /// Default: `RUST_LOG`, else `info`.
    #[serde(default)]
    pub log_level: Option<String>,
}

fn default_max_frame_bytes() -> usize {
    4096
}

/// `collector`: the control-plane peer and connection behaviour.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CollectorSection {
    /// `host:port` of the collector's control plane (TCP), or a list of them: a pool of
    /// collectors. A host may be a name; every address a name resolves to is a member of the
    /// pool (re-resolved every `resolve_interval_seconds`). The agent ranks the members by
    /// rendezvous hashing of its `agent_id`, connects to the first that welcomes it, walks
    /// down the ranks when a collector is lost, refuses it (full) or drains, and returns to a
    /// higher choice once it has been healthy for `return_after_seconds`.
    pub control: ControlTargets,
    /// Seconds between resolutions of the names in `control` (the resolver's own caching
    /// applies too). New members join the ranking; the current connection stays.
    #[serde(default = "crate::pool::default_resolve_interval")]
    pub resolve_interval_seconds: f64,
    /// Seconds a collector ranked above the current one must have answered every probe
    /// before the agent moves back to it (so a restarted collector gets its agents back,
    /// and a flapping one does not pull them back and forth).
    #[serde(default = "crate::pool::default_return_after")]
    pub return_after_seconds: f64,
    /// Seconds over which the returns to a collector are spread: each agent waits a
    /// uniformly random part of this window beyond `return_after_seconds` (and beyond the
    /// moment its collector left the pool's names) before it moves, so a collector that
    /// comes back (or joins) is not hit by its whole share of agents at once. 0 moves at once.
    #[serde(default = "crate::pool::default_return_spread")]
    pub return_spread_seconds: f64,
    /// Seconds between probes of the collectors ranked above the current one (a TCP
    /// connection that sends nothing; none while connected to the first choice).
    #[serde(default = "crate::pool::default_probe_interval")]
    pub probe_interval_seconds: f64,
    /// Give up one connection attempt (TCP connect plus handshake) after this long.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// The connection is declared dead when nothing (heartbeat, report) arrived from the
    /// collector for this long, and at least three of the heartbeat periods the collector
    /// set in `Welcome` (the agent heartbeats at that period too). Default 15.
    #[serde(default = "default_heartbeat_timeout")]
    pub heartbeat_timeout_seconds: f64,
    /// First reconnect delay. The ceiling doubles per failed attempt up to
    /// `reconnect_max_seconds`, and each wait is drawn at random between a tenth of the
    /// ceiling and the ceiling ("full jitter"), so a fleet does not reconnect in lockstep.
    #[serde(default = "default_reconnect_initial")]
    pub reconnect_initial_seconds: f64,
    /// Longest reconnect delay: no wait is longer.
    #[serde(default = "default_reconnect_max")]
    pub reconnect_max_seconds: f64,
    /// Frames kept free in the collector's ring on top of its own margin: the credit window
    /// is `min(Welcome.credit_window, slots − credit_margin_slots)`. Default 0.
    #[serde(default)]
    pub credit_margin_slots: u32,
    /// Frames per second this agent sends at most, sustained, all streams together (a host
    /// collection is a burst of `series ÷ ~300` frames at 4 KiB; the default host metrics of
    /// a small server are about 15 frames per collection). Sent in `Hello`: the collector
    /// sizes this agent's ring from it (rate × its report interval × 2, within its
    /// `ring.min_slots..=ring.slots`) and never lets the agent's credit want fall below
    /// rate × report interval. Credits come back with each report, so the agent sends about
    /// its window per report interval at most: an agent with fast counters or log backlogs
    /// should announce what it sends (512 gives the largest default ring, 1,024 slots).
    /// This is the first guess: the agent measures the frames it needs per report interval
    /// (frames that waited for credit count double) and announces the larger of this and
    /// the peak of its last session at each reconnect, so its ring grows to the bursts its
    /// collections make. Until then the tail of a burst larger than the window waits for
    /// the next grant (`streams.metrics.on_no_credit: wait`). Default 32.
    #[serde(default = "default_expected_fps")]
    pub expected_frames_per_second: u32,
    /// Offer the collector to write this agent's credit into its memory (DESIGN.md §4):
    /// the agent registers a 64-byte region at `Hello` and reads its grant and consumed
    /// point from it without a system call or a message, and the collector sends its
    /// per-interval `Report` less often. A collector without the feature ignores the offer
    /// and credits travel in `Report`s as before. Default true.
    #[serde(default = "default_true")]
    pub credit_writes: bool,
}

fn default_true() -> bool {
    true
}

fn default_expected_fps() -> u32 {
    32
}

fn default_connect_timeout() -> f64 {
    5.0
}

pub use crate::pool::ControlTargets;
fn default_heartbeat_timeout() -> f64 {
    15.0
}
fn default_reconnect_initial() -> f64 {
    0.5
}
fn default_reconnect_max() -> f64 {
    30.0
}

/// `listen`: local listeners of the agent.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenSection {
    /// Address of the local `/metrics` endpoint with the agent's self-metrics: `IP:PORT`,
    /// `[IPv6]:PORT` or `:PORT` (every interface). Off when absent.
    #[serde(default, deserialize_with = "uctel_common::listen::deserialize_option")]
    pub metrics: Option<SocketAddr>,
    /// Serve the endpoints that change the running agent on the `/metrics` port (as
    /// Prometheus's `--web.enable-lifecycle` guards its `/-/reload`): `POST /-/reload`
    /// reloads the configuration, as `SIGHUP` does; `PUT` and `DELETE /api/v1/log_level`
    /// change the log filter. Off by default, because anyone who can reach the port could
    /// then use them; without it they answer 403 (`GET /api/v1/log_level` always answers).
    #[serde(default)]
    pub enable_lifecycle: bool,
}

/// `transport.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// User-space RoCEv2 UC over UDP (works on any host).
    #[default]
    Soft,
    /// Real RDMA through libibverbs.
    Verbs,
}

/// `transport`: which data-path transport and its options.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    /// `soft` (default) or `verbs`.
    #[serde(default)]
    pub kind: TransportKind,
    /// Options of the soft transport.
    #[serde(default)]
    pub soft: SoftSection,
    /// Options of the verbs transport.
    #[serde(default)]
    pub verbs: VerbsSection,
    /// Retransmission settings of the RC QP that carries the streams set to
    /// `reliability: rc` (both transports; unused while every stream is `uc`).
    #[serde(default)]
    pub rc: RcSection,
}

/// `transport.rc`: the RC QP's connection attributes (IBTA 9.7; the same knobs as
/// `ibv_modify_qp`, with rxe's behaviour on the soft transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RcSection {
    /// Local ACK timeout exponent (IBTA 9.7.6.1.3, `IBV_QP_TIMEOUT`): a packet not
    /// acknowledged within 4.096 µs × 2^`timeout` is sent again. 0 turns the timer off (a
    /// lost packet is then only resent after a later packet draws a sequence NAK), 1..=31
    /// otherwise. Default 14 (about 67 ms): at heavy loss the RC lane's goodput is bound by
    /// this timer (BENCHMARKS.md "Reliability trade-off").
    #[serde(default = "default_rc_timeout")]
    pub timeout: u8,
    /// Retries after a timeout or a sequence NAK before a frame fails with
    /// `IBV_WC_RETRY_EXC_ERR` and the QP goes to ERROR, 0..=7 (`IBV_QP_RETRY_CNT`; the soft
    /// transport reads 7 as seven retries, rxe retries for ever). The agent then ends the
    /// session and reconnects with a new epoch; the frames in flight are lost with it.
    /// Default 7.
    #[serde(default = "default_rc_retry")]
    pub retry_cnt: u8,
    /// Retries after receiver-not-ready NAKs (the collector had no receive posted), 0..=7,
    /// 7 = for ever (IBTA 9.7.5.2.8, `IBV_QP_RNR_RETRY`). Default 7.
    #[serde(default = "default_rc_retry")]
    pub rnr_retry: u8,
}

fn default_rc_timeout() -> u8 {
    14
}
fn default_rc_retry() -> u8 {
    7
}

impl Default for RcSection {
    fn default() -> Self {
        Self {
            timeout: default_rc_timeout(),
            retry_cnt: default_rc_retry(),
            rnr_retry: default_rc_retry(),
        }
    }
}

impl RcSection {
    /// The RC QP attributes: these three, the rest at [`RcAttr::default`].
    pub fn attr(&self) -> RcAttr {
        RcAttr {
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            ..RcAttr::default()
        }
    }
}

/// `transport.soft`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SoftSection {
    /// Local UDP address of the soft RoCEv2 endpoint, written like a listen address (`IP:PORT`,
    /// `[IPv6]:PORT`, `:PORT`). Default: an ephemeral port on the local address of the control
    /// connection. Real RoCEv2 peers (rxe, NICs) send to UDP 4791. The RC QP of streams set
    /// to `reliability: rc` shares this device and port with the UC QP; its peer's
    /// acknowledgements come back to this port, so against a verbs collector it must be
    /// 4791 (such a collector refuses the RC lane otherwise).
    #[serde(default, deserialize_with = "uctel_common::listen::deserialize_option")]
    pub bind: Option<SocketAddr>,
    /// Largest path MTU offered, bytes: 256, 512, 1024, 2048 or 4096 (default). The QP uses
    /// the smaller of both sides'; a frame larger than the path MTU becomes a multi-packet
    /// UC message, which one lost packet loses whole.
    #[serde(default = "default_mtu_bytes")]
    pub mtu_bytes: u32,
    /// Lab fault injection on the agent's packets (the soft transport's seeded fault
    /// injector). Off by default.
    #[serde(
        default,
        deserialize_with = "deserialize_fault",
        serialize_with = "serialize_fault"
    )]
    pub fault: FaultConfig,
}

fn default_mtu_bytes() -> u32 {
    4096
}

impl Default for SoftSection {
    fn default() -> Self {
        Self {
            bind: None,
            mtu_bytes: default_mtu_bytes(),
            fault: FaultConfig::default(),
        }
    }
}

fn deserialize_fault<'de, D: serde::Deserializer<'de>>(d: D) -> Result<FaultConfig, D::Error> {
    FaultSection::deserialize(d).map(|f| FaultConfig::from(&f))
}

fn serialize_fault<S: serde::Serializer>(f: &FaultConfig, s: S) -> Result<S::Ok, S::Error> {
    FaultSection::from(f).serialize(s)
}

/// True when any fault of `f` is enabled.
pub fn faults_enabled(f: &FaultConfig) -> bool {
    f.drop_ratio > 0.0
        || f.duplicate_ratio > 0.0
        || f.reorder_ratio > 0.0
        || f.corrupt_ratio > 0.0
        || f.delay_ms > 0
}

/// `transport.verbs`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VerbsSection {
    /// RDMA device name (`rxe0`, `mlx5_0`). Default: the first device.
    #[serde(default)]
    pub device: Option<String>,
    /// Port number on the device (1-based, as in `ibv_devinfo`).
    #[serde(default = "default_verbs_port")]
    pub port: u8,
    /// GID table index. Default: the RoCE v2 GID of the address the control connection
    /// uses.
    #[serde(default)]
    pub gid_index: Option<u32>,
}

fn default_verbs_port() -> u8 {
    1
}

impl Default for VerbsSection {
    fn default() -> Self {
        Self {
            device: None,
            port: default_verbs_port(),
            gid_index: None,
        }
    }
}

/// `auth`: exactly one of `token` and `token_file`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// The pre-shared token itself. Prefer `token_file` outside labs.
    #[serde(default)]
    pub token: Option<String>,
    /// A file whose content (surrounding whitespace trimmed) is the token; should be
    /// readable by the agent only.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// Why the token could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Neither `auth.token` nor `auth.token_file` is set.
    #[error("no auth.token or auth.token_file configured")]
    Missing,
    /// Reading `auth.token_file` failed.
    #[error("cannot read auth.token_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The token is empty after trimming whitespace.
    #[error("the auth token is empty")]
    Empty,
}

impl AuthSection {
    /// The token bytes: `token`, or the trimmed content of `token_file`.
    ///
    /// # Errors
    /// [`TokenError`].
    pub fn read_token(&self) -> Result<Vec<u8>, TokenError> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|source| TokenError::Read {
                    path: path.clone(),
                    source,
                })?
                .trim()
                .to_owned(),
            (None, None) => return Err(TokenError::Missing),
        };
        if token.is_empty() {
            return Err(TokenError::Empty);
        }
        Ok(token.into_bytes())
    }
}

/// The default longest log line (bytes) when `max_frame_bytes` leaves room for it.
pub const DEFAULT_MAX_LINE_BYTES: usize = 2048;

/// Bytes a log record needs in a frame beyond its message: the frame header (64) plus room
/// for the record's fields (timestamp, severity, source path up to 448 bytes, `file_id` and
/// `end_offset` (two keyed varints, at most 22 bytes), tags).
pub const LOG_RECORD_OVERHEAD_BYTES: usize = 576;

/// `pacing`: caps on the send rate (token buckets, see [`crate::pacing`]). A frame that has
/// to wait waits in the sender; what cannot wait is dropped and counted at the source. With
/// a stream set to `reliability: rc` both lanes (UC QP, RC QP) draw on the same buckets:
/// the caps hold for the connection, whichever lane a frame takes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PacingSection {
    /// Frames per second, all streams together. Default 20000. With a stream set to
    /// `reliability: rc` both lanes (UC QP, RC QP) draw on it together, taking turns.
    #[serde(default = "default_fps")]
    pub frames_per_second: Option<u64>,
    /// Frame bytes (header and payload) per second. Default 50 MB/s. Both lanes together, as
    /// `frames_per_second`.
    #[serde(default = "default_bps")]
    pub bytes_per_second: Option<u64>,
    /// Depth of the buckets in milliseconds of rate. Default 100.
    #[serde(default = "default_burst_ms")]
    pub burst_milliseconds: u64,
}

#[allow(clippy::unnecessary_wraps)]
fn default_fps() -> Option<u64> {
    Some(20_000)
}
#[allow(clippy::unnecessary_wraps)]
fn default_bps() -> Option<u64> {
    Some(50_000_000)
}
fn default_burst_ms() -> u64 {
    100
}

impl Default for PacingSection {
    fn default() -> Self {
        Self {
            frames_per_second: default_fps(),
            bytes_per_second: default_bps(),
            burst_milliseconds: default_burst_ms(),
        }
    }
}

/// A validated, positive, finite number of seconds as a [`Duration`]; 0 for anything else
/// (validation rejects those before this is used).
pub fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}

fn check_seconds(p: &mut Problems, key: &str, v: f64, min: f64, max: f64) {
    if !v.is_finite() || v < min || v > max {
        p.push(
            key,
            format!("must be a number of seconds in [{min}, {max}], got {v}"),
        );
    }
}

pub use crate::pool::split_host_port;

mod streams;
mod system_logs;
pub use streams::{DataPath, OnNoCredit, Reliability, StreamSection, StreamsSection};

/// The `agent_id` of the packaged `/etc/uctel/agent.yaml`, refused until the operator sets
/// one (or passes `--agent-id` / `UCTEL_AGENT_ID`): a fleet of agents all named `change-me`
/// would be one agent to the collector.
pub const AGENT_ID_PLACEHOLDER: &str = "change-me";

/// Whether `id` is a valid `agent_id`: 1–128 characters of `[A-Za-z0-9._-]`.
pub fn valid_agent_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Validate for AgentConfig {
    fn renamed_keys() -> &'static [(&'static str, &'static str)] {
        uctel_common::config::RENAMED_SOFT_KEYS
    }

    fn validate(&self, p: &mut Problems) {
        if let Some(level) = &self.log_level {
            if let Err(e) = uctel_common::logging::filter(level) {
                p.push("log_level", e.to_string());
            }
        }
        if self.agent_id == AGENT_ID_PLACEHOLDER {
            p.push(
                "agent_id",
                format!(
                    "{AGENT_ID_PLACEHOLDER} is the packaged placeholder: set agent_id to a name \
                     unique to this host, or pass --agent-id (or the environment variable \
                     UCTEL_AGENT_ID)"
                ),
            );
        } else if !valid_agent_id(&self.agent_id) {
            p.push(
                "agent_id",
                "must be 1 to 128 characters of letters, digits, '.', '_' or '-'",
            );
        }
        for (key, addr) in [
            ("listen.metrics", self.listen.metrics),
            (
                "transport.soft.bind",
                self.transport
                    .soft
                    .bind
                    .filter(|_| self.transport.kind == TransportKind::Soft),
            ),
        ] {
            if let Some(why) = addr.and_then(uctel_common::listen::not_local) {
                p.push(key, why);
            }
        }
        self.check_collector(p);
        self.check_transport(p);
        self.check_auth(p);
        self.check_sources(p);
        self.check_sending(p);
    }
}

/// The checks of [`Validate::validate`], one per section, in the order of the problems.
impl AgentConfig {
    /// The `collector` section: the pool's addresses and every duration in its range.
    fn check_collector(&self, p: &mut Problems) {
        let c = &self.collector;
        for (key, problem) in c.control.problems() {
            p.push(key, problem);
        }
        check_seconds(
            p,
            "collector.resolve_interval_seconds",
            c.resolve_interval_seconds,
            1.0,
            86400.0,
        );
        check_seconds(
            p,
            "collector.return_after_seconds",
            c.return_after_seconds,
            0.0,
            86400.0,
        );
        check_seconds(
            p,
            "collector.return_spread_seconds",
            c.return_spread_seconds,
            0.0,
            86400.0,
        );
        check_seconds(
            p,
            "collector.probe_interval_seconds",
            c.probe_interval_seconds,
            0.1,
            3600.0,
        );
        check_seconds(
            p,
            "collector.connect_timeout_seconds",
            c.connect_timeout_seconds,
            0.01,
            3600.0,
        );
        check_seconds(
            p,
            "collector.heartbeat_timeout_seconds",
            c.heartbeat_timeout_seconds,
            0.02,
            7200.0,
        );
        check_seconds(
            p,
            "collector.reconnect_initial_seconds",
            c.reconnect_initial_seconds,
            0.001,
            3600.0,
        );
        check_seconds(
            p,
            "collector.reconnect_max_seconds",
            c.reconnect_max_seconds,
            0.001,
            86400.0,
        );
        if c.reconnect_max_seconds < c.reconnect_initial_seconds {
            p.push(
                "collector.reconnect_max_seconds",
                "must not be less than collector.reconnect_initial_seconds",
            );
        }
    }

    /// The `transport` section: fault injection, the soft MTU, the verbs build and port, the RC attributes.
    fn check_transport(&self, p: &mut Problems) {
        match self.transport.soft.fault.validate() {
            Ok(()) => {}
            Err(FaultConfigError::Ratio { field, value }) => p.push(
                format!("transport.soft.fault.{field}"),
                format!("must be a probability from 0 to 1, got {value}"),
            ),
            Err(FaultConfigError::Reorder { ratio, window }) => p.push(
                "transport.soft.fault.reorder_window",
                format!(
                    "reordering needs both reorder_ratio and reorder_window above 0 (got \
                     {ratio} and {window})"
                ),
            ),
        }
        if ![256, 512, 1024, 2048, 4096].contains(&self.transport.soft.mtu_bytes) {
            p.push(
                "transport.soft.mtu_bytes",
                "must be 256, 512, 1024, 2048 or 4096",
            );
        }
        if self.transport.kind == TransportKind::Verbs && !cfg!(feature = "verbs") {
            p.push(
                "transport.kind",
                "this uctel-agent was built without the verbs transport (cargo feature `verbs`)",
            );
        }
        if self.transport.verbs.port == 0 {
            p.push("transport.verbs.port", "port numbers start at 1");
        }
        if let Err(e) = self.transport.rc.attr().validate() {
            // "<field> <value> is out of range 0..=<max>"
            let field = e.split(' ').next().unwrap_or_default();
            p.push(format!("transport.rc.{field}"), e.clone());
        }
    }

    /// The `auth` section: exactly one of `token` and `token_file`, not empty.
    fn check_auth(&self, p: &mut Problems) {
        match (&self.auth.token, &self.auth.token_file) {
            (Some(_), Some(_)) => p.push("auth", "set only one of token and token_file"),
            (None, None) => p.push(
                "auth",
                "set token or token_file (the collector refuses agents without a proof)",
            ),
            (Some(t), None) if t.trim().is_empty() => p.push("auth.token", "must not be empty"),
            (Some(_), None) => {}
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(t) if t.trim().is_empty() => {
                    p.push("auth.token_file", format!("{} is empty", path.display()));
                }
                Ok(_) => {}
                Err(e) => p.push(
                    "auth.token_file",
                    format!("cannot read {}: {e}", path.display()),
                ),
            },
        }
    }

    /// The `sources` section: intervals, scrape targets, fast counters, textfiles, the state directory (the log tailers in [`AgentConfig::check_logs`]).
    fn check_sources(&self, p: &mut Problems) {
        let h = &self.sources.host_metrics;
        check_seconds(
            p,
            "sources.host_metrics.interval_seconds",
            h.interval_seconds,
            0.1,
            86400.0,
        );
        let s = &self.sources.self_metrics;
        check_seconds(
            p,
            "sources.self_metrics.interval_seconds",
            s.interval_seconds,
            0.1,
            86400.0,
        );
        let offsets = [
            ("host_metrics", h.offset_seconds, h.interval_seconds),
            ("self_metrics", s.offset_seconds, s.interval_seconds),
        ]
        .into_iter()
        .chain(
            self.sources
                .textfile
                .iter()
                .map(|t| ("textfile", t.offset_seconds, t.interval_seconds)),
        );
        for (section, offset, interval) in offsets {
            if let Some(problem) = crate::pacing::grid::offset_problem(offset, interval) {
                p.push(format!("sources.{section}.offset_seconds"), problem);
            }
        }
        for (i, t) in self.sources.scrape.iter().enumerate() {
            for (key, problem) in crate::sources::scrape::problems(t) {
                p.push(format!("sources.scrape[{i}].{key}"), problem);
            }
        }
        for (i, problem) in crate::sources::scrape::shared_identities(&self.sources.scrape) {
            p.push(format!("sources.scrape[{i}]"), problem);
        }
        for (key, problem) in self.sources.fast_counters.iter().flat_map(|f| f.problems()) {
            p.push(format!("sources.fast_counters.{key}"), problem);
        }
        for (key, problem) in self.sources.textfile.iter().flat_map(|t| t.problems()) {
            p.push(format!("sources.textfile.{key}"), problem);
        }
        for (key, problem) in self.sources.slurm.iter().flat_map(|s| s.problems()) {
            p.push(format!("sources.slurm.{key}"), problem);
        }
        let pods = self.sources.pod_resources.iter();
        for (key, problem) in pods.flat_map(|s| s.problems()) {
            p.push(format!("sources.pod_resources.{key}"), problem);
        }
        self.check_logs(p);
        self.check_journald(p);
        self.check_kmsg(p);
        if let Some(dir) = &self.sources.state_directory {
            if dir.as_os_str().is_empty() {
                p.push(
                    "sources.state_directory",
                    "must not be empty (null: no checkpoints)",
                );
            } else if !self.sources.logs.is_empty() {
                if let Err(e) = uctel_common::config::check_directory(dir) {
                    p.push("sources.state_directory", e);
                }
            }
        }
    }

    /// The sending: `pacing`, the `streams` queues, buffers and flush times, `max_frame_bytes`.
    fn check_sending(&self, p: &mut Problems) {
        let pc = &self.pacing;
        if pc.frames_per_second == Some(0) {
            p.push(
                "pacing.frames_per_second",
                "must be positive (null means no limit)",
            );
        }
        if let Some(bps) = pc.bytes_per_second {
            if bps < self.max_frame_bytes as u64 {
                p.push(
                    "pacing.bytes_per_second",
                    format!(
                        "must be at least max_frame_bytes ({}) per second",
                        self.max_frame_bytes
                    ),
                );
            }
        }
        if pc.burst_milliseconds == 0 || pc.burst_milliseconds > 60_000 {
            p.push("pacing.burst_milliseconds", "must be in 1..=60000");
        }

        for stream in Stream::ALL {
            let st = self.streams.get(stream);
            if !(1..=16 * 1024 * 1024).contains(&self.streams.queue_records(stream)) {
                p.push(
                    format!("streams.{stream}.queue_records"),
                    "must be in 1..=16777216",
                );
            }
            match (stream, st.buffer_while_disconnected_records) {
                (Stream::Metrics, Some(n)) if n > 16 * 1024 * 1024 => p.push(
                    "streams.metrics.buffer_while_disconnected_records",
                    "must be in 0..=16777216",
                ),
                (Stream::Logs | Stream::FastCounters, Some(_)) => p.push(
                    format!("streams.{stream}.buffer_while_disconnected_records"),
                    "only streams.metrics buffers while disconnected (log lines wait in their \
                     files; fast_counters samples are fresh or worthless)",
                ),
                _ => {}
            }
            if stream != Stream::Metrics && st.series_dictionary.is_some() {
                p.push(
                    format!("streams.{stream}.series_dictionary"),
                    "only streams.metrics carries metrics with a series dictionary",
                );
            }
            if !(1..=60_000).contains(&st.flush_milliseconds) {
                p.push(
                    format!("streams.{stream}.flush_milliseconds"),
                    "must be in 1..=60000",
                );
            }
        }

        if !(MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&self.max_frame_bytes) {
            p.push(
                "max_frame_bytes",
                format!("must be in {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES}"),
            );
        }
    }

    /// Every `sources.logs[i]` entry: its globs, line size and durations.
    fn check_logs(&self, p: &mut Problems) {
        for (i, l) in self.sources.logs.iter().enumerate() {
            let key = |k: &str| format!("sources.logs[{i}].{k}");
            for (k, pattern) in std::iter::once(("path".to_owned(), &l.path)).chain(
                l.exclude
                    .iter()
                    .enumerate()
                    .map(|(j, e)| (format!("exclude[{j}]"), e)),
            ) {
                if pattern.trim().is_empty() {
                    p.push(key(&k), "must not be empty");
                } else if let Err(e) = glob::Pattern::new(pattern) {
                    p.push(key(&k), format!("invalid glob: {e}"));
                } else if !Path::new(pattern).is_absolute() {
                    p.push(key(&k), "must be an absolute path");
                }
            }
            let frame = self.frame_limit_bytes();
            let max_line = frame.saturating_sub(LOG_RECORD_OVERHEAD_BYTES);
            if l.max_line_bytes
                .is_some_and(|m| !(16..=max_line.max(16)).contains(&m))
            {
                let why = if frame < self.max_frame_bytes {
                    format!(
                        "a frame is one packet of transport.soft.mtu_bytes {} here, so a line \
                         must be in 16..={max_line} (the MTU − {LOG_RECORD_OVERHEAD_BYTES}); set \
                         multi_packet_frames: true to send longer lines whole as multi-packet \
                         messages",
                        self.transport.soft.mtu_bytes
                    )
                } else {
                    format!(
                        "must be in 16..={max_line} (max_frame_bytes − {LOG_RECORD_OVERHEAD_BYTES}) so a line fits a frame"
                    )
                };
                p.push(key("max_line_bytes"), why);
            }
            check_seconds(
                p,
                &key("partial_line_timeout_seconds"),
                l.partial_line_timeout_seconds,
                0.01,
                3600.0,
            );
            check_seconds(
                p,
                &key("rotate_wait_seconds"),
                l.rotate_wait_seconds,
                0.0,
                3600.0,
            );
            check_seconds(
                p,
                &key("glob_interval_seconds"),
                l.glob_interval_seconds,
                0.01,
                3600.0,
            );
            check_seconds(
                p,
                &key("poll_interval_seconds"),
                l.poll_interval_seconds,
                0.01,
                3600.0,
            );
            if let Err(e) = crate::sources::logs::parse::Parser::new(&l.parse) {
                // "<key>: <why>", the key under `parse`.
                let (k, why) = e.split_once(": ").unwrap_or(("", e.as_str()));
                p.push(key(&format!("parse.{k}")), why);
            }
        }
    }
}

impl AgentConfig {
    /// Loads and validates a file, every problem at once.
    ///
    /// # Errors
    /// [`uctel_common::config::ConfigError`] listing each problem with line and key.
    pub fn load(path: &Path) -> Result<AgentConfig, uctel_common::config::ConfigError> {
        uctel_common::config::load(path)
    }

    /// [`AgentConfig::load`] with `agent_id`, when given (`--agent-id`, `UCTEL_AGENT_ID`), in
    /// the place of the file's `agent_id`, before the checks: the file may then leave the
    /// key out or hold the placeholder.
    ///
    /// # Errors
    /// As [`AgentConfig::load`].
    pub fn load_with_agent_id(
        path: &Path,
        agent_id: Option<&str>,
    ) -> Result<AgentConfig, uctel_common::config::ConfigError> {
        uctel_common::config::load_with(path, |doc: &mut serde_yaml::Value| {
            if let (Some(id), serde_yaml::Value::Mapping(m)) = (agent_id, doc) {
                m.insert("agent_id".into(), id.into());
            }
        })
        .map_err(|mut e| {
            for p in &mut e.problems {
                if p.key_path == "agent_id" && p.message == "required, but missing" {
                    p.message = "required: set agent_id in this file, or pass --agent-id (or \
                                 the environment variable UCTEL_AGENT_ID)"
                        .to_owned();
                }
            }
            e
        })
    }

    /// Loads and validates configuration text; `name` names it in problems.
    ///
    /// # Errors
    /// As [`AgentConfig::load`].
    pub fn from_yaml(
        name: &str,
        text: &str,
    ) -> Result<AgentConfig, uctel_common::config::ConfigError> {
        uctel_common::config::from_str(name, text)
    }

    /// The longest log line of `entry`: its `max_line_bytes`, or [`DEFAULT_MAX_LINE_BYTES`]
    /// lowered to fit a frame ([`frame_limit_bytes`](Self::frame_limit_bytes)).
    pub fn max_line_bytes(&self, entry: &LogSection) -> usize {
        self.log_line_limit(entry.max_line_bytes)
    }

    /// The longest log message of a source whose limit is `configured` (`None`: the
    /// default of [`AgentConfig::max_line_bytes`]), in bytes.
    pub fn log_line_limit(&self, configured: Option<usize>) -> usize {
        configured.unwrap_or_else(|| {
            DEFAULT_MAX_LINE_BYTES.min(
                self.frame_limit_bytes()
                    .saturating_sub(LOG_RECORD_OVERHEAD_BYTES)
                    .max(16),
            )
        })
    }

    /// The largest frame this configuration can build before any collector lowers it, in
    /// bytes: `max_frame_bytes`, and on the soft transport without `multi_packet_frames` at
    /// most one packet of `transport.soft.mtu_bytes` (on verbs the path MTU is the device's,
    /// known only once connected).
    pub fn frame_limit_bytes(&self) -> usize {
        if self.multi_packet_frames || self.transport.kind != TransportKind::Soft {
            self.max_frame_bytes
        } else {
            self.max_frame_bytes
                .min(self.transport.soft.mtu_bytes as usize)
        }
    }

    /// What `--check-config` prints after "valid": the effective frame and line limits.
    pub fn effective_limits(&self) -> String {
        let mut out = format!(
            "frames: at most {} bytes{}",
            self.frame_limit_bytes(),
            if self.multi_packet_frames {
                " (multi-packet UC messages allowed: one lost packet loses the whole frame)"
                    .to_owned()
            } else if self.transport.kind == TransportKind::Soft {
                format!(
                    " (one packet: max_frame_bytes {} and transport.soft.mtu_bytes {}; the \
                     collector and the path MTU may lower it further)",
                    self.max_frame_bytes, self.transport.soft.mtu_bytes
                )
            } else {
                " (one packet: also lowered to the device's path MTU once connected)".to_owned()
            }
        );
        for (i, entry) in self.sources.logs.iter().enumerate() {
            out.push_str(&format!(
                "\nsources.logs[{i}]: lines up to {} bytes arrive whole; longer lines are cut \
                 (truncated=\"line\")",
                self.max_line_bytes(entry)
            ));
        }
        out
    }

    /// What the agent will read and write with this configuration, for `--check-config`:
    /// the log globs with the files they match now (and how many of those this user cannot
    /// read: they are skipped, each logged once), the checkpoint directory, the local
    /// `/metrics` address.
    pub fn reads_and_writes(&self) -> String {
        let mut out = Vec::new();
        if self.sources.host_metrics.enabled {
            out.push(format!(
                "reads host metrics from {} and {} every {} s",
                self.sources.host_metrics.procfs_path.display(),
                self.sources.host_metrics.sysfs_path.display(),
                self.sources.host_metrics.interval_seconds
            ));
        }
        for (i, l) in self.sources.logs.iter().enumerate() {
            let (mut found, mut unreadable) = (0usize, 0usize);
            if let Ok(paths) = glob::glob(&l.path) {
                let skip: Vec<glob::Pattern> = l
                    .exclude
                    .iter()
                    .filter_map(|e| glob::Pattern::new(e).ok())
                    .collect();
                for p in paths.flatten() {
                    if !p.is_file() || skip.iter().any(|x| x.matches_path(&p)) {
                        continue;
                    }
                    found += 1;
                    if std::fs::File::open(&p).is_err() {
                        unreadable += 1;
                    }
                }
            }
            let unreadable = if unreadable > 0 {
                format!(
                    ", {unreadable} of them not readable by this user (skipped, logged once each)"
                )
            } else {
                String::new()
            };
            out.push(format!(
                "sources.logs[{i}]: tails {} ({found} file{} now{unreadable})",
                l.path,
                if found == 1 { "" } else { "s" }
            ));
        }
        match (&self.sources.state_directory, self.sources.logs.is_empty()) {
            (_, true) => {}
            (Some(dir), false) => out.push(format!(
                "writes log checkpoints to {}",
                std::path::absolute(dir)
                    .unwrap_or_else(|_| dir.clone())
                    .display()
            )),
            (None, false) => out.push("keeps no log checkpoints (state_directory: null)".into()),
        }
        if let Some(addr) = self.listen.metrics {
            out.push(format!("serves its self-metrics on http://{addr}/metrics"));
        }
        out.push(format!(
            "sends to the collector at {}",
            self.collector.control
        ));
        out.join("\n")
    }

    /// The pacing limits for the sender, with the frame size the collector agreed to.
    pub fn pacing_limits(&self, max_frame_bytes: usize) -> PacingLimits {
        PacingLimits {
            frames_per_second: self.pacing.frames_per_second,
            bytes_per_second: self.pacing.bytes_per_second,
            burst_millis: self.pacing.burst_milliseconds,
            max_frame_bytes: max_frame_bytes as u64,
        }
    }
}

/// The required keys, one log source and one fault setting, for the reference's defaults.
const REFERENCE_MINIMAL: &str = "\
agent_id: host-a
collector:
  control: collector.example:7400
sources:
  logs:
    - path: /var/log/syslog*
  scrape:
    - url: http://127.0.0.1:9100/metrics
";

/// The configuration reference of the agent (`docs/configuration.md`,
/// `--print-default-config`), generated from these types and their doc comments.
pub fn reference() -> Reference {
    Reference::new::<AgentConfig>(Sources {
        daemon: "uctel-agent",
        rust: &[
            include_str!("config.rs"),
            include_str!("config/streams.rs"),
            include_str!("sources/sections.rs"),
            include_str!("sources/start_at.rs"),
            include_str!("sources/logs/parse/section.rs"),
            include_str!("sources/textfile.rs"),
            include_str!("sources/slurm/mod.rs"),
            include_str!("sources/pod_resources/section.rs"),
            include_str!("sources/scrape.rs"),
            include_str!("sources/fast_counters.rs"),
            include_str!("sources/journald/mod.rs"),
            include_str!("sources/kmsg/mod.rs"),
            include_str!("sources/host.rs"),
            include_str!("sources/node/mod.rs"),
            include_str!("sources/node/ethtool.rs"),
            uctel_common::config::SOURCE,
        ],
        minimal: REFERENCE_MINIMAL,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::host::HostCollector;

    const MINIMAL: &str =
        "agent_id: a1\ncollector:\n  control: 127.0.0.1:7470\nauth:\n  token: secret\n";

    fn load(text: &str) -> Result<AgentConfig, uctel_common::config::ConfigError> {
        AgentConfig::from_yaml("agent.yaml", text)
    }

    #[test]
    fn host_collectors_can_be_disabled_by_name() {
        let text = format!(
            "{MINIMAL}sources:\n  host_metrics:\n    disabled_collectors: [vmstat, conntrack]\n"
        );
        let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.sources.host_metrics.disabled_collectors,
            [HostCollector::Vmstat, HostCollector::Conntrack]
        );
        assert_eq!(
            crate::runners::host_config(&c).disabled,
            [HostCollector::Vmstat, HostCollector::Conntrack]
        );
        assert!(load(MINIMAL)
            .unwrap_or_else(|e| panic!("{e}"))
            .sources
            .host_metrics
            .disabled_collectors
            .is_empty());
        let bad =
            format!("{MINIMAL}sources:\n  host_metrics:\n    disabled_collectors: [nosuch]\n");
        assert!(load(&bad).is_err());
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.agent_id, "a1");
        assert_eq!(c.transport.kind, TransportKind::Soft);
        assert!(!faults_enabled(&c.transport.soft.fault));
        assert_eq!(c.max_frame_bytes, 4096);
        assert_eq!(c.streams.metrics.data_path, DataPath::WriteWithImm);
        assert!(c.listen.metrics.is_none());
        assert!(c.sources.host_metrics.enabled);
        assert_eq!(c.auth.read_token().ok(), Some(b"secret".to_vec()));
    }

    #[test]
    fn public_keys_parse() {
        let text = "\
agent_id: host-a
collector:
  control: collector.example:7470
listen:
  metrics: 127.0.0.1:9471
transport:
  kind: soft
  soft:
    fault:
      drop_ratio: 0.01
      seed: 7
sources:
  host_metrics:
    interval_seconds: 5
  logs:
    - path: /var/log/*.log
      start_at: beginning
pacing:
  frames_per_second: 1000
  bytes_per_second: 1000000
auth:
  token: t
streams:
  metrics:
    data_path: send
  logs:
    data_path: write_with_imm
max_frame_bytes: 2048
";
        let c = load(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.transport.kind, TransportKind::Soft);
        assert_eq!(c.transport.soft.fault.seed, 7);
        assert!(faults_enabled(&c.transport.soft.fault));
        assert_eq!(c.sources.logs.len(), 1);
        assert_eq!(c.sources.logs[0].start_at, StartAt::Beginning);
        assert_eq!(c.streams.get(Stream::Metrics).data_path, DataPath::Send);
        assert_eq!(
            c.streams.get(Stream::Logs).data_path,
            DataPath::WriteWithImm
        );
        assert_eq!(c.pacing_limits(2048).frames_per_second, Some(1000));
        assert_eq!(c.listen.metrics.map(|a| a.port()), Some(9471));
    }

    #[test]
    fn every_problem_is_reported_with_line_and_key() {
        let text = "\
agent_id: 'bad id'
collector:
  control: nohostport
transport:
  kind: carrier-pigeon
  soft:
    fault:
      drop_ratio: 1.5
pacing:
  frames_per_second: 0
bogus: 1
streams:
  logs:
    data_path: rdma_read
max_frame_bytes: 10
";
        let err = load(text)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        let got: Vec<(Option<usize>, &str)> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key_path.as_str()))
            .collect();
        // Deserialization problems first are found round by round; semantic ones only when
        // the structure is sound, so check the structural ones here.
        for want in [
            (Some(5), "transport.kind"),
            (Some(11), "bogus"),
            (Some(14), "streams.logs.data_path"),
        ] {
            assert!(got.contains(&want), "missing {want:?} in {got:?}\n{err}");
        }
    }

    #[test]
    fn semantic_problems_are_all_reported() {
        let text = "\
agent_id: 'bad id'
collector:
  control: nohostport
  connect_timeout_seconds: 0
  heartbeat_timeout_seconds: 5
transport:
  soft:
    fault:
      drop_ratio: 1.5
pacing:
  frames_per_second: 0
  bytes_per_second: 5
auth:
  token: x
  token_file: /nonexistent
sources:
  logs:
    - path: relative/*.log
    - path: '/var/log/[.log'
max_frame_bytes: 10
";
        let err = load(text)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        let got: Vec<(Option<usize>, &str)> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key_path.as_str()))
            .collect();
        for want in [
            (Some(1), "agent_id"),
            (Some(3), "collector.control"),
            (Some(4), "collector.connect_timeout_seconds"),
            (Some(9), "transport.soft.fault.drop_ratio"),
            (Some(11), "pacing.frames_per_second"),
            (Some(12), "pacing.bytes_per_second"),
            (Some(14), "auth"),
            (Some(18), "sources.logs[0].path"),
            (Some(19), "sources.logs[1].path"),
            (Some(20), "max_frame_bytes"),
        ] {
            assert!(got.contains(&want), "missing {want:?} in {got:?}\n{err}");
        }
    }

    #[test]
    fn missing_auth_and_unreadable_token_file_are_problems() {
        let no_auth = "agent_id: a\ncollector:\n  control: h:1\n";
        let err = load(no_auth)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        assert!(err.problems.iter().any(|p| p.key_path == "auth"), "{err}");

        let bad_file = "agent_id: a\ncollector:\n  control: h:1\nauth:\n  token_file: /nonexistent/uctel.token\n";
        let err = load(bad_file)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        assert!(
            err.problems
                .iter()
                .any(|p| p.key_path == "auth.token_file" && p.line == Some(5)),
            "{err}"
        );
    }

    #[test]
    fn token_file_is_trimmed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("token");
        std::fs::write(&path, "  s3cret\n").unwrap_or_else(|e| panic!("{e}"));
        let auth = AuthSection {
            token: None,
            token_file: Some(path),
        };
        assert_eq!(auth.read_token().ok(), Some(b"s3cret".to_vec()));
    }

    #[test]
    fn control_takes_one_address_or_a_pool() {
        let one = load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.collector.control.targets().len(), 1);
        let pool = "agent_id: a1\ncollector:\n  control: [10.0.0.1:7400, 'c2.example:7400', '[fd00::3]:7400']\nauth:\n  token: t\n";
        let c = load(pool).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.collector.control,
            ControlTargets::Pool(vec![
                "10.0.0.1:7400".into(),
                "c2.example:7400".into(),
                "[fd00::3]:7400".into()
            ])
        );
        assert_eq!(c.collector.return_after_seconds, 60.0);
        assert_eq!(c.collector.return_spread_seconds, 5.0);
        assert_eq!(c.collector.probe_interval_seconds, 5.0);
        assert_eq!(c.collector.resolve_interval_seconds, 30.0);
        let bad = "agent_id: a1\ncollector:\n  control: [10.0.0.1:7400, nohostport, 10.0.0.1:7400]\nauth:\n  token: t\n";
        let err = load(bad)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        let keys: Vec<_> = err.problems.iter().map(|p| p.key_path.as_str()).collect();
        assert_eq!(
            keys,
            ["collector.control[1]", "collector.control[2]"],
            "{err}"
        );
        assert!(err.to_string().contains("listed twice"), "{err}");
        let empty = "agent_id: a1\ncollector:\n  control: []\nauth:\n  token: t\n";
        let err = load(empty)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert!(err.to_string().contains("empty"), "{err}");
        let wrong = "agent_id: a1\ncollector:\n  control: {a: 1}\nauth:\n  token: t\n";
        let err = load(wrong)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert!(
            err.to_string()
                .contains("host:port, or a list of host:port"),
            "{err}"
        );
    }

    #[test]
    fn reliability_is_uc_unless_a_stream_asks_for_rc() {
        let c = load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        for s in Stream::ALL {
            assert_eq!(c.streams.reliability(s), Reliability::Uc);
        }
        assert!(c.streams.rc_streams().is_empty());
        assert_eq!(c.transport.rc, RcSection::default());
        assert_eq!(c.transport.rc.attr(), RcAttr::default());

        let text = format!(
            "{MINIMAL}streams:\n  logs:\n    reliability: rc\n  fast_counters:\n    reliability: uc\n\
             transport:\n  rc:\n    timeout: 18\n    retry_cnt: 3\n"
        );
        let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.streams.reliability(Stream::Logs), Reliability::Rc);
        assert_eq!(c.streams.reliability(Stream::Metrics), Reliability::Uc);
        assert_eq!(c.streams.rc_streams(), [Stream::Logs]);
        let attr = c.transport.rc.attr();
        assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry), (18, 3, 7));
        assert_eq!(attr.min_rnr_timer, RcAttr::default().min_rnr_timer);
        assert_eq!(Reliability::Rc.as_str(), "rc");

        let bad = format!("{MINIMAL}streams:\n  metrics:\n    reliability: tcp\n");
        let err = load(&bad)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert!(
            err.problems
                .iter()
                .any(|p| p.key_path.contains("reliability") && p.line == Some(8)),
            "{err}"
        );
    }

    #[test]
    fn only_the_metrics_stream_buffers_while_disconnected() {
        let c = load(MINIMAL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.streams.buffer_while_disconnected_records(), 16384);
        let text =
            format!("{MINIMAL}streams:\n  metrics:\n    buffer_while_disconnected_records: 0\n");
        let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.streams.buffer_while_disconnected_records(), 0);
        for stream in ["logs", "fast_counters"] {
            let text = format!(
                "{MINIMAL}streams:\n  {stream}:\n    buffer_while_disconnected_records: 10\n"
            );
            let err = load(&text)
                .err()
                .unwrap_or_else(|| panic!("expected a problem"));
            assert!(
                err.problems.iter().any(|p| p.key_path
                    == format!("streams.{stream}.buffer_while_disconnected_records")
                    && p.message.contains("only streams.metrics")),
                "{err}"
            );
        }
    }

    #[test]
    fn rc_settings_out_of_their_ibta_range_are_problems() {
        let text = format!("{MINIMAL}transport:\n  rc:\n    retry_cnt: 8\n");
        let err = load(&text)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert!(
            err.problems
                .iter()
                .any(|p| p.key_path == "transport.rc.retry_cnt"
                    && p.line == Some(8)
                    && p.message.contains("out of range 0..=7")),
            "{err}"
        );
        let text = format!("{MINIMAL}transport:\n  rc:\n    timeout: 32\n");
        let err = load(&text)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert!(
            err.problems
                .iter()
                .any(|p| p.key_path == "transport.rc.timeout"),
            "{err}"
        );
        // Not a u8 at all: a type error at its line.
        let text = format!("{MINIMAL}transport:\n  rc:\n    rnr_retry: 300\n");
        assert!(load(&text).is_err());
        let text = format!("{MINIMAL}transport:\n  rc:\n    min_rnr_timer: 1\n");
        assert!(load(&text).is_err(), "unknown key accepted");
    }

    #[test]
    fn verbs_needs_the_verbs_build() {
        let text = format!("{MINIMAL}transport:\n  kind: verbs\n  verbs:\n    device: rxe0\n");
        let loaded = load(&text);
        if cfg!(feature = "verbs") {
            assert!(loaded.is_ok());
        } else {
            let err = loaded.err().unwrap_or_else(|| panic!("expected a problem"));
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.key_path == "transport.kind" && p.line == Some(7)),
                "{err}"
            );
        }
    }

    #[test]
    fn four_mistakes_are_four_problems_at_once() {
        // Two that serde finds (an unknown key, a wrong type) and two that only the semantic
        // checks find (a bad agent_id, a glob that is not absolute): all in one report.
        let text = "\
agent_id: 'bad id'
collector:
  control: 127.0.0.1:7400
  conect_timeout_seconds: 5
auth:
  token: t
pacing:
  burst_milliseconds: lots
sources:
  logs:
    - path: relative/*.log
";
        let err = load(text)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        let got: Vec<_> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key_path.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some(1),
                    "agent_id",
                    "must be 1 to 128 characters of letters, digits, '.', '_' or '-'"
                ),
                (
                    Some(4),
                    "collector.conect_timeout_seconds",
                    "unknown key; did you mean collector.connect_timeout_seconds?"
                ),
                (
                    Some(8),
                    "pacing.burst_milliseconds",
                    "expected a whole number from 0 to 18446744073709551615, found the text \"lots\""
                ),
                (Some(11), "sources.logs[0].path", "must be an absolute path"),
            ],
            "{err}"
        );
    }

    #[test]
    fn the_soft_transport_keys_are_the_collectors() {
        let text = format!(
            "{MINIMAL}listen:\n  metrics: :9471\ntransport:\n  soft:\n    bind: :4791\n    fault:\n      \
             delay_milliseconds: 3\n"
        );
        let c = load(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.listen.metrics,
            Some(SocketAddr::from(([0, 0, 0, 0], 9471)))
        );
        assert_eq!(
            c.transport.soft.bind,
            Some(SocketAddr::from(([0, 0, 0, 0], 4791)))
        );
        assert_eq!(c.transport.soft.fault.delay_ms, 3);
        // The spellings the collector used to take are errors naming the key now used.
        let text = format!(
            "{MINIMAL}transport:\n  soft:\n    udp:\n      bind: 127.0.0.1:1\n    faults:\n      \
             drop_ratio: 0.1\n      delay_ms: 1\n"
        );
        let err = load(&text)
            .err()
            .unwrap_or_else(|| panic!("expected problems"));
        let shown = err.to_string();
        for want in [
            "agent.yaml:9:7: transport.soft.udp.bind: unknown key; did you mean transport.soft.bind?",
            "agent.yaml:10:5: transport.soft.faults: unknown key; did you mean transport.soft.fault?",
        ] {
            assert!(shown.contains(want), "missing {want:?} in\n{shown}");
        }
        assert_eq!(err.problems.len(), 2, "{shown}");
    }

    #[test]
    fn a_state_directory_that_cannot_be_created_is_a_problem() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("plain-file");
        std::fs::write(&file, "x").unwrap_or_else(|e| panic!("{e}"));
        let state = file.join("state");
        let with_logs = format!(
            "{MINIMAL}sources:\n  logs:\n    - path: /var/log/*.log\n  state_directory: {}\n",
            state.display()
        );
        let err = load(&with_logs)
            .err()
            .unwrap_or_else(|| panic!("expected a problem"));
        assert_eq!(
            err.to_string(),
            format!(
                "agent.yaml:9:20: sources.state_directory: cannot create {}: {} is not a \
                 directory",
                state.display(),
                file.display()
            )
        );
        // Without log sources it is never used, so not checked.
        let without = format!(
            "{MINIMAL}sources:\n  state_directory: {}\n",
            state.display()
        );
        assert!(load(&without).is_ok());
        // A relative directory is relative to the working directory.
        let relative = with_logs.replace(&state.display().to_string(), "./uctel-agent-state");
        let c = load(&relative).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.sources.state_directory.as_deref(),
            Some(Path::new("./uctel-agent-state"))
        );
        assert!(
            !Path::new("./uctel-agent-state").exists(),
            "created by the check"
        );
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("a.example:7470"), Some(("a.example", 7470)));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1", 80)));
        assert_eq!(split_host_port("10.0.0.1:1"), Some(("10.0.0.1", 1)));
        assert_eq!(split_host_port("noport"), None);
        assert_eq!(split_host_port(":80"), None);
        assert_eq!(split_host_port("h:0"), None);
        assert_eq!(split_host_port("h:99999"), None);
    }

    #[test]
    fn agent_ids() {
        assert!(valid_agent_id("node-07.rack_3"));
        assert!(!valid_agent_id(""));
        assert!(!valid_agent_id("a b"));
        assert!(!valid_agent_id("a\"b"));
        assert!(!valid_agent_id(&"x".repeat(129)));
    }

    /// A scrape target with `interval_seconds: 1` and no `timeout_seconds` is valid (its
    /// timeout is the interval, as in Prometheus); a timeout longer than the interval that
    /// the file sets is still refused.
    #[test]
    fn a_scrape_target_with_a_short_interval_needs_no_timeout() {
        let ok = format!(
            "{MINIMAL}sources:\n  scrape:\n    - url: http://127.0.0.1:9100/metrics\n      interval_seconds: 1\n"
        );
        if let Err(e) = load(&ok) {
            panic!("{e}");
        }
        let bad = format!("{ok}      timeout_seconds: 2\n");
        let e = load(&bad).err().unwrap_or_else(|| panic!("accepted"));
        assert!(
            e.problems
                .iter()
                .any(|p| p.key_path == "sources.scrape[0].timeout_seconds"),
            "{e}"
        );
    }

    /// Two targets without `job` on different ports are two instances; two on the same
    /// `host:port` share `job` and `instance` and are refused, the later one named.
    #[test]
    fn two_scrape_targets_sharing_job_and_instance_are_refused() {
        let two = |second: &str| {
            format!(
                "{MINIMAL}sources:\n  scrape:\n    - url: http://127.0.0.1:9100/metrics\n    - url: {second}\n"
            )
        };
        if let Err(e) = load(&two("http://127.0.0.1:9400/metrics")) {
            panic!("{e}");
        }
        let e = load(&two("http://127.0.0.1:9100/federate"))
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        let p = e
            .problems
            .iter()
            .find(|p| p.key_path == "sources.scrape[1]")
            .unwrap_or_else(|| panic!("{e}"));
        assert!(
            p.message.contains("\"127.0.0.1:9100\"") && p.message.contains("sources.scrape[0]"),
            "{e}"
        );
        let renamed = format!(
            "{}      instance: federate\n",
            two("http://127.0.0.1:9100/federate")
        );
        if let Err(e) = load(&renamed) {
            panic!("{e}");
        }
    }
}
