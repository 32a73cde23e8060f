//! The kernel log source on this machine's real `/dev/kmsg`: lines written to it (root)
//! arrive with their level, facility, sequence number, wall time and RDMA device; every
//! sequence number from the start on is a record read or counted overwritten.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uctel_agent::config::StartAt;
use uctel_agent::sources::kmsg::{boot_wall_ns, KmsgSection, KmsgSource};
use uctel_protocol::payload::{LogRecord, Severity};

fn field<'a>(r: &'a LogRecord, k: &str) -> Option<&'a str> {
    r.fields
        .iter()
        .find(|f| f.key == k)
        .map(|f| f.value.as_str())
}

#[test]
fn lines_written_to_dev_kmsg_arrive_with_their_level_facility_and_device() {
    let writable = std::fs::OpenOptions::new().write(true).open("/dev/kmsg");
    let Ok(mut w) = writable else {
        eprintln!("SKIPPED: /dev/kmsg not writable here (needs root)");
        return;
    };
    let section = KmsgSection {
        start_at: StartAt::End,
        ..Default::default()
    };
    let mut s = KmsgSource::new(&section, 2048, None, "this-boot");
    let mut out = Vec::new();
    while s.poll(&mut out, 1000, boot_wall_ns()) {}
    assert!(out.is_empty(), "the records present at start are skipped");
    let tag = format!("uctel-kmsg-test-{}", std::process::id());
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // Userspace writes are facility user; `<N>` sets the level (printk_devkmsg allows a
    // burst of 10 per 5 s: three lines).
    for line in [
        format!("<3>{tag} mlx5_core 0000:3b:00.0: port 1 link down\n"),
        format!("<6>{tag} rdma_rxe: rxe0 added\n"),
        format!("<4>{tag} plain line\n"),
    ] {
        w.write_all(line.as_bytes()).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(5);
    let mut mine = Vec::new();
    let mut all = Vec::new();
    while mine.len() < 3 && Instant::now() < until {
        let mut got = Vec::new();
        s.poll(&mut got, 1000, boot_wall_ns());
        mine.extend(got.iter().filter(|r| r.message.contains(&tag)).cloned());
        all.extend(got);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(mine.len(), 3, "{all:?}");
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    assert_eq!(mine[0].severity, Severity::Error as i32);
    assert_eq!(field(&mine[0], "facility"), Some("user"));
    assert_eq!(field(&mine[0], "level"), Some("3"));
    assert_eq!(field(&mine[1], "device"), Some("rxe0"));
    assert_eq!(mine[2].severity, Severity::Warn as i32);
    assert_eq!(field(&mine[2], "device"), None);
    for r in &mine {
        let t = u128::from(r.timestamp_ns);
        // The kernel's clock and CLOCK_BOOTTIME agree to well under a second here.
        assert!(
            t + 1_000_000_000 >= before && t <= after + 1_000_000_000,
            "{t} not within [{before}, {after}]"
        );
        assert_eq!(r.source, "kmsg");
    }
    // Every sequence number since the start is a record read or counted overwritten.
    let seqs: Vec<u64> = all
        .iter()
        .map(|r| field(r, "seq").unwrap().parse().unwrap())
        .collect();
    let span = seqs.last().unwrap() - seqs.first().unwrap() + 1;
    assert_eq!(span, seqs.len() as u64 + s.counts().overwritten);
}

/// `kernel.dmesg_restrict` set for a test and restored after it (also when it fails).
struct DmesgRestrict(String);

const DMESG_RESTRICT: &str = "/proc/sys/kernel/dmesg_restrict";

impl DmesgRestrict {
    fn set(v: &str) -> Option<Self> {
        let old = std::fs::read_to_string(DMESG_RESTRICT).ok()?;
        std::fs::write(DMESG_RESTRICT, v).ok()?;
        Some(Self(old.trim().to_owned()))
    }
}

impl Drop for DmesgRestrict {
    fn drop(&mut self) {
        let _ = std::fs::write(DMESG_RESTRICT, &self.0);
    }
}

/// The real agent binary in `--dry-run` with the kmsg source reading the whole ring, run by
/// setpriv(1) as user and group `nobody` with `caps` (setpriv arguments), for `seconds`;
/// returns its stdout frames and its stderr.
fn agent_as_nobody(caps: &[&str], seconds: u64) -> (Vec<serde_json::Value>, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        format!(
            "agent_id: kmsg-nobody\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n\
             sources:\n  state_directory: {}\n  self_metrics:\n    interval_seconds: 0.5\n  \
             kmsg:\n    start_at: beginning\n",
            state.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    crate::support::dry_run_as_nobody(&cfg, caps, seconds)
}

fn records(frames: &[serde_json::Value]) -> impl Iterator<Item = &serde_json::Value> {
    frames
        .iter()
        .flat_map(|f| f["records"].as_array().into_iter().flatten())
}

/// The last value of `uctel_agent_source_errors_total{source="kmsg",reason}` shipped.
fn kmsg_errors(frames: &[serde_json::Value], reason: &str) -> f64 {
    records(frames)
        .filter(|r| {
            r["name"] == "uctel_agent_source_errors_total"
                && r["labels"]["source"] == "kmsg"
                && r["labels"]["reason"] == reason
        })
        .filter_map(|r| r["value"].as_f64())
        .last()
        .unwrap_or(0.0)
}

#[test]
fn a_non_root_agent_reads_kmsg_with_cap_syslog_only_and_says_when_it_lacks_it() {
    let Ok(mut w) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") else {
        eprintln!("SKIPPED: /dev/kmsg not writable here (needs root)");
        return;
    };
    let Some(_restore) = DmesgRestrict::set("1") else {
        eprintln!("SKIPPED: kernel.dmesg_restrict cannot be set here (needs root)");
        return;
    };
    let tag = format!("uctel-kmsg-nobody-{}", std::process::id());
    w.write_all(format!("<5>{tag} written before the agent started\n").as_bytes())
        .unwrap();
    // As the packaged unit's drop-in (kmsg.conf) runs it: user nobody, CAP_SYSLOG ambient.
    let (frames, stderr) = agent_as_nobody(&["--inh-caps=+syslog", "--ambient-caps=+syslog"], 3);
    let mine = records(&frames)
        .filter(|r| {
            r["source"] == "kmsg" && r["message"].as_str().is_some_and(|m| m.contains(&tag))
        })
        .count();
    assert_eq!(mine, 1, "the kmsg record arrived; stderr: {stderr}");
    assert_eq!(kmsg_errors(&frames, "permission_denied"), 0.0);
    // Without the capability: no record, the refusal counted and named.
    let (frames, stderr) = agent_as_nobody(&[], 3);
    assert_eq!(
        records(&frames).filter(|r| r["source"] == "kmsg").count(),
        0
    );
    assert!(
        kmsg_errors(&frames, "permission_denied") >= 1.0,
        "source_errors_total{{source=\"kmsg\",reason=\"permission_denied\"}}"
    );
    assert!(
        stderr.contains("CAP_SYSLOG") && stderr.contains("permission denied"),
        "the log names the missing capability: {stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.contains("CAP_SYSLOG")).count(),
        1,
        "logged once over several retries: {stderr}"
    );
}
