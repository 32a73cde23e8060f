//! End to end with the real collector (its library, in-process, on loopback with the soft
//! RoCEv2 transport), both configured from the examples in `config/`: this machine's host
//! metrics appear on the collector's `/metrics` under node_exporter names with the agent's
//! `agent` and `instance` labels, log lines reach the collector's log sink, and after the
//! agent's `Goodbye` the accounting is exact on both sides — with and without injected loss:
//! per stream, frames the agent sent = collector accepted + lost, records likewise.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use uctel_agent::config::AgentConfig;
use uctel_agent::selfmetrics::SelfMetrics;
use uctel_agent::stream::Stream;
use uctel_testkit::exposition::{scrape, Scrape};
use uctel_testkit::wait::until;
use uctel_testkit::{RunningAgent, RunningCollector};

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `config/collector.yaml` with every listener on an ephemeral loopback port and the log
/// sink writing to `logs`.
fn collector_config(logs: &Path) -> uctel_collector::config::Config {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("collector.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["listen"]["control"] = "127.0.0.1:0".into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    v["transport"]["soft"]["bind"] = "127.0.0.1:0".into();
    v["logs"]["sink"] = "file".into();
    v["logs"]["file"]["path"] = logs.display().to_string().into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    uctel_common::config::from_str("collector.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// `config/agent.yaml` pointed at `control`, fast intervals, logs and state in `dir`.
fn agent_config(control: std::net::SocketAddr, dir: &Path, drop_ratio: f64) -> AgentConfig {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["collector"]["control"] = control.to_string().into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    v["sources"]["host_metrics"]["interval_seconds"] = 0.25.into();
    v["sources"]["self_metrics"]["interval_seconds"] = 0.25.into();
    v["sources"]["logs"][0]["path"] = format!("{}/*.log", dir.display()).into();
    v["sources"]["logs"][0]["start_at"] = "beginning".into();
    v["sources"]["logs"][0]["poll_interval_seconds"] = 0.02.into();
    v["sources"]["state_directory"] = dir.join("state").display().to_string().into();
    v["streams"]["metrics"]["flush_milliseconds"] = 20.into();
    v["streams"]["logs"]["flush_milliseconds"] = 20.into();
    v["transport"]["soft"]["fault"]["drop_ratio"] = drop_ratio.into();
    v["transport"]["soft"]["fault"]["seed"] = 7.into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    AgentConfig::from_yaml("agent.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Series names the collector must serve for this agent: node_exporter names and the
/// agent's own counters.
const WANTED: [&str; 6] = [
    "node_cpu_seconds_total",
    "node_memory_MemAvailable_bytes",
    "node_network_receive_bytes_total",
    "node_load1",
    "node_filesystem_avail_bytes",
    "uctel_agent_frames_sent_total",
];

/// Whether the scrape has a sample of `name` labelled with this agent and its host.
fn has_series(s: &Scrape, name: &str, host: &str) -> bool {
    s.has(name, &[("agent", "demo-agent"), ("instance", host)])
}

struct Outcome {
    stats: Arc<SelfMetrics>,
    ledger: Vec<(u32, uctel_collector::ingest::StreamLedger)>,
    scraped: Scrape,
    log_sink: String,
    lines: Vec<String>,
}

async fn run_pipeline(drop_ratio: f64, min_frames: u64) -> Outcome {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sink = dir.path().join("received.jsonl");
    let collector = RunningCollector::start(collector_config(&sink)).await;
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap_or_else(|e| panic!("{e}"));
    let cfg = agent_config(collector.control_addr(), dir.path(), drop_ratio);
    let agent = RunningAgent::start(cfg);
    let stats = agent.stats.clone();
    until("the agent connected", Duration::from_secs(10), || {
        stats.connected()
    })
    .await;
    let lines: Vec<String> = (0..200).map(|i| format!("e2e log line {i}")).collect();
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let frames = |s: &SelfMetrics| Stream::ALL.iter().map(|x| s.frames_sent(*x)).sum::<u64>();
    until("frames sent", Duration::from_secs(20), || {
        let n = frames(&stats);
        if n >= min_frames && stats.records_sent(Stream::Logs) >= 200 {
            Ok(())
        } else {
            Err(format!(
                "{n} frames, {} log records",
                stats.records_sent(Stream::Logs)
            ))
        }
    })
    .await;
    // Host metrics are visible on the collector's /metrics while the agent is connected
    // (one collection spans several frames: wait for every name checked).
    let host = hostname();
    let metrics_addr = collector.metrics_addr();
    let scraped = until(
        "host metrics on the collector's /metrics",
        Duration::from_secs(10),
        || {
            let s = scrape(metrics_addr)?;
            match WANTED.iter().find(|name| !has_series(&s, name, &host)) {
                None => Ok(s),
                Some(name) => Err(format!("no {name} with agent and instance labels")),
            }
        },
    )
    .await;
    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1, "{summary:?}");
    // The collector settles a connection's ledger when it processes the Goodbye.
    let ledger = until(
        "the collector's ledger after goodbye",
        Duration::from_secs(10),
        || {
            let ledger = collector.ledger("demo-agent");
            let accepted: u64 = ledger.iter().map(|(_, l)| l.accepted + l.lost).sum();
            if accepted >= frames(&stats) {
                Ok(ledger)
            } else {
                Err(format!("{ledger:?}"))
            }
        },
    )
    .await;
    collector.stop().await;
    let log_sink = std::fs::read_to_string(&sink).unwrap_or_default();
    Outcome {
        stats,
        ledger,
        scraped,
        log_sink,
        lines,
    }
}

fn check_exact_accounting(o: &Outcome) {
    for st in Stream::ALL {
        let Some((_, l)) = o.ledger.iter().find(|(id, _)| *id == st.id()) else {
            // A stream the agent sent nothing on (no source configured) has no ledger.
            assert_eq!(
                (o.stats.frames_sent(st), o.stats.records_sent(st)),
                (0, 0),
                "no ledger for {st}, which the agent sent on: {:?}",
                o.ledger
            );
            continue;
        };
        assert_eq!(
            o.stats.frames_sent(st),
            l.accepted + l.lost,
            "{st}: agent frames sent vs collector accepted + lost: {l:?}"
        );
        assert_eq!(
            o.stats.records_sent(st),
            l.records_received + l.records_lost,
            "{st}: agent records sent vs collector records received + lost: {l:?}"
        );
        assert_eq!(l.duplicate, 0);
        assert_eq!(l.dropped_after_tracking, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_metrics_reach_the_collector_and_accounting_is_exact() {
    let o = run_pipeline(0.0, 10).await;
    let host = hostname();
    for name in WANTED {
        assert!(
            has_series(&o.scraped, name, &host),
            "{name} with agent and instance labels missing from the collector's /metrics"
        );
    }
    check_exact_accounting(&o);
    for (id, l) in &o.ledger {
        assert_eq!(
            l.lost, 0,
            "stream {id}: loss on loopback without faults: {l:?}"
        );
    }
    // Every log line arrived in the collector's sink.
    for line in &o.lines {
        assert!(
            o.log_sink.contains(line.as_str()),
            "{line} missing from the log sink"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_injected_loss_sent_equals_received_plus_lost_on_both_sides() {
    let o = run_pipeline(0.2, 40).await;
    check_exact_accounting(&o);
    let lost: u64 = o.ledger.iter().map(|(_, l)| l.lost).sum();
    assert!(lost > 0, "20 % drop lost nothing: {:?}", o.ledger);
}
