//! Kernel log source (`sources.kmsg`): the records of `/dev/kmsg` as log records, with the
//! kernel's sequence number, level, facility and time, and the RDMA device a driver line
//! names (DESIGN.md §7).
//!
//! # Records and time
//!
//! Each read(2) of `/dev/kmsg` returns one record (`record` has the format). The record's
//! time is microseconds since boot of the kernel's `local_clock()`; the wall time is that
//! plus the boot time taken as `CLOCK_REALTIME − CLOCK_BOOTTIME` at the read (as util-linux
//! `dmesg` computes it), so a record keeps its own time when read late. (After a suspend the
//! kernel's clock may lag `CLOCK_BOOTTIME` by the time suspended; `dmesg` has the same
//! caveat.) Severity is the record's syslog level (0–2 fatal, 3 error, 4 warn, 5–6 info,
//! 7 debug); fields: `seq`, `level` (0–7), `facility` (`kern`, `user`, …), the record's
//! `SUBSYSTEM`/`DEVICE` continuation values, and `device` for an RDMA device
//! ([`rdma_device`]: `mlx5_core 0000:3b:00.0: …` → the bus id, `infiniband mlx5_0: …`,
//! `… rxe0 …` → the device name).
//!
//! # Loss is exact
//!
//! The kernel numbers its records one by one. When the ring buffer overwrote records the
//! reader had not read yet, read(2) fails with `EPIPE` once and the reader moves to the
//! oldest record left; the gap between the sequence expected and the one read is exactly
//! the number of records lost, counted as dropped with reason `kmsg_overwritten`
//! (`uctel_agent_records_dropped_total{stream="logs",reason="kmsg_overwritten"}`) and
//! logged once (then at debug).
//!
//! # Position and replay
//!
//! The source saves `{"boot_id", "next_seq"}` in `<state_directory>/kmsg.json`, the first
//! sequence number not yet *settled* (sent, or dropped and counted), as the file tailer
//! saves offsets. After a restart in the same boot (`/proc/sys/kernel/random/boot_id`) the
//! ring is read from its oldest record and the records before `next_seq` are skipped;
//! records overwritten while the agent was down are counted by the same gap rule. Each
//! record carries `file_id` = FNV-1a 64 of the boot id and `end_offset` = `seq + 1`, so the
//! collector discards what a SIGKILLed agent sends again. In a new boot (or the first run
//! with `start_at: beginning`) the whole ring is read; the first run with `start_at: end`
//! (default) skips the records present when it starts.
//!
//! `path` may name a regular file or a FIFO (tests): records are then split at a `\n` not
//! followed by a space.

mod record;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{Field, LogRecord};

pub use record::{
    facility_name, level_severity, parse, rdma_device, split_records, KmsgError, KmsgRecord,
    SeqTracker,
};

use crate::sources::journald::MAX_FIELD_VALUE_BYTES;
use crate::sources::start_at::StartAt;

/// The `source` of every kernel log record.
pub const SOURCE: &str = "kmsg";

/// Read buffer: a `/dev/kmsg` record is at most 8 KiB (`CONSOLE_EXT_LOG_MAX`).
const READ_BYTES: usize = 8192;

/// How long after a failed open or read the device is opened again.
const REOPEN_DELAY: Duration = Duration::from_secs(1);

/// `sources.kmsg`: ship the kernel log. Off when absent.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KmsgSection {
    /// The kernel log device. Default `/dev/kmsg` (readable by any user with
    /// `kernel.dmesg_restrict=0`; with `1`, Debian's default, only with `CAP_SYSLOG`, which
    /// the packaged unit's drop-in `kmsg.conf` grants; without it every open is counted in
    /// `uctel_agent_source_errors_total{source="kmsg",reason="permission_denied"}`).
    #[serde(default = "default_path")]
    pub path: PathBuf,
    /// Where the very first run starts (no state file yet): `end` (default: records logged
    /// from now on) or `beginning` (the whole ring buffer).
    #[serde(default)]
    pub start_at: StartAt,
    /// Longest message shipped, in bytes; longer ones are cut. Default as
    /// `sources.logs[].max_line_bytes`.
    #[serde(default)]
    pub max_message_bytes: Option<usize>,
    /// Seconds between two reads when the device had nothing. Default 0.25.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: f64,
}

fn default_path() -> PathBuf {
    PathBuf::from("/dev/kmsg")
}
fn default_poll_interval() -> f64 {
    0.25
}

impl Default for KmsgSection {
    /// `/dev/kmsg`, from the end.
    fn default() -> Self {
        Self {
            path: default_path(),
            start_at: StartAt::End,
            max_message_bytes: None,
            poll_interval_seconds: default_poll_interval(),
        }
    }
}

/// Cumulative counters of a [`KmsgSource`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KmsgCounts {
    /// Records returned.
    pub records: u64,
    /// Records overwritten before they were read (sequence gaps).
    pub overwritten: u64,
    /// `EPIPE` answers of read(2).
    pub epipe: u64,
    /// Reads that were not a record (dropped, `invalid`).
    pub unparsable: u64,
    /// Failed opens and reads (retried after `REOPEN_DELAY`), every cause.
    pub read_errors: u64,
    /// Of [`KmsgCounts::read_errors`]: refused for want of permission (`EPERM`, `EACCES`):
    /// without `CAP_SYSLOG` where `kernel.dmesg_restrict=1`, or `/dev/kmsg` hidden by
    /// systemd's `ProtectKernelLogs=yes`.
    pub denied: u64,
    /// Of [`KmsgCounts::read_errors`]: the path does not exist (`ENOENT`).
    pub not_found: u64,
    /// Failed writes of the state file.
    pub checkpoint_errors: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct State {
    boot_id: String,
    next_seq: u64,
}

/// The kernel log source; see the module documentation. Never blocks.
#[derive(Debug)]
pub struct KmsgSource {
    path: PathBuf,
    start_at: StartAt,
    max_message_bytes: usize,
    state_file: Option<PathBuf>,
    boot_id: String,
    file_id: u64,
    file: Option<File>,
    /// One record per read (a character device) or records split from a byte stream.
    device: bool,
    pending: Vec<u8>,
    /// First run at the end: the records present at the first open are skipped.
    skip_existing: bool,
    tracker: SeqTracker,
    unsettled: VecDeque<u64>,
    saved: Option<u64>,
    retry_at: Option<Instant>,
    failing: bool,
    warned_overwrite: bool,
    counts: KmsgCounts,
}

impl KmsgSource {
    /// A source reading `path` that resumes from `state_file` (same boot) or starts at
    /// `start_at`; `boot_id` names the boot (`/proc/sys/kernel/random/boot_id`).
    /// The device is opened by the first [`KmsgSource::poll`].
    pub fn new(
        section: &KmsgSection,
        max_message_bytes: usize,
        state_file: Option<PathBuf>,
        boot_id: &str,
    ) -> Self {
        let saved: Option<State> = state_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str(&t).ok());
        let (tracker, skip_existing, saved_seq) = match saved {
            Some(s) if s.boot_id == boot_id => {
                (SeqTracker::expecting(s.next_seq), false, Some(s.next_seq))
            }
            // Another boot: everything in the ring is new.
            Some(_) => (SeqTracker::default(), false, None),
            None => (
                SeqTracker::default(),
                section.start_at == StartAt::End,
                None,
            ),
        };
        Self {
            path: section.path.clone(),
            start_at: section.start_at,
            max_message_bytes,
            state_file,
            boot_id: boot_id.to_owned(),
            file_id: crate::sources::journald::sequence_file_id(boot_id),
            file: None,
            device: true,
            pending: Vec::new(),
            skip_existing,
            tracker,
            unsettled: VecDeque::new(),
            saved: saved_seq,
            retry_at: None,
            failing: false,
            warned_overwrite: false,
            counts: KmsgCounts::default(),
        }
    }

    /// Cumulative counters.
    pub fn counts(&self) -> &KmsgCounts {
        &self.counts
    }

    /// The first sequence number a source started after this one reads (a reload hands
    /// the source over): the first unsettled record's, or the next expected; `None` before
    /// the first record was read.
    pub fn hand_over(&self) -> Option<u64> {
        self.next_unsettled()
    }

    /// This source, going on at sequence number `next_seq` (what
    /// [`KmsgSource::hand_over`] of the source it replaces gave; same boot) instead of the
    /// state file's or `start_at`: records before it are skipped, a gap after it is counted.
    #[must_use]
    pub fn resuming(mut self, next_seq: u64) -> Self {
        self.tracker = SeqTracker::expecting(next_seq);
        self.skip_existing = false;
        self
    }

    /// The sequence number of the last record read, `None` before the first.
    pub fn last_seq(&self) -> Option<u64> {
        self.tracker.next().and_then(|n| n.checked_sub(1))
    }

    /// The first sequence number not settled yet (what a restart resumes at), `None` before
    /// the first record was read.
    pub fn settled_next_seq(&self) -> Option<u64> {
        self.next_unsettled()
    }

    /// Records returned and not settled.
    pub fn unsettled(&self) -> usize {
        self.unsettled.len()
    }

    /// The oldest `n` unsettled records are settled.
    pub fn settle(&mut self, n: usize) {
        let n = n.min(self.unsettled.len());
        self.unsettled.drain(..n);
    }

    /// The first sequence number not settled: the first unsettled record's, or the next
    /// expected.
    fn next_unsettled(&self) -> Option<u64> {
        self.unsettled.front().copied().or(self.tracker.next())
    }

    /// Writes the first unsettled sequence number to the state file when it changed.
    ///
    /// # Errors
    /// The write failed; the previous state file stays.
    pub fn checkpoint_settled(&mut self) -> std::io::Result<()> {
        let (Some(path), Some(next)) = (&self.state_file, self.next_unsettled()) else {
            return Ok(());
        };
        if self.saved == Some(next) {
            return Ok(());
        }
        let state = State {
            boot_id: self.boot_id.clone(),
            next_seq: next,
        };
        let json = serde_json::to_vec(&state).map_err(std::io::Error::other)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let write = std::fs::write(&tmp, json)
            .and_then(|()| File::open(&tmp).and_then(|f| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        match write {
            Ok(()) => {
                self.saved = Some(next);
                Ok(())
            }
            Err(e) => {
                self.counts.checkpoint_errors += 1;
                Err(e)
            }
        }
    }

    /// Reads the unsettled records again (an RC lane failed): the device is opened again
    /// at its oldest record and the settled ones are skipped; those overwritten since are
    /// counted by the gap rule. Returns 0.
    pub fn rewind(&mut self) -> u64 {
        if let Some(first) = self.unsettled.front().copied() {
            self.tracker = SeqTracker::expecting(first);
            self.unsettled.clear();
            self.file = None;
            self.pending.clear();
        }
        0
    }

    /// Appends at most `max` records to `out`; returns whether more may be waiting.
    /// `boot_wall_ns` is `CLOCK_REALTIME − CLOCK_BOOTTIME` in nanoseconds (the wall time of
    /// boot), added to each record's time since boot.
    pub fn poll(&mut self, out: &mut Vec<LogRecord>, max: usize, boot_wall_ns: i128) -> bool {
        if self.file.is_none() && !self.open() {
            return false;
        }
        let mut buf = vec![0u8; READ_BYTES];
        let start = out.len();
        while out.len() - start < max {
            let Some(f) = self.file.as_mut() else {
                return false;
            };
            match f.read(&mut buf) {
                Ok(0) => {
                    self.caught_up(out, boot_wall_ns);
                    return false;
                }
                Ok(n) => self.bytes(&buf[..n], out, boot_wall_ns),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => self.counts.epipe += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.caught_up(out, boot_wall_ns);
                    return false;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail("read", &e);
                    return false;
                }
            }
        }
        true
    }

    /// Nothing more to read now: a file's or FIFO's last record, complete with its `\n`,
    /// is taken (writers write a record whole), and the first run's skip of the records
    /// present at start ends.
    fn caught_up(&mut self, out: &mut Vec<LogRecord>, boot_wall_ns: i128) {
        if self.pending.last() == Some(&b'\n') {
            let last = std::mem::take(&mut self.pending);
            self.record(&last, out, boot_wall_ns);
        }
        self.skip_existing = false;
    }

    fn open(&mut self) -> bool {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path);
        match opened {
            Ok(f) => {
                self.device = f.metadata().is_ok_and(|m| m.file_type().is_char_device());
                if self.device {
                    // Every reader starts at the oldest record; be sure of it.
                    let mut f2 = &f;
                    let _ = f2.seek(std::io::SeekFrom::Start(0));
                }
                if self.failing {
                    tracing::info!(path = %self.path.display(), "kmsg: reading again");
                }
                self.failing = false;
                self.file = Some(f);
                true
            }
            Err(e) => {
                self.fail("open", &e);
                false
            }
        }
    }

    /// `op` (`open`, `read`) failed with `e`: counted by cause, logged once until it reads
    /// again, retried after `REOPEN_DELAY`.
    fn fail(&mut self, op: &str, e: &std::io::Error) {
        self.counts.read_errors += 1;
        let denied = matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES));
        if denied {
            self.counts.denied += 1;
        } else if e.kind() == ErrorKind::NotFound {
            self.counts.not_found += 1;
        }
        self.file = None;
        self.pending.clear();
        self.retry_at = Some(Instant::now() + REOPEN_DELAY);
        let error = format!("{op} {}: {e}", self.path.display());
        if self.failing {
            tracing::debug!(%error, "kmsg: cannot read the kernel log");
        } else if denied {
            tracing::warn!(%error, "kmsg: permission denied: reading the kernel log needs the capability CAP_SYSLOG where kernel.dmesg_restrict=1 (the packaged unit's drop-in kmsg.conf grants it: AmbientCapabilities=CAP_SYSLOG, ProtectKernelLogs=no); counted in uctel_agent_source_errors_total{{source=\"kmsg\",reason=\"permission_denied\"}}, retried every second (logged once until it reads again)");
        } else {
            tracing::warn!(%error, "kmsg: cannot read the kernel log; retried every second (logged once until it reads again)");
        }
        self.failing = true;
    }

    /// Bytes of one read: one record from the device, or a chunk of a file or FIFO.
    fn bytes(&mut self, bytes: &[u8], out: &mut Vec<LogRecord>, boot_wall_ns: i128) {
        if self.device {
            self.record(bytes, out, boot_wall_ns);
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let (records, used) = split_records(&pending);
        for r in records {
            self.record(r, out, boot_wall_ns);
        }
        pending.drain(..used);
        self.pending = pending;
    }

    fn record(&mut self, bytes: &[u8], out: &mut Vec<LogRecord>, boot_wall_ns: i128) {
        let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let r = match parse(bytes) {
            Ok(r) => r,
            Err(e) => {
                self.counts.unparsable += 1;
                tracing::debug!(error = %e, "kmsg: a read that is not a record");
                return;
            }
        };
        if self.tracker.seen(r.seq) {
            return;
        }
        let gap = self.tracker.read(r.seq);
        if gap > 0 && !self.skip_existing {
            self.counts.overwritten += gap;
            if !self.warned_overwrite {
                self.warned_overwrite = true;
                tracing::warn!(records = gap, seq = r.seq, "kmsg: the kernel's ring buffer overwrote records before they were read; counted in uctel_agent_records_dropped_total{{reason=\"kmsg_overwritten\"}} (logged once)");
            } else {
                tracing::debug!(records = gap, seq = r.seq, "kmsg: records overwritten");
            }
        }
        if self.skip_existing {
            return;
        }
        self.unsettled.push_back(r.seq);
        out.push(self.to_log_record(r, boot_wall_ns));
        self.counts.records += 1;
    }

    fn to_log_record(&self, r: KmsgRecord, boot_wall_ns: i128) -> LogRecord {
        let field = |k: &str, v: &str| {
            let mut value = v.to_owned();
            crate::sources::journald::cut(&mut value, MAX_FIELD_VALUE_BYTES);
            Field {
                key: k.to_owned(),
                value,
            }
        };
        let mut fields = vec![
            field("seq", &r.seq.to_string()),
            field("level", &r.level.to_string()),
            field("facility", &facility_name(r.facility)),
        ];
        if let Some(d) = rdma_device(&r) {
            fields.push(field("device", &d));
        }
        for (k, v) in r
            .dict
            .iter()
            .filter(|(k, _)| k == "SUBSYSTEM" || k == "DEVICE")
        {
            fields.push(field(k, v));
        }
        let mut message = r.message;
        crate::sources::journald::cut(&mut message, self.max_message_bytes);
        let ns = boot_wall_ns + i128::from(r.usec) * 1_000;
        LogRecord {
            timestamp_ns: u64::try_from(ns.max(0)).unwrap_or(u64::MAX),
            severity: level_severity(r.level) as i32,
            source: SOURCE.to_owned(),
            message,
            fields,
            file_id: self.file_id,
            end_offset: r.seq.saturating_add(1),
        }
    }

    /// Where the first run starts ([`KmsgSection::start_at`]).
    pub fn start_at(&self) -> StartAt {
        self.start_at
    }
}

/// `CLOCK_REALTIME − CLOCK_BOOTTIME` now, in nanoseconds: the wall time of boot.
pub fn boot_wall_ns() -> i128 {
    use rustix::time::{clock_gettime, ClockId};
    let ns =
        |t: rustix::time::Timespec| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
    ns(clock_gettime(ClockId::Realtime)) - ns(clock_gettime(ClockId::Boottime))
}

#[cfg(test)]
mod tests;
