//! The status API (`GET /api/v1/status`, `docs/status-api.md`) and the `uctel` tool over
//! it, through the real binaries: a collector with two agents, one of them behind the soft
//! transport's fault injector (10 % of packets dropped), the other on a clean link.
//!
//! * Both daemons' documents agree with their `/metrics`: each counter in the document lies
//!   between a scrape just before and one just after it (the counters only grow), the
//!   session fields with what the collector logged at the `Welcome`, the agent's files with
//!   the file on disk.
//! * `uctel top` runs in a tmux pane of 80 columns, as an operator over SSH would see it:
//!   the captured pane shows the lossy agent first (sorted by loss) with its loss, the
//!   clean one with none, the totals and the sum rule; a key press re-sorts; `q` quits.
//! * `uctel top --once --json` and `uctel status --json` print the document; `uctel status`
//!   a summary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use uctel_testkit::exposition::Scrape;
use uctel_tests::pipeline::{connected_epochs, Pipeline};
use uctel_tests::{bins, exclusive, wait_for};

const UP: Duration = Duration::from_secs(60);

fn tick() -> Duration {
    Duration::from_millis(250)
}

fn status(addr: std::net::SocketAddr) -> Result<Value, String> {
    let body = uctel_testkit::http::get(&format!("http://{addr}/api/v1/status"))?;
    serde_json::from_str(&body).map_err(|e| format!("not JSON: {e}: {body}"))
}

fn scrape(addr: std::net::SocketAddr) -> Scrape {
    uctel_testkit::exposition::scrape(addr).unwrap_or_else(|e| panic!("{e}"))
}

/// A pipeline with `lossy` (10 % of its packets dropped) and `clean`, both shipping host
/// metrics every 0.2 s and tailing their own log file, with lines written.
fn pipeline() -> Pipeline {
    let mut p = Pipeline::start();
    let lossy = p.add_agent("lossy", 0.1, 0.2);
    let clean = p.add_agent("clean", 0.0, 0.2);
    p.wait_flowing(2, &["lossy", "clean"], &["metrics"], UP);
    p.write_lines(lossy, 0, 300);
    p.write_lines(clean, 0, 300);
    p
}

/// `lo ≤ v ≤ hi`, named.
fn between(what: &str, lo: f64, v: &Value, hi: f64) {
    let v = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(
        lo <= v && v <= hi,
        "{what}: {v} not within the scrapes before and after ({lo} ..= {hi})"
    );
}

#[test]
fn the_status_documents_agree_with_metrics_on_both_daemons() {
    let _g = exclusive();
    let p = pipeline();
    let addr = p.metrics_addr();
    // Loss shows once frames leave the reorder window (about a second).
    let doc = wait_for("loss of the lossy agent in the status", UP, tick(), || {
        let d = status(addr)?;
        let lossy = d["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["agent"] == "lossy"))
            .ok_or_else(|| "no lossy agent".to_owned())?;
        if lossy["last_10s"]["frames_lost"].as_u64().unwrap_or(0) > 0 {
            Ok(d)
        } else {
            Err(format!("no loss yet: {}", lossy["last_10s"]))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["daemon"], "uctel-collector");
    assert_eq!(doc["totals"]["agents_connected"], 2);

    let before = scrape(addr);
    let d = status(addr).unwrap();
    let after = scrape(addr);
    for id in ["lossy", "clean"] {
        let a = d["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["agent"] == id)
            .unwrap_or_else(|| panic!("{id} missing: {d}"));
        assert_eq!(a["state"], "connected", "{a}");
        assert_eq!(a["lanes"], serde_json::json!(["uc"]), "{a}");
        assert!(a["data_path"].is_string(), "{a}");
        let epochs = connected_epochs(&p.collector.log(), id);
        assert_eq!(
            Some(a["epoch"].as_str().unwrap_or("")),
            epochs.last().map(String::as_str),
            "the epoch the collector logged at the Welcome"
        );
        let ag = [("agent", id)];
        for (field, metric) in [
            ("frames_received", "uctel_collector_frames_received_total"),
            ("records_received", "uctel_collector_records_received_total"),
            ("frames_lost", "uctel_collector_frames_lost_total"),
            ("records_lost", "uctel_collector_records_lost_total"),
            ("frames_sent", "uctel_collector_agent_frames_sent_total"),
            ("records_sent", "uctel_collector_agent_records_sent_total"),
        ] {
            between(
                &format!("{id} total.{field}"),
                before.sum(metric, &ag),
                &a["total"][field],
                after.sum(metric, &ag),
            );
        }
        let s = &a["sum_rule"];
        let n = |k: &str| s[k].as_i64().unwrap_or_else(|| panic!("{k}: {s}"));
        assert_eq!(
            n("counted"),
            n("received") + n("lost") + n("dropped") + n("replayed"),
            "{s}"
        );
        assert_eq!(n("sent"), n("counted") + n("unsettled"), "{s}");
        assert_eq!(n("produced"), n("sent") + n("agent_dropped"), "{s}");
        between(
            &format!("{id} sum_rule.received"),
            before.sum("uctel_collector_records_received_total", &ag),
            &s["received"],
            after.sum("uctel_collector_records_received_total", &ag),
        );
        assert!(a["credit"]["window_frames"].as_u64().is_some(), "{a}");
        assert!(a["frames_per_second"].as_f64().unwrap() > 0.0, "{a}");
    }
    let lossy = &d["agents"].as_array().unwrap()[1];
    let clean = &d["agents"].as_array().unwrap()[0];
    assert_eq!(
        (lossy["agent"].as_str(), clean["agent"].as_str()),
        (Some("lossy"), Some("clean"))
    );
    assert!(
        lossy["loss_ratio_last_10s"].as_f64().unwrap() > 0.0,
        "{lossy}"
    );
    assert_eq!(clean["total"]["frames_lost"], 0, "{clean}");
    assert_eq!(clean["loss_ratio_last_10s"], 0.0, "{clean}");

    // The agent's own document.
    let i = 0;
    let agent_addr = p.agents[i].options.metrics;
    let log_file = p.agents[i].options.log_file.clone();
    let size = std::fs::metadata(&log_file).unwrap().len();
    let doc = wait_for("the agent read its file", UP, tick(), || {
        let d = status(agent_addr)?;
        let f = d["sources"]["files"]
            .as_array()
            .and_then(|f| {
                f.iter()
                    .find(|f| f["path"] == log_file.display().to_string())
            })
            .cloned()
            .ok_or_else(|| format!("file not listed: {}", d["sources"]))?;
        if f["offset_bytes"] == size {
            Ok(d)
        } else {
            Err(format!("{f}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["daemon"], "uctel-agent");
    assert_eq!(doc["agent_id"], "lossy");
    assert_eq!(doc["collector"]["connected"], true);
    assert_eq!(
        doc["collector"]["address"].as_str(),
        Some(p.addrs.control.to_string().as_str())
    );
    let f = doc["sources"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == log_file.display().to_string())
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(f["inode"], std::fs::metadata(&log_file).unwrap().ino());
    assert_eq!(
        (f["size_bytes"].as_u64(), f["lag_bytes"].as_u64()),
        (Some(size), Some(0))
    );
    assert!(
        doc["credit"]["window_frames"].as_u64().unwrap_or(0) > 0,
        "{doc}"
    );
    let before = scrape(agent_addr);
    let d = status(agent_addr).unwrap();
    let after = scrape(agent_addr);
    for s in d["streams"].as_array().unwrap() {
        let st = [("stream", s["stream"].as_str().unwrap())];
        between(
            "records_sent",
            before.sum("uctel_agent_records_sent_total", &st),
            &s["records_sent"],
            after.sum("uctel_agent_records_sent_total", &st),
        );
    }
}

/// A tmux server of this test's own (its socket named after the process), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(tag: &str) -> Tmux {
        Tmux {
            socket: format!("uctel-test-{tag}-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux (scripts/install-deps installs it): {e}"));
        assert!(
            out.status.success() || args[0] == "has-session",
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn alive(&self, session: &str) -> bool {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(["has-session", "-t", session])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn capture(&self, session: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", session])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

fn cli() -> PathBuf {
    bins::path(bins::CLI)
}

/// The pane's rows for `agent` (a line starting with its id).
fn row<'a>(pane: &'a str, agent: &str) -> Option<(usize, &'a str)> {
    pane.lines()
        .enumerate()
        .find(|(_, l)| l.split_whitespace().next() == Some(agent))
}

fn loss_column(line: &str) -> f64 {
    // AGENT UP FRAMES/s RECORDS/s LOSS% LOST DROPPED LAG
    line.split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no loss column in {line:?}"))
}

#[test]
fn uctel_top_in_an_80_column_tmux_pane_shows_the_lossy_agent_first() {
    let _g = exclusive();
    let p = pipeline();
    let tmux = Tmux::new("top");
    let cmd = format!("{} top --url {}", cli().display(), p.metrics_addr());
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "80",
        "-y",
        "30",
        &cmd,
    ]);
    let pane = wait_for("uctel top shows both agents with loss", UP, tick(), || {
        let pane = tmux.capture("top");
        let (Some((li, lossy)), Some((ci, clean))) = (row(&pane, "lossy"), row(&pane, "clean"))
        else {
            return Err(format!("rows missing:\n{pane}"));
        };
        if loss_column(lossy) > 0.0 && li < ci {
            let _ = clean;
            Ok(pane)
        } else {
            Err(format!("not yet sorted by loss:\n{pane}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));
    println!("uctel top, 80 columns:\n{pane}");
    for l in pane.lines() {
        assert!(l.chars().count() <= 80, "wider than the pane: {l:?}");
    }
    assert!(pane.starts_with("uctel top · uctel-collector"), "{pane}");
    assert!(pane.contains("sort loss"), "{pane}");
    let (_, clean) = row(&pane, "clean").unwrap();
    assert_eq!(loss_column(clean), 0.0, "{pane}");
    assert!(
        pane.lines()
            .any(|l| l.starts_with("TOTAL 2 agents") && l.split_whitespace().nth(3) == Some("2")),
        "{pane}"
    );
    // The sum at the bottom adds up as printed.
    let flat = pane.replace("\n  ", " ");
    let sum = flat
        .lines()
        .find(|l| l.starts_with("Records since start: received "))
        .unwrap_or_else(|| panic!("no sum rule: {pane}"));
    let figures: Vec<u64> = sum
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(';').parse().ok())
        .collect();
    assert!(figures.len() >= 6, "{sum}");
    assert_eq!(
        figures[0] + figures[1] + figures[2] + figures[3],
        figures[4],
        "{sum}"
    );
    // The figures move: the next refresh (1 s) shows other rates or counts.
    std::thread::sleep(Duration::from_millis(2500));
    let later = tmux.capture("top");
    assert_ne!(pane, later, "the view did not refresh");
    if std::env::var_os("UCTEL_SAVE_TOP").is_some() {
        // For the README's picture: a full ten-second window.
        std::thread::sleep(Duration::from_secs(10));
        save_picture(&tmux.capture("top"));
    }
    // `r` sorts by rate.
    tmux.run(&["send-keys", "-t", "top", "r"]);
    wait_for("re-sorted by rate", Duration::from_secs(10), tick(), || {
        let pane = tmux.capture("top");
        pane.contains("sort rate").then_some(()).ok_or(pane)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    tmux.run(&["send-keys", "-t", "top", "q"]);
    wait_for("q quits", Duration::from_secs(10), tick(), || {
        (!tmux.alive("top"))
            .then_some(())
            .ok_or_else(|| "still running".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Keeps the captured pane for the README picture when `UCTEL_SAVE_TOP` names a file.
fn save_picture(pane: &str) {
    if let Some(path) = std::env::var_os("UCTEL_SAVE_TOP") {
        let _ = std::fs::write(Path::new(&path), pane);
    }
}

#[test]
fn an_output_that_cannot_deliver_shows_its_pending_samples_and_last_error() {
    let _g = exclusive();
    // Nothing listens there: every request fails to connect and is retried.
    let url = format!("http://{}/api/v1/write", uctel_tests::net::free_addr());
    let mut p = Pipeline::start_with(|y, _| {
        let mut e = serde_yaml::Mapping::new();
        e.insert("url".into(), url.clone().into());
        y.set(
            "outputs.remote_write",
            serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(e)]),
        );
    });
    p.add_agent("rw", 0.0, 0.5);
    p.wait_flowing(1, &["rw"], &["metrics"], UP);
    let addr = p.metrics_addr();
    let out = wait_for("the output's last error", UP, tick(), || {
        let d = status(addr)?;
        let o = d["outputs"][0].clone();
        if o["last_error"]["error"].is_string() && o["pending"].as_u64().unwrap_or(0) > 0 {
            Ok(o)
        } else {
            Err(format!("{o}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));
    assert_eq!(out["kind"], "remote_write");
    assert_eq!(out["url"], url.as_str());
    assert_eq!(out["delivered"], 0, "{out}");
    let error = out["last_error"]["error"].as_str().unwrap();
    assert!(
        p.collector.log().contains(error),
        "the error the collector logged: {error}"
    );
    let u = [("url", url.as_str())];
    let before = scrape(addr);
    let d = status(addr).unwrap();
    let after = scrape(addr);
    let o = &d["outputs"][0];
    between(
        "items_in",
        before.sum("uctel_collector_remote_write_samples_in_total", &u),
        &o["items_in"],
        after.sum("uctel_collector_remote_write_samples_in_total", &u),
    );
    // items_in = delivered + dropped + pending; the families are read one after another
    // (by name: `samples_in_total` before `samples_pending`), so a sample queued in between
    // can only add to the right side.
    let dropped: u64 = o["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        o["items_in"].as_u64().unwrap()
            <= o["delivered"].as_u64().unwrap() + dropped + o["pending"].as_u64().unwrap(),
        "{o}"
    );
    let summary = Command::new(cli())
        .args(["status", "--url", &addr.to_string()])
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&summary.stdout);
    assert!(
        summary.contains(&format!("output remote_write {url}: 0 samples delivered"))
            && summary.contains("; last error: "),
        "{summary}"
    );
}

#[test]
fn the_agent_shows_its_scrape_targets_and_fast_counters() {
    let _g = exclusive();
    let mut p = Pipeline::start();
    let collector_metrics = format!("http://{}/metrics", p.metrics_addr());
    let closed = format!("http://{}/metrics", uctel_tests::net::free_addr());
    let counter = p.path().join("fast-counter");
    std::fs::write(&counter, "42\n").unwrap();
    let target = |url: &str| {
        let mut m = serde_yaml::Mapping::new();
        m.insert("url".into(), url.into());
        m.insert("interval_seconds".into(), 0.5.into());
        serde_yaml::Value::Mapping(m)
    };
    let mut fast = serde_yaml::Mapping::new();
    fast.insert("path".into(), counter.display().to_string().into());
    fast.insert("name".into(), "uctel_test_fast_counter".into());
    let i = p.add_agent_with("scraper", 0.0, 1.0, |y| {
        y.set(
            "sources.scrape",
            serde_yaml::Value::Sequence(vec![target(&collector_metrics), target(&closed)]),
        )
        .set("sources.fast_counters.interval_milliseconds", 20)
        .set("sources.fast_counters.samples_per_record", 20)
        .set(
            "sources.fast_counters.counters",
            serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(fast)]),
        );
    });
    p.wait_flowing(1, &["scraper"], &["metrics"], UP);
    let addr = p.agents[i].options.metrics;
    let doc = wait_for("both targets scraped twice", UP, tick(), || {
        let d = status(addr)?;
        let t = d["sources"]["scrape_targets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if t.len() == 2 && t.iter().all(|t| t["scrapes"].as_u64().unwrap_or(0) >= 2) {
            Ok(d)
        } else {
            Err(format!("{}", d["sources"]))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[i].daemon.log_tail(20)));
    let targets = doc["sources"]["scrape_targets"].as_array().unwrap();
    let up = targets
        .iter()
        .find(|t| t["url"] == collector_metrics.as_str())
        .unwrap();
    let down = targets
        .iter()
        .find(|t| t["url"] == closed.as_str())
        .unwrap();
    assert_eq!(
        (up["up"].as_u64(), up["error"].is_null()),
        (Some(1), true),
        "{up}"
    );
    assert!(up["last_duration_seconds"].as_f64().unwrap() > 0.0, "{up}");
    assert_eq!(down["up"], 0, "{down}");
    let reason = down["error"].as_str().unwrap_or_else(|| panic!("{down}"));
    let reason = reason.split(':').next().unwrap();
    assert!(
        doc["sources"]["errors"]["scrape"][reason]
            .as_u64()
            .unwrap_or(0)
            >= 2,
        "the failed scrapes counted under {reason}: {}",
        doc["sources"]
    );
    let before = scrape(addr);
    let d = status(addr).unwrap();
    let after = scrape(addr);
    let fc = &d["sources"]["fast_counters"];
    between(
        "fast_counters.samples",
        before.sum("uctel_agent_fast_samples_total", &[]),
        &fc["samples"],
        after.sum("uctel_agent_fast_samples_total", &[]),
    );
    assert!(fc["samples"].as_u64().unwrap() > 0, "{fc}");
    assert!(fc["lateness_mean_seconds"].as_f64().is_some(), "{fc}");
    between(
        "source_errors scrape",
        before.sum(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", reason)],
        ),
        &d["sources"]["errors"]["scrape"][reason],
        after.sum(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", reason)],
        ),
    );
    let out = Command::new(cli())
        .args(["top", "--once", "--url", &addr.to_string()])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        top.lines()
            .any(|l| l.contains("scrape") && l.contains("DOWN")),
        "{top}"
    );
    assert!(top.lines().any(|l| l.starts_with("  error: ")), "{top}");
    assert!(top.lines().any(|l| l.starts_with("fast_counters")), "{top}");
}

#[test]
fn uctel_once_json_and_status_print_the_documents() {
    let _g = exclusive();
    let p = pipeline();
    wait_for("loss counted", UP, tick(), || {
        let s = p.scrape()?;
        (s.sum("uctel_collector_frames_lost_total", &[("agent", "lossy")]) > 0.0)
            .then_some(())
            .ok_or("no loss yet".to_owned())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str]| {
        let out = Command::new(cli())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("uctel: {e}"));
        assert!(
            out.status.success(),
            "uctel {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let url = p.metrics_addr().to_string();
    for args in [
        vec!["top", "--once", "--json", "--url", url.as_str()],
        vec!["status", "--json", "--url", url.as_str()],
    ] {
        let doc: Value =
            serde_json::from_str(&run(&args)).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["daemon"], "uctel-collector");
        assert_eq!(doc["agents"].as_array().map(Vec::len), Some(2), "{doc}");
    }
    let once = run(&["top", "--once", "--url", &url]);
    let (li, _) = row(&once, "lossy").unwrap_or_else(|| panic!("{once}"));
    let (ci, _) = row(&once, "clean").unwrap_or_else(|| panic!("{once}"));
    assert!(li < ci, "sorted by loss: {once}");
    let summary = run(&["status", "--url", &url]);
    assert!(summary.contains("2 of 2 agents connected"), "{summary}");
    assert!(
        summary.contains("agent lossy: connected from 127.0.0.1:"),
        "{summary}"
    );
    // Against an agent: its files and collector.
    let agent_url = format!("http://{}", p.agents[0].options.metrics);
    let summary = run(&["status", "--url", &agent_url]);
    let log_file = p.agents[0].options.log_file.display().to_string();
    assert!(
        summary.contains(&format!("file {log_file}: inode ")),
        "{summary}"
    );
    assert!(summary.contains("(connected,"), "{summary}");
    let top = run(&["top", "--once", "--sort", "lag", "--url", &agent_url]);
    assert!(top.contains("agent lossy · collector "), "{top}");
    assert!(
        top.lines()
            .any(|l| l.contains("file") && l.contains("tail")),
        "{top}"
    );
    // A daemon that is not there: exit 1 with the reason.
    let out = Command::new(cli())
        .args(["status", "--url", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"));
}
