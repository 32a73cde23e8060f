//! Fault-matrix rows of the host log sources (journald, kernel log), through the real
//! `uctel-collector` and `uctel-agent` binaries (soft transport, free ports).
//!
//! - `journald_sigkill_and_rotation_while_down`: the journald source reads a journal
//!   directory written by `systemd-journal-remote`; the agent is SIGKILLed while entries
//!   flow, the journal file is rotated (archived under journald's archive name) and a new
//!   one written while it is down, the agent starts again. Every entry reaches the
//!   collector's JSON Lines sink exactly once, with its own time and fields: the saved cursor
//!   covers only settled entries, and what the agent sends again after the SIGKILL is
//!   discarded by the collector as a replay (`file_id` = the cursor's sequence id,
//!   `end_offset` = its sequence number).
//! - `kmsg_ring_overwritten_while_the_agent_is_stopped` (root; `/proc/sys/kernel/printk_devkmsg`
//!   set to `on` for the row and restored): the agent follows the real `/dev/kmsg`, is
//!   SIGSTOPped, the ring buffer is flooded until the records after the last one it read are
//!   overwritten, and it is SIGCONTed: its next read gets `EPIPE`. The sequence numbers the
//!   collector's sink lacks between the last record before the flood and the last after it
//!   are exactly the agent's drops (`kmsg_overwritten`, and any other counted drop), and
//!   `kmsg_overwritten` is not zero.
//! - `journald_vacuum_while_down_counted_exactly`: the agent stops (SIGTERM) after 100
//!   entries; while it is down systemd-journal-remote writes 100 more and rotates after the
//!   50th (same sequence id), and `journalctl --vacuum-size=1` deletes the archive. After the
//!   restart the 50 entries after the hole arrive once, and the 50 vacuumed unread are
//!   counted exactly as `journal_vacuumed` by the agent and, through its heartbeats, by the
//!   collector (`uctel_collector_agent_records_dropped_total`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_yaml::{Mapping, Value};
use uctel_tests::pipeline::{AgentFigures, Pipeline};
use uctel_tests::{exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(20);
const JOURNAL_REMOTE: &str = "/lib/systemd/systemd-journal-remote";
/// Microseconds of entry 0.
const T0: u64 = 1_700_000_000_000_000;

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// Writes entries `range` (`journal entry <n>`, unit `row.service`, unique times) into
/// `<dir>/remote.journal` with systemd-journal-remote.
fn write_entries(dir: &Path, range: std::ops::Range<u64>) {
    assert!(
        Path::new(JOURNAL_REMOTE).exists(),
        "{JOURNAL_REMOTE} missing: install systemd-journal-remote (scripts/install-deps)"
    );
    let mut export = String::new();
    for n in range {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n\
             _BOOT_ID=0123456789abcdef0123456789abcdef\nMESSAGE=journal entry {n}\n\
             PRIORITY=6\n_SYSTEMD_UNIT=row.service\n_PID={}\n_COMM=row\nSYSLOG_IDENTIFIER=row\n\n",
            T0 + n * 1000,
            1000 + n,
            1000 + n
        ));
    }
    journal_remote(dir, &export);
}

/// Writes the export-format `export` into `dir/remote.journal` with one run of
/// `systemd-journal-remote` (systemd's own writer).
fn journal_remote(dir: &Path, export: &str) {
    let mut child = Command::new(JOURNAL_REMOTE)
        .arg(format!("--output={}", dir.join("remote.journal").display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-journal-remote");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(export.as_bytes()).expect("export input");
    drop(stdin);
    let out = child.wait_with_output().expect("systemd-journal-remote");
    assert!(
        out.status.success(),
        "systemd-journal-remote: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sink records of `agent` from the journald source: message → (times seen, ts_ns, unit).
fn journal_lines(p: &Pipeline, agent: &str) -> BTreeMap<String, (u32, u64, String)> {
    let text = std::fs::read_to_string(p.path().join("collector-logs.jsonl")).unwrap_or_default();
    let mut seen: BTreeMap<String, (u32, u64, String)> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("torn sink line {line:?}: {e}"));
        if v["agent"] != agent || v["source"] != "journald" {
            continue;
        }
        let m = v["message"].as_str().unwrap_or_default().to_owned();
        let e = seen.entry(m).or_default();
        e.0 += 1;
        e.1 = v["ts_ns"].as_u64().unwrap_or(0);
        e.2 = v["fields"]["_SYSTEMD_UNIT"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    }
    seen
}

fn wait_delivered(p: &Pipeline, agent: &str, n: u64) {
    wait_for("journal entries in the sink", UP, tick(), || {
        let seen = journal_lines(p, agent);
        match (0..n).find(|i| !seen.contains_key(&format!("journal entry {i}"))) {
            None => Ok(()),
            Some(i) => Err(format!("entry {i} not delivered yet ({} seen)", seen.len())),
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
}

#[test]
fn journald_sigkill_and_rotation_while_down() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let journal = p.path().join("journal");
    std::fs::create_dir_all(&journal).expect("journal dir");
    write_entries(&journal, 0..300);
    let dir = journal.display().to_string();
    let i = p.add_agent_with("jrnl", 0.0, 1.0, |y| {
        let mut j = Mapping::new();
        j.insert("directory".into(), dir.clone().into());
        j.insert("start_at".into(), "beginning".into());
        y.set("sources.journald", Value::Mapping(j));
    });
    p.wait_flowing(1, &["jrnl"], &["metrics"], UP);
    wait_delivered(&p, "jrnl", 300);
    // Entries flowing when the agent is SIGKILLed: no final checkpoint.
    write_entries(&journal, 300..600);
    wait_for("the agent read entries past 300", UP, tick(), || {
        let f = AgentFigures::read(&p.agents[i].scrape()?);
        let read = f.records_sent["logs"] + f.records_dropped["logs"];
        if read > 300 {
            Ok(())
        } else {
            Err(format!("{read}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[i].daemon.log()));
    p.agents[i].daemon.kill();
    // Down: more entries, the file archived as journald names archives, a new file.
    write_entries(&journal, 600..700);
    std::fs::rename(
        journal.join("remote.journal"),
        journal.join(
            "remote@00000000000000000000000000000001-0000000000000001-0000000000000001.journal",
        ),
    )
    .expect("rotate");
    write_entries(&journal, 700..800);
    p.agents[i].daemon.restart();
    wait_delivered(&p, "jrnl", 800);
    // Pacing, not a wait for a state: an entry sent twice would arrive within this time.
    std::thread::sleep(Duration::from_secs(2));
    p.agents[i].daemon.stop(STOP);

    let seen = journal_lines(&p, "jrnl");
    let twice: Vec<(&String, &(u32, u64, String))> =
        seen.iter().filter(|(_, v)| v.0 != 1).collect();
    assert!(
        twice.is_empty(),
        "entries not delivered exactly once: {twice:?}"
    );
    assert_eq!(seen.len(), 800, "only the entries written arrive");
    for n in [0u64, 299, 450, 650, 799] {
        let (_, ts, unit) = &seen[&format!("journal entry {n}")];
        assert_eq!(
            *ts,
            (T0 + n * 1000) * 1000,
            "entry {n}: the journal's own time"
        );
        assert_eq!(unit, "row.service");
    }
    let scrape = p.scrape().expect("collector scrape");
    let replayed = scrape.count(
        "uctel_collector_records_replayed_total",
        &[("agent", "jrnl")],
    );
    eprintln!(
        "row=journald-sigkill-rotation replayed={replayed} delivered={}",
        seen.len()
    );
    p.collector.stop(STOP);
}

/// Sets `/proc/sys/kernel/printk_devkmsg` for the row (writes to `/dev/kmsg` are
/// rate-limited to 10 per 5 s otherwise) and restores it when dropped.
struct DevkmsgOn(String);

const DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";

impl DevkmsgOn {
    fn set() -> Option<Self> {
        let old = std::fs::read_to_string(DEVKMSG).ok()?;
        std::fs::write(DEVKMSG, "on\n").ok()?;
        Some(Self(old))
    }
}

impl Drop for DevkmsgOn {
    fn drop(&mut self) {
        let _ = std::fs::write(DEVKMSG, self.0.as_bytes());
    }
}

/// Sink records of `agent` from the kmsg source: seq → (times seen, message).
fn kmsg_lines(p: &Pipeline, agent: &str) -> BTreeMap<u64, (u32, String)> {
    let text = std::fs::read_to_string(p.path().join("collector-logs.jsonl")).unwrap_or_default();
    let mut seen: BTreeMap<u64, (u32, String)> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("torn sink line {line:?}: {e}"));
        if v["agent"] != agent || v["source"] != "kmsg" {
            continue;
        }
        let Some(seq) = v["fields"]["seq"].as_str().and_then(|s| s.parse().ok()) else {
            panic!("kmsg record without its seq: {line}");
        };
        let e = seen.entry(seq).or_default();
        e.0 += 1;
        e.1 = v["message"].as_str().unwrap_or_default().to_owned();
    }
    seen
}

/// The sequence number of the oldest record `/dev/kmsg` holds now.
fn oldest_seq() -> u64 {
    use std::io::Read;
    let mut f = std::fs::File::open("/dev/kmsg").expect("/dev/kmsg");
    let mut buf = vec![0u8; 8192];
    let n = f.read(&mut buf).expect("read /dev/kmsg");
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split(',')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("seq")
}

fn wait_kmsg(p: &Pipeline, agent: &str, what: &str) -> u64 {
    let mut found = 0;
    wait_for(
        &format!("{what} in the sink"),
        UP,
        tick(),
        || match kmsg_lines(p, agent)
            .iter()
            .find(|(_, v)| v.1.contains(what))
        {
            Some((seq, _)) => {
                found = *seq;
                Ok(())
            }
            None => Err("not yet".into()),
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    found
}

#[test]
fn kmsg_ring_overwritten_while_the_agent_is_stopped() {
    let _g = exclusive();
    if let Some(why) = uctel_tests::faults::root_missing(&[]) {
        eprintln!("row=kmsg-overwritten SKIPPED: {why}");
        return;
    }
    let Some(_devkmsg) = DevkmsgOn::set() else {
        eprintln!("row=kmsg-overwritten SKIPPED: cannot set {DEVKMSG}");
        return;
    };
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("/dev/kmsg");
    let tag = format!("uctel-row-{}", std::process::id());
    let mut p = Pipeline::start();
    let i = p.add_agent_with("kmsg", 0.0, 1.0, |y| {
        let mut k = Mapping::new();
        k.insert("start_at".into(), "end".into());
        y.set("sources.kmsg", Value::Mapping(k));
    });
    p.wait_flowing(1, &["kmsg"], &["metrics"], UP);
    // One write(2) per record: each write to /dev/kmsg is one record.
    let mut record = |line: String| kmsg.write_all(line.as_bytes()).expect("write /dev/kmsg");
    record(format!("<6>{tag} before\n"));
    let before = wait_kmsg(&p, "kmsg", &format!("{tag} before"));

    // Stopped: the ring is flooded past what the agent read (kept short: the collector
    // declares an agent dead after 3 missed heartbeats).
    p.agents[i].daemon.signal(Signal::SIGSTOP);
    let filler = "x".repeat(200);
    let mut written = 0u64;
    while oldest_seq() <= before + 1 && written < 400_000 {
        for _ in 0..2000 {
            record(format!("<7>{tag} flood {written} {filler}\n"));
            written += 1;
        }
    }
    record(format!("<6>{tag} after\n"));
    let oldest = oldest_seq();
    p.agents[i].daemon.signal(Signal::SIGCONT);
    assert!(
        oldest > before + 1,
        "the ring was not overwritten after {written} lines"
    );
    let after = wait_kmsg(&p, "kmsg", &format!("{tag} after"));
    // Pacing: the agent's drop counters reach its /metrics within a poll.
    std::thread::sleep(Duration::from_secs(2));
    let scrape = p.agents[i].scrape().expect("agent scrape");
    let overwritten = scrape.count(
        "uctel_agent_records_dropped_total",
        &[("stream", "logs"), ("reason", "kmsg_overwritten")],
    );
    let dropped = AgentFigures::read(&scrape).records_dropped["logs"];
    p.agents[i].daemon.stop(STOP);
    let lost = uctel_tests::pipeline::CollectorFigures::read(
        &p.scrape().expect("collector scrape"),
        "kmsg",
    )
    .lost_total();

    let seen = kmsg_lines(&p, "kmsg");
    let twice: Vec<_> = seen.iter().filter(|(_, v)| v.0 != 1).take(5).collect();
    assert!(twice.is_empty(), "records delivered twice: {twice:?}");
    let missing = (before + 1..after)
        .filter(|s| !seen.contains_key(s))
        .count() as u64;
    eprintln!(
        "row=kmsg-overwritten written={written} before_seq={before} after_seq={after} \
         oldest_after_flood={oldest} missing={missing} kmsg_overwritten={overwritten} \
         dropped_all={dropped} collector_lost={lost}"
    );
    assert!(overwritten > 0, "the overwrite was not counted");
    assert!(
        overwritten >= oldest - before - 1,
        "at least the records gone from the ring: {overwritten} < {}",
        oldest - before - 1
    );
    assert_eq!(
        missing,
        dropped + lost,
        "every sequence number missing is a counted drop (kmsg_overwritten {overwritten})"
    );
    p.collector.stop(STOP);
}

// Row: journal entries vacuumed while the agent is down are counted exactly.

/// Writes entries `range` as [`write_entries`] does, and entry `rotate_after` with 260
/// fields of distinct names: past 3/4 of the file's 333-slot field hash table
/// systemd-journal-remote rotates as journald does (the file archived as
/// `remote@<seqnum id>-….journal`, the new one continuing the same sequence).
fn write_entries_rotating(dir: &Path, range: std::ops::Range<u64>, rotate_after: u64) {
    let before = range.start..rotate_after + 1;
    let after = rotate_after + 1..range.end;
    let mut export = String::new();
    for n in before.clone() {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n\
             _BOOT_ID=0123456789abcdef0123456789abcdef\nMESSAGE=journal entry {n}\n\
             PRIORITY=6\n_SYSTEMD_UNIT=row.service\n",
            T0 + n * 1000,
            1000 + n,
        ));
        if n == rotate_after {
            for k in 0..260 {
                export.push_str(&format!("ROTATE_{k}=x\n"));
            }
        }
        export.push('\n');
    }
    for n in after {
        export.push_str(&format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n\
             _BOOT_ID=0123456789abcdef0123456789abcdef\nMESSAGE=journal entry {n}\n\
             PRIORITY=6\n_SYSTEMD_UNIT=row.service\n\n",
            T0 + n * 1000,
            1000 + n,
        ));
    }
    // One systemd-journal-remote run: it rotates between two entries it writes.
    journal_remote(dir, &export);
}

#[test]
fn journald_vacuum_while_down_counted_exactly() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let journal = p.path().join("journal");
    std::fs::create_dir_all(&journal).expect("journal dir");
    write_entries(&journal, 0..100);
    let dir = journal.display().to_string();
    let i = p.add_agent_with("jvac", 0.0, 1.0, |y| {
        let mut j = Mapping::new();
        j.insert("directory".into(), dir.clone().into());
        j.insert("start_at".into(), "beginning".into());
        y.set("sources.journald", Value::Mapping(j));
    });
    p.wait_flowing(1, &["jvac"], &["metrics"], UP);
    wait_delivered(&p, "jvac", 100);
    p.agents[i].daemon.stop(STOP);
    // Down: 100..200 written, rotated after 149, every archive vacuumed: 100..=149 unread.
    write_entries_rotating(&journal, 100..200, 149);
    let vacuum = Command::new("journalctl")
        .arg(format!("--directory={dir}"))
        .arg("--vacuum-size=1")
        .output()
        .expect("journalctl --vacuum-size");
    assert!(vacuum.status.success());
    p.agents[i].daemon.restart();
    let hole = 50;
    wait_for(
        "the entries after the hole, the hole counted",
        UP,
        tick(),
        || {
            let seen = journal_lines(&p, "jvac");
            if let Some(n) = (150..200).find(|n| !seen.contains_key(&format!("journal entry {n}")))
            {
                return Err(format!("entry {n} not delivered yet"));
            }
            let c = p.scrape()?.count(
                "uctel_collector_agent_records_dropped_total",
                &[("agent", "jvac"), ("reason", "journal_vacuumed")],
            );
            if c == hole {
                Ok(())
            } else {
                Err(format!("collector's journal_vacuumed {c}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[i].daemon.log()));
    let agent_count = p.agents[i].scrape().expect("agent scrape").count(
        "uctel_agent_records_dropped_total",
        &[("stream", "logs"), ("reason", "journal_vacuumed")],
    );
    p.agents[i].daemon.stop(STOP);
    let seen = journal_lines(&p, "jvac");
    let want: Vec<String> = (0..100)
        .chain(150..200)
        .map(|n| format!("journal entry {n}"))
        .collect();
    let got: Vec<&String> = seen.keys().collect();
    let mut want_sorted: Vec<&String> = want.iter().collect();
    want_sorted.sort();
    assert_eq!(got, want_sorted, "the entries not vacuumed, and only those");
    assert!(seen.values().all(|v| v.0 == 1), "each once");
    assert_eq!(agent_count, hole, "the agent's own count");
    eprintln!("row=journald-vacuum-while-down hole={hole} journal_vacuumed={agent_count}");
    p.collector.stop(STOP);
}
