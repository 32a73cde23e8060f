//! Unit tests of the parse rules: the joiner on Java and Python traces, [`Parser::apply`], and
//! no panic on any input.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::super::lines::LineEnd;
use super::*;

const JAVA: &str = "2026-12-07 01:02:03,100 ERROR [main] c.e.App - request failed
java.lang.IllegalStateException: boom
\tat com.example.App.handle(App.java:42)
\tat com.example.App.main(App.java:10)
Caused by: java.io.IOException: disk
\tat com.example.Io.read(Io.java:7)
\t... 2 more
2026-12-07 01:02:04,000 INFO [main] c.e.App - next
";

const PYTHON: &str = "2026-12-07 01:02:03,100 ERROR app: failed
Traceback (most recent call last):
  File \"/srv/app.py\", line 10, in <module>
    main()
  File \"/srv/app.py\", line 7, in main
    raise ValueError(\"bad\")
ValueError: bad
2026-12-07 01:02:04,000 INFO app: next
";

/// Lines of `text` with their start offsets, as a splitter emits them.
fn lines(text: &str) -> Vec<(&[u8], u64)> {
    let mut at = 0u64;
    text.split_inclusive('\n')
        .map(|l| {
            let start = at;
            at += l.len() as u64;
            (l.trim_end_matches('\n').as_bytes(), start)
        })
        .collect()
}

fn join(re: &str, text: &str, max_bytes: usize) -> (Vec<(String, u64, u64, u64)>, Joiner) {
    let mut j = Joiner::new(Regex::new(re).ok(), Duration::from_secs(1), max_bytes, 4096);
    let mut out = Vec::new();
    let t0 = Instant::now();
    for (l, start) in lines(text) {
        j.push(l, LineEnd::Newline, start, t0, &mut |r| {
            out.push((
                String::from_utf8_lossy(r.bytes).into_owned(),
                r.start,
                r.end_offset,
                r.cut_bytes,
            ))
        });
    }
    (out, j)
}

#[test]
fn java_trace_is_one_record_covering_its_lines() {
    let (out, mut j) = join(r"^\d{4}-\d{2}-\d{2} ", JAVA, 4096);
    assert_eq!(out.len(), 1, "the second record is still open: {out:?}");
    let trace_end = JAVA.find("2026-12-07 01:02:04").unwrap_or(0) as u64;
    assert_eq!(out[0].0, JAVA[..trace_end as usize - 1]);
    assert_eq!((out[0].1, out[0].2, out[0].3), (0, trace_end, 0));
    assert_eq!(
        j.pending_start(),
        Some(trace_end),
        "a checkpoint resumes here"
    );
    let mut last = Vec::new();
    assert!(j.flush(&mut |r| last.push((r.start, r.end_offset))));
    assert_eq!(last, vec![(trace_end, JAVA.len() as u64)]);
    assert_eq!(j.pending_start(), None);
}

#[test]
fn python_trace_by_non_blank_start() {
    // `^\S` would start a record at "Traceback" and "ValueError": a date start is the rule.
    let (out, _) = join(r"^\d{4}-", PYTHON, 4096);
    assert_eq!(out.len(), 1);
    assert!(out[0].0.starts_with("2026-12-07 01:02:03,100 ERROR"));
    assert!(out[0].0.ends_with("ValueError: bad"));
    assert_eq!(out[0].0.lines().count(), 7);
}

#[test]
fn a_record_over_the_limit_is_cut_and_counted_never_split() {
    let (out, mut j) = join(r"^\d{4}-", JAVA, 100);
    let mut all = out;
    j.flush(&mut |r| all.push((String::new(), r.start, r.end_offset, r.cut_bytes)));
    assert_eq!(all.len(), 2, "still two records");
    let first_len = JAVA.find("2026-12-07 01:02:04").unwrap_or(0) - 1;
    // Cut at the limit (a line joins with its `\n` and at least one byte, or not at all).
    assert!((99..=100).contains(&all[0].0.len()), "{}", all[0].0.len());
    assert_eq!(all[0].0.len() as u64 + all[0].3, first_len as u64);
    assert_eq!(all[1].1, all[0].2, "the records are contiguous");
}

#[test]
fn timeout_flushes_and_without_a_pattern_each_line_is_a_record() {
    let mut j = Joiner::new(Regex::new("^S").ok(), Duration::from_secs(1), 100, 100);
    let t0 = Instant::now();
    let mut n = 0;
    j.push(b"S one", LineEnd::Newline, 0, t0, &mut |_| n += 1);
    j.push(b" two", LineEnd::Newline, 6, t0, &mut |_| n += 1);
    assert!(!j.flush_if_stale(t0 + Duration::from_millis(999), &mut |_| n += 1));
    assert!(j.flush_if_stale(t0 + Duration::from_secs(1), &mut |_| n += 1));
    assert_eq!(n, 1);
    // A continuation with nothing open starts a record of its own.
    let mut got = Vec::new();
    j.push(b" orphan", LineEnd::Flushed, 11, t0, &mut |r| {
        got.push(r.start)
    });
    assert_eq!(j.pending_start(), Some(11));
    j.flush(&mut |r| {
        got.push(r.start);
        got.push(r.end_offset);
        assert!(r.flushed);
    });
    assert_eq!(got, vec![11, 18]);
    let mut plain = Joiner::new(None, Duration::ZERO, 100, 100);
    let mut ends = Vec::new();
    plain.push(b"a", LineEnd::Newline, 0, t0, &mut |r| {
        ends.push(r.end_offset)
    });
    plain.push(b"  b", LineEnd::Newline, 2, t0, &mut |r| {
        ends.push(r.end_offset)
    });
    assert_eq!(ends, vec![2, 6]);
    assert_eq!(plain.pending_start(), None);
}

fn record(message: &str, read_ns: u64) -> LogRecord {
    LogRecord {
        timestamp_ns: read_ns,
        message: message.to_owned(),
        ..LogRecord::default()
    }
}

fn parser(json: bool, timestamp: bool, max_fields: usize) -> Parser {
    Parser::new(&LogParseSection {
        json,
        timestamp,
        json_max_fields: max_fields,
        timezone: "UTC".into(),
        ..LogParseSection::default()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn json_fields_and_time_with_the_read_time_kept() {
    let read = chrono::DateTime::parse_from_rfc3339("2026-12-07T02:20:00Z")
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .unwrap_or(0) as u64;
    let mut r = record(
        r#"{"@timestamp":"2026-12-07T01:02:03.5Z","level":"error","req":{"id":7}}"#,
        read,
    );
    let mut counts = LogSourceCounts::default();
    parser(true, true, 64).apply(&mut r, &mut counts);
    let own = chrono::DateTime::parse_from_rfc3339("2026-12-07T01:02:03.5Z")
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .unwrap_or(0);
    assert_eq!(r.timestamp_ns as i64, own);
    let f: Vec<(&str, &str)> = r
        .fields
        .iter()
        .map(|f| (f.key.as_str(), f.value.as_str()))
        .collect();
    assert_eq!(
        f,
        vec![
            ("@timestamp", "2026-12-07T01:02:03.5Z"),
            ("level", "error"),
            ("req.id", "7"),
            ("read_time", "2026-12-07T02:20:00.000000000Z"),
        ]
    );
    // Too many keys: counted; a line without a time keeps its read time and no field.
    let mut r = record(r#"{"a":1,"b":2,"c":3}"#, read);
    parser(true, true, 1).apply(&mut r, &mut counts);
    assert_eq!(r.timestamp_ns, read);
    assert_eq!(r.fields.len(), 1);
    assert_eq!(counts.get(LogEvent::JsonFieldDropped), 2);
    // Off: nothing changes.
    let mut r = record("2026-12-07T01:02:03Z {\"a\":1}", read);
    parser(false, false, 64).apply(&mut r, &mut counts);
    assert_eq!((r.timestamp_ns, r.fields.len()), (read, 0));
}

#[test]
fn bad_settings_are_refused() {
    let bad = |f: &dyn Fn(&mut LogParseSection)| {
        let mut s = LogParseSection::default();
        f(&mut s);
        Parser::new(&s).is_err()
    };
    assert!(bad(&|s| s.timezone = "Mars/Base".into()));
    assert!(bad(&|s| s.timestamp_format = Some(String::new())));
    assert!(bad(&|s| {
        s.multiline = Some(MultilineSection {
            start_pattern: "(".into(),
            timeout_seconds: 1.0,
        })
    }));
    assert!(bad(&|s| {
        s.multiline = Some(MultilineSection {
            start_pattern: "^x".into(),
            timeout_seconds: 0.0,
        })
    }));
    assert!(!bad(&|_| {}));
}

proptest! {
    /// No input makes a parser panic; a joined record never exceeds its limit and its
    /// offsets cover its lines.
    #[test]
    fn no_panic_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                             max in 1usize..80) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let mut counts = LogSourceCounts::default();
        for p in [parser(true, true, 4), parser(false, true, 4)] {
            let mut r = record(&text, 1_796_605_200_000_000_000);
            p.apply(&mut r, &mut counts);
        }
        let _ = timestamp::from_line(&text, Some("%d/%b/%Y:%H:%M:%S %z"), Zone::Local, u64::MAX);
        let mut j = Joiner::new(Regex::new(r"^\S").ok(), Duration::from_secs(1), max, 4096);
        let mut at = 0u64;
        let mut prev_end = 0u64;
        let mut check = |r: Joined<'_>| {
            assert!(r.bytes.len() <= max);
            assert!(r.start >= prev_end && r.end_offset > r.start);
            prev_end = r.end_offset;
        };
        for l in bytes.split(|b| *b == b'\n') {
            j.push(l, LineEnd::Newline, at, Instant::now(), &mut check);
            at += l.len() as u64 + 1;
        }
        j.flush(&mut check);
    }
}

/// A tailer with `multiline` on `dir/*.log`, checkpointing to `dir/state.json`.
fn multiline_tailer(dir: &std::path::Path) -> super::super::LogTailer {
    let mut c = super::super::LogSourceConfig::new([dir.join("*.log").display().to_string()]);
    c.start_at = super::super::StartAt::Beginning;
    c.state_file = Some(dir.join("state.json"));
    c.parse.multiline = Some(MultilineSection {
        start_pattern: r"^\d{4}-".into(),
        timeout_seconds: 60.0,
    });
    super::super::LogTailer::new(c).unwrap_or_else(|e| panic!("{e}"))
}

fn poll_messages(t: &mut super::super::LogTailer) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    t.poll(Instant::now(), std::time::SystemTime::now, &mut out, 1000);
    out.into_iter().map(|r| (r.message, r.end_offset)).collect()
}

fn append(path: &std::path::Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{e}"));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn tailer_restart_in_the_middle_of_a_trace_reads_it_whole_once() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    let (head, rest) = JAVA.split_at(JAVA.find("Caused by").unwrap_or(0));
    let first = "2026-12-07 01:02:02,000 INFO start\n";
    append(&log, &format!("{first}{head}"));
    let mut t = multiline_tailer(dir.path());
    let got = poll_messages(&mut t);
    assert_eq!(got, vec![(first.trim_end().to_owned(), first.len() as u64)]);
    // Everything returned is checkpointed; the trace being joined is not.
    t.checkpoint().unwrap_or_else(|e| panic!("{e}"));
    drop(t);
    append(&log, rest);
    let mut t = multiline_tailer(dir.path());
    let got = poll_messages(&mut t);
    let trace_end = JAVA.find("2026-12-07 01:02:04").unwrap_or(0);
    assert_eq!(
        got,
        vec![(
            JAVA[..trace_end - 1].to_owned(),
            (first.len() + trace_end) as u64
        )],
        "the trace whole, once, and nothing of the first line again"
    );
}

#[test]
fn truncation_hands_on_the_record_being_joined() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("app.log");
    append(&log, PYTHON);
    let mut t = multiline_tailer(dir.path());
    let got = poll_messages(&mut t);
    assert_eq!(got.len(), 1, "the first record; the second is being joined");
    std::fs::write(&log, "  not joined to the old record\n").unwrap_or_else(|e| panic!("{e}"));
    let got = poll_messages(&mut t);
    assert_eq!(
        got.first().map(|(m, _)| m.as_str()),
        Some("2026-12-07 01:02:04,000 INFO app: next"),
        "{got:?}"
    );
    assert_eq!(got.len(), 1, "the new line is still being joined: {got:?}");
}
