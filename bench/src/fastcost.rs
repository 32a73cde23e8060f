//! Fast counters cost: the real `uctel-agent` sampling `counters` real sysfs counters (the
//! statistics files of `lo`) every `interval` with its `fast_counters` source, shipping to
//! a real `uctel-collector` on the soft transport, against the same agent with the source
//! off (host and self metrics off in both, so the difference is the source), one after the
//! other in one run.
//!
//! * **CPU**: `utime + stime` of the agent process over the window (`/proc/<pid>/stat`),
//!   as a share of one core, per thread too (the sampling thread is `fast-counters`).
//! * **Lateness** (sample time − scheduled time): quantiles of the agent's own
//!   `uctel_agent_fast_sample_lateness_seconds` histogram over the window, interpolated
//!   within buckets as PromQL's `histogram_quantile` does; bucket bounds 10 µs … 50 ms.
//! * **Accounting**: samples taken in the window against the samples the collector received
//!   and counted lost on the `fast_counters` stream in the same window.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{
    free_tcp_port, io, scrape, CollectorProcess, CollectorSettings, DaemonError, Proc, TOKEN,
};
use crate::promtext::Scrape;

/// The agent id of the measured agent.
const AGENT_ID: &str = "fastcost-agent";
/// The statistics files of `lo` sampled (any Linux host has them).
const LO_STATS: [&str; 10] = [
    "rx_bytes",
    "rx_packets",
    "tx_bytes",
    "tx_packets",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "rx_errors",
    "tx_errors",
    "collisions",
];
/// Lateness quantiles reported.
pub const QUANTILES: [f64; 3] = [0.5, 0.99, 0.999];
/// Name of the lateness histogram.
const LATENESS: &str = "uctel_agent_fast_sample_lateness_seconds";

/// Settings of the fast-counters cost run.
#[derive(Debug, Clone)]
pub struct FastCostConfig {
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// Configurations and daemon output.
    pub workdir: PathBuf,
    /// Counters sampled (1 to 10).
    pub counters: usize,
    /// Sampling interval.
    pub interval: Duration,
    /// Time before each window.
    pub warmup: Duration,
    /// Each window.
    pub duration: Duration,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FastCostResult {
    /// Counters sampled.
    pub counters: usize,
    /// Sampling interval, ms.
    pub interval_ms: f64,
    /// Agent CPU with the source.
    pub with_source: CpuDelta,
    /// Agent CPU without it (same config otherwise).
    pub without_source: CpuDelta,
    /// Samples taken in the window.
    pub samples_taken: u64,
    /// Samples the collector received in the window.
    pub samples_received: u64,
    /// Samples the collector counted lost in the window.
    pub samples_lost: u64,
    /// Sampling instants skipped in the window.
    pub missed_rounds: u64,
    /// `(quantile, lateness µs)`.
    pub lateness_us: Vec<(f64, f64)>,
}

impl FastCostResult {
    /// Agent CPU with the source, percent of one core.
    pub fn cpu_percent(&self) -> f64 {
        self.with_source.cores * 100.0
    }

    /// The lateness at quantile `q` (one of [`QUANTILES`]), µs.
    pub fn lateness(&self, q: f64) -> f64 {
        self.lateness_us
            .iter()
            .find(|(x, _)| (*x - q).abs() < 1e-9)
            .map_or(f64::NAN, |(_, v)| *v)
    }
}

/// Why the run failed.
#[derive(Debug, thiserror::Error)]
pub enum FastCostError {
    /// A daemon could not be run or read.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// procfs.
    #[error(transparent)]
    Cpu(#[from] crate::cpu::SampleError),
    /// The samples did not arrive.
    #[error("no fast_counters samples reached the collector within {0:?} (agent output: {1})")]
    NoSamples(Duration, String),
}

fn agent_yaml(cfg: &FastCostConfig, control: &str, metrics: u16, source: bool) -> String {
    let mut y = format!(
        "agent_id: {AGENT_ID}\n\
         collector:\n  control: {control}\n\
         listen:\n  metrics: 127.0.0.1:{metrics}\n\
         transport:\n  kind: soft\n  soft:\n    mtu_bytes: 4096\n\
         auth:\n  token: {TOKEN}\n\
         sources:\n  host_metrics:\n    enabled: false\n  self_metrics:\n    enabled: false\n  state_directory: {}\n",
        cfg.workdir.join("state").display()
    );
    if source {
        y.push_str(&format!(
            "  fast_counters:\n    interval_milliseconds: {}\n    counters:\n",
            cfg.interval.as_millis().max(1)
        ));
        for s in LO_STATS.iter().take(cfg.counters.clamp(1, LO_STATS.len())) {
            y.push_str(&format!("      - path: /sys/class/net/lo/statistics/{s}\n"));
        }
    }
    y
}

/// `histogram_quantile(q, …)` over the bucket deltas `(le, cumulative count)`, in the
/// bucket's unit; NaN without observations.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return lower.0;
            }
            let within = (count - lower.1).max(f64::MIN_POSITIVE);
            return lower.0 + (le - lower.0) * ((rank - lower.1) / within);
        }
        lower = (le, count);
    }
    lower.0
}

/// The lateness histogram's cumulative buckets `(le, count)` in a scrape, sorted by `le`.
fn buckets(s: &Scrape) -> Vec<(f64, f64)> {
    let mut b: Vec<(f64, f64)> = s
        .samples
        .iter()
        .filter(|x| x.name == format!("{LATENESS}_bucket"))
        .filter_map(|x| Some((x.label("le")?.parse::<f64>().ok()?, x.value)))
        .collect();
    b.sort_by(|a, b| a.0.total_cmp(&b.0));
    b
}

fn count(s: &Scrape, name: &str, m: &[(&str, &str)]) -> u64 {
    let v = s.sum(name, m);
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

/// One agent run: start, wait for frames, warm up, measure a window.
struct Window {
    cpu: CpuDelta,
    agent: (Scrape, Scrape),
    collector: (Scrape, Scrape),
}

fn window(
    cfg: &FastCostConfig,
    collector: &CollectorProcess,
    source: bool,
) -> Result<Window, FastCostError> {
    let port = free_tcp_port()?;
    let tag = if source { "with" } else { "without" };
    let yaml = cfg.workdir.join(format!("agent-{tag}.yaml"));
    fs::write(
        &yaml,
        agent_yaml(cfg, &collector.control.to_string(), port, source),
    )
    .map_err(io("writing the agent config"))?;
    let out = cfg.workdir.join(format!("agent-{tag}.out"));
    let yaml_arg = yaml.display().to_string();
    let mut agent = Proc::start(
        &cfg.agent_bin,
        &["--config", &yaml_arg, "--log-level", "error"],
        out.clone(),
    )?;
    let http: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    let m = [("agent", AGENT_ID)];
    loop {
        agent.check_alive("agent")?;
        let s = collector.scrape()?;
        if count(&s, "uctel_collector_frames_received_total", &m) > 0 && scrape(&http, addr).is_ok()
        {
            break;
        }
        if Instant::now() >= deadline {
            return Err(FastCostError::NoSamples(
                Duration::from_secs(20),
                out.display().to_string(),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(cfg.warmup);
    let (a0, c0, p0) = (
        scrape(&http, addr)?,
        collector.scrape()?,
        sample_process(agent.pid())?,
    );
    std::thread::sleep(cfg.duration);
    let p1 = sample_process(agent.pid())?;
    let (a1, c1) = (scrape(&http, addr)?, collector.scrape()?);
    agent.check_alive("agent")?;
    drop(agent);
    Ok(Window {
        cpu: delta(&p0, &p1),
        agent: (a0, a1),
        collector: (c0, c1),
    })
}

/// Runs the measurement.
///
/// # Errors
/// [`FastCostError`] when a daemon cannot be run or read, or no samples arrive.
pub fn run(cfg: &FastCostConfig) -> Result<FastCostResult, FastCostError> {
    if !cfg.agent_bin.is_file() {
        return Err(DaemonError::MissingBinary {
            what: "agent",
            path: cfg.agent_bin.clone(),
            package: "uctel-agent",
        }
        .into());
    }
    fs::create_dir_all(cfg.workdir.join("state")).map_err(io("creating the work directory"))?;
    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &cfg.workdir,
        &CollectorSettings {
            slots: 1024,
            slot_bytes: 4096,
            credit_margin_slots: 64,
            descriptor_queue: 8192,
            // The collector's default: one credit report per second.
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
    let without = window(cfg, &collector, false)?;
    let with = window(cfg, &collector, true)?;
    let (a0, a1) = &with.agent;
    let (c0, c1) = &with.collector;
    let diff = |name: &str, s0: &Scrape, s1: &Scrape, m: &[(&str, &str)]| {
        count(s1, name, m).saturating_sub(count(s0, name, m))
    };
    let stream = [("agent", AGENT_ID), ("stream", "fast_counters")];
    let (b0, b1) = (buckets(a0), buckets(a1));
    let deltas: Vec<(f64, f64)> = b1
        .iter()
        .map(|&(le, n)| {
            let before = b0.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
            (le, n - before)
        })
        .collect();
    collector.stop();
    Ok(FastCostResult {
        counters: cfg.counters.clamp(1, LO_STATS.len()),
        interval_ms: cfg.interval.as_secs_f64() * 1e3,
        with_source: with.cpu,
        without_source: without.cpu,
        samples_taken: diff("uctel_agent_fast_samples_total", a0, a1, &[]),
        samples_received: diff("uctel_collector_records_received_total", c0, c1, &stream),
        samples_lost: diff("uctel_collector_records_lost_total", c0, c1, &stream),
        missed_rounds: diff("uctel_agent_fast_missed_rounds_total", a0, a1, &[]),
        lateness_us: QUANTILES
            .iter()
            .map(|&q| (q, histogram_quantile(q, &deltas) * 1e6))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets_as_promql_does() {
        // 100 observations: 50 ≤ 10 µs, 40 in (10, 100] µs, 10 in (100 µs, 1 ms].
        let b = [
            (0.000_01, 50.0),
            (0.000_1, 90.0),
            (0.001, 100.0),
            (f64::INFINITY, 100.0),
        ];
        assert!((histogram_quantile(0.5, &b) - 0.000_01).abs() < 1e-12);
        // Rank 70: 20 of the 40 in (10, 100] µs → 55 µs.
        assert!((histogram_quantile(0.7, &b) - 0.000_055).abs() < 1e-12);
        assert!((histogram_quantile(0.99, &b) - 0.000_91).abs() < 1e-9);
        assert!(histogram_quantile(0.5, &[]).is_nan());
        assert!(histogram_quantile(0.5, &[(1.0, 0.0)]).is_nan());
        // Beyond the last finite bound: that bound.
        assert_eq!(
            histogram_quantile(0.99, &[(0.001, 1.0), (f64::INFINITY, 10.0)]),
            0.001
        );
    }

    #[test]
    fn the_config_lists_the_counters() {
        let cfg = FastCostConfig {
            agent_bin: PathBuf::new(),
            collector_bin: PathBuf::new(),
            workdir: PathBuf::from("/w"),
            counters: 10,
            interval: Duration::from_millis(10),
            warmup: Duration::ZERO,
            duration: Duration::ZERO,
        };
        let y = agent_yaml(&cfg, "127.0.0.1:1", 2, true);
        assert_eq!(
            y.matches("- path: /sys/class/net/lo/statistics/").count(),
            10
        );
        assert!(y.contains("interval_milliseconds: 10"));
        assert!(!agent_yaml(&cfg, "127.0.0.1:1", 2, false).contains("fast_counters"));
    }
}
