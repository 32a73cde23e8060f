//! Parsed log lines through the real agent and collector binaries (`sources.logs[].parse`):
//! Java and Python stack traces joined into one record each by a start pattern, JSON lines
//! into fields, the lines' own timestamps with the read time kept, a trace longer than the
//! record limit cut and counted, and an agent SIGKILLed in the middle of a trace: after the
//! restart the trace arrives exactly once and whole.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_yaml::{Mapping, Value};
use uctel_tests::pipeline::Pipeline;

const JAVA: &str = "2026-12-07 01:02:03,100 ERROR [main] c.e.App - request failed
java.lang.IllegalStateException: boom
\tat com.example.App.handle(App.java:42)
\tat com.example.App.main(App.java:10)
Caused by: java.io.IOException: disk
\tat com.example.Io.read(Io.java:7)
\t... 2 more
";

const JSON: &str = r#"{"ts":"2026-12-07T01:02:04.250Z","level":"warn","msg":"slow","http":{"status":503,"path":"/a"}}
"#;

const PYTHON: &str = "2026-12-07 01:02:05,000 ERROR app: failed
Traceback (most recent call last):
  File \"/srv/app.py\", line 10, in <module>
    main()
  File \"/srv/app.py\", line 7, in main
    raise ValueError(\"bad\")
ValueError: bad
";

/// The restart trace: its first part is written before the SIGKILL, the rest after.
const BEFORE_KILL: &str = "2026-12-07 01:03:00,000 ERROR [w-1] c.e.Job - crashed
java.lang.NullPointerException: null
\tat com.example.Job.run(Job.java:5)
";
const AFTER_KILL: &str = "\tat java.base/java.lang.Thread.run(Thread.java:1583)
Caused by: java.lang.RuntimeException: inner
\t... 1 more
";

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// The collector writes `ts` as RFC 3339 UTC with nanoseconds, so these compare as text.
fn ts(r: &serde_json::Value) -> &str {
    r["ts"].as_str().unwrap_or_default()
}

/// The records in the collector's JSONL sink, by message.
fn sink(p: &Pipeline) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p.path().join("collector-logs.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_records(p: &Pipeline, what: &str, want: impl Fn(&[serde_json::Value]) -> bool) {
    let r = uctel_tests::wait_for(
        what,
        Duration::from_secs(40),
        Duration::from_millis(100),
        || {
            let got = sink(p);
            if want(&got) {
                Ok(())
            } else {
                Err(format!("{} records in the sink", got.len()))
            }
        },
    );
    if let Err(e) = r {
        panic!(
            "{e}\n{:#?}\n{}",
            sink(p),
            p.agents
                .first()
                .map(|a| a.daemon.log_tail(30))
                .unwrap_or_default()
        );
    }
}

fn message_is(r: &serde_json::Value, text: &str) -> bool {
    r["message"].as_str() == Some(text.trim_end_matches('\n'))
}

#[test]
fn traces_json_and_timestamps_parsed_and_a_trace_survives_an_agent_sigkill() {
    let _g = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let log_file = p.path().join("p.input.log");
    let source = {
        let mut multiline = Mapping::new();
        multiline.insert("start_pattern".into(), r"^(\d{4}-\d{2}-\d{2} |\{)".into());
        multiline.insert("timeout_seconds".into(), 4.0.into());
        let mut parse = Mapping::new();
        parse.insert("json".into(), true.into());
        parse.insert("timestamp".into(), true.into());
        parse.insert("timezone".into(), "UTC".into());
        parse.insert("multiline".into(), multiline.into());
        let mut s = Mapping::new();
        // `p.input.log` and `p2.input.log`.
        let glob = p.path().join("p*.input.log");
        s.insert("path".into(), glob.display().to_string().into());
        s.insert("start_at".into(), "beginning".into());
        s.insert("max_line_bytes".into(), 1024.into());
        s.insert("poll_interval_seconds".into(), 0.05.into());
        s.insert("parse".into(), parse.into());
        s
    };
    std::fs::write(p.path().join("p2.input.log"), "")
        .unwrap_or_else(|e| panic!("p2.input.log: {e}"));
    let a = p.add_agent_with("p", 0.0, 60.0, |y| {
        y.set("sources.logs", Value::Sequence(vec![source.into()]));
    });
    p.wait_flowing(1, &["p"], &["metrics"], Duration::from_secs(30));

    // A trace longer than the record limit (1024 bytes): cut, counted, never split.
    let long: String = std::iter::once("2026-12-07 01:02:02,000 ERROR deep - overflow\n".into())
        .chain((0..60).map(|i| format!("\tat com.example.Deep.f{i}(Deep.java:{i})\n")))
        .collect();
    append(&log_file, &long);
    append(&log_file, JAVA);
    append(&log_file, JSON);
    append(&log_file, PYTHON);
    // The Python trace is last: shipped after the 4 s flush timeout, with no next line.
    wait_records(&p, "the Python trace flushed by its timeout", |got| {
        got.iter().any(|r| message_is(r, PYTHON))
    });
    let got = sink(&p);
    let by_message: BTreeMap<&str, &serde_json::Value> = got
        .iter()
        .filter_map(|r| r["message"].as_str().map(|m| (m, r)))
        .collect();
    assert_eq!(got.len(), 4, "one record per trace and line: {got:#?}");

    let java = by_message
        .get(JAVA.trim_end())
        .unwrap_or_else(|| panic!("the Java trace whole in one record: {got:#?}"));
    assert_eq!(ts(java), "2026-12-07T01:02:03.100000000Z");
    assert_eq!(java["severity"], "error");
    let read = java["fields"]["read_time"].as_str().unwrap_or_default();
    assert!(
        read.len() == ts(java).len() && read.ends_with('Z'),
        "{java}"
    );
    assert!(read > ts(java), "read after the time it states: {read}");

    let json = by_message
        .get(JSON.trim_end())
        .unwrap_or_else(|| panic!("the JSON line: {got:#?}"));
    assert_eq!(ts(json), "2026-12-07T01:02:04.250000000Z");
    assert_eq!(json["fields"]["http.status"], "503");
    assert_eq!(json["fields"]["http.path"], "/a");
    assert_eq!(json["fields"]["level"], "warn");
    assert_eq!(json["severity"], "warn");

    let python = by_message.get(PYTHON.trim_end()).copied();
    assert_eq!(python.map(ts), Some("2026-12-07T01:02:05.000000000Z"));

    let cut = got
        .iter()
        .find(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("2026-12-07 01:02:02,000"))
        })
        .unwrap_or_else(|| panic!("the long trace: {got:#?}"));
    let cut_len = cut["message"].as_str().map_or(0, str::len);
    assert!(
        (1000..=1024).contains(&cut_len),
        "cut at the limit: {cut_len}"
    );
    let s = p.agents[a]
        .scrape()
        .unwrap_or_else(|e| panic!("agent /metrics: {e}"));
    assert_eq!(
        s.count("uctel_agent_log_events_total", &[("reason", "record_cut")]),
        1,
        "the cut is counted"
    );

    // SIGKILL with a trace half written (its lines read and held, not shipped), the rest
    // written while the agent is down. A record of another file of the source settles while
    // the trace is held, so a checkpoint is written then: it must stay at the trace's first
    // line.
    let other = p.path().join("p2.input.log");
    append(&log_file, BEFORE_KILL);
    std::thread::sleep(Duration::from_millis(300));
    append(
        &other,
        "2026-12-07 01:02:59,000 INFO other file\n2026-12-07 01:02:59,500 INFO other again\n",
    );
    wait_records(&p, "the other file's first record", |got| {
        got.iter()
            .any(|r| message_is(r, "2026-12-07 01:02:59,000 INFO other file"))
    });
    std::thread::sleep(Duration::from_millis(700));
    p.agents[a].daemon.kill();
    append(&log_file, AFTER_KILL);
    let restarted = "2026-12-07 01:03:01,000 INFO [w-1] c.e.Job - restarted";
    append(&log_file, &format!("{restarted}\n"));
    let r = uctel_tests::wait_for(
        "session of the killed agent closed",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || match p.scrape()?.count("uctel_collector_agents_connected", &[]) {
            0 => Ok(()),
            n => Err(format!("agents_connected {n}")),
        },
    );
    if let Err(e) = r {
        panic!("{e}");
    }
    p.agents[a].daemon.restart();
    let whole = format!("{BEFORE_KILL}{AFTER_KILL}");
    wait_records(
        &p,
        "the trace written across the restart, and the lines held",
        |got| {
            got.iter().any(|r| message_is(r, &whole))
                && got.iter().any(|r| message_is(r, restarted))
                && got
                    .iter()
                    .any(|r| message_is(r, "2026-12-07 01:02:59,500 INFO other again"))
        },
    );
    // Nothing of it arrives twice or in parts, nor anything sent before the kill.
    let got = sink(&p);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &got {
        *counts
            .entry(r["message"].as_str().unwrap_or(""))
            .or_default() += 1;
    }
    assert!(
        counts.values().all(|n| *n == 1),
        "a record twice: {counts:#?}"
    );
    assert_eq!(counts.get(whole.trim_end()), Some(&1));
    assert!(
        !counts
            .keys()
            .any(|m| m.starts_with("\tat java.base") || m.starts_with("Caused by")),
        "no part of the trace on its own: {counts:#?}"
    );
    assert_eq!(
        got.len(),
        8,
        "4 records, 2 of the other file, the trace, the last line: {counts:#?}"
    );
}
