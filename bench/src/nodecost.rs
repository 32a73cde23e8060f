//! Node cost: CPU per host collection of the real `uctel-agent` against CPU per scrape of a
//! real Prometheus node_exporter, side by side on this host, in one window.
//!
//! * **Agent**: `uctel-agent` with its default host collectors on the real `/proc` and `/sys`
//!   (no logs, self metrics off so that the metrics stream carries host collections only),
//!   `sources.host_metrics.interval_seconds` = `interval`, shipping to a real
//!   `uctel-collector`. A collection is seen when the collector's
//!   `uctel_collector_records_received_total{stream="metrics"}` moves; its series are the
//!   records it brought (each collection's delta is kept, so a missed or doubled collection
//!   shows).
//! * **node_exporter**: two instances, scraped by this harness right after each agent
//!   collection arrived (so the same number of collections in the same window, one after the
//!   other rather than competing for a core): one with its defaults, one with only the
//!   collectors the agent has (`--collector.disable-defaults --collector.<name>` for each of
//!   [`HostCollector::ALL`]: the same series, as far as the agent reproduces them). Each
//!   scrape is an HTTP/1.1 GET of `/metrics` on a kept-alive connection with Prometheus's
//!   `Accept` header and, by default, `Accept-Encoding: gzip` (as Prometheus sends); the body
//!   is read in full and decoded here, outside node_exporter. Its series are the samples of
//!   the scrape except `go_*`, `process_*`, `promhttp_*` and `node_exporter_build_info` (the
//!   exporter's own runtime, not the host).
//!
//! CPU of each process is `utime + stime` (`/proc/<pid>/stat`, 10 ms ticks) over the window,
//! and, finer, the sum of its threads' on-CPU nanoseconds (`/proc/<pid>/task/<tid>/schedstat`
//! first field, sched-stats.rst); threads that exit inside the window are missing from the
//! latter and counted in [`CpuNs::vanished_threads`]. The window starts and ends halfway
//! between two agent collections, when every process is idle, and holds exactly
//! `collections` collections of each.
//!
//! What each side pays for differs: the agent's CPU also frames, checksums and sends its
//! records (soft RoCE UC) and answers the collector's heartbeats and credit reports;
//! node_exporter's also serves HTTP, encodes the text exposition and gzips it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_agent::sources::host::HostCollector;

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{
    free_tcp_port, io, CollectorProcess, CollectorSettings, DaemonError, Proc, TOKEN,
};
use crate::idle::NODE_EXPORTER_NAMES;
use crate::promtext::{Sample, Scrape};

/// The agent id of the measured agent.
const AGENT_ID: &str = "nodecost-agent";

/// The `Accept` header Prometheus 2.x sends with a scrape (scrape/scrape.go,
/// `scrapeAcceptHeader`).
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Metric name prefixes of node_exporter's own runtime, left out of its series count.
pub const EXPORTER_OWN_PREFIXES: [&str; 4] =
    ["go_", "process_", "promhttp_", "node_exporter_build_info"];

/// Settings.
#[derive(Clone, Debug)]
pub struct NodeCostConfig {
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// node_exporter; `None` = looked up on `PATH` ([`NODE_EXPORTER_NAMES`]).
    pub node_exporter_bin: Option<PathBuf>,
    /// Scratch directory.
    pub workdir: PathBuf,
    /// Seconds between two collections (the agent's `interval_seconds`, the scrape interval).
    pub interval: Duration,
    /// Unmeasured time after the agent's first collection arrived; both daemons collect
    /// (and are scraped) throughout.
    pub warmup: Duration,
    /// The window; rounded to a whole number of intervals (at least one).
    pub duration: Duration,
    /// Scrape with `Accept-Encoding: gzip` (Prometheus does).
    pub gzip: bool,
}

/// CPU nanoseconds from the threads' schedstat.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuNs {
    /// On-CPU nanoseconds of the threads over the window.
    pub nanoseconds: u64,
    /// Threads alive at the start and gone at the end (their time in the window is missing).
    pub vanished_threads: usize,
}

/// One measured process over the window.
#[derive(Clone, Debug, Serialize)]
pub struct NodeCostSide {
    /// What ran, in words.
    pub what: String,
    /// Collections (agent) or scrapes (node_exporter) in the window.
    pub collections: u32,
    /// Series one collection yields (mean over the window).
    pub series_per_collection: f64,
    /// Smallest and largest series count of one collection in the window.
    pub series_min_max: (f64, f64),
    /// CPU over the window (`utime + stime`, by thread).
    pub cpu: CpuDelta,
    /// CPU of the threads from schedstat (finer than the ticks).
    pub cpu_ns: CpuNs,
    /// `cpu.cpu_seconds` per collection, microseconds.
    pub cpu_us_per_collection: f64,
    /// schedstat CPU per collection, microseconds.
    pub sched_us_per_collection: f64,
    /// `cpu_us_per_collection / series_per_collection` (ticks), nanoseconds.
    pub cpu_ns_per_series: f64,
    /// Bytes of one scrape's HTTP body as sent (gzip if asked); 0 for the agent (not
    /// measured: see [`NodeCostResult::agent_frames`]).
    pub bytes_per_collection: f64,
    /// Wall time of one scrape as seen by the harness (node_exporter), or 0, microseconds.
    pub wall_us_per_collection: f64,
    /// The largest `node_scrape_collector_duration_seconds{collector}` of the last collection,
    /// up to 6, seconds (wall time each sub-collector took, its own report).
    pub slowest_collectors: Vec<(String, f64)>,
    /// Sum of `node_scrape_collector_duration_seconds` of the last collection, seconds.
    pub collectors_seconds: f64,
}

impl NodeCostSide {
    /// CPU per collection the ratios use, microseconds: the schedstat figure when no thread
    /// of the process exited in the window (it is then the whole on-CPU time, in ns), else
    /// the `utime + stime` one (10 ms ticks: a few ticks per window for the agent).
    pub fn us_per_collection(&self) -> f64 {
        if self.cpu_ns.vanished_threads == 0 && self.cpu_ns.nanoseconds > 0 {
            self.sched_us_per_collection
        } else {
            self.cpu_us_per_collection
        }
    }

    /// [`NodeCostSide::us_per_collection`] per series, nanoseconds.
    pub fn ns_per_series(&self) -> f64 {
        crate::stats::ratio(self.us_per_collection() * 1e3, self.series_per_collection)
    }

    /// `frames` over the window per collection.
    pub fn frames_per_collection(&self, frames: f64) -> f64 {
        crate::stats::rate(frames, f64::from(self.collections))
    }
}

/// What the node-cost run measured.
#[derive(Clone, Debug, Serialize)]
pub struct NodeCostResult {
    /// Seconds between two collections.
    pub interval_seconds: f64,
    /// The measured window, seconds.
    pub window_seconds: f64,
    /// The agent.
    pub agent: NodeCostSide,
    /// Series the collector holds for the agent at the end (check on
    /// `agent.series_per_collection`).
    pub agent_series_stored: usize,
    /// Frames the agent's collections took in the window.
    pub agent_frames: f64,
    /// node_exporter with its defaults.
    pub node_defaults: NodeCostSide,
    /// node_exporter with only the agent's collectors.
    pub node_same_collectors: NodeCostSide,
    /// The node_exporter binary.
    pub node_exporter: String,
    /// `Accept-Encoding` sent and `Content-Encoding`/`Content-Type` received.
    pub encoding: String,
    /// `/proc/loadavg` at the start of the window.
    pub loadavg: String,
}

impl NodeCostResult {
    /// Agent CPU per collection / node_exporter's per scrape, from
    /// [`NodeCostSide::us_per_collection`] (`same`: the agent's collectors
    /// only; otherwise its defaults).
    pub fn ratio_per_collection(&self, same: bool) -> f64 {
        let n = if same {
            &self.node_same_collectors
        } else {
            &self.node_defaults
        };
        crate::stats::ratio(self.agent.us_per_collection(), n.us_per_collection())
    }

    /// Agent CPU per series / node_exporter's per series.
    pub fn ratio_per_series(&self, same: bool) -> f64 {
        let n = if same {
            &self.node_same_collectors
        } else {
            &self.node_defaults
        };
        crate::stats::ratio(self.agent.ns_per_series(), n.ns_per_series())
    }
}

/// Why the run failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeCostError {
    /// A daemon could not be run or read.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// No node_exporter to compare with.
    #[error(
        "node_exporter not found ({0} on PATH; Debian: apt-get install prometheus-node-exporter)"
    )]
    NoNodeExporter(String),
    /// A node_exporter scrape failed.
    #[error("scraping node_exporter at {addr}: {detail}")]
    Scrape {
        /// Its address.
        addr: SocketAddr,
        /// What failed.
        detail: String,
    },
    /// The agent's collections did not arrive.
    #[error("no host collection of the agent arrived within {0:?} (its output: {1})")]
    NoCollection(Duration, String),
}

/// Whether `name` is node_exporter's own runtime rather than a host series
/// ([`EXPORTER_OWN_PREFIXES`]).
pub fn is_exporter_own(name: &str) -> bool {
    EXPORTER_OWN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Host series of a node_exporter scrape: every sample but the exporter's own runtime.
pub fn node_series(s: &Scrape) -> usize {
    s.samples
        .iter()
        .filter(|x| !is_exporter_own(&x.name))
        .count()
}

/// The largest `node_scrape_collector_duration_seconds{collector}` of `samples` (at most
/// `n`, largest first) and the sum of all of them, seconds.
pub fn slowest_collectors<'a>(
    samples: impl Iterator<Item = &'a Sample>,
    n: usize,
) -> (Vec<(String, f64)>, f64) {
    let mut v: Vec<(String, f64)> = samples
        .filter(|s| s.name == "node_scrape_collector_duration_seconds" && s.value.is_finite())
        .filter_map(|s| s.label("collector").map(|c| (c.to_owned(), s.value)))
        .collect();
    let total = v.iter().map(|(_, d)| d).sum();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(n);
    (v, total)
}

/// The first field of a schedstat line (`/proc/<pid>/task/<tid>/schedstat`: time on CPU in
/// ns, time waiting on a runqueue, timeslices; Documentation/scheduler/sched-stats.rst).
pub fn parse_schedstat(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

/// On-CPU nanoseconds of each live thread of `pid`.
fn thread_ns(pid: i32) -> BTreeMap<i32, u64> {
    let mut m = BTreeMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return m;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(ns) = fs::read_to_string(e.path().join("schedstat"))
            .ok()
            .and_then(|s| parse_schedstat(&s))
        {
            m.insert(tid, ns);
        }
    }
    m
}

/// The schedstat CPU between two snapshots: threads new in `b` count from zero.
pub fn ns_delta(a: &BTreeMap<i32, u64>, b: &BTreeMap<i32, u64>) -> CpuNs {
    let nanoseconds = b
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(a.get(tid).copied().unwrap_or(0)))
        .sum();
    let vanished_threads = a.keys().filter(|t| !b.contains_key(t)).count();
    CpuNs {
        nanoseconds,
        vanished_threads,
    }
}

/// Mean, min and max of `xs` (zeros for none).
pub fn mean_min_max(xs: &[f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (xs.iter().sum::<f64>() / xs.len() as f64, min, max)
}

/// A node_exporter under measurement, with its scrape statistics.
struct Node {
    what: String,
    proc: Proc,
    addr: SocketAddr,
    series: Vec<f64>,
    bytes: Vec<f64>,
    wall: Vec<f64>,
    last: Option<Scrape>,
    encoding: String,
}

impl Node {
    fn start(bin: &Path, what: &str, args: &[String], out: PathBuf) -> Result<Node, DaemonError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()?));
        let mut all = vec![format!("--web.listen-address={addr}")];
        all.extend_from_slice(args);
        Ok(Node {
            what: what.to_owned(),
            proc: Proc::start(bin, &all, out)?,
            addr,
            series: Vec::new(),
            bytes: Vec::new(),
            wall: Vec::new(),
            last: None,
            encoding: String::new(),
        })
    }

    /// One scrape as Prometheus makes it; `keep` records its figures.
    fn scrape(&mut self, http: &ureq::Agent, gzip: bool, keep: bool) -> Result<(), NodeCostError> {
        let err = |detail: String| NodeCostError::Scrape {
            addr: self.addr,
            detail,
        };
        let t = Instant::now();
        let mut req = http
            .get(format!("http://{}/metrics", self.addr))
            .header("Accept", PROMETHEUS_ACCEPT);
        if gzip {
            req = req.header("Accept-Encoding", "gzip");
        }
        let mut resp = req.call().map_err(|e| err(e.to_string()))?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let (content_encoding, content_type) = (header("content-encoding"), header("content-type"));
        let body = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .map_err(|e| err(e.to_string()))?;
        let wall = t.elapsed().as_secs_f64();
        let text = if content_encoding.eq_ignore_ascii_case("gzip") {
            let mut s = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut s)
                .map_err(|e| err(format!("gunzip: {e}")))?;
            s
        } else {
            String::from_utf8_lossy(&body).into_owned()
        };
        let scrape = Scrape::parse(&text).map_err(|e| err(e.to_string()))?;
        self.encoding = format!(
            "Content-Encoding: {}, Content-Type: {content_type}",
            if content_encoding.is_empty() {
                "identity"
            } else {
                &content_encoding
            }
        );
        if keep {
            self.series.push(node_series(&scrape) as f64);
            self.bytes.push(body.len() as f64);
            self.wall.push(wall);
        }
        self.last = Some(scrape);
        Ok(())
    }
}

fn agent_yaml(control: SocketAddr, interval: f64, state: &Path) -> String {
    format!(
        "agent_id: {AGENT_ID}\n\
         collector:\n  control: {control}\n\
         transport:\n  kind: soft\n  soft:\n    mtu_bytes: 4096\n\
         auth:\n  token: {TOKEN}\n\
         sources:\n  host_metrics:\n    interval_seconds: {interval}\n  self_metrics:\n    enabled: false\n  state_directory: {}\n",
        state.display()
    )
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn records(s: &Scrape) -> f64 {
    s.sum(
        "uctel_collector_records_received_total",
        &[("agent", AGENT_ID), ("stream", "metrics")],
    )
}

fn frames(s: &Scrape) -> f64 {
    s.sum(
        "uctel_collector_frames_received_total",
        &[("agent", AGENT_ID)],
    )
}

/// Runs the node-cost measurement.
///
/// # Errors
/// [`NodeCostError`] when a daemon cannot be run, node_exporter is missing or cannot be
/// scraped, or the agent's collections do not arrive.
pub fn run(cfg: &NodeCostConfig) -> Result<NodeCostResult, NodeCostError> {
    if !cfg.agent_bin.is_file() {
        return Err(DaemonError::MissingBinary {
            what: "agent",
            path: cfg.agent_bin.clone(),
            package: "uctel-agent",
        }
        .into());
    }
    let node_bin = cfg
        .node_exporter_bin
        .clone()
        .or_else(|| {
            NODE_EXPORTER_NAMES.iter().find_map(|n| {
                std::env::var_os("PATH").and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|d| d.join(n))
                        .find(|p| p.is_file())
                })
            })
        })
        .ok_or_else(|| NodeCostError::NoNodeExporter(NODE_EXPORTER_NAMES.join(" or ")))?;
    fs::create_dir_all(&cfg.workdir).map_err(io("creating the node-cost directory"))?;
    let state = cfg.workdir.join("state");
    fs::create_dir_all(&state).map_err(io("creating the state directory"))?;
    let interval = cfg.interval.max(Duration::from_millis(100));
    let collections = (cfg.duration.as_secs_f64() / interval.as_secs_f64())
        .round()
        .max(1.0) as u32;

    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &cfg.workdir,
        &CollectorSettings {
            slots: 1024,
            slot_bytes: 4096,
            credit_margin_slots: 64,
            descriptor_queue: 8192,
            report_interval_seconds: 1.0,
            data_path: "auto",
            log_file: cfg.workdir.join("received-logs.jsonl"),
            credit_write_batching: None,
            extra_yaml: String::new(),
            recv_buffer_bytes: None,
            progress: None,
            min_slots: None,
        },
    )?;
    let mut same_args = vec!["--collector.disable-defaults".to_owned()];
    same_args.extend(
        HostCollector::ALL
            .iter()
            .map(|c| format!("--collector.{}", c.name())),
    );
    let mut nodes = [
        Node::start(
            &node_bin,
            "node_exporter, its defaults",
            &[],
            cfg.workdir.join("node_exporter-defaults.out"),
        )?,
        Node::start(
            &node_bin,
            &format!(
                "node_exporter, the agent's {} collectors only",
                HostCollector::ALL.len()
            ),
            &same_args,
            cfg.workdir.join("node_exporter-same.out"),
        )?,
    ];
    let yaml = cfg.workdir.join("agent.yaml");
    fs::write(
        &yaml,
        agent_yaml(collector.control, interval.as_secs_f64(), &state),
    )
    .map_err(io("writing agent.yaml"))?;
    let agent_out = cfg.workdir.join("agent.out");
    let mut agent = Proc::start(
        &cfg.agent_bin,
        &[
            "--config".into(),
            yaml.display().to_string(),
            "--log-level".into(),
            "error".into(),
        ],
        agent_out.clone(),
    )?;
    let http: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let no_collection =
        |d: Duration| NodeCostError::NoCollection(d, agent_out.display().to_string());

    // Wait for node_exporters to answer and the agent's first collection.
    let first_deadline = Instant::now() + Duration::from_secs(20);
    let mut edge = loop {
        agent.check_alive("agent")?;
        let s = collector.scrape()?;
        if records(&s) > 0.0 {
            break Instant::now();
        }
        if Instant::now() >= first_deadline {
            return Err(no_collection(Duration::from_secs(20)));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for n in &mut nodes {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Err(e) = n.scrape(&http, cfg.gzip, false) {
            n.proc.check_alive("node_exporter")?;
            if Instant::now() >= deadline {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let half = interval / 2;
    // Halfway to the next collection: every process idle, the last collection all in. On a
    // loaded machine a collection's frames may still arrive then: the count must hold still
    // for 50 ms (polled until 0.75 of the interval after the edge, before the next one).
    let settle = |edge: Instant| -> Result<Scrape, NodeCostError> {
        std::thread::sleep((edge + half).saturating_duration_since(Instant::now()));
        let give_up = edge + interval.mul_f64(0.75);
        let mut s = collector.scrape()?;
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let again = collector.scrape()?;
            if records(&again) == records(&s) || Instant::now() >= give_up {
                return Ok(again);
            }
            s = again;
        }
    };
    let mut last = records(&settle(edge)?);
    // The next collection: the records counter moves. Polled from 0.8 interval after the
    // last one, every 5 ms.
    let next_edge = |edge: Instant, last: f64| -> Result<Instant, NodeCostError> {
        std::thread::sleep(
            (edge + interval.mul_f64(0.8)).saturating_duration_since(Instant::now()),
        );
        let give_up = interval * 3 + Duration::from_secs(5);
        let deadline = Instant::now() + give_up;
        loop {
            if records(&collector.scrape()?) > last {
                return Ok(Instant::now());
            }
            if Instant::now() >= deadline {
                return Err(no_collection(give_up));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let warm_until = Instant::now() + cfg.warmup;
    while Instant::now() < warm_until {
        edge = next_edge(edge, last)?;
        for n in &mut nodes {
            n.scrape(&http, cfg.gzip, false)?;
        }
        last = records(&settle(edge)?);
    }

    // The window.
    let load = loadavg();
    let pids = [agent.pid(), nodes[0].proc.pid(), nodes[1].proc.pid()];
    let before_ticks = pids
        .iter()
        .map(|p| sample_process(*p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(DaemonError::from)?;
    let before_ns: Vec<_> = pids.iter().map(|p| thread_ns(*p)).collect();
    let s0 = collector.scrape()?;
    let mut per_collection = Vec::new();
    let mut prev = records(&s0);
    let mut s1 = s0.clone();
    for _ in 0..collections {
        edge = next_edge(edge, prev)?;
        for n in &mut nodes {
            n.scrape(&http, cfg.gzip, true)?;
        }
        s1 = settle(edge)?;
        let r = records(&s1);
        per_collection.push(r - prev);
        prev = r;
    }
    let after_ticks = pids
        .iter()
        .map(|p| sample_process(*p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(DaemonError::from)?;
    let after_ns: Vec<_> = pids.iter().map(|p| thread_ns(*p)).collect();
    agent.check_alive("agent")?;
    for n in &mut nodes {
        n.proc.check_alive("node_exporter")?;
    }

    let side = |i: usize,
                what: String,
                series: &[f64],
                bytes: &[f64],
                wall: &[f64],
                durations: (Vec<(String, f64)>, f64)| {
        let cpu = delta(&before_ticks[i], &after_ticks[i]);
        let cpu_ns = ns_delta(&before_ns[i], &after_ns[i]);
        let (mean, min, max) = mean_min_max(series);
        let n = f64::from(collections);
        let cpu_us = cpu.cpu_seconds * 1e6 / n;
        NodeCostSide {
            what,
            collections,
            series_per_collection: mean,
            series_min_max: (min, max),
            cpu_us_per_collection: cpu_us,
            sched_us_per_collection: cpu_ns.nanoseconds as f64 / 1e3 / n,
            cpu_ns_per_series: crate::stats::ratio(cpu_us * 1e3, mean),
            cpu,
            cpu_ns,
            bytes_per_collection: mean_min_max(bytes).0,
            wall_us_per_collection: mean_min_max(wall).0 * 1e6,
            slowest_collectors: durations.0,
            collectors_seconds: durations.1,
        }
    };
    let agent_samples: Vec<&Sample> = s1
        .samples
        .iter()
        .filter(|s| s.label("agent") == Some(AGENT_ID) && !s.name.starts_with("uctel_"))
        .collect();
    let agent_side = side(
        0,
        format!(
            "uctel-agent, default host collectors every {:.1} s",
            interval.as_secs_f64()
        ),
        &per_collection,
        &[],
        &[],
        slowest_collectors(agent_samples.iter().copied(), 6),
    );
    let node_side = |i: usize| {
        let n = &nodes[i];
        side(
            i + 1,
            n.what.clone(),
            &n.series,
            &n.bytes,
            &n.wall,
            n.last.as_ref().map_or((Vec::new(), 0.0), |s| {
                slowest_collectors(s.samples.iter(), 6)
            }),
        )
    };
    let (node_defaults, node_same_collectors) = (node_side(0), node_side(1));
    let result = NodeCostResult {
        interval_seconds: interval.as_secs_f64(),
        window_seconds: agent_side.cpu.wall_seconds,
        agent_series_stored: agent_samples.len(),
        agent_frames: frames(&s1) - frames(&s0),
        agent: agent_side,
        node_defaults,
        node_same_collectors,
        node_exporter: node_bin.display().to_string(),
        encoding: format!(
            "Accept-Encoding: {}; {}",
            if cfg.gzip { "gzip" } else { "(none)" },
            nodes[0].encoding
        ),
        loadavg: load,
    };
    drop(agent);
    drop(nodes);
    collector.stop();
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exporter_runtime_series_are_not_host_series() {
        let s = Scrape::parse(
            "go_goroutines 8\nprocess_cpu_seconds_total 1\npromhttp_metric_handler_requests_total{code=\"200\"} 3\n\
             node_exporter_build_info{version=\"1.5.0\"} 1\nnode_load1 0.5\n\
             node_scrape_collector_duration_seconds{collector=\"cpu\"} 0.002\n\
             node_scrape_collector_duration_seconds{collector=\"netclass\"} 0.004\n\
             node_scrape_collector_duration_seconds{collector=\"time\"} 0.0001\n",
        )
        .unwrap();
        assert_eq!(node_series(&s), 4);
        let (top, total) = slowest_collectors(s.samples.iter(), 2);
        assert_eq!(
            top,
            vec![("netclass".to_owned(), 0.004), ("cpu".to_owned(), 0.002)]
        );
        assert!((total - 0.0061).abs() < 1e-12);
    }

    #[test]
    fn schedstat_deltas_count_new_threads_from_zero_and_note_gone_ones() {
        assert_eq!(parse_schedstat("313218 14841102 2\n"), Some(313218));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        let a = BTreeMap::from([(1, 100), (2, 50), (3, 10)]);
        let b = BTreeMap::from([(1, 180), (2, 50), (4, 7)]);
        assert_eq!(
            ns_delta(&a, &b),
            CpuNs {
                nanoseconds: 87,
                vanished_threads: 1
            }
        );
    }

    #[test]
    fn this_process_has_schedstat_time() {
        let pid = i32::try_from(std::process::id()).unwrap();
        assert!(thread_ns(pid).values().sum::<u64>() > 0);
    }

    #[test]
    fn ratios_use_schedstat_unless_a_thread_vanished() {
        let side = |ticks_us: f64, sched_us: f64, vanished: usize, series: f64| NodeCostSide {
            what: String::new(),
            collections: 10,
            series_per_collection: series,
            series_min_max: (series, series),
            cpu: CpuDelta {
                wall_seconds: 10.0,
                cpu_seconds: ticks_us * 10.0 / 1e6,
                cores: 0.0,
                by_thread: BTreeMap::new(),
            },
            cpu_ns: CpuNs {
                nanoseconds: (sched_us * 10.0 * 1e3) as u64,
                vanished_threads: vanished,
            },
            cpu_us_per_collection: ticks_us,
            sched_us_per_collection: sched_us,
            cpu_ns_per_series: ticks_us * 1e3 / series,
            bytes_per_collection: 0.0,
            wall_us_per_collection: 0.0,
            slowest_collectors: Vec::new(),
            collectors_seconds: 0.0,
        };
        let r = NodeCostResult {
            interval_seconds: 1.0,
            window_seconds: 10.0,
            agent: side(4000.0, 3000.0, 0, 300.0),
            agent_series_stored: 300,
            agent_frames: 80.0,
            node_defaults: side(12000.0, 12000.0, 1, 400.0),
            node_same_collectors: side(10000.0, 10000.0, 0, 200.0),
            node_exporter: String::new(),
            encoding: String::new(),
            loadavg: String::new(),
        };
        assert!((r.ratio_per_collection(true) - 0.3).abs() < 1e-12);
        // 10 ns per series against 50.
        assert!((r.ratio_per_series(true) - 0.2).abs() < 1e-12);
        // Defaults: a thread vanished, so its ticks (12000) against the agent's schedstat.
        assert!((r.ratio_per_collection(false) - 0.25).abs() < 1e-12);
        assert!((r.agent.frames_per_collection(r.agent_frames) - 8.0).abs() < 1e-12);
    }

    #[test]
    fn mean_min_max_of_collections() {
        assert_eq!(mean_min_max(&[]), (0.0, 0.0, 0.0));
        assert_eq!(mean_min_max(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
    }
}
