//! A pool of collectors and agents that rank it, as one test fixture.
//!
//! The collectors listen for control connections on `127.0.0.1`, `127.0.0.2`, … with one
//! port `P` (so the same pool can also be named by one host name with several addresses);
//! each has its own `/metrics` and UDP port. The agents name the pool as the list of those
//! addresses (or as a name, [`CollectorPool::add_agent_named`]).
//!
//! Accounting is read per epoch from both sides' logs, so that it survives a collector's
//! exit: the agent's `goodbye sent` line (its final sequences per stream) and the
//! collector's `agent disconnected` line (received, lost and dropped per stream) of the same
//! agent and epoch.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_yaml::Value;

use crate::configs::{AgentOptions, CollectorAddrs, Yaml};
use crate::daemon::Daemon;
use crate::exposition::scrape;
use crate::pipeline::{strip_ansi, Agent, STREAMS};

/// A port free for TCP on `127.0.0.1` … `127.0.0.n`, from a fixed range first (so a run's
/// member addresses, and with them the rendezvous ranks, are usually the same).
///
/// # Panics
/// If no port is free on all of them.
pub fn common_port(n: u8) -> u16 {
    let free_on_all = |port: u16| {
        let held: Vec<_> = (1..=n)
            .map(|i| std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, i), port)))
            .collect();
        held.iter().all(Result::is_ok)
    };
    (17400..17500)
        .find(|p| free_on_all(*p))
        .unwrap_or_else(|| panic!("no port in 17400..17500 is free on 127.0.0.1..=127.0.0.{n}"))
}

/// One collector of the pool.
#[derive(Debug)]
pub struct Member {
    /// Its addresses (`control` is the pool member address agents rank).
    pub addrs: CollectorAddrs,
    /// The process.
    pub daemon: Daemon,
}

/// Collectors and agents in one run directory.
#[derive(Debug)]
pub struct CollectorPool {
    /// Configs, logs.
    pub dir: tempfile::TempDir,
    /// The collectors, in address order (`127.0.0.1` first).
    pub members: Vec<Member>,
    /// The agents, in start order.
    pub agents: Vec<Agent>,
}

impl CollectorPool {
    /// Starts `n` collectors with `edit` applied to each configuration; waits for their
    /// `/metrics`.
    ///
    /// # Panics
    /// If one does not come up within 30 s.
    pub fn start(n: u8, edit: impl Fn(&mut Yaml)) -> CollectorPool {
        let dir = tempfile::Builder::new()
            .prefix("uctel-pool-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let port = common_port(n);
        let mut members = Vec::new();
        for i in 1..=n {
            let addrs = CollectorAddrs {
                control: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)), port),
                metrics: crate::net::free_addr(),
                udp: crate::net::free_addr(),
            };
            let mut yaml = crate::configs::collector(&addrs, dir.path());
            yaml.set("control.heartbeat_interval_seconds", 1).set(
                "logs.file.path",
                dir.path()
                    .join(format!("collector-{i}-logs.jsonl"))
                    .display()
                    .to_string(),
            );
            edit(&mut yaml);
            let config = dir.path().join(format!("collector-{i}.yaml"));
            yaml.write(&config);
            let daemon = Daemon::start(
                &format!("collector-{i}"),
                &crate::bins::path(crate::bins::COLLECTOR),
                &config,
                dir.path(),
            );
            members.push(Member { addrs, daemon });
        }
        let pool = CollectorPool {
            dir,
            members,
            agents: Vec::new(),
        };
        for m in 0..pool.members.len() {
            pool.wait_up(m, Duration::from_secs(30));
        }
        pool
    }

    /// The run directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The control addresses of the members, as agents list them.
    pub fn control_addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.addrs.control).collect()
    }

    /// Waits until member `m` answers on `/metrics`.
    ///
    /// # Panics
    /// On timeout, with its log.
    pub fn wait_up(&self, m: usize, timeout: Duration) {
        let addr = self.members[m].addrs.metrics;
        let r = crate::wait_for(
            "collector /metrics",
            timeout,
            Duration::from_millis(100),
            || scrape(addr).map(|_| ()),
        );
        if let Err(e) = r {
            panic!("{e}\n{}", self.members[m].daemon.log_tail(40));
        }
    }

    /// Starts agent `id` with the pool as the list of member addresses, `edit` applied to
    /// its configuration; it tails its own `<id>.input.log`.
    pub fn add_agent(&mut self, id: &str, edit: impl FnOnce(&mut Yaml)) -> usize {
        let list: Vec<Value> = self
            .control_addrs()
            .iter()
            .map(|a| Value::from(a.to_string()))
            .collect();
        self.add_agent_with_control(id, Value::Sequence(list), edit)
    }

    /// Starts agent `id` with `collector.control: <name>:<port of the pool>`.
    pub fn add_agent_named(&mut self, id: &str, name: &str, edit: impl FnOnce(&mut Yaml)) -> usize {
        let port = self.members[0].addrs.control.port();
        self.add_agent_with_control(id, Value::from(format!("{name}:{port}")), edit)
    }

    fn add_agent_with_control(
        &mut self,
        id: &str,
        control: Value,
        edit: impl FnOnce(&mut Yaml),
    ) -> usize {
        let log_file = self.path().join(format!("{id}.input.log"));
        std::fs::write(&log_file, "").unwrap_or_else(|e| panic!("{}: {e}", log_file.display()));
        let options = AgentOptions {
            id: id.to_owned(),
            metrics: crate::net::free_addr(),
            log_file,
            drop_ratio: 0.0,
            host_interval_seconds: 2.0,
        };
        let mut yaml = crate::configs::agent(&options, self.members[0].addrs.control, self.path());
        yaml.set("collector.control", control);
        edit(&mut yaml);
        let config = self.path().join(format!("{id}.yaml"));
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

    /// Agent `i`'s current collector from its `uctel_agent_collector_info{address}` (`None`:
    /// not connected, or no answer).
    pub fn current(&self, i: usize) -> Option<SocketAddr> {
        let s = self.agents[i].scrape().ok()?;
        let current = s
            .select("uctel_agent_collector_info", &[])
            .find(|smp| smp.value == 1.0)
            .and_then(|smp| smp.label("address"))
            .and_then(|a| a.parse().ok());
        current
    }

    /// Every agent's current collector, in agent order.
    pub fn placement(&self) -> Vec<Option<SocketAddr>> {
        (0..self.agents.len()).map(|i| self.current(i)).collect()
    }

    /// Agent `i`'s `uctel_agent_collector_switches_total` by reason.
    pub fn switches(&self, i: usize) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Ok(s) = self.agents[i].scrape() {
            for smp in s.select("uctel_agent_collector_switches_total", &[]) {
                if let Some(r) = smp.label("reason") {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    out.insert(r.to_owned(), smp.value.max(0.0) as u64);
                }
            }
        }
        out
    }

    /// Agent `i`'s `uctel_agent_collector_refusals_total` by reason.
    pub fn refusals(&self, i: usize) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Ok(s) = self.agents[i].scrape() {
            for smp in s.select("uctel_agent_collector_refusals_total", &[]) {
                if let Some(r) = smp.label("reason") {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    out.insert(r.to_owned(), smp.value.max(0.0) as u64);
                }
            }
        }
        out
    }

    /// Writes `n` numbered lines to agent `i`'s input log.
    pub fn write_lines(&self, i: usize, start: usize, n: usize) {
        use std::io::Write;
        let path = &self.agents[i].options.log_file;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for k in start..start + n {
            let _ = writeln!(f, "line {k} of {}", self.agents[i].options.id);
        }
    }
}

/// One epoch's final figures as the agent logged them at its `goodbye sent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEpoch {
    /// `0x…`.
    pub epoch: String,
    /// The collector's control address.
    pub collector: String,
    /// `shutdown`, `drain` or `rebalance`.
    pub reason: String,
    /// Frames per stream name.
    pub frames: BTreeMap<String, u64>,
}

/// Every `goodbye sent` line of an agent log.
pub fn agent_epochs(log: &str) -> Vec<AgentEpoch> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("goodbye sent"))
        .map(|l| {
            let f = fields(&l);
            let get = |k: &str| f.get(k).cloned().unwrap_or_default();
            AgentEpoch {
                epoch: get("epoch"),
                collector: get("collector"),
                reason: get("reason"),
                frames: STREAMS
                    .iter()
                    .map(|s| {
                        let n = get(&format!("{s}_frames")).parse().unwrap_or(u64::MAX);
                        ((*s).to_owned(), n)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// One finished session as a collector logged it at `agent disconnected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorEpoch {
    /// The agent id.
    pub agent: String,
    /// `0x…`.
    pub epoch: String,
    /// What ended it (`the agent's Goodbye (…)`, …).
    pub ended_by: String,
    /// Frames dropped before tracking (no stream).
    pub dropped_before_tracking: u64,
    /// Per stream name: received, lost, dropped after tracking.
    pub streams: BTreeMap<String, (u64, u64, u64)>,
}

/// Every `agent disconnected` line of a collector log.
pub fn collector_epochs(log: &str) -> Vec<CollectorEpoch> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("agent disconnected"))
        .map(|l| {
            let f = fields(&l);
            let get = |k: &str| f.get(k).cloned().unwrap_or_default();
            let mut streams = BTreeMap::new();
            for s in STREAMS {
                if let Some(at) = l.find(&format!("{s}: received ")) {
                    let nums: Vec<u64> = l[at..]
                        .split(|c: char| !c.is_ascii_digit())
                        .filter(|t| !t.is_empty())
                        .take(3)
                        .filter_map(|t| t.parse().ok())
                        .collect();
                    if let [r, lost, d] = nums[..] {
                        streams.insert(s.to_owned(), (r, lost, d));
                    }
                }
            }
            CollectorEpoch {
                agent: get("agent"),
                epoch: get("epoch"),
                ended_by: ended_by(&l),
                dropped_before_tracking: get("frames_dropped").parse().unwrap_or(u64::MAX),
                streams,
            }
        })
        .collect()
}

/// The `ended_by` field, which may hold spaces (quoted).
fn ended_by(line: &str) -> String {
    let Some(at) = line.find("ended_by=") else {
        return String::new();
    };
    let rest = &line[at + "ended_by=".len()..];
    match rest.strip_prefix('"') {
        Some(q) => q.split('"').next().unwrap_or("").to_owned(),
        None => rest.split_whitespace().next().unwrap_or("").to_owned(),
    }
}

/// `key=value` tokens of a log line (values without spaces; quotes trimmed).
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|t| t.split_once('='))
        .filter(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        })
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

/// Lines `127.0.0.k name` added to `/etc/hosts` (the system resolver's file, read again at
/// every lookup), rewritten with [`HostsEntries::set`], and the file's original text put back
/// when dropped.
#[derive(Debug)]
pub struct HostsEntries {
    original: String,
}

impl HostsEntries {
    /// Adds `127.0.0.k name` for `k` in `1..=n`.
    ///
    /// # Errors
    /// `/etc/hosts` cannot be read or written (not root).
    pub fn add(name: &str, n: u8) -> Result<HostsEntries, String> {
        let original = std::fs::read_to_string("/etc/hosts").map_err(|e| e.to_string())?;
        let hosts = HostsEntries { original };
        hosts.set(name, &(1..=n).collect::<Vec<u8>>())?;
        Ok(hosts)
    }

    /// Makes `name` resolve to `127.0.0.k` for each `k` of `last_octets` (in that order),
    /// the rest of the original file kept.
    ///
    /// # Errors
    /// `/etc/hosts` cannot be written.
    pub fn set(&self, name: &str, last_octets: &[u8]) -> Result<(), String> {
        let mut text = self.original.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        for k in last_octets {
            text.push_str(&format!("127.0.0.{k} {name}\n"));
        }
        std::fs::write("/etc/hosts", text).map_err(|e| e.to_string())
    }
}

impl Drop for HostsEntries {
    fn drop(&mut self) {
        let _ = std::fs::write("/etc/hosts", &self.original);
    }
}
