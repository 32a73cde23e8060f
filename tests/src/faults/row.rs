//! The row fixture: a collector and its agents configured from `config/*.yaml`, every
//! scrape recorded, the faults a row applies (kill, restart, stop), and quiescing the
//! README's way (agent SIGTERM → Goodbye). The judgement is in [`super::law`].

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_yaml::{Mapping, Value};

use crate::configs::{AgentOptions, CollectorAddrs, Yaml};
use crate::daemon::Daemon;
use crate::exposition::{scrape, Scrape};
use crate::pipeline::{strip_ansi, CollectorFigures, STREAMS};

// The sibling modules, re-exported by `faults`.
use super::*;

/// Generous memory bound for either daemon (debug build), KiB.
pub const MAX_HWM_KIB: u64 = 512 * 1024;

/// How a row's law is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Law {
    /// Every record is accounted exactly: `written = delivered + lost + dropped`.
    Exact,
    /// A daemon died without Goodbye: `delivered + lost + dropped ≤ written`; the rest is
    /// the unknowable tail, which the collector should report (see [`UNKNOWN_TAIL_HINT`]).
    AtMost,
}

/// Substrings of a metric name (with `records` in it) that would report the unknowable tail
/// of a session that ended without Goodbye: on the collector with `agent` and `stream`
/// labels (an agent that vanished: DESIGN.md §6 has heartbeats carry the sequences for
/// that), on the agent with a `stream` label (records posted but never confirmed by a
/// collector that died). No such metric exists at the time of writing; when one appears,
/// the kill rows use the sum as the bound of what is unaccounted.
pub const UNKNOWN_TAIL_HINT: [&str; 4] = ["unknown", "unaccounted", "unreported", "unconfirmed"];

/// Sum of the samples of `s` that report an unknown tail for the log stream (see
/// [`UNKNOWN_TAIL_HINT`]), `agent` label required when `agent` is given.
pub(super) fn unknown_tail(s: &Scrape, prefix: &str, agent: Option<&str>) -> Option<u64> {
    let mut total = None;
    for smp in &s.samples {
        if smp.name.starts_with(prefix)
            && smp.name.contains("records")
            && UNKNOWN_TAIL_HINT.iter().any(|h| smp.name.contains(h))
            && agent.is_none_or(|a| smp.label("agent") == Some(a))
            && smp.label("stream") == Some("logs")
        {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = smp.value.max(0.0).round() as u64;
            *total.get_or_insert(0) += v;
        }
    }
    total
}

/// Collector settings of a row.
#[derive(Debug, Clone, Default)]
pub struct CollectorSpec {
    /// The JSON Lines sink path (default `<dir>/collector-logs.jsonl`).
    pub sink: Option<PathBuf>,
    /// Address the control plane and the soft UDP socket listen on (default loopback).
    pub listen_ip: Option<Ipv4Addr>,
    /// Put the sink on a tmpfs of this many KiB mounted at `<dir>/sinkfs` (root).
    pub sink_tmpfs_kib: Option<u64>,
    /// Extra `key → value` settings (dotted keys).
    pub set: Vec<(String, Value)>,
}

/// What a row accepts beyond the plain law.
#[derive(Debug, Clone)]
pub struct Allow {
    /// Lines an agent never read stay in its files (a twin kept out by the collector): the
    /// law gets the term `written − read by the agent`.
    pub unread: bool,
    /// Sessions that may end without Goodbye since the frame baseline (a replaced twin);
    /// the frame rule is then not exact and only shown.
    pub sessions_without_goodbye: usize,
    /// How long [`Row::quiesce`] waits for each agent to settle.
    pub settle: Duration,
    /// Handshakes refused as `duplicate_agent_id` are expected (twin agent ids); elsewhere
    /// every agent has its own id and a refusal is a failure (an agent restarted after its
    /// Goodbye taken for a second live agent).
    pub duplicate_refusals: bool,
}

impl Default for Allow {
    fn default() -> Self {
        Allow {
            unread: false,
            sessions_without_goodbye: 0,
            settle: Duration::from_secs(10),
            duplicate_refusals: false,
        }
    }
}

/// One agent of a row.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Unique name in the row (log file, state directory, daemon log).
    pub name: String,
    /// `agent_id` (two agents may share it).
    pub id: String,
    /// The log glob, relative to the row directory (default `<name>.log`).
    pub glob: Option<String>,
    /// `transport.soft.fault.*` settings (seeded with the row's seed).
    pub fault: Vec<(String, Value)>,
    /// Run the agent in the row's network namespace.
    pub in_netns: bool,
    /// `start_at` of the log source (default `end`, the production default).
    pub start_at: &'static str,
    /// Other configuration keys (dotted path, value), set last.
    pub config: Vec<(String, Value)>,
}

impl AgentSpec {
    /// Agent `name` with `agent_id` = `name`, following `<name>.log`.
    pub fn new(name: &str) -> AgentSpec {
        AgentSpec {
            name: name.to_owned(),
            id: name.to_owned(),
            glob: None,
            fault: Vec::new(),
            in_netns: false,
            start_at: "end",
            config: Vec::new(),
        }
    }

    /// Sets the configuration key `key` (dotted path) to `v`.
    pub fn set(mut self, key: &str, v: impl Into<Value>) -> AgentSpec {
        self.config.push((key.to_owned(), v.into()));
        self
    }

    /// Sets `transport.soft.fault.<key>`.
    pub fn fault(mut self, key: &str, v: impl Into<Value>) -> AgentSpec {
        self.fault.push((key.to_owned(), v.into()));
        self
    }
}

/// What is known of one agent process (a "life"): its last scrape.
#[derive(Debug, Clone, Default)]
pub(super) struct Life {
    pub(super) last: Option<Scrape>,
}

/// One agent of a row.
#[derive(Debug)]
pub struct RowAgent {
    /// Its settings.
    pub spec: AgentSpec,
    /// Local `/metrics`.
    pub metrics: SocketAddr,
    /// The process.
    pub daemon: Daemon,
    /// Sources it follows (index 0 is `<name>.log`).
    pub sources: Vec<LineSource>,
    pub(super) lives: Vec<Life>,
    /// Where its log starts counting sessions for the frame rule.
    pub(super) log_mark: usize,
}

impl RowAgent {
    /// Lines written by all of its sources.
    pub fn written(&self) -> u64 {
        self.sources.iter().map(|s| s.written).sum()
    }
}

/// A collector and agents for one row, every scrape recorded. Fields drop in order: the
/// daemons are killed before the namespace, mount and rules under them go.
#[derive(Debug)]
pub struct Row {
    /// Row name (first field of every line).
    pub name: String,
    /// The row's seed.
    pub seed: u64,
    /// Seeded choices of the row (burst sizes).
    pub rng: Rng,
    /// Collector addresses.
    pub addrs: CollectorAddrs,
    /// The collector.
    pub collector: Daemon,
    /// Agents.
    pub agents: Vec<RowAgent>,
    /// The JSON Lines sink.
    pub sink: PathBuf,
    /// Counter monotonicity over every scrape.
    pub mono: Monotonic,
    /// Things the row noticed on the way (timeouts, fault effects), printed with the verdict.
    pub notes: Vec<String>,
    /// Failures found on the way (not only at the verdict).
    pub failures: Vec<String>,
    /// The network namespace of agents with `in_netns`.
    pub netns: Option<NetNs>,
    /// A tmpfs under the sink.
    pub tmpfs: Option<Tmpfs>,
    /// What the row accepts beyond the plain law.
    pub allow: Allow,
    pub(super) collector_lives: Vec<Life>,
    pub(super) collector_log_mark: usize,
    /// Collector scrape the frame rule counts from (`None`: zero, a fresh collector).
    pub(super) frame_base: Option<Scrape>,
    pub(super) memory: BTreeMap<String, (u64, u64)>,
    pub(super) started: Instant,
    /// The run directory (last: removed after everything else).
    pub dir: tempfile::TempDir,
}

/// Tick of every wait in a row.
pub const TICK: Duration = Duration::from_millis(150);

impl Row {
    /// Starts the collector of row `name` and prints the seed.
    ///
    /// # Panics
    /// If the collector does not come up.
    pub fn start(name: &str, spec: CollectorSpec, netns: Option<NetNs>) -> Row {
        let seed = row_seed(name);
        eprintln!(
            "row={name} seed={seed:#x} (rerun with UCTEL_FAULT_SEED={seed:#x} for the same faults)"
        );
        let dir = tempfile::Builder::new()
            .prefix(&format!("uctel-fm-{name}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let ip = spec.listen_ip.unwrap_or(Ipv4Addr::LOCALHOST);
        let addrs = CollectorAddrs {
            control: free_addr_on(ip),
            metrics: crate::net::free_addr(),
            udp: free_addr_on(ip),
        };
        let mut tmpfs = None;
        let sink = match (&spec.sink, spec.sink_tmpfs_kib) {
            (Some(p), _) => p.clone(),
            (None, Some(kib)) => {
                let fs = Tmpfs::mount(&dir.path().join("sinkfs"), kib)
                    .unwrap_or_else(|e| panic!("mounting the sink's tmpfs: {e}"));
                let p = fs.path.join("collector-logs.jsonl");
                tmpfs = Some(fs);
                p
            }
            (None, None) => dir.path().join("collector-logs.jsonl"),
        };
        let mut y = crate::configs::collector(&addrs, dir.path());
        y.set("logs.file.path", sink.display().to_string());
        for (k, v) in &spec.set {
            y.set(k, v.clone());
        }
        let config = dir.path().join("collector.yaml");
        y.write(&config);
        let collector = Daemon::start(
            "collector",
            &crate::bins::path(crate::bins::COLLECTOR),
            &config,
            dir.path(),
        );
        let mut row = Row {
            name: name.to_owned(),
            seed,
            rng: Rng::new(seed),
            addrs,
            collector,
            agents: Vec::new(),
            sink,
            mono: Monotonic::default(),
            notes: Vec::new(),
            failures: Vec::new(),
            netns,
            tmpfs,
            allow: Allow::default(),
            collector_lives: vec![Life::default()],
            collector_log_mark: 0,
            frame_base: None,
            memory: BTreeMap::new(),
            started: Instant::now(),
            dir,
        };
        row.wait_collector_up();
        row
    }

    /// The run directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn wait_collector_up(&mut self) {
        let addr = self.addrs.metrics;
        if let Err(e) = crate::wait_for(
            "collector /metrics",
            Duration::from_secs(30),
            Duration::from_millis(50),
            || scrape(addr).map(|_| ()),
        ) {
            panic!("{e}\n{}", self.collector.log_tail(40));
        }
    }

    /// The directory of the log files the agents follow (`<dir>/input`; the daemons' own
    /// logs are `<dir>/<name>.log`).
    pub fn input(&self) -> PathBuf {
        self.path().join("input")
    }

    /// Adds and starts an agent; its first source is `input/<name>.log` (created empty).
    ///
    /// # Panics
    /// If the config cannot be written or the agent cannot be spawned.
    pub fn add_agent(&mut self, spec: AgentSpec) -> usize {
        let dir = self.path().to_path_buf();
        let input = self.input();
        std::fs::create_dir_all(&input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
        let source = LineSource::create(
            &self.name,
            &spec.name,
            self.seed,
            &input.join(format!("{}.log", spec.name)),
        );
        let ns = if spec.in_netns {
            self.netns.as_ref()
        } else {
            None
        };
        let metrics = match ns {
            Some(n) => SocketAddr::new(n.ns_ip.into(), free_addr_on(Ipv4Addr::LOCALHOST).port()),
            None => crate::net::free_addr(),
        };
        let options = AgentOptions {
            id: spec.id.clone(),
            metrics,
            log_file: source.path.clone(),
            drop_ratio: 0.0,
            host_interval_seconds: 1.0,
        };
        let mut y: Yaml = crate::configs::agent(&options, self.addrs.control, &dir);
        let glob = spec
            .glob
            .clone()
            .unwrap_or_else(|| format!("{}.log", spec.name));
        let mut log = Mapping::new();
        log.insert("path".into(), input.join(glob).display().to_string().into());
        // `end` (the production default) applies only to the very first run (DESIGN.md §7);
        // the files exist, empty, before the agent starts, so nothing written is skipped.
        log.insert("start_at".into(), spec.start_at.into());
        log.insert("glob_interval_seconds".into(), 0.25.into());
        log.insert("poll_interval_seconds".into(), 0.05.into());
        log.insert("rotate_wait_seconds".into(), 1.0.into());
        y.set("sources.logs", Value::Sequence(vec![Value::Mapping(log)]))
            .set(
                "sources.state_directory",
                dir.join(format!("{}-state", spec.name))
                    .display()
                    .to_string(),
            )
            .remove("transport.soft.fault");
        if !spec.fault.is_empty() {
            y.set("transport.soft.fault.seed", self.seed);
            for (k, v) in &spec.fault {
                y.set(&format!("transport.soft.fault.{k}"), v.clone());
            }
        }
        for (k, v) in &spec.config {
            y.set(k, v.clone());
        }
        let config = dir.join(format!("{}.yaml", spec.name));
        y.write(&config);
        let agent_bin = crate::bins::path(crate::bins::AGENT);
        let binary = match ns {
            Some(n) => n.wrapper(&agent_bin, &dir),
            None => agent_bin,
        };
        let daemon = Daemon::start(&spec.name, &binary, &config, &dir);
        self.agents.push(RowAgent {
            spec,
            metrics,
            daemon,
            sources: vec![source],
            lives: vec![Life::default()],
            log_mark: 0,
        });
        self.agents.len() - 1
    }

    /// Adds another source `src` at `file` (in [`Row::input`]) to agent `i`'s list (the
    /// agent's glob must match it).
    pub fn add_source(&mut self, i: usize, src: &str, file: &str) -> usize {
        let path = self.input().join(file);
        let s = LineSource::create(&self.name, src, self.seed, &path);
        self.agents[i].sources.push(s);
        self.agents[i].sources.len() - 1
    }

    /// Appends `n` lines to source `src` of agent `i`.
    pub fn write(&mut self, i: usize, src: usize, n: u64) {
        self.agents[i].sources[src].append(n);
    }

    /// Writes `total` lines to source `src` of agent `i` in seeded bursts of 50..=400 lines
    /// with `gap` between them.
    pub fn write_bursts(&mut self, i: usize, src: usize, total: u64, gap: Duration) {
        let mut left = total;
        while left > 0 {
            let n = self.rng.range(50, 400).min(left);
            self.write(i, src, n);
            left -= n;
            if left > 0 {
                std::thread::sleep(gap);
            }
        }
    }

    /// Scrapes the collector (recording the scrape; the outputs' sum rules are checked on
    /// every scrape, [`output_sum_failures`]).
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape_collector(&mut self) -> Result<Scrape, String> {
        let s = scrape(self.addrs.metrics)?;
        for f in output_sum_failures(&s) {
            if !self.failures.contains(&f) {
                self.failures.push(f);
            }
        }
        if let Some(pid) = self.collector.pid() {
            self.mono.observe("collector", pid, "uctel_collector_", &s);
        }
        if let Some(life) = self.collector_lives.last_mut() {
            life.last = Some(s.clone());
        }
        Ok(s)
    }

    /// Scrapes agent `i` (recording the scrape).
    ///
    /// # Errors
    /// As [`scrape`].
    pub fn scrape_agent(&mut self, i: usize) -> Result<Scrape, String> {
        let a = &mut self.agents[i];
        let s = scrape(a.metrics)?;
        if let Some(pid) = a.daemon.pid() {
            self.mono.observe(&a.spec.name, pid, "uctel_agent_", &s);
        }
        if let Some(life) = a.lives.last_mut() {
            life.last = Some(s.clone());
        }
        Ok(s)
    }

    /// Waits until `uctel_collector_agents_connected == n` and each agent in `who` says it
    /// is connected and follows its log file.
    ///
    /// # Panics
    /// On timeout, with the logs.
    pub fn wait_connected(&mut self, n: u64, who: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut why = String::new();
            match self.scrape_collector() {
                Ok(s) => {
                    let c = s.count("uctel_collector_agents_connected", &[]);
                    if c != n {
                        why = format!("agents_connected = {c}, want {n}");
                    }
                }
                Err(e) => why = e,
            }
            for &i in who {
                match self.scrape_agent(i) {
                    Ok(s) => {
                        if s.count("uctel_agent_connected", &[]) != 1 {
                            why = format!("{} not connected", self.agents[i].spec.name);
                        } else if s.count("uctel_agent_log_files", &[]) == 0 {
                            why = format!("{} follows no log file yet", self.agents[i].spec.name);
                        }
                    }
                    Err(e) => why = e,
                }
            }
            if why.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let mut logs = self.collector.log_tail(30);
                for &i in who {
                    logs.push('\n');
                    logs.push_str(&self.agents[i].daemon.log_tail(30));
                }
                panic!("row {}: not connected after 30 s: {why}\n{logs}", self.name);
            }
            std::thread::sleep(TICK);
        }
    }

    /// Waits until agent `i` has read at least `min_read` lines in this life and has been
    /// idle on its log stream (queue empty, sent + dropped unchanged) for four scrapes.
    /// Returns false (and notes it) on timeout; the verdict then shows what is missing.
    pub fn wait_settled(&mut self, i: usize, min_read: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut last: Option<(u64, u64)> = None;
        let mut stable = 0;
        let mut seen = String::new();
        while Instant::now() < deadline {
            self.check_in_flight(i);
            if let Ok(s) = self.scrape_agent(i) {
                let m = [("stream", "logs")];
                let read = s.count("uctel_agent_log_records_read_total", &[]);
                let out = s.count("uctel_agent_records_sent_total", &m)
                    + s.count("uctel_agent_records_dropped_total", &m);
                let queued = s.count("uctel_agent_queue_records", &m);
                seen = format!(
                    "read {read} (want >= {min_read}), sent+dropped {out}, queued {queued}"
                );
                if queued == 0 && read >= min_read && last == Some((read, out)) {
                    stable += 1;
                    if stable >= 4 {
                        return true;
                    }
                } else {
                    stable = 0;
                }
                last = Some((read, out));
            }
            std::thread::sleep(TICK);
        }
        let name = self.agents[i].spec.name.clone();
        self.notes
            .push(format!("{name}: not settled within {timeout:?}: {seen}"));
        false
    }

    /// README "Loss accounting": at every scrape, per stream, the collector's received + lost
    /// is at most what the agent sent (nothing to subtract, loss never counted early). Checked
    /// where both counters cover the same span: the agent's first life, the collector's
    /// first life, an agent id of its own. The collector is scraped first, so the agent's
    /// counter can only be ahead.
    pub fn check_in_flight(&mut self, i: usize) {
        let id = self.agents[i].spec.id.clone();
        let shared = self.agents.iter().filter(|a| a.spec.id == id).count() > 1;
        if shared || self.agents[i].lives.len() != 1 || self.collector_lives.len() != 1 {
            return;
        }
        let (Ok(c), Ok(a)) = (self.scrape_collector(), self.scrape_agent(i)) else {
            return;
        };
        let f = CollectorFigures::read(&c, &id);
        for st in STREAMS {
            let sent = a.count("uctel_agent_frames_sent_total", &[("stream", st)]);
            let seen = f.received[st] + f.lost[st];
            let prefix = format!("agent {id} stream {st}: at a scrape");
            if seen > sent && !self.failures.iter().any(|f| f.starts_with(&prefix)) {
                self.failures.push(format!(
                    "{prefix} the collector had received {} + lost {} = {seen} frames, more than the {sent} the agent had sent",
                    f.received[st], f.lost[st]
                ));
            }
        }
    }

    /// Waits until every line `seqs` of source `src` of agent `i` is in the sink. Returns
    /// false (and notes it) on timeout.
    pub fn wait_delivered(
        &mut self,
        i: usize,
        src: usize,
        seqs: std::ops::Range<u64>,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let (id, tag) = (
            self.agents[i].spec.id.clone(),
            self.agents[i].sources[src].src.clone(),
        );
        let mut have = 0;
        while Instant::now() < deadline {
            let d = Delivered::read(&self.sink, &self.name, self.seed);
            have = seqs.clone().filter(|s| d.has(&id, &tag, *s)).count() as u64;
            if have == seqs.end - seqs.start {
                return true;
            }
            let _ = self.scrape_collector();
            std::thread::sleep(TICK);
        }
        self.notes.push(format!(
            "{id}/{tag}: {have} of lines {seqs:?} in the sink after {timeout:?}"
        ));
        false
    }

    /// Samples the memory of every running daemon (kept for the verdict).
    pub fn sample_memory(&mut self) {
        let mut procs: Vec<(String, Option<u32>)> =
            vec![("collector".into(), self.collector.pid())];
        for a in &self.agents {
            procs.push((a.spec.name.clone(), a.daemon.pid()));
        }
        for (name, pid) in procs {
            let Some(pid) = pid else { continue };
            if let Some((rss, hwm)) = memory_kib(pid) {
                if hwm > MAX_HWM_KIB {
                    self.failures.push(format!(
                        "{name} (pid {pid}): peak RSS {hwm} KiB above the bound {MAX_HWM_KIB} KiB"
                    ));
                }
                let e = self.memory.entry(format!("{name}[{pid}]")).or_default();
                *e = (rss, e.1.max(hwm));
            }
        }
    }

    /// SIGKILL of agent `i` (its last scrape is what is known of that life).
    pub fn kill_agent(&mut self, i: usize) {
        let _ = self.scrape_agent(i);
        self.sample_memory();
        self.agents[i].daemon.kill();
    }

    /// SIGTERM of agent `i` and a wait for its clean exit (failure noted otherwise).
    pub fn stop_agent(&mut self, i: usize) {
        if !self.agents[i].daemon.is_running() {
            return;
        }
        if let Err(e) = self.scrape_agent(i) {
            self.failures.push(format!(
                "{}: /metrics not served before SIGTERM: {e}",
                self.agents[i].spec.name
            ));
        }
        self.sample_memory();
        let a = &mut self.agents[i];
        a.daemon.signal(Signal::SIGTERM);
        match a.daemon.wait_exit(Duration::from_secs(20)) {
            Some(st) if st.success() => {}
            Some(st) => self
                .failures
                .push(format!("{} exited with {st} after SIGTERM", a.spec.name)),
            None => {
                a.daemon.kill();
                self.failures.push(format!(
                    "{} did not exit within 20 s of SIGTERM",
                    a.spec.name
                ));
            }
        }
    }

    /// Waits until the collector has closed every session (`agents_connected == 0`); notes
    /// a timeout.
    pub fn wait_sessions_closed(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(s) = self.scrape_collector() {
                if s.count("uctel_collector_agents_connected", &[]) == 0 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.notes.push(format!(
            "collector: sessions still open {timeout:?} after the agents left"
        ));
    }

    /// Starts agent `i` again (same config and state directory): a new life.
    pub fn restart_agent(&mut self, i: usize) {
        let a = &mut self.agents[i];
        a.lives.push(Life::default());
        a.daemon.restart();
    }

    /// SIGKILL of the collector: its last scrape is what is known of that life.
    pub fn kill_collector(&mut self) {
        let _ = self.scrape_collector();
        self.sample_memory();
        self.collector.kill();
    }

    /// Starts the collector again: a new life with counters from zero; the frame rule
    /// counts from here (sessions with the old collector ended without Goodbye).
    pub fn restart_collector(&mut self) {
        self.collector_lives.push(Life::default());
        self.collector.restart();
        self.wait_collector_up();
        self.collector_log_mark = self.collector.log().len();
        self.frame_base = None;
        for a in &mut self.agents {
            a.log_mark = a.daemon.log().len();
        }
    }

    /// The frame rule counts from now: the collector's current figures are the base and
    /// only sessions logged from here on are compared (after an agent was killed and the
    /// collector closed its session).
    pub fn frame_baseline(&mut self) {
        self.frame_base = self.scrape_collector().ok();
        self.collector_log_mark = self.collector.log().len();
        for a in &mut self.agents {
            a.log_mark = a.daemon.log().len();
        }
    }

    /// Waits until the collector has closed every session (`agents_connected == 0`) and
    /// its counters stopped moving.
    pub fn wait_collector_idle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut prev: Option<String> = None;
        while Instant::now() < deadline {
            if let Ok(s) = self.scrape_collector() {
                let key: String = s
                    .samples
                    .iter()
                    .filter(|m| {
                        m.name.starts_with("uctel_collector_") && m.name.ends_with("_total")
                    })
                    .map(|m| format!("{}{:?}={};", m.name, m.labels, m.value))
                    .collect();
                if s.count("uctel_collector_agents_connected", &[]) == 0
                    && prev.as_deref() == Some(key.as_str())
                {
                    return;
                }
                prev = Some(key);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        self.notes.push(
            "collector: sessions still open or counters moving 20 s after the agents stopped"
                .into(),
        );
    }

    /// The README's quiescence: every running agent settles and gets SIGTERM (Goodbye), then
    /// the collector closes the sessions; `/metrics` must still be served.
    pub fn quiesce(&mut self) {
        for i in 0..self.agents.len() {
            if self.agents[i].daemon.is_running() {
                self.wait_settled(i, 0, self.allow.settle);
                self.stop_agent(i);
            }
        }
        if self.collector.is_running() {
            self.wait_collector_idle();
            self.sample_memory();
            if let Err(e) = self.scrape_collector() {
                self.failures.push(format!(
                    "collector: /metrics not served after the fault: {e}"
                ));
            }
        } else {
            self.failures
                .push("collector: not running at the end of the row".into());
        }
    }

    /// Σ over the Goodbye lines of agent id `id` since the baseline of `key`
    /// (`frames`, `logs_frames`, `fault_dropped`, …).
    pub fn goodbye_sum(&self, id: &str, key: &str) -> u64 {
        self.agents
            .iter()
            .filter(|a| a.spec.id == id)
            .flat_map(|a| goodbye_lines(a.daemon.log().get(a.log_mark..).unwrap_or("")))
            .filter_map(|g| g.get(key).copied())
            .sum()
    }

    /// The collector's figures for `id` now (last scrape of the current life).
    pub fn collector_figures(&self, id: &str) -> CollectorFigures {
        self.collector_lives
            .last()
            .and_then(|l| l.last.as_ref())
            .map(|s| CollectorFigures::read(s, id))
            .unwrap_or_default()
    }

    /// Agent `i`'s last scrape (of its current or last life).
    pub fn agent_last(&self, i: usize) -> Scrape {
        self.agents[i]
            .lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default()
    }

    /// The current collector life's last scrape.
    pub fn collector_last(&self) -> Scrape {
        self.collector_lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default()
    }

    /// Records a failed expectation about the fault itself (it must have happened).
    pub fn expect(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.notes.push(format!("ok: {what}"));
        } else {
            self.failures.push(format!("expected: {what}"));
        }
    }
}

/// How many sessions of agent `id` the collector log `log` welcomed (its `agent connected`
/// lines; a refusal that mentions the connected agent is not one).
pub fn welcomed_sessions(log: &str, id: &str) -> usize {
    let want = format!("agent={id}");
    log.lines()
        .map(strip_ansi)
        .filter(|l| {
            l.contains(": agent connected ")
                && l.split_whitespace().any(|t| t == want)
                && l.split_whitespace().any(|t| t.starts_with("epoch="))
        })
        .count()
}

/// Numeric fields of every `goodbye sent` line of an agent log, in order.
pub fn goodbye_lines(log: &str) -> Vec<BTreeMap<String, u64>> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("goodbye sent"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.split_once('='))
                .filter_map(|(k, v)| v.trim_matches('"').parse().ok().map(|n| (k.to_owned(), n)))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodbye_lines_are_all_read() {
        let log = "x goodbye sent epoch=1 frames=3 logs_frames=2\ny\nz goodbye sent frames=4 logs_frames=1 fault_dropped=2\n";
        let g = goodbye_lines(log);
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].get("fault_dropped"), Some(&2));
        assert_eq!(g.iter().filter_map(|m| m.get("frames")).sum::<u64>(), 7);
    }
}
