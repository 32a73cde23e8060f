//! `uctel-bench`: parse flags, run the measurements, print the table, write the JSON.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use uctel_bench::agentcost::{self, AgentCostConfig};
use uctel_bench::fastcost::{self, FastCostConfig};
use uctel_bench::forms::{FormRound, SoftForms};
use uctel_bench::idle::{self, IdleConfig};
use uctel_bench::journalcost::{self, JournalCostConfig};
use uctel_bench::limit::{self, LimitConfig};
use uctel_bench::nodecost::{self, NodeCostConfig};
use uctel_bench::processing::{self, ProcessingConfig};
use uctel_bench::remotewrite::{self, RemoteWriteRunConfig};
use uctel_bench::report::{Machine, Perftest, Report};
use uctel_bench::softpath::{self, SoftRunConfig};
use uctel_bench::tradeoff::{self, TradeoffConfig};
use uctel_bench::workload::{FrameForm, FrameTemplate, ROCE_WRITE_IMM_OVERHEAD};
use uctel_transport::api::RcAttr;

/// The collector's `transport.soft.progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Progress {
    /// A progress thread runs the soft device; the worker polls the CQs.
    Thread,
    /// The data-plane worker drives the device once per round.
    Worker,
}

impl Progress {
    fn name(self) -> &'static str {
        match self {
            Progress::Thread => "thread",
            Progress::Worker => "worker",
        }
    }
}

/// One part of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Part {
    /// The recvmmsg limit, plain and with UDP GSO/GRO.
    Limit,
    /// The soft path with `--agents` agents.
    Soft,
    /// Processing only.
    Processing,
    /// The soft path at each of `--scaling-agents`.
    Scaling,
    /// Synchronized bursts at each of `--burst-agents`: every agent its whole credit at once.
    Burst,
    /// `--memory-agents` agents at the agents' default configuration: collector memory.
    Memory,
    /// The real agent's CPU and RSS.
    Agent,
    /// Idle CPU of both daemons beside node_exporter.
    Idle,
    /// Remote-write into VictoriaMetrics: uctel-collector beside vmagent.
    RemoteWrite,
    /// OTLP samples per collector CPU-s against remote-write's, same run, same load.
    Otlp,
    /// CPU per host collection of the agent against node_exporter's per scrape.
    NodeCost,
    /// CPU and lateness of the agent's fast_counters source.
    FastCost,
    /// Aligned sampling: `--align-agents` agents' sample times against the epoch grid.
    Align,
    /// Lines per agent CPU-second of the journald source against the file tailer's.
    JournalCost,
    /// The same frame stream over UC and RC at each of `--tradeoff-losses`.
    Tradeoff,
    /// `--fleet-agents` agents at `--fleet-fps` frames/s each (issue 42).
    Fleet,
    /// `--upkeep-agents` connected agents that only keep their sessions alive (issue 42).
    Upkeep,
    /// The upkeep run with credits written into the agents' memory, twice: the collector's
    /// credit writes batched across agents, and each posted alone (the ratio, one run).
    UpkeepBatching,
    /// The series dictionary: bytes per sample and ingest CPU per sample of a host
    /// collection, protobuf metrics frames against series-dictionary frames.
    Dict,
    /// Bytes per log record of a realistic line mix, today's frames against the same
    /// records with repeated per-file fields interned (would a log dictionary pay?).
    LogDict,
}

/// Measures the uctel soft path, processing, scaling and agent cost against a recvmmsg
/// limit measured in the same run; prints a table and writes JSON.
#[derive(Debug, Parser)]
#[command(name = "uctel-bench", version, about)]
struct Args {
    /// JSON result file; default target/bench-results/<UTC timestamp>.json.
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// Largest frame in bytes (frames are packed full with the protocol framer).
    #[arg(long, default_value_t = 1024)]
    frame_bytes: usize,
    /// Measured window of the limit and the headline soft-path run, seconds.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// Unmeasured warm-up before each window, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Emulated agents in the headline soft-path run.
    #[arg(long, default_value_t = 10)]
    agents: usize,
    /// Agent counts of the scaling runs.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000")]
    scaling_agents: Vec<usize>,
    /// Agent counts of the synchronized-burst runs.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    burst_agents: Vec<usize>,
    /// Bursts per synchronized-burst run.
    #[arg(long, default_value_t = 5)]
    bursts: u32,
    /// Agents of the memory run (default agent configuration: rings from
    /// `--memory-expected-fps`).
    #[arg(long, default_value_t = 10_000)]
    memory_agents: usize,
    /// `Hello.expected_frames_per_second` of the memory run's agents (the agent's default).
    #[arg(long, default_value_t = 32)]
    memory_expected_fps: u32,
    /// Agents of the fleet run.
    #[arg(long, default_value_t = 10_000)]
    fleet_agents: usize,
    /// Frames per second each agent of the fleet run offers (a host: 10–30).
    #[arg(long, default_value_t = 20.0)]
    fleet_fps: f64,
    /// Measured window of the fleet run, seconds.
    #[arg(long, default_value_t = 20.0)]
    fleet_duration_secs: f64,
    /// Agents of the upkeep run.
    #[arg(long, default_value_t = 10_000)]
    upkeep_agents: usize,
    /// Measured window of the upkeep run, seconds.
    #[arg(long, default_value_t = 20.0)]
    upkeep_duration_secs: f64,
    /// Measured window of the memory run, seconds.
    #[arg(long, default_value_t = 5.0)]
    memory_duration_secs: f64,
    /// The collector's `transport.soft.recv_buffer_bytes` (default: the collector's own).
    #[arg(long)]
    recv_buffer_bytes: Option<usize>,
    /// The collector's `transport.soft.progress` in the soft-path, scaling, burst and memory
    /// runs (default: the collector's own).
    #[arg(long, value_enum)]
    collector_progress: Option<Progress>,
    /// The emulated agents offer credit writes into their memory (DESIGN.md §4): the
    /// collector then writes their credit by RDMA WRITE and sends a `Report` every
    /// `control.credit_writes_report_every_intervals` intervals. Off: `Report`s every interval.
    #[arg(long)]
    credit_writes: bool,
    /// Measured window of each scaling run, seconds (at least ten report intervals).
    #[arg(long, default_value_t = 3.0)]
    scaling_duration_secs: f64,
    /// CPU seconds spent in the processing-only ingest loop.
    #[arg(long, default_value_t = 2.0)]
    processing_cpu_secs: f64,
    /// Ring slots per agent (slot size = frame size).
    #[arg(long, default_value_t = 1024)]
    slots: u32,
    /// Credit margin in slots (agents keep at most slots − margin frames outstanding).
    #[arg(long, default_value_t = 64)]
    credit_margin: u32,
    /// Collector `ring.descriptor_queue`: poller → worker queue room beyond the agents' credit
    /// windows (which the collector reserves on its own).
    #[arg(long, default_value_t = 8192)]
    descriptor_queue: u32,
    /// Collector report (credit) interval in ms; default max(10, 0.2 × K), at most 1000 (with
    /// the collector's default 32 MiB receive buffer the budget lasts 29 ms at 1 M frames/s).
    #[arg(long)]
    report_interval_ms: Option<f64>,
    /// Generator QPs per soft device (per UDP socket).
    #[arg(long, default_value_t = 32)]
    qps_per_device: usize,
    /// Generator send queue depth per agent.
    #[arg(long, default_value_t = 64)]
    sq_depth: usize,
    /// Generator WRs posted per agent per turn.
    #[arg(long, default_value_t = 16)]
    post_batch: usize,
    /// Agent cost: metric samples per second to produce.
    #[arg(long, default_value_t = 10_000.0)]
    agent_samples_per_sec: f64,
    /// Agent cost: log lines per second to write.
    #[arg(long, default_value_t = 1_000.0)]
    agent_log_lines_per_sec: f64,
    /// Agent cost: host-metrics interval, seconds (≥ 0.1).
    #[arg(long, default_value_t = 1.0)]
    agent_interval_secs: f64,
    /// Agent cost: measured window, seconds.
    #[arg(long, default_value_t = 10.0)]
    agent_duration_secs: f64,
    /// Agent cost: warm-up after the first data arrived, seconds.
    #[arg(long, default_value_t = 3.0)]
    agent_warmup_secs: f64,
    /// Idle: the window of each phase (collector with no agent and agent with its collector
    /// down; then the agent connected), seconds.
    #[arg(long, default_value_t = 60.0)]
    idle_seconds: f64,
    /// Idle: unmeasured time after each phase started, seconds.
    #[arg(long, default_value_t = 3.0)]
    idle_warmup_secs: f64,
    /// Idle and node cost: the node_exporter to measure beside the daemons; default
    /// `prometheus-node-exporter` (Debian) or `node_exporter` on PATH.
    #[arg(long, value_name = "PATH")]
    node_exporter_bin: Option<PathBuf>,
    /// Align: agents (10 ms fast counters and 1 s host metrics each).
    #[arg(long, default_value_t = 3)]
    align_agents: usize,
    /// Align: how long the agents run, seconds (the figure is 600; CI runs short).
    #[arg(long, default_value_t = 20.0)]
    align_duration_secs: f64,
    /// Fast cost: counters sampled (1 to 10 statistics files of `lo`).
    #[arg(long, default_value_t = 10)]
    fast_counters: usize,
    /// Fast cost: sampling interval, milliseconds.
    #[arg(long, default_value_t = 10)]
    fast_interval_ms: u64,
    /// Fast cost: unmeasured time before each window, seconds.
    #[arg(long, default_value_t = 3.0)]
    fast_warmup_secs: f64,
    /// Fast cost: each measured window (with and without the source), seconds.
    #[arg(long, default_value_t = 20.0)]
    fast_duration_secs: f64,
    /// Journal cost: lines read from the file and from the journal.
    #[arg(long, default_value_t = 200_000)]
    journal_lines: u64,
    /// Node cost: seconds between two collections of the agent and two scrapes of
    /// node_exporter (≥ 0.1).
    #[arg(long, default_value_t = 1.0)]
    node_interval_secs: f64,
    /// Node cost: unmeasured time after the agent's first collection, seconds.
    #[arg(long, default_value_t = 3.0)]
    node_warmup_secs: f64,
    /// Node cost: the measured window, seconds (a whole number of intervals).
    #[arg(long, default_value_t = 20.0)]
    node_duration_secs: f64,
    /// Node cost: scrape node_exporter without `Accept-Encoding: gzip` (Prometheus asks for
    /// gzip).
    #[arg(long)]
    node_no_gzip: bool,
    /// Remote-write: emulated agents (one frame of 11 series per agent per
    /// `--rw-frame-interval-ms`).
    #[arg(long, default_value_t = 20)]
    rw_agents: usize,
    /// Remote-write: milliseconds between two frames of one agent (at least 1).
    #[arg(long, default_value_t = 2)]
    rw_frame_interval_ms: u64,
    /// Remote-write: largest frame (the agent's and collector's default is 4096).
    #[arg(long, default_value_t = 4096)]
    rw_frame_bytes: usize,
    /// Remote-write: skip the collector run without remote-write (the marginal cost).
    #[arg(long)]
    rw_no_baseline: bool,
    /// Rounds of the soft path with both payload forms alternated back to back (protobuf
    /// `metrics` and series-dictionary `metrics_dict` frames of the same size, ABBA), and
    /// whether remote-write also runs the dictionary pair; 0: the protobuf form only.
    #[arg(long, default_value_t = 2)]
    form_rounds: usize,
    /// Remote-write: the measured window of each side, seconds.
    #[arg(long, default_value_t = 10.0)]
    rw_duration_secs: f64,
    /// Remote-write: the VictoriaMetrics receiver (Debian package `victoria-metrics`).
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/victoria-metrics")]
    victoria_metrics_bin: PathBuf,
    /// Remote-write: the vmagent measured beside the collector (same package).
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/vmagent")]
    vmagent_bin: PathBuf,
    /// The collector binary; default `uctel-collector` next to this binary.
    #[arg(long, value_name = "PATH")]
    collector_bin: Option<PathBuf>,
    /// The agent binary; default `uctel-agent` next to this binary.
    #[arg(long, value_name = "PATH")]
    agent_bin: Option<PathBuf>,
    /// Trade-off: offered frames per second of each cell.
    #[arg(long, default_value_t = 10_000)]
    tradeoff_rate: u64,
    /// Trade-off: sending time of each cell, seconds.
    #[arg(long, default_value_t = 3.0)]
    tradeoff_duration_secs: f64,
    /// Trade-off: injected loss probabilities per datagram (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 0.001, 0.01, 0.05])]
    tradeoff_losses: Vec<f64>,
    /// Trade-off: also draw the table as an SVG plot here.
    #[arg(long, value_name = "PATH")]
    tradeoff_plot: Option<PathBuf>,
    /// Run only these parts (comma-separated); default all.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Output of the Soft-RoCE VM suite (`tests/rxe/run.sh verbs_send_bench`) to take the
    /// perftest comparison from.
    #[arg(long, value_name = "PATH")]
    rxe_log: Option<PathBuf>,
    /// Also run the VM suite's `verbs_send_bench` scenario (needs QEMU and the verbs build;
    /// takes minutes) and take the perftest comparison from it.
    #[arg(long)]
    rxe: bool,
    /// Keep configurations and daemon output here instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Report intervals a scaling run's window covers at least.
const SCALING_INTERVALS: f64 = 10.0;

/// A scaling run's window also lasts at least K ÷ this many seconds: at K = 10,000 each agent
/// gets about a third of a frame per second, and a 10 s window holds 3 or 4 frames per agent,
/// so its Jain index measured the rounding (a perfectly fair split reads at most 0.98) more
/// than the sharing; 50 s hold about 18 each (BENCHMARKS.md, fairness at K = 10,000).
const SCALING_AGENTS_PER_SECOND: f64 = 200.0;

fn report_interval(args: &Args, agents: usize) -> f64 {
    let ms = args
        .report_interval_ms
        .unwrap_or_else(|| (0.2 * agents as f64).clamp(10.0, 1000.0));
    ms / 1000.0
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("uctel-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs everything; `Ok(false)` when a part failed (targets missed are not failures).
fn run(args: &Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    let started_at = chrono::Utc::now();
    let wants = |p: Part| args.only.is_empty() || args.only.contains(&p);
    let frame = Arc::new(FrameTemplate::metrics(args.frame_bytes)?);
    let collector_bin = args
        .collector_bin
        .clone()
        .unwrap_or_else(|| sibling("uctel-collector"));
    let agent_bin = args
        .agent_bin
        .clone()
        .unwrap_or_else(|| sibling("uctel-agent"));
    let tmp;
    let workdir: PathBuf = match &args.workdir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("uctel-bench-").tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let mut report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        wall_seconds: 0.0,
        machine: Machine::detect(),
        limit: None,
        limit_gso: None,
        soft: None,
        processing: None,
        scaling: Vec::new(),
        bursts: Vec::new(),
        memory: None,
        fleet: None,
        upkeep: None,
        upkeep_batching: None,
        agent: None,
        idle: None,
        remote_write: None,
        otlp: None,
        node_cost: None,
        fast_cost: None,
        align: None,
        dict_cost: None,
        log_dict: None,
        soft_forms: None,
        journal_cost: None,
        tradeoff: Vec::new(),
        perftest: Perftest {
            source: "not in this run: tests/rxe/run.sh verbs_send_bench prints BENCH verbs_vs_perftest_ratio (pass --rxe-log or --rxe)".into(),
            ..Perftest::default()
        },
        targets: Vec::new(),
        failures: Vec::new(),
    };
    eprintln!(
        "frame: {} B, {} samples per frame; work directory {}",
        frame.len(),
        frame.records(),
        workdir.display()
    );

    if wants(Part::Limit) {
        let cfg = LimitConfig {
            datagram_bytes: frame.len() + ROCE_WRITE_IMM_OVERHEAD,
            batch: 64,
            gso_segments: 32,
            recv_buffer_bytes: 8 << 20,
            warmup: secs(args.warmup_secs),
            duration: secs(args.duration_secs),
        };
        eprintln!("[limit] recvmmsg sink, {:.1} s", args.duration_secs);
        match limit::measure(&cfg) {
            Ok(r) => report.limit = Some(r),
            Err(e) => report.failures.push(("limit".into(), e.to_string())),
        }
        eprintln!(
            "[limit] UDP_SEGMENT × {} sender, UDP_GRO sink, {:.1} s",
            cfg.gso_segments, args.duration_secs
        );
        match limit::measure_gso(&cfg) {
            Ok(r) => report.limit_gso = Some(r),
            Err(e) => report.failures.push(("limit_gso".into(), e.to_string())),
        }
    }
    let soft_cfg = |k: usize, duration: f64, tag: &str| SoftRunConfig {
        collector_bin: collector_bin.clone(),
        workdir: workdir.join(format!("{tag}-k{k}")),
        agents: k,
        frame: frame.clone(),
        slots: args.slots,
        credit_margin_slots: args.credit_margin,
        descriptor_queue: args.descriptor_queue,
        report_interval_seconds: report_interval(args, k),
        warmup: secs(args.warmup_secs),
        duration: secs(duration),
        qps_per_device: args.qps_per_device,
        sq_depth: args.sq_depth,
        post_batch: args.post_batch,
        expected_fps: None,
        bursts: None,
        recv_buffer_bytes: args.recv_buffer_bytes,
        min_slots: None,
        progress: args.collector_progress.map(Progress::name),
        credit_writes: args.credit_writes,
        credit_write_batching: true,
        pace: None,
    };
    if wants(Part::Soft) && args.form_rounds == 0 {
        eprintln!("[soft] K = {}, {:.1} s", args.agents, args.duration_secs);
        match softpath::run(&soft_cfg(args.agents, args.duration_secs, "soft")) {
            Ok(r) => report.soft = Some(r),
            Err(e) => report.failures.push(("soft path".into(), e.to_string())),
        }
    }
    if wants(Part::Soft) && args.form_rounds > 0 {
        let dict = Arc::new(FrameTemplate::metrics_dict(args.frame_bytes)?);
        let mut forms = SoftForms::default();
        for round in 0..args.form_rounds {
            // ABBA: the form that ran second runs first in the next round.
            let order = if round % 2 == 0 {
                [FrameForm::Metrics, FrameForm::MetricsDict]
            } else {
                [FrameForm::MetricsDict, FrameForm::Metrics]
            };
            let mut got = Vec::new();
            for form in order {
                eprintln!(
                    "[soft] round {round}, {}: K = {}, {:.1} s",
                    form.name(),
                    args.agents,
                    args.duration_secs
                );
                let tag = format!("soft-{}-r{round}", form.name());
                let cfg = SoftRunConfig {
                    frame: match form {
                        FrameForm::Metrics => frame.clone(),
                        FrameForm::MetricsDict => dict.clone(),
                    },
                    ..soft_cfg(args.agents, args.duration_secs, &tag)
                };
                match softpath::run(&cfg) {
                    Ok(r) => got.push(r),
                    Err(e) => report
                        .failures
                        .push((format!("soft path, {}", form.name()), e.to_string())),
                }
            }
            let (Some(b), Some(a)) = (got.pop(), got.pop()) else {
                continue;
            };
            let (metrics, metrics_dict) = if order[0] == FrameForm::Metrics {
                (a, b)
            } else {
                (b, a)
            };
            if report.soft.is_none() {
                report.soft = Some(metrics.clone());
            }
            forms.rounds.push(FormRound {
                first: order[0],
                metrics,
                metrics_dict,
            });
        }
        report.soft_forms = Some(forms);
    }
    if wants(Part::Processing) {
        eprintln!("[processing] {:.1} CPU-s", args.processing_cpu_secs);
        match processing::measure(&ProcessingConfig {
            frame: frame.clone(),
            cpu_budget: secs(args.processing_cpu_secs),
            batch: 1024,
        }) {
            Ok(r) => report.processing = Some(r),
            Err(e) => report.failures.push(("processing".into(), e.to_string())),
        }
    }
    if wants(Part::Scaling) {
        for &k in &args.scaling_agents {
            // Per-agent rates and their fairness need the window to cover several report
            // intervals (credit comes back once per interval; at K = 10,000 each agent's
            // share is a fraction of a frame per interval), and the warm-up a few.
            let interval = report_interval(args, k);
            let duration = args
                .scaling_duration_secs
                .max(SCALING_INTERVALS * interval)
                .max(k as f64 / SCALING_AGENTS_PER_SECOND);
            eprintln!("[scaling] K = {k}, {duration:.1} s");
            let cfg = SoftRunConfig {
                warmup: secs(args.warmup_secs.max(2.0 * interval)),
                ..soft_cfg(k, duration, "scaling")
            };
            match softpath::run(&cfg) {
                Ok(r) => report.scaling.push(r),
                Err(e) => report
                    .failures
                    .push((format!("scaling K = {k}"), e.to_string())),
            }
        }
    }
    if wants(Part::Burst) {
        for &k in &args.burst_agents {
            eprintln!("[burst] K = {k}, {} synchronized bursts", args.bursts);
            let cfg = SoftRunConfig {
                bursts: Some(args.bursts.max(1)),
                // A whole window in one post.
                sq_depth: args.sq_depth.max(args.slots as usize),
                // Long enough for every burst: each waits for the previous one to be
                // consumed and the grants to settle.
                duration: secs(
                    (0.5 + 2.0 * report_interval(args, k)) * f64::from(args.bursts.max(1)),
                ),
                ..soft_cfg(k, 0.0, "burst")
            };
            match softpath::run(&cfg) {
                Ok(r) => report.bursts.push(r),
                Err(e) => report
                    .failures
                    .push((format!("burst K = {k}"), e.to_string())),
            }
        }
    }
    if wants(Part::Fleet) {
        let k = args.fleet_agents;
        let fps = args.fleet_fps.max(0.001);
        eprintln!(
            "[fleet] K = {k} at {fps} frames/s each, {:.1} s",
            args.fleet_duration_secs
        );
        let cfg = SoftRunConfig {
            pace: Some(Duration::from_secs_f64(1.0 / fps)),
            warmup: secs(args.warmup_secs.max(2.0 * report_interval(args, k))),
            ..soft_cfg(k, args.fleet_duration_secs, "fleet")
        };
        match softpath::run(&cfg) {
            Ok(r) => report.fleet = Some(r),
            Err(e) => report
                .failures
                .push((format!("fleet K = {k}"), e.to_string())),
        }
    }
    if wants(Part::Upkeep) {
        let k = args.upkeep_agents;
        eprintln!("[upkeep] K = {k} idle, {:.1} s", args.upkeep_duration_secs);
        // One frame per agent at the start (in the warm-up), then nothing but the sessions'
        // heartbeats, reports and credit.
        let cfg = SoftRunConfig {
            pace: Some(Duration::from_secs(24 * 3600)),
            warmup: secs(args.warmup_secs.max(2.0 * report_interval(args, k))),
            ..soft_cfg(k, args.upkeep_duration_secs, "upkeep")
        };
        match softpath::run(&cfg) {
            Ok(r) => report.upkeep = Some(r),
            Err(e) => report
                .failures
                .push((format!("upkeep K = {k}"), e.to_string())),
        }
    }
    if wants(Part::UpkeepBatching) {
        let k = args.upkeep_agents;
        let run = |batching: bool| {
            eprintln!(
                "[upkeep-batching] K = {k} idle, credit writes batched {batching}, {:.1} s",
                args.upkeep_duration_secs
            );
            let tag = if batching {
                "upkeep-batched"
            } else {
                "upkeep-unbatched"
            };
            softpath::run(&SoftRunConfig {
                pace: Some(Duration::from_secs(24 * 3600)),
                warmup: secs(args.warmup_secs.max(2.0 * report_interval(args, k))),
                credit_writes: true,
                credit_write_batching: batching,
                ..soft_cfg(k, args.upkeep_duration_secs, tag)
            })
        };
        match run(true).and_then(|batched| {
            run(false).map(|unbatched| uctel_bench::fleet::UpkeepBatching { batched, unbatched })
        }) {
            Ok(r) => report.upkeep_batching = Some(r),
            Err(e) => report
                .failures
                .push((format!("upkeep-batching K = {k}"), e.to_string())),
        }
    }
    if wants(Part::Memory) {
        let k = args.memory_agents;
        eprintln!(
            "[memory] K = {k} at {} frames/s announced, {:.1} s",
            args.memory_expected_fps, args.memory_duration_secs
        );
        let cfg = SoftRunConfig {
            expected_fps: Some(args.memory_expected_fps),
            ..soft_cfg(k, args.memory_duration_secs, "memory")
        };
        match softpath::run(&cfg) {
            Ok(r) => report.memory = Some(r),
            Err(e) => report
                .failures
                .push((format!("memory K = {k}"), e.to_string())),
        }
    }
    if wants(Part::Agent) {
        eprintln!(
            "[agent] {} samples/s + {} lines/s, {:.1} s",
            args.agent_samples_per_sec, args.agent_log_lines_per_sec, args.agent_duration_secs
        );
        match agentcost::run(&AgentCostConfig {
            agent_bin: agent_bin.clone(),
            collector_bin: collector_bin.clone(),
            workdir: workdir.join("agent"),
            samples_per_sec: args.agent_samples_per_sec,
            log_lines_per_sec: args.agent_log_lines_per_sec,
            interval_seconds: args.agent_interval_secs.max(0.1),
            warmup: secs(args.agent_warmup_secs),
            duration: secs(args.agent_duration_secs),
        }) {
            Ok(r) => report.agent = Some(r),
            Err(e) => report.failures.push(("agent cost".into(), e.to_string())),
        }
    }
    if wants(Part::Idle) {
        eprintln!(
            "[idle] collector, agent and node_exporter with nothing to do, 2 × {:.0} s",
            args.idle_seconds
        );
        match idle::run(&IdleConfig {
            collector_bin: collector_bin.clone(),
            agent_bin: agent_bin.clone(),
            node_exporter_bin: args.node_exporter_bin.clone(),
            workdir: workdir.join("idle"),
            warmup: secs(args.idle_warmup_secs),
            duration: secs(args.idle_seconds),
        }) {
            Ok(r) => report.idle = Some(r),
            Err(e) => report.failures.push(("idle".into(), e.to_string())),
        }
    }
    if wants(Part::RemoteWrite) {
        eprintln!(
            "[remote-write] {} agents, a frame each per {} ms, 2 × {:.1} s",
            args.rw_agents, args.rw_frame_interval_ms, args.rw_duration_secs
        );
        match remotewrite::run(&RemoteWriteRunConfig {
            collector_bin: collector_bin.clone(),
            victoria_bin: args.victoria_metrics_bin.clone(),
            vmagent_bin: args.vmagent_bin.clone(),
            workdir: workdir.join("remote-write"),
            agents: args.rw_agents,
            frame: Arc::new(FrameTemplate::metrics(args.rw_frame_bytes)?),
            dict_frame: if args.form_rounds > 0 {
                Some(Arc::new(FrameTemplate::metrics_dict(args.rw_frame_bytes)?))
            } else {
                None
            },
            baseline: !args.rw_no_baseline,
            gap: Duration::from_millis(args.rw_frame_interval_ms.max(1)),
            slots: args.slots,
            warmup: secs(args.warmup_secs.max(2.0)),
            duration: secs(args.rw_duration_secs),
        }) {
            Ok(r) => report.remote_write = Some(r),
            Err(e) => report.failures.push(("remote-write".into(), e.to_string())),
        }
    }
    if wants(Part::Otlp) {
        eprintln!(
            "[otlp] {} agents, a frame each per {} ms, OTLP then remote-write, 2 × {:.1} s",
            args.rw_agents, args.rw_frame_interval_ms, args.rw_duration_secs
        );
        match uctel_bench::otlpcost::run(&uctel_bench::otlpcost::OtlpCostConfig {
            collector_bin: collector_bin.clone(),
            workdir: workdir.join("otlp"),
            agents: args.rw_agents,
            frame: Arc::new(FrameTemplate::metrics(args.rw_frame_bytes)?),
            gap: Duration::from_millis(args.rw_frame_interval_ms.max(1)),
            slots: args.slots,
            warmup: secs(args.warmup_secs.max(2.0)),
            duration: secs(args.rw_duration_secs),
        }) {
            Ok(r) => report.otlp = Some(r),
            Err(e) => report.failures.push(("otlp".into(), e.to_string())),
        }
    }
    if wants(Part::NodeCost) {
        eprintln!(
            "[node-cost] agent host collection vs node_exporter scrape every {:.1} s, {:.0} s",
            args.node_interval_secs, args.node_duration_secs
        );
        match nodecost::run(&NodeCostConfig {
            agent_bin: agent_bin.clone(),
            collector_bin: collector_bin.clone(),
            node_exporter_bin: args.node_exporter_bin.clone(),
            workdir: workdir.join("node-cost"),
            interval: secs(args.node_interval_secs.max(0.1)),
            warmup: secs(args.node_warmup_secs),
            duration: secs(args.node_duration_secs),
            gzip: !args.node_no_gzip,
        }) {
            Ok(r) => report.node_cost = Some(r),
            Err(e) => report.failures.push(("node cost".into(), e.to_string())),
        }
    }
    if wants(Part::FastCost) {
        eprintln!(
            "[fast-cost] {} counters every {} ms, 2 × {:.0} s",
            args.fast_counters, args.fast_interval_ms, args.fast_duration_secs
        );
        match fastcost::run(&FastCostConfig {
            agent_bin: agent_bin.clone(),
            collector_bin: collector_bin.clone(),
            workdir: workdir.join("fast-cost"),
            counters: args.fast_counters,
            interval: Duration::from_millis(args.fast_interval_ms.max(1)),
            warmup: secs(args.fast_warmup_secs),
            duration: secs(args.fast_duration_secs),
        }) {
            Ok(r) => report.fast_cost = Some(r),
            Err(e) => report.failures.push(("fast cost".into(), e.to_string())),
        }
    }
    if wants(Part::Align) {
        eprintln!(
            "[align] {} agents, 10 ms fast counters and 1 s host metrics, {:.0} s",
            args.align_agents, args.align_duration_secs
        );
        match uctel_bench::align::run(&uctel_bench::align::AlignConfig {
            agent_bin: agent_bin.clone(),
            workdir: workdir.join("align"),
            agents: args.align_agents.max(1),
            fast_interval: Duration::from_millis(10),
            host_interval: Duration::from_secs(1),
            duration: secs(args.align_duration_secs),
        }) {
            Ok(r) => report.align = Some(r),
            Err(e) => report.failures.push(("align".into(), e.to_string())),
        }
    }
    if wants(Part::Dict) {
        eprintln!("[dict] one host collection, metrics vs metrics_dict frames, ingest alternated");
        match uctel_bench::dictcost::measure(&uctel_bench::dictcost::DictCostConfig {
            frame_bytes: frame.len().min(1024),
            cpu_budget: secs(args.processing_cpu_secs),
        }) {
            Ok(r) => {
                for (what, figure) in r.lines() {
                    eprintln!("[dict] {what}: {figure}");
                }
                report.dict_cost = Some(r);
            }
            Err(e) => report.failures.push(("dict".into(), e.to_string())),
        }
    }
    if wants(Part::LogDict) {
        eprintln!("[log-dict] a log line mix, bytes per record with and without interning");
        match uctel_bench::logdict::measure(&uctel_bench::logdict::LogDictConfig {
            frame_bytes: frame.len().min(1024),
            records: 20_000,
        }) {
            Ok(r) => {
                for (what, figure) in r.lines() {
                    eprintln!("[log-dict] {what}: {figure}");
                }
                report.log_dict = Some(r);
            }
            Err(e) => report.failures.push(("log dict".into(), e)),
        }
    }
    if wants(Part::JournalCost) {
        eprintln!(
            "[journal-cost] {} lines from a file, then from the journal",
            args.journal_lines
        );
        match journalcost::run(&JournalCostConfig {
            agent_bin: agent_bin.clone(),
            collector_bin: collector_bin.clone(),
            workdir: workdir.join("journal-cost"),
            lines: args.journal_lines.max(1),
            timeout: Duration::from_secs(300),
        }) {
            Ok(r) => report.journal_cost = Some(r),
            Err(e) => report.failures.push(("journal cost".into(), e.to_string())),
        }
    }
    if wants(Part::Tradeoff) {
        let cfg = TradeoffConfig {
            frame_bytes: frame.len().min(1024),
            rate_fps: args.tradeoff_rate.max(1),
            duration: secs(args.tradeoff_duration_secs),
            losses: args.tradeoff_losses.clone(),
            rc: RcAttr::default(),
            seed: 0x7ade_0ff5,
        };
        match tradeoff::run(&cfg) {
            Ok(rows) => {
                if let Some(path) = &args.tradeoff_plot {
                    if let Err(e) = tradeoff::plot(&rows, path) {
                        report
                            .failures
                            .push(("trade-off plot".into(), e.to_string()));
                    }
                }
                report.tradeoff = rows;
            }
            Err(e) => report.failures.push(("trade-off".into(), format!("{e:#}"))),
        }
    }
    if args.rxe {
        eprintln!("[rxe] tests/rxe/run.sh verbs_send_bench (QEMU guest; minutes)");
        report.perftest = run_rxe(&workdir);
    } else if let Some(path) = &args.rxe_log {
        let when = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| {
                chrono::DateTime::<chrono::Utc>::from(t)
                    .format(" (VM suite run of %Y-%m-%d %H:%M UTC)")
                    .to_string()
            })
            .unwrap_or_default();
        report.perftest = match std::fs::read_to_string(path) {
            Ok(text) => Perftest::parse(&text, &format!("{}{when}", path.display())),
            Err(e) => Perftest {
                source: format!("{}: {e}", path.display()),
                ..Perftest::default()
            },
        };
    }

    report.wall_seconds = started.elapsed().as_secs_f64();
    report.check_targets();
    print!("{}", report.render());
    let output = args.output.clone().unwrap_or_else(|| {
        Path::new("target/bench-results")
            .join(format!("{}.json", started_at.format("%Y%m%dT%H%M%SZ")))
    });
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&output, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", output.display()))?;
    println!("results: {}", output.display());
    Ok(report.failures.is_empty())
}

fn run_rxe(workdir: &Path) -> Perftest {
    let log = workdir.join("rxe.out");
    let out = std::process::Command::new("tests/rxe/run.sh")
        .arg("verbs_send_bench")
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let _ = std::fs::write(&log, &text);
            let mut p = Perftest::parse(&text, "tests/rxe/run.sh verbs_send_bench (this run)");
            if !o.status.success() {
                p.source = format!("{} — exited {}", p.source, o.status);
            }
            p
        }
        Err(e) => Perftest {
            source: format!("tests/rxe/run.sh could not be started: {e}"),
            ..Perftest::default()
        },
    }
}
