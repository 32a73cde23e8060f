//! The log tailer across restarts: what happens to files while the agent is down, and what it
//! says about the files it finds truncated.
//!
//! A "restart" is a new [`LogTailer`] on the same state file; time is virtual (every poll gets
//! an explicit `Instant`) and every drive loop is bounded, so a hang fails the test.
//!
//! - `start_at` applies only to the first run (no state file yet): a file born while the agent
//!   was down is new data, read from its first byte (opentelemetry-collector-contrib #12769).
//! - copytruncate while the agent was down: the copy is recognised by the fingerprint of its
//!   first bytes and resumed at the saved offset; the truncated original is read from 0.
//! - A truncation, while running or while down, is counted (`file_truncated`) and logged once,
//!   naming the path.

use crate::support;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use support::capture::Capture;
use uctel_agent::sources::logs::{LogEvent, LogSourceConfig, LogTailer, StartAt};
use uctel_protocol::payload::LogRecord;

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn truncate(path: &Path) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(0))
        .expect("truncate");
}

fn line(n: u32) -> String {
    format!("line {n:06}")
}

fn lines(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
    range.map(line).collect()
}

/// Appends `line N\n` (12 bytes each) for every N of `range`.
fn append_lines(path: &Path, range: std::ops::RangeInclusive<u32>) {
    let text: String = range.map(|n| format!("{}\n", line(n))).collect();
    append(path, &text);
}

struct Env {
    dir: tempfile::TempDir,
    state: PathBuf,
    clock: Instant,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state").join("logs.json");
        std::fs::create_dir(dir.path().join("state")).expect("state dir");
        Self {
            dir,
            state,
            clock: Instant::now(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn tailer(&self, pattern: &str, start_at: StartAt) -> LogTailer {
        let mut c = LogSourceConfig::new([self.path(pattern).to_string_lossy().into_owned()]);
        c.start_at = start_at;
        c.max_line_bytes = 100;
        c.glob_interval = Duration::from_secs(1);
        c.rotate_wait = Duration::from_secs(5);
        c.state_file = Some(self.state.clone());
        LogTailer::new(c).expect("tailer")
    }

    /// Polls (7 records at a time, 100 ms apart) until a poll returns nothing and nothing is
    /// pending; bounded.
    fn drain(&mut self, t: &mut LogTailer) -> Vec<String> {
        self.drain_records(t)
            .into_iter()
            .map(|r| r.message)
            .collect()
    }

    /// [`Env::drain`], returning the whole records.
    fn drain_records(&mut self, t: &mut LogTailer) -> Vec<LogRecord> {
        let mut got = Vec::new();
        for _ in 0..200 {
            self.clock += Duration::from_millis(100);
            let mut out = Vec::new();
            let stats = t.poll(self.clock, SystemTime::now, &mut out, 7);
            assert!(stats.errors.is_empty(), "poll errors: {:?}", stats.errors);
            let empty = out.is_empty();
            got.extend(out);
            if empty && !stats.more_pending {
                return got;
            }
        }
        panic!("tailer did not settle after 200 polls; got {got:?}");
    }
}

#[test]
fn file_born_while_the_agent_was_down_is_read_from_its_first_byte() {
    let mut env = Env::new();
    let a = env.path("a.log");
    append(&a, "a old\n");
    {
        // First run: start_at = end skips what a.log already holds.
        let mut t = env.tailer("*.log", StartAt::End);
        assert!(env.drain(&mut t).is_empty());
        t.checkpoint().expect("checkpoint");
    }
    // While the agent is down: a.log grows, b.log is born (`echo x > b.log`).
    append(&a, "a new\n");
    append(&env.path("b.log"), "x\n");
    let mut t = env.tailer("*.log", StartAt::End);
    assert_eq!(env.drain(&mut t), vec!["a new", "x"]);
    t.checkpoint().expect("checkpoint");
    drop(t);

    // And again with an empty checkpoint being the only state: not a first run either.
    let mut t = env.tailer("*.log", StartAt::End);
    assert!(env.drain(&mut t).is_empty());
    append(&env.path("c.log"), "c 1\n");
    env.clock += Duration::from_secs(1); // the next glob evaluation finds it
    assert_eq!(env.drain(&mut t), vec!["c 1"], "a file born while running");
}

#[test]
fn first_run_with_a_glob_matching_nothing_still_makes_later_files_new_data() {
    let mut env = Env::new();
    {
        let mut t = env.tailer("*.log", StartAt::End);
        assert!(env.drain(&mut t).is_empty());
        t.checkpoint().expect("checkpoint");
    }
    append(&env.path("b.log"), "x\n");
    let mut t = env.tailer("*.log", StartAt::End);
    assert_eq!(env.drain(&mut t), vec!["x"]);
}

#[test]
fn start_positions_of_the_first_run_are_recorded_before_any_checkpoint_call() {
    let mut env = Env::new();
    let a = env.path("a.log");
    append(&a, "a old\n");
    {
        // First run, killed before it ever checkpoints (SIGKILL: no final checkpoint).
        let mut t = env.tailer("*.log", StartAt::End);
        assert!(env.drain(&mut t).is_empty());
    }
    assert!(
        env.state.exists(),
        "the first scan records where start_at put each file"
    );
    append(&a, "a new\n");
    append(&env.path("b.log"), "x\n");
    let mut t = env.tailer("*.log", StartAt::End);
    assert_eq!(env.drain(&mut t), vec!["a new", "x"]);
}

/// Checkpoints `app.log` after reading lines 1..=30 (360 bytes, more than the fingerprint),
/// then, "while the agent is down", appends 31..=35, runs copytruncate (`cp app.log
/// app.log.1; : > app.log`) and appends 36..=40 to the truncated file.
fn copytruncate_while_down(env: &mut Env, start_at: StartAt) -> LogTailer {
    let log = env.path("app.log");
    append_lines(&log, 1..=30);
    {
        let mut first = env.tailer("app.log*", StartAt::Beginning);
        assert_eq!(env.drain(&mut first), lines(1..=30));
        first.checkpoint().expect("checkpoint");
    }
    append_lines(&log, 31..=35);
    std::fs::copy(&log, env.path("app.log.1")).expect("cp app.log app.log.1");
    truncate(&log);
    append_lines(&log, 36..=40);
    let copy = std::fs::metadata(env.path("app.log.1")).expect("stat copy");
    let orig = std::fs::metadata(&log).expect("stat");
    assert_ne!(copy.ino(), orig.ino(), "the copy is another inode");
    env.tailer("app.log*", start_at)
}

#[test]
fn copytruncate_while_down_resumes_the_copy_at_the_saved_offset() {
    for start_at in [StartAt::Beginning, StartAt::End] {
        let mut env = Env::new();
        let mut t = copytruncate_while_down(&mut env, start_at);
        // The copy first (older data) from where the checkpoint left off, then the truncated
        // original from its first byte: nothing repeated, nothing skipped.
        assert_eq!(env.drain(&mut t), lines(31..=40), "start_at {start_at:?}");
        assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);
        assert_eq!(t.counts().records, 10);
        t.checkpoint().expect("checkpoint");
        drop(t);

        // The next restart knows both files under their own inodes.
        append_lines(&env.path("app.log"), 41..=42);
        let mut t = env.tailer("app.log*", start_at);
        assert_eq!(env.drain(&mut t), lines(41..=42));
        assert_eq!(t.counts().get(LogEvent::FileTruncated), 0);
    }
}

#[test]
fn new_file_opening_with_the_same_banner_is_not_taken_for_a_copy() {
    // Files that open with the same 300-byte banner (longer than the fingerprint): app.log is
    // rotated away while the agent is down (the glob does not match the rotated name) and a
    // new app.log with the same banner and more bytes than the saved offset replaces it.
    let banner: Vec<String> = (1..=5)
        .map(|n| format!("# banner {n} {}", "=".repeat(48)))
        .collect();
    let banner_text: String = banner.iter().map(|l| format!("{l}\n")).collect();
    assert_eq!(banner_text.len(), 300);
    let mut env = Env::new();
    let log = env.path("app.log");
    append(&log, &banner_text);
    append_lines(&log, 1..=10);
    {
        let mut t = env.tailer("app.log", StartAt::Beginning);
        assert_eq!(env.drain(&mut t).len(), 15);
        t.checkpoint().expect("checkpoint");
    }
    std::fs::rename(&log, env.path("app.log.1")).expect("mv app.log app.log.1");
    append(&log, &banner_text);
    append_lines(&log, 11..=40);
    let mut t = env.tailer("app.log", StartAt::Beginning);
    let mut expected = banner;
    expected.extend(lines(11..=40));
    assert_eq!(env.drain(&mut t), expected, "the whole new file");
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 1);
}

#[test]
fn checkpoint_entry_without_fingerprint_falls_back_to_dev_and_inode() {
    // A state file of an older agent: no `head_len` / `head_hash`.
    let mut env = Env::new();
    let log = env.path("app.log");
    append(&log, "one\ntwo\n");
    let meta = std::fs::metadata(&log).expect("stat");
    let state = format!(
        r#"{{"version":1,"files":[{{"path":"{}","dev":{},"ino":{},"offset":4}}]}}"#,
        log.display(),
        meta.dev(),
        meta.ino()
    );
    std::fs::write(&env.state, state).expect("write state");
    let mut t = env.tailer("app.log*", StartAt::Beginning);
    assert_eq!(env.drain(&mut t), vec!["two"]);
}

#[test]
fn truncation_in_place_is_counted_and_logged_once_naming_the_path() {
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let mut env = Env::new();
        let log = env.path("app.log");
        let other = env.path("other.log");
        append_lines(&log, 1..=5);
        append_lines(&other, 1..=3);
        let mut t = env.tailer("*.log", StartAt::Beginning);
        assert_eq!(env.drain(&mut t).len(), 8);
        assert!(capture.warnings().is_empty(), "{:?}", capture.warnings());

        truncate(&log);
        // Many polls see the file shorter than before: one event, one line.
        assert!(env.drain(&mut t).is_empty());
        append_lines(&log, 6..=7);
        assert_eq!(env.drain(&mut t), lines(6..=7));
        assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);
        let warnings = capture.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let shown = log.display().to_string();
        assert!(warnings[0].contains(&shown), "{warnings:?} names {shown}");
        assert!(!warnings[0].contains("other.log"), "{warnings:?}");

        // A second truncation is a distinct event: a second line.
        truncate(&log);
        append_lines(&log, 8..=8);
        assert_eq!(env.drain(&mut t), lines(8..=8));
        assert_eq!(t.counts().get(LogEvent::FileTruncated), 2);
        assert_eq!(capture.warnings().len(), 2, "{:?}", capture.warnings());
    });
}

#[test]
fn truncation_while_down_is_counted_and_logged_naming_the_path() {
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let mut env = Env::new();
        let mut t = copytruncate_while_down(&mut env, StartAt::Beginning);
        assert_eq!(env.drain(&mut t), lines(31..=40));
        assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);
        let warnings = capture.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let shown = env.path("app.log").display().to_string();
        assert!(warnings[0].contains(&format!("{shown} ")) || warnings[0].ends_with(&shown));
    });
}

/// `(message, file_id, end_offset)` of each record.
fn positions(records: &[LogRecord]) -> Vec<(String, u64, u64)> {
    records
        .iter()
        .map(|r| (r.message.clone(), r.file_id, r.end_offset))
        .collect()
}

#[test]
fn records_carry_a_stable_file_id_and_increasing_end_offsets_across_restarts() {
    let mut env = Env::new();
    let log = env.path("app.log");
    // 360 bytes: more than the fingerprint, so a copy can be recognised later.
    append_lines(&log, 1..=30);
    let first = {
        let mut t = env.tailer("app.log*", StartAt::Beginning);
        let got = env.drain_records(&mut t);
        // Killed with the checkpoint behind what was sent: only lines 1..=25 settled.
        t.settle(25);
        t.checkpoint_settled().expect("checkpoint");
        got
    };
    let id = first.first().map(|r| r.file_id).expect("records");
    assert_ne!(id, 0, "a file gets a non-zero file_id");
    // Line N ends at byte 12 N (12 bytes a line, the newline included).
    let expect = |range: std::ops::RangeInclusive<u32>, id: u64| -> Vec<(String, u64, u64)> {
        range.map(|n| (line(n), id, 12 * u64::from(n))).collect()
    };
    assert_eq!(positions(&first), expect(1..=30, id));

    // Restart: lines 26..=30 are read again with the same identity and offsets as before
    // (what the collector recognises as a replay), then the new lines go on from there.
    append_lines(&log, 31..=32);
    let second = {
        let mut t = env.tailer("app.log*", StartAt::Beginning);
        let got = env.drain_records(&mut t);
        t.checkpoint().expect("checkpoint");
        got
    };
    assert_eq!(positions(&second), expect(26..=32, id));

    // copytruncate while down: the copy inherits the identity and goes on after the saved
    // offset; the truncated original is other bytes at the same offsets: a new identity.
    append_lines(&log, 33..=35);
    std::fs::copy(&log, env.path("app.log.1")).expect("cp app.log app.log.1");
    truncate(&log);
    append_lines(&log, 36..=37);
    let mut t = env.tailer("app.log*", StartAt::Beginning);
    let third = env.drain_records(&mut t);
    let (copy, original) = third.split_at(3.min(third.len()));
    assert_eq!(positions(copy), expect(33..=35, id));
    let new_id = original
        .first()
        .map(|r| r.file_id)
        .expect("original's records");
    assert!(
        new_id != 0 && new_id != id,
        "the truncated file is another file"
    );
    assert_eq!(
        positions(original),
        vec![(line(36), new_id, 12), (line(37), new_id, 24)]
    );
    t.checkpoint().expect("checkpoint");
    drop(t);

    // Both identities survive the next restart (from the state file).
    append_lines(&log, 38..=38);
    append_lines(&env.path("app.log.1"), 100..=100);
    let mut t = env.tailer("app.log*", StartAt::Beginning);
    let mut fourth = positions(&env.drain_records(&mut t));
    fourth.sort();
    assert_eq!(
        fourth,
        vec![(line(38), new_id, 36), (line(100), id, 12 * 36)]
    );
}
