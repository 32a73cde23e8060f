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

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    ts_ns: u64,
    agent: &'a str,
    instance: &'a str,
    stream: std::borrow::Cow<'static, str>,
    stream_seq: u64,
    severity: &'static str,
    source: &'a str,
    message: &'a str,
    fields: serde_json::Map<String, serde_json::Value>,
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
    let line = Line {
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
    };
    // Serializing strings and numbers into a Vec cannot fail; an empty line is never written.
    let mut out = serde_json::to_vec(&line).unwrap_or_default();
    out.push(b'\n');
    out
}

/// A file that rotates by size (see the module docs).
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_file_bytes: u64,
    max_files: u32,
    file: Option<BufWriter<File>>,
    size: u64,
}

/// Checks, without creating or changing anything, that a log file could be created at
/// `path`: it is not an existing directory, and the nearest existing ancestor of its
/// directory is a directory (the missing ones are created at open). Used by the
/// configuration check (`--check-config`) and before opening, so that a path under a regular
/// file reads "… is not a directory" rather than `create_dir_all`'s "File exists".
///
/// # Errors
/// [`io::ErrorKind::IsADirectory`] or [`io::ErrorKind::NotADirectory`] with a message naming
/// the offending path.
pub fn check_path(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it is a directory; name a file in it",
        ));
    }
    let mut dir = path.parent();
    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", d.display()),
                ))
            }
            Err(_) => dir = d.parent(),
        }
    }
    Ok(())
}

impl RotatingFile {
    /// Opens (appending) or creates `path`, creating its directory.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened ([`check_path`] first).
    pub fn open(path: &Path, max_file_bytes: u64, max_files: u32) -> io::Result<RotatingFile> {
        check_path(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = RotatingFile {
            path: path.to_path_buf(),
            max_file_bytes: max_file_bytes.max(1),
            max_files: max_files.max(1),
            file: None,
            size: 0,
        };
        f.reopen()?;
        Ok(f)
    }

    fn reopen(&mut self) -> io::Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.size = file.metadata()?.len();
        self.file = Some(BufWriter::with_capacity(64 * 1024, file));
        Ok(())
    }

    fn numbered(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    fn rotate(&mut self) -> io::Result<()> {
        if let Some(mut f) = self.file.take() {
            f.flush()?;
        }
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
        std::fs::rename(&self.path, self.numbered(1))?;
        self.reopen()
    }

    /// Writes one whole line, rotating first if it would take the file past the bound.
    ///
    /// # Errors
    /// I/O errors; the file is reopened on the next write.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let len = line.len() as u64;
        if self.size > 0 && self.size.saturating_add(len) > self.max_file_bytes {
            if let Err(e) = self.rotate() {
                self.file = None;
                return Err(e);
            }
        }
        if self.file.is_none() {
            self.reopen()?;
        }
        let Some(f) = self.file.as_mut() else {
            return Err(io::Error::other("log file not open"));
        };
        if let Err(e) = f.write_all(line) {
            self.file = None;
            return Err(e);
        }
        self.size = self.size.saturating_add(len);
        Ok(())
    }

    /// Flushes buffered lines to the OS.
    ///
    /// # Errors
    /// I/O errors.
    pub fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

enum Target {
    Stdout,
    File(RotatingFile),
}

/// The configured sink. Thread-safe.
pub struct LogSink {
    target: Mutex<Target>,
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
        Ok(LogSink {
            target: Mutex::new(target),
        })
    }

    /// Writes every record of one frame; returns how many could not be written (the caller
    /// counts them as `log_sink_error`) and the first error.
    pub fn write_batch(
        &self,
        ctx: &LogContext<'_>,
        records: &[LogRecord],
    ) -> (u64, Option<io::Error>) {
        let Ok(mut target) = self.target.lock() else {
            return (
                records.len() as u64,
                Some(io::Error::other("log sink lock poisoned")),
            );
        };
        let mut failed = 0u64;
        let mut first_err = None;
        match &mut *target {
            Target::Stdout => {
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
            }
            Target::File(f) => {
                for r in records {
                    if let Err(e) = f.write_line(&encode_line(ctx, r)) {
                        failed += 1;
                        first_err.get_or_insert(e);
                    }
                }
                if let Err(e) = f.flush() {
                    first_err.get_or_insert(e);
                }
            }
        }
        (failed, first_err)
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
