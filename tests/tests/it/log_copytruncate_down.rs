//! copytruncate while the agent is down, through the real `uctel-collector` and `uctel-agent`
//! binaries (soft transport, free ports): glob `app.log*`, `start_at: beginning`; 20 short
//! lines (under the 256-byte fingerprint) are read and checkpointed, the agent stops
//! (SIGTERM), `cp app.log app.log.1; : > app.log`, the agent starts again and 5 more lines
//! are written to the truncated `app.log`. Every line reaches the collector's JSON Lines sink
//! exactly once: the copy is recognised as the checkpointed file (its inode was found
//! truncated, and the copy starts with every byte read from it) and resumed at the saved
//! offset. Before, the 20 lines arrived a second time, from `app.log.1`.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use serde_yaml::{Mapping, Value};
use uctel_tests::pipeline::{AgentFigures, Pipeline};
use uctel_tests::{exclusive, wait_for};

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

fn append(path: &std::path::Path, lines: std::ops::RangeInclusive<u32>) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text: String = lines.map(|n| format!("line {n}\n")).collect();
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Waits until the agent's `/metrics` says it read (sent or dropped) `n` log lines.
fn wait_read(p: &Pipeline, i: usize, n: u64) {
    let a = &p.agents[i];
    wait_for(&format!("{} read {n} lines", a.id()), UP, tick(), || {
        let f = AgentFigures::read(&a.scrape()?);
        let read = f.records_sent["logs"] + f.records_dropped["logs"];
        if read >= n {
            Ok(())
        } else {
            Err(format!("{read} of {n}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", a.daemon.log()));
}

/// Waits until the sink holds every line of `want`.
fn wait_delivered(p: &Pipeline, want: &[String]) {
    wait_for("lines in the sink", UP, tick(), || {
        let seen = sink_lines(p, "cptrunc");
        match want.iter().find(|l| !seen.contains_key(*l)) {
            None => Ok(()),
            Some(l) => Err(format!("{l:?} not delivered yet")),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
}

#[test]
fn a_copy_made_while_the_agent_was_down_is_not_read_again() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let log = p.path().join("cptrunc.input.log");
    let glob = format!("{}*", log.display());
    let i = p.add_agent_with("cptrunc", 0.0, 1.0, |y| {
        let mut entry = Mapping::new();
        entry.insert("path".into(), glob.clone().into());
        entry.insert("start_at".into(), "beginning".into());
        y.set("sources.logs", Value::Sequence(vec![Value::Mapping(entry)]));
    });
    p.wait_flowing(1, &["cptrunc"], &["metrics"], UP);
    append(&log, 1..=20);
    let first: Vec<String> = (1..=20).map(|n| format!("line {n}")).collect();
    wait_read(&p, i, 20);
    wait_delivered(&p, &first);

    // SIGTERM: the final checkpoint holds app.log at its end (under 256 bytes).
    p.agents[i].daemon.stop(STOP);
    let copy = p.path().join("cptrunc.input.log.1");
    std::fs::copy(&log, &copy).unwrap_or_else(|e| panic!("cp: {e}"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(0))
        .unwrap_or_else(|e| panic!(": > app.log: {e}"));
    p.agents[i].daemon.restart();
    append(&log, 21..=25);
    wait_read(&p, i, 5);
    let all: Vec<String> = (1..=25).map(|n| format!("line {n}")).collect();
    wait_delivered(&p, &all);
    // Pacing, not a wait for a state: a copy read again would arrive within this time.
    std::thread::sleep(Duration::from_secs(2));
    p.agents[i].daemon.stop(STOP);

    let seen = sink_lines(&p, "cptrunc");
    let twice: Vec<(&String, &u32)> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "lines not delivered exactly once: {twice:?}"
    );
    assert_eq!(seen.len(), 25, "{seen:?}");
    p.collector.stop(STOP);
}
