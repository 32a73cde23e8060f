//! Aligned sampling: `agents` real `uctel-agent`s on this machine, each with 10 ms fast
//! counters (two statistics files of `lo`) and 1 s host metrics at offset 0, started at
//! different phases, run for `duration`. Every sample's time is read from the agents'
//! `--dry-run` output, which frames each record exactly as it would go on the wire (fast
//! counter samples in µs, host collections in ms), and compared with the grid: whole
//! multiples of the interval since the Unix epoch.
//!
//! * **Error from the grid** (sample time − its instant): p50/p99/p99.9 and the share
//!   within 1 ms, fast counters in µs, host collections in ms (their stamp's unit).
//! * **Spread across agents**: for each fast instant sampled by every agent, the latest
//!   agent's sample time − the earliest's.
//! * **Drift**: per agent, the median error over the last tenth of the run − the median over
//!   the first tenth; the largest magnitude over the agents.
//! * **Missed instants**: fast instants an agent did not sample (gaps in its sequence).
//! * **Baseline**, measured in the same run: a bare thread of this process that sleeps to
//!   the same 10 ms grid with `std::thread::sleep` and reads the clock (what the machine's
//!   timers and scheduler allow without the agent); the agent's p99 is reported against it.
//!   A second bare thread does the same as a `SCHED_FIFO` priority 1 thread, as the agent's
//!   waking threads run by default (`sources.wake_scheduling`): what the machine's timers
//!   allow a real-time thread, the floor for the agent (absent where the policy is refused).

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::daemon::{DaemonError, Proc};

/// Quantiles reported.
pub const QUANTILES: [f64; 3] = [0.5, 0.99, 0.999];

/// Settings of the alignment run.
#[derive(Debug, Clone)]
pub struct AlignConfig {
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// Configurations and output.
    pub workdir: PathBuf,
    /// Agents (3 in the issue).
    pub agents: usize,
    /// Fast counters' interval (10 ms).
    pub fast_interval: Duration,
    /// Host metrics' interval (1 s).
    pub host_interval: Duration,
    /// How long the agents run.
    pub duration: Duration,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct AlignResult {
    /// Agents.
    pub agents: usize,
    /// Fast interval, ms.
    pub fast_interval_ms: f64,
    /// Host interval, s.
    pub host_interval_s: f64,
    /// Run length, s.
    pub duration_s: f64,
    /// Fast samples measured (first counter of every agent).
    pub fast_samples: usize,
    /// `(quantile, µs)` of fast sample time − instant.
    pub fast_error_us: Vec<(f64, f64)>,
    /// Share of fast samples within 1 ms of their instant.
    pub fast_within_1ms: f64,
    /// Host collections measured.
    pub host_samples: usize,
    /// `(quantile, ms)` of host collection stamp − instant.
    pub host_error_ms: Vec<(f64, f64)>,
    /// Share of host collections stamped within 1 ms of their instant.
    pub host_within_1ms: f64,
    /// `(quantile, µs)` of the spread across agents per fast instant.
    pub spread_us: Vec<(f64, f64)>,
    /// Largest |median error last tenth − first tenth| over agents, µs.
    pub drift_us: f64,
    /// Fast instants not sampled, all agents.
    pub missed_instants: u64,
    /// `(quantile, µs)` of the baseline thread's wake-up − instant.
    pub baseline_error_us: Vec<(f64, f64)>,
    /// `(quantile, µs)` of the real-time baseline thread's wake-up − instant; `None` where
    /// this process may not use `SCHED_FIFO`.
    pub realtime_baseline_error_us: Option<Vec<(f64, f64)>>,
}

impl AlignResult {
    /// The value at quantile `q` of `v`.
    pub fn q(v: &[(f64, f64)], q: f64) -> f64 {
        v.iter()
            .find(|(x, _)| (*x - q).abs() < 1e-9)
            .map_or(f64::NAN, |(_, y)| *y)
    }
}

/// Why the run failed.
#[derive(Debug, thiserror::Error)]
pub enum AlignError {
    /// An agent could not be run.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// Its output could not be read.
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    /// Too few samples to measure.
    #[error("agent {0} produced {1} fast samples and {2} host collections (output: {3})")]
    TooFew(usize, usize, usize, String),
}

fn agent_yaml(i: usize, cfg: &AlignConfig) -> String {
    format!(
        "agent_id: align-{i}\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: bench\n\
         sources:\n  host_metrics:\n    interval_seconds: {}\n  self_metrics:\n    enabled: false\n\
         \x20 fast_counters:\n    interval_milliseconds: {}\n    samples_per_record: 50\n\
         \x20   counters:\n      - path: /sys/class/net/lo/statistics/rx_packets\n\
         \x20     - path: /sys/class/net/lo/statistics/tx_packets\n",
        cfg.host_interval.as_secs_f64(),
        cfg.fast_interval.as_millis()
    )
}

/// Sample times of one agent's output: fast (µs, first counter) and host (ms).
fn parse(text: &str) -> (Vec<u64>, Vec<u64>) {
    let mut fast = Vec::new();
    let mut host = Vec::new();
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        let records = v["records"].as_array().cloned().unwrap_or_default();
        for r in records {
            if r["name"] == "node_network_receive_packets_total" {
                let start = r["start_us"].as_u64().unwrap_or(0);
                for o in r["offsets_us"].as_array().into_iter().flatten() {
                    fast.push(start + o.as_u64().unwrap_or(0));
                }
            } else if r["name"] == "node_load1" {
                if let Some(t) = r["timestamp_ms"].as_u64() {
                    host.push(t);
                }
            }
        }
    }
    fast.sort_unstable();
    fast.dedup();
    host.sort_unstable();
    host.dedup();
    (fast, host)
}

/// Quantiles of `v` (nearest rank), in the unit given by `scale`.
fn quantiles(v: &mut [u64], scale: f64) -> Vec<(f64, f64)> {
    v.sort_unstable();
    QUANTILES
        .iter()
        .map(|q| {
            let rank = ((*q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
            (*q, v.get(rank).map_or(f64::NAN, |x| *x as f64 * scale))
        })
        .collect()
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(f64::NAN, |x| *x as f64)
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The baseline: sleeps to each instant of the grid and records how late it woke, ns.
fn baseline(interval_ns: u64, stop: &AtomicBool) -> Vec<u64> {
    let mut late = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = unix_ns();
        let next = (now / interval_ns + 1) * interval_ns;
        std::thread::sleep(Duration::from_nanos(next - now));
        late.push(unix_ns().saturating_sub(next));
    }
    late
}

/// Runs the agents and measures.
///
/// # Errors
/// [`AlignError`].
pub fn run(cfg: &AlignConfig) -> Result<AlignResult, AlignError> {
    fs::create_dir_all(&cfg.workdir)
        .map_err(|e| AlignError::Read(cfg.workdir.display().to_string(), e))?;
    let fast_ns = u64::try_from(cfg.fast_interval.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    let host_ms = u64::try_from(cfg.host_interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let base = {
        let stop = stop.clone();
        std::thread::spawn(move || baseline(fast_ns, &stop))
    };
    let realtime_base = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            uctel_agent::sources::sys::sched::wake_in_real_time()
                .ok()
                .map(|()| baseline(fast_ns, &stop))
        })
    };
    let mut procs = Vec::new();
    let mut outs = Vec::new();
    for i in 0..cfg.agents {
        let yaml = cfg.workdir.join(format!("agent-{i}.yaml"));
        fs::write(&yaml, agent_yaml(i, cfg))
            .map_err(|e| AlignError::Read(yaml.display().to_string(), e))?;
        let out = cfg.workdir.join(format!("agent-{i}.out"));
        let args = [
            "--config".to_owned(),
            yaml.display().to_string(),
            "--dry-run".to_owned(),
            "--log-level".to_owned(),
            "warn".to_owned(),
        ];
        procs.push(Proc::start(&cfg.agent_bin, &args, out.clone())?);
        outs.push(out);
        // Different start phases: a start-relative ticker would sample at different instants.
        std::thread::sleep(Duration::from_millis(137));
    }
    std::thread::sleep(cfg.duration);
    for p in &mut procs {
        p.check_alive("uctel-agent")?;
    }
    drop(procs);
    stop.store(true, Ordering::Relaxed);
    let mut base_late = base.join().unwrap_or_default();
    let realtime_late = realtime_base.join().ok().flatten();

    let mut fast_err = Vec::new();
    let mut host_err = Vec::new();
    let mut per_instant: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    let mut drift_us: f64 = 0.0;
    let mut missed = 0;
    for (i, out) in outs.iter().enumerate() {
        let text =
            fs::read_to_string(out).map_err(|e| AlignError::Read(out.display().to_string(), e))?;
        let (fast, host) = parse(&text);
        if fast.len() < 20 || host.len() < 2 {
            return Err(AlignError::TooFew(
                i,
                fast.len(),
                host.len(),
                out.display().to_string(),
            ));
        }
        let errs: Vec<u64> = fast.iter().map(|t| (t * 1_000) % fast_ns).collect();
        let tenth = (errs.len() / 10).max(1);
        let first = median(errs[..tenth].to_vec());
        let last = median(errs[errs.len() - tenth..].to_vec());
        drift_us = drift_us.max((last - first).abs() / 1e3);
        let mut prev: Option<u64> = None;
        for t in &fast {
            let k = t * 1_000 / fast_ns;
            if let Some(p) = prev {
                missed += k.saturating_sub(p + 1);
            }
            prev = Some(k);
            per_instant.entry(k).or_default().push(*t);
        }
        fast_err.extend(errs);
        host_err.extend(host.iter().map(|t| t % host_ms));
    }
    let mut spread: Vec<u64> = per_instant
        .values()
        .filter(|v| v.len() == cfg.agents)
        .map(|v| v.iter().max().unwrap_or(&0) - v.iter().min().unwrap_or(&0))
        .collect();
    let within = |v: &[u64], bound: u64| {
        v.iter().filter(|e| **e < bound).count() as f64 / v.len().max(1) as f64
    };
    Ok(AlignResult {
        agents: cfg.agents,
        fast_interval_ms: cfg.fast_interval.as_secs_f64() * 1e3,
        host_interval_s: cfg.host_interval.as_secs_f64(),
        duration_s: cfg.duration.as_secs_f64(),
        fast_samples: fast_err.len(),
        fast_within_1ms: within(&fast_err, 1_000_000),
        host_samples: host_err.len(),
        host_within_1ms: within(&host_err, 1),
        fast_error_us: quantiles(&mut fast_err, 1e-3),
        host_error_ms: quantiles(&mut host_err, 1.0),
        spread_us: quantiles(&mut spread, 1.0),
        drift_us,
        missed_instants: missed,
        baseline_error_us: quantiles(&mut base_late, 1e-3),
        realtime_baseline_error_us: realtime_late.map(|mut v| quantiles(&mut v, 1e-3)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_run_lines_give_sample_times_and_quantiles_are_nearest_rank() {
        let text = concat!(
            "not json\n",
            r#"{"stream":"fast_counters","records":[{"name":"node_network_receive_packets_total","start_us":1000,"offsets_us":[0,10000],"values":[1,2]},{"name":"node_network_transmit_packets_total","start_us":5,"offsets_us":[0],"values":[1]}]}"#,
            "\n",
            r#"{"stream":"metrics","records":[{"name":"node_load1","value":0.1,"timestamp_ms":2000},{"name":"node_load5","timestamp_ms":7}]}"#,
            "\n"
        );
        assert_eq!(parse(text), (vec![1000, 11000], vec![2000]));
        let mut v: Vec<u64> = (1..=1000).collect();
        let q = quantiles(&mut v, 1.0);
        assert_eq!(q, vec![(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)]);
        assert!(agent_yaml(
            1,
            &AlignConfig {
                agent_bin: PathBuf::new(),
                workdir: PathBuf::new(),
                agents: 3,
                fast_interval: Duration::from_millis(10),
                host_interval: Duration::from_secs(1),
                duration: Duration::from_secs(1),
            }
        )
        .contains("interval_milliseconds: 10\n"));
    }
}
