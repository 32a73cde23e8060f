//! Gone agents and relayed sample times, through the real binaries.
//!
//! * An agent that stops (SIGTERM: its `Goodbye`), dies (SIGKILL: its control connection
//!   closes) or freezes (SIGSTOP: silent until the dead-peer rule, heartbeat interval ×
//!   missed heartbeats) leaves the collector's `/metrics` then, not `staleness_seconds`
//!   (300 s) later, and `uctel_collector_agent_up{agent}` goes from 1 to 0 while the other
//!   agents stay.
//! * A real Prometheus scraping the collector keeps each relayed sample's collection time,
//!   so `rate(node_cpu_seconds_total[10s])` through uctel agrees with the same rate from
//!   the real node_exporter scraped directly, at every evaluation over 40 s, and
//!   `node_time_seconds` (the time node_exporter's collector read) matches its sample time.
//!   The agent relays node_exporter through its scrape source (stamped with each scrape's
//!   start, as Prometheus stamps its own scrapes), every 5 s; Prometheus scrapes the
//!   collector and node_exporter every second.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use uctel_tests::exposition::Scrape;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::prometheus::{sample_value, Job, Prometheus};
use uctel_tests::wait_for;

/// Heartbeat period and missed heartbeats of the collector in the liveness test: the
/// dead-peer rule declares a silent agent dead after 3 s.
const HEARTBEAT_SECONDS: u64 = 1;
const MISSED_HEARTBEATS: u64 = 3;

/// Samples on the collector's `/metrics` that came from `agent` (its own `node_*` and
/// `uctel_agent_*` series; not the collector's self-metrics about it).
fn agent_series(s: &Scrape, agent: &str) -> usize {
    s.samples
        .iter()
        .filter(|x| x.label("agent") == Some(agent) && !x.name.starts_with("uctel_collector_"))
        .count()
}

fn agent_up(s: &Scrape, agent: &str) -> Option<f64> {
    s.value(&format!("uctel_collector_agent_up{{agent=\"{agent}\"}}"))
}

/// Waits (at most `within`) until `agent` has no series on the collector and `agent_up 0`;
/// how long that took.
fn wait_gone(p: &Pipeline, agent: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    wait_for(
        &format!("{agent}'s series gone and agent_up 0"),
        within,
        Duration::from_millis(100),
        || {
            let s = p.scrape()?;
            match (agent_series(&s, agent), agent_up(&s, agent)) {
                (0, Some(0.0)) => Ok(()),
                (n, up) => Err(format!("{n} series of {agent} left, agent_up {up:?}")),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    t0.elapsed()
}

#[test]
fn gone_agents_leave_metrics_at_once_and_agent_up_goes_to_zero() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start_with(|y, _| {
        y.set("control.heartbeat_interval_seconds", HEARTBEAT_SECONDS)
            .set("control.dead_after_missed_heartbeats", MISSED_HEARTBEATS)
            .set("staleness_seconds", 300);
    });
    let ids = ["stopped", "killed", "frozen", "staying"];
    for id in ids {
        p.add_agent(id, 0.0, 1.0);
    }
    p.wait_flowing(ids.len(), &ids, &["metrics"], Duration::from_secs(60));
    let s = wait_for(
        "every agent's node_* series",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = p.scrape()?;
            match ids.iter().find(|id| !s.has("node_load1", &[("agent", id)])) {
                Some(id) => Err(format!("no node_load1 of {id} yet")),
                None => Ok(s),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    for id in ids {
        assert_eq!(agent_up(&s, id), Some(1.0), "agent_up of {id}");
    }

    // SIGTERM: the agent says Goodbye; its series go with its session.
    p.agents[0].daemon.signal(Signal::SIGTERM);
    assert!(
        p.agents[0]
            .daemon
            .wait_exit(Duration::from_secs(20))
            .is_some(),
        "the agent did not stop"
    );
    let took = wait_gone(&p, "stopped", Duration::from_secs(5));
    eprintln!("SIGTERM: gone {took:.1?} after the agent exited");

    // SIGKILL: the kernel closes its control connection; no Goodbye.
    p.agents[1].daemon.kill();
    let took = wait_gone(&p, "killed", Duration::from_secs(5));
    eprintln!("SIGKILL: gone {took:.1?} after the kill");

    // SIGSTOP: the connection stays open and silent; the dead-peer rule ends it.
    p.agents[2].daemon.signal(Signal::SIGSTOP);
    let frozen_at = Instant::now();
    let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        agent_series(&s, "frozen") > 0,
        "frozen's series gone at once"
    );
    let dead_after = Duration::from_secs(HEARTBEAT_SECONDS * MISSED_HEARTBEATS);
    let took = wait_gone(&p, "frozen", dead_after + Duration::from_secs(5));
    eprintln!(
        "SIGSTOP: gone {:.1?} after the stop (dead-peer rule: {dead_after:?} of silence)",
        frozen_at.elapsed()
    );
    assert!(took <= dead_after + Duration::from_secs(5));

    // The agent that stays is untouched; the collector's accounting of the others stays.
    let s = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    assert!(s.has("node_load1", &[("agent", "staying")]), "{}", s.text);
    assert_eq!(agent_up(&s, "staying"), Some(1.0));
    for id in ["stopped", "killed", "frozen"] {
        assert!(
            s.has("uctel_collector_frames_received_total", &[("agent", id)]),
            "{id}: its accounting must stay"
        );
    }
    p.agents[2].daemon.kill();
}

#[test]
fn relayed_samples_keep_their_collection_time_so_rates_agree_with_node_exporter() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let (ne_addr, _node_exporter) = uctel_tests::node_exporter::start(
        p.path(),
        "node-exporter",
        &[
            "--collector.disable-defaults".to_owned(),
            "--collector.cpu".to_owned(),
            "--collector.time".to_owned(),
        ],
    );
    // The same node_exporter relayed by the agent's scrape source every 5 s (its series
    // labelled job="relayed"), and scraped directly by Prometheus every second.
    let targets = serde_yaml::from_str::<serde_yaml::Value>(&format!(
        "- {{url: 'http://{ne_addr}/metrics', job: relayed, interval_seconds: 5, timeout_seconds: 2}}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    p.add_agent_with("a", 0.0, 10.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    p.wait_flowing(1, &["a"], &["metrics"], Duration::from_secs(60));
    let prom_dir = p.path().join("prometheus");
    std::fs::create_dir(&prom_dir).unwrap_or_else(|e| panic!("{e}"));
    let prom = Prometheus::start(
        &prom_dir,
        &[
            Job {
                name: "uctel".into(),
                targets: vec![p.metrics_addr()],
                honor_labels: true,
            },
            Job {
                name: "node".into(),
                targets: vec![ne_addr],
                honor_labels: false,
            },
        ],
    );
    let value = |expr: &str| -> Result<f64, String> {
        let r = prom.query(expr)?;
        r.first()
            .and_then(sample_value)
            .ok_or_else(|| format!("{expr}: no value in {r:?}"))
    };
    // Every CPU's seconds in all modes together grow by one per second: the rate of their
    // sum is the number of CPUs, from either path, whatever the load.
    let ratio = "sum(rate(node_cpu_seconds_total{job=\"relayed\",agent=\"a\"}[10s])) \
                 / sum(rate(node_cpu_seconds_total{job=\"node\"}[10s]))";
    let relayed_time = "node_time_seconds{job=\"relayed\",agent=\"a\"}";
    let lag = format!("abs({relayed_time} - timestamp({relayed_time}))");
    // 40 s of one-second evaluations, each with a full 10 s window of both paths: from 55 s
    // of direct scrapes on (a window reaching back before the first scrape extrapolates
    // less than its length and reads low).
    let (min, max, max_lag) = wait_for(
        "55 s of direct scrapes",
        Duration::from_secs(150),
        Duration::from_secs(2),
        || {
            let n = value("count_over_time(up{job=\"node\"}[60s])")?;
            if n < 55.0 {
                return Err(format!("{n} scrapes of node_exporter so far"));
            }
            Ok((
                value(&format!("min_over_time(({ratio})[40s:1s])"))?,
                value(&format!("max_over_time(({ratio})[40s:1s])"))?,
                value(&format!("max_over_time(({lag})[40s:1s])"))?,
            ))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", prom.log_tail(20)));
    let busy = |selector: &str| {
        value(&format!(
            "sum(rate(node_cpu_seconds_total{{{selector},mode!=\"idle\"}}[30s]))"
        ))
        .unwrap_or(f64::NAN)
    };
    eprintln!(
        "rate(node_cpu_seconds_total[10s]) summed, through uctel / scraped directly, over \
         40 s: min {min:.3}, max {max:.3}; CPU busy over 30 s: through uctel {:.3}, directly \
         {:.3}; relayed node_time_seconds minus its sample time: at most {max_lag:.3} s",
        busy("job=\"relayed\",agent=\"a\""),
        busy("job=\"node\"")
    );
    assert!(
        (0.9..=1.1).contains(&min) && (0.9..=1.1).contains(&max),
        "rate(node_cpu_seconds_total[10s]) through uctel is {min:.3}..{max:.3} times the \
         rate scraped from node_exporter directly (want 0.9..1.1)"
    );
    assert!(
        max_lag < 1.0,
        "a relayed node_time_seconds is up to {max_lag:.3} s off its sample time (want < 1 s)"
    );
}
