//! One journal entry as `journalctl --output=json --all` prints it, and the [`LogRecord`] it
//! becomes (sans-IO, never panics on any input).
//!
//! journalctl's JSON (systemd.journal-fields(7), "JSON format" of journalctl(1)): one object
//! per line; every value is a string, or, for a field that is not valid UTF-8, an array of
//! byte numbers, or, for a field present several times in the entry, an array of such
//! values; `__CURSOR` names the entry and `__REALTIME_TIMESTAMP` is its wall time in
//! microseconds since the Unix epoch, as decimal text.

use serde::Deserialize;
use uctel_protocol::payload::{Field, LogRecord, Severity};

/// The `source` of every journald record.
pub const SOURCE: &str = "journald";

/// The entry fields shipped as record fields, in this order, when the entry has them.
pub const SHIPPED_FIELDS: [&str; 4] = ["_SYSTEMD_UNIT", "_PID", "_COMM", "SYSLOG_IDENTIFIER"];

/// Longest shipped field value, in bytes (longer values are cut at a UTF-8 boundary): four
/// such fields fit the room a frame keeps for a record's source path
/// (`LOG_RECORD_OVERHEAD_BYTES`), so a record of `max_message_bytes` always fits a frame.
pub const MAX_FIELD_VALUE_BYTES: usize = 80;

/// A parsed journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `__CURSOR`, as journalctl printed it.
    pub cursor: String,
    /// `__REALTIME_TIMESTAMP`, microseconds since the Unix epoch (0 when absent or not a
    /// number).
    pub realtime_us: u64,
    /// Every other field: name → values (a field may repeat), lossy UTF-8.
    pub fields: Vec<(String, String)>,
}

impl Entry {
    /// The first value of field `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a line of journalctl's output is not an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Not one JSON object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// No `__CURSOR` string.
    #[error("no __CURSOR")]
    NoCursor,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Value {
    Text(String),
    Bytes(Vec<u8>),
    Many(Vec<Value>),
    Other(serde::de::IgnoredAny),
}

fn push_values(name: &str, v: Value, out: &mut Vec<(String, String)>, depth: u8) {
    match v {
        Value::Text(s) => out.push((name.to_owned(), s)),
        Value::Bytes(b) => out.push((name.to_owned(), String::from_utf8_lossy(&b).into_owned())),
        Value::Many(vs) if depth == 0 => {
            for v in vs {
                push_values(name, v, out, depth + 1);
            }
        }
        Value::Many(_) | Value::Other(_) => {}
    }
}

/// Parses one line of `journalctl --output=json` (without its `\n`).
///
/// # Errors
/// [`EntryError`] when the line is not a JSON object or names no cursor.
pub fn parse(line: &[u8]) -> Result<Entry, EntryError> {
    let map: std::collections::BTreeMap<String, Value> =
        serde_json::from_slice(line).map_err(|e| EntryError::Json(e.to_string()))?;
    let mut cursor = None;
    let mut realtime_us = 0;
    let mut fields = Vec::new();
    for (k, v) in map {
        match (k.as_str(), v) {
            ("__CURSOR", Value::Text(c)) => cursor = Some(c),
            ("__REALTIME_TIMESTAMP", Value::Text(t)) => realtime_us = t.parse().unwrap_or(0),
            (_, v) => push_values(&k, v, &mut fields, 0),
        }
    }
    Ok(Entry {
        cursor: cursor.ok_or(EntryError::NoCursor)?,
        realtime_us,
        fields,
    })
}

/// The parts of a cursor (`s=<seqnum id>;i=<seqnum, hex>;b=…;m=…;t=…;x=…`, sd_journal_get_cursor(3))
/// that name an entry's place in its journal's sequence: the sequence id and the sequence
/// number, which journald (and systemd-journal-remote) increase by one per entry written,
/// across file rotations.
pub fn cursor_seqnum(cursor: &str) -> Option<(&str, u64)> {
    let mut id = None;
    let mut seq = None;
    for part in cursor.split(';') {
        if let Some(s) = part.strip_prefix("s=") {
            id = Some(s);
        } else if let Some(i) = part.strip_prefix("i=") {
            seq = u64::from_str_radix(i, 16).ok();
        }
    }
    Some((id?, seq?))
}

/// The record's `file_id`: FNV-1a 64 of the sequence id, never 0, so the collector's replay
/// rule (per `file_id`, `end_offset` = sequence number) discards entries an agent sends
/// again after a restart.
pub fn sequence_file_id(seqnum_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seqnum_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// syslog(3) priority (`PRIORITY`, RFC 5424 §6.2.1 severities 0–7) → severity: 0–2
/// (emerg, alert, crit) fatal, 3 error, 4 warn, 5–6 (notice, info) info, 7 debug; absent
/// or not a number: unspecified.
pub fn priority_severity(priority: Option<&str>) -> Severity {
    match priority.and_then(|p| p.trim().parse::<u8>().ok()) {
        Some(0..=2) => Severity::Fatal,
        Some(3) => Severity::Error,
        Some(4) => Severity::Warn,
        Some(5 | 6) => Severity::Info,
        Some(7) => Severity::Debug,
        _ => Severity::Unspecified,
    }
}

/// `s` cut to at most `max` bytes at a UTF-8 boundary; whether it was cut.
pub fn cut(s: &mut String, max: usize) -> bool {
    if s.len() <= max {
        return false;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    true
}

/// The record of `entry`: its own time (`__REALTIME_TIMESTAMP`), severity from `PRIORITY`,
/// `MESSAGE` cut to `max_message_bytes`, the [`SHIPPED_FIELDS`] it has (values cut to
/// [`MAX_FIELD_VALUE_BYTES`]), `file_id`/`end_offset` from its cursor's sequence (0 when
/// the cursor has none). Returns the record and whether the message was cut.
pub fn to_record(entry: &Entry, max_message_bytes: usize) -> (LogRecord, bool) {
    let mut message = entry.get("MESSAGE").unwrap_or("").to_owned();
    let cut_message = cut(&mut message, max_message_bytes);
    let fields = SHIPPED_FIELDS
        .iter()
        .filter_map(|k| {
            entry.get(k).map(|v| {
                let mut value = v.to_owned();
                cut(&mut value, MAX_FIELD_VALUE_BYTES);
                Field {
                    key: (*k).to_owned(),
                    value,
                }
            })
        })
        .collect();
    let (file_id, end_offset) =
        cursor_seqnum(&entry.cursor).map_or((0, 0), |(id, seq)| (sequence_file_id(id), seq));
    let record = LogRecord {
        timestamp_ns: entry.realtime_us.saturating_mul(1_000),
        severity: priority_severity(entry.get("PRIORITY")) as i32,
        source: SOURCE.to_owned(),
        message,
        fields,
        file_id,
        end_offset,
    };
    (record, cut_message)
}

/// Whether `entry` is excluded: its `_SYSTEMD_UNIT` is one of `units`, or one of its fields
/// has a value listed for that field in `matches` (`FIELD=value` pairs).
pub fn excluded(entry: &Entry, units: &[String], matches: &[(String, String)]) -> bool {
    entry
        .fields
        .iter()
        .any(|(k, v)| k == "_SYSTEMD_UNIT" && units.iter().any(|u| u == v))
        || matches
            .iter()
            .any(|(mk, mv)| entry.fields.iter().any(|(k, v)| k == mk && v == mv))
}

/// A unit name as systemd completes it: a name without a `.` gets `.service`
/// (systemctl(1), "unit name without a suffix").
pub fn unit_name(u: &str) -> String {
    if u.contains('.') {
        u.to_owned()
    } else {
        format!("{u}.service")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"__CURSOR":"s=8a23237f56a547be8907e14db4ea84a2;i=2a;b=0123;m=3e9;t=662008e0bd855;x=a7","__REALTIME_TIMESTAMP":"1796604382926933","PRIORITY":"4","MESSAGE":"hello","_SYSTEMD_UNIT":"foo.service","_PID":"42","_COMM":"foo","SYSLOG_IDENTIFIER":"foo","_BOOT_ID":"0123"}"#;

    #[test]
    fn an_entry_becomes_a_record_with_its_own_time_priority_and_fields() {
        let e = parse(LINE.as_bytes()).unwrap();
        let (r, cut) = to_record(&e, 2048);
        assert!(!cut);
        assert_eq!(r.timestamp_ns, 1_796_604_382_926_933_000);
        assert_eq!(r.severity, Severity::Warn as i32);
        assert_eq!(r.message, "hello");
        assert_eq!(r.source, "journald");
        let f: Vec<(&str, &str)> = r
            .fields
            .iter()
            .map(|f| (f.key.as_str(), f.value.as_str()))
            .collect();
        assert_eq!(
            f,
            [
                ("_SYSTEMD_UNIT", "foo.service"),
                ("_PID", "42"),
                ("_COMM", "foo"),
                ("SYSLOG_IDENTIFIER", "foo")
            ]
        );
        assert_eq!(r.end_offset, 0x2a);
        assert_eq!(
            r.file_id,
            sequence_file_id("8a23237f56a547be8907e14db4ea84a2")
        );
    }

    #[test]
    fn binary_and_repeated_fields_and_bad_lines() {
        let e = parse(br#"{"__CURSOR":"c","MESSAGE":[104,105,255],"_PID":["1","2"],"X":null}"#)
            .unwrap();
        assert_eq!(e.get("MESSAGE"), Some("hi\u{fffd}"));
        assert_eq!(e.get("_PID"), Some("1"));
        let (r, _) = to_record(&e, 100);
        assert_eq!((r.file_id, r.end_offset, r.timestamp_ns), (0, 0, 0));
        assert_eq!(r.severity, Severity::Unspecified as i32);
        assert_eq!(parse(b"{\"MESSAGE\":\"x\"}"), Err(EntryError::NoCursor));
        assert!(parse(b"{\"__CURSOR\":").is_err());
        assert!(parse(b"[1]").is_err());
        assert!(parse(&[0xff, 0x00]).is_err());
    }

    #[test]
    fn priorities_map_like_syslog() {
        let s = |p: &str| priority_severity(Some(p));
        assert_eq!(
            ["0", "2", "3", "4", "5", "6", "7", "8", "x"].map(s),
            [
                Severity::Fatal,
                Severity::Fatal,
                Severity::Error,
                Severity::Warn,
                Severity::Info,
                Severity::Info,
                Severity::Debug,
                Severity::Unspecified,
                Severity::Unspecified
            ]
        );
    }

    #[test]
    fn long_values_are_cut_at_a_char_boundary() {
        let msg = "é".repeat(20);
        let line = format!(
            r#"{{"__CURSOR":"c","MESSAGE":"{msg}","_COMM":"{}"}}"#,
            "a".repeat(200)
        );
        let (r, cut) = to_record(&parse(line.as_bytes()).unwrap(), 5);
        assert!(cut);
        assert_eq!(r.message, "éé");
        assert_eq!(r.fields[0].value.len(), MAX_FIELD_VALUE_BYTES);
    }

    #[test]
    fn exclusions_and_unit_names() {
        let e = parse(LINE.as_bytes()).unwrap();
        assert!(excluded(&e, &["foo.service".into()], &[]));
        assert!(!excluded(&e, &["bar.service".into()], &[]));
        assert!(excluded(&e, &[], &[("_COMM".into(), "foo".into())]));
        assert!(!excluded(&e, &[], &[("_COMM".into(), "bar".into())]));
        assert_eq!(unit_name("sshd"), "sshd.service");
        assert_eq!(unit_name("a.socket"), "a.socket");
        assert_eq!(cursor_seqnum("s=ab;i=ff;b=1"), Some(("ab", 255)));
        assert_eq!(cursor_seqnum("i=ff"), None);
    }
}
