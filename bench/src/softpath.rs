//! One soft-path run: a fresh `uctel-collector` process, `K` emulated agents
//! ([`crate::loadgen`]) sending flat out within their credits, a measured window, then
//! `Goodbye`s and the whole-run accounting.
//!
//! ```text
//!  start collector ─► RSS baseline ─► K handshakes ─► send ─► warm-up ─► S0 ── window ── S1 ─► stop
//!                                                                    (scrape, CPU)  (scrape, CPU, RSS)
//!  ─► wait until the reports show everything consumed ─► Goodbye ×K ─► S2 (accounting)
//! ```
//!
//! Figures: frames and samples accepted per wall second and per collector CPU second (all
//! collector threads: soft device, completion poller, worker, tokio), the collector's
//! per-thread CPU, memory per agent (RSS at S1 minus the baseline, over K), per-agent
//! fairness over the window, and `sent = received + lost + dropped` over the run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_collector::telemetry::DropReason;

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{CollectorProcess, CollectorSettings, DaemonError, TOKEN};
use crate::loadgen::{DataStats, LoadConfig, LoadError, LoadGen};
use crate::promtext::Scrape;
use crate::stats::{rate, spread, Spread};
use crate::workload::{FrameForm, FrameTemplate};

const RECEIVED: &str = "uctel_collector_frames_received_total";
const RECORDS: &str = "uctel_collector_records_received_total";
const LOST: &str = "uctel_collector_frames_lost_total";
const RECORDS_LOST: &str = "uctel_collector_records_lost_total";
const DROPPED: &str = "uctel_collector_frames_dropped_total";
const TRANSPORT_DROPPED: &str = "uctel_collector_transport_packets_dropped_total";
const CONNECTED: &str = "uctel_collector_agents_connected";
const BUDGET: &str = "uctel_collector_credit_budget_frames";
const CREDIT_WRITES: &str = "uctel_collector_credit_writes_total";
const CREDIT_WRITE_BATCHES: &str = "uctel_collector_credit_write_batches_total";

/// The kernel's drop count of the UDP socket bound to `port` in process `pid`'s network
/// namespace (`/proc/<pid>/net/udp`, last column; the socket's receive buffer was full).
fn udp_drops(pid: i32, port: u16) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).ok()?;
    let want = format!(":{port:04X}");
    text.lines().skip(1).find_map(|line| {
        let mut cols = line.split_whitespace();
        let local = cols.nth(1)?;
        if !local.ends_with(&want) {
            return None;
        }
        line.split_whitespace().last()?.parse().ok()
    })
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct SoftRunConfig {
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// Scratch directory (configuration, logs).
    pub workdir: PathBuf,
    /// Emulated agents.
    pub agents: usize,
    /// The frames.
    pub frame: Arc<FrameTemplate>,
    /// Ring slots per agent.
    pub slots: u32,
    /// Credit margin in slots.
    pub credit_margin_slots: u32,
    /// Poller → worker queue room beyond the credit windows (`ring.descriptor_queue`).
    pub descriptor_queue: u32,
    /// Report (credit) interval.
    pub report_interval_seconds: f64,
    /// Unmeasured sending before the window.
    pub warmup: Duration,
    /// The window.
    pub duration: Duration,
    /// QPs per generator soft device.
    pub qps_per_device: usize,
    /// Generator send queue depth per agent.
    pub sq_depth: usize,
    /// Generator WRs per agent per turn.
    pub post_batch: usize,
    /// `Hello.expected_frames_per_second` of the agents (`None`: not announced; the
    /// collector gives each its largest ring, `slots`).
    pub expected_fps: Option<u32>,
    /// `Some(n)`: `n` synchronized bursts (every agent its whole credit at once) instead of
    /// sending flat out.
    pub bursts: Option<u32>,
    /// The collector's `transport.soft.recv_buffer_bytes` (`None`: its default).
    pub recv_buffer_bytes: Option<usize>,
    /// The collector's `ring.min_slots` (`None`: its default).
    pub min_slots: Option<u32>,
    /// The collector's `transport.soft.progress` (`None`: its default).
    pub progress: Option<&'static str>,
    /// The emulated agents offer credit writes into their memory (`Hello.credit_mr`,
    /// DESIGN.md §4); false: credits in `Report`s only (the collector then sends one per
    /// report interval).
    pub credit_writes: bool,
    /// The collector's `control.credit_write_batching`: a round's credit writes posted
    /// together (one `sendmmsg`) or each on its own.
    pub credit_write_batching: bool,
    /// `Some(gap)`: each agent sends one frame every `gap` (at least 1 ms) instead of flat
    /// out (the fleet and upkeep rows, [`crate::fleet`]).
    pub pace: Option<Duration>,
}

/// Whole-run frame accounting (after every agent's `Goodbye`).
#[derive(Clone, Debug, Serialize)]
pub struct Accounting {
    /// Frames the generator posted.
    pub sent: u64,
    /// `frames_received_total`.
    pub received: f64,
    /// `frames_lost_total` (gaps, leading and tail loss).
    pub lost: f64,
    /// `frames_dropped_total` by reason.
    pub dropped: BTreeMap<String, f64>,
    /// `transport_packets_dropped_total` by reason (before any QP).
    pub transport_dropped: BTreeMap<String, f64>,
    /// Frames dropped after their stream tracked them (bad payload, limits): the only drops
    /// not also in `lost` (the collector counts a frame dropped before tracking — queue full,
    /// ring overrun, torn slot, transport drops — in `frames_dropped_total{reason}` and, as a
    /// gap of its stream, in `frames_lost_total`).
    pub dropped_after_tracking: f64,
    /// `sent - received - lost - dropped_after_tracking`: 0 when every frame is accounted
    /// for (the collector's per-stream rule, `collector/src/ingest/`).
    pub unaccounted: f64,
    /// Whether the collector reported every posted frame consumed before the goodbyes.
    pub drained: bool,
    /// Records (samples) in the frames the generator posted.
    pub records_sent: u64,
    /// `records_received_total`.
    pub records_received: f64,
    /// `records_lost_total` (the records of lost frames).
    pub records_lost: f64,
    /// `records_sent − records_received − records_lost`: 0 when no frame was dropped after
    /// tracking (those frames' records are in neither counter).
    pub records_unaccounted: f64,
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct SoftRunResult {
    /// Credit writes the collector posted or had refused per second of the window
    /// (`uctel_collector_credit_writes_total`; 0 without `credit_writes`).
    pub credit_writes_per_sec: f64,
    /// Transport calls that posted them batched over the window
    /// (`uctel_collector_credit_write_batches_total`; 0 without batching).
    pub credit_write_batches: f64,
    /// Emulated agents.
    pub agents: usize,
    /// The frames' payload form.
    pub form: FrameForm,
    /// Bytes per frame (the largest: the ring's slot size).
    pub frame_bytes: usize,
    /// Bytes of the steady-state frame.
    pub steady_frame_bytes: usize,
    /// Samples per (steady-state) frame.
    pub records_per_frame: u32,
    /// Agents whose series dictionary the collector had acknowledged by the window's start
    /// (all of them for the protobuf form).
    pub dict_acknowledged: usize,
    /// Ring bytes per agent (`slots × slot_bytes` of the largest ring the collector gave).
    pub ring_bytes: u64,
    /// Ring slots the collector gave, smallest and largest over the agents.
    pub ring_slots: (u32, u32),
    /// The collector's credit budget in frames (`uctel_collector_credit_budget_frames`).
    pub credit_budget_frames: f64,
    /// Datagrams the kernel dropped at the collector's UDP socket over the whole run (the
    /// `drops` column of `/proc/<pid>/net/udp`: receive buffer full).
    pub socket_drops: Option<u64>,
    /// Synchronized bursts sent (burst mode).
    pub bursts: u64,
    /// Seconds the K handshakes took.
    pub connect_seconds: f64,
    /// Frames accepted in the window.
    pub frames: f64,
    /// Samples accepted in the window.
    pub samples: f64,
    /// Frames the generator posted in the window.
    pub frames_offered: u64,
    /// Frames lost in the window.
    pub frames_lost: f64,
    /// Frames dropped in the window (all reasons).
    pub frames_dropped: f64,
    /// Accepted frames per wall second.
    pub frames_per_sec: f64,
    /// Accepted samples per wall second.
    pub samples_per_sec: f64,
    /// Accepted frames per collector CPU second.
    pub frames_per_core_sec: f64,
    /// Accepted samples per collector CPU second.
    pub samples_per_core_sec: f64,
    /// Collector CPU over the window.
    pub collector_cpu: CpuDelta,
    /// Collector RSS with no agent, bytes.
    pub rss_baseline_bytes: u64,
    /// Collector RSS at the end of the window, bytes.
    pub rss_loaded_bytes: u64,
    /// `(rss_loaded - rss_baseline) / K`, bytes.
    pub memory_per_agent_bytes: f64,
    /// Ring bytes per agent the agents had written by the end of the window (whole 4 KiB
    /// pages of the first `min(frames sent, slots)` slots): only written ring pages are
    /// resident, so a short run touches part of each ring.
    pub ring_touched_per_agent_bytes: f64,
    /// `memory_per_agent_bytes - ring_touched_per_agent_bytes`: what an agent costs besides
    /// its ring (QP, CQs, trackers, series, telemetry, queues).
    pub overhead_per_agent_bytes: f64,
    /// Per-agent frames per second over the window.
    pub fairness: Option<Spread>,
    /// Whole-run accounting.
    pub accounting: Accounting,
    /// CPU of the load generator's threads (this process) over the window, by thread.
    pub generator_cpu: Option<CpuDelta>,
    /// Generator counters.
    pub generator_post_calls: u64,
    /// Generator turns with nothing to post (credit- or completion-bound).
    pub generator_idle_rounds: u64,
    /// Errors the control sessions met.
    pub control_errors: Vec<String>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum SoftRunError {
    /// The collector process.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The generator.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Agents never showed up as connected.
    #[error("only {connected} of {agents} agents connected (collector output: {log})")]
    NotConnected {
        /// Connected per the collector.
        connected: f64,
        /// Expected.
        agents: usize,
        /// Collector output file.
        log: String,
    },
}

fn by_reason(s: &Scrape, name: &str) -> BTreeMap<String, f64> {
    s.sum_by(name, "reason")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Runs one soft-path measurement.
///
/// # Errors
/// [`SoftRunError`] when the collector or the generator cannot be run.
pub fn run(cfg: &SoftRunConfig) -> Result<SoftRunResult, SoftRunError> {
    let frame_len = cfg.frame.len();
    let slot_bytes = u32::try_from(frame_len).unwrap_or(u32::MAX);
    std::fs::create_dir_all(&cfg.workdir).map_err(|source| DaemonError::Io {
        what: format!("creating {}", cfg.workdir.display()),
        source,
    })?;
    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &cfg.workdir,
        &CollectorSettings {
            slots: cfg.slots,
            slot_bytes,
            credit_margin_slots: cfg.credit_margin_slots,
            descriptor_queue: cfg.descriptor_queue,
            report_interval_seconds: cfg.report_interval_seconds,
            data_path: "write_with_imm",
            log_file: cfg.workdir.join("logs.jsonl"),
            credit_write_batching: Some(cfg.credit_write_batching),
            extra_yaml: String::new(),
            recv_buffer_bytes: cfg.recv_buffer_bytes,
            min_slots: cfg.min_slots,
            progress: cfg.progress,
        },
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let baseline = collector.sample()?;

    let t_connect = Instant::now();
    let mut gen = LoadGen::connect(&LoadConfig {
        agents: cfg.agents,
        control: collector.control,
        token: TOKEN.into(),
        frame: cfg.frame.clone(),
        qps_per_device: cfg.qps_per_device,
        sq_depth: cfg.sq_depth,
        post_batch: cfg.post_batch,
        connect_parallelism: 32,
        pace: cfg.pace,
        expected_fps: cfg.expected_fps,
        bursts: cfg.bursts,
        credit_writes: cfg.credit_writes,
    })?;
    // The collector counts an agent connected once its Welcome went out.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let connected = collector.scrape()?.sum(CONNECTED, &[]);
        if connected as usize >= cfg.agents {
            break;
        }
        if Instant::now() >= deadline {
            return Err(SoftRunError::NotConnected {
                connected,
                agents: cfg.agents,
                log: collector.log_path().display().to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let connect_seconds = t_connect.elapsed().as_secs_f64();

    gen.start_sending()?;
    std::thread::sleep(cfg.warmup);
    let dict_acknowledged = gen.dict_acknowledged();
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let gen0 = sample_process(me).ok();
    let (c0, s0, g0) = (collector.sample()?, collector.scrape()?, gen.sent());
    let t0 = Instant::now();
    std::thread::sleep(cfg.duration);
    let (c1, g1) = (collector.sample()?, gen.sent());
    let gen1 = sample_process(me).ok();
    let s1 = collector.scrape()?;
    let window = t0.elapsed().as_secs_f64();
    let stats: DataStats = gen.stop_sending();
    let ring_slots = gen.ring_slots();

    let drained = gen.wait_consumed(Duration::from_secs_f64(
        2.0 + 5.0 * cfg.report_interval_seconds,
    ));
    let sent_total: u64 = gen.sent().iter().sum();
    let records_sent = gen.records_sent();
    let socket_drops = udp_drops(collector.pid(), collector.udp.port());
    let ids = gen.agent_ids();
    let control_errors = gen.finish();
    // The collector settles each agent's tail after a short drain once it has the goodbye.
    let deadline = Instant::now() + Duration::from_secs(30);
    let s2 = loop {
        let s = collector.scrape()?;
        if s.sum(CONNECTED, &[]) <= 0.0 || Instant::now() >= deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    collector.stop();

    let cpu = delta(&c0, &c1);
    let frames = s1.sum(RECEIVED, &[]) - s0.sum(RECEIVED, &[]);
    let samples = s1.sum(RECORDS, &[]) - s0.sum(RECORDS, &[]);
    let per_agent0 = s0.sum_by(RECEIVED, "agent");
    let per_agent1 = s1.sum_by(RECEIVED, "agent");
    let per_agent: Vec<f64> = ids
        .iter()
        .map(|id| {
            let a = per_agent1.get(id).copied().unwrap_or(0.0)
                - per_agent0.get(id).copied().unwrap_or(0.0);
            rate(a, window)
        })
        .collect();
    let dropped_total: BTreeMap<String, f64> = by_reason(&s2, DROPPED);
    let received_total = s2.sum(RECEIVED, &[]);
    let lost_total = s2.sum(LOST, &[]);
    let dropped_after_tracking: f64 = dropped_total
        .iter()
        .filter(|(reason, _)| {
            DropReason::all()
                .find(|r| r.as_str() == reason.as_str())
                .is_some_and(|r| !r.before_tracking())
        })
        .map(|(_, v)| v)
        .sum::<f64>()
        + 0.0; // an empty sum is -0.0
    let unaccounted = sent_total as f64 - received_total - lost_total - dropped_after_tracking;
    let rss_delta = c1.rss_bytes.saturating_sub(baseline.rss_bytes);
    let memory_per_agent = rss_delta as f64 / cfg.agents.max(1) as f64;
    // Slots written: frames that reached the ring (accepted or dropped after arriving);
    // frames lost on the way never wrote theirs.
    let dropped_by_agent = s1.sum_by(DROPPED, "agent");
    let ring_touched = ids
        .iter()
        .map(|id| {
            let arrived = per_agent1.get(id).copied().unwrap_or(0.0)
                + dropped_by_agent.get(id).copied().unwrap_or(0.0);
            let slots = ring_slots.get(id).copied().unwrap_or(cfg.slots);
            let bytes = (arrived as u64).min(u64::from(slots)) * u64::from(slot_bytes);
            bytes.div_ceil(4096) * 4096
        })
        .sum::<u64>() as f64
        / cfg.agents.max(1) as f64;
    let min_slots = ring_slots.values().copied().min().unwrap_or(cfg.slots);
    let max_slots = ring_slots.values().copied().max().unwrap_or(cfg.slots);
    let records_received = s2.sum(RECORDS, &[]);
    let records_lost = s2.sum(RECORDS_LOST, &[]);
    Ok(SoftRunResult {
        agents: cfg.agents,
        form: cfg.frame.form(),
        frame_bytes: frame_len,
        steady_frame_bytes: cfg.frame.steady_len(),
        records_per_frame: cfg.frame.records(),
        dict_acknowledged,
        ring_bytes: u64::from(max_slots) * u64::from(slot_bytes),
        ring_slots: (min_slots, max_slots),
        credit_budget_frames: s1.sum(BUDGET, &[]),
        credit_writes_per_sec: rate(
            s1.sum(CREDIT_WRITES, &[]) - s0.sum(CREDIT_WRITES, &[]),
            window,
        ),
        credit_write_batches: s1.sum(CREDIT_WRITE_BATCHES, &[]) - s0.sum(CREDIT_WRITE_BATCHES, &[]),
        socket_drops,
        bursts: stats.bursts,
        connect_seconds,
        frames,
        samples,
        frames_offered: g1.iter().sum::<u64>() - g0.iter().sum::<u64>(),
        frames_lost: s1.sum(LOST, &[]) - s0.sum(LOST, &[]),
        frames_dropped: s1.sum(DROPPED, &[]) - s0.sum(DROPPED, &[]),
        frames_per_sec: rate(frames, window),
        samples_per_sec: rate(samples, window),
        frames_per_core_sec: rate(frames, cpu.cpu_seconds),
        samples_per_core_sec: rate(samples, cpu.cpu_seconds),
        collector_cpu: cpu,
        rss_baseline_bytes: baseline.rss_bytes,
        rss_loaded_bytes: c1.rss_bytes,
        memory_per_agent_bytes: memory_per_agent,
        ring_touched_per_agent_bytes: ring_touched,
        overhead_per_agent_bytes: memory_per_agent - ring_touched,
        fairness: spread(&per_agent),
        accounting: Accounting {
            sent: sent_total,
            received: received_total,
            lost: lost_total,
            dropped: dropped_total,
            dropped_after_tracking,
            transport_dropped: by_reason(&s2, TRANSPORT_DROPPED),
            unaccounted,
            drained,
            records_sent,
            records_received,
            records_lost,
            records_unaccounted: records_sent as f64 - records_received - records_lost + 0.0,
        },
        generator_cpu: gen0.zip(gen1).map(|(a, b)| delta(&a, &b)),
        generator_post_calls: stats.post_calls,
        generator_idle_rounds: stats.idle_rounds,
        control_errors,
    })
}
