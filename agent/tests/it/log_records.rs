//! What a log line becomes: each record carries the time its line was read (not one time per
//! poll or frame) and the severity the line states; `severity: none` turns detection off.
//! On the tailer over real files, and end to end through the real collector's JSONL sink.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uctel_agent::config::{AgentConfig, LogSeverity};
use uctel_agent::run::{run_with, Options};
use uctel_agent::sources::logs::{LogSourceConfig, LogTailer, StartAt};
use uctel_protocol::payload::{LogRecord, Severity};

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open for append: {e}"));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("append: {e}"));
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn tailer(dir: &Path, detect_severity: bool) -> LogTailer {
    let mut c = LogSourceConfig::new([dir.join("*.log").to_string_lossy().into_owned()]);
    c.start_at = StartAt::Beginning;
    c.detect_severity = detect_severity;
    LogTailer::new(c).unwrap_or_else(|e| panic!("tailer: {e}"))
}

fn poll(t: &mut LogTailer) -> Vec<LogRecord> {
    let mut out = Vec::new();
    let stats = t.poll(Instant::now(), SystemTime::now, &mut out, 100_000);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    out
}

#[test]
fn each_line_carries_the_time_it_was_read() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("a.log");
    let lines: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    append(&log, &lines);
    let mut t = tailer(dir.path(), true);
    let before = unix_ns();
    let first = poll(&mut t);
    let after = unix_ns();
    assert_eq!(first.len(), 2000);
    let ts: Vec<u64> = first.iter().map(|r| r.timestamp_ns).collect();
    assert!(
        ts.iter().all(|&t| (before..=after).contains(&t)),
        "read between {before} and {after}: {:?}..{:?}",
        ts.first(),
        ts.last()
    );
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "in the order they were read"
    );
    let first_ts = ts.first().copied().unwrap_or_default();
    let last_ts = ts.last().copied().unwrap_or_default();
    assert!(
        first_ts < last_ts,
        "2000 lines of one poll do not share one timestamp: {first_ts} .. {last_ts}"
    );

    std::thread::sleep(Duration::from_millis(20));
    append(&log, "later\n");
    let later = poll(&mut t);
    assert_eq!(later.len(), 1);
    assert!(
        later[0].timestamp_ns >= last_ts + 20_000_000,
        "{} vs {last_ts}",
        later[0].timestamp_ns
    );
}

/// Lines and the severity each states.
const MIXED: [(&str, Severity); 10] = [
    (
        "2024-01-01 00:00:00,123 ERROR [main] c.x.Y - failed",
        Severity::Error,
    ),
    (r#"{"level":"warn","msg":"slow"}"#, Severity::Warn),
    (r#"{"severity":"DEBUG","message":"x"}"#, Severity::Debug),
    (
        "<11>1 2024-01-01T00:00:00Z host app - - - boom",
        Severity::Error,
    ),
    (
        r#"time="2024-01-01T00:00:00Z" level=info msg=started"#,
        Severity::Info,
    ),
    (
        "I0102 15:04:05.123456 1 main.go:1] klog line",
        Severity::Info,
    ),
    ("12:00:00 [FATAL] out of memory", Severity::Fatal),
    ("TRACE enter", Severity::Trace),
    ("GET /index.html 200 no level here", Severity::Unspecified),
    ("an Error in lower case mid-line", Severity::Unspecified),
];

#[test]
fn severity_is_detected_from_each_line_unless_turned_off() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let text: String = MIXED.iter().map(|(l, _)| format!("{l}\n")).collect();
    append(&dir.path().join("a.log"), &text);

    let got: Vec<(String, i32)> = poll(&mut tailer(dir.path(), true))
        .into_iter()
        .map(|r| (r.message, r.severity))
        .collect();
    let want: Vec<(String, i32)> = MIXED
        .iter()
        .map(|(l, s)| ((*l).to_owned(), *s as i32))
        .collect();
    assert_eq!(got, want);

    let off = poll(&mut tailer(dir.path(), false));
    assert_eq!(off.len(), MIXED.len());
    assert!(
        off.iter()
            .all(|r| r.severity == Severity::Unspecified as i32),
        "{off:?}"
    );
}

#[test]
fn invalid_utf8_and_cut_lines_still_get_a_severity() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.path().join("a.log"))
        .unwrap_or_else(|e| panic!("{e}"));
    f.write_all(b"WARN \xff\xfe bad bytes\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let long = format!("{{\"level\":\"error\",\"msg\":\"{}\"}}\n", "x".repeat(5000));
    f.write_all(long.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    let records = poll(&mut tailer(dir.path(), true));
    let severities: Vec<i32> = records.iter().map(|r| r.severity).collect();
    assert_eq!(
        severities,
        vec![Severity::Warn as i32, Severity::Error as i32],
        "the cut JSON line is read as text"
    );
}

// ---- end to end through the collector's JSONL sink ----

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn collector_config(sink: &Path) -> uctel_collector::config::Config {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("collector.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["listen"]["control"] = "127.0.0.1:0".into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    v["transport"]["soft"]["bind"] = "127.0.0.1:0".into();
    v["logs"]["sink"] = "file".into();
    v["logs"]["file"]["path"] = sink.display().to_string().into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    uctel_common::config::from_str("collector.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Two log sources: `dir/auto/*.log` (severity detected, the default) and
/// `dir/none/*.log` (`severity: none`).
fn agent_config(control: std::net::SocketAddr, dir: &Path) -> AgentConfig {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["collector"]["control"] = control.to_string().into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    let source = |sub: &str| {
        let mut s = serde_yaml::Mapping::new();
        s.insert(
            "path".into(),
            format!("{}/{sub}/*.log", dir.display()).into(),
        );
        s.insert("start_at".into(), "beginning".into());
        s.insert("poll_interval_seconds".into(), 0.02.into());
        s
    };
    let mut none = source("none");
    none.insert("severity".into(), "none".into());
    v["sources"]["logs"] = serde_yaml::Value::Sequence(vec![source("auto").into(), none.into()]);
    v["sources"]["state_directory"] = dir.join("state").display().to_string().into();
    v["streams"]["logs"]["flush_milliseconds"] = 20.into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    AgentConfig::from_yaml("agent.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn severity_option_parses_strictly() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let c = agent_config(
        "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}")),
        dir.path(),
    );
    let got: Vec<LogSeverity> = c.sources.logs.iter().map(|l| l.severity).collect();
    assert_eq!(got, vec![LogSeverity::Auto, LogSeverity::Off]);
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["sources"]["logs"][0]["severity"] = "sometimes".into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    let err = AgentConfig::from_yaml("agent.yaml", &text)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("severity") && err.contains("auto") && err.contains("none"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_sink_writes_each_records_own_time_and_severity() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for sub in ["auto", "none"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap_or_else(|e| panic!("{e}"));
    }
    let sink = dir.path().join("received.jsonl");
    let collector = uctel_collector::daemon::start(collector_config(&sink))
        .await
        .unwrap_or_else(|e| panic!("collector: {e}"));
    // Written before the agent starts: read by one poll, shipped in as few frames as fit.
    let mut text = String::new();
    for i in 0..50 {
        for (line, _) in MIXED {
            text.push_str(&format!("{line} #{i}\n"));
        }
    }
    append(&dir.path().join("auto/app.log"), &text);
    append(&dir.path().join("none/app.log"), "ERROR not looked at\n");
    let (trigger, shutdown) = uctel_common::shutdown::channel();
    let agent = tokio::spawn(run_with(
        agent_config(collector.control_addr(), dir.path()),
        Options::default(),
        shutdown,
    ));
    let want = 50 * MIXED.len() + 1;
    let until = Instant::now() + Duration::from_secs(30);
    let lines: Vec<serde_json::Value> = loop {
        let got: Vec<serde_json::Value> = std::fs::read_to_string(&sink)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if got.len() >= want {
            break got;
        }
        assert!(
            Instant::now() < until,
            "{} of {want} lines in the sink",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    trigger.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(20), agent).await;
    let _ = collector.stop().await;

    let name = |s: Severity| uctel_collector::logsink::severity_name(s as i32);
    let mut per_frame: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
    for l in &lines {
        let message = l["message"].as_str().unwrap_or_default();
        let source = l["source"].as_str().unwrap_or_default();
        let severity = l["severity"].as_str().unwrap_or_default();
        let expected = if source.contains("/none/") {
            "unspecified"
        } else {
            MIXED
                .iter()
                .find(|(line, _)| message.starts_with(line))
                .map(|(_, s)| name(*s))
                .unwrap_or("?")
        };
        assert_eq!(severity, expected, "{l}");
        per_frame
            .entry((source.to_owned(), l["stream_seq"].as_u64().unwrap_or(0)))
            .or_default()
            .push(l["ts_ns"].as_u64().unwrap_or(0));
    }
    // The lines of one frame keep their own read times, in order, not the frame's one time.
    let (key, times) = per_frame
        .iter()
        .max_by_key(|(_, t)| t.len())
        .unwrap_or_else(|| panic!("no lines"));
    assert!(times.len() >= 10, "{key:?}: {} lines", times.len());
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{key:?}: {times:?}");
    assert!(
        times.first() < times.last(),
        "{key:?}: every line of the frame has the same ts_ns {times:?}"
    );
}
