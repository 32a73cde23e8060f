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
//! - `start_position` (private): where to start reading a newly seen file (checkpoint, `start_at`,
//!   rotation successor).
//! - [`truncation_check`]: copytruncate/truncation detection from `(size, offset, head bytes)`.
//!
//! [`LogTailer`] is the thin IO layer: it evaluates globs, stats paths, keeps one open handle
//! per followed file (so a renamed or deleted file can still be read to its end), reads with
//! positional reads, and writes the checkpoint file.
//!
//! # Rotation and truncation
//!
//! Files are identified by `(dev, inode)`, never by path:
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
//!   [`LogEvent::FileTruncated`]. The two cases cannot be told apart from `(dev, inode, size)`
//!   observations, so they share one reason. Bytes known to exist but not yet read when the
//!   truncation was seen are counted in [`LogSourceCounts::truncated_unread_bytes`] (a lower
//!   bound of the loss).
//!
//!   **copytruncate race:** lines written after our last read and before the truncation exist only
//!   in the copy; lines written between logrotate's copy and its truncate exist nowhere. No tailer
//!   of the original path can deliver them. Use create-rotation where the writer can reopen its
//!   file. With copytruncate the glob must not match the copies (they are new inodes with old
//!   content, and would be read again from their beginning).
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
//! # Checkpoint and delivery guarantee
//!
//! Every record returned by [`LogTailer::poll`] carries, inside the tailer, the position of
//! its line: file `(dev, inode)`, the file's generation (bumped at each truncation) and the
//! offset of the line's first byte. The caller reports, oldest first, the records that are
//! *settled* — handed on for good — with [`LogTailer::settle`];
//! [`LogTailer::checkpoint_settled`] then writes, for every followed file, `(path, dev, inode,
//! offset)` plus a fingerprint of its first bytes to [`LogSourceConfig::state_file`] (JSON,
//! written to a temporary file, fsynced and renamed over the old one). The offset is the
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
//! On start, a file whose `(dev, inode)` is in the state file and whose first bytes still match
//! resumes at the saved offset (at 0 if it is now shorter: truncated while the agent was down).
//! A file at a path the state file knows under another inode was rotated in while the agent was
//! down and is read from its beginning. Other files start at [`LogSourceConfig::start_at`]; files
//! that appear later are always read from their beginning. Lines still unread in a rotated file
//! that no glob matches when the agent starts are lost (the glob can include rotated names to
//! avoid that).
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

/// How many leading bytes of a file are kept as its fingerprint (truncation detection and
/// checkpoint validation).
pub const HEAD_BYTES: usize = 64;

/// Largest positional read issued at once.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// At most this many errors are returned by one poll (all are counted).
const MAX_ERRORS_PER_POLL: usize = 16;

/// Version of the state file format.
const STATE_VERSION: u32 = 1;

/// Where to start reading a file found at the first scan that has no checkpoint entry.
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
    /// Start position for files present at the first scan without a checkpoint entry.
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
}

impl LogSourceConfig {
    /// Defaults: start at end, 2048-byte lines, 1 s partial-line timeout, 5 s rotate wait,
    /// 1 s glob interval, 1 MiB per poll, no state file.
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
    head_len: usize,
    head_hash: u64,
}

/// Where to start reading a newly tracked file (sans-IO). `saved` is its checkpoint entry when
/// `(dev, inode)` matched and the head fingerprint still matches. Returns (offset, discarding,
/// whether a truncation while the agent was down was detected).
fn start_position(
    saved: Option<Saved>,
    size: u64,
    initial_scan: bool,
    replaced: bool,
    start_at: StartAt,
) -> (u64, bool, bool) {
    match saved {
        Some(s) if s.offset <= size => (s.offset, s.discarding, false),
        Some(_) => (0, false, true),
        None if initial_scan && !replaced && start_at == StartAt::End => (size, false, false),
        None => (0, false, false),
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

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateEntry {
    path: String,
    dev: u64,
    ino: u64,
    offset: u64,
    #[serde(default)]
    discarding: bool,
    head_len: usize,
    head_hash: u64,
}

fn load_state(path: &Path) -> Result<Vec<StateEntry>, LogSourceError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
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
    Ok(state.files)
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
}

/// Follows log files; see the module documentation.
#[derive(Debug)]
pub struct LogTailer {
    config: LogSourceConfig,
    exclude: Vec<glob::Pattern>,
    files: Vec<Tracked>,
    saved: HashMap<FileId, Saved>,
    history: HashMap<PathBuf, FileId>,
    last_full_scan: Option<Instant>,
    initial_scan_done: bool,
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
    /// Validates the patterns and limits and loads the state file (a missing state file is an
    /// empty one). No file is opened before the first [`LogTailer::poll`].
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
        let mut saved = HashMap::new();
        let mut history = HashMap::new();
        if let Some(state_path) = &config.state_file {
            for e in load_state(state_path)? {
                let id = FileId {
                    dev: e.dev,
                    ino: e.ino,
                };
                saved.insert(
                    id,
                    Saved {
                        offset: e.offset,
                        discarding: e.discarding,
                        head_len: e.head_len.min(HEAD_BYTES),
                        head_hash: e.head_hash,
                    },
                );
                history.insert(PathBuf::from(e.path), id);
            }
        }
        Ok(Self {
            config,
            exclude,
            files: Vec::new(),
            saved,
            history,
            last_full_scan: None,
            initial_scan_done: false,
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
    /// errors are counted, returned in [`PollStats::errors`], and retried next time.
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

        let timestamp_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
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
                    timestamp_ns,
                    &mut budget,
                    &mut buf,
                    Emitted {
                        out,
                        positions: &mut self.unsettled,
                    },
                    &mut self.counts,
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
            self.close_orphans(now, timestamp_ns, out, &mut budget);
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
                StateEntry {
                    path: t.source.clone(),
                    dev: t.id.dev,
                    ino: t.id.ino,
                    offset,
                    discarding,
                    head_len: t.head.len(),
                    head_hash: fnv1a64(&t.head),
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
                    record_error(&mut self.counts, stats, "stat", path, e);
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
        // Files resuming from a checkpoint were written before files that are new to us (a
        // rotated file before its successor), so they are read first.
        new_files.sort_by_key(|(id, path, _)| (!self.saved.contains_key(id), path.clone()));
        for (id, path, replaced) in new_files {
            self.open_new(id, path, replaced, initial, stats);
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
            // Checkpoint entries of files that are gone will never match again.
            let live: HashSet<FileId> = self.files.iter().map(|t| t.id).collect();
            self.saved.retain(|id, _| live.contains(id));
            self.initial_scan_done = true;
        }
        // Orphans first (older data), then discovery order.
        self.files.sort_by_key(|t| (t.orphaned_at.is_none(), t.seq));
    }

    fn open_new(
        &mut self,
        observed_id: FileId,
        path: PathBuf,
        replaced: bool,
        initial: bool,
        stats: &mut PollStats,
    ) {
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() != ErrorKind::NotFound {
                    record_error(&mut self.counts, stats, "open", path, e);
                }
                return;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                record_error(&mut self.counts, stats, "stat", path, e);
                return;
            }
        };
        // The path may have been rotated between stat and open: trust the handle.
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if id != observed_id && self.files.iter().any(|t| t.id == id) {
            return;
        }
        let size = meta.len();
        let saved = self.saved.remove(&id).filter(|s| {
            let mut head = vec![0u8; s.head_len];
            s.head_len == 0
                || (read_full_at(&file, &mut head, 0).is_ok_and(|n| n == s.head_len)
                    && fnv1a64(&head) == s.head_hash)
        });
        let (offset, discarding, truncated_while_down) =
            start_position(saved, size, initial, replaced, self.config.start_at);
        if truncated_while_down {
            self.counts.bump(LogEvent::FileTruncated);
        }
        if replaced {
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
            id,
            source: path.to_string_lossy().into_owned(),
            path,
            file,
            read_offset: offset,
            last_size: size,
            head: Vec::new(),
            splitter,
            orphaned_at: None,
            at_eof: false,
            seq,
            generation: 0,
        });
    }

    fn close_orphans(
        &mut self,
        now: Instant,
        timestamp_ns: u64,
        out: &mut Vec<LogRecord>,
        budget: &mut Budget,
    ) {
        let rotate_wait = self.config.rotate_wait;
        let max_line = self.config.max_line_bytes;
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
                let (id, generation) = (t.id, t.generation);
                let source = t.source.clone();
                t.splitter.flush(&mut |line, end, start| {
                    push_record(out, counts, &source, timestamp_ns, max_line, line, end);
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

fn record_error(
    counts: &mut LogSourceCounts,
    stats: &mut PollStats,
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
) {
    counts.bump(LogEvent::ReadError);
    if stats.errors.len() < MAX_ERRORS_PER_POLL {
        stats.errors.push(LogFileError { op, path, source });
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

/// Builds one record from a line: lossy UTF-8, message bounded by `max_line` bytes.
fn push_record(
    out: &mut Vec<LogRecord>,
    counts: &mut LogSourceCounts,
    source: &str,
    timestamp_ns: u64,
    max_line: usize,
    line: &[u8],
    end: LineEnd,
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
    out.push(LogRecord {
        timestamp_ns,
        severity: Severity::Unspecified as i32,
        source: source.to_owned(),
        message,
        fields: Vec::new(),
    });
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
    timestamp_ns: u64,
    budget: &mut Budget,
    buf: &mut [u8],
    emitted: Emitted<'_>,
    counts: &mut LogSourceCounts,
    stats: &mut PollStats,
) -> bool {
    let max_line = config.max_line_bytes;
    let Emitted { out, positions } = emitted;
    let id = t.id;
    let size = match t.file.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            record_error(counts, stats, "stat", t.path.clone(), e);
            return false;
        }
    };
    let mut current_head = [0u8; HEAD_BYTES];
    let head_now = if !t.head.is_empty() && size >= t.read_offset {
        let want = &mut current_head[..t.head.len()];
        match read_full_at(&t.file, want, 0) {
            Ok(n) => Some(&current_head[..n]),
            Err(e) => {
                record_error(counts, stats, "read", t.path.clone(), e);
                return false;
            }
        }
    } else {
        None
    };
    if truncation_check(size, t.read_offset, &t.head, head_now) == Truncation::Truncated {
        counts.bump(LogEvent::FileTruncated);
        counts.truncated_unread_bytes += t.last_size.saturating_sub(t.read_offset);
        if budget.records > 0 {
            let source = t.source.clone();
            let generation = t.generation;
            if t.splitter.flush(&mut |line, end, start| {
                push_record(out, counts, &source, timestamp_ns, max_line, line, end);
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
    }
    let generation = t.generation;

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
                record_error(counts, stats, "read", t.path.clone(), e);
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
                push_record(out, counts, source, timestamp_ns, max_line, line, end);
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
                push_record(out, counts, source, timestamp_ns, max_line, line, end);
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
    if t.head.len() < HEAD_BYTES && t.read_offset > t.head.len() as u64 {
        let len = usize::try_from(t.read_offset)
            .unwrap_or(HEAD_BYTES)
            .min(HEAD_BYTES);
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
        let saved = Saved {
            offset: 100,
            discarding: true,
            head_len: 10,
            head_hash: 0,
        };
        assert_eq!(
            start_position(Some(saved), 150, true, false, StartAt::End),
            (100, true, false)
        );
        assert_eq!(
            start_position(Some(saved), 50, true, false, StartAt::End),
            (0, false, true)
        );
        assert_eq!(
            start_position(None, 150, true, false, StartAt::End),
            (150, false, false)
        );
        assert_eq!(
            start_position(None, 150, true, false, StartAt::Beginning),
            (0, false, false)
        );
        assert_eq!(
            start_position(None, 150, true, true, StartAt::End),
            (0, false, false),
            "rotation successor"
        );
        assert_eq!(
            start_position(None, 150, false, false, StartAt::End),
            (0, false, false),
            "appeared later"
        );
    }

    #[test]
    fn record_message_never_exceeds_limit_after_lossy_conversion() {
        let mut out = Vec::new();
        let mut counts = LogSourceCounts::default();
        push_record(
            &mut out,
            &mut counts,
            "s",
            0,
            4,
            &[0xFF, 0xFF, 0xFF, 0xFF],
            LineEnd::Newline,
        );
        assert!(out[0].message.len() <= 4);
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
