//! The `sources.logs[].parse` configuration section (see the parent module for the rules).

use serde::{Deserialize, Serialize};

/// How the lines of one `sources.logs` entry are parsed (`sources.logs[].parse`). Every part
/// is off by default: each costs CPU per line.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogParseSection {
    /// A line that is a JSON object (`{...}`) has its keys put into the record's fields, nested
    /// keys joined with `.` (`{"http":{"status":500}}` → `http.status=500`); arrays, and
    /// objects deeper than `json_max_depth`, stay JSON text in one field. The message stays
    /// the whole line. Default off.
    #[serde(default)]
    pub json: bool,
    /// At most this many fields per record from a JSON line; the keys past it are not kept
    /// and each is counted (`uctel_agent_log_events_total{reason="json_field_dropped"}`).
    /// Default 64.
    #[serde(default = "default_json_max_fields")]
    pub json_max_fields: usize,
    /// Object nesting flattened into dotted keys, at most (1 = only top-level keys); a deeper
    /// object is kept as its JSON text in the field of its dotted key (nothing lost).
    /// Default 8.
    #[serde(default = "default_json_max_depth")]
    pub json_max_depth: usize,
    /// The record's timestamp is the line's own time when the line has one: an RFC 3339 prefix
    /// (`2026-12-07T01:02:03.5Z`, also with a space for `T` and without a zone), a syslog
    /// RFC 5424 header (`<34>1 2026-12-07T01:02:03Z …`) or RFC 3164 prefix
    /// (`<34>Dec  7 01:02:03 …`, year inferred), or, with `json`, a `time`, `ts` or
    /// `@timestamp` key (RFC 3339 text, or Unix seconds, milliseconds, microseconds or
    /// nanoseconds as a number). The time the agent read the line then goes into the field
    /// `read_time` (RFC 3339 UTC, nanoseconds). A line without one keeps its read time and no
    /// `read_time` field. Default off: every record carries its read time.
    #[serde(default)]
    pub timestamp: bool,
    /// A chrono `strftime` format the line starts with (`[%d/%b/%Y:%H:%M:%S %z]` for nginx):
    /// tried first when `timestamp` is on (and for JSON time text); without a zone (`%z`) the
    /// time is in `timezone`. Default: none (only the built-in formats).
    #[serde(default)]
    pub timestamp_format: Option<String>,
    /// The time zone of line times that carry none (RFC 3164, RFC 3339 text without an
    /// offset, a `timestamp_format` without `%z`): `local` (the agent's: `TZ`, else
    /// `/etc/localtime`), `UTC`, or a fixed offset `+02:00` / `-05:30`. Default `local`.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// Joins the lines of one record (stack traces) into one message; `null` (default): one
    /// record per line.
    #[serde(default)]
    pub multiline: Option<MultilineSection>,
}

/// Multi-line records (`sources.logs[].parse.multiline`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MultilineSection {
    /// A regex (`regex` crate syntax) matched against each line: a matching line starts a new
    /// record, any other line is appended to the current one (joined with `\n`). E.g.
    /// `^\d{4}-\d{2}-\d{2}` (a line that starts with a date starts a record: the Java or
    /// Python trace a logger prints after its line joins that line) or `^\S` (a line that is
    /// not indented).
    pub start_pattern: String,
    /// A record is shipped when the next start line arrives, or once no line was added to it
    /// for this long. Default 1.
    #[serde(default = "default_multiline_timeout")]
    pub timeout_seconds: f64,
}

impl Default for LogParseSection {
    fn default() -> Self {
        Self {
            json: false,
            json_max_fields: default_json_max_fields(),
            json_max_depth: default_json_max_depth(),
            timestamp: false,
            timestamp_format: None,
            timezone: default_timezone(),
            multiline: None,
        }
    }
}

fn default_json_max_fields() -> usize {
    64
}
fn default_json_max_depth() -> usize {
    8
}
fn default_timezone() -> String {
    "local".to_owned()
}
fn default_multiline_timeout() -> f64 {
    1.0
}
