//! Log file source: follows files matched by glob patterns and turns their lines into
//! [`LogRecord`]s (DESIGN.md §7).
//!
//! # Layout
//!
//! The rules live in sans-IO modules that take observations and return decisions, unit-tested
//! without files; one module does the IO:
//!
//! - `lines`: bytes → lines ([`LineSplitter`]: the long-line cut, the discard of the
//!   remainder, the partial-last-line timeout, each line's offsets) and a line → a
//!   [`LogRecord`] (lossy UTF-8, the message bound, severity, the read time it is given).
//! - `rotation`: file identity ([`FileId`]) and the rules that say what happened to a file:
//!   [`truncation_check`] (copytruncate/truncation from `(size, offset, head bytes)`),
//!   `reconcile` (rotation from `(path, dev, inode)` observations: which tracked files moved,
//!   which were rotated away or removed (orphaned), which files are new and whether a new file
//!   replaced another at the same path), `match_checkpoint` (which checkpoint entry each file
//!   found at start resumes, by `(dev, inode)` and by the fingerprint of its first
//!   [`HEAD_BYTES`] bytes, and which checkpointed files were truncated while the agent was
//!   down) and `start_position` (where to start reading a newly seen file).
//! - `checkpoint` (private): the state file's format, its load and its atomic save, and the
//!   rule for where a restart resumes given the records not settled yet.
//! - `parse`: multi-line records, JSON fields and the line's own time, per source
//!   ([`parse::LogParseSection`], all off by default); `emit` (private) puts each line through
//!   them into a record.
//! - `tailer` (private): [`LogTailer`], the thin IO layer: it evaluates globs, stats paths,
//!   keeps one open handle per followed file (so a renamed or deleted file can still be read to
//!   its end), reads with positional reads, feeds the rules above what it observed and acts on
//!   their decisions, and writes the checkpoint file.
//! - this module: the configuration, counters, events and errors they share, and
//!   `ErrorLatch` (private): which failing paths were already reported, so a failure is logged
//!   when it starts, not at every retry.
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
//! Each record carries the time its line was read (`timestamp_ns`: the wall clock passed to
//! [`LogTailer::poll`] is read for every line, so the lines of one poll, and of one frame, keep
//! their own times and order) and the severity the line states ([`super::severity::detect`]:
//! syslog `<PRI>`, a JSON `level`, `level=`, a level word near the start; `unspecified`
//! otherwise, or always when [`LogSourceConfig::detect_severity`] is off).
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
//! On an RC lane (DESIGN.md §8b) a line settles only once the RC QP acknowledged its frame;
//! when the lane fails, the lines returned and not settled are returned again by the next
//! polls after [`LogTailer::rewind`] (the positions are then kept without a state file too,
//! [`LogSourceConfig::keep_positions`]).
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
//! **Short files.** A fingerprint names a file's content on its own only when it covers
//! [`HEAD_BYTES`] bytes. The entry of a file shorter than that when it was checkpointed (every
//! byte read is then in both fingerprints) is recognised in a copy only when its own inode is
//! found truncated (step 2: the copytruncate signature), by a file whose first bytes are every
//! byte read from it: `cp app.log app.log.1; : > app.log` of a 20-line file while the agent was
//! down resumes the copy at the saved offset instead of sending the 20 lines again. When its
//! inode is gone instead (rotated out of the glob, removed), a file that merely starts with
//! the same few bytes is read from its beginning (at most `HEAD_BYTES − 1` bytes repeated)
//! rather than risk skipping a different file. Unlike Vector, short files are read at once, not
//! ignored until they grow. Entries of older versions (a 64-byte head, no `before_*`) and of
//! files closed before the checkpoint (no `before_*`) are identified by `(dev, inode)` only.
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(doc)]
use uctel_protocol::payload::LogRecord;

mod checkpoint;
mod emit;
mod lines;
pub mod parse;
mod rotation;
mod tailer;

pub use lines::{line_end_offset, Fed, LineEnd, LineSplitter};
pub use rotation::{truncation_check, FileId, Truncation};
pub use tailer::LogTailer;

/// How many leading bytes of a file are kept as its fingerprint: truncation detection while
/// running, checkpoint validation at start, and recognising a copy of a checkpointed file
/// under another inode (for a file shorter than this only when its own inode was found
/// truncated; module documentation, "Short files") (the size Vector's checksum
/// fingerprinter used by default). The checkpoint stores the FNV-1a 64 hash of the
/// first `min(size, HEAD_BYTES)` bytes and their count.
pub const HEAD_BYTES: usize = 256;

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
    /// Each record's severity is read from its line ([`super::severity::detect`]); otherwise every
    /// record is `unspecified`.
    pub detect_severity: bool,
    /// Keep the positions of the records not settled yet even without a state file, so
    /// [`LogTailer::rewind`] can read them again (logs on an RC lane, DESIGN.md §8b). With
    /// a state file they are always kept.
    pub keep_positions: bool,
    /// How lines are parsed: multi-line records, JSON fields, the line's own time
    /// ([`parse`]); all off by default.
    pub parse: parse::LogParseSection,
}

impl LogSourceConfig {
    /// Defaults: start at end, 2048-byte lines, 1 s partial-line timeout, 5 s rotate wait,
    /// 1 s glob interval, 1 MiB per poll, no state file, severity detected, positions kept only
    /// with a state file.
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
            keep_positions: false,
            parse: parse::LogParseSection::default(),
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
    /// A key of a JSON line was not put into the record's fields: the record already had
    /// `parse.json_max_fields` (one per key not kept; the message still holds the line).
    JsonFieldDropped,
    /// A multi-line record was longer than `max_line_bytes`: cut there (once per record; the
    /// bytes not kept are in [`LogSourceCounts::discarded_bytes`]).
    RecordCut,
}

impl LogEvent {
    /// Every reason, in declaration order.
    pub const ALL: [LogEvent; 8] = [
        LogEvent::LineTruncated,
        LogEvent::InvalidUtf8,
        LogEvent::PartialLineFlushed,
        LogEvent::FileTruncated,
        LogEvent::RotationCreate,
        LogEvent::ReadError,
        LogEvent::JsonFieldDropped,
        LogEvent::RecordCut,
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
            LogEvent::JsonFieldDropped => "json_field_dropped",
            LogEvent::RecordCut => "record_cut",
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
        self.add(event, 1);
    }

    fn add(&mut self, event: LogEvent, n: u64) {
        if let Some(c) = self.events.get_mut(event as usize) {
            *c += n;
        }
    }
}

/// A failure on one file or pattern; counted as [`LogEvent::ReadError`] and retried.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct LogFileError {
    /// `glob`, `stat`, `open` or `read`.
    pub op: &'static str,
    /// The file, or the path a glob pattern failed at.
    pub path: PathBuf,
    /// What the OS said.
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
        /// The pattern as configured (`include` or `exclude`).
        pattern: String,
        /// Where and why it does not parse.
        #[source]
        source: glob::PatternError,
    },
    /// A limit is zero.
    #[error("{field} must be at least 1")]
    ZeroLimit {
        /// The [`LogSourceConfig`] field: `max_line_bytes` or `max_bytes_per_poll`.
        field: &'static str,
    },
    /// A `parse` setting is invalid ([`parse::Parser::new`]).
    #[error("parse.{0}")]
    Parse(String),
    /// The state file exists but cannot be read or parsed.
    #[error("cannot load state file {path}: {reason}")]
    State {
        /// [`LogSourceConfig::state_file`].
        path: PathBuf,
        /// The read error, the JSON error (with its line and column), or a version other than
        /// the one this agent writes.
        reason: String,
    },
}

/// [`LogTailer::checkpoint`] failed; the previous state file is left in place.
#[derive(Debug, thiserror::Error)]
#[error("cannot write state file {path}: {source}")]
pub struct CheckpointError {
    /// [`LogSourceConfig::state_file`].
    pub path: PathBuf,
    /// What the OS said when the temporary file was created, written, synced or renamed.
    #[source]
    pub source: std::io::Error,
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

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
    fn event_names_are_distinct() {
        let names: HashSet<&str> = LogEvent::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(names.len(), LogEvent::ALL.len());
    }
}
