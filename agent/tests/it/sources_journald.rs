//! The journald source against real journal files: `systemd-journal-remote` (Debian package
//! `systemd-journal-remote`, `scripts/install-deps`) writes export-format entries into a
//! journal file in a directory, and the source reads it with `journalctl --directory`.
//! Checked: the entries' own time, priority and fields; excluded units; resuming from the
//! saved cursor without a repeat or a gap (settled records only), across a rotation and a
//! vacuum while the source is down and a rotation while it runs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uctel_agent::config::StartAt;
use uctel_agent::sources::journald::{JournalConfig, JournalSource, JournaldSection};
use uctel_protocol::payload::{LogRecord, Severity};

const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// Microseconds of the first entry written by the tests.
const T0: u64 = 1_700_000_000_000_000;

/// Writes entries `range` (message `entry <n>`, unit `u<n % 3>.service`, priority
/// `n % 8`, unique times) into `<dir>/<file>` with systemd-journal-remote.
fn write_entries(dir: &Path, file: &str, range: std::ops::Range<u64>) {
    write_entries_rotating(dir, file, range, None);
}

/// As [`write_entries`], and entry `rotate_after` carries 260 fields of distinct names: the
/// file's field hash table passes journald's fill limit (3/4 of its 333 slots), so
/// systemd-journal-remote rotates before the next entry, as journald does: the file is
/// archived (`remote@<seqnum id>-….journal`) and a new one continues the same sequence.
fn write_entries_rotating(
    dir: &Path,
    file: &str,
    range: std::ops::Range<u64>,
    rotate_after: Option<u64>,
) {
    assert!(
        Path::new(JOURNAL_REMOTE).exists(),
        "{JOURNAL_REMOTE} missing: install the Debian package systemd-journal-remote (scripts/install-deps)"
    );
    let mut export = String::new();
    for n in range {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID=0123456789abcdef0123456789abcdef\n\
             MESSAGE=entry {n}\nPRIORITY={}\n_SYSTEMD_UNIT=u{}.service\n_PID={}\n_COMM=app\n\
             SYSLOG_IDENTIFIER=app{}\n\n",
            T0 + n,
            1000 + n,
            n % 8,
            n % 3,
            100 + n,
            n % 3
        ));
        if rotate_after == Some(n) {
            export.pop();
            for k in 0..260 {
                export.push_str(&format!("ROTATE_{k}=x\n"));
            }
            export.push('\n');
        }
    }
    let mut child = Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join(file).display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-journal-remote");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(export.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "systemd-journal-remote: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Archives `<dir>/remote.journal` under journald's archive name
/// (`remote@<anything>.journal`), as a rotation does.
fn rotate(dir: &Path, tag: &str) -> PathBuf {
    let to = dir.join(format!(
        "remote@0000000000000000000000000000000{tag}-0000000000000001-0000000000000001.journal"
    ));
    std::fs::rename(dir.join("remote.journal"), &to).unwrap();
    to
}

fn config(dir: &Path, state: &Path, section: JournaldSection) -> JournalConfig {
    let section = JournaldSection {
        directory: Some(dir.to_owned()),
        ..section
    };
    JournalConfig::new(&section, 2048, Some(state))
}

/// Polls until `n` records arrived (or 20 s passed).
fn poll_n(s: &mut JournalSource, n: usize) -> Vec<LogRecord> {
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while out.len() < n && Instant::now() < until {
        let room = n - out.len();
        if !s.poll(&mut out, room) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    out
}

/// Polls for `d` and returns everything that arrived.
fn poll_for(s: &mut JournalSource, d: Duration) -> Vec<LogRecord> {
    let mut out = Vec::new();
    let until = Instant::now() + d;
    while Instant::now() < until {
        if !s.poll(&mut out, 1000) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    out
}

fn messages(r: &[LogRecord]) -> Vec<String> {
    r.iter().map(|r| r.message.clone()).collect()
}

fn range(r: std::ops::Range<u64>) -> Vec<String> {
    r.map(|n| format!("entry {n}")).collect()
}

fn beginning() -> JournaldSection {
    JournaldSection {
        start_at: StartAt::Beginning,
        ..Default::default()
    }
}

#[test]
fn entries_carry_their_own_time_priority_and_fields() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..8);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    let got = poll_n(&mut s, 8);
    assert_eq!(messages(&got), range(0..8));
    let r = &got[3];
    assert_eq!(r.timestamp_ns, (T0 + 3) * 1000, "the journal's own time");
    assert_eq!(r.severity, Severity::Error as i32, "PRIORITY=3");
    assert_eq!(got[4].severity, Severity::Warn as i32, "PRIORITY=4");
    assert_eq!(got[0].severity, Severity::Fatal as i32, "PRIORITY=0");
    assert_eq!(got[7].severity, Severity::Debug as i32, "PRIORITY=7");
    let fields: Vec<(&str, &str)> = r
        .fields
        .iter()
        .map(|f| (f.key.as_str(), f.value.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("_SYSTEMD_UNIT", "u0.service"),
            ("_PID", "103"),
            ("_COMM", "app"),
            ("SYSLOG_IDENTIFIER", "app0")
        ]
    );
    assert_eq!(r.source, "journald");
    assert_eq!(r.end_offset, 4, "the entry's sequence number");
    assert_ne!(r.file_id, 0);
}

#[test]
fn a_restart_resumes_after_the_last_settled_entry_only() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..40);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 40)), range(0..40));
    // Only 6 of the 40 were settled (sent) before the agent died.
    s.settle(6);
    s.checkpoint_settled().unwrap();
    drop(s);
    write_entries(dir.path(), "remote.journal", 40..42);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    // More than journalctl's 10-entry backlog default in follow mode.
    let again = poll_n(&mut s, 36);
    assert_eq!(
        messages(&again),
        range(6..42),
        "not settled: read again, once"
    );
    assert!(poll_for(&mut s, Duration::from_millis(500)).is_empty());
    s.settle(36);
    s.checkpoint_settled().unwrap();
    drop(s);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert!(
        poll_for(&mut s, Duration::from_millis(700)).is_empty(),
        "everything settled: nothing repeated"
    );
}

#[test]
fn rotation_and_vacuum_while_down() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..5);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 5)), range(0..5));
    s.settle(5);
    s.checkpoint_settled().unwrap();
    drop(s);
    // Down: more entries, the file rotated, a new file written.
    write_entries(dir.path(), "remote.journal", 5..8);
    rotate(dir.path(), "1");
    write_entries(dir.path(), "remote.journal", 8..11);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(
        messages(&poll_n(&mut s, 6)),
        range(5..11),
        "across the rotation"
    );
    s.settle(6);
    s.checkpoint_settled().unwrap();
    drop(s);
    // Down again: the archive holding the saved cursor is vacuumed (deleted); the cursor
    // still places the reader after it.
    rotate(dir.path(), "2");
    write_entries(dir.path(), "remote.journal", 11..14);
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().contains("remote@") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    let got = poll_n(&mut s, 3);
    assert_eq!(messages(&got), range(11..14));
    assert!(poll_for(&mut s, Duration::from_millis(500)).is_empty());
}

#[test]
fn rotation_while_running_and_excluded_units() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..6);
    let section = JournaldSection {
        exclude_units: vec!["u1".into()],
        ..beginning()
    };
    let mut s = JournalSource::new(config(dir.path(), state.path(), section.clone())).unwrap();
    let want = |r: std::ops::Range<u64>| -> Vec<String> {
        r.filter(|n| n % 3 != 1)
            .map(|n| format!("entry {n}"))
            .collect()
    };
    assert_eq!(messages(&poll_n(&mut s, 4)), want(0..6));
    rotate(dir.path(), "1");
    write_entries(dir.path(), "remote.journal", 6..12);
    assert_eq!(
        messages(&poll_n(&mut s, 4)),
        want(6..12),
        "followed across it"
    );
    assert_eq!(s.counts().excluded, 4);
    s.settle(8);
    s.checkpoint_settled().unwrap();
    drop(s);
    let mut s = JournalSource::new(config(dir.path(), state.path(), section)).unwrap();
    assert!(poll_for(&mut s, Duration::from_millis(700)).is_empty());
}

#[test]
fn include_units_and_start_at_end() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..6);
    let section = JournaldSection {
        include_units: vec!["u2.service".into()],
        ..Default::default()
    };
    // First run at the end: the 6 entries present are not read, later ones are.
    let mut s = JournalSource::new(config(dir.path(), state.path(), section.clone())).unwrap();
    assert!(poll_for(&mut s, Duration::from_millis(700)).is_empty());
    write_entries(dir.path(), "remote.journal", 6..12);
    assert_eq!(messages(&poll_n(&mut s, 2)), ["entry 8", "entry 11"]);
    drop(s);
    // Killed before anything settled: the start position was saved at once, so the two
    // entries come again, and nothing before them.
    let mut s = JournalSource::new(config(dir.path(), state.path(), section)).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 2)), ["entry 8", "entry 11"]);
    assert!(poll_for(&mut s, Duration::from_millis(500)).is_empty());
}

#[test]
fn a_missing_directory_is_retried_until_it_appears() {
    let base = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let dir = base.path().join("later");
    let mut s = JournalSource::new(config(&dir, state.path(), beginning())).unwrap();
    assert!(poll_for(&mut s, Duration::from_millis(300)).is_empty());
    std::fs::create_dir(&dir).unwrap();
    write_entries(&dir, "remote.journal", 0..3);
    assert_eq!(messages(&poll_n(&mut s, 3)), range(0..3));
}

#[test]
fn the_section_is_parsed_and_checked() {
    const MINIMAL: &str =
        "agent_id: a1\ncollector:\n  control: 127.0.0.1:7470\nauth:\n  token: secret\n";
    let ok = format!(
        "{MINIMAL}sources:\n  journald:\n    directory: /j\n    include_units: [sshd]\n    \
         exclude_matches: {{_COMM: [cron]}}\n    start_at: beginning\n"
    );
    let c = uctel_agent::config::AgentConfig::from_yaml("a.yaml", &ok).unwrap();
    let j = c.sources.journald.unwrap();
    assert_eq!(j.directory.as_deref(), Some(Path::new("/j")));
    assert_eq!(j.start_at, StartAt::Beginning);
    assert_eq!(j.journalctl_path, Path::new("journalctl"));
    let bad = format!(
        "{MINIMAL}sources:\n  journald:\n    max_message_bytes: 1\n    poll_interval_seconds: 0\n    \
         include_matches: {{lower: [x]}}\n"
    );
    let e = uctel_agent::config::AgentConfig::from_yaml("a.yaml", &bad)
        .unwrap_err()
        .to_string();
    for key in [
        "sources.journald.max_message_bytes",
        "sources.journald.poll_interval_seconds",
        "sources.journald.include_matches.lower",
    ] {
        assert!(e.contains(key), "{key} not in {e}");
    }
}

fn archives(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains('@')
        })
        .count()
}

/// `journalctl --directory=<dir> --vacuum-size=1`: every archived file deleted, as
/// journald's size limits do.
fn vacuum(dir: &Path) {
    let out = Command::new("journalctl")
        .arg(format!("--directory={}", dir.display()))
        .arg("--vacuum-size=1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(archives(dir), 0, "vacuumed");
}

#[test]
fn entries_vacuumed_while_down_are_counted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..5);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 5)), range(0..5));
    s.settle(5);
    s.checkpoint_settled().unwrap();
    drop(s);
    // Down: entries 5..12 written, the file rotated after entry 8 (same sequence id), and
    // the archive (entries 0..=8) vacuumed: 5, 6, 7, 8 were never read.
    write_entries_rotating(dir.path(), "remote.journal", 5..12, Some(8));
    assert_eq!(archives(dir.path()), 1, "journal-remote rotated");
    vacuum(dir.path());
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 3)), range(9..12));
    assert_eq!(s.counts().vacuumed, 4, "entries 5..=8, exactly");
    assert_eq!(s.counts().vacuumed_unfiltered, 0);
    // A new sequence id (the file set started afresh) is not a hole.
    s.settle(3);
    s.checkpoint_settled().unwrap();
    drop(s);
    std::fs::remove_file(dir.path().join("remote.journal")).unwrap();
    write_entries(dir.path(), "remote.journal", 12..15);
    let mut s = JournalSource::new(config(dir.path(), state.path(), beginning())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 3)), range(12..15));
    assert!(poll_for(&mut s, Duration::from_millis(300)).is_empty());
    assert_eq!(s.counts().vacuumed, 0, "a new sequence id is not a hole");
}

#[test]
fn vacuumed_while_down_with_journalctl_matches_is_an_upper_bound() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let section = JournaldSection {
        include_units: vec!["u2".into()],
        ..beginning()
    };
    write_entries(dir.path(), "remote.journal", 0..6);
    let mut s = JournalSource::new(config(dir.path(), state.path(), section.clone())).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 2)), ["entry 2", "entry 5"]);
    s.settle(2);
    s.checkpoint_settled().unwrap();
    drop(s);
    // Down: 6..14 written, rotated after 10, vacuumed: 6..=10 gone unread (of which 8 was
    // u2's); the stream's own jumps (entries of other units) are not holes.
    write_entries_rotating(dir.path(), "remote.journal", 6..14, Some(10));
    vacuum(dir.path());
    let mut s = JournalSource::new(config(dir.path(), state.path(), section)).unwrap();
    assert_eq!(messages(&poll_n(&mut s, 1)), ["entry 11"]);
    assert!(poll_for(&mut s, Duration::from_millis(300)).is_empty());
    assert_eq!(
        s.counts().vacuumed_unfiltered,
        5,
        "entries 6..=10 of every unit: an upper bound of the 1 record lost"
    );
    assert_eq!(s.counts().vacuumed, 0, "not counted as dropped records");
}

/// The pids whose parent is `parent` and whose command is `comm` (from `/proc/<pid>/stat`:
/// `pid (comm) state ppid …`), not counting zombies.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if &stat[open + 1..close] == comm
            && rest.first() != Some(&"Z")
            && rest.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
        {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` is still a live (not zombie) process named `comm`.
fn alive(pid: u32, comm: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.contains(&format!("({comm})")) && !s.split(')').nth(1).unwrap_or("").starts_with(" Z")
    })
}

#[test]
fn journalctl_never_outlives_a_sigkilled_agent() {
    let dir = tempfile::tempdir().unwrap();
    write_entries(dir.path(), "remote.journal", 0..3);
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        format!(
            "agent_id: pdeath\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n\
             sources:\n  state_directory: {0}/state\n  journald:\n    directory: {0}\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_uctel-agent"))
        .arg("--config")
        .arg(&cfg)
        .args(["--dry-run", "--log-level", "warn"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut found = Vec::new();
    while found.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        found = children_named(agent.id(), "journalctl");
    }
    assert_eq!(found.len(), 1, "the agent's journalctl --follow child");
    let child = found[0];
    // journalctl 252 --follow exits by itself once it notices its stdout closed (it polls
    // it while idle); stopped, it notices nothing, as when busy seeking a large journal or
    // in a version without that check: only the kernel's death signal can end it then.
    let signal = |sig: &str| {
        Command::new("kill")
            .args([sig, &child.to_string()])
            .status()
    };
    assert!(signal("-STOP").unwrap().success());
    agent.kill().unwrap(); // SIGKILL: no destructor runs
    agent.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while alive(child, "journalctl") && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survived = alive(child, "journalctl");
    if survived {
        let _ = signal("-KILL");
    }
    assert!(!survived, "journalctl {child} outlived the SIGKILLed agent");
}
