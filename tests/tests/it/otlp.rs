//! The OTLP output against a real OpenTelemetry receiver, through the real binaries: an
//! agent tails a file and sends host metrics, the collector sends both over OTLP/HTTP
//! (protobuf, gzip) to rotel (PyPI `rotel`, a Rust OpenTelemetry collector, started once
//! for this module's one test), which exports what it received onward over OTLP/HTTP to a
//! receiver in the test ([`uctel_tests::otlp::Receiver`]). What arrives is compared field
//! by field with what the collector got from the agent:
//!
//! * every log record of the JSON Lines sink arrives once: its own time, the frame's time
//!   as observed time, severity number and text, body, source, stream and stream sequence,
//!   and the agent as resource (`host.name`, `service.instance.id`);
//! * every data point the output counted sent arrives (counts equal), each series' last
//!   point has the value the collector's `/metrics` shows for it, counters as cumulative
//!   monotonic sums, gauges as gauges;
//! * the output's sum rule holds with nothing pending.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use uctel_tests::otlp::{Mode, Receiver, Rotel};
use uctel_tests::pipeline::Pipeline;
use uctel_tests::{exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);
const LINES: usize = 3000;

fn tick() -> Duration {
    Duration::from_millis(200)
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

#[test]
fn samples_and_log_records_reach_a_real_otlp_receiver_field_by_field() {
    let _one = exclusive();
    let dir = tempfile::Builder::new()
        .prefix("uctel-otlp-")
        .tempdir()
        .unwrap();
    let capture = Receiver::start(Mode::Accept);
    let rotel = Rotel::start(dir.path(), &capture.endpoint());
    let endpoint = rotel.endpoint();
    let mut p = Pipeline::start_with(|y, _| {
        let mut m = serde_yaml::Mapping::new();
        m.insert("endpoint".into(), endpoint.clone().into());
        m.insert("batch_send_deadline_seconds".into(), 0.2.into());
        m.insert("max_items_per_request".into(), 500.into());
        y.set("outputs.otlp", serde_yaml::Value::Mapping(m));
    });
    p.add_agent("ot-a", 0.0, 1.0);
    p.wait_flowing(1, &["ot-a"], &["metrics"], UP);
    p.write_lines(0, 0, LINES);
    wait_for("every line in the sink", UP, tick(), || {
        let n = sink(&p).len();
        (n >= LINES).then_some(()).ok_or(format!("{n} lines"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    // What the collector shows while the agent runs: each of these values is a sample it
    // received, so a point of the OTLP output (which sends every sample).
    let shown = p.scrape().unwrap();
    // The agent says goodbye: no sample after this.
    p.agents[0].daemon.stop(Duration::from_secs(20));
    let settled = wait_for("the OTLP output settled", UP, tick(), || {
        let s = p.scrape()?;
        let get = |n: &str, sig: &str| {
            s.sum(&format!("uctel_collector_otlp_{n}"), &[("signal", sig)]) as u64
        };
        let pending = get("items_pending", "metrics") + get("items_pending", "logs");
        if pending > 0 {
            return Err(format!("{pending} pending"));
        }
        Ok((
            s.clone(),
            get("items_sent_total", "metrics"),
            get("items_sent_total", "logs"),
        ))
    });
    let (s, points_sent, records_sent) =
        settled.unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    for sig in ["metrics", "logs"] {
        let get = |n: &str| s.sum(&format!("uctel_collector_otlp_{n}"), &[("signal", sig)]) as u64;
        assert_eq!(
            get("items_in_total"),
            get("items_sent_total") + get("items_dropped_total"),
            "{sig}: sum rule"
        );
        assert_eq!(get("items_dropped_total"), 0, "{sig}: nothing dropped");
    }
    wait_for("rotel forwarded everything", UP, tick(), || {
        let (pts, recs) = capture.with(|h| (h.points.len() as u64, h.records.len() as u64));
        (pts >= points_sent && recs >= records_sent)
            .then_some(())
            .ok_or(format!(
                "{pts} of {points_sent} points, {recs} of {records_sent} records"
            ))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            rotel
                .log_text()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    std::thread::sleep(Duration::from_millis(500)); // nothing more should come
    let (points, records) = capture.with(|h| (h.points.clone(), h.records.clone()));
    assert_eq!(
        points.len() as u64,
        points_sent,
        "data points received = sent"
    );
    assert_eq!(
        records.len() as u64,
        records_sent,
        "log records received = sent"
    );

    // Logs: every line of the sink, once, field by field.
    let lines = sink(&p);
    assert_eq!(
        records.len(),
        lines.len(),
        "records received = lines in the sink"
    );
    let mut seen = BTreeSet::new();
    for r in &records {
        let line = lines
            .get(&r.body)
            .unwrap_or_else(|| panic!("{:?} is not a line of the sink", r.body));
        assert!(seen.insert(r.body.clone()), "{} received twice", r.body);
        let want_text = match line["severity"].as_str().unwrap() {
            "unspecified" => "",
            s => s,
        };
        assert_eq!(
            r.time_unix_nano,
            line["ts_ns"].as_u64().unwrap(),
            "{}",
            r.body
        );
        assert!(r.observed_time_unix_nano > 0, "{}", r.body);
        assert_eq!(r.severity_text, want_text, "{}", r.body);
        assert_eq!(r.resource["host.name"], line["instance"].as_str().unwrap());
        assert_eq!(r.resource["service.instance.id"], "ot-a");
        assert_eq!(
            r.attributes["uctel.source"],
            line["source"].as_str().unwrap()
        );
        assert_eq!(
            r.attributes["uctel.stream"],
            line["stream"].as_str().unwrap()
        );
        assert_eq!(
            r.attributes["uctel.stream_seq"],
            line["stream_seq"].as_u64().unwrap().to_string()
        );
    }

    // Metrics: the value /metrics showed for each series is among its points.
    let mut by_series: BTreeMap<(String, BTreeMap<String, String>), Vec<f64>> = BTreeMap::new();
    for pt in &points {
        assert_eq!(pt.resource["service.instance.id"], "ot-a");
        assert!(
            pt.kind == "gauge"
                || pt.kind == "sum monotonic=true temporality=2"
                || pt.kind == "histogram temporality=2",
            "{pt:?}"
        );
        let (series, value) = match &pt.histogram {
            Some((count, _, _)) => (format!("{}_count", pt.name), *count as f64),
            None => (pt.name.clone(), pt.value),
        };
        by_series
            .entry((series, pt.attributes.clone()))
            .or_default()
            .push(value);
    }
    assert!(by_series.len() > 10, "{} series", by_series.len());
    let mut compared = 0;
    for ((series, attrs), values) in &by_series {
        let mut m: Vec<(&str, &str)> = attrs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        m.push(("agent", "ot-a"));
        let got: Vec<f64> = shown
            .select(series, &m)
            .filter(|x| x.labels.len() == m.len() + 1) // + instance
            .map(|x| x.value)
            .collect();
        let Some(v) = got.first() else {
            continue; // a series that started after the scrape
        };
        compared += 1;
        assert!(
            values.iter().any(|x| x == v || (x.is_nan() && v.is_nan())),
            "{series}{m:?}: /metrics showed {v}, not among its OTLP points {values:?}"
        );
    }
    assert!(
        compared * 10 >= by_series.len() * 9,
        "{compared} of {} series compared",
        by_series.len()
    );
    assert!(
        rotel.log_text().contains("ot-a"),
        "rotel's debug log shows what it received"
    );
    p.collector.stop(Duration::from_secs(20));
}
