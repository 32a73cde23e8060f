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
