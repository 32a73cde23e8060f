//! Idle cost: CPU of the real `uctel-collector` and `uctel-agent` with nothing to do,
//! measured side by side with a real Prometheus node_exporter (idle, never scraped) in the
//! same window, so that the figures can be read against the daemon operators compare us
//! with (DESIGN.md §2: idle means asleep).
//!
//! Two phases of `duration` each, every process of a phase measured over the same window:
//!
//! 1. **disconnected**: a collector with no agent; an agent whose collector is down (its
//!    control address has no listener: it retries with backoff); node_exporter.
//! 2. **connected**: the same collector with one agent connected that sends only its host
//!    and self metrics every 10 s (the example configuration's intervals: one collection
//!    per interval is the only work); node_exporter.
//!
//! CPU is `utime + stime` of each process (`/proc/<pid>/stat`, 10 ms ticks: 0.017 % of a
//! core over 60 s), reported as a share of one core and by thread.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cpu::{delta, sample_process, CpuDelta, ProcessSample};
use crate::daemon::{
    free_tcp_port, io, CollectorProcess, CollectorSettings, DaemonError, Proc, TOKEN,
};

/// The node_exporter binaries looked for on `PATH` (Debian's package name first).
pub const NODE_EXPORTER_NAMES: [&str; 2] = ["prometheus-node-exporter", "node_exporter"];

/// Settings.
#[derive(Clone, Debug)]
pub struct IdleConfig {
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// node_exporter; `None` = looked up on `PATH` ([`NODE_EXPORTER_NAMES`]), skipped when
    /// not found.
    pub node_exporter_bin: Option<PathBuf>,
    /// Scratch directory.
    pub workdir: PathBuf,
    /// Unmeasured time after the processes of a phase started (and the agent connected).
    pub warmup: Duration,
    /// The window of each phase.
    pub duration: Duration,
}

/// One process over one window.
#[derive(Clone, Debug, Serialize)]
pub struct IdleProcess {
    /// `disconnected` or `connected`.
    pub phase: String,
    /// What ran, in words.
    pub what: String,
    /// Share of one core over the window, percent.
    pub cpu_percent: f64,
    /// CPU by thread.
    pub cpu: CpuDelta,
}

/// What the idle run measured.
#[derive(Clone, Debug, Serialize)]
pub struct IdleResult {
    /// The window of each phase, seconds.
    pub seconds: f64,
    /// Every process of both phases.
    pub processes: Vec<IdleProcess>,
    /// The node_exporter binary used, or why there was none.
    pub node_exporter: String,
    /// `/proc/loadavg` at the start of each phase (other work on the machine).
    pub loadavg: Vec<String>,
}

impl IdleResult {
    /// The process of `phase` whose description starts with `what`.
    pub fn find(&self, phase: &str, what: &str) -> Option<&IdleProcess> {
        self.processes
            .iter()
            .find(|p| p.phase == phase && p.what.starts_with(what))
    }
}

/// Why the idle run failed.
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    /// A daemon could not be run or read.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The agent did not connect.
    #[error("the agent did not connect to the collector within {0:?}; see {1}")]
    NotConnected(Duration, String),
}

/// `name` on `PATH`, if there.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn agent_yaml(control: &str, state: &Path) -> String {
    format!(
        "agent_id: idle-agent\n\
         collector:\n  control: {control}\n\
         transport:\n  kind: soft\n  soft:\n    mtu_bytes: 4096\n\
         auth:\n  token: {TOKEN}\n\
         sources:\n  host_metrics:\n    interval_seconds: 10\n  self_metrics:\n    interval_seconds: 10\n  state_directory: {}\n",
        state.display()
    )
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Samples every `(what, pid)` at once, waits `duration`, samples again.
fn measure(
    phase: &str,
    procs: &[(String, i32)],
    duration: Duration,
) -> Result<Vec<IdleProcess>, DaemonError> {
    let before: Vec<ProcessSample> = procs
        .iter()
        .map(|(_, pid)| sample_process(*pid))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    std::thread::sleep(duration.saturating_sub(start.elapsed()));
    let after: Vec<ProcessSample> = procs
        .iter()
        .map(|(_, pid)| sample_process(*pid))
        .collect::<Result<_, _>>()?;
    Ok(procs
        .iter()
        .zip(before.iter().zip(&after))
        .map(|((what, _), (a, b))| {
            let cpu = delta(a, b);
            IdleProcess {
                phase: phase.to_owned(),
                what: what.clone(),
                cpu_percent: cpu.cores * 100.0,
                cpu,
            }
        })
        .collect())
}

/// Runs both phases.
///
/// # Errors
/// [`IdleError`] when a daemon cannot be run or the agent does not connect.
pub fn run(cfg: &IdleConfig) -> Result<IdleResult, IdleError> {
    for (what, bin, package) in [
        ("collector", &cfg.collector_bin, "uctel-collector"),
        ("agent", &cfg.agent_bin, "uctel-agent"),
    ] {
        if !bin.is_file() {
            return Err(DaemonError::MissingBinary {
                what,
                path: bin.clone(),
                package,
            }
            .into());
        }
    }
    fs::create_dir_all(&cfg.workdir).map_err(io("creating the idle directory"))?;
    let state = cfg.workdir.join("state");
    fs::create_dir_all(&state).map_err(io("creating the state directory"))?;
    let node_bin = cfg
        .node_exporter_bin
        .clone()
        .or_else(|| NODE_EXPORTER_NAMES.iter().find_map(|n| on_path(n)));
    let mut result = IdleResult {
        seconds: cfg.duration.as_secs_f64(),
        processes: Vec::new(),
        node_exporter: node_bin.as_ref().map_or_else(
            || {
                format!(
                    "not found ({} on PATH; Debian: apt-get install prometheus-node-exporter)",
                    NODE_EXPORTER_NAMES.join(" or ")
                )
            },
            |p| p.display().to_string(),
        ),
        loadavg: Vec::new(),
    };
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
    let mut node = match &node_bin {
        Some(bin) => {
            let listen = format!("--web.listen-address=127.0.0.1:{}", free_tcp_port()?);
            Some(Proc::start(
                bin,
                &[&listen],
                cfg.workdir.join("node_exporter.out"),
            )?)
        }
        None => None,
    };

    // Phase 1: nobody connected; the agent's collector is down.
    let dead = format!("127.0.0.1:{}", free_tcp_port()?);
    let yaml = cfg.workdir.join("agent-disconnected.yaml");
    fs::write(&yaml, agent_yaml(&dead, &state)).map_err(io("writing the agent config"))?;
    let yaml_arg = yaml.display().to_string();
    let mut agent = Proc::start(
        &cfg.agent_bin,
        &["--config", &yaml_arg, "--log-level", "error"],
        cfg.workdir.join("agent-disconnected.out"),
    )?;
    std::thread::sleep(cfg.warmup);
    agent.check_alive("agent")?;
    if let Some(n) = node.as_mut() {
        n.check_alive("node_exporter")?;
    }
    let mut procs = vec![
        ("collector, no agent connected".to_owned(), collector.pid()),
        (
            "agent, its collector down (retrying with backoff)".to_owned(),
            agent.pid(),
        ),
    ];
    if let Some(n) = &node {
        procs.push(("node_exporter, idle (not scraped)".to_owned(), n.pid()));
    }
    result.loadavg.push(loadavg());
    result
        .processes
        .extend(measure("disconnected", &procs, cfg.duration)?);
    drop(agent);

    // Phase 2: the agent connected, host and self metrics every 10 s.
    let yaml = cfg.workdir.join("agent-connected.yaml");
    let control = collector.control.to_string();
    fs::write(&yaml, agent_yaml(&control, &state)).map_err(io("writing the agent config"))?;
    let yaml_arg = yaml.display().to_string();
    let agent_out = cfg.workdir.join("agent-connected.out");
    let mut agent = Proc::start(
        &cfg.agent_bin,
        &["--config", &yaml_arg, "--log-level", "error"],
        agent_out.clone(),
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = collector.scrape()?;
        if s.sum(
            "uctel_collector_frames_received_total",
            &[("agent", "idle-agent")],
        ) > 0.0
        {
            break;
        }
        agent.check_alive("agent")?;
        if Instant::now() >= deadline {
            return Err(IdleError::NotConnected(
                Duration::from_secs(20),
                agent_out.display().to_string(),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(cfg.warmup);
    let mut procs = vec![
        (
            "collector, one idle agent connected".to_owned(),
            collector.pid(),
        ),
        (
            "agent, connected, host and self metrics every 10 s".to_owned(),
            agent.pid(),
        ),
    ];
    if let Some(n) = &node {
        procs.push(("node_exporter, idle (not scraped)".to_owned(), n.pid()));
    }
    result.loadavg.push(loadavg());
    result
        .processes
        .extend(measure("connected", &procs, cfg.duration)?);
    agent.check_alive("agent")?;
    drop(agent);
    drop(node);
    collector.stop();
    Ok(result)
}
