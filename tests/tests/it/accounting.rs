//! Exact accounting under faults, through the real binaries: the regression tests of the
//! reorder, killed-agent, twin-agent-id and long-line findings.
//!
//! * Reordering without loss counts no loss at any scrape (loss is counted once a frame
//!   leaves the reorder window unseen, never taken back).
//! * An agent killed without `Goodbye` is settled from its last heartbeat (which carries the
//!   sequences sent by then) and counted in `sessions_ended_total{reason="no_goodbye"}`.
//! * Two agents with one `agent_id`: the second is refused (`duplicate_agent_id`), the first
//!   keeps its session; no loop of replacements.
//! * Lines longer than one packet arrive whole with `multi_packet_frames`, and
//!   `--check-config` refuses a `max_line_bytes` that one packet cannot carry.
//!
//! The tests run one at a time ([`uctel_tests::exclusive`]): each runs several daemons.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use uctel_tests::daemon::check_config;
use uctel_tests::pipeline::{goodbye_frames, AgentFigures, CollectorFigures, Pipeline, STREAMS};
use uctel_tests::{bins, exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(20);

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// Lines of the collector's JSON Lines sink for `agent`: message → times seen.
fn sink_lines(p: &Pipeline, agent: &str) -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(p.path().join("collector-logs.jsonl")).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("torn sink line {line:?}: {e}"));
        if v["agent"] == agent {
            if let Some(m) = v["message"].as_str() {
                *seen.entry(m.to_owned()).or_default() += 1;
            }
        }
    }
    seen
}

#[test]
fn reordering_without_loss_counts_no_loss_at_any_scrape() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let i = p.add_agent_with("reorder", 0.0, 0.5, |y| {
        y.set("transport.soft.fault.reorder_ratio", 0.1)
            .set("transport.soft.fault.reorder_window", 3)
            .set("transport.soft.fault.seed", 7);
    });
    p.wait_flowing(1, &["reorder"], &["metrics"], UP);
    const LINES: usize = 400;
    let mut max_late = 0;
    for burst in 0..8 {
        p.write_lines(i, burst * LINES / 8, LINES / 8);
        std::thread::sleep(Duration::from_millis(300));
        let s = p.scrape().expect("scrape");
        let c = CollectorFigures::read(&s, "reorder");
        assert_eq!(
            c.lost_total(),
            0,
            "reordered frames counted lost at a scrape: {c:?}"
        );
        assert_eq!(c.records_lost.values().sum::<u64>(), 0, "{c:?}");
        assert_eq!(c.connection_lost, 0, "{c:?}");
        max_late =
            max_late.max(s.count("uctel_collector_frames_late_total", &[("agent", "reorder")]));
    }
    let agent_scrape = wait_for("agent read every line", UP, tick(), || {
        let f = AgentFigures::read(&p.agents[i].scrape()?);
        if f.records_sent["logs"] >= LINES as u64 {
            Ok(f)
        } else {
            Err(format!("{} of {LINES}", f.records_sent["logs"]))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(agent_scrape.records_dropped["logs"], 0);
    p.agents[i].daemon.stop(STOP);
    let sent = goodbye_frames(&p.agents[i].daemon.log());
    assert_eq!(sent.len(), 1, "{}", p.agents[i].daemon.log_tail(20));
    let c = wait_for("connection settled", UP, tick(), || {
        let s = p.scrape()?;
        let c = CollectorFigures::read(&s, "reorder");
        if s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "reorder"), ("reason", "goodbye")],
        ) == 1
        {
            Ok(c)
        } else {
            Err("no goodbye yet".into())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    assert_eq!(c.lost_total(), 0, "{c:?}");
    assert_eq!(c.received_total(), sent[0], "{c:?}");
    let late = p
        .scrape()
        .unwrap()
        .count("uctel_collector_frames_late_total", &[("agent", "reorder")]);
    assert!(
        late > 0,
        "the fault injector reordered nothing, the test proves nothing"
    );
    println!(
        "reorder: {} frames, {late} late, 0 lost (max late at a scrape {max_late})",
        sent[0]
    );
    let lines = sink_lines(&p, "reorder");
    assert_eq!(lines.len(), LINES, "distinct lines delivered");
    assert!(lines.values().all(|n| *n == 1), "a line delivered twice");
}

#[test]
fn a_killed_agent_is_settled_from_its_last_heartbeat() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    // Every packet of this agent is lost on the wire (a black-holed UDP path): the collector
    // learns what was sent only from the heartbeats on the control connection.
    let i = p.add_agent_with("killed", 0.0, 0.2, |y| {
        y.set("transport.soft.fault.drop_ratio", 1.0)
            .set("transport.soft.fault.seed", 3);
    });
    wait_for("agent connected", UP, tick(), || {
        let s = p.scrape()?;
        (s.count("uctel_collector_agents_connected", &[]) == 1)
            .then_some(())
            .ok_or_else(|| "not connected".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    p.write_lines(i, 0, 20);
    // Let at least two heartbeats carry the sequences (the collector's heartbeat interval is
    // the agent's).
    let sent = wait_for("agent sent frames", UP, tick(), || {
        let f = AgentFigures::read(&p.agents[i].scrape()?);
        let n: u64 = f.frames_sent.values().sum();
        if n >= 10 && f.records_sent["logs"] >= 20 {
            Ok(n)
        } else {
            Err(format!("{n} frames sent"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // Until a heartbeat (every 5 s, the collector's interval) has carried the sequences of
    // every frame counted above to the collector (`agent_frames_sent_total` is what the
    // agent's heartbeats said).
    let carried = Instant::now();
    wait_for("a heartbeat carrying the frames sent", UP, tick(), || {
        let n = p.scrape()?.count(
            "uctel_collector_agent_frames_sent_total",
            &[("agent", "killed")],
        );
        if n >= sent {
            Ok(())
        } else {
            Err(format!("heartbeats carried {n} of {sent} frames"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    println!(
        "heartbeat carried the frames sent after {:?}",
        carried.elapsed()
    );
    let before_kill: u64 = AgentFigures::read(&p.agents[i].scrape().unwrap())
        .frames_sent
        .values()
        .sum();
    let log = p.agents[i].daemon.log();
    assert!(
        !log.contains("connection to the collector lost"),
        "the agent reconnected before the kill, the test would mix sessions:\n{log}"
    );
    p.agents[i].daemon.kill();
    let s = wait_for("session ended without goodbye", UP, tick(), || {
        let s = p.scrape()?;
        (s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "killed"), ("reason", "no_goodbye")],
        ) == 1
            && s.count("uctel_collector_agents_connected", &[]) == 0)
            .then_some(s)
            .ok_or_else(|| "not yet".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    let c = CollectorFigures::read(&s, "killed");
    assert_eq!(c.received_total(), 0, "{c:?}");
    // Everything up to the last heartbeat is counted lost; only what was sent after it may
    // be unknown.
    assert!(
        c.lost_total() >= sent && c.lost_total() <= before_kill,
        "lost {} should be within [{sent}, {before_kill}] ({c:?})\n{}",
        c.lost_total(),
        p.collector.log_tail(30)
    );
    assert!(c.records_lost["logs"] >= 20, "{c:?}");
    println!(
        "killed agent: {before_kill} frames sent, {} counted lost, {} unknown",
        c.lost_total(),
        before_kill - c.lost_total()
    );
}

#[test]
fn a_second_agent_with_the_same_id_is_refused_not_looped() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let first = p.add_agent("twin", 0.0, 0.5);
    p.wait_flowing(1, &["twin"], &["metrics"], UP);
    // A second process with the same agent_id and its own state directory.
    let second = p.add_agent_with("twin-b", 0.0, 0.5, |y| {
        // Retries every 5 s (the longest backoff) while refused.
        y.set("agent_id", "twin")
            .set("collector.reconnect_max_seconds", 5.0);
    });
    let start = CollectorFigures::read(&p.scrape().unwrap(), "twin");
    std::thread::sleep(Duration::from_secs(10));
    let s = p.scrape().unwrap();
    let end = CollectorFigures::read(&s, "twin");
    assert_eq!(
        end.epoch_resets(),
        start.epoch_resets(),
        "the first agent's session was reset: {end:?}"
    );
    assert_eq!(
        s.count(
            "uctel_collector_connections_replaced_total",
            &[("agent", "twin")]
        ),
        0
    );
    let refused = s.count(
        "uctel_collector_handshakes_refused_total",
        &[("reason", "duplicate_agent_id")],
    );
    assert!(refused >= 1, "the second agent was not refused");
    assert!(
        refused <= 4,
        "refused {refused} times in 10 s: not retrying at the longest backoff"
    );
    assert_eq!(s.count("uctel_collector_agents_connected", &[]), 1);
    for st in STREAMS {
        assert!(end.received[st] >= start.received[st]);
    }
    assert!(p.agents[first].daemon.is_running());
    let log = p.agents[second].daemon.log();
    let warned = log
        .matches("another agent with the same agent_id is connected")
        .count();
    assert_eq!(warned, 1, "the refusal is logged once:\n{log}");
    p.agents[second].daemon.signal(Signal::SIGTERM);
}

#[test]
fn long_lines_arrive_whole_with_multi_packet_frames_at_mtu_1024() {
    let _g = exclusive();
    // --check-config refuses lines that one packet of 1024 bytes cannot carry.
    let dir = tempfile::tempdir().unwrap();
    let addrs = uctel_tests::configs::CollectorAddrs::free();
    let options = uctel_tests::configs::AgentOptions {
        id: "long".into(),
        metrics: uctel_tests::net::free_addr(),
        log_file: dir.path().join("long.log"),
        drop_ratio: 0.0,
        host_interval_seconds: 1.0,
    };
    let mut y = uctel_tests::configs::agent(&options, addrs.control, dir.path());
    let mut log = serde_yaml_mapping(&options.log_file, 3520);
    y.set("sources.logs", std::mem::take(&mut log))
        .set("transport.soft.mtu_bytes", 1024)
        .set("max_frame_bytes", 4096);
    let cfg = dir.path().join("agent.yaml");
    y.write(&cfg);
    let (code, out) = check_config(&bins::path(bins::AGENT), &cfg);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("multi_packet_frames"), "{out}");
    y.set("multi_packet_frames", true);
    y.write(&cfg);
    let (code, out) = check_config(&bins::path(bins::AGENT), &cfg);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lines up to 3520 bytes arrive whole"), "{out}");

    // Through the pipeline: 3,000 lines of 1..=3,500 bytes, every one whole.
    let mut p = Pipeline::start();
    let path = p.path().join("long.input.log");
    let i = p.add_agent_with("long", 0.0, 1.0, |y| {
        y.set("sources.logs", serde_yaml_mapping(&path, 3520))
            .set("transport.soft.mtu_bytes", 1024)
            .set("max_frame_bytes", 4096)
            .set("multi_packet_frames", true);
    });
    p.wait_flowing(1, &["long"], &["metrics"], UP);
    const LINES: usize = 3000;
    let mut want = BTreeMap::new();
    let mut text = String::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for k in 0..LINES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = 1 + (x % 3500) as usize;
        let head = format!("{k} ");
        let line: String = head
            .chars()
            .chain(std::iter::repeat('x'))
            .take(len.max(head.len()))
            .collect();
        text.push_str(&line);
        text.push('\n');
        want.insert(line, 1u32);
    }
    std::fs::write(&path, text).unwrap();
    wait_for("agent read every line", UP, tick(), || {
        let f = AgentFigures::read(&p.agents[i].scrape()?);
        if f.records_sent["logs"] >= LINES as u64 {
            Ok(f)
        } else {
            Err(format!("{} of {LINES}", f.records_sent["logs"]))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[i].daemon.log_tail(20)));
    let truncated = p.agents[i]
        .scrape()
        .unwrap()
        .count("uctel_agent_records_truncated_total", &[]);
    assert_eq!(truncated, 0, "lines cut to fit a frame");
    p.agents[i].daemon.stop(STOP);
    wait_for("goodbye settled", UP, tick(), || {
        let s = p.scrape()?;
        (s.count(
            "uctel_collector_sessions_ended_total",
            &[("agent", "long"), ("reason", "goodbye")],
        ) == 1)
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let got = sink_lines(&p, "long");
    let missing = want.keys().filter(|l| !got.contains_key(*l)).count();
    let c = CollectorFigures::read(&p.scrape().unwrap(), "long");
    assert_eq!(missing, 0, "lines not delivered whole ({c:?})");
    assert_eq!(got, want);
}

/// `sources.logs` with one file read from the beginning, lines up to `max_line_bytes`.
fn serde_yaml_mapping(path: &std::path::Path, max_line_bytes: u64) -> serde_yaml::Value {
    let mut log = serde_yaml::Mapping::new();
    log.insert("path".into(), path.display().to_string().into());
    log.insert("start_at".into(), "beginning".into());
    log.insert("max_line_bytes".into(), max_line_bytes.into());
    serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(log)])
}
