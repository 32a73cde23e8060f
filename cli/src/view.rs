//! Status documents (`docs/status-api.md`) as lines of text: [`top`] for `uctel top`,
//! [`summary`] for `uctel status`. Pure: a document in, lines out; a field missing from the
//! document reads as 0 or empty, never a panic.

use serde_json::Value;

use crate::SortKey;

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn int(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| v.as_f64().map_or(0, |f| f.max(0.0) as u64))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Σ of an object of counts (`{"reason": n}`).
fn total(v: &Value) -> u64 {
    v.as_object().map_or(0, |m| m.values().map(int).sum())
}

/// `{"a": 3, "b": 0}` → `a 3` (non-zero entries, largest first), or `none`.
fn reasons(maps: &[&Value]) -> String {
    let mut all: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for m in maps {
        if let Some(o) = m.as_object() {
            for (k, v) in o {
                *all.entry(k.clone()).or_insert(0) += int(v);
            }
        }
    }
    let mut v: Vec<(String, u64)> = all.into_iter().filter(|(_, n)| *n > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if v.is_empty() {
        return "none".to_owned();
    }
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `12345` → `12.3k`; whole numbers below 10 000 as they are.
#[allow(clippy::cast_precision_loss)]
fn short(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=9_999_999 => format!("{:.1}k", n as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Bytes, binary units.
#[allow(clippy::cast_precision_loss)]
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Seconds as `1h02m`, `3m04s`, `5s`.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The last `width` characters of `s`, with `…` in front when cut.
fn tail(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_owned();
    }
    let keep: String = s.chars().skip(n - (width - 1)).collect();
    format!("…{keep}")
}

/// `s` cut to `width` characters, with `…` at the end when cut.
fn head(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let keep: String = s.chars().take(width - 1).collect();
    format!("{keep}…")
}

/// Words joined into lines of at most `width` characters.
fn wrap(words: &[String], indent: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    for w in words {
        if !line.is_empty() && line.chars().count() + 1 + w.chars().count() > width {
            out.push(std::mem::take(&mut line));
            line.push_str(indent);
        } else if !line.is_empty() && !line.ends_with(' ') {
            line.push(' ');
        }
        line.push_str(w);
    }
    if !line.trim().is_empty() {
        out.push(line);
    }
    out
}

fn sort_name(k: SortKey) -> &'static str {
    match k {
        SortKey::Loss => "loss",
        SortKey::Rate => "rate",
        SortKey::Drops => "drops",
        SortKey::Lag => "lag",
    }
}

/// The `uctel top` view of `doc`, at most `width` (≥ 80 recommended) characters a line:
/// one row per agent of a collector or per source of an agent, sorted by `sort` (largest
/// first, then by name), totals and the sum rule at the bottom.
pub fn top(doc: &Value, sort: SortKey, width: usize) -> Vec<String> {
    let width = width.max(60);
    let mut out = vec![format!(
        "uctel top · {} {} · up {} · window {:.0}s · sort {}",
        text(&doc["daemon"]),
        text(&doc["daemon_version"]),
        duration(num(&doc["uptime_seconds"])),
        num(&doc["window_seconds"]),
        sort_name(sort)
    )];
    if text(&doc["daemon"]) == "uctel-agent" {
        agent_top(doc, sort, width, &mut out);
    } else {
        collector_top(doc, sort, width, &mut out);
    }
    out.iter().map(|l| head(l, width)).collect()
}

fn drops_10s(a: &Value) -> u64 {
    total(&a["last_10s"]["frames_dropped"]) + total(&a["last_10s"]["agent_frames_dropped"])
}

fn collector_top(doc: &Value, sort: SortKey, width: usize, out: &mut Vec<String>) {
    let row = |c: [&str; 8]| {
        format!(
            "{:<18} {:<4} {:>8} {:>9} {:>7} {:>7} {:>8} {:>7}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        )
    };
    out.push(row([
        "AGENT",
        "UP",
        "FRAMES/s",
        "RECORDS/s",
        "LOSS%",
        "LOST",
        "DROPPED",
        "LAG",
    ]));
    let mut agents: Vec<&Value> = doc["agents"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().collect());
    let key = |a: &Value| -> f64 {
        match sort {
            SortKey::Loss => num(&a["loss_ratio_last_10s"]),
            SortKey::Rate => num(&a["records_per_second"]),
            #[allow(clippy::cast_precision_loss)]
            SortKey::Drops => drops_10s(a) as f64,
            #[allow(clippy::cast_precision_loss)]
            SortKey::Lag => int(&a["lag_frames"]) as f64,
        }
    };
    agents.sort_by(|a, b| {
        key(b)
            .total_cmp(&key(a))
            .then_with(|| text(&a["agent"]).cmp(text(&b["agent"])))
    });
    for a in &agents {
        let lag = if a["lag_frames"].is_null() {
            "-".to_owned()
        } else {
            short(int(&a["lag_frames"]))
        };
        out.push(row([
            &head(text(&a["agent"]), 18),
            if text(&a["state"]) == "connected" {
                "yes"
            } else {
                "no"
            },
            &format!("{:.1}", num(&a["frames_per_second"])),
            &format!("{:.1}", num(&a["records_per_second"])),
            &format!("{:.2}", 100.0 * num(&a["loss_ratio_last_10s"])),
            &short(int(&a["last_10s"]["frames_lost"])),
            &short(drops_10s(a)),
            &lag,
        ]));
    }
    if agents.is_empty() {
        out.push("  (no agent has connected yet)".to_owned());
    }
    let t = &doc["totals"];
    let lost = int(&t["last_10s"]["frames_lost"]);
    let received = int(&t["last_10s"]["frames_received"]);
    #[allow(clippy::cast_precision_loss)]
    let loss = if lost + received == 0 {
        0.0
    } else {
        100.0 * lost as f64 / (lost + received) as f64
    };
    let lag: u64 = agents.iter().map(|a| int(&a["lag_frames"])).sum();
    out.push(row([
        &format!("TOTAL {} agents", agents.len()),
        &int(&t["agents_connected"]).to_string(),
        &format!("{:.1}", num(&t["frames_per_second"])),
        &format!("{:.1}", num(&t["records_per_second"])),
        &format!("{loss:.2}"),
        &short(lost),
        &short(drops_10s(t)),
        &short(lag),
    ]));
    out.push(format!(
        "LOST, DROPPED: frames in the last {:.0} s; LAG: frames sent, not consumed yet",
        num(&doc["window_seconds"])
    ));
    out.extend(sum_rule(&t["sum_rule"], width));
    out.extend(wrap(
        &[
            "Dropped by reason (10 s):".into(),
            reasons(&[
                &t["last_10s"]["frames_dropped"],
                &t["last_10s"]["agent_frames_dropped"],
            ]),
        ],
        "  ",
        width,
    ));
    for o in doc["outputs"].as_array().into_iter().flatten() {
        out.push(format!(
            "{} {}: {:.1}/s, pending {}, dropped {}{}",
            text(&o["kind"]),
            tail(text(&o["url"]), 32),
            num(&o["delivered_per_second"]),
            short(int(&o["pending"])),
            short(total(&o["dropped"])),
            if o["last_error"]["error"].is_string() {
                ", FAILING"
            } else {
                ""
            }
        ));
        if let Some(e) = o["last_error"]["error"].as_str() {
            out.push(format!("  last error: {e}"));
        }
    }
}

/// The records sum of README "Loss accounting" (`sum_rule` of the document).
fn sum_rule(s: &Value, width: usize) -> Vec<String> {
    let words: Vec<String> = vec![
        "Records since start:".into(),
        format!("received {}", int(&s["received"])),
        format!("+ lost {}", int(&s["lost"])),
        format!("+ dropped {}", int(&s["dropped"])),
        format!("+ replayed {}", int(&s["replayed"])),
        format!("= {} counted;", int(&s["counted"])),
        format!("sent {}", int(&s["sent"])),
        "(agents' heartbeats, up to one interval behind)".into(),
    ];
    wrap(&words, "  ", width)
}

struct SourceRow {
    name: String,
    kind: &'static str,
    state: String,
    progress: String,
    lag: u64,
    lag_text: String,
    detail: Option<String>,
}

fn agent_top(doc: &Value, sort: SortKey, width: usize, out: &mut Vec<String>) {
    let c = &doc["collector"];
    out.push(format!(
        "agent {} · collector {} · {}",
        text(&doc["agent_id"]),
        c["address"].as_str().unwrap_or("-"),
        if c["connected"].as_bool() == Some(true) {
            "connected"
        } else {
            "NOT CONNECTED"
        }
    ));
    let row = |c: [&str; 5]| {
        format!(
            "{:<38} {:<6} {:<5} {:>12} {:>12}",
            c[0], c[1], c[2], c[3], c[4]
        )
    };
    out.push(row(["SOURCE", "KIND", "STATE", "READ", "LAG"]));
    let mut rows = source_rows(&doc["sources"]);
    rows.sort_by(|a, b| {
        let by_lag = if sort == SortKey::Lag {
            b.lag.cmp(&a.lag)
        } else {
            std::cmp::Ordering::Equal
        };
        by_lag.then_with(|| a.name.cmp(&b.name))
    });
    for r in &rows {
        out.push(row([
            &tail(&r.name, 38),
            r.kind,
            &r.state,
            &r.progress,
            &r.lag_text,
        ]));
        if let Some(d) = &r.detail {
            out.push(format!("  {}", head(d, width - 2)));
        }
    }
    if rows.is_empty() {
        out.push("  (no file, scrape target or fast counter yet)".to_owned());
    }
    let mut sent = 0;
    let mut dropped = 0;
    let mut queued = 0;
    let mut rate = 0.0;
    for s in doc["streams"].as_array().into_iter().flatten() {
        sent += int(&s["records_sent"]);
        dropped += total(&s["records_dropped"]);
        queued += int(&s["queue_records"]);
        rate += num(&s["records_per_second"]);
        out.push(format!(
            "stream {:<13} {:>8.1} rec/s  sent {:>7}  dropped {:>6}  queued {:>6}",
            text(&s["stream"]),
            num(&s["records_per_second"]),
            short(int(&s["records_sent"])),
            short(total(&s["records_dropped"])),
            short(int(&s["queue_records"]))
        ));
    }
    out.extend(wrap(
        &[
            format!("TOTAL {rate:.1} rec/s; records taken:"),
            format!("sent {sent}"),
            format!("+ dropped {dropped}"),
            format!("+ queued {queued}"),
            format!("= {}", sent + dropped + queued),
        ],
        "  ",
        width,
    ));
    out.extend(wrap(
        &[
            "Dropped by reason (10 s):".into(),
            reasons(&[&doc["drops_last_10s"]]),
        ],
        "  ",
        width,
    ));
    if let Some(cr) = doc["credit"].as_object() {
        out.push(format!(
            "credit: window {} frames, outstanding {}, available {}",
            int(&cr["window_frames"]),
            int(&cr["outstanding_frames"]),
            int(&cr["available_frames"])
        ));
    }
}

fn source_rows(s: &Value) -> Vec<SourceRow> {
    let mut rows = Vec::new();
    for f in s["files"].as_array().into_iter().flatten() {
        let lag = int(&f["lag_bytes"]);
        rows.push(SourceRow {
            name: text(&f["path"]).to_owned(),
            kind: "file",
            state: if f["rotated"].as_bool() == Some(true) {
                "rot".into()
            } else {
                "tail".into()
            },
            progress: bytes(int(&f["offset_bytes"])),
            lag,
            lag_text: bytes(lag),
            detail: None,
        });
    }
    for t in s["scrape_targets"].as_array().into_iter().flatten() {
        let up = int(&t["up"]) == 1;
        rows.push(SourceRow {
            name: text(&t["url"]).to_owned(),
            kind: "scrape",
            state: if up { "up".into() } else { "DOWN".into() },
            progress: format!("{:.0} ms", 1000.0 * num(&t["last_duration_seconds"])),
            lag: 0,
            lag_text: "-".into(),
            detail: t["error"].as_str().map(|e| format!("error: {e}")),
        });
    }
    if let Some(fc) = s["fast_counters"].as_object() {
        rows.push(SourceRow {
            name: "fast_counters".into(),
            kind: "fast",
            state: short(int(&fc["missed_rounds"])),
            progress: short(int(&fc["samples"])),
            lag: 0,
            lag_text: format!(
                "{:.2} ms",
                1000.0 * num(&fc["lateness_mean_seconds_last_10s"])
            ),
            detail: None,
        });
    }
    rows
}

/// The `uctel status` summary of `doc`.
pub fn summary(doc: &Value) -> Vec<String> {
    if text(&doc["daemon"]) == "uctel-agent" {
        return agent_summary(doc);
    }
    let t = &doc["totals"];
    let agents: Vec<&Value> = doc["agents"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().collect());
    let mut out = vec![
        format!(
            "{} {}, up {}, {} of {} agents connected{}",
            text(&doc["daemon"]),
            text(&doc["daemon_version"]),
            duration(num(&doc["uptime_seconds"])),
            int(&t["agents_connected"]),
            agents.len(),
            if doc["draining"].as_bool() == Some(true) {
                ", DRAINING"
            } else {
                ""
            }
        ),
        format!(
            "credit budget: {} of {} frames claimed",
            int(&doc["credit_claimed_frames"]),
            int(&doc["credit_budget_frames"])
        ),
    ];
    for a in agents {
        let connected = text(&a["state"]) == "connected";
        let lanes: Vec<&str> = a["lanes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.push(format!(
            "agent {}: {}{}",
            text(&a["agent"]),
            text(&a["state"]),
            if connected {
                format!(
                    " from {} ({}), epoch {}, {} on {}, for {}",
                    text(&a["peer"]),
                    text(&a["hostname"]),
                    text(&a["epoch"]),
                    text(&a["data_path"]),
                    lanes.join("+"),
                    duration(num(&a["connected_seconds"]))
                )
            } else {
                String::new()
            }
        ));
        out.push(format!(
            "  {:.1} frames/s, {:.1} records/s; last 10 s: loss {:.2}%, {} frames lost, dropped: {}",
            num(&a["frames_per_second"]),
            num(&a["records_per_second"]),
            100.0 * num(&a["loss_ratio_last_10s"]),
            int(&a["last_10s"]["frames_lost"]),
            reasons(&[&a["last_10s"]["frames_dropped"], &a["last_10s"]["agent_frames_dropped"]])
        ));
        for l in sum_rule(&a["sum_rule"], 78) {
            out.push(format!("  {l}"));
        }
    }
    for o in doc["outputs"].as_array().into_iter().flatten() {
        out.push(format!(
            "output {} {}: {} {} delivered ({:.1}/s), {} pending, dropped: {}{}",
            text(&o["kind"]),
            text(&o["url"]),
            int(&o["delivered"]),
            text(&o["items"]),
            num(&o["delivered_per_second"]),
            int(&o["pending"]),
            reasons(&[&o["dropped"]]),
            o["last_error"]["error"]
                .as_str()
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default()
        ));
    }
    out
}

fn agent_summary(doc: &Value) -> Vec<String> {
    let c = &doc["collector"];
    let mut out = vec![format!(
        "{} {} \"{}\", up {}, collector {} ({}, {} reconnects)",
        text(&doc["daemon"]),
        text(&doc["daemon_version"]),
        text(&doc["agent_id"]),
        duration(num(&doc["uptime_seconds"])),
        c["address"].as_str().unwrap_or("-"),
        if c["connected"].as_bool() == Some(true) {
            "connected"
        } else {
            "not connected"
        },
        int(&c["reconnects"])
    )];
    if let Some(cr) = doc["credit"].as_object() {
        out.push(format!(
            "credit: window {} frames (granted {}), outstanding {}, available {}",
            int(&cr["window_frames"]),
            int(&cr["granted_window_frames"]),
            int(&cr["outstanding_frames"]),
            int(&cr["available_frames"])
        ));
    }
    for s in doc["streams"].as_array().into_iter().flatten() {
        out.push(format!(
            "stream {}: {} records sent ({:.1}/s), {} queued, dropped: {}",
            text(&s["stream"]),
            int(&s["records_sent"]),
            num(&s["records_per_second"]),
            int(&s["queue_records"]),
            reasons(&[&s["records_dropped"]])
        ));
    }
    let src = &doc["sources"];
    for f in src["files"].as_array().into_iter().flatten() {
        out.push(format!(
            "file {}: inode {}, fingerprint {}, offset {} of {}, lag {}",
            text(&f["path"]),
            int(&f["inode"]),
            text(&f["fingerprint"]),
            int(&f["offset_bytes"]),
            int(&f["size_bytes"]),
            bytes(int(&f["lag_bytes"]))
        ));
    }
    for t in src["scrape_targets"].as_array().into_iter().flatten() {
        out.push(format!(
            "scrape {}: up {}, {:.3} s{}",
            text(&t["url"]),
            int(&t["up"]),
            num(&t["last_duration_seconds"]),
            t["error"]
                .as_str()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        ));
    }
    if let Some(fc) = src["fast_counters"].as_object() {
        out.push(format!(
            "fast counters: {} samples, {} missed rounds, lateness {:.3} ms (last 10 s)",
            int(&fc["samples"]),
            int(&fc["missed_rounds"]),
            1000.0 * num(&fc["lateness_mean_seconds_last_10s"])
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector_doc() -> Value {
        serde_json::json!({
            "version": 1, "daemon": "uctel-collector", "daemon_version": "0.1.0",
            "uptime_seconds": 75.0, "window_seconds": 10.0, "draining": false,
            "credit_budget_frames": 1000, "credit_claimed_frames": 40,
            "agents": [
                {"agent": "quiet", "state": "connected", "frames_per_second": 2.0,
                 "records_per_second": 50.0, "loss_ratio_last_10s": 0.0, "lag_frames": 1,
                 "last_10s": {"frames_lost": 0, "frames_received": 20,
                              "frames_dropped": {}, "agent_frames_dropped": {}},
                 "sum_rule": {"sent": 10, "received": 10, "lost": 0, "dropped": 0,
                              "replayed": 0, "counted": 10, "unsettled": 0}},
                {"agent": "a-very-long-agent-name-that-is-cut", "state": "connected",
                 "frames_per_second": 9.0, "records_per_second": 90.0,
                 "loss_ratio_last_10s": 0.1, "lag_frames": 5,
                 "last_10s": {"frames_lost": 9, "frames_received": 81,
                              "frames_dropped": {"ring_overrun": 2},
                              "agent_frames_dropped": {"no_credit": 3}},
                 "sum_rule": {"sent": 100, "received": 80, "lost": 10, "dropped": 0,
                              "replayed": 0, "counted": 90, "unsettled": 10}}
            ],
            "totals": {"agents_connected": 2, "frames_per_second": 11.0,
                       "records_per_second": 140.0,
                       "last_10s": {"frames_lost": 9, "frames_received": 101,
                                    "frames_dropped": {"ring_overrun": 2},
                                    "agent_frames_dropped": {"no_credit": 3}},
                       "sum_rule": {"sent": 110, "received": 90, "lost": 10,
                                    "dropped": 0, "replayed": 0, "counted": 100,
                                    "unsettled": 10}},
            "outputs": [{"kind": "remote_write", "url": "http://127.0.0.1:9090/api/v1/write",
                         "delivered_per_second": 12.5, "pending": 3, "dropped": {"queue_full": 4}}]
        })
    }

    #[test]
    fn collector_top_fits_80_columns_sorts_and_sums() {
        let lines = top(&collector_doc(), SortKey::Loss, 80);
        for l in &lines {
            assert!(l.chars().count() <= 80, "{l:?}");
        }
        let rows: Vec<&String> = lines.iter().filter(|l| l.contains("yes ")).collect();
        assert!(rows[0].starts_with("a-very-long-agent…"), "{lines:#?}");
        assert!(rows[1].starts_with("quiet"), "{lines:#?}");
        assert!(rows[0].contains("10.00"), "{}", rows[0]);
        let total = lines
            .iter()
            .find(|l| l.starts_with("TOTAL 2 agents"))
            .unwrap();
        assert!(total.contains("8.18"), "9 of 110 frames: {total}");
        let all = lines.join("\n");
        let flat = all.replace("\n  ", " ");
        assert!(
            flat.contains("received 90 + lost 10 + dropped 0 + replayed 0 = 100 counted; sent 110"),
            "{all}"
        );
        assert!(all.contains("no_credit 3, ring_overrun 2"), "{all}");
        assert!(all.contains("remote_write"), "{all}");
        // Sorted by rate, the quiet agent stays second (50 < 90 records/s); by lag too.
        let by_rate = top(&collector_doc(), SortKey::Rate, 80);
        assert!(by_rate[2].starts_with("a-very"), "{by_rate:#?}");
    }

    #[test]
    fn an_empty_or_odd_document_renders_without_panicking() {
        for doc in [
            serde_json::json!({}),
            serde_json::json!({"daemon": "uctel-agent"}),
            serde_json::json!({"agents": "nope", "totals": 3}),
            serde_json::json!({"daemon": "uctel-agent", "sources": {"files": [{}]}, "streams": [1]}),
        ] {
            for k in [SortKey::Loss, SortKey::Rate, SortKey::Drops, SortKey::Lag] {
                let lines = top(&doc, k, 80);
                assert!(lines.iter().all(|l| l.chars().count() <= 80), "{lines:#?}");
            }
            let _ = summary(&doc);
        }
    }

    #[test]
    fn agent_top_lists_sources_sorted_by_lag() {
        let doc = serde_json::json!({
            "daemon": "uctel-agent", "agent_id": "h", "collector": {"address": "c:7400", "connected": true},
            "streams": [{"stream": "logs", "records_sent": 10, "records_per_second": 1.0,
                         "queue_records": 2, "records_dropped": {"source_overflow": 1}}],
            "drops_last_10s": {"source_overflow": 1},
            "sources": {"files": [
                {"path": "/var/log/a.log", "offset_bytes": 10, "lag_bytes": 0},
                {"path": "/var/log/b.log", "offset_bytes": 10, "lag_bytes": 4096}],
                "scrape_targets": [{"url": "http://x/metrics", "up": 0,
                                    "last_duration_seconds": 0.25, "error": "connect: refused"}]}
        });
        let lines = top(&doc, SortKey::Lag, 80);
        let all = lines.join("\n");
        let b = all.find("/var/log/b.log").unwrap();
        let a = all.find("/var/log/a.log").unwrap();
        assert!(b < a, "{all}");
        assert!(all.contains("4.0 KiB"), "{all}");
        assert!(
            all.contains("DOWN") && all.contains("error: connect: refused"),
            "{all}"
        );
        assert!(all.contains("sent 10 + dropped 1 + queued 2 = 13"), "{all}");
        assert!(
            lines
                .iter()
                .all(|l| l.chars().count() <= 80 && !l.ends_with('…')),
            "{all}"
        );
    }
}
