//! A collector and its agents as one test fixture, and the loss accounting read from both
//! sides.
//!
//! Agent side: the agent's local `/metrics` (`uctel_agent_*`) and its log line
//! `goodbye sent` (written after the last frame left, with the connection's frame total).
//! Collector side: `uctel_collector_*` on the collector's `/metrics`. The identities checked
//! (collector module docs, DESIGN.md §5 and §8):
//!
//! * per connection: `sent = Σ received + Σ dropped + connection_frames_lost`;
//! * per connection: `sent = Σ_stream (received + lost) + dropped_after_tracking`;
//! * per stream, with the agent's final per-stream figures:
//!   `sent = received + lost (+ dropped after tracking)`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::configs::{AgentOptions, CollectorAddrs};
use crate::daemon::Daemon;
use crate::exposition::{scrape, Scrape};

/// The agent's streams by the name both sides use as their `stream` label
/// (`uctel_protocol::stream::WELL_KNOWN`: stream id 1 is `metrics`, 2 is `logs`, 3 is
/// `fast_counters`). A connection carries `fast_counters` only with `sources.fast_counters`
/// configured (no frame at all otherwise, so the collector shows none); the agent's
/// `goodbye sent` line has `<stream>_frames` and `<stream>_records` for each of the three.
pub const STREAMS: [&str; 3] = ["metrics", "logs", "fast_counters"];

/// Collector drop reasons after which the frame's stream has already counted it (not lost).
pub const AFTER_TRACKING: [&str; 2] = ["malformed_payload", "limit_exceeded"];

/// One agent of the pipeline.
#[derive(Debug)]
pub struct Agent {
    /// Its options (id, addresses, log file).
    pub options: AgentOptions,
    /// The process.
    pub daemon: Daemon,
}

impl Agent {
    /// Scrapes the agent's local `/metrics`.
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape(&self) -> Result<Scrape, String> {
        scrape(self.options.metrics)
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.options.id
    }
}

/// A collector with agents, all in one temporary run directory.
#[derive(Debug)]
pub struct Pipeline {
    /// Config files, logs, agent log files, state.
    pub dir: tempfile::TempDir,
    /// Collector addresses.
    pub addrs: CollectorAddrs,
    /// The collector process.
    pub collector: Daemon,
    /// Agents in start order.
    pub agents: Vec<Agent>,
}

impl Pipeline {
    /// Writes the collector config and starts the collector; waits for its `/metrics`.
    ///
    /// # Panics
    /// If it does not come up within 30 s.
    pub fn start() -> Pipeline {
        Pipeline::start_with(|_, _| {})
    }

    /// [`start`](Self::start) with `edit` applied to the collector's configuration (given
    /// the run directory) before it starts.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with(edit: impl FnOnce(&mut crate::configs::Yaml, &Path)) -> Pipeline {
        let dir = tempfile::Builder::new()
            .prefix("uctel-e2e-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let addrs = CollectorAddrs::free();
        let config = dir.path().join("collector.yaml");
        let mut yaml = crate::configs::collector(&addrs, dir.path());
        edit(&mut yaml, dir.path());
        yaml.write(&config);
        let collector = Daemon::start(
            "collector",
            &crate::bins::path(crate::bins::COLLECTOR),
            &config,
            dir.path(),
        );
        let mut p = Pipeline {
            dir,
            addrs,
            collector,
            agents: Vec::new(),
        };
        p.wait_collector_up(Duration::from_secs(30));
        p
    }

    /// The run directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the collector answers on `/metrics`.
    ///
    /// # Panics
    /// On timeout or if the collector exited, with its log.
    pub fn wait_collector_up(&mut self, timeout: Duration) {
        let addr = self.addrs.metrics;
        let r = crate::wait_for(
            "collector /metrics",
            timeout,
            Duration::from_millis(100),
            || scrape(addr).map(|_| ()),
        );
        if let Err(e) = r {
            let running = self.collector.is_running();
            panic!("{e} (running: {running})\n{}", self.collector.log_tail(40));
        }
    }

    /// Adds and starts an agent `id` tailing its own log file `<id>.input.log` in the run
    /// directory, with `drop_ratio` fault injection on its link.
    pub fn add_agent(&mut self, id: &str, drop_ratio: f64, host_interval_seconds: f64) -> usize {
        self.add_agent_with(id, drop_ratio, host_interval_seconds, |_| {})
    }

    /// [`add_agent`](Self::add_agent) with `edit` applied to its configuration before it
    /// starts.
    pub fn add_agent_with(
        &mut self,
        id: &str,
        drop_ratio: f64,
        host_interval_seconds: f64,
        edit: impl FnOnce(&mut crate::configs::Yaml),
    ) -> usize {
        let log_file = self.path().join(format!("{id}.input.log"));
        std::fs::write(&log_file, "").unwrap_or_else(|e| panic!("{}: {e}", log_file.display()));
        let options = AgentOptions {
            id: id.to_owned(),
            metrics: crate::net::free_addr(),
            log_file,
            drop_ratio,
            host_interval_seconds,
        };
        let config = self.path().join(format!("{id}.yaml"));
        let mut yaml = crate::configs::agent(&options, self.addrs.control, self.path());
        edit(&mut yaml);
        yaml.write(&config);
        let daemon = Daemon::start(
            id,
            &crate::bins::path(crate::bins::AGENT),
            &config,
            self.path(),
        );
        self.agents.push(Agent { options, daemon });
        self.agents.len() - 1
    }

    /// Scrapes the collector.
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape(&self) -> Result<Scrape, String> {
        scrape(self.addrs.metrics)
    }

    /// The collector's `/metrics` address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.addrs.metrics
    }

    /// Waits until `uctel_collector_agents_connected == n` and every agent in `ids` has
    /// frames received on every stream in `streams` (names: `metrics`, `logs`).
    ///
    /// # Panics
    /// On timeout, with the collector's log.
    pub fn wait_flowing(&self, n: usize, ids: &[&str], streams: &[&str], timeout: Duration) {
        let r = crate::wait_for(
            "agents connected and frames flowing",
            timeout,
            Duration::from_millis(200),
            || {
                let s = self.scrape()?;
                let connected = s.count("uctel_collector_agents_connected", &[]);
                if connected != n as u64 {
                    return Err(format!("agents_connected = {connected}, want {n}"));
                }
                for id in ids {
                    for st in streams {
                        let got = s.count(
                            "uctel_collector_frames_received_total",
                            &[("agent", id), ("stream", st)],
                        );
                        if got == 0 {
                            return Err(format!("no frames yet from {id} on stream {st}"));
                        }
                    }
                }
                Ok(())
            },
        );
        if let Err(e) = r {
            panic!("{e}\n{}", self.collector.log_tail(40));
        }
    }

    /// Appends `n` numbered lines to agent `i`'s input log.
    pub fn write_lines(&self, i: usize, start: usize, n: usize) {
        use std::io::Write;
        let path = &self.agents[i].options.log_file;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut buf = String::with_capacity(n * 80);
        for k in start..start + n {
            buf.push_str(&format!(
                "line {k} of {} from the uctel end-to-end test, padded to look like a real log line\n",
                self.agents[i].options.id
            ));
        }
        f.write_all(buf.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Collector-side figures for one agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectorFigures {
    /// Per stream name: frames received.
    pub received: BTreeMap<String, u64>,
    /// Per stream name: frames lost.
    pub lost: BTreeMap<String, u64>,
    /// Per stream name: records received.
    pub records_received: BTreeMap<String, u64>,
    /// Per stream name: records lost.
    pub records_lost: BTreeMap<String, u64>,
    /// Per reason: frames dropped.
    pub dropped: BTreeMap<String, u64>,
    /// Connection-sequence gaps not explained by a drop.
    pub connection_lost: u64,
    /// Per (stream name, reason): stream resets (`epoch_change`: a new agent epoch;
    /// `dropout`: a jump beyond `max_dropout_frames`).
    pub resets: BTreeMap<(String, String), u64>,
}

impl CollectorFigures {
    /// Reads the figures of `agent` from a collector scrape.
    pub fn read(s: &Scrape, agent: &str) -> CollectorFigures {
        let mut f = CollectorFigures::default();
        for id in STREAMS {
            let m = [("agent", agent), ("stream", id)];
            f.received.insert(
                id.into(),
                s.count("uctel_collector_frames_received_total", &m),
            );
            f.lost
                .insert(id.into(), s.count("uctel_collector_frames_lost_total", &m));
            f.records_received.insert(
                id.into(),
                s.count("uctel_collector_records_received_total", &m),
            );
            f.records_lost
                .insert(id.into(), s.count("uctel_collector_records_lost_total", &m));
            for smp in s.select(
                "uctel_collector_stream_resets_total",
                &[("agent", agent), ("stream", id)],
            ) {
                if let Some(reason) = smp.label("reason") {
                    *f.resets.entry((id.into(), reason.into())).or_default() += s.count(
                        "uctel_collector_stream_resets_total",
                        &[("agent", agent), ("stream", id), ("reason", reason)],
                    );
                }
            }
        }
        for smp in s.select("uctel_collector_frames_dropped_total", &[("agent", agent)]) {
            if let Some(r) = smp.label("reason") {
                let n = s.count(
                    "uctel_collector_frames_dropped_total",
                    &[("agent", agent), ("reason", r)],
                );
                f.dropped.insert(r.to_owned(), n);
            }
        }
        f.connection_lost = s.count(
            "uctel_collector_connection_frames_lost_total",
            &[("agent", agent)],
        );
        f
    }

    /// Σ received over streams.
    pub fn received_total(&self) -> u64 {
        self.received.values().sum()
    }

    /// Σ lost over streams.
    pub fn lost_total(&self) -> u64 {
        self.lost.values().sum()
    }

    /// Σ resets whose reason names a new epoch.
    pub fn epoch_resets(&self) -> u64 {
        self.resets
            .iter()
            .filter(|((_, r), _)| r.contains("epoch"))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Σ resets for any other reason (dropout/resync): never expected on loopback.
    pub fn other_resets(&self) -> u64 {
        self.resets
            .iter()
            .filter(|((_, r), _)| !r.contains("epoch"))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Σ dropped over reasons.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// Σ dropped over the reasons after tracking.
    pub fn dropped_after_tracking(&self) -> u64 {
        AFTER_TRACKING
            .iter()
            .map(|r| self.dropped.get(*r).copied().unwrap_or(0))
            .sum()
    }
}

/// Agent-side figures: per stream (agent label names) frames and records sent and dropped at
/// the source, and the fault injector's drops when the agent exposes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentFigures {
    /// Per stream name: frames posted.
    pub frames_sent: BTreeMap<String, u64>,
    /// Per stream name: records posted.
    pub records_sent: BTreeMap<String, u64>,
    /// Per stream name: records dropped at the source, all reasons.
    pub records_dropped: BTreeMap<String, u64>,
    /// Packets the soft transport's fault injector dropped, when exposed: the sum of every
    /// `uctel_agent_*` sample whose name mentions `fault` and whose name or labels say
    /// `drop`.
    pub fault_dropped: Option<u64>,
}

impl AgentFigures {
    /// Reads the figures from a scrape of the agent's `/metrics`.
    pub fn read(s: &Scrape) -> AgentFigures {
        let mut f = AgentFigures::default();
        for name in STREAMS {
            let m = [("stream", name)];
            f.frames_sent
                .insert(name.into(), s.count("uctel_agent_frames_sent_total", &m));
            f.records_sent
                .insert(name.into(), s.count("uctel_agent_records_sent_total", &m));
            f.records_dropped.insert(
                name.into(),
                s.count("uctel_agent_records_dropped_total", &m),
            );
        }
        let mut fault = None;
        for smp in &s.samples {
            let n = &smp.name;
            let drop_label = smp.labels.values().any(|v| v.contains("drop"));
            if n.starts_with("uctel_agent_")
                && n.contains("fault")
                && (n.contains("drop") || drop_label)
            {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let v = smp.value.max(0.0).round() as u64;
                fault = Some(fault.unwrap_or(0) + v);
            }
        }
        f.fault_dropped = fault;
        f
    }
}

/// `key=value` fields of the last log line of `log` containing `message`, ANSI colours
/// stripped. Values are kept as text.
pub fn last_log_fields(log: &str, message: &str) -> Option<BTreeMap<String, String>> {
    let line = log
        .lines()
        .rev()
        .map(strip_ansi)
        .find(|l| l.contains(message))?;
    let mut out = BTreeMap::new();
    for tok in line.split_whitespace() {
        if let Some((k, v)) = tok.split_once('=') {
            if !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                out.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
    }
    Some(out)
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Every `goodbye sent` line of an agent log: the `frames` field of each (one per session
/// that ended by shutdown).
pub fn goodbye_frames(log: &str) -> Vec<u64> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("goodbye sent"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|t| t.strip_prefix("frames="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

/// The numeric fields of the last `goodbye sent` line of an agent log: the final figures of
/// the session that ended by shutdown. `frames` (the connection), per stream
/// `metrics_frames`, `metrics_records`, `logs_frames`, `logs_records`, and `fault_dropped`
/// (packets that session's fault injector dropped) when fault injection is on.
pub fn goodbye_figures(log: &str) -> BTreeMap<String, u64> {
    last_log_fields(log, "goodbye sent")
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| v.parse().ok().map(|n| (k, n)))
        .collect()
}

/// The epochs the collector logged for `agent` at each `agent connected`, in order.
pub fn connected_epochs(collector_log: &str, agent: &str) -> Vec<String> {
    let want = format!("agent={agent}");
    collector_log
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains("agent connected") && l.split_whitespace().any(|t| t == want))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|t| t.strip_prefix("epoch=").map(str::to_owned))
        })
        .collect()
}

/// A file path inside the run directory, for the tests' own artefacts.
pub fn artefact(p: &Pipeline, name: &str) -> PathBuf {
    p.path().join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_fields_and_ansi() {
        let log = "2025 INFO x: connected\n\u{1b}[2m2025\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m uctel_agent::run: goodbye sent \u{1b}[3mepoch\u{1b}[0m\u{1b}[2m=\u{1b}[0m7 \u{1b}[3mframes\u{1b}[0m\u{1b}[2m=\u{1b}[0m1234\n";
        let f = last_log_fields(log, "goodbye sent").unwrap_or_default();
        assert_eq!(f.get("frames").map(String::as_str), Some("1234"));
        assert_eq!(f.get("epoch").map(String::as_str), Some("7"));
        assert_eq!(goodbye_frames(log), vec![1234]);
        assert!(last_log_fields(log, "nothing like this").is_none());
        let log = "INFO uctel_agent::run: goodbye sent epoch=7 frames=30 metrics_frames=12 metrics_records=400 logs_frames=18 logs_records=900 fault_dropped=2\n";
        assert_eq!(goodbye_frames(log), vec![30]);
        let g = goodbye_figures(log);
        assert_eq!(g.get("frames"), Some(&30));
        assert_eq!(g.get("logs_records"), Some(&900));
        assert_eq!(g.get("fault_dropped"), Some(&2));
    }
}
