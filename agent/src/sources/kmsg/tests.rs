//! The source on files that mimic the kernel's records (one per line, continuation lines
//! with a leading space), and on the real `/dev/kmsg` of the machine where it is readable.

use std::io::Write;

use uctel_protocol::payload::Severity;

use super::*;

fn section(path: &std::path::Path, start_at: StartAt) -> KmsgSection {
    KmsgSection {
        path: path.to_owned(),
        start_at,
        ..Default::default()
    }
}

fn write(path: &std::path::Path, seqs: impl IntoIterator<Item = u64>) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    for s in seqs {
        writeln!(f, "6,{s},{},-;line {s}\n SUBSYSTEM=net", s * 1000).unwrap();
    }
}

fn poll_all(s: &mut KmsgSource) -> Vec<LogRecord> {
    let mut out = Vec::new();
    while s.poll(&mut out, 1000, 1_000_000_000_000) {}
    out
}

#[test]
fn gaps_in_the_sequence_are_counted_exactly_and_records_keep_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kmsg");
    // 10..20 read; 20..=49 overwritten; 50..60 read; one line from another boot's ring.
    write(&f, 10..20);
    write(&f, 50..60);
    let mut s = KmsgSource::new(&section(&f, StartAt::Beginning), 2048, None, "boot");
    let got = poll_all(&mut s);
    assert_eq!(got.len(), 20);
    assert_eq!(s.counts().overwritten, 30, "exactly 20..=49");
    let r = &got[10];
    assert_eq!(r.message, "line 50");
    assert_eq!(r.timestamp_ns, 1_000_000_000_000 + 50_000 * 1000);
    assert_eq!(r.severity, Severity::Info as i32);
    assert_eq!(r.end_offset, 51);
    let f: Vec<(&str, &str)> = r
        .fields
        .iter()
        .map(|f| (f.key.as_str(), f.value.as_str()))
        .collect();
    assert_eq!(
        f,
        [
            ("seq", "50"),
            ("level", "6"),
            ("facility", "kern"),
            ("SUBSYSTEM", "net")
        ]
    );
}

#[test]
fn a_restart_resumes_after_the_settled_records_and_counts_what_was_overwritten_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kmsg");
    let state = dir.path().join("kmsg.json");
    write(&f, 0..10);
    let mut s = KmsgSource::new(
        &section(&f, StartAt::Beginning),
        2048,
        Some(state.clone()),
        "boot",
    );
    assert_eq!(poll_all(&mut s).len(), 10);
    s.settle(7);
    s.checkpoint_settled().unwrap();
    drop(s);
    // Down: the ring moved on; 7..=11 are gone, 12..15 are there.
    std::fs::write(&f, "").unwrap();
    write(&f, 12..15);
    let mut s = KmsgSource::new(
        &section(&f, StartAt::Beginning),
        2048,
        Some(state.clone()),
        "boot",
    );
    let got: Vec<String> = poll_all(&mut s).into_iter().map(|r| r.message).collect();
    assert_eq!(got, ["line 12", "line 13", "line 14"]);
    assert_eq!(
        s.counts().overwritten,
        5,
        "7, 8, 9 unsettled and 10, 11 unread"
    );
    // Same ring, not overwritten: the settled records are skipped.
    s.settle(3);
    s.checkpoint_settled().unwrap();
    drop(s);
    let mut s = KmsgSource::new(&section(&f, StartAt::Beginning), 2048, Some(state), "boot");
    assert!(poll_all(&mut s).is_empty());
    assert_eq!(s.counts().overwritten, 0);
}

#[test]
fn another_boot_reads_the_whole_ring_and_the_first_run_at_the_end_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kmsg");
    let state = dir.path().join("kmsg.json");
    write(&f, 0..5);
    let mut s = KmsgSource::new(&section(&f, StartAt::End), 2048, Some(state.clone()), "b1");
    assert!(poll_all(&mut s).is_empty(), "present at the first start");
    write(&f, 5..7);
    assert_eq!(poll_all(&mut s).len(), 2);
    s.settle(2);
    s.checkpoint_settled().unwrap();
    drop(s);
    std::fs::write(&f, "").unwrap();
    write(&f, 0..3);
    let mut s = KmsgSource::new(&section(&f, StartAt::End), 2048, Some(state), "b2");
    assert_eq!(poll_all(&mut s).len(), 3, "a new boot: all of it");
    assert_eq!(s.counts().overwritten, 0);
}

#[test]
fn garbage_is_counted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kmsg");
    std::fs::write(&f, "not a record\n6,1,1,-;ok\n\u{0}\u{ff}\n6,2,1,-;ok\n").unwrap();
    let mut s = KmsgSource::new(&section(&f, StartAt::Beginning), 2048, None, "b");
    assert_eq!(poll_all(&mut s).len(), 2);
    assert_eq!(s.counts().unparsable, 2);
    let mut missing = KmsgSource::new(
        &section(&dir.path().join("none"), StartAt::End),
        2048,
        None,
        "b",
    );
    assert!(poll_all(&mut missing).is_empty());
    assert_eq!(missing.counts().read_errors, 1);
}

#[test]
fn a_hand_over_goes_on_at_the_first_unsettled_record_without_a_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kmsg");
    write(&f, 0..10);
    let mut s = KmsgSource::new(&section(&f, StartAt::Beginning), 2048, None, "boot");
    assert_eq!(s.hand_over(), None, "nothing read yet");
    assert_eq!(poll_all(&mut s).len(), 10);
    s.settle(6);
    assert_eq!((s.last_seq(), s.settled_next_seq()), (Some(9), Some(6)));
    let at = s.hand_over().unwrap();
    drop(s);
    write(&f, 10..12);
    // The replacement (another level filter, say) starts at the end by its own section,
    // but the hand-over wins: 6..=11, nothing before, nothing counted as overwritten.
    let mut s = KmsgSource::new(&section(&f, StartAt::End), 2048, None, "boot").resuming(at);
    let got: Vec<String> = poll_all(&mut s).into_iter().map(|r| r.message).collect();
    assert_eq!(
        got,
        ["line 6", "line 7", "line 8", "line 9", "line 10", "line 11"]
    );
    assert_eq!(s.counts().overwritten, 0);
}
