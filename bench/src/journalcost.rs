//! journald source cost: the real `uctel-agent` reading `lines` journal entries written by
//! `systemd-journal-remote` (its `journald` source, `start_at: beginning`) against the same
//! agent reading the same messages as lines of a file (its file tailer), one after the
//! other in one run, each shipping to a real `uctel-collector` on the soft transport (host
//! and self metrics off, so the difference is the source).
//!
//! Each window runs from the agent's start until its own counter says every line was read
//! (`uctel_agent_log_records_read_total`, `uctel_agent_journal_entries_read_total`): CPU is
//! `utime + stime` of the agent process over that window; for journald, the `journalctl`
//! child's CPU is measured apart (`/proc/<pid>/stat` of the agent's child named
//! `journalctl`). The figure is lines per CPU-second, as a ratio of the file tailer's.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cpu::{delta, sample_process, CpuDelta};
use crate::daemon::{
    free_tcp_port, io, scrape, CollectorProcess, CollectorSettings, DaemonError, Proc, TOKEN,
};

const AGENT_ID: &str = "journalcost-agent";
const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// Settings of the journald cost run.
#[derive(Debug, Clone)]
pub struct JournalCostConfig {
    /// The agent binary.
    pub agent_bin: PathBuf,
    /// The collector binary.
    pub collector_bin: PathBuf,
    /// Journal, log file, configurations and daemon output.
    pub workdir: PathBuf,
    /// Lines (entries) read in each window.
    pub lines: u64,
    /// Longest wait for a window.
    pub timeout: Duration,
}

/// What the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct JournalCostResult {
    /// Lines read in each window.
    pub lines: u64,
    /// The agent reading them from a file.
    pub file: CpuDelta,
    /// The agent reading them from the journal.
    pub journald: CpuDelta,
    /// journalctl's CPU seconds in the journald window.
    pub journalctl_cpu_seconds: f64,
}

impl JournalCostResult {
    /// Lines per agent CPU-second reading the file.
    pub fn file_lines_per_cpu_s(&self) -> f64 {
        self.lines as f64 / self.file.cpu_seconds.max(1e-9)
    }
    /// Lines per agent CPU-second reading the journal (journalctl apart).
    pub fn journald_lines_per_cpu_s(&self) -> f64 {
        self.lines as f64 / self.journald.cpu_seconds.max(1e-9)
    }
    /// Lines per CPU-second of the agent and journalctl together.
    pub fn journald_with_journalctl_lines_per_cpu_s(&self) -> f64 {
        self.lines as f64 / (self.journald.cpu_seconds + self.journalctl_cpu_seconds).max(1e-9)
    }
}

/// Why the run failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalCostError {
    /// A daemon could not be run or read.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// procfs.
    #[error(transparent)]
    Cpu(#[from] crate::cpu::SampleError),
    /// systemd-journal-remote is missing or failed.
    #[error("systemd-journal-remote: {0}")]
    JournalRemote(String),
    /// The agent did not read every line in time.
    #[error("the agent read {read} of {want} lines within {timeout:?} (output: {out})")]
    Timeout {
        /// Lines read.
        read: u64,
        /// Lines written.
        want: u64,
        /// The wait.
        timeout: Duration,
        /// The agent's output file.
        out: String,
    },
}

fn message(n: u64) -> String {
    format!("bench line {n} level=info component=bench the quick brown fox jumps over the lazy dog")
}

fn write_inputs(cfg: &JournalCostConfig) -> Result<(), JournalCostError> {
    let dir = cfg.workdir.join("journal");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(io("creating the journal directory"))?;
    let mut file = String::new();
    let mut export = String::new();
    for n in 0..cfg.lines {
        let m = message(n);
        file.push_str(&m);
        file.push('\n');
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n\
             _BOOT_ID=0123456789abcdef0123456789abcdef\nMESSAGE={m}\nPRIORITY=6\n\
             _SYSTEMD_UNIT=bench.service\n_PID=42\n_COMM=bench\nSYSLOG_IDENTIFIER=bench\n\n",
            1_700_000_000_000_000 + n,
            1_000 + n
        ));
    }
    fs::write(cfg.workdir.join("bench.log"), file).map_err(io("writing the log file"))?;
    let mut child = Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join("remote.journal").display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| JournalCostError::JournalRemote(format!("{JOURNAL_REMOTE}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(export.as_bytes())
            .map_err(|e| JournalCostError::JournalRemote(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| JournalCostError::JournalRemote(e.to_string()))?;
    if !out.status.success() {
        return Err(JournalCostError::JournalRemote(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(())
}

fn agent_yaml(cfg: &JournalCostConfig, control: &str, metrics: u16, journald: bool) -> String {
    let tag = if journald { "journald" } else { "file" };
    let mut y = format!(
        "agent_id: {AGENT_ID}\n\
         collector:\n  control: {control}\n\
         listen:\n  metrics: 127.0.0.1:{metrics}\n\
         transport:\n  kind: soft\n  soft:\n    mtu_bytes: 4096\n\
         auth:\n  token: {TOKEN}\n\
         sources:\n  host_metrics:\n    enabled: false\n  self_metrics:\n    enabled: false\n  state_directory: {}\n",
        cfg.workdir.join(format!("state-{tag}")).display()
    );
    if journald {
        y.push_str(&format!(
            "  journald:\n    directory: {}\n    start_at: beginning\n",
            cfg.workdir.join("journal").display()
        ));
    } else {
        y.push_str(&format!(
            "  logs:\n    - path: {}\n      start_at: beginning\n",
            cfg.workdir.join("bench.log").display()
        ));
    }
    y
}

/// The pid of `parent`'s child process named `comm`.
fn child_named(parent: i32, comm: &str) -> Option<i32> {
    procfs::process::all_processes()
        .ok()?
        .flatten()
        .filter_map(|p| p.stat().ok())
        .find(|s| s.ppid == parent && s.comm == comm)
        .map(|s| s.pid)
}

fn window(
    cfg: &JournalCostConfig,
    collector: &CollectorProcess,
    journald: bool,
) -> Result<(CpuDelta, f64), JournalCostError> {
    let tag = if journald { "journald" } else { "file" };
    let _ = fs::remove_dir_all(cfg.workdir.join(format!("state-{tag}")));
    let port = free_tcp_port()?;
    let yaml = cfg.workdir.join(format!("agent-{tag}.yaml"));
    fs::write(
        &yaml,
        agent_yaml(cfg, &collector.control.to_string(), port, journald),
    )
    .map_err(io("writing the agent config"))?;
    let out = cfg.workdir.join(format!("agent-{tag}.out"));
    let yaml_arg = yaml.display().to_string();
    let mut agent = Proc::start(
        &cfg.agent_bin,
        &["--config", &yaml_arg, "--log-level", "error"],
        out.clone(),
    )?;
    let p0 = sample_process(agent.pid())?;
    let http: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let counter = if journald {
        "uctel_agent_journal_entries_read_total"
    } else {
        "uctel_agent_log_records_read_total"
    };
    let deadline = Instant::now() + cfg.timeout;
    let mut journalctl = None;
    let mut journalctl_cpu = 0.0;
    loop {
        agent.check_alive("agent")?;
        if journald && journalctl.is_none() {
            journalctl = child_named(agent.pid(), "journalctl");
        }
        if let Some(pid) = journalctl {
            if let Ok(s) = sample_process(pid) {
                journalctl_cpu = s.cpu_seconds;
            }
        }
        let read = scrape(&http, addr)
            .map(|s| s.sum(counter, &[]))
            .unwrap_or(0.0);
        if read >= cfg.lines as f64 {
            break;
        }
        if Instant::now() >= deadline {
            return Err(JournalCostError::Timeout {
                read: read as u64,
                want: cfg.lines,
                timeout: cfg.timeout,
                out: out.display().to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let p1 = sample_process(agent.pid())?;
    drop(agent);
    Ok((delta(&p0, &p1), journalctl_cpu))
}

/// Runs the measurement.
///
/// # Errors
/// [`JournalCostError`] when a daemon or systemd-journal-remote cannot be run, or the
/// agent does not read every line in time.
pub fn run(cfg: &JournalCostConfig) -> Result<JournalCostResult, JournalCostError> {
    for (what, path, package) in [
        ("agent", &cfg.agent_bin, "uctel-agent"),
        ("collector", &cfg.collector_bin, "uctel-collector"),
    ] {
        if !path.is_file() {
            return Err(DaemonError::MissingBinary {
                what,
                path: path.clone(),
                package,
            }
            .into());
        }
    }
    if !Path::new(JOURNAL_REMOTE).is_file() {
        return Err(JournalCostError::JournalRemote(format!(
            "{JOURNAL_REMOTE} missing (Debian package systemd-journal-remote)"
        )));
    }
    fs::create_dir_all(&cfg.workdir).map_err(io("creating the work directory"))?;
    write_inputs(cfg)?;
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
    let (file, _) = window(cfg, &collector, false)?;
    let (journald, journalctl_cpu_seconds) = window(cfg, &collector, true)?;
    collector.stop();
    Ok(JournalCostResult {
        lines: cfg.lines,
        file,
        journald,
        journalctl_cpu_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configs_name_one_source_each() {
        let cfg = JournalCostConfig {
            agent_bin: PathBuf::new(),
            collector_bin: PathBuf::new(),
            workdir: PathBuf::from("/w"),
            lines: 10,
            timeout: Duration::ZERO,
        };
        let j = agent_yaml(&cfg, "127.0.0.1:1", 2, true);
        assert!(j.contains("journald:\n    directory: /w/journal"));
        assert!(!j.contains("logs:"));
        let f = agent_yaml(&cfg, "127.0.0.1:1", 2, false);
        assert!(f.contains("- path: /w/bench.log"));
        assert!(!f.contains("journald"));
    }
}
