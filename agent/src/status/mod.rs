//! The agent's status API: `GET /api/v1/status` on its metrics port (`listen.metrics`), a
//! JSON document of schema version [`uctel_common::status::API_VERSION`]
//! (`docs/status-api.md`).
//!
//! Built at each request from what the agent already keeps: the self-metrics registry
//! (sent and dropped per stream and reason, the collector, fast counters) and the
//! [`Board`] its log tailers, scrape loops and sender fill as they run. A figure named
//! after a metric equals that `uctel_agent_` series at the same moment; "last 10 s"
//! figures are increases over a [`Window`] sampled every second ([`sample_loop`]).
//!
//! - [`board`]: files, scrape targets, the journald cursor and kmsg sequence number, the
//!   credit window.

pub mod board;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde::Serialize;
use uctel_common::shutdown::Shutdown;
use uctel_common::status::{Samples, Since, Window, SAMPLE_EVERY};

pub use board::{Board, CreditView, FileView, JournaldView, KmsgView, ScrapeView};

const A: &str = "uctel_agent_";

/// The agent's status document (schema version 1). Counts are whole items, `*_seconds`
/// seconds, `*_per_second` rates over `window_seconds` (up to 10 s).
#[derive(Debug, Clone, Serialize)]
pub struct AgentStatus {
    /// Schema version, 1.
    pub version: u32,
    /// `uctel-agent`.
    pub daemon: &'static str,
    /// The agent's package version.
    pub daemon_version: &'static str,
    /// Its `agent_id`.
    pub agent_id: String,
    /// When the document was built (Unix seconds).
    pub time_unix_seconds: f64,
    /// Seconds since the agent started.
    pub uptime_seconds: f64,
    /// The span of the `last_10s` and `*_per_second` figures.
    pub window_seconds: f64,
    /// The collector it is connected to.
    pub collector: CollectorLink,
    /// The UC lane's credit window at the last heartbeat; `null` while not connected.
    pub credit: Option<CreditView>,
    /// One entry per stream (`metrics`, `logs`, `fast_counters`).
    pub streams: Vec<StreamStatus>,
    /// Records dropped by reason, Σ over streams (`records_dropped_total`).
    pub drops: BTreeMap<String, u64>,
    /// Records dropped by reason over the window.
    pub drops_last_10s: BTreeMap<String, u64>,
    /// What the sources read.
    pub sources: Sources,
}

/// The collector link.
#[derive(Debug, Clone, Serialize)]
pub struct CollectorLink {
    /// Its control address while connected (`collector_info{address}`); `null` otherwise.
    pub address: Option<String>,
    /// `connected` (1 or 0).
    pub connected: bool,
    /// `reconnects_total`.
    pub reconnects: u64,
}

/// One stream.
#[derive(Debug, Clone, Serialize)]
pub struct StreamStatus {
    /// `metrics`, `logs` or `fast_counters`.
    pub stream: String,
    /// `frames_sent_total`.
    pub frames_sent: u64,
    /// `records_sent_total`.
    pub records_sent: u64,
    /// Frames sent per second over the window.
    pub frames_per_second: f64,
    /// Records sent per second over the window.
    pub records_per_second: f64,
    /// `queue_records`: waiting between the sources and the sender.
    pub queue_records: u64,
    /// `records_dropped_total` by reason.
    pub records_dropped: BTreeMap<String, u64>,
    /// `frames_dropped_total` by reason.
    pub frames_dropped: BTreeMap<String, u64>,
}

/// The sources.
#[derive(Debug, Clone, Serialize)]
pub struct Sources {
    /// Log files followed, by source (its first include pattern).
    pub files: Vec<FileStatus>,
    /// Scrape targets (`sources.scrape`), by URL.
    pub scrape_targets: Vec<ScrapeView>,
    /// The fast counters (`sources.fast_counters`); `null` when off.
    pub fast_counters: Option<FastCounters>,
    /// The journald source's cursors (`sources.journald`); `null` when off.
    pub journald: Option<JournaldView>,
    /// The kernel log source's sequence numbers (`sources.kmsg`); `null` when off.
    pub kmsg: Option<KmsgView>,
    /// `source_errors_total` by source and reason.
    pub errors: BTreeMap<String, BTreeMap<String, u64>>,
}

/// One followed file with its lag.
#[derive(Debug, Clone, Serialize)]
pub struct FileStatus {
    /// The log source (its first include pattern).
    pub source: String,
    /// The file as the tailer saw it.
    #[serde(flatten)]
    pub file: FileView,
    /// `size_bytes − offset_bytes`: bytes written and not read yet (0 when the file
    /// shrank; the tailer handles the truncation).
    pub lag_bytes: u64,
}

/// The fast counters' schedule.
#[derive(Debug, Clone, Serialize)]
pub struct FastCounters {
    /// `fast_samples_total`.
    pub samples: u64,
    /// `fast_missed_rounds_total`.
    pub missed_rounds: u64,
    /// Mean lateness of a round's reads behind its schedule over the window, seconds
    /// (`fast_sample_lateness_seconds` sum / count).
    pub lateness_mean_seconds_last_10s: f64,
    /// The same since start.
    pub lateness_mean_seconds: f64,
}

/// Everything the document is built from; cheap to clone.
#[derive(Debug, Clone)]
pub struct Status {
    agent_id: String,
    registry: prometheus::Registry,
    board: Board,
    window: Arc<Mutex<Window>>,
    started: Instant,
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn as_u64(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

fn whole(m: BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    m.into_iter().map(|(k, v)| (k, as_u64(v))).collect()
}

impl Status {
    /// The status of agent `agent_id` whose self-metrics are in `registry`.
    pub fn new(agent_id: String, registry: prometheus::Registry, board: Board) -> Status {
        Status {
            agent_id,
            registry,
            board,
            window: Arc::default(),
            started: Instant::now(),
        }
    }

    /// Adds the self-metrics now to the window.
    pub fn sample(&self, now: Instant) -> Arc<Samples> {
        let samples = Arc::new(Samples::from_families(&self.registry.gather()));
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(now, samples.clone());
        samples
    }

    /// The document now.
    pub fn document(&self) -> AgentStatus {
        let now = Instant::now();
        let s = self.sample(now);
        let since = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .since(now, &s);
        let name = |n: &str| format!("{A}{n}");
        let address = s
            .series(&name("collector_info"))
            .iter()
            .find(|x| x.value > 0.0)
            .and_then(|x| x.labels.iter().find(|(k, _)| k == "address"))
            .map(|(_, v)| v.clone());
        let connected = s.sum(&name("connected"), &[]) > 0.0;
        AgentStatus {
            version: uctel_common::status::API_VERSION,
            daemon: "uctel-agent",
            daemon_version: env!("CARGO_PKG_VERSION"),
            agent_id: self.agent_id.clone(),
            time_unix_seconds: uctel_common::status::unix_seconds(SystemTime::now()),
            uptime_seconds: now.saturating_duration_since(self.started).as_secs_f64(),
            window_seconds: since.seconds,
            collector: CollectorLink {
                address,
                connected,
                reconnects: as_u64(s.sum(&name("reconnects_total"), &[])),
            },
            credit: if connected { self.board.credit() } else { None },
            streams: streams(&s, &since),
            drops: whole(s.sum_by(&name("records_dropped_total"), "reason", &[])),
            drops_last_10s: whole(since.increase_by(
                &s,
                &name("records_dropped_total"),
                "reason",
                &[],
            )),
            sources: Sources {
                files: self.files(),
                scrape_targets: self.board.scrapes(),
                journald: self.board.journald(),
                kmsg: self.board.kmsg(),
                fast_counters: fast_counters(&s, &since),
                errors: errors(&s),
            },
        }
    }

    /// The document as JSON bytes (what the route serves).
    pub fn json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.document()).unwrap_or_else(|e| {
            format!("{{\"version\":1,\"error\":{:?}}}", e.to_string()).into_bytes()
        })
    }

    /// The followed files with their size looked up now (the same inode only).
    fn files(&self) -> Vec<FileStatus> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        for (source, files) in self.board.files() {
            for mut file in files {
                if let Ok(m) = std::fs::metadata(&file.path) {
                    if m.ino() == file.inode && m.dev() == file.dev {
                        file.size_bytes = m.len();
                    }
                }
                out.push(FileStatus {
                    source: source.clone(),
                    lag_bytes: file.size_bytes.saturating_sub(file.offset_bytes),
                    file,
                });
            }
        }
        out
    }
}

fn streams(s: &Samples, since: &Since) -> Vec<StreamStatus> {
    let name = |n: &str| format!("{A}{n}");
    s.label_values(&name("frames_sent_total"), "stream")
        .into_iter()
        .map(|stream| {
            let w = [("stream", stream.as_str())];
            StreamStatus {
                frames_sent: as_u64(s.sum(&name("frames_sent_total"), &w)),
                records_sent: as_u64(s.sum(&name("records_sent_total"), &w)),
                frames_per_second: since.rate(s, &name("frames_sent_total"), &w),
                records_per_second: since.rate(s, &name("records_sent_total"), &w),
                queue_records: as_u64(s.sum(&name("queue_records"), &w)),
                records_dropped: whole(s.sum_by(&name("records_dropped_total"), "reason", &w)),
                frames_dropped: whole(s.sum_by(&name("frames_dropped_total"), "reason", &w)),
                stream,
            }
        })
        .collect()
}

fn fast_counters(s: &Samples, since: &Since) -> Option<FastCounters> {
    let name = |n: &str| format!("{A}{n}");
    if s.series(&name("fast_samples_total")).is_empty() {
        return None;
    }
    let mean = |sum: f64, count: f64| if count > 0.0 { sum / count } else { 0.0 };
    let (sum, count) = (
        name("fast_sample_lateness_seconds_sum"),
        name("fast_sample_lateness_seconds_count"),
    );
    Some(FastCounters {
        samples: as_u64(s.sum(&name("fast_samples_total"), &[])),
        missed_rounds: as_u64(s.sum(&name("fast_missed_rounds_total"), &[])),
        lateness_mean_seconds_last_10s: mean(
            since.increase(s, &sum, &[]),
            since.increase(s, &count, &[]),
        ),
        lateness_mean_seconds: mean(s.sum(&sum, &[]), s.sum(&count, &[])),
    })
}

fn errors(s: &Samples) -> BTreeMap<String, BTreeMap<String, u64>> {
    let name = format!("{A}source_errors_total");
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for x in s.series(&name) {
        let label = |k: &str| {
            x.labels
                .iter()
                .find(|(l, _)| l == k)
                .map(|(_, v)| v.clone())
        };
        if let (Some(source), Some(reason)) = (label("source"), label("reason")) {
            if x.value > 0.0 {
                *out.entry(source).or_default().entry(reason).or_insert(0) += as_u64(x.value);
            }
        }
    }
    out
}

/// Samples `status` every [`SAMPLE_EVERY`] until `shutdown`, so the "last 10 s" figures
/// cover ten seconds however rarely the API is asked.
pub async fn sample_loop(status: Status, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => { status.sample(Instant::now()); }
            () = shutdown.wait() => return,
        }
    }
}
