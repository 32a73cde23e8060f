//! Agent cost: CPU and memory of the real `uctel-agent` binary shipping a given sample rate
//! and log-line rate to a real `uctel-collector`.
//!
//! * **Samples**: the agent's own host-metrics source, pointed (`sources.host_metrics.
//!   procfs_path`) at a synthetic procfs tree of a large host — `cpus` CPUs in `stat`, `disks`
//!   NVMe disks in `diskstats`, `netdevs` interfaces in `net/dev`, the real `meminfo` and
//!   `loadavg`, one root mount — sized so that one collection yields `samples_per_sec ×
//!   interval` samples. The count is calibrated with the agent library's own collector
//!   ([`HostMetrics::collect`]) before the run, and the rate that reached the collector is
//!   measured (`records_received_total{stream="metrics"}`). The agent has no synthetic source, and
//!   its shortest host interval is 0.1 s, so a big host scraped every second is how 10 k
//!   samples/s is produced; the agent still reads and parses every file each interval.
//! * **Logs**: a writer thread appends `log_lines_per_sec` lines (about 120 bytes, the shape
//!   of an access log) to a file the agent tails, in 100 small writes per second.
//!
//! The agent's CPU is `utime + stime` of its process over the window; memory is `VmRSS` at
//! the end of the window and `VmHWM`.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_agent::sources::host::{HostMetrics, HostMetricsConfig, HostPaths};

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{io, stop_child, CollectorProcess, CollectorSettings, DaemonError, TOKEN};
use crate::stats::rate;

/// `collector.expected_frames_per_second` of the measured agent: a collection of 10 k
/// samples is about 250 frames at 4 KiB, sent at once, and credits come back every 0.1 s (the
/// collector's report interval here); announcing this rate gets the largest ring (1,024
/// slots), whose window holds a whole collection, so each collection arrives as one burst
/// (the window below is cut between bursts) and nothing waits for credit. With the default
/// announcement (32) the collection's tail waits for the next grants, nothing is dropped,
/// but the collection trickles in over the whole interval.
const EXPECTED_FRAMES_PER_SECOND: u32 = 4096;

/// Settings.
#[derive(Clone, Debug)]
pub struct AgentCostConfig {
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// Scratch directory.
    pub workdir: PathBuf,
    /// Target metric samples per second.
    pub samples_per_sec: f64,
    /// Target log lines per second.
    pub log_lines_per_sec: f64,
    /// Host-metrics interval, seconds.
    pub interval_seconds: f64,
    /// Unmeasured time after the agent connected.
    pub warmup: Duration,
    /// The window.
    pub duration: Duration,
}

/// Size of the synthetic host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FakeHost {
    /// CPUs in `stat`.
    pub cpus: usize,
    /// Interfaces in `net/dev`.
    pub netdevs: usize,
    /// Disks in `diskstats`.
    pub disks: usize,
}

/// What the agent-cost run measured.
#[derive(Clone, Debug, Serialize)]
pub struct AgentCostResult {
    /// The synthetic host.
    pub host: FakeHost,
    /// Samples one host collection yields (calibrated with the agent library).
    pub samples_per_collection: usize,
    /// Host-metrics interval, seconds.
    pub interval_seconds: f64,
    /// Target samples/s.
    pub target_samples_per_sec: f64,
    /// Samples/s that reached the collector (metrics stream).
    pub samples_per_sec: f64,
    /// Target log lines/s.
    pub target_log_lines_per_sec: f64,
    /// Lines/s the writer wrote.
    pub log_lines_written_per_sec: f64,
    /// Log records/s that reached the collector (logs stream).
    pub log_lines_per_sec: f64,
    /// Agent CPU over the window.
    pub cpu: CpuDelta,
    /// Agent CPU as percent of one core.
    pub cpu_percent: f64,
    /// `VmRSS` at the end of the window, bytes.
    pub rss_bytes: u64,
    /// `VmHWM`, bytes.
    pub hwm_bytes: u64,
    /// Frames the collector counted lost or dropped for the agent in the window.
    pub frames_lost_or_dropped: f64,
}

/// Why the run failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentCostError {
    /// Daemon handling.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The agent did not deliver.
    #[error("the agent delivered nothing within {0:?} (its output: {1})")]
    NoData(Duration, String),
}

/// Writes a procfs tree for `host` under `dir`.
///
/// # Errors
/// Filesystem errors.
pub fn write_fake_proc(dir: &Path, host: FakeHost) -> std::io::Result<()> {
    fs::create_dir_all(dir.join("net"))?;
    fs::create_dir_all(dir.join("1"))?;
    let mut stat = String::new();
    let line = |s: &mut String, name: &str, k: u64| {
        let _ = writeln!(
            s,
            "{name} {} {} {} {} {} {} {} {} 0 0",
            1000 * k + 11,
            k + 2,
            300 * k + 3,
            9000 * k + 4,
            k + 5,
            k + 6,
            k + 7,
            k + 8
        );
    };
    line(&mut stat, "cpu ", host.cpus as u64);
    for c in 0..host.cpus {
        line(&mut stat, &format!("cpu{c}"), c as u64 + 1);
    }
    stat.push_str(
        "intr 123456 0 0 0\nctxt 987654321\nbtime 1700000000\nprocesses 424242\nprocs_running 3\nprocs_blocked 0\nsoftirq 1 2 3 4 5 6 7 8 9 10 11\n",
    );
    fs::write(dir.join("stat"), stat)?;
    let mut dev = String::from(
        "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n",
    );
    for d in 0..host.netdevs {
        let k = d as u64 + 1;
        let _ = writeln!(
            dev,
            "  eth{d}: {} {} 0 0 0 0 0 {} {} {} 0 0 0 0 0 0",
            k * 123_456_789,
            k * 98_765,
            k,
            k * 23_456_789,
            k * 45_678
        );
    }
    fs::write(dir.join("net").join("dev"), dev)?;
    let mut disks = String::new();
    for d in 0..host.disks {
        let k = d as u64 + 1;
        let _ = writeln!(
            disks,
            " 259 {d} nvme{d}n1 {} 10 {} 300 {} 20 {} 400 0 500 700 0 0 0 0 0 0",
            k * 1000,
            k * 8000,
            k * 2000,
            k * 16000
        );
    }
    fs::write(dir.join("diskstats"), disks)?;
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_else(|_| {
        "MemTotal:       16384000 kB\nMemFree:         8192000 kB\nMemAvailable:   12288000 kB\n"
            .into()
    });
    fs::write(dir.join("meminfo"), meminfo)?;
    let loadavg = fs::read_to_string("/proc/loadavg")
        .unwrap_or_else(|_| "0.50 0.40 0.30 2/300 4242\n".into());
    fs::write(dir.join("loadavg"), loadavg)?;
    fs::write(
        dir.join("1").join("mountinfo"),
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n",
    )?;
    Ok(())
}

/// Samples one collection of the agent's host source yields on `proc`.
pub fn samples_per_collection(proc: &Path) -> usize {
    let mut h = HostMetrics::new(HostMetricsConfig {
        paths: HostPaths {
            proc: proc.to_path_buf(),
            ..HostPaths::default()
        },
        ticks_per_second: Some(100),
        disabled: Vec::new(),
        ethtool: None,
    });
    h.collect().metrics.len()
}

/// Builds a synthetic host under `dir` whose collection yields about `target` samples: 64
/// CPUs and 16 disks (1 CPU and no disk when that is already more than `target`), then as
/// many interfaces as it takes (16 samples each). Returns the host and its exact count.
///
/// # Errors
/// Filesystem errors.
pub fn calibrate(dir: &Path, target: usize) -> std::io::Result<(FakeHost, usize)> {
    let mut host = FakeHost {
        cpus: 64,
        netdevs: 0,
        disks: 16,
    };
    write_fake_proc(dir, host)?;
    let mut base = samples_per_collection(dir);
    if base > target {
        host = FakeHost {
            cpus: 1,
            netdevs: 0,
            disks: 0,
        };
        write_fake_proc(dir, host)?;
        base = samples_per_collection(dir);
    }
    host.netdevs = target.saturating_sub(base).div_ceil(16);
    write_fake_proc(dir, host)?;
    Ok((host, samples_per_collection(dir)))
}

/// Appends `rate` lines per second to `path` until `stop`; counts lines in `written`.
fn log_writer(path: PathBuf, rate: f64, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) {
    let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(&path) else {
        return;
    };
    let start = Instant::now();
    let mut n = 0u64;
    let mut buf = String::new();
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        buf.clear();
        while n < due {
            let _ = writeln!(
                buf,
                "2026-11-29T12:00:00.{:06}Z INFO http request id={n} method=GET path=/api/v1/items/{} status=200 duration_ms=12.{} bytes={}",
                n % 1_000_000,
                n % 977,
                n % 10,
                4096 + n % 1024
            );
            n += 1;
        }
        if !buf.is_empty() && f.write_all(buf.as_bytes()).is_ok() {
            written.store(n, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct AgentChild(Child);

impl Drop for AgentChild {
    fn drop(&mut self) {
        stop_child(&mut self.0);
    }
}

/// Runs the agent-cost measurement.
///
/// # Errors
/// [`AgentCostError`] when a daemon cannot be run or no data arrives.
pub fn run(cfg: &AgentCostConfig) -> Result<AgentCostResult, AgentCostError> {
    if !cfg.agent_bin.is_file() {
        return Err(DaemonError::MissingBinary {
            what: "agent",
            path: cfg.agent_bin.clone(),
            package: "uctel-agent",
        }
        .into());
    }
    fs::create_dir_all(&cfg.workdir).map_err(io("creating the agent-cost directory"))?;
    let proc = cfg.workdir.join("proc");
    let per_collection = (cfg.samples_per_sec * cfg.interval_seconds).round() as usize;
    let (host, samples) =
        calibrate(&proc, per_collection).map_err(io("writing the fake procfs"))?;
    let state = cfg.workdir.join("state");
    fs::create_dir_all(&state).map_err(io("creating the state directory"))?;
    let log_path = cfg.workdir.join("app.log");
    fs::write(&log_path, b"").map_err(io("creating app.log"))?;

    let collector = CollectorProcess::start(
        &cfg.collector_bin,
        &cfg.workdir,
        &CollectorSettings {
            slots: 1024,
            slot_bytes: 4096,
            credit_margin_slots: 64,
            descriptor_queue: 8192,
            report_interval_seconds: 0.1,
            data_path: "auto",
            log_file: cfg.workdir.join("received-logs.jsonl"),
            credit_write_batching: None,
            extra_yaml: String::new(),
            recv_buffer_bytes: None,
            progress: None,
            min_slots: None,
        },
    )?;
    let yaml = format!(
        "agent_id: bench-agent\n\
         collector:\n  control: {control}\n  expected_frames_per_second: {announce}\n\
         transport:\n  kind: soft\n  soft:\n    mtu_bytes: 4096\n\
         auth:\n  token: {TOKEN}\n\
         sources:\n  host_metrics:\n    interval_seconds: {interval}\n    procfs_path: {proc}\n  self_metrics:\n    interval_seconds: 10\n  logs:\n    - path: {log}\n      start_at: beginning\n  state_directory: {state}\n\
         max_frame_bytes: 4096\n",
        control = collector.control,
        announce = EXPECTED_FRAMES_PER_SECOND,
        interval = cfg.interval_seconds,
        proc = proc.display(),
        log = log_path.display(),
        state = state.display(),
    );
    let agent_yaml = cfg.workdir.join("agent.yaml");
    fs::write(&agent_yaml, yaml).map_err(io("writing agent.yaml"))?;
    let out_path = cfg.workdir.join("agent.out");
    let out = fs::File::create(&out_path).map_err(io("creating agent.out"))?;
    let err = out.try_clone().map_err(io("agent.out"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written, path, rate) = (
            stop.clone(),
            written.clone(),
            log_path.clone(),
            cfg.log_lines_per_sec,
        );
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || log_writer(path, rate, stop, written))
            .map_err(io("spawning the log writer"))?
    };
    let result = (|| {
        let child = Command::new(&cfg.agent_bin)
            .arg("--config")
            .arg(&agent_yaml)
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {}", cfg.agent_bin.display())))?;
        let child = AgentChild(child);
        let pid = i32::try_from(child.0.id()).unwrap_or(i32::MAX);
        let samples_of = |s: &crate::promtext::Scrape, stream: &str| {
            s.sum(
                "uctel_collector_records_received_total",
                &[("agent", "bench-agent"), ("stream", stream)],
            )
        };
        // Wait for data.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if samples_of(&collector.scrape()?, "metrics") > 0.0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(AgentCostError::NoData(
                    Duration::from_secs(20),
                    out_path.display().to_string(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(cfg.warmup);
        let lost = |s: &crate::promtext::Scrape| {
            s.sum(
                "uctel_collector_frames_lost_total",
                &[("agent", "bench-agent")],
            ) + s.sum(
                "uctel_collector_frames_dropped_total",
                &[("agent", "bench-agent")],
            )
        };
        // The window starts and ends when a host collection starts arriving at the collector
        // (the metrics counter moves after a quiet spell of at least half an interval), so it
        // holds a whole number of collections; a window cut at arbitrary instants is off by up
        // to one collection (±10 % over 10 s at a 1 s interval).
        let intervals = (cfg.duration.as_secs_f64() / cfg.interval_seconds)
            .round()
            .max(1.0) as u32;
        let quiet = Duration::from_secs_f64(cfg.interval_seconds * 0.5);
        let give_up = Duration::from_secs_f64(cfg.interval_seconds * 3.0 + 5.0);
        let mut last_value = samples_of(&collector.scrape()?, "metrics");
        let mut last_change = Instant::now();
        let mut next_collection = || -> Result<crate::promtext::Scrape, AgentCostError> {
            let deadline = Instant::now() + give_up;
            loop {
                let s = collector.scrape()?;
                let v = samples_of(&s, "metrics");
                if v > last_value {
                    let gap = last_change.elapsed();
                    last_value = v;
                    last_change = Instant::now();
                    if gap >= quiet {
                        return Ok(s);
                    }
                }
                if Instant::now() >= deadline {
                    return Err(AgentCostError::NoData(
                        give_up,
                        out_path.display().to_string(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let s0 = next_collection()?;
        let a0 = sample_process(pid).map_err(DaemonError::from)?;
        let w0 = written.load(Ordering::Relaxed);
        let mut s1 = s0.clone();
        for _ in 0..intervals {
            s1 = next_collection()?;
        }
        let a1 = sample_process(pid).map_err(DaemonError::from)?;
        let w1 = written.load(Ordering::Relaxed);
        let cpu = delta(&a0, &a1);
        let window = cpu.wall_seconds;
        Ok(AgentCostResult {
            host,
            samples_per_collection: samples,
            interval_seconds: cfg.interval_seconds,
            target_samples_per_sec: cfg.samples_per_sec,
            samples_per_sec: rate(
                samples_of(&s1, "metrics") - samples_of(&s0, "metrics"),
                window,
            ),
            target_log_lines_per_sec: cfg.log_lines_per_sec,
            log_lines_written_per_sec: rate((w1 - w0) as f64, window),
            log_lines_per_sec: rate(samples_of(&s1, "logs") - samples_of(&s0, "logs"), window),
            cpu_percent: cpu.cores * 100.0,
            cpu,
            rss_bytes: a1.rss_bytes,
            hwm_bytes: a1.hwm_bytes,
            frames_lost_or_dropped: lost(&s1) - lost(&s0),
        })
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    collector.stop();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_host_scales_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        let big = dir.path().join("big");
        write_fake_proc(
            &small,
            FakeHost {
                cpus: 2,
                netdevs: 1,
                disks: 1,
            },
        )
        .unwrap();
        write_fake_proc(
            &big,
            FakeHost {
                cpus: 2,
                netdevs: 11,
                disks: 1,
            },
        )
        .unwrap();
        let (a, b) = (samples_per_collection(&small), samples_per_collection(&big));
        // 16 series per interface (8 receive + 8 transmit fields).
        assert_eq!(b - a, 10 * 16, "small {a}, big {b}");
    }

    #[test]
    fn calibration_lands_near_the_target() {
        for target in [3000, 400] {
            let dir = tempfile::tempdir().unwrap();
            let (_, n) = calibrate(dir.path(), target).unwrap();
            assert!((target..target + 16).contains(&n), "{target}: {n}");
        }
    }
}
