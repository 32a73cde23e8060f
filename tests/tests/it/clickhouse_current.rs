//! The ClickHouse output's schemas and rows on a current ClickHouse: ClickHouse 26.9 run
//! in-process through PyPI's chdb-core (`scripts/install-deps` installs it in its own
//! virtual environment; a missing one fails the test).
//!
//! For each schema `uctel-collector --print-clickhouse-schema` prints (the one for 18.16 and
//! later, and the one of `--server-version 26`), the `CREATE TABLE` runs as printed, then
//! the `INSERT … FORMAT JSONEachRow` the collector sends, its body built by the collector's
//! own row encoder (`outputs::clickhouse::row::encode`, one row per line), is run twice, as
//! a retry after a lost answer would. Read back, every column equals what was sent; the
//! modern schema stores the repeated block once (`non_replicated_deduplication_window`)
//! and its `time` column is `ts_ns` to the nanosecond; the 18.16 schema keeps both copies.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use uctel_collector::logsink::{LogContext, LogLine};
use uctel_collector::outputs::clickhouse::row;
use uctel_protocol::payload::{Field, LogRecord, Severity};

/// Python of the chdb-core virtual environment `scripts/install-deps` creates.
const PYTHON: &str = "/opt/uctel-test-tools/chdb/bin/python";

/// Runs the DDL (argv 1), the `INSERT` with the body of argv 2 twice, in a chdb session
/// in argv 3; prints the server version, then the rows as JSONEachRow.
const SCRIPT: &str = r#"
import sys
from chdb import session
ddl, body, path, extra = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3], sys.argv[4]
s = session.Session(path)
s.query(ddl)
for _ in range(2):
    s.query("INSERT INTO logs FORMAT JSONEachRow\n" + body)
print(s.query("SELECT version()", "TSV"), end="")
print(s.query("SELECT ts_ns, toUnixTimestamp(ts) AS ts, agent, instance, stream, stream_seq, "
              "severity, source, message, fields.key, fields.value" + extra +
              " FROM logs ORDER BY ts_ns SETTINGS output_format_json_quote_64bit_integers = 0",
              "JSONEachRow"), end="")
"#;

/// Records with what JSON and SQL escaping must carry through.
fn records(now_ns: u64) -> Vec<LogRecord> {
    let messages = [
        "plain line",
        "quotes \" and ' and back\\slash \\n not a newline",
        "a real\nnewline, a tab\t, a control \u{1} and é ✓ 😀",
        "",
        "{\"json\": [1, 2]} FORMAT JSONEachRow; DROP TABLE logs",
    ];
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| LogRecord {
            timestamp_ns: now_ns + i as u64 * 1_000_000_007,
            severity: Severity::Warn as i32,
            source: format!("/var/log/app-{i}.log"),
            message: (*m).to_owned(),
            fields: (0..i)
                .map(|k| Field {
                    key: format!("key'{k}"),
                    value: format!("value \"{k}\"\n"),
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

fn schema(args: &[&str]) -> String {
    let out = Command::new(uctel_tests::bins::path(uctel_tests::bins::COLLECTOR))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("uctel-collector: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 schema")
}

/// Runs the script; the server version and the rows read back.
fn run(dir: &Path, ddl: &str, body: &[u8], extra: &str) -> (String, Vec<Value>) {
    std::fs::write(dir.join("ddl.sql"), ddl).unwrap();
    std::fs::write(dir.join("body.jsonl"), body).unwrap();
    std::fs::write(dir.join("run.py"), SCRIPT).unwrap();
    let session = dir.join("session");
    let out = Command::new(PYTHON)
        .arg(dir.join("run.py"))
        .arg(dir.join("ddl.sql"))
        .arg(dir.join("body.jsonl"))
        .arg(&session)
        .arg(extra)
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON}: {e} (install chdb-core: scripts/install-deps)"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chdb failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let version = lines.next().unwrap_or_default().to_owned();
    let rows = lines
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("row {l:?}: {e}")))
        .collect();
    (version, rows)
}

#[test]
fn both_schemas_take_the_collectors_rows_on_clickhouse_26() {
    // Within the modern schema's 30-day TTL: rows older than that are not stored.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        - 3_600_000_000_000;
    let recs = records(now_ns);
    let ctx = LogContext {
        agent: "web-1",
        instance: "web-1.example",
        stream: 2,
        stream_seq: 41,
        frame_timestamp_ns: now_ns,
    };
    let sent: Vec<Value> = recs
        .iter()
        .map(|r| serde_json::from_slice(&row::encode(&LogLine::new(&ctx, r))).unwrap())
        .collect();
    // The body as the sender writes it: each row, then a newline.
    let mut body = Vec::new();
    for r in &recs {
        body.extend_from_slice(&row::encode(&LogLine::new(&ctx, r)));
        body.push(b'\n');
    }

    let old = schema(&["--print-clickhouse-schema"]);
    let old_too = schema(&["--print-clickhouse-schema", "--server-version", "18.16"]);
    let modern = schema(&["--print-clickhouse-schema", "--server-version", "26"]);
    assert_eq!(old, old_too);
    assert_ne!(old, modern);

    for (name, ddl, extra, copies) in [
        ("18.16 schema", &old, "", 2usize),
        (
            "modern schema",
            &modern,
            ", toUnixTimestamp64Nano(time) AS time_ns",
            1,
        ),
    ] {
        let dir = tempfile::Builder::new()
            .prefix("uctel-chdb-")
            .tempdir()
            .unwrap();
        let (version, rows) = run(dir.path(), ddl, &body, extra);
        println!(
            "{name}: ClickHouse {version}, {} rows read back for {} sent twice",
            rows.len(),
            sent.len()
        );
        assert!(
            version
                .split('.')
                .next()
                .and_then(|m| m.parse::<u32>().ok())
                >= Some(22),
            "not a current ClickHouse: {version}"
        );
        assert_eq!(rows.len(), sent.len() * copies, "{name}: rows stored");
        for (i, got) in rows.iter().enumerate() {
            let want = &sent[i / copies];
            for key in [
                "ts_ns",
                "ts",
                "agent",
                "instance",
                "stream",
                "stream_seq",
                "severity",
                "source",
                "message",
                "fields.key",
                "fields.value",
            ] {
                assert_eq!(got[key], want[key], "{name}: {key} of row {i}");
            }
            if !extra.is_empty() {
                assert_eq!(got["time_ns"], want["ts_ns"], "{name}: time of row {i}");
            }
        }
    }
}
