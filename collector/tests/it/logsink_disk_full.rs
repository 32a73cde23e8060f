//! Regression: the file log sink on a full disk. An in-process collector writes its log file
//! to a 256 KiB tmpfs and a test agent sends more log records than fit. Every record must end
//! up either in a file as a whole JSON line or in
//! `uctel_collector_records_dropped_total{reason="log_sink_error"}`, once; and when space is
//! freed the sink writes (and rotates) again by itself.
//!
//! Mounting needs root: as another user the test says it is skipped and passes (CI runs as
//! root). As root, a failed mount fails the test.

use crate::support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{collector_config, eventually, now_ns, sample, AgentOptions, LogStream, TestAgent};
use uctel_protocol::framer::PushOutcome;
use uctel_protocol::payload::{LogRecord, Severity};

const AGENT: &str = "disk";
/// Records per frame.
const PER_FRAME: u64 = 10;
const MESSAGE_BYTES: usize = 100;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A tmpfs mounted on a temporary directory; unmounted on drop (also when the test fails).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (skipped) when not root.
    fn mount(size: &str) -> Option<Tmpfs> {
        if !is_root() {
            eprintln!("logsink_disk_full: skipped, mounting a tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "mount -t tmpfs on {} failed: {}",
            dir.path().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Busy (a failed test left the collector running): detach it lazily, so that the
            // temporary directory can still be removed.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// A log record whose message is `MESSAGE_BYTES` long and names record `n`.
fn record(n: u64) -> LogRecord {
    let mut message = format!("record {n:06} ");
    message.extend(std::iter::repeat_n('x', MESSAGE_BYTES - message.len()));
    LogRecord {
        timestamp_ns: now_ns(),
        severity: Severity::Info as i32,
        source: "/var/log/test.log".into(),
        message,
        ..Default::default()
    }
}

/// Sends records `from..to`, `PER_FRAME` to a frame.
async fn send_records(agent: &mut TestAgent, logs: &mut LogStream, from: u64, to: u64) {
    for first in (from..to).step_by(PER_FRAME as usize) {
        for n in first..(first + PER_FRAME).min(to) {
            match logs.framer.push(&record(n), now_ns()) {
                PushOutcome::Appended => {}
                other => panic!("record {n} did not fit a frame of {PER_FRAME}: {other:?}"),
            }
        }
        agent.send(logs.framer.flush().expect("a frame")).await;
    }
}

fn counter(text: &str, series: &str) -> u64 {
    sample(text, series).unwrap_or(0.0) as u64
}

fn received(text: &str) -> u64 {
    counter(
        text,
        &format!("uctel_collector_records_received_total{{agent=\"{AGENT}\",stream=\"logs\"}}"),
    )
}

fn dropped(text: &str) -> u64 {
    counter(
        text,
        &format!(
            "uctel_collector_records_dropped_total{{agent=\"{AGENT}\",reason=\"log_sink_error\"}}"
        ),
    )
}

/// The log file and its rotated files.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the log directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("logs.jsonl"))
        })
        .collect();
    files.sort();
    files
}

/// The record numbers of every line in `files`; each line must be whole JSON, and no record
/// may be there twice.
fn records_in(files: &[PathBuf]) -> HashSet<u64> {
    let mut seen = HashSet::new();
    for path in files {
        let bytes = std::fs::read(path).expect("read a log file");
        assert!(
            bytes.is_empty() || bytes.ends_with(b"\n"),
            "{} ends in a partial line",
            path.display()
        );
        for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|e| {
                panic!(
                    "{} line {}: not JSON ({e}): {:?}",
                    path.display(),
                    i + 1,
                    String::from_utf8_lossy(line)
                )
            });
            let message = v["message"].as_str().expect("a message");
            let n: u64 = message
                .strip_prefix("record ")
                .and_then(|m| m.get(..6))
                .and_then(|m| m.parse().ok())
                .unwrap_or_else(|| panic!("unexpected message {message:?}"));
            assert!(seen.insert(n), "record {n} written twice");
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_keeps_whole_lines_counts_every_lost_record_and_recovers() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    let dir = fs.path();
    let mut config = collector_config(dir);
    // Rotated files fill the disk; deleting them frees space while the sink runs.
    config.logs.file.max_file_bytes = 64 * 1024;
    config.logs.file.max_files = 8;
    let running = uctel_collector::start(config).await.unwrap();
    let mut agent = TestAgent::connect(running.control_addr(), AgentOptions::new(AGENT))
        .await
        .unwrap();
    let mut logs = LogStream::new(2);

    // 1,000 records of ~290-byte lines: more than 256 KiB.
    send_records(&mut agent, &mut logs, 0, 1000).await;
    let text = eventually("1,000 records received", || {
        let text = running.render_metrics().ok()?;
        (received(&text) == 1000).then_some(text)
    })
    .await;
    let lost = dropped(&text);
    let written = records_in(&log_files(dir));
    eprintln!(
        "{} records in whole lines, {lost} counted dropped",
        written.len()
    );
    assert_eq!(
        written.len() as u64 + lost,
        1000,
        "{} lines in the files, {lost} records counted dropped",
        written.len()
    );
    assert!(lost > 0, "the disk never filled: {} lines", written.len());

    // Free space: delete the rotated files (not open); the active file stays.
    let active = dir.join("logs.jsonl");
    let kept = records_in(std::slice::from_ref(&active));
    for path in log_files(dir) {
        if path != active {
            std::fs::remove_file(&path).unwrap();
        }
    }

    // 300 more (~87 KB): written whole, and the active file rotates on the way.
    send_records(&mut agent, &mut logs, 1000, 1300).await;
    let text = eventually("1,300 records received", || {
        let text = running.render_metrics().ok()?;
        (received(&text) == 1300).then_some(text)
    })
    .await;
    assert_eq!(
        dropped(&text),
        lost,
        "records dropped after space was freed"
    );
    let after = records_in(&log_files(dir));
    let expected: HashSet<u64> = kept.iter().copied().chain(1000..1300).collect();
    assert_eq!(after, expected);
    assert!(
        dir.join("logs.jsonl.1").exists(),
        "no rotation after recovery: {:?}",
        log_files(dir)
    );

    agent.goodbye(vec![logs.final_state()]).await;
    let ledger = eventually("ledger after goodbye", || {
        let l = running.ledger(AGENT);
        (!l.is_empty()).then_some(l)
    })
    .await;
    assert_eq!(ledger[0].1.records_received, 1300, "{ledger:?}");
    assert_eq!(ledger[0].1.records_lost, 0, "{ledger:?}");
    running.stop().await.unwrap();
}
