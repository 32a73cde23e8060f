//! The log tailer's IO layer on real files (no logrotate): discovery, start position, budgets,
//! deletion, state file handling.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use uctel_agent::sources::logs::{LogEvent, LogSourceConfig, LogSourceError, LogTailer, StartAt};

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn config(dir: &Path, pattern: &str) -> LogSourceConfig {
    let mut c = LogSourceConfig::new([dir.join(pattern).to_string_lossy().into_owned()]);
    c.start_at = StartAt::Beginning;
    c.max_line_bytes = 100;
    c.glob_interval = Duration::from_secs(1);
    c.rotate_wait = Duration::from_secs(5);
    c.state_file = Some(dir.join("state.json"));
    c
}

fn poll(t: &mut LogTailer, now: Instant, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let stats = t.poll(now, SystemTime::now, &mut out, max);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!(stats.records, out.len());
    out.into_iter().map(|r| r.message).collect()
}

#[test]
fn start_at_end_skips_existing_lines_but_reads_files_created_later_from_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    append(&dir.path().join("a.log"), "old 1\nold 2\n");
    let mut c = config(dir.path(), "*.log");
    c.start_at = StartAt::End;
    let mut t = LogTailer::new(c).expect("tailer");
    let t0 = Instant::now();
    assert!(poll(&mut t, t0, 100).is_empty());
    append(&dir.path().join("a.log"), "new 3\n");
    append(&dir.path().join("b.log"), "b 1\nb 2\n");
    // b.log is found at the next glob evaluation (1 s later), from its first line.
    assert_eq!(
        poll(&mut t, t0 + Duration::from_millis(500), 100),
        vec!["new 3"]
    );
    assert_eq!(
        poll(&mut t, t0 + Duration::from_secs(1), 100),
        vec!["b 1", "b 2"]
    );
    assert_eq!(t.counts().files_opened, 2);
}

#[test]
fn exclude_patterns_and_non_files_are_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    append(&dir.path().join("a.log"), "a\n");
    append(&dir.path().join("a.log.gz"), "\u{1f}binary\n");
    std::fs::create_dir(dir.path().join("dir.log")).expect("mkdir");
    let mut c = config(dir.path(), "*");
    c.include = vec![dir.path().join("*.log*").to_string_lossy().into_owned()];
    c.exclude = vec![dir.path().join("*.gz").to_string_lossy().into_owned()];
    let mut t = LogTailer::new(c).expect("tailer");
    assert_eq!(poll(&mut t, Instant::now(), 100), vec!["a"]);
    assert_eq!(t.files().len(), 1);
}

#[test]
fn budgets_bound_each_poll_and_report_more_pending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    let text: String = (0..100).map(|n| format!("{n:09}\n")).collect(); // 10 bytes a line
    append(&log, &text);
    let mut c = config(dir.path(), "a.log");
    c.max_bytes_per_poll = 95;
    let mut t = LogTailer::new(c).expect("tailer");
    let now = Instant::now();
    let mut all = Vec::new();
    let mut polls = 0;
    loop {
        let mut out = Vec::new();
        let stats = t.poll(now, SystemTime::now, &mut out, 4);
        assert!(out.len() <= 4);
        assert!(stats.bytes <= 95);
        all.extend(out.into_iter().map(|r| r.message));
        polls += 1;
        if !stats.more_pending {
            break;
        }
        assert!(polls < 100, "no progress");
    }
    let expected: Vec<String> = (0..100).map(|n| format!("{n:09}")).collect();
    assert_eq!(all, expected);
    assert_eq!(t.counts().bytes_read, 1000);
    // max_records = 0 reads nothing and loses nothing.
    append(&log, "last\n");
    let mut out = Vec::new();
    let stats = t.poll(now, SystemTime::now, &mut out, 0);
    assert!(out.is_empty() && stats.more_pending);
    assert_eq!(poll(&mut t, now, 10), vec!["last"]);
}

#[test]
fn deleted_file_is_drained_then_closed_after_rotate_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    append(&log, "1\n");
    let mut writer = OpenOptions::new().append(true).open(&log).expect("open");
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    let t0 = Instant::now();
    assert_eq!(poll(&mut t, t0, 10), vec!["1"]);
    std::fs::remove_file(&log).expect("rm");
    writer.write_all(b"2\n").expect("write to unlinked inode");
    assert_eq!(poll(&mut t, t0 + Duration::from_secs(1), 10), vec!["2"]);
    writer.write_all(b"3\n").expect("write to unlinked inode");
    assert_eq!(poll(&mut t, t0 + Duration::from_secs(4), 10), vec!["3"]);
    assert_eq!(t.counts().files_closed, 0, "still within rotate_wait");
    assert!(poll(&mut t, t0 + Duration::from_secs(7), 10).is_empty());
    assert_eq!(t.counts().files_closed, 1);
    assert!(t.files().is_empty());
}

#[test]
fn checkpoint_is_json_written_atomically_and_resumes_mid_discard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    append(&log, &format!("first\n{}", "x".repeat(300)));
    let state = dir.path().join("state.json");
    {
        let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
        let got = poll(&mut t, Instant::now(), 10);
        assert_eq!(got, vec!["first".to_owned(), "x".repeat(100)]);
        assert_eq!(t.counts().get(LogEvent::LineTruncated), 1);
        t.checkpoint().expect("checkpoint");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("read state")).expect("json");
    let meta = std::fs::metadata(&log).expect("stat");
    let entry = &json["files"][0];
    assert_eq!(json["version"], 1);
    assert_eq!(entry["path"], log.to_string_lossy().as_ref());
    assert_eq!(entry["dev"], meta.dev());
    assert_eq!(entry["ino"], meta.ino());
    assert_eq!(entry["offset"], 306);
    assert_eq!(entry["discarding"], true);
    assert!(!dir.path().join("state.json.tmp").exists());

    // The rest of the over-long line arrives while stopped: still discarded after restart.
    append(&log, &format!("{}\nthird\n", "y".repeat(50)));
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    assert_eq!(poll(&mut t, Instant::now(), 10), vec!["third"]);
    assert_eq!(t.counts().discarded_bytes, 50);
}

#[test]
fn checkpoint_entry_with_other_first_bytes_is_not_trusted() {
    // Same (dev, inode) but a different fingerprint: inode reused by another file.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    append(&log, "one\ntwo\n");
    let meta = std::fs::metadata(&log).expect("stat");
    let state = format!(
        r#"{{"version":1,"files":[{{"path":"{}","dev":{},"ino":{},"offset":4,"head_len":8,"head_hash":12345}}]}}"#,
        log.display(),
        meta.dev(),
        meta.ino()
    );
    std::fs::write(dir.path().join("state.json"), state).expect("write state");
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    assert_eq!(poll(&mut t, Instant::now(), 10), vec!["one", "two"]);
}

#[test]
fn checkpoint_offset_past_end_means_truncated_while_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    append(&log, "one\ntwo\n");
    {
        let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
        assert_eq!(poll(&mut t, Instant::now(), 10), vec!["one", "two"]);
        t.checkpoint().expect("checkpoint");
    }
    OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(0))
        .expect("truncate");
    append(&log, "on\n"); // shorter than the saved offset; head fingerprint differs too
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    assert_eq!(poll(&mut t, Instant::now(), 10), vec!["on"]);
}

#[test]
fn configuration_errors_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(dir.path(), "a.log");
    c.include = vec!["/var/log/[".to_owned()];
    assert!(matches!(
        LogTailer::new(c),
        Err(LogSourceError::Pattern { .. })
    ));

    let mut c = config(dir.path(), "a.log");
    c.max_line_bytes = 0;
    assert!(matches!(
        LogTailer::new(c),
        Err(LogSourceError::ZeroLimit {
            field: "max_line_bytes"
        })
    ));

    let c = config(dir.path(), "a.log");
    std::fs::write(dir.path().join("state.json"), "{ not json").expect("write");
    let err = LogTailer::new(c).expect_err("corrupt state must not be ignored");
    assert!(err.to_string().contains("state.json"), "{err}");

    let mut c = config(dir.path(), "a.log");
    c.state_file = None;
    let mut t = LogTailer::new(c).expect("no state file");
    t.checkpoint().expect("no-op without a state file");
}

fn numbered(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
    range.map(|n| format!("line {n:06}")).collect()
}

fn append_numbered(path: &Path, range: std::ops::RangeInclusive<u32>) {
    let text: String = numbered(range).into_iter().map(|l| l + "\n").collect();
    append(path, &text);
}

/// Polls (7 records at a time, the clock advancing 100 ms a poll) until nothing is left;
/// bounded, so a hang fails the test.
fn drain(t: &mut LogTailer, clock: &mut Instant) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..200 {
        *clock += Duration::from_millis(100);
        let mut out = Vec::new();
        let stats = t.poll(*clock, SystemTime::now, &mut out, 7);
        assert!(stats.errors.is_empty(), "{:?}", stats.errors);
        let empty = out.is_empty();
        got.extend(out.into_iter().map(|r| r.message));
        if empty && !stats.more_pending {
            return got;
        }
    }
    panic!("tailer did not settle");
}

#[test]
fn restart_from_checkpoint_neither_repeats_nor_skips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    let mut clock = Instant::now();
    append_numbered(&log, 1..=40);
    append(&log, "line 000041"); // unfinished when the agent stops
    {
        let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
        let mut out = Vec::new();
        let stats = t.poll(clock, SystemTime::now, &mut out, 25);
        assert!(stats.more_pending);
        let got: Vec<String> = out.into_iter().map(|r| r.message).collect();
        assert_eq!(got, numbered(1..=25));
        // The first 25 lines were handed to the framer: commit them, then stop.
        t.checkpoint().expect("checkpoint");
        let mut out = Vec::new();
        let _ = t.poll(clock, SystemTime::now, &mut out, 5);
        assert_eq!(
            out.len(),
            5,
            "read but never checkpointed: delivered again after restart"
        );
    }
    append(&log, "\n");
    append_numbered(&log, 42..=50);

    // A new instance with start_at = End still resumes at the checkpoint.
    let mut c = config(dir.path(), "a.log");
    c.start_at = StartAt::End;
    let mut t = LogTailer::new(c).expect("tailer");
    assert_eq!(drain(&mut t, &mut clock), numbered(26..=50));
    t.checkpoint().expect("checkpoint");
    drop(t);

    // Restart again with nothing new: nothing is delivered.
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    assert_eq!(drain(&mut t, &mut clock), Vec::<String>::new());
}

/// The state file's entry for `ino`, if any.
fn state_entry(dir: &Path, ino: u64) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("state.json")).expect("read state");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json["files"]
        .as_array()
        .and_then(|files| files.iter().find(|e| e["ino"] == ino).cloned())
}

#[test]
fn checkpoint_of_settled_lines_resumes_at_the_first_unsettled_line_of_each_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    append(&a, "a 0\na 1\na 2\n");
    // b's second line is longer than max_line_bytes (100): cut, its rest discarded.
    append(&b, &format!("b 0\n{}\nb 2\nb 3\n", "L".repeat(150)));
    {
        let mut t = LogTailer::new(config(dir.path(), "*.log")).expect("tailer");
        let got = poll(&mut t, Instant::now(), 100);
        assert_eq!(got.len(), 7);
        assert_eq!(got[4], "L".repeat(100));
        assert_eq!(t.unsettled(), 7);
        // a's lines and b's first line were sent; the cut line and what follows were not.
        t.settle(4);
        assert_eq!(t.unsettled(), 3);
        t.checkpoint_settled().expect("checkpoint");
        let entry =
            state_entry(dir.path(), std::fs::metadata(&b).expect("stat").ino()).expect("b's entry");
        assert_eq!(entry["offset"], 4, "the start of the cut line");
        assert_eq!(entry["discarding"], false);
    }
    append(&a, "a 3\n");
    let mut t = LogTailer::new(config(dir.path(), "*.log")).expect("tailer");
    let mut expected = vec!["a 3".to_owned(), "L".repeat(100)];
    expected.extend(["b 2".to_owned(), "b 3".to_owned()]);
    assert_eq!(poll(&mut t, Instant::now(), 100), expected);
    assert_eq!(t.counts().get(LogEvent::LineTruncated), 1);
}

#[test]
fn unsettled_lines_of_a_truncated_generation_resume_at_the_start_of_the_new_content() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("a.log");
    append(&log, "old 0\nold 1\nold 2\n");
    {
        let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
        let t0 = Instant::now();
        assert_eq!(poll(&mut t, t0, 100), vec!["old 0", "old 1", "old 2"]);
        OpenOptions::new()
            .write(true)
            .open(&log)
            .and_then(|f| f.set_len(0))
            .expect("truncate");
        append(&log, "new 0\nnew 1\n");
        assert_eq!(poll(&mut t, t0, 100), vec!["new 0", "new 1"]);
        // Only "old 0" was sent: "old 1" and "old 2" are gone with the truncation, and all
        // of the new content is still to be sent.
        t.settle(1);
        t.checkpoint_settled().expect("checkpoint");
    }
    let mut t = LogTailer::new(config(dir.path(), "a.log")).expect("tailer");
    assert_eq!(poll(&mut t, Instant::now(), 100), vec!["new 0", "new 1"]);
}

#[test]
fn a_closed_file_keeps_its_entry_while_lines_read_from_it_are_unsettled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("app.log");
    append(&log, "one\ntwo\n");
    let ino = std::fs::metadata(&log).expect("stat").ino();
    let mut t = LogTailer::new(config(dir.path(), "app.log")).expect("tailer");
    let t0 = Instant::now();
    assert_eq!(poll(&mut t, t0, 100), vec!["one", "two"]);
    // create-rotation: the old inode is read to its end and closed after rotate_wait.
    std::fs::rename(&log, dir.path().join("app.log.1")).expect("rename");
    append(&log, "three\n");
    assert_eq!(
        poll(&mut t, t0 + Duration::from_secs(1), 100),
        vec!["three"]
    );
    assert!(poll(&mut t, t0 + Duration::from_secs(7), 100).is_empty());
    assert_eq!(t.counts().files_closed, 1);
    t.settle(1);
    t.checkpoint_settled().expect("checkpoint");
    let entry = state_entry(dir.path(), ino).expect("the closed file's entry");
    assert_eq!(entry["offset"], 4, "the start of \"two\"");
    t.settle(2);
    t.checkpoint_settled().expect("checkpoint");
    assert!(state_entry(dir.path(), ino).is_none());
}

#[test]
fn records_are_stamped_by_the_wall_clock_passed_in_read_for_each_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    append(&dir.path().join("a.log"), "one\ntwo\nthree\npartial");
    let mut c = config(dir.path(), "*.log");
    c.state_file = None;
    let mut t = LogTailer::new(c).expect("tailer");
    // A stepping clock: 1 s after the epoch, then one more nanosecond at each read.
    let mut reads = 0u64;
    let mut clock = || {
        reads += 1;
        SystemTime::UNIX_EPOCH + Duration::from_secs(1) + Duration::from_nanos(reads)
    };
    let t0 = Instant::now();
    let mut out = Vec::new();
    let stats = t.poll(t0, &mut clock, &mut out, 100);
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    let stamped: Vec<(&str, u64)> = out
        .iter()
        .map(|r| (r.message.as_str(), r.timestamp_ns))
        .collect();
    assert_eq!(
        stamped,
        vec![
            ("one", 1_000_000_001),
            ("two", 1_000_000_002),
            ("three", 1_000_000_003)
        ]
    );
    // The partial last line, flushed after its timeout, is stamped when it is emitted.
    out.clear();
    let _ = t.poll(t0 + Duration::from_secs(2), &mut clock, &mut out, 100);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].message.as_str(), out[0].timestamp_ns),
        ("partial", 1_000_000_004)
    );
}

/// `rewind` (an RC lane failed): the lines returned and not settled are returned again, in
/// order, from the first unsettled one, the partial last line forgotten and read again
/// whole; settled lines are not repeated. Without a state file the positions are kept only
/// with `keep_positions`; lines of a generation truncated away are counted as gone.
#[test]
fn rewind_returns_the_unsettled_lines_again_from_the_first_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.log");
    append(&path, &numbered(1..=5).join("\n"));
    append(&path, "\npart");
    let mut t = LogTailer::new(config(dir.path(), "*.log")).expect("tailer");
    let t0 = Instant::now();
    assert_eq!(poll(&mut t, t0, 100), numbered(1..=5));
    t.settle(2);
    assert_eq!(t.rewind(), 0);
    assert_eq!(t.unsettled(), 0);
    append(&path, "ial 6\n");
    let mut want = numbered(3..=5);
    want.push("partial 6".to_owned());
    assert_eq!(poll(&mut t, t0, 100), want);
    assert_eq!(t.unsettled(), 4);
    // Nothing settled: all of them again, and the checkpoint resumes at line 3.
    assert_eq!(t.rewind(), 0);
    assert_eq!(poll(&mut t, t0, 2), numbered(3..=4));
    t.checkpoint_settled().expect("checkpoint");
    let state = std::fs::read_to_string(dir.path().join("state.json")).expect("state");
    let line3: usize = numbered(1..=2).iter().map(|l| l.len() + 1).sum();
    assert!(state.contains(&format!("\"offset\": {line3},")), "{state}");

    // No state file: positions kept only when asked to.
    let other = tempfile::tempdir().expect("tempdir");
    append(
        &other.path().join("b.log"),
        &(numbered(1..=3).join("\n") + "\n"),
    );
    let mut c = config(other.path(), "*.log");
    c.state_file = None;
    let mut plain = LogTailer::new(c.clone()).expect("tailer");
    assert_eq!(poll(&mut plain, t0, 100).len(), 3);
    assert_eq!(plain.rewind(), 0);
    assert!(poll(&mut plain, t0, 100).is_empty(), "nothing to rewind to");
    c.keep_positions = true;
    let mut kept = LogTailer::new(c).expect("tailer");
    assert_eq!(poll(&mut kept, t0, 100).len(), 3);
    assert_eq!(kept.rewind(), 0);
    assert_eq!(poll(&mut kept, t0, 100), numbered(1..=3));

    // Truncated since the lines were read: they are gone, the new content is read.
    std::fs::write(other.path().join("b.log"), "new 1\n").expect("truncate");
    assert_eq!(poll(&mut kept, t0, 100), vec!["new 1"]);
    assert_eq!(kept.rewind(), 3, "the lines of the truncated generation");
    assert_eq!(poll(&mut kept, t0, 100), vec!["new 1"]);
}
