//! One log record as a `JSONEachRow` row of the table in `config/clickhouse/logs.sql`: the
//! JSON Lines sink's fields ([`LogLine`]), with `ts` in whole seconds (a `DateTime`) and
//! `fields` as the `Nested(key, value)` column's two arrays.

use serde::Serialize;

use crate::logsink::LogLine;

#[derive(Serialize)]
struct Row<'a> {
    ts: u32,
    ts_ns: u64,
    agent: &'a str,
    instance: &'a str,
    stream: &'a str,
    stream_seq: u64,
    severity: &'a str,
    source: &'a str,
    message: &'a str,
    #[serde(rename = "fields.key")]
    keys: Vec<&'a str>,
    #[serde(rename = "fields.value")]
    values: Vec<&'a str>,
}

/// `ts` of the row: whole seconds of `ts_ns`, at most the last second a `DateTime` holds
/// (2106-02-07 06:28:15 UTC; a later timestamp stays exact in `ts_ns`).
pub fn ts_seconds(ts_ns: u64) -> u32 {
    u32::try_from(ts_ns / 1_000_000_000).unwrap_or(u32::MAX)
}

/// The row of `line`, one JSON object without a newline.
pub fn encode(line: &LogLine<'_>) -> Vec<u8> {
    let (keys, values) = line
        .fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
        .unzip();
    let row = Row {
        ts: ts_seconds(line.ts_ns),
        ts_ns: line.ts_ns,
        agent: line.agent,
        instance: line.instance,
        stream: &line.stream,
        stream_seq: line.stream_seq,
        severity: line.severity,
        source: line.source,
        message: line.message,
        keys,
        values,
    };
    // Serializing strings and numbers into a Vec cannot fail.
    serde_json::to_vec(&row).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logsink::{encode_line, LogContext};
    use uctel_protocol::payload::{Field, LogRecord, Severity};

    #[test]
    fn a_row_carries_the_json_lines_fields_with_the_same_values() {
        let ctx = LogContext {
            agent: "web-1",
            instance: "web-1.example",
            stream: 2,
            stream_seq: 41,
            frame_timestamp_ns: 1_700_000_000_123_456_789,
        };
        let record = LogRecord {
            timestamp_ns: 0,
            severity: Severity::Error as i32,
            source: "/var/log/app.log".into(),
            message: "disk \"full\"\n\u{1} é".into(),
            fields: vec![
                Field {
                    key: "unit".into(),
                    value: "cron".into(),
                },
                Field {
                    key: "pid".into(),
                    value: "42".into(),
                },
            ],
            ..Default::default()
        };
        let jsonl: serde_json::Value = serde_json::from_slice(&encode_line(&ctx, &record)).unwrap();
        let row: serde_json::Value =
            serde_json::from_slice(&encode(&LogLine::new(&ctx, &record))).unwrap();
        for key in [
            "ts_ns",
            "agent",
            "instance",
            "stream",
            "stream_seq",
            "severity",
            "source",
            "message",
        ] {
            assert_eq!(row[key], jsonl[key], "{key}");
        }
        assert_eq!(row["ts"], 1_700_000_000u32);
        assert_eq!(jsonl["ts"], "2023-11-14T22:13:20.123456789Z");
        let fields: serde_json::Map<String, serde_json::Value> = row["fields.key"]
            .as_array()
            .unwrap()
            .iter()
            .zip(row["fields.value"].as_array().unwrap())
            .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
            .collect();
        assert_eq!(serde_json::Value::Object(fields), jsonl["fields"]);
        assert_eq!(row.as_object().unwrap().len(), 11);
    }

    #[test]
    fn seconds_beyond_datetime_are_capped() {
        assert_eq!(ts_seconds(u64::MAX), u32::MAX);
        assert_eq!(ts_seconds(1_999_999_999), 1);
    }
}
