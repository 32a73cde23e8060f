//! Log file source: follows files matched by glob patterns and turns their lines into
//! [`LogRecord`]s (DESIGN.md §7).
//!
//! # Layout
//!
//! The rules live in sans-IO pieces that take observations and return decisions, unit-tested
//! without files:
//!
//! - [`LineSplitter`]: bytes → lines, with the long-line cut, the discard of the remainder, and
//!   the partial-last-line timeout.
//! - `reconcile` (private): rotation detection from `(path, dev, inode)` observations: which
//!   tracked files moved, which were rotated away or removed (orphaned), which files are new and
//!   whether a new file replaced another at the same path (create-rotation).
//! - `match_checkpoint` (private): which checkpoint entry each file found at start resumes, by
//!   `(dev, inode)` and by the fingerprint of its first [`HEAD_BYTES`] bytes (a copy made while
//!   the agent was down), and which checkpointed files were truncated while it was down.
//! - `start_position` (private): where to start reading a newly seen file (checkpoint, `start_at`
//!   on the first run, first byte otherwise).
//! - [`truncation_check`]: copytruncate/truncation detection from `(size, offset, head bytes)`.
//! - `ErrorLatch` (private): which failing paths were already reported, so a failure is logged
//!   when it starts, not at every retry.
//!
//! [`LogTailer`] is the thin IO layer: it evaluates globs, stats paths, keeps one open handle
//! per followed file (so a renamed or deleted file can still be read to its end), reads with
//! positional reads, and writes the checkpoint file.
//!
//! # Rotation and truncation
//!
//! While running, files are identified by `(dev, inode)`, never by path:
//!
//! - **create-rotation** (`mv app.log app.log.1; create app.log`): the path now names another
//!   inode. The old file becomes an *orphan*: it is read to its end first (before the new file,
//!   in every poll, so order is kept), stays open for [`LogSourceConfig::rotate_wait`] after it
//!   was orphaned for writers that have not reopened yet, and is closed at EOF after a full glob
//!   scan that no longer finds it. While it holds an unfinished last line, the new file at its
//!   path waits (the writer may still complete that line; at most `partial_line_timeout`). The
//!   new file is read from its beginning. Counted as
//!   [`LogEvent::RotationCreate`]. If the glob also matches the rotated name (`app.log*`), the old
//!   inode is simply found at its new path and followed there.
//! - **copytruncate** and plain truncation (`cp app.log app.log.1; : > app.log`): same inode, and
//!   either its size is below our offset, or its first bytes (up to [`HEAD_BYTES`]) differ from
//!   those seen before (caught even when the file has grown past our offset again before the next
//!   poll). Reading restarts at offset 0; a buffered partial line is flushed first. Counted as
//!   [`LogEvent::FileTruncated`] and logged (`tracing` warn, naming the path) once per truncation
//!   seen, not once per poll. The two cases cannot be told apart from `(dev, inode, size)`
//!   observations, so they share one reason. Bytes known to exist but not yet read when the
//!   truncation was seen are counted in [`LogSourceCounts::truncated_unread_bytes`] (a lower
//!   bound of the loss). The counter's label is the reason only: a path label would grow
//!   without bound as files rotate; the log line names the path.
//!
//!   **copytruncate race:** lines written after our last read and before the truncation exist only
//!   in the copy; lines written between logrotate's copy and its truncate exist nowhere. No tailer
//!   of the original path can deliver them. Use create-rotation where the writer can reopen its
//!   file. With copytruncate the glob should not match the copies: a copy made while the agent
//!   runs is a new inode with old content, and is read again from its beginning (a copy made
//!   while the agent was down is recognised, see below).
//!
//! A glob, stat, open or read failure is counted ([`LogEvent::ReadError`]), returned in
//! [`PollStats::errors`] and retried; it is logged (warn, naming the path) when a path starts
//! failing, and again only after it has recovered for a full glob interval.
//!
//! # Lines
//!
//! A line ends at `\n` (not included in the record; a `\r` before it is kept). A line longer than
//! [`LogSourceConfig::max_line_bytes`] is cut at that length (backing off to a UTF-8 character
//! boundary), emitted, and the rest up to the next `\n` is discarded
//! ([`LogEvent::LineTruncated`], bytes in [`LogSourceCounts::discarded_bytes`]); the file stays
//! followed. A last line without `\n` is held until its newline arrives, or emitted as is after
//! [`LogSourceConfig::partial_line_timeout`] ([`LogEvent::PartialLineFlushed`]; what the writer
//! appends to that line later becomes a new record). Invalid UTF-8 is replaced with U+FFFD
//! ([`LogEvent::InvalidUtf8`]); a record's message is never longer than `max_line_bytes` bytes.
//!
//! Each record carries the time its line was read (`timestamp_ns`: the wall clock is read
//! for every line, so the lines of one poll, and of one frame, keep their own times and
//! order) and the severity the line states ([`super::severity::detect`]: syslog `<PRI>`, a
//! JSON `level`, `level=`, a level word near the start; `unspecified` otherwise, or always
//! when [`LogSourceConfig::detect_severity`] is off).
//!
//! # Checkpoint and delivery guarantee
//!
//! Every record returned by [`LogTailer::poll`] carries, inside the tailer, the position of
//! its line: file `(dev, inode)`, the file's generation (bumped at each truncation) and the
//! offset of the line's first byte. The caller reports, oldest first, the records that are
//! *settled* — handed on for good — with [`LogTailer::settle`];
//! [`LogTailer::checkpoint_settled`] then writes, for every followed file, `(path, dev, inode,
//! offset)` plus fingerprints (FNV-1a 64) of its first `min(size, HEAD_BYTES)` bytes
//! (`head_len`, `head_hash`) and of the `min(offset, HEAD_BYTES)` bytes just before the offset
//! (`before_len`, `before_hash`) to [`LogSourceConfig::state_file`] (JSON, written to a
//! temporary file, fsynced and renamed over the old one). The offset is the
//! start of the file's first unsettled line, or, when every line read from the file is
//! settled, the end of the last line returned (a buffered partial line is not included; it is
//! read again after a restart). An unsettled line of an older generation was truncated away:
//! the file then resumes at 0. A file closed (rotated away, removed) while lines read from it
//! are unsettled keeps its entry until they are. [`LogTailer::checkpoint`] settles everything
//! returned so far and writes.
//!
//! The agent settles a line once it is posted in a frame or dropped and counted for a reason
//! other than `shutdown` (`runners::Handoff`); lines still queued or framed when it stops are
//! read again after a restart. Lines returned but not yet checkpointed when the agent dies
//! (a crash, SIGKILL) are delivered again after a restart (at-least-once up to the framer);
//! once a line is checkpointed it is never read again, and from the framer on, delivery over
//! UC is at-most-once (loss is counted by the collector, never retransmitted). With
//! checkpoints of settled lines and a final one at shutdown, a restart neither repeats nor
//! skips lines.
//!
//! # Start: the first run, and what happened while the agent was down
//!
//! [`LogSourceConfig::start_at`] applies only to the files found by the first scan of the
//! *first run*: no state file configured, or none written yet. That first poll writes the state
//! file at once (where `start_at` put each file), so a crash before any other checkpoint does
//! not apply `start_at` again. Every other file the checkpoint does not know — one created
//! while the agent was down, or while it runs — is new data and is read from its first byte
//! (the rule Fluent Bit and OpenTelemetry filelog users asked for:
//! opentelemetry-collector-contrib issue #12769).
//!
//! At a restart, each file found is matched to the checkpoint (`match_checkpoint`):
//!
//! 1. Same `(dev, inode)` and its first `head_len` bytes still hash to the saved fingerprint:
//!    resume at the saved offset. An entry without a fingerprint (written before fingerprints,
//!    or `head_len` 0) is trusted on `(dev, inode)` alone.
//! 2. Same `(dev, inode)` but other first bytes, or shorter than the saved offset: truncated
//!    (or the inode reused) while the agent was down. Read from 0, counted as
//!    [`LogEvent::FileTruncated`] and logged once.
//! 3. Another inode, not in the checkpoint, at least as long as the offset of an entry no file
//!    resumed in step 1, whose first [`HEAD_BYTES`] bytes and whose bytes just before that
//!    offset hash to the entry's two fingerprints: a copy of that file (recognised by content
//!    as Vector's checksum fingerprinter does; e.g. `cp app.log app.log.1; : > app.log` while
//!    the agent was down, with a glob matching both): resume at the saved offset, so its lines
//!    are not read again. The second fingerprint keeps a new file that merely opens with the
//!    same banner from being taken for a copy (which would skip its first bytes). Among several
//!    such files, the one at the saved path wins, then the first in path order.
//!
//! **Short files.** A fingerprint names a file's content only when it covers [`HEAD_BYTES`]
//! bytes: a file shorter than that when it was checkpointed is identified by `(dev, inode)`
//! only, so a copy of it made while the agent was down is read again from its beginning (at
//! most `HEAD_BYTES − 1` bytes repeated), rather than risk skipping a different file that merely
//! starts with the same few bytes. Unlike Vector, such files are read at once, not ignored until
//! they grow. The same holds for entries of older versions (a 64-byte head, no `before_*`) and
//! of files closed before the checkpoint (no `before_*`).
//!
//! A file at a path the state file knows under another inode was rotated in while the agent was
//! down and is read from its beginning ([`LogEvent::RotationCreate`]). Lines still unread in a
//! rotated file that no glob matches when the agent starts are lost (the glob can include
//! rotated names to avoid that).
//!
//! # Bounded work
//!
//! One [`LogTailer::poll`] returns at most `max_records` records and reads at most
//! [`LogSourceConfig::max_bytes_per_poll`] bytes; memory per file is one partial line
//! (≤ `max_line_bytes`) plus a [`HEAD_BYTES`] fingerprint. [`PollStats::more_pending`] tells the
//! caller to poll again soon. Orphans are read first, then files in discovery order, so a file
//! that is written faster than the budget delays the files after it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uctel_protocol::payload::{LogRecord, Severity};

use super::severity;

/// How many leading bytes of a file are kept as its fingerprint: truncation detection while
/// running, checkpoint validation at start, and — only when the file has at least this many
/// bytes — recognising a copy of a checkpointed file under another inode (the size Vector's
/// checksum fingerprinter used by default). The checkpoint stores the FNV-1a 64 hash of the
/// first `min(size, HEAD_BYTES)` bytes and their count.
pub const HEAD_BYTES: usize = 256;

/// Largest positional read issued at once.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// At most this many errors are returned by one poll (all are counted).
const MAX_ERRORS_PER_POLL: usize = 16;

/// Version of the state file format.
const STATE_VERSION: u32 = 1;

/// Where to start reading a file found at the first scan of the first run (no state file yet;
/// see the module documentation). Files found later are always read from their first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartAt {
    /// From offset 0.
    Beginning,
    /// From the current end of the file (only lines written from now on).
    #[default]
    End,
}

/// Configuration of a [`LogTailer`].
#[derive(Debug, Clone, PartialEq)]
pub struct LogSourceConfig {
    /// Glob patterns (`glob` crate syntax: `*`, `?`, `[...]`, `**`) of files to follow.
    pub include: Vec<String>,
    /// Glob patterns of paths to skip even if included (e.g. `/var/log/*.gz`).
    pub exclude: Vec<String>,
    /// Start position for files present at the first scan of the first run (no state file
    /// configured, or none written yet). Every file found later, or not in an existing state
    /// file, is read from its first byte.
    pub start_at: StartAt,
    /// Longest line, in bytes without the `\n`, emitted whole; longer lines are cut. Must leave
    /// room in a frame for the frame header and the record's encoding.
    pub max_line_bytes: usize,
    /// A last line without `\n` is emitted as is after this long.
    pub partial_line_timeout: Duration,
    /// How long a rotated-away or deleted file stays open for late writes after it was seen to
    /// be rotated.
    pub rotate_wait: Duration,
    /// Minimum time between glob evaluations; between them only the known paths are stat'ed.
    pub glob_interval: Duration,
    /// At most this many bytes are read by one poll.
    pub max_bytes_per_poll: usize,
    /// Where offsets are checkpointed; `None` disables checkpoints.
    pub state_file: Option<PathBuf>,
    /// Each record's severity is read from its line ([`severity::detect`]); otherwise every
    /// record is `unspecified`.
    pub detect_severity: bool,
}

impl LogSourceConfig {
    /// Defaults: start at end, 2048-byte lines, 1 s partial-line timeout, 5 s rotate wait,
    /// 1 s glob interval, 1 MiB per poll, no state file, severity detected.
    pub fn new<I, S>(include: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            include: include.into_iter().map(Into::into).collect(),
            exclude: Vec::new(),
            start_at: StartAt::End,
            max_line_bytes: 2048,
            partial_line_timeout: Duration::from_secs(1),
            rotate_wait: Duration::from_secs(5),
            glob_interval: Duration::from_secs(1),
            max_bytes_per_poll: 1 << 20,
            state_file: None,
            detect_severity: true,
        }
    }
}

/// Everything the tailer drops, alters or recovers from, as one closed set of reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogEvent {
    /// A line longer than `max_line_bytes` was cut; the rest up to `\n` was discarded.
    LineTruncated,
    /// A record contained invalid UTF-8, replaced with U+FFFD.
    InvalidUtf8,
    /// A last line without `\n` was emitted without waiting for its end (timeout, file closed
    /// or truncated).
    PartialLineFlushed,
    /// A followed file was truncated (copytruncate rotation or truncation); reading restarted
    /// at 0.
    FileTruncated,
    /// A followed path was re-created as a new file (create-rotation).
    RotationCreate,
    /// A glob, stat, open or read failed; retried on later polls.
    ReadError,
}

impl LogEvent {
    /// Every reason, in declaration order.
    pub const ALL: [LogEvent; 6] = [
        LogEvent::LineTruncated,
        LogEvent::InvalidUtf8,
        LogEvent::PartialLineFlushed,
        LogEvent::FileTruncated,
        LogEvent::RotationCreate,
        LogEvent::ReadError,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LogEvent::LineTruncated => "line_truncated",
            LogEvent::InvalidUtf8 => "invalid_utf8",
            LogEvent::PartialLineFlushed => "partial_line_flushed",
            LogEvent::FileTruncated => "file_truncated",
            LogEvent::RotationCreate => "rotation_create",
            LogEvent::ReadError => "read_error",
        }
    }
}

/// Cumulative counters of one [`LogTailer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSourceCounts {
    /// Records returned by [`LogTailer::poll`].
    pub records: u64,
    /// Bytes consumed from files (lines, newlines and discarded remainders).
    pub bytes_read: u64,
    /// Bytes of over-long lines discarded after the cut.
    pub discarded_bytes: u64,
    /// Bytes that existed in a file but had not been read when it was found truncated (lower
    /// bound of what the truncation lost).
    pub truncated_unread_bytes: u64,
    /// Files opened for following.
    pub files_opened: u64,
    /// Files closed after rotation or removal.
    pub files_closed: u64,
    events: [u64; LogEvent::ALL.len()],
}

impl LogSourceCounts {
    /// How many times `event` happened.
    pub fn get(&self, event: LogEvent) -> u64 {
        self.events.get(event as usize).copied().unwrap_or(0)
    }

    fn bump(&mut self, event: LogEvent) {
        if let Some(n) = self.events.get_mut(event as usize) {
            *n += 1;
        }
    }
}

/// A failure on one file or pattern; counted as [`LogEvent::ReadError`] and retried.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct LogFileError {
    /// `glob`, `stat`, `open` or `read`.
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What one [`LogTailer::poll`] did.
#[derive(Debug, Default)]
pub struct PollStats {
    /// Records appended to `out`.
    pub records: usize,
    /// Bytes consumed from files.
    pub bytes: u64,
    /// Files followed after this poll (orphans included).
    pub files: usize,
    /// A budget (`max_records` or `max_bytes_per_poll`) stopped reading while data was left.
    pub more_pending: bool,
    /// Up to 16 of the errors met (all are counted).
    pub errors: Vec<LogFileError>,
}

/// [`LogTailer::new`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LogSourceError {
    /// A glob pattern does not parse.
    #[error("bad glob pattern {pattern:?}: {source}")]
    Pattern {
        pattern: String,
        #[source]
        source: glob::PatternError,
    },
    /// A limit is zero.
    #[error("{field} must be at least 1")]
    ZeroLimit { field: &'static str },
    /// The state file exists but cannot be read or parsed.
    #[error("cannot load state file {path}: {reason}")]
    State { path: PathBuf, reason: String },
}

/// [`LogTailer::checkpoint`] failed; the previous state file is left in place.
#[derive(Debug, thiserror::Error)]
#[error("cannot write state file {path}: {source}")]
pub struct CheckpointError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

// ---------------------------------------------------------------------------------------------
// Sans-IO: line splitting.

/// How an emitted line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnd {
    /// At a `\n`.
    Newline,
    /// Cut at `max_line_bytes`; the rest of the line is being discarded.
    Cut,
    /// A partial last line emitted without its `\n`.
    Flushed,
}

/// Splits a byte stream into lines (sans-IO). Holds at most `max_line_bytes` bytes of an
/// unfinished line. Tracks the stream offset of the next byte fed ([`LineSplitter::position`])
/// so that every emitted line comes with the offset of its first byte (where reading must
/// resume to read that line again).
#[derive(Debug, Clone)]
pub struct LineSplitter {
    max_line_bytes: usize,
    partial: Vec<u8>,
    partial_since: Option<Instant>,
    /// Stream offset of the first byte of `partial`.
    partial_start: u64,
    discarding: bool,
    /// Stream offset of the next byte to be fed.
    pos: u64,
}

/// Result of [`LineSplitter::feed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fed {
    /// Bytes of the chunk consumed (emitted, buffered as partial, or discarded).
    pub consumed: usize,
    /// Lines emitted.
    pub lines: usize,
    /// Bytes discarded (rest of over-long lines, and bytes dropped to keep a cut on a UTF-8
    /// boundary).
    pub discarded: usize,
}

impl LineSplitter {
    /// A splitter for lines of at most `max_line_bytes` bytes (at least 1).
    pub fn new(max_line_bytes: usize) -> Self {
        Self {
            max_line_bytes: max_line_bytes.max(1),
            partial: Vec::new(),
            partial_since: None,
            partial_start: 0,
            discarding: false,
            pos: 0,
        }
    }

    /// The same splitter, with the next byte fed at stream offset `offset` (where reading
    /// starts or resumes).
    #[must_use]
    pub fn at(mut self, offset: u64) -> Self {
        self.pos = offset;
        self
    }

    /// Stream offset of the next byte to be fed.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// A splitter resuming in the middle of an over-long line (from a checkpoint).
    pub fn discarding(max_line_bytes: usize) -> Self {
        Self {
            discarding: true,
            ..Self::new(max_line_bytes)
        }
    }

    /// Bytes of an unfinished line held back (not yet emitted).
    pub fn partial_len(&self) -> usize {
        self.partial.len()
    }

    /// Whether the rest of a cut line is being discarded.
    pub fn is_discarding(&self) -> bool {
        self.discarding
    }

    /// Forgets any partial line and discard state, and restarts at offset 0 (after the file
    /// was truncated).
    pub fn reset(&mut self) {
        self.partial.clear();
        self.partial_since = None;
        self.discarding = false;
        self.pos = 0;
    }

    /// Consumes `chunk` (the bytes at [`LineSplitter::position`] onwards), calling
    /// `emit(line, end, start)` for each line, `start` being the stream offset of the line's
    /// first byte; stops after `max_lines` lines; unconsumed bytes must be fed again. `now`
    /// starts the partial-line timer.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        now: Instant,
        max_lines: usize,
        emit: &mut dyn FnMut(&[u8], LineEnd, u64),
    ) -> Fed {
        let mut fed = Fed::default();
        let base = self.pos;
        let mut i = 0;
        while i < chunk.len() {
            let rest = &chunk[i..];
            if self.discarding {
                match rest.iter().position(|&b| b == b'\n') {
                    Some(p) => {
                        fed.discarded += p;
                        i += p + 1;
                        self.discarding = false;
                    }
                    None => {
                        fed.discarded += rest.len();
                        i = chunk.len();
                    }
                }
                continue;
            }
            if fed.lines >= max_lines {
                break;
            }
            let room = self.max_line_bytes - self.partial.len();
            // A newline at index `room` still ends a line of exactly max_line_bytes.
            let window = &rest[..rest.len().min(room + 1)];
            let here = base + i as u64;
            if let Some(p) = window.iter().position(|&b| b == b'\n') {
                if self.partial.is_empty() {
                    emit(&rest[..p], LineEnd::Newline, here);
                } else {
                    self.partial.extend_from_slice(&rest[..p]);
                    emit(&self.partial, LineEnd::Newline, self.partial_start);
                    self.partial.clear();
                    self.partial_since = None;
                }
                fed.lines += 1;
                i += p + 1;
            } else if rest.len() > room {
                // Over-long: cut at max_line_bytes, on a UTF-8 boundary where possible.
                if self.partial.is_empty() {
                    self.partial_start = here;
                }
                self.partial.extend_from_slice(&rest[..room]);
                let cut = utf8_cut(&self.partial);
                fed.discarded += self.partial.len() - cut;
                emit(&self.partial[..cut], LineEnd::Cut, self.partial_start);
                self.partial.clear();
                self.partial_since = None;
                self.discarding = true;
                fed.lines += 1;
                i += room;
            } else {
                if self.partial.is_empty() {
                    self.partial_since = Some(now);
                    self.partial_start = here;
                }
                self.partial.extend_from_slice(rest);
                i = chunk.len();
            }
        }
        fed.consumed = i;
        self.pos = base + i as u64;
        fed
    }

    /// Emits the partial line if it has waited `timeout` since its first byte was read.
    /// Returns whether a line was emitted.
    pub fn flush_if_stale(
        &mut self,
        now: Instant,
        timeout: Duration,
        emit: &mut dyn FnMut(&[u8], LineEnd, u64),
    ) -> bool {
        match self.partial_since {
            Some(since)
                if !self.partial.is_empty() && now.saturating_duration_since(since) >= timeout =>
            {
                self.flush(emit)
            }
            _ => false,
        }
    }

    /// Emits the partial line now, if any. Returns whether a line was emitted.
    pub fn flush(&mut self, emit: &mut dyn FnMut(&[u8], LineEnd, u64)) -> bool {
        if self.partial.is_empty() {
            return false;
        }
        emit(&self.partial, LineEnd::Flushed, self.partial_start);
        self.partial.clear();
        self.partial_since = None;
        true
    }
}

/// The longest prefix length of `buf` that does not end inside a UTF-8 sequence (so a cut does
/// not invent an invalid character). Invalid bytes earlier in `buf` are left to the lossy
/// conversion.
fn utf8_cut(buf: &[u8]) -> usize {
    match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        Err(e) if e.error_len().is_none() => {
            // Everything before the incomplete tail may itself contain invalid bytes; cut just
            // before the incomplete sequence (at most 3 bytes).
            let tail = buf.len() - e.valid_up_to();
            buf.len() - tail.min(3)
        }
        Err(_) => buf.len(),
    }
}

/// Where reading resumes after a line emitted by a [`LineSplitter`] of `max_line_bytes` that
/// started at `start` and holds `len` bytes: just after its `\n` (`Newline`), just after its
/// last byte (`Flushed`: the rest, if any, is another line), or just after the
/// `max_line_bytes` bytes taken before the cut (`Cut`: a UTF-8 back-off may have emitted
/// fewer; the rest of the line is discarded, never emitted). Increases strictly with each
/// line of a file, so it is the record's `end_offset`.
pub fn line_end_offset(start: u64, len: usize, end: LineEnd, max_line_bytes: usize) -> u64 {
    let taken = match end {
        LineEnd::Newline => len.saturating_add(1),
        LineEnd::Flushed => len,
        LineEnd::Cut => max_line_bytes.max(len),
    };
    start.saturating_add(taken as u64)
}

// ---------------------------------------------------------------------------------------------
// Sans-IO: identity, rotation and truncation rules.

/// Identity of a file: device and inode number (stat(2) `st_dev`, `st_ino`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// What the size and head bytes of a followed file say (sans-IO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Nothing suspicious: keep reading at the offset.
    None,
    /// The file is shorter than the offset, or its first bytes changed: it was truncated
    /// (and possibly rewritten); restart at 0.
    Truncated,
}

/// Truncation rule: `size < offset`, or the first `head.len()` bytes now read `current_head`
/// instead of `head` (copytruncate followed by new writes past the old offset).
pub fn truncation_check(
    size: u64,
    offset: u64,
    head: &[u8],
    current_head: Option<&[u8]>,
) -> Truncation {
    if size < offset {
        return Truncation::Truncated;
    }
    match current_head {
        Some(cur) if !head.is_empty() && cur != head => Truncation::Truncated,
        _ => Truncation::None,
    }
}

/// A tracked file as `reconcile` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TrackedView {
    id: FileId,
    path: PathBuf,
    orphaned: bool,
}

/// One decision of `reconcile`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A tracked file is now at `path` (renamed within the watched set) and not orphaned.
    Moved { id: FileId, path: PathBuf },
    /// A tracked file is no longer at any watched path (rotated away or deleted).
    Orphaned { id: FileId },
    /// A file not tracked yet; `replaced` if the path named another file before.
    New {
        id: FileId,
        path: PathBuf,
        replaced: bool,
    },
}

/// Rotation detection from observations (sans-IO).
///
/// `observed`: every path stat'ed this poll that exists, with the file it names now.
/// `checked`: every path stat'ed this poll (existing or not). `history`: the file each path named
/// when last seen. A tracked file is orphaned when its own path was checked, no longer names it,
/// and it was not observed elsewhere.
fn reconcile(
    tracked: &[TrackedView],
    observed: &[(PathBuf, FileId)],
    checked: &HashSet<PathBuf>,
    history: &HashMap<PathBuf, FileId>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut seen_at: HashMap<FileId, &PathBuf> = HashMap::new();
    for (path, id) in observed {
        // Prefer the file's current path if it is still observed there.
        let keep_current = tracked.iter().any(|t| t.id == *id && t.path == *path);
        if keep_current || !seen_at.contains_key(id) {
            seen_at.insert(*id, path);
        }
    }
    for t in tracked {
        match seen_at.get(&t.id) {
            Some(path) if **path != t.path || t.orphaned => changes.push(Change::Moved {
                id: t.id,
                path: (*path).clone(),
            }),
            Some(_) => {}
            None if !t.orphaned && checked.contains(&t.path) => {
                changes.push(Change::Orphaned { id: t.id })
            }
            None => {}
        }
    }
    let mut new_ids = HashSet::new();
    for (path, id) in observed {
        if tracked.iter().any(|t| t.id == *id) || !new_ids.insert(*id) {
            continue;
        }
        let replaced = history.get(path).is_some_and(|prev| prev != id);
        changes.push(Change::New {
            id: *id,
            path: path.clone(),
            replaced,
        });
    }
    changes
}

/// A saved position of one file (checkpoint entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Saved {
    offset: u64,
    discarding: bool,
    /// Bytes covered by `head_hash` (0: no fingerprint).
    head_len: usize,
    /// FNV-1a 64 of the file's first `head_len` bytes.
    head_hash: u64,
    /// `(len, FNV-1a 64)` of the `len = min(offset, HEAD_BYTES)` bytes just before `offset`;
    /// `None` when unknown (older state files, files closed before the checkpoint).
    before: Option<(usize, u64)>,
    /// The file's stable identity (`LogRecord::file_id`); 0 in older state files.
    file_id: u64,
}

impl Saved {
    /// Whether `head` (a file's first bytes, up to [`HEAD_BYTES`]) starts with the bytes this
    /// entry fingerprinted. No fingerprint matches anything.
    fn fingerprint_matches(&self, head: &[u8]) -> bool {
        self.head_len == 0
            || head
                .get(..self.head_len)
                .is_some_and(|h| fnv1a64(h) == self.head_hash)
    }

    /// Whether the fingerprints can recognise the file under another inode: its first
    /// [`HEAD_BYTES`] bytes and the bytes before the offset are known.
    fn names_content(&self) -> bool {
        self.head_len == HEAD_BYTES && self.before.is_some()
    }
}

/// One entry of the state file loaded at start.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SavedEntry {
    id: FileId,
    path: PathBuf,
    pos: Saved,
}

/// A file found by the first scan, as `match_checkpoint` sees it.
#[derive(Debug, Clone, Copy)]
struct Found<'a> {
    id: FileId,
    path: &'a Path,
    size: u64,
    /// The file's first `min(size, HEAD_BYTES)` bytes.
    head: &'a [u8],
}

/// What the checkpoint says about a file found at start (decision of `match_checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resume {
    /// Resume at the saved position. `copy_of`: the file was recognised by its fingerprint
    /// under another inode (a copy of the checkpointed file at that path).
    Saved {
        offset: u64,
        discarding: bool,
        copy_of: Option<PathBuf>,
        /// The entry's `file_id`, inherited by the file (0: none saved, a new one is drawn).
        file_id: u64,
    },
    /// The checkpoint knows this `(dev, inode)`, but the file's first bytes changed or it is
    /// shorter than the saved offset: truncated (or the inode reused) while the agent was down.
    Truncated { saved_offset: u64 },
    /// Not in the checkpoint.
    Unknown,
}

/// Matches the files found by the first scan to the checkpoint entries (sans-IO); one decision
/// per file of `found`, in its order. Rules (module documentation, "Start"): first by
/// `(dev, inode)` with a matching fingerprint; an entry whose inode no longer holds its content
/// may then be claimed by one file of another inode not in the checkpoint, at least as long as
/// the saved offset, whose first [`HEAD_BYTES`] bytes and whose bytes just before the saved
/// offset match (a copy; at the saved path first, then in path order). Each entry resumes at
/// most one file.
///
/// `hash_at(i, at, len)`: FNV-1a 64 of the `len` bytes of `found[i]` at offset `at`, `None` when
/// they cannot all be read (no match).
fn match_checkpoint(
    entries: &[SavedEntry],
    found: &[Found<'_>],
    hash_at: &mut dyn FnMut(usize, u64, usize) -> Option<u64>,
) -> Vec<Resume> {
    let mut claimed = vec![false; entries.len()];
    let mut out = vec![Resume::Unknown; found.len()];
    for (f, decision) in found.iter().zip(out.iter_mut()) {
        let Some(k) = entries
            .iter()
            .zip(&claimed)
            .position(|(e, c)| !c && e.id == f.id)
        else {
            continue;
        };
        let Some(e) = entries.get(k) else { continue };
        if e.pos.fingerprint_matches(f.head) && e.pos.offset <= f.size {
            if let Some(c) = claimed.get_mut(k) {
                *c = true;
            }
            *decision = Resume::Saved {
                offset: e.pos.offset,
                discarding: e.pos.discarding,
                copy_of: None,
                file_id: e.pos.file_id,
            };
        } else {
            // Not claimed: the content may live on in a copy.
            *decision = Resume::Truncated {
                saved_offset: e.pos.offset,
            };
        }
    }
    for (e, c) in entries.iter().zip(claimed.iter_mut()) {
        let Some((before_len, before_hash)) = e.pos.before.filter(|_| e.pos.names_content()) else {
            continue;
        };
        if *c {
            continue;
        }
        let before_at = e.pos.offset.saturating_sub(before_len as u64);
        let pick = found
            .iter()
            .zip(&out)
            .enumerate()
            .filter(|(i, (f, d))| {
                **d == Resume::Unknown
                    && f.size >= e.pos.offset
                    && e.pos.fingerprint_matches(f.head)
                    && hash_at(*i, before_at, before_len) == Some(before_hash)
            })
            .min_by_key(|(_, (f, _))| (f.path != e.path, f.path))
            .map(|(i, _)| i);
        if let Some(decision) = pick.and_then(|i| out.get_mut(i)) {
            *c = true;
            *decision = Resume::Saved {
                offset: e.pos.offset,
                discarding: e.pos.discarding,
                copy_of: Some(e.path.clone()),
                file_id: e.pos.file_id,
            };
        }
    }
    out
}

/// Where to start reading a newly tracked file (sans-IO): `(offset, discarding)`. `resume` is
/// the checkpoint's word on it; `first_scan_of_first_run`: found by the first scan with no
/// state file to resume from, the only case where `start_at` applies (module documentation,
/// "Start"). Everything else the checkpoint does not know is new data, read from 0.
fn start_position(
    resume: &Resume,
    size: u64,
    first_scan_of_first_run: bool,
    start_at: StartAt,
) -> (u64, bool) {
    match resume {
        Resume::Saved {
            offset, discarding, ..
        } => (*offset, *discarding),
        Resume::Truncated { .. } => (0, false),
        Resume::Unknown if first_scan_of_first_run && start_at == StartAt::End => (size, false),
        Resume::Unknown => (0, false),
    }
}

/// Remembers which `(path, op)` failures were reported, so that a path failing at every poll
/// is logged once when it starts failing (sans-IO). A failure not seen again for a whole scan
/// epoch (a full glob interval) is forgotten: if it comes back, it is news again. Holds at most
/// the failures of the last two epochs.
#[derive(Debug, Default)]
struct ErrorLatch {
    failing: HashMap<(PathBuf, &'static str), u64>,
    epoch: u64,
}

impl ErrorLatch {
    /// Notes that `op` failed on `path`; returns whether that is news (to be logged).
    fn note(&mut self, path: &Path, op: &'static str) -> bool {
        let epoch = self.epoch;
        self.failing.insert((path.to_owned(), op), epoch).is_none()
    }

    /// Starts a new epoch (at each full scan), forgetting failures last seen before the
    /// previous one.
    fn next_epoch(&mut self) {
        self.epoch += 1;
        let keep_from = self.epoch.saturating_sub(1);
        self.failing.retain(|_, seen| *seen >= keep_from);
    }
}

/// FNV-1a 64 of the head bytes (fingerprint stored in the state file).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

// ---------------------------------------------------------------------------------------------
// State file.

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateFile {
    version: u32,
    files: Vec<StateEntry>,
}

/// One file of the state file. `head_len` and `head_hash` (the fingerprint) may be missing
/// (state files of older versions): the entry then matches on `(dev, inode)` alone.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateEntry {
    path: String,
    dev: u64,
    ino: u64,
    offset: u64,
    #[serde(default)]
    discarding: bool,
    /// Bytes covered by `head_hash`, at most [`HEAD_BYTES`] (64 in older versions).
    #[serde(default)]
    head_len: usize,
    /// FNV-1a 64 of the file's first `head_len` bytes.
    #[serde(default)]
    head_hash: u64,
    /// Bytes covered by `before_hash`: `min(offset, HEAD_BYTES)`. Missing in older versions
    /// and for files closed before the checkpoint (no recognition under another inode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before_len: Option<usize>,
    /// FNV-1a 64 of the `before_len` bytes just before `offset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before_hash: Option<u64>,
    /// The file's stable identity sent with its records (`LogRecord::file_id`). Missing (0)
    /// in older versions: the file then gets a new one.
    #[serde(default)]
    file_id: u64,
}

/// Loads the state file: `None` when there is none yet (the first run).
fn load_state(path: &Path) -> Result<Option<Vec<StateEntry>>, LogSourceError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(LogSourceError::State {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        }
    };
    let state: StateFile = serde_json::from_str(&text).map_err(|e| LogSourceError::State {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(LogSourceError::State {
            path: path.to_owned(),
            reason: format!("version {} is not {STATE_VERSION}", state.version),
        });
    }
    Ok(Some(state.files))
}

// ---------------------------------------------------------------------------------------------
// IO layer.

#[derive(Debug)]
struct Tracked {
    id: FileId,
    path: PathBuf,
    source: String,
    file: File,
    read_offset: u64,
    last_size: u64,
    head: Vec<u8>,
    splitter: LineSplitter,
    orphaned_at: Option<Instant>,
    at_eof: bool,
    seq: u64,
    /// Bumped at every truncation: offsets of an older generation name bytes that are gone.
    generation: u64,
    /// Stable identity sent with every record (`LogRecord::file_id`): kept in the checkpoint,
    /// inherited by a copy recognised at start, drawn anew at every truncation.
    file_id: u64,
}

/// A file found by a scan and opened, not followed yet.
#[derive(Debug)]
struct Opened {
    id: FileId,
    path: PathBuf,
    file: File,
    size: u64,
    /// The first `min(size, HEAD_BYTES)` bytes.
    head: Vec<u8>,
    /// The path named another file before (create-rotation).
    replaced: bool,
}

/// [`LogEvent::FileTruncated`]: counted, and logged once per truncation found (the callers
/// find each truncation once: reading then restarts at 0 with a new fingerprint).
#[derive(Debug)]
struct FileTruncated<'a> {
    path: &'a Path,
    /// Where reading was (or, while down, the saved offset).
    offset: u64,
    /// The file's size now.
    size: u64,
    /// Bytes that existed past `offset` and were never read (lower bound of the loss).
    unread_bytes: u64,
    /// Found at start: truncated (or the inode reused) while the agent was down.
    while_down: bool,
}

impl FileTruncated<'_> {
    fn emit(self, counts: &mut LogSourceCounts) {
        counts.bump(LogEvent::FileTruncated);
        counts.truncated_unread_bytes += self.unread_bytes;
        if self.while_down {
            tracing::warn!(
                path = %self.path.display(),
                saved_offset = self.offset,
                size = self.size,
                "log file truncated or replaced while the agent was down (its first bytes or \
                 size no longer match the checkpoint); reading it from offset 0"
            );
        } else {
            tracing::warn!(
                path = %self.path.display(),
                offset = self.offset,
                size = self.size,
                unread_bytes = self.unread_bytes,
                "log file truncated (copytruncate or truncation in place); reading it again from \
                 offset 0"
            );
        }
    }
}

impl Tracked {
    /// End of the last emitted (or discarded) byte: where a restart resumes.
    fn committed_offset(&self) -> u64 {
        self.read_offset
            .saturating_sub(self.splitter.partial_len() as u64)
    }
}

/// Where a record returned by [`LogTailer::poll`] came from: its file, the file's generation,
/// and the offset of the line's first byte (where reading resumes to read it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RecordPos {
    id: FileId,
    generation: u64,
    start: u64,
}

/// A file closed (rotated away or removed) while records read from it were not settled yet:
/// its checkpoint entry is kept until they are.
#[derive(Debug, Clone)]
struct Retired {
    id: FileId,
    source: String,
    head: Vec<u8>,
    generation: u64,
    file_id: u64,
}

/// Follows log files; see the module documentation.
#[derive(Debug)]
pub struct LogTailer {
    config: LogSourceConfig,
    exclude: Vec<glob::Pattern>,
    files: Vec<Tracked>,
    /// Checkpoint entries loaded at start; consulted by the first scan only.
    saved: Vec<SavedEntry>,
    history: HashMap<PathBuf, FileId>,
    last_full_scan: Option<Instant>,
    initial_scan_done: bool,
    /// No state file to resume from: `start_at` applies to the first scan.
    first_run: bool,
    /// The first run's start positions are to be written to the state file after the first
    /// scan.
    record_start: bool,
    latch: ErrorLatch,
    next_seq: u64,
    counts: LogSourceCounts,
    buf: Vec<u8>,
    /// Positions of the records returned by `poll` and not settled yet, oldest first (kept
    /// only with a state file).
    unsettled: VecDeque<RecordPos>,
    /// Closed files some unsettled record came from.
    retired: Vec<Retired>,
}

impl LogTailer {
    /// Validates the patterns and limits and loads the state file (a missing one means this is
    /// the first run: `start_at` applies to the first scan). No file is opened before the first
    /// [`LogTailer::poll`].
    ///
    /// # Errors
    /// [`LogSourceError`] for a bad pattern, a zero limit, or an unreadable/corrupt state file
    /// (not silently ignored: starting over would repeat or skip lines).
    pub fn new(config: LogSourceConfig) -> Result<Self, LogSourceError> {
        if config.max_line_bytes == 0 {
            return Err(LogSourceError::ZeroLimit {
                field: "max_line_bytes",
            });
        }
        if config.max_bytes_per_poll == 0 {
            return Err(LogSourceError::ZeroLimit {
                field: "max_bytes_per_poll",
            });
        }
        for pattern in &config.include {
            glob::Pattern::new(pattern).map_err(|source| LogSourceError::Pattern {
                pattern: pattern.clone(),
                source,
            })?;
        }
        let exclude = config
            .exclude
            .iter()
            .map(|p| {
                glob::Pattern::new(p).map_err(|source| LogSourceError::Pattern {
                    pattern: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut saved = Vec::new();
        let mut history = HashMap::new();
        let state = match &config.state_file {
            Some(state_path) => load_state(state_path)?,
            None => None,
        };
        let first_run = state.is_none();
        for e in state.into_iter().flatten() {
            let id = FileId {
                dev: e.dev,
                ino: e.ino,
            };
            let path = PathBuf::from(e.path);
            history.insert(path.clone(), id);
            saved.push(SavedEntry {
                id,
                path,
                pos: Saved {
                    offset: e.offset,
                    discarding: e.discarding,
                    // A longer fingerprint cannot be checked: it never matches.
                    head_len: e.head_len.min(HEAD_BYTES + 1),
                    head_hash: e.head_hash,
                    before: e.before_len.zip(e.before_hash),
                    file_id: e.file_id,
                },
            });
        }
        let record_start = first_run && config.state_file.is_some();
        Ok(Self {
            config,
            exclude,
            files: Vec::new(),
            saved,
            history,
            last_full_scan: None,
            initial_scan_done: false,
            first_run,
            record_start,
            latch: ErrorLatch::default(),
            next_seq: 0,
            counts: LogSourceCounts::default(),
            buf: Vec::new(),
            unsettled: VecDeque::new(),
            retired: Vec::new(),
        })
    }

    /// Cumulative counters.
    pub fn counts(&self) -> &LogSourceCounts {
        &self.counts
    }

    /// The files followed now: (path, committed offset), orphans first.
    pub fn files(&self) -> Vec<(PathBuf, u64)> {
        self.files
            .iter()
            .map(|t| (t.path.clone(), t.committed_offset()))
            .collect()
    }

    /// Finds new, rotated and truncated files and reads new lines into `out`: at most
    /// `max_records` records and [`LogSourceConfig::max_bytes_per_poll`] bytes. `now` drives the
    /// glob interval, partial-line timeout and rotate wait. Never fails as a whole: per-file
    /// errors are counted, returned in [`PollStats::errors`], logged when a path starts failing,
    /// and retried next time. The first poll of a first run writes the state file (the start
    /// positions; a failure is logged).
    pub fn poll(
        &mut self,
        now: Instant,
        out: &mut Vec<LogRecord>,
        max_records: usize,
    ) -> PollStats {
        let mut stats = PollStats::default();
        let full_scan = self
            .last_full_scan
            .is_none_or(|t| now.saturating_duration_since(t) >= self.config.glob_interval);
        self.scan(now, full_scan, &mut stats);
        if full_scan {
            self.last_full_scan = Some(now);
        }
        if self.record_start {
            // Where start_at put each file, before anything is read: a crash before the next
            // checkpoint must not apply start_at again. Tried once; later checkpoints cover it.
            self.record_start = false;
            if let Err(e) = self.checkpoint_settled() {
                tracing::warn!(error = %e, "cannot record the log files' start positions");
            }
        }

        let mut budget = Budget {
            records: max_records,
            bytes: self.config.max_bytes_per_poll,
        };
        let start_len = out.len();
        for t in &mut self.files {
            t.at_eof = false; // set again by `service` for the files it reads to their end
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(READ_CHUNK_BYTES, 0);
        // Paths whose rotated-away file still holds an unfinished last line: the writer may
        // complete it before reopening, so the successor waits (at most partial_line_timeout).
        let mut blocked: Vec<PathBuf> = Vec::new();
        for idx in 0..self.files.len() {
            if budget.records == 0 || budget.bytes == 0 {
                stats.more_pending = true;
                break;
            }
            if let Some(t) = self.files.get_mut(idx) {
                if t.orphaned_at.is_none() && blocked.contains(&t.path) {
                    stats.more_pending = true;
                    continue;
                }
                let more = service(
                    t,
                    &self.config,
                    now,
                    &mut budget,
                    &mut buf,
                    Emitted {
                        out,
                        positions: &mut self.unsettled,
                    },
                    &mut self.counts,
                    &mut self.latch,
                    &mut stats,
                );
                stats.more_pending |= more;
                if t.orphaned_at.is_some() && t.splitter.partial_len() > 0 {
                    blocked.push(t.path.clone());
                }
            }
        }
        self.buf = buf;

        if full_scan {
            self.close_orphans(now, out, &mut budget);
        }
        if self.config.state_file.is_none() {
            // Nothing to checkpoint: no positions to keep.
            self.unsettled.clear();
            self.retired.clear();
        }
        stats.records = out.len() - start_len;
        stats.bytes = (self.config.max_bytes_per_poll - budget.bytes) as u64;
        stats.files = self.files.len();
        stats
    }

    /// Records returned by [`LogTailer::poll`] and not settled yet (only counted with a state
    /// file).
    pub fn unsettled(&self) -> usize {
        self.unsettled.len()
    }

    /// The oldest `n` records returned by [`LogTailer::poll`] and not settled yet are settled:
    /// handed on for good (sent, or dropped and counted for a reason that a restart would not
    /// undo). [`LogTailer::checkpoint_settled`] moves past them; lines never settled are read
    /// again after a restart.
    pub fn settle(&mut self, n: usize) {
        let n = n.min(self.unsettled.len());
        self.unsettled.drain(..n);
        if !self.retired.is_empty() {
            let pending: HashSet<FileId> = self.unsettled.iter().map(|p| p.id).collect();
            self.retired.retain(|r| pending.contains(&r.id));
        }
    }

    /// Settles every record returned so far and writes the state file: a restart resumes after
    /// the last line returned by [`LogTailer::poll`]. Call it once those records were handed
    /// on; see the module documentation. No state file configured → no-op.
    ///
    /// # Errors
    /// [`CheckpointError`] when the file cannot be written; the previous one stays valid.
    pub fn checkpoint(&mut self) -> Result<(), CheckpointError> {
        self.settle(self.unsettled.len());
        self.checkpoint_settled()
    }

    /// Writes the state file (temporary file, fsync, rename) so that a restart resumes at the
    /// first unsettled line of each file ([`LogTailer::settle`]), or after the last line read
    /// where every record read from it is settled. A file closed while records read from it
    /// were unsettled keeps its entry until they are. No state file configured → no-op.
    ///
    /// # Errors
    /// [`CheckpointError`] when the file cannot be written; the previous one stays valid.
    pub fn checkpoint_settled(&self) -> Result<(), CheckpointError> {
        let Some(path) = &self.config.state_file else {
            return Ok(());
        };
        // The first unsettled record of each file.
        let mut first: HashMap<FileId, RecordPos> = HashMap::new();
        for p in &self.unsettled {
            first.entry(p.id).or_insert(*p);
        }
        // Resume where the first unsettled line started; a line of an older generation was
        // truncated away, so everything of the current one is read again.
        let resume = |id: FileId, generation: u64| {
            first.get(&id).map(|p| {
                if p.generation == generation {
                    p.start
                } else {
                    0
                }
            })
        };
        let mut files: Vec<StateEntry> = self
            .files
            .iter()
            .map(|t| {
                let (offset, discarding) = match resume(t.id, t.generation) {
                    Some(start) => (start, false),
                    None => (t.committed_offset(), t.splitter.is_discarding()),
                };
                let before = fingerprint_before(&t.file, offset);
                StateEntry {
                    path: t.source.clone(),
                    dev: t.id.dev,
                    ino: t.id.ino,
                    offset,
                    discarding,
                    head_len: t.head.len(),
                    head_hash: fnv1a64(&t.head),
                    before_len: before.map(|(len, _)| len),
                    before_hash: before.map(|(_, hash)| hash),
                    file_id: t.file_id,
                }
            })
            .collect();
        for r in &self.retired {
            if let Some(offset) = resume(r.id, r.generation) {
                files.push(StateEntry {
                    path: r.source.clone(),
                    dev: r.id.dev,
                    ino: r.id.ino,
                    offset,
                    discarding: false,
                    head_len: r.head.len(),
                    head_hash: fnv1a64(&r.head),
                    before_len: None,
                    before_hash: None,
                    file_id: r.file_id,
                });
            }
        }
        let state = StateFile {
            version: STATE_VERSION,
            files,
        };
        let err = |source| CheckpointError {
            path: path.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(&state).map_err(|e| err(std::io::Error::other(e)))?;
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        {
            let mut f = File::create(&tmp).map_err(err)?;
            f.write_all(&json).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Make the rename durable; best effort (not all filesystems allow fsync on a dir).
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    fn scan(&mut self, now: Instant, full_scan: bool, stats: &mut PollStats) {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if full_scan {
            self.latch.next_epoch();
            for pattern in &self.config.include {
                let paths = match glob::glob(pattern) {
                    Ok(p) => p,
                    Err(_) => continue, // validated in new()
                };
                for entry in paths {
                    match entry {
                        Ok(p) => {
                            if !self.exclude.iter().any(|x| x.matches_path(&p)) {
                                candidates.push(p);
                            }
                        }
                        Err(e) => {
                            let path = e.path().to_owned();
                            record_error(
                                &mut self.counts,
                                &mut self.latch,
                                stats,
                                "glob",
                                path,
                                std::io::Error::from(e),
                            );
                        }
                    }
                }
            }
        }
        for t in self.files.iter().filter(|t| t.orphaned_at.is_none()) {
            candidates.push(t.path.clone());
        }
        let mut checked = HashSet::new();
        let mut observed = Vec::new();
        for path in candidates {
            if !checked.insert(path.clone()) {
                continue;
            }
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => observed.push((
                    path,
                    FileId {
                        dev: m.dev(),
                        ino: m.ino(),
                    },
                )),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    // Unknown state: do not treat the path as gone.
                    checked.remove(&path);
                    record_error(&mut self.counts, &mut self.latch, stats, "stat", path, e);
                }
            }
        }
        let views: Vec<TrackedView> = self
            .files
            .iter()
            .map(|t| TrackedView {
                id: t.id,
                path: t.path.clone(),
                orphaned: t.orphaned_at.is_some(),
            })
            .collect();
        let changes = reconcile(&views, &observed, &checked, &self.history);

        let initial = !self.initial_scan_done;
        let mut new_files = Vec::new();
        for change in changes {
            match change {
                Change::Moved { id, path } => {
                    if let Some(t) = self.files.iter_mut().find(|t| t.id == id) {
                        t.source = path.to_string_lossy().into_owned();
                        t.path = path;
                        t.orphaned_at = None;
                    }
                }
                Change::Orphaned { id } => {
                    if let Some(t) = self.files.iter_mut().find(|t| t.id == id) {
                        t.orphaned_at = Some(now);
                    }
                }
                Change::New { id, path, replaced } => new_files.push((id, path, replaced)),
            }
        }
        let mut opened: Vec<Opened> = Vec::new();
        for (id, path, replaced) in new_files {
            if let Some(o) = self.open(id, path, replaced, &opened, stats) {
                opened.push(o);
            }
        }
        let resumes = if self.saved.is_empty() {
            vec![Resume::Unknown; opened.len()]
        } else {
            let found: Vec<Found<'_>> = opened
                .iter()
                .map(|o| Found {
                    id: o.id,
                    path: &o.path,
                    size: o.size,
                    head: &o.head,
                })
                .collect();
            let files: Vec<&File> = opened.iter().map(|o| &o.file).collect();
            match_checkpoint(&self.saved, &found, &mut |i, at, len| {
                let file = files.get(i)?;
                let mut buf = [0u8; HEAD_BYTES];
                let want = buf.get_mut(..len)?;
                match read_full_at(file, want, at) {
                    Ok(n) if n == len => Some(fnv1a64(want)),
                    _ => None,
                }
            })
        };
        let mut opened: Vec<(Opened, Resume)> = opened.into_iter().zip(resumes).collect();
        // Files resuming from a checkpoint were written before files that are new to us (a
        // rotated file before its successor), so they are read first.
        opened.sort_by(|(a, ra), (b, rb)| {
            let fresh = |r: &Resume| !matches!(r, Resume::Saved { .. });
            (fresh(ra), &a.path).cmp(&(fresh(rb), &b.path))
        });
        let first_scan_of_first_run = initial && self.first_run;
        for (o, resume) in opened {
            self.track(o, &resume, first_scan_of_first_run);
        }
        if full_scan {
            // Forget paths that are gone, unless a tracked file (an orphan being drained) was
            // last seen there: its successor may not have been created yet.
            let observed_paths: HashSet<&PathBuf> = observed.iter().map(|(p, _)| p).collect();
            let tracked_ids: HashSet<FileId> = self.files.iter().map(|t| t.id).collect();
            self.history
                .retain(|path, id| observed_paths.contains(path) || tracked_ids.contains(id));
        }
        for (path, id) in observed {
            self.history.insert(path, id);
        }
        if full_scan {
            // The checkpoint speaks of the files as they were at start: only the first scan
            // matches them.
            self.saved = Vec::new();
            self.initial_scan_done = true;
        }
        // Orphans first (older data), then discovery order.
        self.files.sort_by_key(|t| (t.orphaned_at.is_none(), t.seq));
    }

    /// Opens a new file and reads its fingerprint bytes. `None` when it vanished, failed (counted),
    /// or turned out to be a file already followed (renamed between stat and open).
    fn open(
        &mut self,
        observed_id: FileId,
        path: PathBuf,
        replaced: bool,
        opened: &[Opened],
        stats: &mut PollStats,
    ) -> Option<Opened> {
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() != ErrorKind::NotFound {
                    record_error(&mut self.counts, &mut self.latch, stats, "open", path, e);
                }
                return None;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                record_error(&mut self.counts, &mut self.latch, stats, "stat", path, e);
                return None;
            }
        };
        // The path may have been rotated between stat and open: trust the handle.
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if id != observed_id
            && (self.files.iter().any(|t| t.id == id) || opened.iter().any(|o| o.id == id))
        {
            return None;
        }
        let size = meta.len();
        let mut head = vec![0u8; usize::try_from(size).unwrap_or(HEAD_BYTES).min(HEAD_BYTES)];
        match read_full_at(&file, &mut head, 0) {
            Ok(n) => head.truncate(n),
            Err(e) => {
                record_error(&mut self.counts, &mut self.latch, stats, "read", path, e);
                return None;
            }
        }
        Some(Opened {
            id,
            path,
            file,
            size,
            head,
            replaced,
        })
    }

    /// Starts following an opened file where the checkpoint or the start rule says.
    fn track(&mut self, o: Opened, resume: &Resume, first_scan_of_first_run: bool) {
        let (offset, discarding) = start_position(
            resume,
            o.size,
            first_scan_of_first_run,
            self.config.start_at,
        );
        match resume {
            Resume::Truncated { saved_offset } => FileTruncated {
                path: &o.path,
                offset: *saved_offset,
                size: o.size,
                unread_bytes: 0,
                while_down: true,
            }
            .emit(&mut self.counts),
            Resume::Saved {
                copy_of: Some(original),
                ..
            } => tracing::info!(
                path = %o.path.display(),
                copy_of = %original.display(),
                offset,
                "log file recognised by its first bytes as a copy of a checkpointed file \
                 (copytruncate while the agent was down); resuming at the saved offset"
            ),
            Resume::Saved { .. } | Resume::Unknown => {}
        }
        let file_id = match resume {
            Resume::Saved { file_id, .. } if *file_id != 0 => *file_id,
            _ => new_file_id(),
        };
        if o.replaced {
            self.counts.bump(LogEvent::RotationCreate);
        }
        let splitter = if discarding {
            LineSplitter::discarding(self.config.max_line_bytes)
        } else {
            LineSplitter::new(self.config.max_line_bytes)
        }
        .at(offset);
        self.counts.files_opened += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.files.push(Tracked {
            id: o.id,
            source: o.path.to_string_lossy().into_owned(),
            path: o.path,
            file: o.file,
            read_offset: offset,
            last_size: o.size,
            head: o.head,
            splitter,
            orphaned_at: None,
            at_eof: false,
            seq,
            generation: 0,
            file_id,
        });
    }

    fn close_orphans(&mut self, now: Instant, out: &mut Vec<LogRecord>, budget: &mut Budget) {
        let rotate_wait = self.config.rotate_wait;
        let max_line = self.config.max_line_bytes;
        let detect = self.config.detect_severity;
        let counts = &mut self.counts;
        let unsettled = &mut self.unsettled;
        let retired = &mut self.retired;
        self.files.retain_mut(|t| {
            let expired = t
                .orphaned_at
                .is_some_and(|at| now.saturating_duration_since(at) >= rotate_wait);
            if !expired || !t.at_eof {
                return true;
            }
            if t.splitter.partial_len() > 0 {
                if budget.records == 0 {
                    return true;
                }
                let (id, generation, file_id) = (t.id, t.generation, t.file_id);
                let source = t.source.clone();
                t.splitter.flush(&mut |line, end, start| {
                    let at = (file_id, line_end_offset(start, line.len(), end, max_line));
                    push_record(out, counts, &source, detect, max_line, line, end, at);
                    unsettled.push_back(RecordPos {
                        id,
                        generation,
                        start,
                    });
                });
                budget.records -= 1;
            }
            if unsettled.iter().any(|p| p.id == t.id) {
                retired.push(Retired {
                    id: t.id,
                    source: t.source.clone(),
                    head: t.head.clone(),
                    generation: t.generation,
                    file_id: t.file_id,
                });
            }
            counts.files_closed += 1;
            false
        });
    }
}

#[derive(Debug)]
struct Budget {
    records: usize,
    bytes: usize,
}

/// [`LogEvent::ReadError`]: counted, returned (up to [`MAX_ERRORS_PER_POLL`] a poll), and
/// logged when `path` starts failing at `op` (see `ErrorLatch`).
fn record_error(
    counts: &mut LogSourceCounts,
    latch: &mut ErrorLatch,
    stats: &mut PollStats,
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
) {
    counts.bump(LogEvent::ReadError);
    if latch.note(&path, op) {
        tracing::warn!(
            path = %path.display(),
            op,
            error = %source,
            "log file {op} failed; retried at every poll, logged again only after it recovers"
        );
    }
    if stats.errors.len() < MAX_ERRORS_PER_POLL {
        stats.errors.push(LogFileError { op, path, source });
    }
}

/// `(len, FNV-1a 64)` of the `len = min(offset, HEAD_BYTES)` bytes of `file` just before
/// `offset`; `None` when they cannot all be read.
fn fingerprint_before(file: &File, offset: u64) -> Option<(usize, u64)> {
    let len = usize::try_from(offset)
        .unwrap_or(HEAD_BYTES)
        .min(HEAD_BYTES);
    let mut buf = [0u8; HEAD_BYTES];
    let want = buf.get_mut(..len)?;
    match read_full_at(file, want, offset.saturating_sub(len as u64)) {
        Ok(n) if n == len => Some((len, fnv1a64(want))),
        _ => None,
    }
}

/// Reads until `buf` is full or EOF; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Nanoseconds since the Unix epoch now (0 before 1970, saturating after 2554).
fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Builds one record from a line: stamped with the time it was read (the clock is read for
/// each line, so lines read by one poll keep their order in time), severity detected from
/// the line when `detect_severity` ([`severity::detect`]), lossy UTF-8, message bounded by
/// `max_line` bytes. `(file_id, end_offset)`: the file's stable identity and where reading
/// resumes after the line ([`line_end_offset`]), sent for the collector's deduplication.
#[allow(clippy::too_many_arguments)]
fn push_record(
    out: &mut Vec<LogRecord>,
    counts: &mut LogSourceCounts,
    source: &str,
    detect_severity: bool,
    max_line: usize,
    line: &[u8],
    end: LineEnd,
    (file_id, end_offset): (u64, u64),
) {
    let mut message = match String::from_utf8_lossy(line) {
        Cow::Borrowed(s) => s.to_owned(),
        Cow::Owned(s) => {
            counts.bump(LogEvent::InvalidUtf8);
            s
        }
    };
    let mut cut = end == LineEnd::Cut;
    if message.len() > max_line {
        // U+FFFD replacements can make the text longer than the bytes it came from.
        let mut at = max_line;
        while !message.is_char_boundary(at) {
            at -= 1;
        }
        message.truncate(at);
        cut = true;
    }
    if cut {
        counts.bump(LogEvent::LineTruncated);
    }
    if end == LineEnd::Flushed {
        counts.bump(LogEvent::PartialLineFlushed);
    }
    counts.records += 1;
    let severity = if detect_severity {
        severity::detect(line)
    } else {
        Severity::Unspecified
    };
    out.push(LogRecord {
        timestamp_ns: unix_ns_now(),
        severity: severity as i32,
        source: source.to_owned(),
        message,
        fields: Vec::new(),
        file_id,
        end_offset,
    });
}

/// A new random non-zero `file_id`.
fn new_file_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

/// Where [`service`] puts what it reads: the records, and in the same order where each
/// started.
struct Emitted<'a> {
    out: &'a mut Vec<LogRecord>,
    positions: &'a mut VecDeque<RecordPos>,
}

/// Reads one file within the budget. Returns whether data was left unread because of the
/// budget.
#[allow(clippy::too_many_arguments)]
fn service(
    t: &mut Tracked,
    config: &LogSourceConfig,
    now: Instant,
    budget: &mut Budget,
    buf: &mut [u8],
    emitted: Emitted<'_>,
    counts: &mut LogSourceCounts,
    latch: &mut ErrorLatch,
    stats: &mut PollStats,
) -> bool {
    let max_line = config.max_line_bytes;
    let detect = config.detect_severity;
    let Emitted { out, positions } = emitted;
    let id = t.id;
    let size = match t.file.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            record_error(counts, latch, stats, "stat", t.path.clone(), e);
            return false;
        }
    };
    let mut current_head = [0u8; HEAD_BYTES];
    let head_len = t.head.len().min(HEAD_BYTES);
    let head_now = if head_len > 0 && size >= t.read_offset {
        let want = &mut current_head[..head_len];
        match read_full_at(&t.file, want, 0) {
            Ok(n) => current_head.get(..n),
            Err(e) => {
                record_error(counts, latch, stats, "read", t.path.clone(), e);
                return false;
            }
        }
    } else {
        None
    };
    if truncation_check(size, t.read_offset, &t.head, head_now) == Truncation::Truncated {
        FileTruncated {
            path: &t.path,
            offset: t.read_offset,
            size,
            unread_bytes: t.last_size.saturating_sub(t.read_offset),
            while_down: false,
        }
        .emit(counts);
        if budget.records > 0 {
            let source = t.source.clone();
            let (generation, file_id) = (t.generation, t.file_id);
            if t.splitter.flush(&mut |line, end, start| {
                let at = (file_id, line_end_offset(start, line.len(), end, max_line));
                push_record(out, counts, &source, detect, max_line, line, end, at);
                positions.push_back(RecordPos {
                    id,
                    generation,
                    start,
                });
            }) {
                budget.records -= 1;
            }
        }
        t.splitter.reset();
        t.read_offset = 0;
        t.head.clear();
        t.generation += 1;
        // Other bytes at the same offsets: another file for the collector's deduplication.
        t.file_id = new_file_id();
    }
    let (generation, file_id) = (t.generation, t.file_id);

    let mut more = false;
    t.at_eof = false;
    loop {
        if budget.records == 0 || budget.bytes == 0 {
            more = true;
            break;
        }
        let want = budget.bytes.min(buf.len());
        let chunk = &mut buf[..want];
        let n = match t.file.read_at(chunk, t.read_offset) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                record_error(counts, latch, stats, "read", t.path.clone(), e);
                break;
            }
        };
        if n == 0 {
            t.at_eof = true;
            break;
        }
        let source = &t.source;
        let fed = t
            .splitter
            .feed(&chunk[..n], now, budget.records, &mut |line, end, start| {
                let at = (file_id, line_end_offset(start, line.len(), end, max_line));
                push_record(out, counts, source, detect, max_line, line, end, at);
                positions.push_back(RecordPos {
                    id,
                    generation,
                    start,
                });
            });
        t.read_offset += fed.consumed as u64;
        counts.bytes_read += fed.consumed as u64;
        counts.discarded_bytes += fed.discarded as u64;
        budget.records -= fed.lines.min(budget.records);
        budget.bytes -= fed.consumed.min(budget.bytes);
        if fed.consumed < n {
            more = true;
            break;
        }
    }
    if t.at_eof && budget.records > 0 {
        let source = &t.source;
        if t.splitter
            .flush_if_stale(now, config.partial_line_timeout, &mut |line, end, start| {
                let at = (file_id, line_end_offset(start, line.len(), end, max_line));
                push_record(out, counts, source, detect, max_line, line, end, at);
                positions.push_back(RecordPos {
                    id,
                    generation,
                    start,
                });
            })
        {
            budget.records -= 1;
        }
    }
    // Fingerprint the first bytes once they exist (or extend a short fingerprint).
    let known = size.max(t.read_offset);
    if t.head.len() < HEAD_BYTES && known > t.head.len() as u64 {
        let len = usize::try_from(known).unwrap_or(HEAD_BYTES).min(HEAD_BYTES);
        let mut head = vec![0u8; len];
        if let Ok(n) = read_full_at(&t.file, &mut head, 0) {
            head.truncate(n);
            t.head = head;
        }
    }
    t.last_size = size.max(t.read_offset);
    more
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(
        s: &mut LineSplitter,
        chunk: &[u8],
        max_lines: usize,
    ) -> (Vec<(Vec<u8>, LineEnd)>, Fed) {
        let mut lines = Vec::new();
        let fed = s.feed(chunk, Instant::now(), max_lines, &mut |l, e, _| {
            lines.push((l.to_vec(), e))
        });
        (lines, fed)
    }

    #[test]
    fn splits_lines_and_holds_partial() {
        let mut s = LineSplitter::new(100);
        let (lines, fed) = split(&mut s, b"a\nbb\nccc", 10);
        assert_eq!(
            lines,
            vec![
                (b"a".to_vec(), LineEnd::Newline),
                (b"bb".to_vec(), LineEnd::Newline)
            ]
        );
        assert_eq!(fed.consumed, 8);
        assert_eq!(s.partial_len(), 3);
        let (lines, _) = split(&mut s, b"c\n", 10);
        assert_eq!(lines, vec![(b"cccc".to_vec(), LineEnd::Newline)]);
        assert_eq!(s.partial_len(), 0);
    }

    #[test]
    fn stops_at_max_lines_without_consuming_more() {
        let mut s = LineSplitter::new(100);
        let (lines, fed) = split(&mut s, b"1\n2\n3\n", 2);
        assert_eq!(lines.len(), 2);
        assert_eq!(fed.consumed, 4);
        let (lines, fed) = split(&mut s, b"3\n", 2);
        assert_eq!(lines, vec![(b"3".to_vec(), LineEnd::Newline)]);
        assert_eq!(fed.consumed, 2);
        let (lines, fed) = split(&mut s, b"4\n", 0);
        assert!(lines.is_empty());
        assert_eq!(fed.consumed, 0);
    }

    #[test]
    fn line_of_exactly_max_is_whole_and_longer_is_cut() {
        let mut s = LineSplitter::new(4);
        let (lines, _) = split(&mut s, b"abcd\n", 10);
        assert_eq!(lines, vec![(b"abcd".to_vec(), LineEnd::Newline)]);
        let (lines, fed) = split(&mut s, b"abcdefgh\nnext\n", 10);
        assert_eq!(
            lines,
            vec![
                (b"abcd".to_vec(), LineEnd::Cut),
                (b"next".to_vec(), LineEnd::Newline)
            ]
        );
        assert_eq!(fed.discarded, 4);
        assert!(!s.is_discarding());
    }

    #[test]
    fn cut_spanning_chunks_discards_until_newline() {
        let mut s = LineSplitter::new(4);
        let (lines, _) = split(&mut s, b"ab", 10);
        assert!(lines.is_empty());
        let (lines, _) = split(&mut s, b"cdef", 10);
        assert_eq!(lines, vec![(b"abcd".to_vec(), LineEnd::Cut)]);
        assert!(s.is_discarding());
        let (lines, fed) = split(&mut s, b"xxxxxxxx", 10);
        assert!(lines.is_empty());
        assert_eq!(fed.discarded, 8);
        let (lines, _) = split(&mut s, b"x\nok\n", 10);
        assert_eq!(lines, vec![(b"ok".to_vec(), LineEnd::Newline)]);
    }

    #[test]
    fn cut_backs_off_to_utf8_boundary() {
        // "aé" is 61 C3 A9; a 2-byte limit would split é.
        let mut s = LineSplitter::new(2);
        let (lines, fed) = split(&mut s, "aé\n".as_bytes(), 10);
        assert_eq!(lines, vec![(b"a".to_vec(), LineEnd::Cut)]);
        assert_eq!(fed.discarded, 2);
        assert_eq!(utf8_cut(&[0xE2, 0x82]), 0);
        assert_eq!(utf8_cut(b"abc"), 3);
        assert_eq!(utf8_cut(&[0xFF, b'a']), 2);
    }

    #[test]
    fn lines_come_with_the_offset_of_their_first_byte() {
        let mut starts = Vec::new();
        let mut s = LineSplitter::new(4).at(100);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| starts.push((l.to_vec(), e, start));
        // "ab\n" at 100, "cd" + "e\n" at 103 (split over two feeds), "fghijk\n" cut at 4,
        // its rest discarded, "z" flushed at 114.
        s.feed(b"ab\ncd", Instant::now(), 10, &mut emit);
        s.feed(b"e\nfghijk\nz", Instant::now(), 10, &mut emit);
        assert_eq!(s.position(), 115);
        s.flush(&mut emit);
        assert_eq!(
            starts,
            vec![
                (b"ab".to_vec(), LineEnd::Newline, 100),
                (b"cde".to_vec(), LineEnd::Newline, 103),
                (b"fghi".to_vec(), LineEnd::Cut, 107),
                (b"z".to_vec(), LineEnd::Flushed, 114),
            ]
        );
        // A cut of a line that began in an earlier feed starts where the line began.
        let mut starts = Vec::new();
        let mut s = LineSplitter::new(4);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| starts.push((l.to_vec(), e, start));
        s.feed(b"x\nab", Instant::now(), 10, &mut emit);
        s.feed(b"cdef\n", Instant::now(), 10, &mut emit);
        assert_eq!(starts.last(), Some(&(b"abcd".to_vec(), LineEnd::Cut, 2)));
        s.reset();
        assert_eq!(s.position(), 0);
    }

    #[test]
    fn end_offsets_are_where_reading_resumes() {
        let mut ends = Vec::new();
        let mut s = LineSplitter::new(4).at(100);
        let mut emit = |l: &[u8], e: LineEnd, start: u64| {
            ends.push(line_end_offset(start, l.len(), e, 4));
        };
        // "ab\n" 100..103, "cde\n" 103..107, "fghi" cut (its rest "jk\n" discarded up to
        // 114), "z" flushed 114..115; then "abcé" cut to "abc" at a UTF-8 boundary still
        // ends after the 4 bytes taken (115..119).
        s.feed(b"ab\ncd", Instant::now(), 10, &mut emit);
        s.feed(b"e\nfghijk\nz", Instant::now(), 10, &mut emit);
        s.flush(&mut emit);
        s.feed("abcé".as_bytes(), Instant::now(), 10, &mut emit);
        assert_eq!(ends, vec![103, 107, 111, 115, 119]);
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn partial_flushes_after_timeout_only() {
        let mut s = LineSplitter::new(100);
        let t0 = Instant::now();
        s.feed(b"half", t0, 10, &mut |_, _, _| panic!("no line yet"));
        let mut got = Vec::new();
        assert!(!s.flush_if_stale(
            t0 + Duration::from_millis(999),
            Duration::from_secs(1),
            &mut |l, e, _| got.push((l.to_vec(), e))
        ));
        assert!(s.flush_if_stale(
            t0 + Duration::from_secs(1),
            Duration::from_secs(1),
            &mut |l, e, _| got.push((l.to_vec(), e))
        ));
        assert_eq!(got, vec![(b"half".to_vec(), LineEnd::Flushed)]);
        assert_eq!(s.partial_len(), 0);
    }

    #[test]
    fn truncation_rules() {
        assert_eq!(truncation_check(10, 20, b"", None), Truncation::Truncated);
        assert_eq!(
            truncation_check(20, 20, b"abc", Some(b"abc")),
            Truncation::None
        );
        assert_eq!(
            truncation_check(50, 20, b"abc", Some(b"xyz")),
            Truncation::Truncated
        );
        assert_eq!(truncation_check(50, 20, b"", Some(b"")), Truncation::None);
    }

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino }
    }

    fn view(ino: u64, path: &str, orphaned: bool) -> TrackedView {
        TrackedView {
            id: id(ino),
            path: path.into(),
            orphaned,
        }
    }

    #[test]
    fn create_rotation_orphans_old_and_adds_new_as_replacement() {
        let tracked = [view(1, "/l/app.log", false)];
        let observed = [(PathBuf::from("/l/app.log"), id(2))];
        let checked: HashSet<PathBuf> = ["/l/app.log".into()].into();
        let history: HashMap<PathBuf, FileId> = [("/l/app.log".into(), id(1))].into();
        let changes = reconcile(&tracked, &observed, &checked, &history);
        assert_eq!(
            changes,
            vec![
                Change::Orphaned { id: id(1) },
                Change::New {
                    id: id(2),
                    path: "/l/app.log".into(),
                    replaced: true
                }
            ]
        );
    }

    #[test]
    fn rename_within_glob_is_a_move_not_an_orphan() {
        let tracked = [view(1, "/l/app.log", false)];
        let observed = [
            (PathBuf::from("/l/app.log"), id(2)),
            (PathBuf::from("/l/app.log.1"), id(1)),
        ];
        let checked: HashSet<PathBuf> = ["/l/app.log".into(), "/l/app.log.1".into()].into();
        let history: HashMap<PathBuf, FileId> = [("/l/app.log".into(), id(1))].into();
        let changes = reconcile(&tracked, &observed, &checked, &history);
        assert_eq!(
            changes,
            vec![
                Change::Moved {
                    id: id(1),
                    path: "/l/app.log.1".into()
                },
                Change::New {
                    id: id(2),
                    path: "/l/app.log".into(),
                    replaced: true
                }
            ]
        );
    }

    #[test]
    fn missing_path_orphans_and_unchecked_path_does_not() {
        let tracked = [view(1, "/l/a.log", false), view(2, "/l/b.log", false)];
        let checked: HashSet<PathBuf> = ["/l/a.log".into()].into();
        let changes = reconcile(&tracked, &[], &checked, &HashMap::new());
        assert_eq!(changes, vec![Change::Orphaned { id: id(1) }]);
    }

    #[test]
    fn same_file_under_two_paths_is_one_new_file() {
        let observed = [
            (PathBuf::from("/l/a"), id(7)),
            (PathBuf::from("/l/b"), id(7)),
        ];
        let changes = reconcile(&[], &observed, &HashSet::new(), &HashMap::new());
        assert_eq!(
            changes,
            vec![Change::New {
                id: id(7),
                path: "/l/a".into(),
                replaced: false
            }]
        );
    }

    #[test]
    fn orphan_seen_again_is_moved_back() {
        let tracked = [view(1, "/l/app.log", true)];
        let observed = [(PathBuf::from("/l/app.log.1"), id(1))];
        let changes = reconcile(&tracked, &observed, &HashSet::new(), &HashMap::new());
        assert_eq!(
            changes,
            vec![Change::Moved {
                id: id(1),
                path: "/l/app.log.1".into()
            }]
        );
    }

    #[test]
    fn start_position_rules() {
        let saved = Resume::Saved {
            offset: 100,
            discarding: true,
            copy_of: None,
            file_id: 7,
        };
        assert_eq!(start_position(&saved, 150, true, StartAt::End), (100, true));
        assert_eq!(
            start_position(
                &Resume::Truncated { saved_offset: 100 },
                50,
                false,
                StartAt::End
            ),
            (0, false)
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, true, StartAt::End),
            (150, false),
            "first scan of the first run"
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, true, StartAt::Beginning),
            (0, false)
        );
        assert_eq!(
            start_position(&Resume::Unknown, 150, false, StartAt::End),
            (0, false),
            "appeared later, or while the agent was down: new data"
        );
    }

    /// `n` bytes of a numbered log from line `from` on: "line 000001\n…" (12 bytes a line).
    fn numbered(from: u32, n: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (from..)
            .flat_map(|i| format!("line {i:06}\n").into_bytes())
            .take(n)
            .collect();
        v.truncate(n);
        v
    }

    /// The checkpoint entry of a file holding `content` (as the agent saw it), at `offset`.
    fn entry(ino: u64, path: &str, content: &[u8], offset: u64) -> SavedEntry {
        let head = &content[..content.len().min(HEAD_BYTES)];
        let end = usize::try_from(offset).expect("small offset");
        let before = &content[end.saturating_sub(HEAD_BYTES)..end];
        SavedEntry {
            id: id(ino),
            path: path.into(),
            pos: Saved {
                offset,
                discarding: false,
                head_len: head.len(),
                head_hash: fnv1a64(head),
                before: Some((before.len(), fnv1a64(before))),
                file_id: 1000 + ino,
            },
        }
    }

    /// `match_checkpoint` over files given by (inode, path, whole content).
    fn decide(entries: &[SavedEntry], disk: &[(u64, &str, Vec<u8>)]) -> Vec<Resume> {
        let found: Vec<Found<'_>> = disk
            .iter()
            .map(|(ino, path, content)| Found {
                id: id(*ino),
                path: Path::new(path),
                size: content.len() as u64,
                head: &content[..content.len().min(HEAD_BYTES)],
            })
            .collect();
        match_checkpoint(entries, &found, &mut |i, at, len| {
            let content = &disk.get(i)?.2;
            let start = usize::try_from(at).ok()?;
            content.get(start..start.checked_add(len)?).map(fnv1a64)
        })
    }

    /// Resumed at `offset` with the `file_id` of the entry of inode 1 (every table below
    /// has one entry, of inode 1: a copy inherits its id).
    fn resume_at(offset: u64, copy_of: Option<&str>) -> Resume {
        Resume::Saved {
            offset,
            discarding: false,
            copy_of: copy_of.map(PathBuf::from),
            file_id: 1001,
        }
    }

    #[test]
    fn checkpoint_match_by_inode_and_fingerprint() {
        let old = numbered(1, 360);
        let entries = [entry(1, "/l/app.log", &old, 360)];
        // Same inode, same first bytes, grown: resume.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(1, 420))]),
            vec![resume_at(360, None)]
        );
        // Same inode, other first bytes: truncated (and rewritten) while down.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(36, 60))]),
            vec![Resume::Truncated { saved_offset: 360 }]
        );
        // Same inode and first bytes, but shorter than the offset: truncated too.
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(1, 300))]),
            vec![Resume::Truncated { saved_offset: 360 }]
        );
        // Another inode, not in the checkpoint: unknown.
        assert_eq!(
            decide(&entries, &[(2, "/l/b.log", numbered(36, 60))]),
            vec![Resume::Unknown]
        );
    }

    #[test]
    fn copytruncate_while_down_resumes_the_copy_and_rereads_the_original() {
        // Checkpoint: app.log (inode 1) at 360. While down: 60 more bytes; cp app.log
        // app.log.1 (inode 2, 420 bytes); : > app.log; 60 new bytes.
        let entries = [entry(1, "/l/app.log", &numbered(1, 360), 360)];
        let disk = [
            (1, "/l/app.log", numbered(36, 60)),
            (2, "/l/app.log.1", numbered(1, 420)),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![
                Resume::Truncated { saved_offset: 360 },
                resume_at(360, Some("/l/app.log"))
            ]
        );
        // A copy shorter than the saved offset is not that file's copy.
        let disk = [(2, "/l/app.log.1", numbered(1, 300))];
        assert_eq!(decide(&entries, &disk), vec![Resume::Unknown]);
    }

    #[test]
    fn same_first_bytes_but_other_bytes_before_the_offset_is_not_a_copy() {
        // Files that open with the same 300-byte banner: app.log rotated away while down (the
        // glob does not match the rotated name) and a new app.log with the same banner.
        let banner = vec![b'#'; 300];
        let old: Vec<u8> = [banner.clone(), numbered(1, 120)].concat();
        let new: Vec<u8> = [banner, numbered(500, 240)].concat();
        let entries = [entry(1, "/l/app.log", &old, 420)];
        assert_eq!(
            decide(&entries, &[(2, "/l/app.log", new)]),
            vec![Resume::Unknown]
        );
        // Without the bytes before the offset (older state file), no recognition by content.
        let mut entries = entries;
        entries[0].pos.before = None;
        assert_eq!(
            decide(&entries, &[(2, "/l/app.log.1", old)]),
            vec![Resume::Unknown]
        );
    }

    #[test]
    fn an_entry_claimed_by_its_inode_is_not_claimed_by_a_copy_too() {
        // cp app.log app.log.1 while down, no truncation: both hold the same bytes.
        let content = numbered(1, 360);
        let entries = [entry(1, "/l/app.log", &content, 360)];
        let disk = [
            (2, "/l/app.log.1", content.clone()),
            (1, "/l/app.log", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(360, None)]
        );
    }

    #[test]
    fn several_copies_prefer_the_saved_path_then_path_order() {
        let content = numbered(1, 300);
        let entries = [entry(1, "/l/app.log", &content, 300)];
        // The original is gone; a same-content file was moved onto its path (new inode).
        let disk = [
            (3, "/l/app.log.1", content.clone()),
            (2, "/l/app.log", content.clone()),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(300, Some("/l/app.log"))]
        );
        let disk = [
            (3, "/l/app.log.2", content.clone()),
            (2, "/l/app.log.1", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Unknown, resume_at(300, Some("/l/app.log"))]
        );
    }

    #[test]
    fn short_and_missing_fingerprints_match_on_inode_only() {
        // A file of 60 bytes when checkpointed: its copy is not recognised (read again, at
        // most HEAD_BYTES - 1 bytes repeated) rather than risk skipping another file.
        let short = numbered(1, 60);
        let entries = [entry(1, "/l/app.log", &short, 60)];
        let disk = [(1, "/l/app.log", Vec::new()), (2, "/l/app.log.1", short)];
        assert_eq!(
            decide(&entries, &disk),
            vec![Resume::Truncated { saved_offset: 60 }, Resume::Unknown]
        );
        // No fingerprint at all (older state file): the inode is trusted.
        let mut entries = [entry(1, "/l/app.log", &[], 0)];
        entries[0].pos.offset = 4;
        entries[0].pos.before = None;
        assert_eq!(
            decide(&entries, &[(1, "/l/app.log", numbered(9, 24))]),
            vec![resume_at(4, None)]
        );
        // A 64-byte fingerprint of an older version: checked on its inode, never across.
        let content = numbered(1, 320);
        let mut entries = [entry(1, "/l/app.log", &content[..64], 64)];
        entries[0].pos.offset = 300;
        entries[0].pos.before = None;
        let disk = [
            (1, "/l/app.log", content.clone()),
            (2, "/l/app.log.1", content),
        ];
        assert_eq!(
            decide(&entries, &disk),
            vec![resume_at(300, None), Resume::Unknown]
        );
    }

    #[test]
    fn fingerprint_longer_than_head_bytes_never_matches() {
        let s = Saved {
            offset: 0,
            discarding: false,
            head_len: HEAD_BYTES + 1,
            head_hash: 0,
            before: Some((0, fnv1a64(&[]))),
            file_id: 0,
        };
        assert!(!s.fingerprint_matches(&[0; HEAD_BYTES]));
        assert!(!s.names_content());
    }

    #[test]
    fn state_entries_without_fingerprint_load() {
        let state: StateFile = serde_json::from_str(
            r#"{"version":1,"files":[{"path":"/l/a","dev":1,"ino":2,"offset":3}]}"#,
        )
        .expect("older state file");
        let e = state.files.first().expect("one entry");
        assert_eq!(
            (e.offset, e.head_len, e.head_hash, e.discarding, e.file_id),
            (3, 0, 0, false, 0)
        );
    }

    #[test]
    fn error_latch_reports_a_failing_path_once_until_it_recovers() {
        let mut latch = ErrorLatch::default();
        let a = Path::new("/l/a.log");
        assert!(latch.note(a, "read"));
        assert!(!latch.note(a, "read"), "same failure, same epoch");
        assert!(
            latch.note(a, "open"),
            "another operation is another failure"
        );
        assert!(latch.note(Path::new("/l/b.log"), "read"));
        // Still failing at every epoch: never reported again.
        for _ in 0..5 {
            latch.next_epoch();
            assert!(!latch.note(a, "read"));
        }
        // Not seen failing for a whole epoch: forgotten, reported again when it comes back.
        latch.next_epoch();
        latch.next_epoch();
        assert!(latch.note(a, "read"));
        assert_eq!(latch.failing.len(), 1, "old failures are dropped");
    }

    #[test]
    fn record_message_never_exceeds_limit_after_lossy_conversion() {
        let mut out = Vec::new();
        let mut counts = LogSourceCounts::default();
        push_record(
            &mut out,
            &mut counts,
            "s",
            true,
            4,
            &[0xFF, 0xFF, 0xFF, 0xFF],
            LineEnd::Newline,
            (9, 5),
        );
        assert!(out[0].message.len() <= 4);
        assert_eq!((out[0].file_id, out[0].end_offset), (9, 5));
        assert_eq!(out[0].message, "\u{FFFD}");
        assert_eq!(counts.get(LogEvent::InvalidUtf8), 1);
        assert_eq!(counts.get(LogEvent::LineTruncated), 1);
        assert_eq!(counts.records, 1);
    }

    #[test]
    fn event_names_are_distinct() {
        let names: HashSet<&str> = LogEvent::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(names.len(), LogEvent::ALL.len());
    }
}
