//! [`LogTailer`], the IO layer of the log source: glob evaluation, stat(2), one open handle
//! per followed file, positional reads, fingerprint reads and the checkpoint's content. What it
//! observes goes through the rules of `rotation`, `lines` and `checkpoint`; what they decide,
//! it does (and counts, and logs). Times come from the caller: `now` for the timers, a wall
//! clock read once per line for the records' `timestamp_ns`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use uctel_protocol::payload::LogRecord;

use super::checkpoint::{self, Loaded, RecordPos, ResumePoints, StateEntry};
use super::emit::{Emitted, LineOrigin};
use super::lines::LineSplitter;
use super::parse::{Joiner, Parser};
use super::rotation::{
    fnv1a64, match_checkpoint, reconcile, start_position, truncation_check, Change, FileId, Found,
    Resume, SavedEntry, TrackedView, Truncation,
};
use super::{
    CheckpointError, ErrorLatch, LogEvent, LogFileError, LogSourceConfig, LogSourceCounts,
    LogSourceError, PollStats, HEAD_BYTES,
};

/// Largest positional read issued at once.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// At most this many errors are returned by one poll (all are counted).
const MAX_ERRORS_PER_POLL: usize = 16;

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
    /// Joins lines into multi-line records (passes each line on when `parse.multiline` is off).
    joiner: Joiner,
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
    /// End of the last emitted (or discarded) byte, or the start of the multi-line record
    /// being joined, and whether the splitter is discarding there: where a restart resumes.
    fn committed(&self) -> (u64, bool) {
        match self.joiner.pending_start() {
            Some(start) => (start, false),
            None => (
                self.read_offset
                    .saturating_sub(self.splitter.partial_len() as u64),
                self.splitter.is_discarding(),
            ),
        }
    }
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
    /// `config.parse`, compiled.
    parser: Parser,
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
        let parser = Parser::new(&config.parse).map_err(LogSourceError::Parse)?;
        let state = match &config.state_file {
            Some(state_path) => checkpoint::load(state_path)?,
            None => None,
        };
        let first_run = state.is_none();
        let Loaded { saved, history } = state.unwrap_or_default();
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
            parser,
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
            .map(|t| (t.path.clone(), t.committed().0))
            .collect()
    }

    /// The files followed now as the status API shows them (`crate::status`).
    pub fn file_views(&self) -> Vec<crate::status::FileView> {
        self.files
            .iter()
            .map(|t| crate::status::FileView {
                path: t.path.display().to_string(),
                dev: t.id.dev,
                inode: t.id.ino,
                fingerprint: format!("{:016x}", t.file_id),
                offset_bytes: t.committed().0,
                size_bytes: t.last_size.max(t.read_offset),
                rotated: t.orphaned_at.is_some(),
            })
            .collect()
    }

    /// The first include pattern: names the source on the status API.
    pub fn source_name(&self) -> &str {
        self.config.include.first().map_or("", String::as_str)
    }

    /// Finds new, rotated and truncated files and reads new lines into `out`: at most
    /// `max_records` records and [`LogSourceConfig::max_bytes_per_poll`] bytes. `now` drives the
    /// glob interval, partial-line timeout and rotate wait. Never fails as a whole: per-file
    /// errors are counted, returned in [`PollStats::errors`], logged when a path starts failing,
    /// and retried next time. The first poll of a first run writes the state file (the start
    /// positions; a failure is logged).
    ///
    /// `wall` is the wall clock, read once for each record to stamp it with the time its line
    /// was read (`timestamp_ns`); the agent passes `SystemTime::now`, a test may pass a fixed
    /// or stepping clock. No other clock is read.
    pub fn poll(
        &mut self,
        now: Instant,
        mut wall: impl FnMut() -> SystemTime,
        out: &mut Vec<LogRecord>,
        max_records: usize,
    ) -> PollStats {
        let wall: &mut dyn FnMut() -> SystemTime = &mut wall;
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
                    (&self.config, &self.parser),
                    now,
                    &mut budget,
                    &mut buf,
                    Emitted {
                        out,
                        positions: &mut self.unsettled,
                        wall: &mut *wall,
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
            self.close_orphans(now, wall, out, &mut budget);
        }
        if self.config.state_file.is_none() && !self.config.keep_positions {
            // Nothing to checkpoint nor rewind: no positions to keep.
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

    /// Reads again every record returned by [`LogTailer::poll`] and not settled yet: each
    /// file goes back to where its first unsettled line starts (the place a restart would
    /// resume at, [`LogTailer::checkpoint_settled`]), with any partial line forgotten, so the
    /// next polls return those lines again, in order, with the same `file_id` and offsets
    /// (the collector's replay rule drops a line it already delivered). For a sender whose
    /// records settle only once the peer acknowledged them (an RC lane, DESIGN.md §8b) and
    /// whose connection failed.
    ///
    /// Returns the unsettled records that cannot be read again: their file was closed after
    /// a rotation, or truncated since (the caller counts them as dropped). Needs the
    /// positions: with neither a state file nor [`LogSourceConfig::keep_positions`] nothing
    /// is rewound and 0 is returned.
    pub fn rewind(&mut self) -> u64 {
        let points = ResumePoints::new(&self.unsettled);
        let gone = self
            .unsettled
            .iter()
            .filter(|p| {
                !self
                    .files
                    .iter()
                    .any(|t| t.id == p.id && t.generation == p.generation)
            })
            .count() as u64;
        let max_line = self.config.max_line_bytes;
        for t in &mut self.files {
            if let Some(offset) = points.offset(t.id, t.generation) {
                t.read_offset = offset;
                t.splitter = LineSplitter::new(max_line).at(offset);
                t.joiner.reset();
                t.at_eof = false;
            }
        }
        self.unsettled.clear();
        self.retired.clear();
        gone
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
        // Resume where the first unsettled line started (or at 0, see ResumePoints).
        let points = ResumePoints::new(&self.unsettled);
        let resume = |id: FileId, generation: u64| points.offset(id, generation);
        let mut files: Vec<StateEntry> = self
            .files
            .iter()
            .map(|t| {
                let (offset, discarding) = match resume(t.id, t.generation) {
                    Some(start) => (start, false),
                    None => t.committed(),
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
        checkpoint::save(path, files)
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
            joiner: self.parser.joiner(self.config.max_line_bytes),
            orphaned_at: None,
            at_eof: false,
            seq,
            generation: 0,
            file_id,
        });
    }

    fn close_orphans(
        &mut self,
        now: Instant,
        wall: &mut dyn FnMut() -> SystemTime,
        out: &mut Vec<LogRecord>,
        budget: &mut Budget,
    ) {
        let rotate_wait = self.config.rotate_wait;
        let max_line = self.config.max_line_bytes;
        let detect = self.config.detect_severity;
        let parser = &self.parser;
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
            if t.splitter.partial_len() > 0 || t.joiner.pending_start().is_some() {
                if budget.records == 0 {
                    return true;
                }
                let from = LineOrigin {
                    source: &t.source,
                    id: t.id,
                    generation: t.generation,
                    file_id: t.file_id,
                    detect,
                    max_line,
                    parser,
                };
                let before = out.len();
                let mut emitted = Emitted {
                    out: &mut *out,
                    positions: &mut *unsettled,
                    wall: &mut *wall,
                };
                let joiner = &mut t.joiner;
                t.splitter.flush(&mut |line, end, start| {
                    emitted.keep(counts, &from, joiner, (line, end, start), now);
                });
                emitted.flush(counts, &from, joiner);
                // Up to two records (the joined one and the last line): at most one past the
                // budget, which the queue counts if it has no room.
                budget.records = budget.records.saturating_sub(emitted.out.len() - before);
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

/// A new random non-zero `file_id`.
fn new_file_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

/// Reads one file within the budget. Returns whether data was left unread because of the
/// budget.
#[allow(clippy::too_many_arguments)]
fn service(
    t: &mut Tracked,
    (config, parser): (&LogSourceConfig, &Parser),
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
    let mut emitted = emitted;
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
        let from = LineOrigin {
            source: &t.source,
            id,
            generation: t.generation,
            file_id: t.file_id,
            detect,
            max_line,
            parser,
        };
        let before = emitted.out.len();
        let joiner = &mut t.joiner;
        if budget.records > 0 {
            t.splitter.flush(&mut |line, end, start| {
                emitted.keep(counts, &from, joiner, (line, end, start), now);
            });
        }
        // The record being joined holds lines of bytes that are gone: handed on whatever the
        // budget, so no line of the new content joins it.
        emitted.flush(counts, &from, joiner);
        budget.records = budget.records.saturating_sub(emitted.out.len() - before);
        t.splitter.reset();
        t.read_offset = 0;
        t.head.clear();
        t.generation += 1;
        // Other bytes at the same offsets: another file for the collector's deduplication.
        t.file_id = new_file_id();
    }
    let from = LineOrigin {
        source: &t.source,
        id,
        generation: t.generation,
        file_id: t.file_id,
        detect,
        max_line,
        parser,
    };

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
        let fed = t
            .splitter
            .feed(&chunk[..n], now, budget.records, &mut |line, end, start| {
                emitted.keep(counts, &from, &mut t.joiner, (line, end, start), now);
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
        let before = emitted.out.len();
        let joiner = &mut t.joiner;
        let flushed =
            t.splitter
                .flush_if_stale(now, config.partial_line_timeout, &mut |line, end, start| {
                    emitted.keep(counts, &from, joiner, (line, end, start), now);
                });
        // A partial line still waiting for its end may belong to the record being joined.
        if (flushed || t.splitter.partial_len() == 0) && budget.records > emitted.out.len() - before
        {
            emitted.flush_stale(counts, &from, joiner, now);
        }
        budget.records = budget.records.saturating_sub(emitted.out.len() - before);
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
