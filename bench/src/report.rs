//! The result of a run: every measurement, the targets as ratios measured in the same run,
//! the machine, and the command line; printed as a table and written as JSON.

use serde::Serialize;

use crate::agentcost::AgentCostResult;
use crate::idle::IdleResult;
use crate::limit::LimitResult;
use crate::nodecost::{NodeCostResult, NodeCostSide};
use crate::processing::ProcessingResult;
use crate::remotewrite::RemoteWriteResult;
use crate::softpath::SoftRunResult;
use crate::stats::{Goal, Verdict};

/// Bytes of collector memory allowed per agent on top of its ring (the target).
pub const PER_AGENT_OVERHEAD_BYTES: f64 = 64.0 * 1024.0;
/// Soft path frames/s at least this fraction of the UDP limit.
pub const SOFT_VS_LIMIT: f64 = 1.5;
/// Soft path frames per collector CPU-second against the plain limit's datagrams per
/// receiver CPU-second.
pub const SOFT_VS_LIMIT_PER_CORE: f64 = 2.0;
/// Jain fairness of the agents' frame rates at every K.
pub const JAIN_FAIRNESS: f64 = 0.95;
/// Collector RSS at the largest K of the default configuration, every ring fully written.
pub const COLLECTOR_RSS_BYTES: f64 = 4.0 * 1024.0 * 1024.0 * 1024.0;
/// Processing-only frames/s per core at least this multiple of the soft path's.
pub const PROCESSING_VS_SOFT: f64 = 10.0;
/// Agent CPU at most this percent of one core.
pub const AGENT_CPU_PERCENT: f64 = 1.0;
/// Agent RSS at most this many bytes.
pub const AGENT_RSS_BYTES: f64 = 20.0 * 1024.0 * 1024.0;
/// Largest share of one core an idle collector or agent may use, percent (the issue's
/// target: idle means asleep).
pub const IDLE_CPU_PERCENT: f64 = 0.1;
/// Remote-write: samples delivered per collector CPU-s ≥ this × vmagent's per vmagent CPU-s.
pub const REMOTE_WRITE_VS_VMAGENT: f64 = 1.0;
/// Node cost: agent CPU per host collection ≤ this × node_exporter's per scrape of the same
/// collectors (issue #18).
pub const NODE_COST_VS_NODE_EXPORTER: f64 = 0.3;

/// Fast counters: agent CPU at most this percent of one core (10 counters at 10 ms).
pub const FAST_CPU_PERCENT: f64 = 1.0;
/// Fast counters: p99 lateness at most this many µs.
pub const FAST_P99_LATENESS_US: f64 = 2000.0;
/// Aligned sampling: p99 of sample time − grid instant, µs (issue 46: within 1 ms).
pub const ALIGN_P99_US: f64 = 1000.0;

/// The machine the run was on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Logical CPUs available to the process.
    pub cores: usize,
    /// CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// Total memory, bytes.
    pub memory_bytes: u64,
    /// `/proc/loadavg` when the run started (1, 5, 15 minutes): other work sharing the
    /// cores skews wall-clock rates, less so per-CPU-second figures.
    pub loadavg: String,
}

impl Machine {
    /// Reads the machine description (missing facts are left empty).
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let loadavg = std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        Machine {
            loadavg,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            kernel,
            memory_bytes,
        }
    }
}

/// The perftest comparison from the Soft-RoCE VM suite (`tests/rxe/`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Perftest {
    /// Where the figures came from (a file, or why there are none).
    pub source: String,
    /// `BENCH verbs_send_uc_msg_rate`.
    pub verbs_msg_rate: Option<f64>,
    /// `BENCH perftest_send_uc_median_msg_rate` (or `perftest_send_uc_msg_rate`).
    pub perftest_msg_rate: Option<f64>,
    /// `BENCH verbs_vs_perftest_ratio`.
    pub ratio: Option<f64>,
}

impl Perftest {
    /// Reads the `BENCH <name> <value> ...` lines of the VM suite's output.
    pub fn parse(text: &str, source: &str) -> Perftest {
        let mut p = Perftest {
            source: source.to_string(),
            ..Perftest::default()
        };
        for line in text.lines() {
            let mut it = line.split_whitespace().skip_while(|w| *w != "BENCH");
            if it.next().is_none() {
                continue;
            }
            let (Some(name), Some(value)) = (it.next(), it.next()) else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            match name {
                "verbs_send_uc_msg_rate" => p.verbs_msg_rate = Some(v),
                "perftest_send_uc_median_msg_rate" => p.perftest_msg_rate = Some(v),
                "perftest_send_uc_msg_rate" if p.perftest_msg_rate.is_none() => {
                    p.perftest_msg_rate = Some(v)
                }
                "verbs_vs_perftest_ratio" => p.ratio = Some(v),
                _ => {}
            }
        }
        p
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The command line.
    pub command: String,
    /// Start time (RFC 3339, UTC).
    pub started_at: String,
    /// Wall seconds of the whole run.
    pub wall_seconds: f64,
    /// The machine.
    pub machine: Machine,
    /// The UDP limit.
    pub limit: Option<LimitResult>,
    /// The UDP limit with a `UDP_SEGMENT` sender and a `UDP_GRO` receiver (datagrams
    /// counted, not buffers).
    pub limit_gso: Option<LimitResult>,
    /// The headline soft-path run.
    pub soft: Option<SoftRunResult>,
    /// Processing only.
    pub processing: Option<ProcessingResult>,
    /// Scaling runs, by K.
    pub scaling: Vec<SoftRunResult>,
    /// Synchronized-burst runs, by K: every agent sends its whole credit at the same instant.
    pub bursts: Vec<SoftRunResult>,
    /// K agents at a host's rate each (issue 42, [`crate::fleet`]).
    pub fleet: Option<SoftRunResult>,
    /// K connected agents that only keep their sessions alive ([`crate::fleet`]).
    pub upkeep: Option<SoftRunResult>,
    /// The upkeep run with credit writes batched across agents and each alone.
    pub upkeep_batching: Option<crate::fleet::UpkeepBatching>,
    /// The largest K at the agents' default configuration (rings sized from the default
    /// `expected_frames_per_second`), for the collector's memory.
    pub memory: Option<SoftRunResult>,
    /// Agent cost.
    pub agent: Option<AgentCostResult>,
    /// Idle cost of both daemons, with node_exporter beside them.
    pub idle: Option<IdleResult>,
    /// Remote-write beside vmagent.
    pub remote_write: Option<RemoteWriteResult>,
    /// OTLP against remote-write, per collector CPU-s.
    pub otlp: Option<crate::otlpcost::OtlpCostResult>,
    /// Agent CPU per host collection beside node_exporter's per scrape.
    pub node_cost: Option<NodeCostResult>,
    /// The fast_counters source's CPU and lateness.
    pub fast_cost: Option<crate::fastcost::FastCostResult>,
    /// Aligned sampling: sample times of several agents against the epoch grid.
    pub align: Option<crate::align::AlignResult>,
    /// The series dictionary against protobuf metrics frames (`--only dict`).
    #[serde(default)]
    pub dict_cost: Option<crate::dictcost::DictCostResult>,
    /// Bytes per log record with and without a log dictionary (`--only log-dict`).
    pub log_dict: Option<crate::logdict::LogDictResult>,
    /// The soft path with both payload forms alternated (`--form-rounds`).
    pub soft_forms: Option<crate::forms::SoftForms>,
    /// Lines per agent CPU-second of the journald source against the file tailer's.
    pub journal_cost: Option<crate::journalcost::JournalCostResult>,
    /// The reliability trade-off: UC and RC at each injected loss rate.
    pub tradeoff: Vec<crate::tradeoff::TradeoffRow>,
    /// VM-suite perftest comparison.
    pub perftest: Perftest,
    /// Targets with verdicts.
    pub targets: Vec<Target>,
    /// Parts that failed, with the error.
    pub failures: Vec<(String, String)>,
}

pub use crate::stats::Target;

impl Report {
    /// The runs with many agents, labelled: scaling, synchronized bursts, default config.
    fn runs_at_scale(&self) -> impl Iterator<Item = (&'static str, &SoftRunResult)> {
        self.scaling
            .iter()
            .map(|s| ("scaling", s))
            .chain(self.bursts.iter().map(|s| ("burst", s)))
            .chain(self.memory.iter().map(|s| ("default config", s)))
            .chain(self.fleet.iter().map(|s| ("fleet", s)))
            .chain(self.upkeep.iter().map(|s| ("upkeep", s)))
    }

    /// Computes the targets from the measurements present.
    pub fn check_targets(&mut self) {
        let mut t = Vec::new();
        if let (Some(l), Some(s)) = (&self.limit, &self.soft) {
            t.push(Target {
                name: format!("soft path vs UDP limit, wall (K = {})", s.agents),
                rule: format!("frames/s ≥ {SOFT_VS_LIMIT} × limit msg/s"),
                verdict: Verdict::check(
                    ratio(s.frames_per_sec, l.msgs_per_sec),
                    SOFT_VS_LIMIT,
                    Goal::AtLeast,
                ),
            });
            t.push(Target {
                name: format!("soft path vs UDP limit, per core (K = {})", s.agents),
                rule: format!(
                    "frames per collector CPU-s ≥ {SOFT_VS_LIMIT_PER_CORE} × msgs per receiver CPU-s"
                ),
                verdict: Verdict::check(
                    ratio(s.frames_per_core_sec, l.msgs_per_core_sec),
                    SOFT_VS_LIMIT_PER_CORE,
                    Goal::AtLeast,
                ),
            });
        }
        if let (Some(p), Some(s)) = (&self.processing, &self.soft) {
            t.push(Target {
                name: "processing only vs soft path, per core".into(),
                rule: format!("ingest frames per CPU-s ≥ {PROCESSING_VS_SOFT} × soft path's"),
                verdict: Verdict::check(
                    ratio(p.ingest.frames_per_core_sec, s.frames_per_core_sec),
                    PROCESSING_VS_SOFT,
                    Goal::AtLeast,
                ),
            });
        }
        if let Some(big) = self.scaling.iter().max_by_key(|r| r.agents) {
            // A ring page is resident once written; a steady-state collector has written all
            // of it. So the bound is checked on the measured memory with the unwritten part of
            // the ring added back: overhead besides the ring ≤ 64 KiB.
            let steady = big.overhead_per_agent_bytes + big.ring_bytes as f64;
            let bound = big.ring_bytes as f64 + PER_AGENT_OVERHEAD_BYTES;
            t.push(Target {
                name: format!("collector memory per agent (K = {})", big.agents),
                rule: format!(
                    "RSS delta / K with the ring fully written ≤ ring ({}) + 64 KiB",
                    bytes(big.ring_bytes as f64)
                ),
                verdict: Verdict::check(steady, bound, Goal::AtMost),
            });
        }
        for (what, s) in self.runs_at_scale() {
            t.push(Target {
                name: format!("no loss in the socket buffer ({what} K = {})", s.agents),
                rule: "kernel socket drops + frames lost = 0 (no fault injected)".into(),
                verdict: Verdict::check(
                    s.socket_drops.map_or(f64::NAN, |d| d as f64) + s.accounting.lost,
                    0.0,
                    Goal::AtMost,
                ),
            });
            if what == "scaling" && s.agents > 1 {
                t.push(Target {
                    name: format!("fairness (K = {})", s.agents),
                    rule: format!("Jain index of per-agent frames/s ≥ {JAIN_FAIRNESS}"),
                    verdict: Verdict::check(
                        s.fairness.map_or(f64::NAN, |f| f.jain),
                        JAIN_FAIRNESS,
                        Goal::AtLeast,
                    ),
                });
            }
            if what != "burst" {
                t.push(Target {
                    name: format!("unaccounted frames ({what} K = {})", s.agents),
                    rule: "sent − received − lost − dropped after tracking = 0".into(),
                    verdict: Verdict::check(s.accounting.unaccounted.abs(), 0.0, Goal::AtMost),
                });
            }
        }
        if let Some(m) = &self.memory {
            let steady = m.rss_baseline_bytes as f64
                + m.agents as f64 * (m.overhead_per_agent_bytes + m.ring_bytes as f64);
            t.push(Target {
                name: format!("collector RSS at K = {} (default agent config)", m.agents),
                rule: "baseline + K × (other + ring fully written) ≤ 4 GiB".into(),
                verdict: Verdict::check(steady, COLLECTOR_RSS_BYTES, Goal::AtMost),
            });
        }
        if let Some(a) = &self.agent {
            t.push(Target {
                name: "agent CPU".into(),
                rule: format!("≤ {AGENT_CPU_PERCENT} % of one core"),
                verdict: Verdict::check(a.cpu_percent, AGENT_CPU_PERCENT, Goal::AtMost),
            });
            t.push(Target {
                name: "agent RSS".into(),
                rule: "≤ 20 MiB".into(),
                verdict: Verdict::check(a.rss_bytes as f64, AGENT_RSS_BYTES, Goal::AtMost),
            });
        }
        if let Some(i) = &self.idle {
            for (phase, what, name) in [
                ("disconnected", "collector", "idle collector, no agent"),
                ("connected", "collector", "idle collector, one quiet agent"),
                ("disconnected", "agent", "idle agent, collector down"),
                ("connected", "agent", "idle agent, connected"),
            ] {
                if let Some(p) = i.find(phase, what) {
                    t.push(Target {
                        name: name.into(),
                        rule: format!("≤ {IDLE_CPU_PERCENT} % of one core over {:.0} s", i.seconds),
                        verdict: Verdict::check(p.cpu_percent, IDLE_CPU_PERCENT, Goal::AtMost),
                    });
                }
            }
        }
        if let Some(v) = self
            .remote_write
            .as_ref()
            .and_then(|r| r.vmagent.as_ref().map(|v| (r, v)))
        {
            let (r, v) = v;
            t.push(Target {
                name: "remote-write vs vmagent, per core".into(),
                rule: format!(
                    "samples delivered per collector CPU-s ≥ {REMOTE_WRITE_VS_VMAGENT} × vmagent's per vmagent CPU-s"
                ),
                verdict: Verdict::check(
                    ratio(r.uctel.samples_per_core_sec, v.samples_per_core_sec),
                    REMOTE_WRITE_VS_VMAGENT,
                    Goal::AtLeast,
                ),
            });
        }
        if let Some(n) = &self.node_cost {
            t.push(Target {
                name: "agent CPU per host collection vs node_exporter per scrape".into(),
                rule: format!(
                    "≤ {NODE_COST_VS_NODE_EXPORTER} × node_exporter's (the agent's collectors only)"
                ),
                verdict: Verdict::check(
                    n.ratio_per_collection(true),
                    NODE_COST_VS_NODE_EXPORTER,
                    Goal::AtMost,
                ),
            });
            t.push(Target {
                name: "agent CPU per series vs node_exporter per series".into(),
                rule: format!(
                    "≤ {NODE_COST_VS_NODE_EXPORTER} × node_exporter's (the agent's collectors only)"
                ),
                verdict: Verdict::check(
                    n.ratio_per_series(true),
                    NODE_COST_VS_NODE_EXPORTER,
                    Goal::AtMost,
                ),
            });
        }
        if let Some(f) = &self.fast_cost {
            let what = format!("{} counters every {:.0} ms", f.counters, f.interval_ms);
            t.push(Target {
                name: format!("agent CPU, fast_counters ({what})"),
                rule: format!("≤ {FAST_CPU_PERCENT} % of one core"),
                verdict: Verdict::check(f.cpu_percent(), FAST_CPU_PERCENT, Goal::AtMost),
            });
            t.push(Target {
                name: format!("fast_counters lateness p99 ({what})"),
                rule: format!("≤ {FAST_P99_LATENESS_US} µs"),
                verdict: Verdict::check(f.lateness(0.99), FAST_P99_LATENESS_US, Goal::AtMost),
            });
        }
        if let Some(a) = &self.align {
            use crate::align::AlignResult as A;
            t.push(Target {
                name: format!(
                    "aligned sampling: fast counter samples from the grid, p99 ({} agents)",
                    a.agents
                ),
                rule: format!("≤ {ALIGN_P99_US} µs (issue 46)"),
                verdict: Verdict::check(A::q(&a.fast_error_us, 0.99), ALIGN_P99_US, Goal::AtMost),
            });
        }
        t.extend(self.soft_forms.iter().flat_map(|f| f.targets()));
        t.extend(
            self.remote_write
                .iter()
                .flat_map(crate::remotewrite::dict_targets),
        );
        t.extend(crate::fleet::targets(
            &self.scaling,
            self.fleet.as_ref(),
            self.upkeep.as_ref(),
        ));
        self.targets = t;
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut rows: Vec<[String; 4]> = Vec::new();
        let row = |a: String, b: String, c: String, d: String| [a, b, c, d];
        if let Some(l) = &self.limit {
            rows.push(row(
                format!("UDP limit: recvmmsg sink, {} B datagrams", l.datagram_bytes),
                format!("{} msg/s", si(l.msgs_per_sec)),
                format!("{} msg per receiver CPU-s", si(l.msgs_per_core_sec)),
                format!(
                    "sender offered {} msg/s",
                    si(l.sent as f64 / l.seconds.max(1e-9))
                ),
            ));
        }
        if let Some(l) = &self.limit_gso {
            let per_buffer = l.received as f64 / (l.gro_buffers.max(1) as f64);
            rows.push(row(
                format!(
                    "UDP limit: UDP_SEGMENT sender, UDP_GRO sink, {} B datagrams",
                    l.datagram_bytes
                ),
                format!("{} msg/s", si(l.msgs_per_sec)),
                format!("{} msg per receiver CPU-s", si(l.msgs_per_core_sec)),
                format!(
                    "sender offered {} msg/s; {per_buffer:.1} datagrams per GRO buffer",
                    si(l.sent as f64 / l.seconds.max(1e-9))
                ),
            ));
        }
        if let Some(s) = &self.soft {
            rows.push(soft_row("soft path", s, self.limit.as_ref()));
            rows.push(row(
                "  collector CPU by thread".into(),
                format!("{:.2} cores", s.collector_cpu.cores),
                threads(&s.collector_cpu),
                String::new(),
            ));
            if let Some(g) = &s.generator_cpu {
                rows.push(row(
                    "  load generator CPU by thread (same machine)".into(),
                    format!("{:.2} cores", g.cores),
                    threads(g),
                    String::new(),
                ));
            }
            rows.push(row(
                "  loss and drops (whole run)".into(),
                format!(
                    "sent {} = received {} + lost {} + dropped after tracking {}",
                    s.accounting.sent,
                    s.accounting.received,
                    s.accounting.lost,
                    s.accounting.dropped_after_tracking
                ),
                format!("unaccounted {}", s.accounting.unaccounted),
                format!("dropped (also in lost): {}", reasons(&s.accounting.dropped)),
            ));
        }
        if let Some(f) = &self.soft_forms {
            rows.extend(f.rows());
        }
        if let Some(p) = &self.processing {
            let vs = self.soft.as_ref().map_or(String::new(), |s| {
                format!(
                    "{:.1}× soft path per core",
                    ratio(p.ingest.frames_per_core_sec, s.frames_per_core_sec)
                )
            });
            rows.push(row(
                "processing only (validate+track+decode+store)".into(),
                format!(
                    "{} frames per CPU-s ({} samples)",
                    si(p.ingest.frames_per_core_sec),
                    si(p.samples_per_core_sec)
                ),
                vs,
                format!("{:.0} ns/frame", p.ingest.ns_per_frame),
            ));
            for st in [&p.check, &p.decode] {
                rows.push(row(
                    format!("  {}", st.what),
                    format!("{} frames per CPU-s", si(st.frames_per_core_sec)),
                    String::new(),
                    format!("{:.0} ns/frame", st.ns_per_frame),
                ));
            }
        }
        for (what, s) in self.runs_at_scale() {
            rows.push(soft_row(
                &format!("{what} K = {}", s.agents),
                s,
                self.limit.as_ref(),
            ));
            rows.push(row(
                format!("  credit budget, socket ({what} K = {})", s.agents),
                format!(
                    "budget {} frames; rings {}–{} slots{}",
                    s.credit_budget_frames,
                    s.ring_slots.0,
                    s.ring_slots.1,
                    if s.bursts > 0 {
                        format!("; {} bursts", s.bursts)
                    } else {
                        String::new()
                    }
                ),
                format!(
                    "kernel socket drops {}",
                    s.socket_drops.map_or("unknown".into(), |d| d.to_string())
                ),
                format!(
                    "sent {} = received {} + lost {} + dropped after tracking {}",
                    s.accounting.sent,
                    s.accounting.received,
                    s.accounting.lost,
                    s.accounting.dropped_after_tracking
                ),
            ));
            let fair = s.fairness.map_or("no data".into(), |f| {
                format!(
                    "per agent min {} max {} frames/s, Jain {:.3}",
                    si(f.min),
                    si(f.max),
                    f.jain
                )
            });
            rows.push(row(
                format!("  memory, fairness (K = {})", s.agents),
                format!(
                    "{} per agent = ring written {} + other {}",
                    bytes(s.memory_per_agent_bytes),
                    bytes(s.ring_touched_per_agent_bytes),
                    bytes(s.overhead_per_agent_bytes)
                ),
                format!("ring {} + 64 KiB allowed", bytes(s.ring_bytes as f64)),
                fair,
            ));
        }
        if let Some(u) = &self.upkeep {
            rows.push(row(
                format!("upkeep K = {}", u.agents),
                crate::fleet::upkeep_line(u),
                String::new(),
                String::new(),
            ));
        }
        if let Some(b) = &self.upkeep_batching {
            rows.push(row(
                format!("upkeep K = {}, credit writes batched", b.batched.agents),
                b.line(),
                "ratio in one run (< 1: batching saves)".into(),
                String::new(),
            ));
        }
        if let Some(a) = &self.agent {
            rows.push(row(
                "agent (real uctel-agent)".into(),
                format!(
                    "{:.2} % of a core, RSS {} (peak {})",
                    a.cpu_percent,
                    bytes(a.rss_bytes as f64),
                    bytes(a.hwm_bytes as f64)
                ),
                format!(
                    "{} samples/s + {} lines/s delivered",
                    si(a.samples_per_sec),
                    si(a.log_lines_per_sec)
                ),
                format!(
                    "target {} samples/s + {} lines/s",
                    si(a.target_samples_per_sec),
                    si(a.target_log_lines_per_sec)
                ),
            ));
        }
        if let Some(i) = &self.idle {
            for p in &i.processes {
                let node = i
                    .find(&p.phase, "node_exporter")
                    .filter(|n| !std::ptr::eq(*n, p))
                    .map_or(String::new(), |n| {
                        format!("node_exporter {:.3} % in the same window", n.cpu_percent)
                    });
                rows.push(row(
                    format!("idle {:.0} s ({}): {}", i.seconds, p.phase, p.what),
                    format!("{:.3} % of a core", p.cpu_percent),
                    node,
                    idle_threads(&p.cpu),
                ));
            }
            rows.push(row(
                "  load average at each phase's start".into(),
                i.loadavg.join("; "),
                String::new(),
                format!("node_exporter: {}", i.node_exporter),
            ));
        }
        if let Some(o) = &self.otlp {
            rows.extend(o.rows());
        }
        if let Some(r) = &self.remote_write {
            let vs = r.vmagent.as_ref().map_or_else(
                || {
                    format!(
                        "vmagent not run: {}",
                        r.vmagent_error.clone().unwrap_or_default()
                    )
                },
                |v| {
                    format!(
                        "{:.2}× vmagent ({} samples/s, {} per vmagent CPU-s)",
                        ratio(r.uctel.samples_per_core_sec, v.samples_per_core_sec),
                        si(v.samples_per_sec),
                        si(v.samples_per_core_sec)
                    )
                },
            );
            rows.push(row(
                format!(
                    "remote-write into VictoriaMetrics: K = {}, {} series",
                    r.agents, r.series
                ),
                format!(
                    "{} samples/s; {} per collector CPU-s",
                    si(r.uctel.samples_per_sec),
                    si(r.uctel.samples_per_core_sec)
                ),
                vs,
                format!("offered {} samples/s", si(r.offered_per_sec)),
            ));
            if let Some(b) = &r.baseline {
                rows.push(row(
                    "  marginal: collector CPU with remote-write − without".into(),
                    format!("{:.2} − {:.2} cores", r.uctel.cpu.cores, b.cores),
                    r.marginal_samples_per_core_sec
                        .map_or("no difference measured".into(), |m| {
                            format!("{} samples per extra CPU-s", si(m))
                        }),
                    threads(b),
                ));
            }
            rows.push(row(
                "  collector CPU by thread".into(),
                format!("{:.2} cores", r.uctel.cpu.cores),
                threads(&r.uctel.cpu),
                r.vmagent.as_ref().map_or(String::new(), |v| {
                    format!("vmagent {:.2} cores", v.cpu.cores)
                }),
            ));
            let a = &r.accounting;
            rows.push(row(
                "  remote-write accounting (whole run)".into(),
                format!(
                    "in {} = sent {} + dropped {} + failed {} + pending {}",
                    a.samples_in,
                    a.sent,
                    a.dropped.values().sum::<f64>(),
                    a.failed.values().sum::<f64>(),
                    a.pending
                ),
                format!("unaccounted {}", a.unaccounted),
                format!("dropped: {}", reasons(&a.dropped)),
            ));
            rows.extend(crate::remotewrite::dict_rows(r));
        }
        if let Some(n) = &self.node_cost {
            rows.push(row(
                format!(
                    "node cost, {} collections every {:.1} s: {}",
                    n.agent.collections, n.interval_seconds, n.agent.what
                ),
                node_cost_value(&n.agent, "collection"),
                format!(
                    "{} series stored at the collector, {:.1} frames per collection",
                    n.agent_series_stored,
                    n.agent.frames_per_collection(n.agent_frames)
                ),
                slowest(&n.agent),
            ));
            for (same, s) in [(false, &n.node_defaults), (true, &n.node_same_collectors)] {
                rows.push(row(
                    format!("  {}, scraped", s.what),
                    node_cost_value(s, "scrape"),
                    format!(
                        "agent/node_exporter {:.2} per collection, {:.2} per series",
                        n.ratio_per_collection(same),
                        n.ratio_per_series(same)
                    ),
                    format!(
                        "{} body, {:.1} ms wall per scrape; {}",
                        bytes(s.bytes_per_collection),
                        s.wall_us_per_collection / 1e3,
                        slowest(s)
                    ),
                ));
            }
            rows.push(row(
                "  node cost: scrape encoding, load average".into(),
                n.encoding.clone(),
                format!("load average {}", n.loadavg),
                format!("node_exporter: {}", n.node_exporter),
            ));
        }
        if let Some(j) = &self.journal_cost {
            rows.push(row(
                format!("journald source, {} lines", j.lines),
                format!(
                    "{:.0} lines per agent CPU-s ({:.0} with journalctl's CPU)",
                    j.journald_lines_per_cpu_s(),
                    j.journald_with_journalctl_lines_per_cpu_s()
                ),
                format!(
                    "file tailer {:.0} lines per CPU-s: journald/file {:.2} (agent), {:.2} (with journalctl)",
                    j.file_lines_per_cpu_s(),
                    j.journald_lines_per_cpu_s() / j.file_lines_per_cpu_s(),
                    j.journald_with_journalctl_lines_per_cpu_s() / j.file_lines_per_cpu_s()
                ),
                format!(
                    "agent {:.2} CPU-s + journalctl {:.2} CPU-s vs {:.2} CPU-s",
                    j.journald.cpu_seconds, j.journalctl_cpu_seconds, j.file.cpu_seconds
                ),
            ));
        }
        if let Some(f) = &self.fast_cost {
            rows.push(row(
                format!(
                    "fast counters, {} counters every {:.0} ms",
                    f.counters, f.interval_ms
                ),
                format!(
                    "{:.2} % of a core (without the source {:.2} %)",
                    f.cpu_percent(),
                    f.without_source.cores * 100.0
                ),
                format!(
                    "lateness p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs; {} missed rounds",
                    f.lateness(0.5),
                    f.lateness(0.99),
                    f.lateness(0.999),
                    f.missed_rounds
                ),
                format!(
                    "samples in the window: taken {}, received {}, lost {}; {}",
                    f.samples_taken,
                    f.samples_received,
                    f.samples_lost,
                    threads(&f.with_source)
                ),
            ));
        }
        if let Some(a) = &self.align {
            use crate::align::AlignResult as A;
            let q3 = |v: &[(f64, f64)], unit: &str| {
                format!(
                    "p50 {:.0} {unit}, p99 {:.0} {unit}, p99.9 {:.0} {unit}",
                    A::q(v, 0.5),
                    A::q(v, 0.99),
                    A::q(v, 0.999)
                )
            };
            rows.push(row(
                format!(
                    "aligned sampling, {} agents, {:.0} ms fast counters, {:.0} s host metrics, {:.0} s",
                    a.agents, a.fast_interval_ms, a.host_interval_s, a.duration_s
                ),
                format!(
                    "fast from grid {} ({:.2} % within 1 ms, {} samples)",
                    q3(&a.fast_error_us, "µs"),
                    a.fast_within_1ms * 100.0,
                    a.fast_samples
                ),
                format!(
                    "host from grid {} ({:.2} % within 1 ms, {} collections); spread across agents {}",
                    q3(&a.host_error_ms, "ms"),
                    a.host_within_1ms * 100.0,
                    a.host_samples,
                    q3(&a.spread_us, "µs")
                ),
                format!(
                    "drift {:.0} µs; {} missed instants; baseline sleeping thread {} (agent p99 = {:.2} × baseline p99); {}",
                    a.drift_us,
                    a.missed_instants,
                    q3(&a.baseline_error_us, "µs"),
                    crate::stats::ratio(A::q(&a.fast_error_us, 0.99), A::q(&a.baseline_error_us, 0.99)),
                    a.realtime_baseline_error_us.as_ref().map_or_else(
                        || "no SCHED_FIFO baseline (refused to this process)".to_owned(),
                        |r| format!(
                            "SCHED_FIFO sleeping thread {} (agent p99 = {:.2} × its p99)",
                            q3(r, "µs"),
                            crate::stats::ratio(A::q(&a.fast_error_us, 0.99), A::q(r, 0.99))
                        )
                    )
                ),
            ));
        }
        let p = &self.perftest;
        rows.push(row(
            "Soft-RoCE VM: verbs sender vs perftest (UC Send 1 KiB)".into(),
            p.ratio.map_or("not measured in this run".into(), |r| {
                format!("{r:.2}× perftest")
            }),
            match (p.verbs_msg_rate, p.perftest_msg_rate) {
                (Some(v), Some(q)) => format!("ours {} msg/s, perftest {} msg/s", si(v), si(q)),
                (None, Some(q)) => format!("perftest {} msg/s", si(q)),
                _ => String::new(),
            },
            p.source.clone(),
        ));

        let mut out = String::new();
        out.push_str(&table(
            &["measure", "value", "compared with", "notes"],
            &rows,
        ));
        out.push('\n');
        let trows: Vec<[String; 4]> = self
            .targets
            .iter()
            .map(|t| {
                [
                    t.name.clone(),
                    t.rule.clone(),
                    match t.verdict.goal {
                        Goal::AtLeast => format!("{:.3}", t.verdict.value),
                        Goal::AtMost if t.name.contains("RSS") || t.name.contains("memory") => {
                            bytes(t.verdict.value)
                        }
                        Goal::AtMost => format!("{:.2}", t.verdict.value),
                    },
                    t.verdict.describe(),
                ]
            })
            .collect();
        out.push_str(&table(&["target", "rule", "measured", "verdict"], &trows));
        if !self.tradeoff.is_empty() {
            out.push('\n');
            out.push_str(&crate::tradeoff::render(&self.tradeoff));
        }
        for (what, e) in &self.failures {
            out.push_str(&format!("\nFAILED {what}: {e}"));
        }
        out.push_str(&format!(
            "\nmachine: {} cores ({}), kernel {}, {} RAM, load average at start {}; run took {:.0} s\ncommand: {}\n",
            self.machine.cores,
            self.machine.cpu_model,
            self.machine.kernel,
            bytes(self.machine.memory_bytes as f64),
            self.machine.loadavg,
            self.wall_seconds,
            self.command
        ));
        out
    }
}

fn soft_row(label: &str, s: &SoftRunResult, limit: Option<&LimitResult>) -> [String; 4] {
    let vs = limit.map_or(String::new(), |l| {
        format!(
            "{:.2}× limit (wall), {:.2}× limit per core",
            ratio(s.frames_per_sec, l.msgs_per_sec),
            ratio(s.frames_per_core_sec, l.msgs_per_core_sec)
        )
    });
    [
        format!(
            "{label}: K = {} agents, {} B frames",
            s.agents, s.frame_bytes
        ),
        format!(
            "{} frames/s, {} samples/s; {} frames per collector CPU-s",
            si(s.frames_per_sec),
            si(s.samples_per_sec),
            si(s.frames_per_core_sec)
        ),
        vs,
        format!(
            "window: lost {}, dropped {}, offered {}",
            s.frames_lost, s.frames_dropped, s.frames_offered
        ),
    ]
}

fn threads(c: &crate::cpu::CpuDelta) -> String {
    let mut v: Vec<(&String, &f64)> = c.by_thread.iter().filter(|(_, s)| **s > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter()
        .map(|(n, s)| format!("{n} {:.2}", *s / c.wall_seconds.max(1e-9)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU milliseconds by thread, busiest first (idle processes use a few ticks at most).
fn idle_threads(c: &crate::cpu::CpuDelta) -> String {
    let mut v: Vec<(&String, &f64)> = c.by_thread.iter().filter(|(_, s)| **s > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    let threads: Vec<String> = v
        .iter()
        .map(|(n, s)| format!("{n} {:.0} ms", **s * 1000.0))
        .collect();
    format!(
        "{:.0} ms of CPU{}{}",
        c.cpu_seconds * 1000.0,
        if threads.is_empty() { "" } else { ": " },
        threads.join(", ")
    )
}

/// CPU per collection (schedstat, and ticks), series, per series.
fn node_cost_value(s: &NodeCostSide, per: &str) -> String {
    format!(
        "{:.0} µs CPU per {per} (ticks: {:.0} µs), {:.0} series ({:.0}–{:.0}), {:.1} µs per series",
        s.us_per_collection(),
        s.cpu_us_per_collection,
        s.series_per_collection,
        s.series_min_max.0,
        s.series_min_max.1,
        s.ns_per_series() / 1e3
    )
}

/// The slowest sub-collectors by their own `node_scrape_collector_duration_seconds`.
fn slowest(s: &NodeCostSide) -> String {
    let top: Vec<String> = s
        .slowest_collectors
        .iter()
        .map(|(c, d)| format!("{c} {:.2}", d * 1e3))
        .collect();
    format!(
        "collectors {:.1} ms wall in all; slowest (ms): {}",
        s.collectors_seconds * 1e3,
        top.join(", ")
    )
}

fn reasons(m: &std::collections::BTreeMap<String, f64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub use crate::stats::ratio;

pub use crate::stats::si;

/// `1.5 MiB`, `64.0 KiB`, `12 B`.
pub fn bytes(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "n/a".into()
    } else if a >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", v / (1024.0 * 1024.0 * 1024.0))
    } else if a >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", v / (1024.0 * 1024.0))
    } else if a >= 1024.0 {
        format!("{:.1} KiB", v / 1024.0)
    } else {
        format!("{v:.0} B")
    }
}

pub use crate::stats::table;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_lines_are_read() {
        let text = "SCENARIO verbs_send_bench PASS ok\n[  12.3] BENCH verbs_send_uc_msg_rate 4100 msg/s\nBENCH perftest_send_uc_median_msg_rate 5000 msg/s\nBENCH verbs_vs_perftest_ratio 0.82\nBENCH garbage x\n";
        let p = Perftest::parse(text, "serial.log");
        assert_eq!(p.verbs_msg_rate, Some(4100.0));
        assert_eq!(p.perftest_msg_rate, Some(5000.0));
        assert_eq!(p.ratio, Some(0.82));
        assert_eq!(p.source, "serial.log");
    }

    #[test]
    fn si_and_bytes() {
        assert_eq!(si(1_234_567.0), "1.23 M");
        assert_eq!(si(45_600.0), "46 k");
        assert_eq!(si(1_500.0), "1.5 k");
        assert_eq!(si(12.0), "12");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
    }

    #[test]
    fn tables_align() {
        let t = table(&["a", "bb"], &[["xxx".into(), "y".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines
            .iter()
            .all(|l| l.chars().count() == lines[0].chars().count()));
    }
}
