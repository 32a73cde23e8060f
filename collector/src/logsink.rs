//! The log sink: received log records as JSON Lines, to stdout or to files with size-based
//! rotation (DESIGN.md §8).
//!
//! One record per line:
//!
//! ```json
//! {"ts":"2026-11-29T18:00:00.123456789Z","ts_ns":1795974000123456789,"agent":"web-1",
//!  "instance":"web-1.example","stream":"logs","stream_seq":41,"severity":"info",
//!  "source":"/var/log/syslog","message":"...","fields":{"unit":"cron"}}
//! ```
//!
//! (shown wrapped; it is one line). `ts` is RFC 3339 UTC with nanoseconds, `ts_ns` the same
//! instant in nanoseconds since the Unix epoch; a record without its own timestamp gets the
//! frame's. `stream` is the name of the frame's stream, as in the `stream` label of the
//! self-metrics (`uctel_protocol::stream::label`: `logs` for the agent's log stream, the
//! stream id as a decimal string for an id without a well-known name); `stream_seq` is the
//! stream sequence of the frame that carried the record.
//!
//! Rotation (logrotate's numbered scheme): before a line would take the active file past
//! `max_file_bytes`, `path.N-1 → path.N`, …, `path → path.1`, and a new `path` is opened;
//! `max_files` rotated files are kept. A line is never split across files, so a file exceeds
//! the bound only when a single line is larger than it. The rotation is written here rather
//! than taken from the `file-rotate` crate because that crate panics when the directory cannot
//! be created and silently discards writes when the file cannot be opened, while every lost
//! record here must be counted (`log_sink_error`).
//!
//! Write errors (a full disk): lines are written whole from a 64 KiB buffer, when it fills
//! and at the end of every batch. A write that fails part-way is cut back (`set_len`) to its
//! last whole line, so no partial line is left, and every record not in the file is counted
//! as one `log_sink_error` drop, once. The file is then closed and reopened by path with the
//! next line, so writing resumes by itself when space returns (also when the file itself was
//! deleted to free it) and rotation goes on. A warning names the path and the error (at most
//! once per 10 s), and an info says when writes succeed again.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use uctel_protocol::payload::{LogRecord, Severity};

use crate::config::{LogSinkKind, LogsConfig};

/// Where the frame that carried a batch came from.
#[derive(Clone, Copy, Debug)]
pub struct LogContext<'a> {
    /// Agent id.
    pub agent: &'a str,
    /// Agent hostname (from `Hello`).
    pub instance: &'a str,
    /// Stream id.
    pub stream: u32,
    /// Stream sequence of the frame.
    pub stream_seq: u64,
    /// The frame's timestamp, ns since the Unix epoch (for records without one).
    pub frame_timestamp_ns: u64,
}

/// The fields of one log record as every log output writes them: the JSON Lines sink
/// ([`encode_line`]) and the ClickHouse output (`crate::outputs::clickhouse`) build their
/// rows from this one struct, so both carry the same values.
#[derive(Debug, Serialize)]
pub struct LogLine<'a> {
    /// RFC 3339 UTC with nanoseconds ([`rfc3339_nanos`] of `ts_ns`).
    pub ts: String,
    /// The record's timestamp, ns since the Unix epoch (the frame's when it has none).
    pub ts_ns: u64,
    /// Agent id.
    pub agent: &'a str,
    /// Agent hostname.
    pub instance: &'a str,
    /// The stream's name (`uctel_protocol::stream::label`).
    pub stream: std::borrow::Cow<'static, str>,
    /// Stream sequence of the frame that carried the record.
    pub stream_seq: u64,
    /// Lower-case severity name ([`severity_name`]).
    pub severity: &'static str,
    /// Where the agent read it (a file path).
    pub source: &'a str,
    /// The message.
    pub message: &'a str,
    /// The record's fields by key (sorted by key; of a key given twice, the later value).
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl<'a> LogLine<'a> {
    /// The fields of `record`, carried by a frame from `ctx`.
    pub fn new(ctx: &LogContext<'a>, record: &'a LogRecord) -> LogLine<'a> {
        let ts_ns = if record.timestamp_ns == 0 {
            ctx.frame_timestamp_ns
        } else {
            record.timestamp_ns
        };
        let fields = record
            .fields
            .iter()
            .map(|f| (f.key.clone(), serde_json::Value::String(f.value.clone())))
            .collect();
        LogLine {
            ts: rfc3339_nanos(ts_ns),
            ts_ns,
            agent: ctx.agent,
            instance: ctx.instance,
            stream: uctel_protocol::stream::label(ctx.stream),
            stream_seq: ctx.stream_seq,
            severity: severity_name(record.severity),
            source: &record.source,
            message: &record.message,
            fields,
        }
    }
}

/// Lower-case severity name (`unspecified` for 0).
pub fn severity_name(value: i32) -> &'static str {
    match Severity::try_from(value) {
        Ok(Severity::Trace) => "trace",
        Ok(Severity::Debug) => "debug",
        Ok(Severity::Info) => "info",
        Ok(Severity::Warn) => "warn",
        Ok(Severity::Error) => "error",
        Ok(Severity::Fatal) => "fatal",
        Ok(Severity::Unspecified) | Err(_) => "unspecified",
    }
}

/// RFC 3339 UTC with nanoseconds for `ns` since the Unix epoch.
pub fn rfc3339_nanos(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let nanos = (ns % 1_000_000_000) as u32;
    chrono::DateTime::from_timestamp(secs, nanos)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
        .unwrap_or_default()
}

/// Encodes one record as a JSON line (with the trailing `\n`).
pub fn encode_line(ctx: &LogContext<'_>, record: &LogRecord) -> Vec<u8> {
    // Serializing strings and numbers into a Vec cannot fail; an empty line is never written.
    let mut out = serde_json::to_vec(&LogLine::new(ctx, record)).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Bytes of whole lines held in memory before they are written to the file (and at the end
/// of every batch).
const BUFFER_BYTES: usize = 64 * 1024;

/// At most one warning about failing writes per this interval (as the drop events).
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Lines that did not reach a log file: how many, and the first error. Every line is either
/// in the file whole or counted here, once.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct WriteError {
    /// The log file.
    pub path: PathBuf,
    /// Lines lost (records, one line each).
    pub lines: u64,
    /// The first error.
    #[source]
    pub source: io::Error,
}

impl WriteError {
    /// Adds `other`'s lines to `acc` (keeping the first error), or makes it `acc`.
    fn merge_into(acc: &mut Option<WriteError>, other: WriteError) {
        match acc {
            Some(a) => a.lines = a.lines.saturating_add(other.lines),
            None => *acc = Some(other),
        }
    }
}

/// What the rotating file needs of an open log file: a [`File`] opened for appending here, a
/// file with a size quota in the unit tests.
trait LogFile: Send + std::fmt::Debug {
    /// One `write(2)`: how many bytes of `buf` were written.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// The file's length.
    fn file_len(&self) -> io::Result<u64>;
    /// Cuts the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl LogFile for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Write::write(self, buf)
    }
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

/// Opens `path` for appending, creating it.
type Opener = fn(&Path) -> io::Result<Box<dyn LogFile>>;

fn open_append(path: &Path) -> io::Result<Box<dyn LogFile>> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(Box::new(file))
}

/// Whole lines not yet written: their bytes, and the offset in `buf` where each one ends.
#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Pending {
    fn push(&mut self, line: &[u8]) {
        self.buf.extend_from_slice(line);
        self.ends.push(self.buf.len());
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
    }
}

/// What a failed [`flush_lines`] lost.
#[derive(Debug)]
struct Lost {
    /// Pending lines not in the file.
    lines: u64,
    /// Pending bytes not in the file.
    bytes: u64,
    source: io::Error,
}

/// Writes the pending lines to `file` and empties `pending`.
///
/// When a write fails (`ENOSPC`, `EIO`, …), the lines written whole stay in the file, the
/// bytes of a line written only in part are cut off again (`set_len` to the file's length
/// less those bytes, so a file truncated meanwhile by someone else is not extended with
/// zeros; to `base`, the length before this call, plus the whole lines if the length cannot
/// be read), and the rest is lost: the error says how many lines. If that cut fails too,
/// `torn` keeps the length the open file must be cut back to; it is tried first on the next
/// call, and nothing is written to the file until it succeeds.
fn flush_lines(
    file: &mut dyn LogFile,
    base: u64,
    pending: &mut Pending,
    torn: &mut Option<u64>,
) -> Result<(), Lost> {
    if let Some(len) = *torn {
        // Only ever shorter: a file truncated meanwhile is not extended with zeros.
        let cut = match file.file_len() {
            Ok(now) if now <= len => Ok(()),
            _ => file.set_len(len),
        };
        if let Err(source) = cut {
            let lost = Lost {
                lines: pending.ends.len() as u64,
                bytes: pending.buf.len() as u64,
                source,
            };
            pending.clear();
            return Err(lost);
        }
        *torn = None;
    }
    let mut written = 0usize;
    let mut failure = None;
    while written < pending.buf.len() {
        let rest = pending.buf.get(written..).unwrap_or_default();
        match file.write(rest) {
            Ok(0) => {
                failure = Some(io::Error::from(io::ErrorKind::WriteZero));
                break;
            }
            Ok(n) => written = written.saturating_add(n.min(rest.len())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let Some(source) = failure else {
        pending.clear();
        return Ok(());
    };
    let whole = pending.ends.partition_point(|&end| end <= written);
    let kept = whole
        .checked_sub(1)
        .and_then(|i| pending.ends.get(i))
        .copied()
        .unwrap_or(0);
    let partial = (written - kept) as u64;
    if partial > 0 {
        let cut = file
            .file_len()
            .map_or(base.saturating_add(kept as u64), |len| {
                len.saturating_sub(partial)
            });
        if file.set_len(cut).is_err() {
            *torn = Some(cut);
        }
    }
    let lost = Lost {
        lines: (pending.ends.len() - whole) as u64,
        bytes: (pending.buf.len() - kept) as u64,
        source,
    };
    pending.clear();
    Err(lost)
}

/// A file that rotates by size (see the module docs).
///
/// Lines are held in memory (up to 64 KiB) and written whole; a failed write is
/// cut back to the last whole line and the lost lines are counted in the [`WriteError`].
/// After a failed write the file is closed (unless a partial line is still to be cut off)
/// and reopened by path on the next line, so space freed by deleting it is released and the
/// writes resume by themselves.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_file_bytes: u64,
    max_files: u32,
    open: Opener,
    /// `None` only after a failed write or rotation (then `pending` is empty and `torn`
    /// is `None`).
    file: Option<Box<dyn LogFile>>,
    pending: Pending,
    /// The length the open file must be cut back to (a partial line could not be cut off).
    torn: Option<u64>,
    /// The file's length plus the pending bytes (the rotation bound is checked on it).
    size: u64,
}

pub use crate::config::check_path;

impl RotatingFile {
    /// Opens (appending) or creates `path`, creating its directory.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened ([`check_path`] first).
    pub fn open(path: &Path, max_file_bytes: u64, max_files: u32) -> io::Result<RotatingFile> {
        RotatingFile::open_with(path, max_file_bytes, max_files, open_append)
    }

    fn open_with(
        path: &Path,
        max_file_bytes: u64,
        max_files: u32,
        open: Opener,
    ) -> io::Result<RotatingFile> {
        check_path(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = RotatingFile {
            path: path.to_path_buf(),
            max_file_bytes: max_file_bytes.max(1),
            max_files: max_files.max(1),
            open,
            file: None,
            pending: Pending::default(),
            torn: None,
            size: 0,
        };
        f.reopen()?;
        Ok(f)
    }

    /// The active file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `path` anew (only with nothing pending and nothing to cut back).
    fn reopen(&mut self) -> io::Result<()> {
        self.file = None;
        let file = (self.open)(&self.path)?;
        self.size = file
            .file_len()?
            .saturating_add(self.pending.buf.len() as u64);
        self.file = Some(file);
        Ok(())
    }

    fn error(&self, lines: u64, source: io::Error) -> WriteError {
        WriteError {
            path: self.path.clone(),
            lines,
            source,
        }
    }

    fn numbered(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    /// `path.N-1 → path.N`, …, `path → path.1` and a new `path` (nothing pending). A
    /// missing `path` (deleted by someone else) is not an error.
    fn rotate(&mut self) -> io::Result<()> {
        if self.torn.is_some() {
            return Err(io::Error::other(
                "not rotated: a partly written line could not be cut off",
            ));
        }
        self.file = None;
        let oldest = self.numbered(self.max_files);
        match std::fs::remove_file(&oldest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for n in (1..self.max_files).rev() {
            let from = self.numbered(n);
            if from.exists() {
                std::fs::rename(&from, self.numbered(n + 1))?;
            }
        }
        match std::fs::rename(&self.path, self.numbered(1)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.reopen()
    }

    /// Writes the pending lines (see [`flush_lines`]); after a failure the file is closed
    /// (unless a partial line is still to be cut off), to be reopened by path.
    fn flush_pending(&mut self) -> Result<(), WriteError> {
        let base = self.size.saturating_sub(self.pending.buf.len() as u64);
        let Some(file) = self.file.as_mut() else {
            let lines = self.pending.ends.len() as u64;
            self.size = base;
            self.pending.clear();
            return match lines {
                0 => Ok(()),
                _ => Err(self.error(lines, io::Error::other("log file not open"))),
            };
        };
        match flush_lines(file.as_mut(), base, &mut self.pending, &mut self.torn) {
            Ok(()) => Ok(()),
            Err(lost) => {
                self.size = self.size.saturating_sub(lost.bytes);
                if self.torn.is_none() {
                    self.file = None;
                }
                Err(self.error(lost.lines, lost.source))
            }
        }
    }

    /// Takes one whole line (with its `\n`), rotating first if it would take the file past
    /// the bound; it is written when the buffer fills or at [`RotatingFile::flush`].
    ///
    /// # Errors
    /// The lines lost by this call: this one if the file cannot be opened or rotated, and
    /// earlier ones whose write failed here (each line is counted once, by the call that
    /// lost it).
    pub fn write_line(&mut self, line: &[u8]) -> Result<(), WriteError> {
        let mut lost = None;
        let len = line.len() as u64;
        match self.make_room(len, &mut lost) {
            Ok(()) => {
                self.pending.push(line);
                self.size = self.size.saturating_add(len);
            }
            Err(e) => WriteError::merge_into(&mut lost, self.error(1, e)),
        }
        lost.map_or(Ok(()), Err)
    }

    /// Gets ready to take a line of `len` bytes: opens the file, rotates it or writes the
    /// buffer out as needed. Earlier lines lost on the way go to `lost`; an error means this
    /// line cannot be taken.
    fn make_room(&mut self, len: u64, lost: &mut Option<WriteError>) -> io::Result<()> {
        if self.file.is_none() {
            self.reopen()?;
        }
        if self.size > 0 && self.size.saturating_add(len) > self.max_file_bytes {
            if let Err(e) = self.flush_pending() {
                WriteError::merge_into(lost, e);
            }
            self.rotate()?;
        } else if !self.pending.is_empty()
            && (self.pending.buf.len() as u64).saturating_add(len) > BUFFER_BYTES as u64
        {
            if let Err(e) = self.flush_pending() {
                WriteError::merge_into(lost, e);
            }
            if self.file.is_none() {
                self.reopen()?;
            }
        }
        Ok(())
    }

    /// Writes the pending lines to the OS.
    ///
    /// # Errors
    /// The lines that could not be written (cut back to the last whole line).
    pub fn flush(&mut self) -> Result<(), WriteError> {
        self.flush_pending()
    }
}

impl Drop for RotatingFile {
    /// Writes what is pending, if it can (a loss here cannot be counted: [`LogSink`] flushes
    /// at the end of every batch, so nothing is pending when it drops the file).
    fn drop(&mut self) {
        let _ = self.flush_pending();
    }
}

enum Target {
    Stdout,
    File(RotatingFile),
}

/// When to log about a failing log file (`now` passed in): a warning at most once per
/// [`WARN_INTERVAL`], with the lines lost since the last one, and one info when writes
/// succeed again after an outage that was warned about.
#[derive(Debug, Default)]
struct Health {
    /// A write failed and no batch has been written whole since.
    failing: bool,
    /// This outage was warned about.
    warned: bool,
    last_warn: Option<Instant>,
    /// Lines lost since the last warning.
    unreported: u64,
    /// Lines lost in this outage.
    outage: u64,
}

impl Health {
    /// `lost` lines were lost; `Some(lines lost since the last warning)` when a warning is
    /// due.
    fn failed(&mut self, now: Instant, lost: u64) -> Option<u64> {
        self.failing = true;
        self.unreported = self.unreported.saturating_add(lost);
        self.outage = self.outage.saturating_add(lost);
        let due = self
            .last_warn
            .is_none_or(|t| now.saturating_duration_since(t) >= WARN_INTERVAL);
        if !due {
            return None;
        }
        self.last_warn = Some(now);
        self.warned = true;
        Some(std::mem::take(&mut self.unreported))
    }

    /// A batch was written whole; `Some(lines lost in the outage)` when an info is due.
    fn succeeded(&mut self) -> Option<u64> {
        if !self.failing {
            return None;
        }
        self.failing = false;
        let lost = std::mem::take(&mut self.outage);
        std::mem::take(&mut self.warned).then_some(lost)
    }
}

struct State {
    target: Target,
    health: Health,
}

/// The configured sink. Thread-safe.
pub struct LogSink {
    state: Mutex<State>,
}

impl std::fmt::Debug for LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogSink")
    }
}

impl LogSink {
    /// Opens the sink described by `config`.
    ///
    /// # Errors
    /// The log file or its directory cannot be created.
    pub fn open(config: &LogsConfig) -> io::Result<LogSink> {
        let target = match config.sink {
            LogSinkKind::Stdout => Target::Stdout,
            LogSinkKind::File => Target::File(RotatingFile::open(
                &config.file.path,
                config.file.max_file_bytes,
                config.file.max_files,
            )?),
        };
        Ok(LogSink::with_target(target))
    }

    fn with_target(target: Target) -> LogSink {
        LogSink {
            state: Mutex::new(State {
                target,
                health: Health::default(),
            }),
        }
    }

    /// Writes every record of one frame; returns how many could not be written (the caller
    /// counts them as `log_sink_error`) and the first error. To a file, every record is
    /// either in it as a whole line or in the count, once; a failing file is warned about
    /// (rate-limited, with its path and the error) and its recovery logged.
    pub fn write_batch(
        &self,
        ctx: &LogContext<'_>,
        records: &[LogRecord],
    ) -> (u64, Option<io::Error>) {
        let Ok(mut state) = self.state.lock() else {
            return (
                records.len() as u64,
                Some(io::Error::other("log sink lock poisoned")),
            );
        };
        let State { target, health } = &mut *state;
        match target {
            Target::Stdout => {
                let mut failed = 0u64;
                let mut first_err = None;
                let stdout = io::stdout();
                let mut out = stdout.lock();
                for r in records {
                    if let Err(e) = out.write_all(&encode_line(ctx, r)) {
                        failed += 1;
                        first_err.get_or_insert(e);
                    }
                }
                if let Err(e) = out.flush() {
                    first_err.get_or_insert(e);
                }
                (failed, first_err)
            }
            Target::File(f) => {
                let mut lost = None;
                for r in records {
                    if let Err(e) = f.write_line(&encode_line(ctx, r)) {
                        WriteError::merge_into(&mut lost, e);
                    }
                }
                if let Err(e) = f.flush() {
                    WriteError::merge_into(&mut lost, e);
                }
                let failed = lost.as_ref().map_or(0, |e| e.lines);
                if failed > 0 {
                    if let Some(n) = health.failed(Instant::now(), failed) {
                        if let Some(e) = &lost {
                            tracing::warn!(
                                path = %e.path.display(),
                                error = %e.source,
                                records = n,
                                "log file writes fail; records dropped (log_sink_error; \
                                 warned at most once per 10 s)"
                            );
                        }
                    }
                } else if !records.is_empty() {
                    if let Some(n) = health.succeeded() {
                        tracing::info!(
                            path = %f.path().display(),
                            records_dropped = n,
                            "log file writes succeed again"
                        );
                    }
                }
                (failed, lost.map(|e| io::Error::new(e.source.kind(), e)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_protocol::payload::Field;

    fn ctx() -> LogContext<'static> {
        LogContext {
            agent: "web-1",
            instance: "web-1.example",
            stream: 2,
            stream_seq: 41,
            frame_timestamp_ns: 1_700_000_000_000_000_007,
        }
    }

    fn record(msg: &str) -> LogRecord {
        LogRecord {
            timestamp_ns: 0,
            severity: Severity::Warn as i32,
            source: "/var/log/syslog".into(),
            message: msg.into(),
            fields: vec![Field {
                key: "unit".into(),
                value: "cron".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn line_shape() {
        let line = encode_line(&ctx(), &record("disk \"full\"\nagain"));
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["ts"], "2023-11-14T22:13:20.000000007Z");
        assert_eq!(v["ts_ns"], 1_700_000_000_000_000_007u64);
        assert_eq!(v["agent"], "web-1");
        assert_eq!(v["instance"], "web-1.example");
        assert_eq!(v["stream"], "logs");
        assert_eq!(v["stream_seq"], 41);
        assert_eq!(v["severity"], "warn");
        assert_eq!(v["source"], "/var/log/syslog");
        assert_eq!(v["message"], "disk \"full\"\nagain");
        assert_eq!(v["fields"]["unit"], "cron");
    }

    #[test]
    fn stream_without_a_well_known_name_is_its_number_as_a_string() {
        let c = LogContext { stream: 7, ..ctx() };
        let v: serde_json::Value = serde_json::from_slice(&encode_line(&c, &record("x"))).unwrap();
        assert_eq!(v["stream"], "7");
    }

    #[test]
    fn rotation_keeps_whole_lines_and_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/logs.jsonl");
        let mut f = RotatingFile::open(&path, 100, 2).unwrap();
        let line = [b'x'; 39]
            .iter()
            .copied()
            .chain(std::iter::once(b'\n'))
            .collect::<Vec<u8>>();
        for _ in 0..10 {
            f.write_line(&line).unwrap();
        }
        f.flush().unwrap();
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // 40-byte lines, 100-byte bound: two lines per file.
        assert_eq!(size(&path), 80);
        assert_eq!(size(&dir.path().join("sub/logs.jsonl.1")), 80);
        assert_eq!(size(&dir.path().join("sub/logs.jsonl.2")), 80);
        assert!(!dir.path().join("sub/logs.jsonl.3").exists());
        for p in ["sub/logs.jsonl", "sub/logs.jsonl.1", "sub/logs.jsonl.2"] {
            let text = std::fs::read_to_string(dir.path().join(p)).unwrap();
            assert!(text.lines().all(|l| l.len() == 39), "{p}");
        }
    }

    #[test]
    fn reopens_existing_file_and_counts_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.jsonl");
        std::fs::write(&path, [b'y'; 90]).unwrap();
        let mut f = RotatingFile::open(&path, 100, 1).unwrap();
        f.write_line(b"0123456789ab\n").unwrap();
        f.flush().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 13);
        assert_eq!(
            std::fs::metadata(dir.path().join("l.jsonl.1"))
                .unwrap()
                .len(),
            90
        );
    }

    #[test]
    fn sink_writes_batches_to_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogsConfig {
            sink: LogSinkKind::File,
            file: crate::config::LogFileConfig {
                path: dir.path().join("out.jsonl"),
                max_file_bytes: 1 << 20,
                max_files: 2,
            },
        };
        let sink = LogSink::open(&cfg).unwrap();
        let (failed, err) = sink.write_batch(&ctx(), &[record("a"), record("b")]);
        assert_eq!(failed, 0);
        assert!(err.is_none());
        let text = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
        let msgs: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["message"].to_string())
            .collect();
        assert_eq!(msgs, vec!["\"a\"", "\"b\""]);
    }

    /// A file in memory that takes `room` more bytes, at most `chunk` per write, then fails
    /// with `ENOSPC`; its first `set_len_failures` cuts fail.
    #[derive(Debug)]
    struct Flaky {
        data: Vec<u8>,
        room: usize,
        chunk: usize,
        set_len_failures: u32,
    }

    fn no_space() -> io::Error {
        io::Error::new(io::ErrorKind::StorageFull, "no space left on device")
    }

    impl LogFile for Flaky {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room).min(self.chunk);
            if n == 0 {
                return Err(no_space());
            }
            self.data.extend_from_slice(&buf[..n]);
            self.room -= n;
            Ok(n)
        }
        fn file_len(&self) -> io::Result<u64> {
            Ok(self.data.len() as u64)
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            if self.set_len_failures > 0 {
                self.set_len_failures -= 1;
                return Err(io::Error::other("cannot cut"));
            }
            let len = len as usize;
            self.room += self.data.len().saturating_sub(len);
            self.data.resize(len, 0);
            Ok(())
        }
    }

    fn pending<L: AsRef<[u8]>>(lines: &[L]) -> Pending {
        let mut p = Pending::default();
        for l in lines {
            p.push(l.as_ref());
        }
        p
    }

    #[test]
    fn failed_flush_keeps_whole_lines_cuts_the_partial_one_and_counts_the_rest() {
        let mut f = Flaky {
            data: b"old\n".to_vec(),
            room: 25,
            chunk: 7,
            set_len_failures: 0,
        };
        let mut p = pending(&[b"aaaaaaaaa\n"; 5]);
        let mut torn = None;
        let lost = flush_lines(&mut f, 4, &mut p, &mut torn).unwrap_err();
        // 25 bytes went out: two whole lines and half of the third, which is cut off again.
        assert_eq!(f.data, b"old\naaaaaaaaa\naaaaaaaaa\n");
        assert_eq!((lost.lines, lost.bytes), (3, 30));
        assert_eq!(lost.source.kind(), io::ErrorKind::StorageFull);
        assert!(p.is_empty() && torn.is_none());
        // Space again: the next lines go out whole.
        f.room = 100;
        let mut p = pending(&[&b"bb\n"[..], b"", b"cc\n"]);
        flush_lines(&mut f, 24, &mut p, &mut torn).unwrap();
        assert_eq!(f.data, b"old\naaaaaaaaa\naaaaaaaaa\nbb\ncc\n");
    }

    #[test]
    fn a_cut_that_fails_is_done_before_the_next_write() {
        let mut f = Flaky {
            data: Vec::new(),
            room: 15,
            chunk: 64,
            set_len_failures: 2,
        };
        let mut torn = None;
        let lost =
            flush_lines(&mut f, 0, &mut pending(&[b"0123456789\n"; 2]), &mut torn).unwrap_err();
        assert_eq!(lost.lines, 1);
        assert_eq!(torn, Some(11));
        // The second cut fails too: nothing is written after the partial line.
        f.room = 100;
        let lost = flush_lines(&mut f, 11, &mut pending(&[b"x\n"]), &mut torn).unwrap_err();
        assert_eq!((lost.lines, lost.bytes), (1, 2));
        assert_eq!(f.data.len(), 15);
        // Now it is cut, then the line is written.
        flush_lines(&mut f, 11, &mut pending(&[b"y\n"]), &mut torn).unwrap();
        assert_eq!(f.data, b"0123456789\ny\n");
        assert!(torn.is_none());
    }

    /// A real file in a directory whose files may hold at most `CAP` bytes together (a
    /// disk of that size, without root); writes of at most 4 KiB.
    #[derive(Debug)]
    struct Quota<const CAP: u64> {
        file: File,
        dir: PathBuf,
    }

    impl<const CAP: u64> LogFile for Quota<CAP> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let used: u64 = std::fs::read_dir(&self.dir)?
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum();
            let room = usize::try_from(CAP.saturating_sub(used)).unwrap_or(usize::MAX);
            let n = buf.len().min(room).min(4096);
            if n == 0 {
                return Err(no_space());
            }
            Write::write(&mut self.file, &buf[..n])
        }
        fn file_len(&self) -> io::Result<u64> {
            self.file.file_len()
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            self.file.set_len(len)
        }
    }

    fn quota_open<const CAP: u64>(path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Ok(Box::new(Quota::<CAP> { file, dir }))
    }

    /// Every line of the log files under `dir` (all must be whole JSON): the messages.
    fn messages_in(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(e.unwrap().path()).unwrap();
            assert!(bytes.is_empty() || bytes.ends_with(b"\n"), "a partial line");
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let v: serde_json::Value = serde_json::from_slice(line)
                    .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(line)));
                out.push(v["message"].as_str().unwrap().to_string());
            }
        }
        out.sort();
        out
    }

    fn records(from: usize, to: usize) -> Vec<LogRecord> {
        (from..to)
            .map(|n| record(&format!("{n:06}{}", "x".repeat(94))))
            .collect()
    }

    /// 1,000 records of ~100 bytes through a sink on a full "disk" of `CAP` bytes, `batch`
    /// to a call: every one is in a file whole or counted, once; after the rotated files
    /// are deleted, writes (and rotations) succeed again.
    fn conservation_on_a_full_disk<const CAP: u64>(max_file_bytes: u64, batch: usize) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs.jsonl");
        let file = RotatingFile::open_with(&path, max_file_bytes, 8, quota_open::<CAP>).unwrap();
        let sink = LogSink::with_target(Target::File(file));
        let all = records(0, 1000);
        let mut lost = 0;
        for chunk in all.chunks(batch) {
            let (failed, err) = sink.write_batch(&ctx(), chunk);
            assert_eq!(failed > 0, err.is_some());
            if let Some(e) = err {
                assert_eq!(e.kind(), io::ErrorKind::StorageFull);
                assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
            }
            lost += failed;
        }
        let written = messages_in(dir.path());
        assert!(lost > 0, "never full");
        assert_eq!(written.len() as u64 + lost, 1000);
        let mut unique = written.clone();
        unique.dedup();
        assert_eq!(unique, written, "a record written twice");

        // Free the space, the active file too (closed after the failed write, it is
        // created anew).
        for e in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let more = records(1000, 1030);
        for chunk in more.chunks(batch) {
            let (failed, err) = sink.write_batch(&ctx(), chunk);
            assert_eq!(failed, 0, "{err:?}");
        }
        let expected: Vec<String> = more.iter().map(|r| r.message.clone()).collect();
        assert_eq!(messages_in(dir.path()), expected);
        if max_file_bytes < CAP {
            assert!(dir.path().join("logs.jsonl.1").exists(), "no rotation");
        }
    }

    #[test]
    fn full_disk_with_rotation_keeps_every_record_whole_or_counted() {
        // The disk fills at about four files, before `max_files` (8) would delete one.
        conservation_on_a_full_disk::<{ 16 * 1024 }>(4096, 10);
    }

    #[test]
    fn full_disk_in_one_large_batch_keeps_every_record_whole_or_counted() {
        // 1,000 records in one call: the 64 KiB buffer fills, is written, and fails part-way.
        conservation_on_a_full_disk::<{ 96 * 1024 }>(1 << 30, 1000);
    }

    #[test]
    fn writes_that_fail_are_warned_about_rate_limited_and_their_recovery_once() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut h = Health::default();
        assert_eq!(h.succeeded(), None);
        assert_eq!(h.failed(s(0), 3), Some(3));
        assert_eq!(h.failed(s(1), 2), None);
        assert_eq!(h.failed(s(10), 4), Some(6));
        assert_eq!(h.succeeded(), Some(9));
        assert_eq!(h.succeeded(), None);
        // A short outage inside the interval: no warning, so no recovery message either;
        // its loss is in the next warning.
        assert_eq!(h.failed(s(12), 5), None);
        assert_eq!(h.succeeded(), None);
        assert_eq!(h.failed(s(20), 1), Some(6));
    }

    #[test]
    fn unopenable_path_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        assert!(RotatingFile::open(&blocker.join("x.jsonl"), 100, 1).is_err());
    }

    #[test]
    fn paths_under_a_file_or_naming_a_directory_are_refused_before_anything_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        for path in [blocker.join("x.jsonl"), blocker.join("sub/deeper/x.jsonl")] {
            let e = check_path(&path).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotADirectory, "{}", path.display());
            assert_eq!(
                e.to_string(),
                format!("{} is not a directory", blocker.display())
            );
            let e = RotatingFile::open(&path, 100, 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotADirectory);
        }
        let e = check_path(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
        // Missing directories are fine (created at open); nothing was created by the checks.
        let fresh = dir.path().join("a/b/logs.jsonl");
        check_path(&fresh).unwrap();
        check_path(Path::new("relative.jsonl")).unwrap();
        assert!(!dir.path().join("a").exists());
        assert!(!blocker.join("sub").exists());
    }
}
