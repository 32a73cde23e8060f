//! The scrape source's limits through the real `uctel-agent` and `uctel-collector` binaries,
//! against small HTTP targets started by the test (`uctel_tests::targets`):
//! - **body_size_limit**: a target streaming 200 MB chunked, without `Content-Length`, to a
//!   target with a 4 MiB limit: the scrape fails as `body_too_large`, `up` is 0, the rest is
//!   never read, and the agent's peak RSS grows by less than twice the limit plus a margin.
//! - **timestamps**: samples stamped 65 min in the past, 1 h in the future and in seconds
//!   instead of milliseconds are refused and counted by reason, those beside them delivered;
//!   with `honor_timestamps: false` every one is delivered, stamped at scrape time.
//! - **duplicates**: a series given twice keeps its first value, the repeat counted.
//! - **instance**: two targets without `job` arrive as two `up` series, one per `host:port`.
//!
//! Counts are made exact by closing a target (it answers 404 from then on) and waiting until
//! the agent counted that failure: scrapes of one target run one after the other, so every
//! answer the target served before has been counted by then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uctel_tests::exposition::Scrape;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::targets::{self, Answer, Target};

/// Labels the collector adds or renames, left out of the series keys compared.
const ADDED: [&str; 4] = ["agent", "instance", "exported_instance", "job"];

/// Milliseconds since the Unix epoch, by this machine's clock (the agent's and the
/// targets' too).
fn now_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `sources.scrape` from YAML flow text.
fn yaml(text: &str) -> serde_yaml::Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `uctel_agent_source_errors_total{source="scrape",reason}` at agent `i`.
fn scrape_errors(p: &Pipeline, i: usize, reason: &str) -> u64 {
    p.agents[i]
        .scrape()
        .unwrap_or_else(|e| panic!("{e}"))
        .count(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", reason)],
        )
}

/// The series of `agent`'s job `job` at the collector: `name{labels}` (without [`ADDED`]) →
/// (value, the timestamp in ms written after it, if any), read from the exposition text.
fn at_collector(c: &Scrape, agent: &str, job: &str) -> BTreeMap<String, (f64, Option<i64>)> {
    let (want_agent, want_job) = (format!("agent={agent:?}"), format!("job={job:?}"));
    let mut out = BTreeMap::new();
    for line in c.text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, rest)) = line.rsplit_once('}') else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let labels: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
        if !labels.contains(&want_agent.as_str()) || !labels.contains(&want_job.as_str()) {
            continue;
        }
        let kept: Vec<&str> = labels
            .into_iter()
            .filter(|l| !ADDED.iter().any(|a| l.starts_with(&format!("{a}="))))
            .collect();
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        let ts = fields.next().and_then(|t| t.parse().ok());
        out.insert(format!("{name}{{{}}}", kept.join(",")), (value, ts));
    }
    out
}

/// Waits until the collector holds `up` = `want` for `agent`'s job `job`.
fn wait_up(p: &Pipeline, agent: &str, job: &str, want: f64) {
    uctel_tests::wait_for(
        &format!("up {want} for job {job} at the collector"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let s = at_collector(&p.scrape()?, agent, job);
            match s.get("up{}") {
                Some((v, _)) if *v == want => Ok(()),
                other => Err(format!("up {other:?}")),
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
}

/// Closes `target` (404 from now on, through `closed`) and waits until agent 0 counted one
/// more `http_status` failure: every answer the target served before has been counted.
fn close_and_settle(p: &Pipeline, closed: &AtomicBool) {
    let before = scrape_errors(p, 0, "http_status");
    closed.store(true, Ordering::SeqCst);
    uctel_tests::wait_for(
        "the closed target's 404 counted",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let now = scrape_errors(p, 0, "http_status");
            (now > before)
                .then_some(())
                .ok_or_else(|| format!("http_status {now}"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
}

/// Limit of the big target, MiB (`body_size_limit: 4MiB`).
const LIMIT_MIB: u64 = 4;
/// What the big target streams once armed: 200 MB.
const BIG_ANSWER: u64 = 200_000_000;

/// A target streams 200 MB chunked without `Content-Length` (64 KiB chunks, 1 ms apart, as a
/// slow exporter would) to a target with `body_size_limit: 4MiB`. Until the test arms it, it
/// answers a small exposition (`up` 1), which gives the agent's baseline peak RSS.
///
/// Before `body_size_limit`, main read every answer into one buffer up to a fixed 64 MiB (and
/// refused the key): that buffer alone is 64 MiB, so the RSS bound (2 × 4 MiB + 16 MiB of
/// growth) fails, and the target writes 64 MiB or more to each scrape.
#[test]
fn a_chunked_answer_over_body_size_limit_is_refused_with_the_agents_memory_bounded() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let armed = Arc::new(AtomicBool::new(false));
    let big = {
        let armed = Arc::clone(&armed);
        targets::start(move || {
            if armed.load(Ordering::SeqCst) {
                Answer::Chunked {
                    total: BIG_ANSWER,
                    chunk: 64 << 10,
                    pause: Duration::from_millis(1),
                }
            } else {
                Answer::Text("# TYPE big_target_ready gauge\nbig_target_ready 1\n".into())
            }
        })
    };
    let targets = yaml(&format!(
        "- {{url: '{}', job: big, interval_seconds: 2, timeout_seconds: 2, body_size_limit: {LIMIT_MIB}MiB}}\n",
        big.url()
    ));
    p.add_agent_with("big-answer", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    wait_up(&p, "big-answer", "big", 1.0);
    let pid = p.agents[0]
        .daemon
        .pid()
        .unwrap_or_else(|| panic!("agent pid"));
    // Two more small scrapes, then the baseline.
    let served = big.served();
    uctel_tests::wait_for(
        "two more small answers",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            (big.served() >= served + 2)
                .then_some(())
                .ok_or_else(|| format!("{} served", big.served()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (rss0, hwm0) = uctel_tests::faults::memory_kib(pid).unwrap_or_else(|| panic!("VmHWM"));
    armed.store(true, Ordering::SeqCst);
    uctel_tests::wait_for(
        "three scrapes failed as body_too_large",
        Duration::from_secs(40),
        Duration::from_millis(200),
        || {
            let n = scrape_errors(&p, 0, "body_too_large");
            (n >= 3)
                .then_some(())
                .ok_or_else(|| format!("body_too_large {n}"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
    wait_up(&p, "big-answer", "big", 0.0);
    let (rss, hwm) = uctel_tests::faults::memory_kib(pid).unwrap_or_else(|| panic!("VmHWM"));
    let written = big.written();
    let bound_kib = (2 * LIMIT_MIB + 16) * 1024;
    println!(
        "big chunked answer: baseline VmRSS {rss0} KiB VmHWM {hwm0} KiB; after VmRSS {rss} KiB \
         VmHWM {hwm} KiB (growth {} KiB, bound {bound_kib} KiB); body bytes written per \
         answer {written:?}",
        hwm.saturating_sub(hwm0)
    );
    assert!(
        hwm.saturating_sub(hwm0) < bound_kib,
        "VmHWM grew from {hwm0} to {hwm} KiB, more than {bound_kib} KiB"
    );
    assert!(!written.is_empty(), "no big answer ended");
    // What the agent read (the limit) plus at most what the two socket buffers hold
    // (`tcp_wmem` and `tcp_rmem` maxima, 4 and 32 MiB by default).
    let unread_bound = (LIMIT_MIB + 4 + 32) << 20;
    assert!(
        written.iter().all(|&w| w < unread_bound),
        "more than {unread_bound} bytes of an answer written, the rest read: {written:?}"
    );
    let a = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    let other: Vec<String> = a
        .select("uctel_agent_source_errors_total", &[("source", "scrape")])
        .filter(|s| s.value > 0.0 && s.label("reason") != Some("body_too_large"))
        .map(|s| format!("{:?}={}", s.label("reason"), s.value))
        .collect();
    assert!(other.is_empty(), "other scrape failures: {other:?}");
    p.agents[0].daemon.stop(Duration::from_secs(20));
}

/// The exposition of the timestamp test at `now` (ms): two good samples (one without a
/// timestamp, one stamped 30 s ago) and three bad ones: 65 min in the past (more than the
/// default `timestamp_max_age_seconds`, 3600, before any scrape that asked for it), 1 h in
/// the future (more than `timestamp_max_future_seconds`, 600) and one in seconds (1970 to a
/// reader of milliseconds).
fn stamped_answer(now: i64) -> String {
    format!(
        "# TYPE stamp_fresh gauge\nstamp_fresh 1\n\
         # TYPE stamp_recent gauge\nstamp_recent 2 {}\n\
         # TYPE stamp_past gauge\nstamp_past 3 {}\n\
         # TYPE stamp_future gauge\nstamp_future 4 {}\n\
         # TYPE stamp_seconds gauge\nstamp_seconds 5 {}\n",
        now - 30_000,
        now - 65 * 60_000,
        now + 60 * 60_000,
        now / 1000
    )
}

/// Two targets answering [`stamped_answer`]: `honoured` (defaults) and `unhonoured`
/// (`honor_timestamps: false`). At the collector `honoured` has `stamp_fresh` and
/// `stamp_recent` (its own timestamp) and none of the bad ones; `unhonoured` has all five,
/// each stamped at its scrape. At the agent, exactly one `timestamp_too_new` and two
/// `timestamp_too_old` per answer `honoured` served.
///
/// Before the bounds, main shipped every sample with the timestamp the target gave (the bad
/// ones arrive, nothing is counted) and refused `honor_timestamps`.
#[test]
fn samples_stamped_out_of_bounds_are_refused_and_counted_unless_timestamps_are_not_honoured() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let closed = Arc::new(AtomicBool::new(false));
    let honoured = {
        let closed = Arc::clone(&closed);
        targets::start(move || {
            if closed.load(Ordering::SeqCst) {
                Answer::Status("404 Not Found")
            } else {
                Answer::Text(stamped_answer(now_ms()))
            }
        })
    };
    let unhonoured = targets::start(|| Answer::Text(stamped_answer(now_ms())));
    let targets = yaml(&format!(
        "- {{url: '{}', job: honoured, interval_seconds: 1, timeout_seconds: 1}}\n\
         - {{url: '{}', job: unhonoured, interval_seconds: 1, timeout_seconds: 1, honor_timestamps: false}}\n",
        honoured.url(),
        unhonoured.url()
    ));
    p.add_agent_with("stamps", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    let names = |s: &BTreeMap<String, (f64, Option<i64>)>| -> Vec<String> {
        s.keys()
            .filter(|k| k.starts_with("stamp_"))
            .cloned()
            .collect()
    };
    let mut seen = (BTreeMap::new(), BTreeMap::new());
    uctel_tests::wait_for(
        "both targets' samples at the collector",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let c = p.scrape()?;
            seen = (
                at_collector(&c, "stamps", "honoured"),
                at_collector(&c, "stamps", "unhonoured"),
            );
            let ready = seen.0.contains_key("stamp_recent{}")
                && names(&seen.1).len() == 5
                && seen.0.get("up{}").map(|u| u.0) == Some(1.0);
            ready.then_some(()).ok_or_else(|| format!("{seen:?}"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
    let now = now_ms();
    let (honoured_at, unhonoured_at) = seen;
    assert_eq!(
        names(&honoured_at),
        ["stamp_fresh{}", "stamp_recent{}"],
        "only the good samples of the honoured target: {honoured_at:?}"
    );
    let (value, ts) = honoured_at["stamp_recent{}"];
    assert_eq!(value, 2.0);
    let ts = ts.unwrap_or_else(|| panic!("stamp_recent without a timestamp"));
    assert!(
        (now - 40_000..=now - 25_000).contains(&ts),
        "stamp_recent keeps the target's timestamp (30 s ago): {ts}, now {now}"
    );
    for (name, (value, ts)) in unhonoured_at
        .iter()
        .filter(|(k, _)| k.starts_with("stamp_"))
    {
        let ts = ts.unwrap_or_else(|| panic!("{name} without a timestamp"));
        assert!(
            (now - 10_000..=now + 1_000).contains(&ts),
            "{name} = {value} stamped at its scrape, not the target's: {ts}, now {now}"
        );
    }
    close_and_settle(&p, &closed);
    let (new, old) = (
        scrape_errors(&p, 0, "timestamp_too_new"),
        scrape_errors(&p, 0, "timestamp_too_old"),
    );
    let served = honoured.served();
    println!(
        "timestamps: honoured served {served}, timestamp_too_new {new}, timestamp_too_old {old}"
    );
    assert!(served >= 1);
    assert_eq!(new, served, "one too new per answer");
    assert_eq!(old, 2 * served, "the past and the seconds one per answer");
    p.agents[0].daemon.stop(Duration::from_secs(20));
}

/// A target giving `dup_value{k="a"}` twice (1, then 2) and `dup_value{k="b"}` once: the
/// collector holds `k="a"` at 1 and `k="b"` at 3, and the agent counts exactly one
/// `duplicate` per answer.
///
/// Before, main shipped both samples of `k="a"`, so the collector kept the later (2), and
/// counted nothing.
#[test]
fn a_series_given_twice_keeps_its_first_value_and_the_repeat_is_counted() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let closed = Arc::new(AtomicBool::new(false));
    let dup = {
        let closed = Arc::clone(&closed);
        targets::start(move || {
            if closed.load(Ordering::SeqCst) {
                Answer::Status("404 Not Found")
            } else {
                Answer::Text(
                    "# TYPE dup_value gauge\ndup_value{k=\"a\"} 1\ndup_value{k=\"a\"} 2\n\
                     dup_value{k=\"b\"} 3\n"
                        .into(),
                )
            }
        })
    };
    let targets = yaml(&format!(
        "- {{url: '{}', job: dup, interval_seconds: 1, timeout_seconds: 1}}\n",
        dup.url()
    ));
    p.add_agent_with("dups", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    let mut at = BTreeMap::new();
    uctel_tests::wait_for(
        "the target's series at the collector after two scrapes",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            at = at_collector(&p.scrape()?, "dups", "dup");
            (dup.served() >= 2 && at.contains_key("dup_value{k=\"b\"}"))
                .then_some(())
                .ok_or_else(|| format!("{} served, {at:?}", dup.served()))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
    let values: BTreeMap<&str, f64> = at
        .iter()
        .filter(|(k, _)| k.starts_with("dup_value"))
        .map(|(k, (v, _))| (k.as_str(), *v))
        .collect();
    assert_eq!(
        values,
        BTreeMap::from([("dup_value{k=\"a\"}", 1.0), ("dup_value{k=\"b\"}", 3.0)]),
        "the first value of the repeated series"
    );
    assert_eq!(at.get("scrape_samples_scraped{}").map(|v| v.0), Some(3.0));
    close_and_settle(&p, &closed);
    let (duplicates, served) = (scrape_errors(&p, 0, "duplicate"), dup.served());
    println!("duplicates: served {served}, duplicate {duplicates}");
    assert_eq!(duplicates, served, "one duplicate per answer");
    p.agents[0].daemon.stop(Duration::from_secs(20));
}

/// Two targets without `job` (so both `job="scrape"`) on two ports: the collector holds two
/// `up` series and two `plain_value` series, told apart by `exported_instance` (each
/// target's `host:port`).
///
/// Before `instance`, main labelled both only `job="scrape"`: one `up` series (and one
/// `plain_value`) at the collector, overwritten by each target in turn.
#[test]
fn two_targets_without_job_arrive_as_two_instances() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let (one, two): (Target, Target) = (
        targets::start(|| Answer::Text("plain_value 7\n".into())),
        targets::start(|| Answer::Text("plain_value 8\n".into())),
    );
    let targets = yaml(&format!(
        "- {{url: '{}', interval_seconds: 1}}\n- {{url: '{}', interval_seconds: 1}}\n",
        one.url(),
        two.url()
    ));
    p.add_agent_with("jobless", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });
    let want: BTreeMap<(String, String), f64> = [
        ("up", &one, 1.0),
        ("up", &two, 1.0),
        ("plain_value", &one, 7.0),
        ("plain_value", &two, 8.0),
    ]
    .into_iter()
    .map(|(n, t, v)| ((n.to_owned(), t.addr.to_string()), v))
    .collect();
    let mut got = BTreeMap::new();
    uctel_tests::wait_for(
        "two instances of job scrape at the collector",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let c = p.scrape()?;
            got = c
                .samples
                .iter()
                .filter(|s| {
                    s.label("agent") == Some("jobless")
                        && s.label("job") == Some("scrape")
                        && (s.name == "up" || s.name == "plain_value")
                })
                .map(|s| {
                    let instance = s.label("exported_instance").unwrap_or("none").to_owned();
                    ((s.name.clone(), instance), s.value)
                })
                .collect();
            (got == want)
                .then_some(())
                .ok_or_else(|| format!("{got:?}"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.agents[0].daemon.log_tail(30)));
    p.agents[0].daemon.stop(Duration::from_secs(20));
}
