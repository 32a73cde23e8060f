//! The log tailer against the real `logrotate` binary (Debian package `logrotate`).
//!
//! Every test writes numbered lines before, during and after a rotation, polls, and asserts the
//! exact sequence delivered: no line lost, none repeated, order kept. Time is virtual: each poll
//! gets an explicit `Instant`, so glob intervals, partial-line timeouts and the rotate wait are
//! crossed deterministically.
//!
//! With copytruncate there is an inherent race: lines written after the tailer's last read and
//! before logrotate truncates the file are only in the copy. The tests write nothing while
//! logrotate runs and read everything before it, which is the only way any tailer of the
//! original path gets every line.
//!
//! These tests FAIL (never skip) when `logrotate` is not installed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use uctel_agent::sources::logs::{LogEvent, LogSourceConfig, LogTailer, StartAt};
use uctel_protocol::payload::LogRecord;

struct Env {
    dir: tempfile::TempDir,
    log: PathBuf,
    state: PathBuf,
    clock: Instant,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("app.log");
        let state = dir.path().join("tailer-state.json");
        File::create(&log).expect("create log");
        Self {
            dir,
            log,
            state,
            clock: Instant::now(),
        }
    }

    fn config(&self, pattern: &str) -> LogSourceConfig {
        let mut c =
            LogSourceConfig::new([self.dir.path().join(pattern).to_string_lossy().into_owned()]);
        c.start_at = StartAt::Beginning;
        c.max_line_bytes = 100;
        c.partial_line_timeout = Duration::from_secs(1);
        c.rotate_wait = Duration::from_secs(5);
        c.glob_interval = Duration::from_secs(1);
        c.state_file = Some(self.state.clone());
        c
    }

    /// Advances the virtual clock.
    fn tick(&mut self, d: Duration) -> Instant {
        self.clock += d;
        self.clock
    }

    /// Runs `logrotate -f` on app.log with the given extra directives.
    fn logrotate(&self, directives: &str) {
        let conf = self.dir.path().join("logrotate.conf");
        let status = self.dir.path().join("logrotate.status");
        std::fs::write(
            &conf,
            format!(
                "{} {{\n    rotate 3\n    nocompress\n    missingok\n    {directives}\n}}\n",
                self.log.display()
            ),
        )
        .expect("write logrotate.conf");
        let out = Command::new(logrotate_binary())
            .arg("-f")
            .arg("-s")
            .arg(&status)
            .arg(&conf)
            .output()
            .expect("run logrotate");
        assert!(
            out.status.success(),
            "logrotate failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `logrotate` from PATH or /usr/sbin; a clear failure when it is not installed.
fn logrotate_binary() -> PathBuf {
    let in_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("logrotate"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    in_path
        .into_iter()
        .chain([
            PathBuf::from("/usr/sbin/logrotate"),
            PathBuf::from("/sbin/logrotate"),
        ])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the `logrotate` binary is required by these tests and was not found in PATH or \
                 /usr/sbin: install it (Debian/Ubuntu: `apt-get install -y logrotate`)"
            )
        })
}

fn line(n: u32) -> String {
    format!("line {n:06}")
}

fn lines(range: std::ops::RangeInclusive<u32>) -> Vec<String> {
    range.map(line).collect()
}

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open for append");
    f.write_all(text.as_bytes()).expect("append");
}

fn append_lines(path: &Path, range: std::ops::RangeInclusive<u32>) {
    let text: String = range.map(|n| format!("{}\n", line(n))).collect();
    append(path, &text);
}

/// Polls until a poll returns nothing and nothing is pending (bounded: a hang fails the test),
/// advancing the clock by `step` before each poll.
fn drain(env: &mut Env, tailer: &mut LogTailer, step: Duration) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..200 {
        let now = env.tick(step);
        let mut out: Vec<LogRecord> = Vec::new();
        let stats = tailer.poll(now, SystemTime::now, &mut out, 7);
        assert!(stats.errors.is_empty(), "poll errors: {:?}", stats.errors);
        let empty = out.is_empty();
        got.extend(out.into_iter().map(|r| r.message));
        if empty && !stats.more_pending {
            return got;
        }
    }
    panic!(
        "tailer did not settle after 200 polls; got {} lines",
        got.len()
    );
}

const SHORT: Duration = Duration::from_millis(100);

#[test]
fn create_rotation_drains_old_inode_then_follows_new_file() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=50);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(1..=50));

    // Written, not yet read, when logrotate renames the file.
    append_lines(&env.log, 51..=60);
    // A writer that has the file open keeps writing to the old inode until it reopens.
    let mut old_writer = OpenOptions::new()
        .append(true)
        .open(&env.log)
        .expect("open");
    env.logrotate("create");
    for n in 61..=65 {
        writeln!(old_writer, "{}", line(n)).expect("write old inode");
    }
    drop(old_writer);
    append_lines(&env.log, 66..=100); // the writer reopened the path: new file

    assert_eq!(drain(&mut env, &mut t, SHORT), lines(51..=100));
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 1);

    // A second rotation: app.log -> app.log.1, app.log.1 -> app.log.2.
    append_lines(&env.log, 101..=150);
    env.logrotate("create");
    append_lines(&env.log, 151..=200);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(101..=200));
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 2);

    // Past the rotate wait, a full scan closes the rotated files.
    let _ = drain(&mut env, &mut t, Duration::from_secs(6));
    assert_eq!(t.counts().files_closed, 2);
    assert_eq!(t.files().len(), 1);
    assert_eq!(t.counts().records, 200);
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 0);
}

#[test]
fn copytruncate_detected_by_size_when_polled_right_after() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=50);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(1..=50));

    env.logrotate("copytruncate");
    assert_eq!(std::fs::metadata(&env.log).expect("stat").len(), 0);
    assert_eq!(drain(&mut env, &mut t, SHORT), Vec::<String>::new());
    append_lines(&env.log, 51..=80);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(51..=80));
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 0);
    assert_eq!(t.counts().truncated_unread_bytes, 0);
}

#[test]
fn copytruncate_detected_by_head_when_file_regrew_past_offset() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=50);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(1..=50));

    env.logrotate("copytruncate");
    // More bytes than before the rotation are written before the next poll: the size alone
    // no longer shows the truncation, the changed first bytes do.
    append_lines(&env.log, 51..=130);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(51..=130));
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);

    // And once more, to show the fingerprint was renewed after the restart at 0.
    env.logrotate("copytruncate");
    append_lines(&env.log, 131..=250);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(131..=250));
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 2);
}

#[test]
fn plain_truncation_restarts_at_zero_then_rotation_still_followed() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=30);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(1..=30));

    // `: > app.log` (truncate in place), then new lines.
    OpenOptions::new()
        .write(true)
        .open(&env.log)
        .and_then(|f| f.set_len(0))
        .expect("truncate");
    append_lines(&env.log, 31..=40);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(31..=40));
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);

    env.logrotate("create");
    append_lines(&env.log, 41..=60);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(41..=60));
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 1);
}

#[test]
fn partial_last_line_completed_by_writer_after_rotation_is_one_record_in_order() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    let mut writer = OpenOptions::new()
        .append(true)
        .open(&env.log)
        .expect("open");
    for n in 1..=10 {
        writeln!(writer, "{}", line(n)).expect("write");
    }
    write!(writer, "{}", line(11)).expect("write partial");
    assert_eq!(
        drain(&mut env, &mut t, SHORT),
        lines(1..=10),
        "partial line held back"
    );

    env.logrotate("create");
    append_lines(&env.log, 12..=20); // another writer already uses the new file
                                     // The successor waits while the rotated file holds an unfinished line.
    let mut out = Vec::new();
    let stats = t.poll(
        env.tick(Duration::from_millis(50)),
        SystemTime::now,
        &mut out,
        7,
    );
    assert!(out.is_empty(), "{out:?}");
    assert!(
        stats.more_pending,
        "the new file is pending behind the partial line"
    );
    writer
        .write_all(b"\n")
        .expect("complete the line in the old inode");
    drop(writer);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(11..=20));
    assert_eq!(t.counts().get(LogEvent::PartialLineFlushed), 0);
}

#[test]
fn partial_last_line_never_completed_is_flushed_after_timeout_in_order() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=10);
    append(&env.log, &line(11)); // no newline, ever
    assert_eq!(
        drain(&mut env, &mut t, Duration::from_millis(10)),
        lines(1..=10)
    );

    env.logrotate("create");
    append_lines(&env.log, 12..=20);
    // Polls 300 ms apart: the 1 s timeout passes, the partial line goes out, then the new file.
    assert_eq!(
        drain(&mut env, &mut t, Duration::from_millis(300)),
        lines(11..=20)
    );
    assert_eq!(t.counts().get(LogEvent::PartialLineFlushed), 1);
}

#[test]
fn long_line_is_cut_and_rest_discarded_across_rotation() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    assert_eq!(
        drain(&mut env, &mut t, SHORT),
        Vec::<String>::new(),
        "file found, empty"
    );
    append_lines(&env.log, 1..=5);
    let long = format!("{} {}", line(6), "x".repeat(1000));
    append(&env.log, &format!("{long}\n"));
    append_lines(&env.log, 7..=10);
    env.logrotate("create");
    append_lines(&env.log, 11..=15);

    let mut expected = lines(1..=5);
    expected.push(long[..100].to_owned());
    expected.extend(lines(7..=15));
    assert_eq!(drain(&mut env, &mut t, SHORT), expected);
    assert_eq!(t.counts().get(LogEvent::LineTruncated), 1);
    assert_eq!(t.counts().discarded_bytes, long.len() as u64 - 100);
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 1);
}

#[test]
fn invalid_utf8_is_replaced_and_counted_across_copytruncate() {
    let mut env = Env::new();
    let mut t = LogTailer::new(env.config("app.log")).expect("tailer");
    append_lines(&env.log, 1..=2);
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(&env.log)
            .expect("open");
        f.write_all(b"line 000003 \xFF\xFE end\n").expect("write");
    }
    append_lines(&env.log, 4..=5);
    let mut expected = lines(1..=2);
    expected.push("line 000003 \u{FFFD}\u{FFFD} end".to_owned());
    expected.extend(lines(4..=5));
    assert_eq!(drain(&mut env, &mut t, SHORT), expected);

    env.logrotate("copytruncate");
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(&env.log)
            .expect("open");
        f.write_all(b"line 000006 \xC3\n").expect("write"); // truncated 2-byte sequence
    }
    append_lines(&env.log, 7..=8);
    let mut expected = vec!["line 000006 \u{FFFD}".to_owned()];
    expected.extend(lines(7..=8));
    assert_eq!(drain(&mut env, &mut t, SHORT), expected);
    assert_eq!(t.counts().get(LogEvent::InvalidUtf8), 2);
    assert_eq!(t.counts().get(LogEvent::FileTruncated), 1);
}

#[test]
fn restart_after_rotation_while_stopped_reads_rotated_tail_then_new_file() {
    let mut env = Env::new();
    append_lines(&env.log, 1..=40);
    {
        // The glob also matches rotated names, so a rotation while stopped loses nothing.
        let mut t = LogTailer::new(env.config("app.log*")).expect("tailer");
        let mut out = Vec::new();
        let _ = t.poll(env.tick(SHORT), SystemTime::now, &mut out, 25);
        assert_eq!(out.len(), 25);
        t.checkpoint().expect("checkpoint");
    }
    append_lines(&env.log, 41..=60);
    env.logrotate("create");
    append_lines(&env.log, 61..=80);

    let mut config = env.config("app.log*");
    config.start_at = StartAt::End;
    let mut t = LogTailer::new(config).expect("tailer");
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(26..=80));
    assert_eq!(t.counts().get(LogEvent::RotationCreate), 1);
    t.checkpoint().expect("checkpoint");

    // And a rotation while running, with app.log.1 -> app.log.2 also matched by the glob.
    append_lines(&env.log, 81..=90);
    env.logrotate("create");
    append_lines(&env.log, 91..=100);
    assert_eq!(drain(&mut env, &mut t, SHORT), lines(81..=100));
    assert_eq!(t.counts().records, 75);
}
