//! The ClickHouse log output against a real ClickHouse server, through the real binaries:
//! two agents tail files, the collector writes every record to its JSON Lines file and to
//! ClickHouse (`config/collector-clickhouse.yaml`, table from `config/clickhouse/logs.sql`).
//!
//! * 10,000 lines land in the table exactly once each, every column equal to the JSON
//!   Lines sink's field.
//! * ClickHouse restarted (SIGTERM, start again) mid-run: every line is in the table or
//!   counted dropped by the collector; duplicates only from retried `INSERT`s.
//!
//! * Rows ClickHouse refuses (a value longer than its `FixedString` column) are dropped
//!   and logged one by one; the other rows of their `INSERT`s are inserted.
//!
//! * ClickHouse frozen (SIGSTOP) with `INSERT`s in flight for longer than the output's
//!   `timeout_seconds`, then resumed: every line is in the table exactly once (the sender
//!   asks whether a timed-out `INSERT` landed before sending it again).
//!
//! One server for the four phases (starting takes seconds); they run in one test, in turn.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use uctel_tests::clickhouse::ClickHouse;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::{exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const STOP: Duration = Duration::from_secs(20);

fn tick() -> Duration {
    Duration::from_millis(200)
}

/// A collector writing to `table` of `ch` and its JSON Lines file, with agents `ids`.
fn pipeline(ch: &ClickHouse, table: &str, ids: &[&str]) -> Pipeline {
    pipeline_with(ch, table, ids, &[])
}

/// [`pipeline`] with more `outputs.clickhouse` keys.
fn pipeline_with(
    ch: &ClickHouse,
    table: &str,
    ids: &[&str],
    extra: &[(&str, serde_yaml::Value)],
) -> Pipeline {
    let schema =
        std::fs::read_to_string(uctel_tests::workspace_root().join("config/clickhouse/logs.sql"))
            .expect("config/clickhouse/logs.sql");
    let create = schema.replace(
        "CREATE TABLE IF NOT EXISTS logs",
        &format!("CREATE TABLE IF NOT EXISTS {table}"),
    );
    assert!(
        schema.contains("CREATE TABLE IF NOT EXISTS logs\n"),
        "the schema's CREATE TABLE line changed"
    );
    ch.query(&create).unwrap_or_else(|e| panic!("{e}"));
    let example = uctel_tests::configs::Yaml::example("collector-clickhouse.yaml");
    let mut p = Pipeline::start_with(|y, _| {
        let mut c = example
            .get("outputs.clickhouse")
            .cloned()
            .expect("the example has outputs.clickhouse");
        if let serde_yaml::Value::Mapping(m) = &mut c {
            m.insert("url".into(), ch.url().into());
            m.insert("table".into(), table.into());
            m.insert("max_rows_per_insert".into(), 1000.into());
            m.insert("batch_send_deadline_seconds".into(), 0.2.into());
            m.insert("min_backoff_seconds".into(), 0.05.into());
            m.insert("max_backoff_seconds".into(), 0.5.into());
            for (k, v) in extra {
                m.insert((*k).into(), v.clone());
            }
        }
        y.set("outputs.clickhouse", c);
    });
    for id in ids {
        p.add_agent(id, 0.0, 60.0);
    }
    p.wait_flowing(ids.len(), ids, &["metrics"], UP);
    p
}

/// The JSON Lines sink's records: message → its line.
fn sink(p: &Pipeline) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(p.path().join("collector-logs.jsonl")).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("sink line {line:?}: {e}"));
        let m = v["message"].as_str().expect("message").to_owned();
        assert!(out.insert(m.clone(), v).is_none(), "{m} twice in the sink");
    }
    out
}

/// Rows of `table`: message → rows with it.
fn rows(ch: &ClickHouse, table: &str) -> BTreeMap<String, Vec<Value>> {
    let text = ch
        .query_with(&format!(
            "SELECT ts_ns, toUnixTimestamp(ts) AS ts, agent, instance, stream, stream_seq, severity, source, message, fields.key, fields.value FROM {table} FORMAT JSONEachRow"
        ), &[("output_format_json_quote_64bit_integers", "0")])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("row {line:?}: {e}"));
        out.entry(v["message"].as_str().expect("message").to_owned())
            .or_default()
            .push(v);
    }
    out
}

fn count(ch: &ClickHouse, table: &str) -> u64 {
    ch.query(&format!("SELECT count() FROM {table}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The ClickHouse output's counter `name` (summed over labels matching `m`).
fn counter(p: &Pipeline, name: &str, m: &[(&str, &str)]) -> u64 {
    p.scrape().map(|s| s.sum(name, m) as u64).unwrap_or(0)
}

/// Waits until the output took `sent` rows in and has none pending (inserted or dropped).
fn wait_settled(p: &Pipeline, ch: &ClickHouse, sent: u64) {
    wait_for("every line settled", UP, tick(), || {
        let s = p.scrape()?;
        let rows_in = s.sum("uctel_collector_clickhouse_rows_in_total", &[]) as u64;
        let pending = s.sum("uctel_collector_clickhouse_rows_pending", &[]) as u64;
        (rows_in == sent && pending == 0)
            .then_some(())
            .ok_or(format!("{rows_in} in, {pending} pending"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", p.collector.log_tail(30), ch.log_tail()));
}

fn write(p: &Pipeline, per_agent: usize, start: usize) {
    for i in 0..p.agents.len() {
        p.write_lines(i, start, per_agent);
    }
}

fn stop(mut p: Pipeline) {
    for a in &mut p.agents {
        a.daemon.stop(STOP);
    }
    p.collector.stop(STOP);
}

#[test]
fn log_lines_land_in_clickhouse_once_with_the_json_lines_fields_and_survive_a_restart() {
    let _one = exclusive();
    let mut ch = ClickHouse::start();

    // Phase 1: 10,000 lines through two agents, exactly once, fields equal.
    let p = pipeline(&ch, "logs", &["ch-a", "ch-b"]);
    write(&p, 5000, 0);
    wait_for("10,000 rows in ClickHouse", UP, tick(), || {
        let n = count(&ch, "logs");
        let pending = counter(&p, "uctel_collector_clickhouse_rows_pending", &[]);
        (n >= 10_000 && pending == 0)
            .then_some(())
            .ok_or(format!("{n} rows, {pending} pending"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    let lines = sink(&p);
    let table = rows(&ch, "logs");
    assert_eq!(lines.len(), 10_000, "JSON Lines sink");
    assert_eq!(table.len(), 10_000, "distinct rows");
    assert_eq!(count(&ch, "logs"), 10_000, "a row inserted twice");
    for (message, line) in &lines {
        let row = &table
            .get(message)
            .unwrap_or_else(|| panic!("{message} not in ClickHouse"))[0];
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
            assert_eq!(row[key], line[key], "{key} of {message}");
        }
        assert_eq!(
            row["ts"].as_u64(),
            line["ts_ns"].as_u64().map(|ns| ns / 1_000_000_000),
            "ts of {message}"
        );
        let fields: serde_json::Map<String, Value> = row["fields.key"]
            .as_array()
            .expect("keys")
            .iter()
            .zip(row["fields.value"].as_array().expect("values"))
            .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), v.clone()))
            .collect();
        assert_eq!(Value::Object(fields), line["fields"], "fields of {message}");
    }
    assert_eq!(
        counter(&p, "uctel_collector_clickhouse_rows_dropped_total", &[]),
        0
    );
    assert_eq!(
        counter(&p, "uctel_collector_clickhouse_rows_inserted_total", &[]),
        10_000
    );
    stop(p);

    // Phase 2: ClickHouse restarted while lines flow.
    let p = pipeline(&ch, "logs_restart", &["ch-r"]);
    write(&p, 3000, 0);
    std::thread::sleep(Duration::from_millis(300));
    ch.stop();
    write(&p, 3000, 3000);
    std::thread::sleep(Duration::from_secs(1));
    ch.restart();
    write(&p, 2000, 6000);
    let sent = 8000u64;
    wait_settled(&p, &ch, sent);
    assert_eq!(sink(&p).len(), sent as usize, "JSON Lines sink");
    let table = rows(&ch, "logs_restart");
    let s = p.scrape().expect("scrape");
    let dropped = s.sum("uctel_collector_clickhouse_rows_dropped_total", &[]) as u64;
    let per_agent: u64 = [
        "clickhouse_rejected",
        "clickhouse_queue_full",
        "clickhouse_shutdown",
    ]
    .iter()
    .map(|r| {
        s.count(
            "uctel_collector_records_dropped_total",
            &[("agent", "ch-r"), ("reason", r)],
        )
    })
    .sum();
    let retried = s.sum("uctel_collector_clickhouse_rows_retried_total", &[]) as u64;
    let inserted = s.sum("uctel_collector_clickhouse_rows_inserted_total", &[]) as u64;
    let total = count(&ch, "logs_restart");
    println!(
        "restart: {sent} sent, {} distinct rows ({total} in all), {inserted} inserted, {dropped} dropped, {retried} retried",
        table.len()
    );
    // An output's drops are the output's, not the agent's `records_dropped_total`
    // (README, ClickHouse output): the line is in the JSON Lines sink.
    assert_eq!(per_agent, 0, "ClickHouse drops counted for the agent");
    assert_eq!(
        table.len() as u64 + dropped,
        sent,
        "a line neither in ClickHouse nor counted dropped"
    );
    assert_eq!(inserted + dropped, sent);
    assert!(
        retried > 0,
        "the restart caused no retry: the test proves nothing"
    );
    assert!(
        total - table.len() as u64 <= retried,
        "duplicates beyond what retries explain"
    );
    stop(p);

    // Phase 3: rows ClickHouse refuses (a message longer than its FixedString column) cost
    // only themselves: the other rows of their INSERTs are inserted.
    let narrow = "logs_narrow";
    ch.query(&format!(
        "CREATE TABLE {narrow} (ts DateTime, ts_ns UInt64, agent String, instance String, \
         stream String, stream_seq UInt64, severity String, source String, \
         message FixedString(32), fields Nested(key String, value String)) \
         ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY (agent, ts)"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let p = pipeline(&ch, narrow, &["ch-n"]);
    let (good, bad) = (3000usize, [17usize, 1500, 2999]);
    let mut text = String::new();
    for k in 0..good {
        if bad.contains(&k) {
            text.push_str(&format!(
                "line {k} is longer than the thirty-two bytes the column allows\n"
            ));
        } else {
            text.push_str(&format!("short line {k}\n"));
        }
    }
    {
        use std::io::Write;
        let path = &p.agents[0].options.log_file;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        f.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    wait_settled(&p, &ch, good as u64);
    let s = p.scrape().expect("scrape");
    let refused = s.sum(
        "uctel_collector_clickhouse_rows_dropped_total",
        &[("reason", "rejected")],
    ) as u64;
    let inserted = s.sum("uctel_collector_clickhouse_rows_inserted_total", &[]) as u64;
    let stored = count(&ch, narrow);
    println!(
        "narrow column: {good} lines, {inserted} inserted, {stored} stored, {refused} refused"
    );
    assert_eq!(refused, bad.len() as u64, "rows refused");
    assert_eq!(inserted, (good - bad.len()) as u64, "rows inserted");
    assert_eq!(stored, inserted, "rows in the table");
    let log = p.collector.log_tail(400);
    let logged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ClickHouse refused a row") && l.contains("agent ch-n"))
        .collect();
    assert_eq!(
        logged.len(),
        bad.len(),
        "one log line per refused row:\n{log}"
    );
    assert!(
        logged.iter().all(|l| l.contains("stream_seq")),
        "{logged:?}"
    );
    stop(p);

    // Phase 4: ClickHouse frozen (SIGSTOP) while INSERTs are in flight, four times longer
    // than the output's timeout_seconds, then resumed (SIGCONT): the frozen server applies
    // the requests it had buffered once it runs, so a blind retry would store rows twice.
    let frozen = "logs_frozen";
    let p = pipeline_with(&ch, frozen, &["ch-f"], &[("timeout_seconds", 1.0.into())]);
    write(&p, 2000, 0);
    wait_for("the first lines inserted", UP, tick(), || {
        let n = counter(&p, "uctel_collector_clickhouse_rows_inserted_total", &[]);
        (n > 0).then_some(()).ok_or(format!("{n} inserted"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    ch.freeze();
    write(&p, 2000, 2000);
    std::thread::sleep(Duration::from_secs(2));
    write(&p, 2000, 4000);
    std::thread::sleep(Duration::from_secs(2));
    ch.resume();
    write(&p, 2000, 6000);
    let sent = 8000u64;
    wait_settled(&p, &ch, sent);
    // Let whatever the server still had buffered land before counting.
    std::thread::sleep(Duration::from_secs(2));
    let s = p.scrape().expect("scrape");
    let rows_in = s.sum("uctel_collector_clickhouse_rows_in_total", &[]) as u64;
    let inserted = s.sum("uctel_collector_clickhouse_rows_inserted_total", &[]) as u64;
    let dropped = s.sum("uctel_collector_clickhouse_rows_dropped_total", &[]) as u64;
    let pending = s.sum("uctel_collector_clickhouse_rows_pending", &[]) as u64;
    let retried = s.sum("uctel_collector_clickhouse_rows_retried_total", &[]) as u64;
    let checks = s.sum("uctel_collector_clickhouse_insert_checks_total", &[]) as u64;
    let landed = s.sum(
        "uctel_collector_clickhouse_insert_checks_total",
        &[("result", "landed")],
    ) as u64;
    let table = rows(&ch, frozen);
    let total = count(&ch, frozen);
    let twice: Vec<(&String, usize)> = table
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(m, v)| (m, v.len()))
        .take(5)
        .collect();
    println!(
        "frozen: {sent} sent, {} distinct rows ({total} in all), {inserted} inserted, {dropped} dropped, {retried} retried, {checks} checks ({landed} landed)",
        table.len()
    );
    assert_eq!(
        rows_in,
        inserted + dropped + pending,
        "rows_in = inserted + dropped + pending"
    );
    assert_eq!(
        total - table.len() as u64,
        0,
        "rows stored twice, e.g. {twice:?}"
    );
    assert_eq!(table.len() as u64, sent, "lines missing from ClickHouse");
    assert_eq!((inserted, dropped), (sent, 0), "inserted, dropped");
    assert_eq!(sink(&p).len(), sent as usize, "JSON Lines sink");
    assert!(
        checks > 0,
        "no INSERT of unknown outcome was checked: the freeze caught none in flight"
    );
    stop(p);
    ch.stop();
}
