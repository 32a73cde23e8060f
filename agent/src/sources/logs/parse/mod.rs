//! Parsing of log lines, per `sources.logs` entry ([`LogParseSection`]); every part is off by
//! default.
//!
//! - **Multi-line records** (`multiline`, [`Joiner`]): a line matching `start_pattern` begins
//!   a record, any other line joins the current one (with `\n`); the record is handed on at the
//!   next start line, once no line joined it for `timeout_seconds`, when its file is truncated
//!   or closed. A record holds at most `max_line_bytes` bytes (the limit `--check-config` fits
//!   to a frame): further bytes are not kept and counted ([`LogEvent::RecordCut`] once per
//!   record, the bytes in `discarded_bytes`), but its lines stay in it, so a record is never
//!   split into two. Its `end_offset` is the end of its last line and the checkpoint resumes
//!   at the first line of the record being joined, so an agent restart reads the whole record
//!   again: no line of it is lost or sent twice (the collector's replay rule discards a record
//!   it already delivered by that `end_offset`).
//! - **JSON lines** (`json`): a line that is a JSON object (RFC 8259) has its keys in the
//!   record's fields, flattened (`a.b`), bounded by `json_max_depth` (deeper objects stay JSON
//!   text) and `json_max_fields` (each key not kept counted as
//!   [`LogEvent::JsonFieldDropped`]). The message stays the line. A record whose fields make
//!   it larger than a frame is cut by the sender to fit and counted there
//!   (`records_truncated_total`), as any record.
//! - **The line's own time** (`timestamp`, `timestamp_format`, `timezone`;
//!   [`timestamp::from_line`]): the record's `timestamp_ns` becomes the time the line states
//!   and the read time goes into the field [`READ_TIME_FIELD`]; lines without one keep the
//!   read time. With `json`, the keys `time`, `ts` and `@timestamp` are looked at first.
//!
//! Severity detection (`severity: auto`) is separate and reads the first line.

mod json;
mod multiline;
mod section;
pub mod timestamp;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use regex::bytes::Regex;
use uctel_protocol::payload::{Field, LogRecord};

pub use json::{flatten, Flat};
pub use multiline::{Joined, Joiner};
pub use section::{LogParseSection, MultilineSection};
pub use timestamp::Zone;

use super::{LogEvent, LogSourceCounts};

/// The field that keeps the time a line was read (RFC 3339 UTC, nanoseconds) when the record's
/// timestamp is the line's own.
pub const READ_TIME_FIELD: &str = "read_time";

/// The JSON keys that hold a line's time, looked at in this order.
pub const JSON_TIME_KEYS: [&str; 3] = ["time", "ts", "@timestamp"];

/// [`LogParseSection`] checked and compiled: what the tailer applies to each record.
#[derive(Debug, Clone)]
pub struct Parser {
    json: bool,
    max_fields: usize,
    max_depth: usize,
    timestamp: bool,
    format: Option<String>,
    zone: Zone,
    multiline: Option<(Regex, Duration)>,
}

impl Parser {
    /// Checks and compiles `section`.
    ///
    /// # Errors
    /// A text naming the key: a `timezone` that is not `local`, `UTC` or `±HH:MM`; a
    /// `start_pattern` that is not a valid regex; a `timeout_seconds` that is not a positive
    /// finite number of at most 3600; an empty `timestamp_format`.
    pub fn new(section: &LogParseSection) -> Result<Parser, String> {
        let zone = Zone::parse(&section.timezone).map_err(|e| format!("timezone: {e}"))?;
        if section
            .timestamp_format
            .as_deref()
            .is_some_and(str::is_empty)
        {
            return Err("timestamp_format: must not be empty".into());
        }
        let multiline = match &section.multiline {
            None => None,
            Some(m) => {
                let re = Regex::new(&m.start_pattern)
                    .map_err(|e| format!("multiline.start_pattern: {e}"))?;
                let t = m.timeout_seconds;
                if !(t.is_finite() && t > 0.0 && t <= 3600.0) {
                    return Err(format!(
                        "multiline.timeout_seconds: {t} is not in (0, 3600]"
                    ));
                }
                Some((re, Duration::from_secs_f64(t)))
            }
        };
        Ok(Parser {
            json: section.json,
            max_fields: section.json_max_fields,
            max_depth: section.json_max_depth,
            timestamp: section.timestamp,
            format: section.timestamp_format.clone(),
            zone,
            multiline,
        })
    }

    /// A [`Joiner`] for one file: records of at most `max_line_bytes` bytes.
    pub fn joiner(&self, max_line_bytes: usize) -> Joiner {
        match &self.multiline {
            Some((re, timeout)) => {
                Joiner::new(Some(re.clone()), *timeout, max_line_bytes, max_line_bytes)
            }
            None => Joiner::new(None, Duration::ZERO, max_line_bytes, max_line_bytes),
        }
    }

    /// Whether [`Parser::apply`] does anything.
    pub fn is_active(&self) -> bool {
        self.json || self.timestamp
    }

    /// Parses `record`'s message: JSON keys into its fields, its own time into its
    /// `timestamp_ns` (which holds the read time when called; that moves into
    /// [`READ_TIME_FIELD`]). Counts the JSON keys not kept in `counts`. Never fails: a line
    /// that does not parse is left as it is.
    pub fn apply(&self, record: &mut LogRecord, counts: &mut LogSourceCounts) {
        let read_ns = record.timestamp_ns;
        let mut own: Option<u64> = None;
        if self.json {
            if let Some((flat, value)) = flatten(&record.message, self.max_fields, self.max_depth) {
                if flat.dropped > 0 {
                    counts.add(LogEvent::JsonFieldDropped, flat.dropped);
                }
                record.fields.extend(
                    flat.fields
                        .into_iter()
                        .map(|(key, value)| Field { key, value }),
                );
                if self.timestamp {
                    own = JSON_TIME_KEYS.iter().find_map(|k| {
                        value.get(k).and_then(|v| {
                            timestamp::from_json(v, self.format.as_deref(), self.zone)
                        })
                    });
                }
            }
        }
        if self.timestamp && own.is_none() {
            own = timestamp::from_line(&record.message, self.format.as_deref(), self.zone, read_ns);
        }
        if let Some(t) = own.filter(|t| *t > 0) {
            record.timestamp_ns = t;
            record.fields.push(Field {
                key: READ_TIME_FIELD.to_owned(),
                value: rfc3339_nanos(read_ns),
            });
        }
    }
}

/// `ns` since the Unix epoch as RFC 3339 UTC with nanoseconds (`2026-12-07T01:02:03.000000001Z`).
pub fn rfc3339_nanos(ns: u64) -> String {
    DateTime::<Utc>::from_timestamp_nanos(i64::try_from(ns).unwrap_or(i64::MAX))
        .to_rfc3339_opts(SecondsFormat::Nanos, true)
}

#[cfg(test)]
mod tests;
