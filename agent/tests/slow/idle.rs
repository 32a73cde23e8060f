//! Idle means asleep (DESIGN.md §2): an agent whose collector is down (it retries with
//! backoff) and an agent connected to a collector with nothing to send but host metrics at a
//! long interval cost next to no CPU.
//!
//! CPU is `utime + stime` from procfs (10 ms ticks). With the collector down the process is
//! the agent plus an idle test harness (`/proc/self/stat`). Connected, the collector runs in
//! this process on its own runtime (threads `coll-rt`) and its data-plane threads
//! (`uctel-worker`, `uctel-soft0`): the agent's share is the process's CPU
//! minus those threads' (a collector thread that exited would count as the agent's: the
//! figure can only be too high). The tests run one at a time (a lock). The bound, 2 % of
//! one core, is far above the 0.1 % target and far below what a loop waking every few
//! hundred microseconds costs.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_agent::config::AgentConfig;
use uctel_agent::run::Options;
use uctel_agent::selfmetrics::SelfMetrics;
use uctel_testkit::wait::Outcome;
use uctel_testkit::{wait_for, RunningAgent, RunningCollector};

/// One test at a time: each measures the whole process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The measured window.
const WINDOW: Duration = Duration::from_secs(5);
/// Largest share of one core an idle agent may use over [`WINDOW`].
const MAX_IDLE_SHARE: f64 = 0.02;
/// Thread names of the in-process collector.
const COLLECTOR_THREADS: [&str; 3] = ["coll-rt", "uctel-worker", "uctel-soft0"];

fn ticks_of(stat: &str) -> u64 {
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    t(11) + t(12)
}

/// This process's CPU ticks so far.
fn process_ticks() -> u64 {
    ticks_of(&std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat"))
}

/// CPU ticks of this process's live threads named one of `names`.
fn threads_ticks(names: &[&str]) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            names.contains(&comm.trim_end())
        })
        .map(|e| ticks_of(&std::fs::read_to_string(e.path().join("stat")).unwrap_or_default()))
        .sum()
}

/// The share of one core the agent used over [`WINDOW`] (the process minus the collector's
/// threads).
fn agent_share() -> f64 {
    let (p, c) = (process_ticks(), threads_ticks(&COLLECTOR_THREADS));
    let start = Instant::now();
    std::thread::sleep(WINDOW);
    let used = (process_ticks() - p).saturating_sub(threads_ticks(&COLLECTOR_THREADS) - c);
    used as f64 / 100.0 / start.elapsed().as_secs_f64()
}

/// An agent with only its own and the host's metrics at long intervals, no log source and
/// no local `/metrics`, shipping to `control`.
fn agent_config(control: &str, dir: &Path) -> AgentConfig {
    let text = format!(
        "\
agent_id: idle-agent
collector:
  control: {control}
  reconnect_initial_seconds: 0.5
  reconnect_max_seconds: 30
transport:
  kind: soft
  soft:
    mtu_bytes: 4096
auth:
  token: idle-test-token-0123456789
sources:
  host_metrics:
    interval_seconds: 30
  self_metrics:
    interval_seconds: 30
  state_directory: {}
",
        dir.join("state").display()
    );
    AgentConfig::from_yaml("agent.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn collector_config(logs: &Path) -> uctel_collector::config::Config {
    let text = format!(
        "\
listen:
  control: 127.0.0.1:0
  metrics: 127.0.0.1:0
transport:
  kind: soft
  soft:
    bind: 127.0.0.1:0
    mtu_bytes: 4096
auth:
  shared:
    token: idle-test-token-0123456789
logs:
  sink: file
  file:
    path: {}
",
        logs.display()
    );
    uctel_common::config::from_str("collector.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the agent on its own runtime (threads `agent-rt`), apart from the collector's.
fn start_agent(
    config: AgentConfig,
    stats: Arc<SelfMetrics>,
) -> (tokio::runtime::Runtime, RunningAgent) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("agent-rt")
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        stats: Some(stats),
        metrics_listener: None,
        ..Options::default()
    };
    let agent = rt.block_on(async { RunningAgent::start_with(config, options) });
    (rt, agent)
}

#[test]
fn an_agent_whose_collector_is_down_sleeps() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A port nobody listens on: every attempt is refused, the agent backs off.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("{e}")));
    let (agent_rt, agent) = start_agent(
        agent_config(&format!("127.0.0.1:{port}"), dir.path()),
        stats.clone(),
    );
    // A deliberate pause, not a wait for a state: the start-up work (first collections,
    // first refused attempts) passes before the idle window is measured.
    std::thread::sleep(Duration::from_millis(500));
    let share = agent_share();
    eprintln!(
        "idle agent, collector down: {:.3} % of a core over {WINDOW:?}",
        share * 100.0
    );
    assert!(!stats.connected());
    let summary = agent_rt.block_on(agent.stop());
    assert_eq!(summary.sessions, 0, "{summary:?}");
    assert!(
        share < MAX_IDLE_SHARE,
        "an agent retrying a dead collector used {:.2} % of a core (bound {:.0} %)",
        share * 100.0,
        MAX_IDLE_SHARE * 100.0
    );
}

#[test]
fn a_connected_agent_with_nothing_to_send_sleeps() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let collector_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("coll-rt")
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let collector = collector_rt.block_on(RunningCollector::start(collector_config(
        &dir.path().join("logs.jsonl"),
    )));
    let stats = Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("{e}")));
    let (agent_rt, agent) = start_agent(
        agent_config(&collector.control_addr().to_string(), dir.path()),
        stats.clone(),
    );
    wait_for(
        "the agent connected",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || Outcome::into_result(stats.connected()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A deliberate pause, not a wait for a state: the first collections go out at start;
    // then nothing is due for 30 s, and the idle window starts after that burst.
    std::thread::sleep(Duration::from_secs(1));
    let share = agent_share();
    eprintln!(
        "idle agent, connected: {:.3} % of a core over {WINDOW:?}",
        share * 100.0
    );
    assert!(stats.connected(), "still connected");
    let summary = agent_rt.block_on(agent.stop());
    assert_eq!(summary.sessions, 1, "{summary:?}");
    collector_rt.block_on(collector.stop());
    assert!(
        share < MAX_IDLE_SHARE,
        "a connected agent with nothing to send used {:.2} % of a core (bound {:.0} %)",
        share * 100.0,
        MAX_IDLE_SHARE * 100.0
    );
}
