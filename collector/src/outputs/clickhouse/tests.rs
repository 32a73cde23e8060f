//! The sender against a local HTTP server answering canned responses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::telemetry::DropReason;
use uctel_protocol::payload::Severity;

/// A server answering the `i`-th request with `answers[i]` (the last one from then on);
/// it records each request's target and body.
struct Canned {
    url: String,
    requests: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

fn canned(answers: &'static [(u16, &'static str)]) -> Canned {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (r, s) = (requests.clone(), seen.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let i = r.fetch_add(1, Ordering::SeqCst);
            s.lock().unwrap().push((
                request_line.split(' ').nth(1).unwrap_or("").to_owned(),
                String::from_utf8_lossy(&body).into_owned(),
            ));
            let (status, text) = answers[i.min(answers.len() - 1)];
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    Canned {
        url,
        requests,
        seen,
    }
}

fn config(url: &str) -> ClickHouseConfig {
    ClickHouseConfig {
        url: url.to_owned(),
        database: Some("telemetry".into()),
        batch_send_deadline_seconds: 0.01,
        min_backoff_seconds: 0.01,
        max_backoff_seconds: 0.05,
        timeout_seconds: 5.0,
        ..ClickHouseConfig::default()
    }
}

fn records(n: usize) -> Vec<LogRecord> {
    (0..n)
        .map(|i| LogRecord {
            timestamp_ns: 1_700_000_000_000_000_000 + i as u64,
            severity: Severity::Info as i32,
            source: "/var/log/app.log".into(),
            message: format!("line {i}"),
            ..Default::default()
        })
        .collect()
}

const CTX: LogContext<'static> = LogContext {
    agent: "web-1",
    instance: "web-1.example",
    stream: 2,
    stream_seq: 1,
    frame_timestamp_ns: 0,
};

async fn settled(ch: &ClickHouse, rows: u64) -> Snapshot {
    for _ in 0..500 {
        let s = ch.snapshot().unwrap();
        if s.pending == 0 && s.rows_in == rows {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("rows not settled: {:?}", ch.snapshot());
}

#[tokio::test]
async fn bad_data_answered_500_is_dropped_and_counted_not_retried() {
    let server = canned(&[(
        500,
        "Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected { before: x",
    )]);
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&config(&server.url)), &telemetry, &sd).unwrap();
    started.handle.push(&CTX, &records(5));
    let s = settled(&started.handle, 5).await;
    assert_eq!((s.rejected, s.inserted, s.retried), (5, 0, 0));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Every row refused: the INSERT is split until each row was refused alone (2·5 − 1
    // requests), and no request is ever sent twice.
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        9,
        "the parts of a refused INSERT"
    );
    let bodies: Vec<String> = server
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, b)| b.clone())
        .collect();
    let distinct: std::collections::BTreeSet<&String> = bodies.iter().collect();
    assert_eq!(distinct.len(), bodies.len(), "a refused part sent twice");
    assert_eq!(bodies.iter().filter(|b| b.lines().count() == 1).count(), 5);
    // The output's drops, not the agent's (`crate::outputs` module docs, "Drops").
    let agent = telemetry.agent("web-1");
    assert_eq!(
        DropReason::all()
            .map(|r| agent.records_dropped(r))
            .sum::<u64>(),
        0
    );
    let (target, body) = server.seen.lock().unwrap()[0].clone();
    assert!(
        target.contains("query=INSERT+INTO+telemetry.logs+FORMAT+JSONEachRow"),
        "{target}"
    );
    assert_eq!(body.lines().count(), 5);
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(text.contains("uctel_collector_clickhouse_rows_dropped_total{reason=\"rejected\"} 5"));
    assert!(!text.contains("reason=\"clickhouse_"), "{text}");
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn server_errors_without_a_bad_data_code_are_retried_until_inserted() {
    let server = canned(&[
        (
            500,
            "Code: 241, e.displayText() = DB::Exception: Memory limit exceeded",
        ),
        // A 503 without a code may come after the rows were applied: two checks (running?
        // stored?) find them absent, then the rows go again.
        (503, "Service Unavailable"),
        (200, "0\n"),
        (200, "0\n"),
        (200, "0\n"),
        (200, "0\n"),
        (200, ""),
    ]);
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&config(&server.url)), &telemetry, &sd).unwrap();
    started.handle.push(&CTX, &records(4));
    let s = settled(&started.handle, 4).await;
    assert_eq!((s.inserted, s.dropped(), s.retried), (4, 0, 8));
    assert_eq!(server.requests.load(Ordering::SeqCst), 7);
    let seen = server.seen.lock().unwrap().clone();
    let inserts: Vec<&(String, String)> = seen
        .iter()
        .filter(|(t, _)| t.contains("query=INSERT"))
        .collect();
    assert_eq!(inserts.len(), 3);
    assert!(
        inserts.windows(2).all(|w| w[0] == w[1]),
        "a retry sends the same rows with the same query_id"
    );
    assert!(inserts[0].0.contains("query_id=uctel-"), "{}", inserts[0].0);
    let checks: Vec<&String> = seen[2..6].iter().map(|(_, b)| b).collect();
    assert!(checks[0].contains("system.processes") && checks[2].contains("system.processes"));
    assert!(checks[1].starts_with("SELECT count() FROM telemetry.logs WHERE"));
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(text.contains("uctel_collector_clickhouse_insert_checks_total{result=\"absent\"} 2"));
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn an_insert_that_timed_out_but_landed_is_not_sent_again() {
    // The INSERT's answer is lost (a 500 without a code); the check finds every row stored.
    let server = canned(&[(500, ""), (200, "0\n"), (200, "4\n"), (200, "")]);
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&config(&server.url)), &telemetry, &sd).unwrap();
    started.handle.push(&CTX, &records(4));
    let s = settled(&started.handle, 4).await;
    assert_eq!((s.inserted, s.dropped(), s.retried), (4, 0, 0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        3,
        "INSERT, two checks"
    );
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(text.contains("uctel_collector_clickhouse_insert_checks_total{result=\"landed\"} 1"));
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_dead_server_at_shutdown_leaves_every_row_counted() {
    // Nothing listens on the port: every attempt is a transport error.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = config(&format!("http://127.0.0.1:{port}/"));
    c.timeout_seconds = 0.2;
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&c), &telemetry, &sd).unwrap();
    started.handle.push(&CTX, &records(3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    started.handle.push(&CTX, &records(2));
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
    started.handle.push(&CTX, &records(1)); // After the sender stopped.
    started.handle.close();
    let s = started.handle.snapshot().unwrap();
    assert_eq!((s.rows_in, s.shutdown, s.inserted, s.pending), (6, 6, 0, 0));
    assert!(s.retried > 0);
    let agent = telemetry.agent("web-1");
    assert_eq!(
        DropReason::all()
            .map(|r| agent.records_dropped(r))
            .sum::<u64>(),
        0
    );
}

#[test]
fn the_server_version_picks_the_schema() {
    assert_eq!(schema_for("18.16"), Ok(SCHEMA));
    assert_eq!(schema_for("21.8.15"), Ok(SCHEMA));
    assert_eq!(schema_for("22"), Ok(SCHEMA_MODERN));
    assert_eq!(schema_for("26.9.2.1"), Ok(SCHEMA_MODERN));
    assert!(schema_for("latest").is_err());
    assert!(schema_for("").is_err());
    // The same columns the collector inserts, in both.
    for column in [
        "ts DateTime",
        "ts_ns UInt64",
        "stream_seq UInt64",
        "message String",
        "fields Nested(",
    ] {
        assert!(
            SCHEMA.contains(column) && SCHEMA_MODERN.contains(column),
            "{column}"
        );
    }
    assert!(SCHEMA_MODERN.contains("non_replicated_deduplication_window"));
}

/// The `INSERT` rows `server` got into `table`.
fn rows_into(server: &Canned, table: &str) -> usize {
    let want = format!("query=INSERT+INTO+telemetry.{table}+FORMAT");
    server
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(target, _)| target.contains(&want))
        .map(|(_, body)| body.lines().count())
        .sum()
}

#[tokio::test]
async fn a_reload_moves_the_rows_to_the_new_table_each_row_once() {
    let server = canned(&[(200, "")]);
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&config(&server.url)), &telemetry, &sd).unwrap();
    let handle = started.handle.clone();
    handle.push(&CTX, &records(5));
    settled(&handle, 5).await;
    let mut moved = config(&server.url);
    moved.table = "logs_v2".into();
    let (replacement, line) = handle.prepare(Some(&moved)).unwrap().unwrap();
    assert!(line.contains("(telemetry.logs): changed to"), "{line}");
    assert!(
        handle
            .prepare(Some(&config(&server.url)))
            .unwrap()
            .is_none(),
        "the configuration in force is no change"
    );
    replacement.commit();
    handle.push(&CTX, &records(3));
    let s = settled(&handle, 8).await;
    assert_eq!((s.inserted, s.dropped(), s.pending), (8, 0, 0));
    assert_eq!(rows_into(&server, "logs"), 5);
    assert_eq!(rows_into(&server, "logs_v2"), 3);
    assert!(handle.prepare(Some(&moved)).unwrap().is_none());
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
    handle.join().await;
    assert_eq!(handle.close(), 0);
}

#[tokio::test]
async fn rows_a_dead_endpoint_still_holds_when_a_reload_retires_it_are_counted_reload() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut dead = config(&format!("http://127.0.0.1:{port}/"));
    dead.timeout_seconds = 0.2;
    let server = canned(&[(200, "")]);
    let telemetry = Telemetry::new().unwrap();
    let (trigger, sd) = uctel_common::shutdown::channel();
    let started = start(Some(&dead), &telemetry, &sd).unwrap();
    let handle = started.handle.clone();
    handle.push(&CTX, &records(3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (replacement, _) = handle.prepare(Some(&config(&server.url))).unwrap().unwrap();
    replacement.commit();
    handle.push(&CTX, &records(2));
    let s = settled(&handle, 5).await;
    assert_eq!(
        (s.rows_in, s.reload, s.inserted, s.shutdown, s.pending),
        (5, 3, 2, 0, 0),
        "{s:?}"
    );
    assert_eq!(rows_into(&server, "logs"), 2);
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(
        text.contains("uctel_collector_clickhouse_rows_dropped_total{reason=\"reload\"} 3"),
        "{text}"
    );
    // Removed: nothing in force, nothing queued.
    let (replacement, line) = handle.prepare(None).unwrap().unwrap();
    assert!(line.contains("removed"), "{line}");
    replacement.commit();
    assert!(!handle.is_enabled());
    handle.push(&CTX, &records(4));
    trigger.trigger();
    for t in started.tasks {
        t.await.unwrap();
    }
    handle.join().await;
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(
        text.contains("uctel_collector_clickhouse_rows_in_total 5"),
        "nothing taken while no endpoint is in force: {text}"
    );
}
