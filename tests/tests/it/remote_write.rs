//! Remote-write end to end through the real binaries: two agents with 2 % injected UC loss →
//! collector → a real Prometheus (`--web.enable-remote-write-receiver`) and a real
//! VictoriaMetrics at once; and an outage of the receiver.
//!
//! What is checked, per endpoint, once the agents said `Goodbye` and nothing is pending:
//! * the sum rule `samples_in = samples + Σ dropped + Σ failed` (pending 0), and nothing
//!   failed (no request was refused: no out-of-order sample reached a receiver);
//! * the receiver holds exactly `samples − stale_markers` samples (stale markers are not
//!   returned by queries);
//! * Prometheus and VictoriaMetrics hold the same series with the same samples, sample for
//!   sample: timestamps (ms) equal, values equal (VictoriaMetrics to its 12 significant
//!   digits);
//! * every series carries `agent` and `instance` (and nothing naming the collector: the
//!   label sets are the ones `/metrics` shows), its timestamps
//!   increase and lie within the run, and the value the collector's own `/metrics` served
//!   for the same series while the agents ran is among its samples; once the agents have
//!   said Goodbye their series are gone from `/metrics`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_yaml::{Mapping, Value};
use uctel_tests::exposition::Scrape;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::prometheus::Prometheus;
use uctel_tests::victoria::{RawSeries, Victoria};
use uctel_tests::wait_for;

const RW: &str = "uctel_collector_remote_write_";

/// How long VictoriaMetrics gets to make the last samples it received searchable.
const SEARCHABLE: Duration = Duration::from_secs(20);

fn endpoint(url: &str, extra: &[(&str, Value)]) -> Value {
    let mut m = Mapping::new();
    m.insert("url".into(), url.into());
    m.insert("batch_send_deadline_seconds".into(), 0.2.into());
    m.insert("min_backoff_seconds".into(), 0.05.into());
    m.insert("max_backoff_seconds".into(), 1.0.into());
    for (k, v) in extra {
        m.insert((*k).into(), v.clone());
    }
    Value::Mapping(m)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The endpoint's figures from one scrape.
#[derive(Debug, Default)]
struct Figures {
    samples_in: u64,
    sent: u64,
    dropped: BTreeMap<String, u64>,
    failed: BTreeMap<String, u64>,
    pending: u64,
    stale: u64,
    retried: u64,
}

impl Figures {
    fn read(s: &Scrape, url: &str) -> Figures {
        let by_reason = |name: &str| {
            s.select(&format!("{RW}{name}"), &[("url", url)])
                .map(|x| (x.label("reason").unwrap_or("?").to_owned(), x.value as u64))
                .collect()
        };
        Figures {
            samples_in: s.count(&format!("{RW}samples_in_total"), &[("url", url)]),
            sent: s.count(&format!("{RW}samples_total"), &[("url", url)]),
            dropped: by_reason("samples_dropped_total"),
            failed: by_reason("samples_failed_total"),
            pending: s.count(&format!("{RW}samples_pending"), &[("url", url)]),
            stale: s.count(&format!("{RW}stale_markers_total"), &[("url", url)]),
            retried: s.count(&format!("{RW}samples_retried_total"), &[("url", url)]),
        }
    }

    fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    fn check_sum(&self, url: &str) {
        assert_eq!(
            self.samples_in,
            self.sent + self.dropped_total() + self.failed_total() + self.pending,
            "sum rule for {url}: {self:?}"
        );
    }
}

/// Waits until both endpoints have nothing pending and `samples_in` stopped moving.
fn settle(p: &Pipeline, urls: &[&str]) -> Scrape {
    let mut last = Vec::new();
    let mut out = None;
    let r = uctel_tests::wait_for(
        "remote-write queues drained",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let s = p.scrape()?;
            let figures: Vec<(u64, u64)> = urls
                .iter()
                .map(|u| {
                    let f = Figures::read(&s, u);
                    (f.samples_in, f.pending)
                })
                .collect();
            let done = figures.iter().all(|f| f.1 == 0) && figures == last;
            last = figures;
            out = Some(s);
            if done {
                Ok(())
            } else {
                Err(format!("in/pending: {last:?}"))
            }
        },
    );
    if let Err(e) = r {
        panic!("{e}\n{}", p.collector.log_tail(40));
    }
    out.unwrap_or_default()
}

/// Labels of a collector `/metrics` sample, `__name__` included, sorted.
fn labels_of(s: &uctel_tests::exposition::Sample) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = s
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    v.push(("__name__".into(), s.name.clone()));
    v.sort();
    v
}

fn samples(r: &RawSeries) -> usize {
    r.values().map(Vec::len).sum()
}

#[test]
fn remote_write_into_prometheus_and_victoria_metrics_holds_what_the_collector_accepted() {
    let receivers = tempfile::Builder::new()
        .prefix("uctel-rw-")
        .tempdir()
        .unwrap();
    let prom = Prometheus::receiver(receivers.path());
    let vm = Victoria::start(receivers.path());
    let (prom_url, vm_url) = (prom.write_url(), vm.write_url());
    let mut p = Pipeline::start_with(|y, _| {
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![endpoint(&prom_url, &[]), endpoint(&vm_url, &[])]),
        );
    });
    let t0 = now_ms();
    p.add_agent("rw-a", 0.02, 1.0);
    p.add_agent("rw-b", 0.02, 1.0);
    p.wait_flowing(2, &["rw-a", "rw-b"], &["metrics"], Duration::from_secs(60));
    // Runs until what the checks below stand on has happened: UC loss injected and counted,
    // and more samples sent to each receiver than the 10,000 the check of Prometheus asks
    // for.
    let running = Instant::now();
    wait_for(
        "loss counted and 12,000 samples sent to each receiver",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let s = p.scrape()?;
            let lost = s.count("uctel_collector_frames_lost_total", &[]);
            let sent = [&prom_url, &vm_url].map(|u| Figures::read(&s, u).sent);
            if lost > 0 && sent.iter().all(|n| *n >= 12_000) {
                Ok(())
            } else {
                Err(format!("{lost} frames lost, {sent:?} samples sent"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(40)));
    println!("loss and samples enough after {:?}", running.elapsed());
    // What /metrics serves while the agents run (their series leave it at their Goodbye).
    let serving = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    for a in &mut p.agents {
        a.daemon.stop(Duration::from_secs(30));
    }
    let s = settle(&p, &[&prom_url, &vm_url]);
    assert!(
        !s.samples
            .iter()
            .any(|x| x.label("agent").is_some_and(|a| a.starts_with("rw-"))
                && !x.name.starts_with("uctel_collector_")),
        "the stopped agents' series are still on /metrics"
    );
    let t1 = now_ms();

    // UC loss was injected and counted.
    let lost = s.count("uctel_collector_frames_lost_total", &[]);
    assert!(lost > 0, "2 % injected loss, none counted");

    let selector = r#"{agent=~"rw-.*"}"#;
    let held_prom = prom.raw_samples(selector).unwrap();
    let vm_figures = Figures::read(&s, &vm_url);
    let held_vm = vm
        .export_settled(selector, vm_figures.sent - vm_figures.stale, SEARCHABLE)
        .unwrap();
    for (url, held) in [(&prom_url, &held_prom), (&vm_url, &held_vm)] {
        let f = Figures::read(&s, url);
        f.check_sum(url);
        assert_eq!(f.failed_total(), 0, "{url}: requests refused: {f:?}");
        assert_eq!(f.dropped_total(), 0, "{url}: samples dropped: {f:?}");
        assert!(f.stale > 0, "{url}: Goodbye sent no stale markers");
        assert_eq!(
            samples(held) as u64,
            f.sent - f.stale,
            "{url}: the receiver holds {} samples in {} series, the collector sent {} \
             ({} stale markers)",
            samples(held),
            held.len(),
            f.sent,
            f.stale
        );
    }
    assert!(
        samples(&held_prom) > 10_000,
        "{} samples",
        samples(&held_prom)
    );
    // VictoriaMetrics keeps about 12 significant decimal digits of a float (its docs,
    // "Limitations"); timestamps are exact.
    let same = |a: f64, b: f64| {
        a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-11 * a.abs().max(b.abs())
    };
    let agree = |k: &Vec<(String, String)>, v: &Vec<(i64, f64)>| {
        held_vm.get(k).is_some_and(|w| {
            w.len() == v.len() && w.iter().zip(v).all(|(x, y)| x.0 == y.0 && same(x.1, y.1))
        })
    };
    let differ: Vec<_> = held_prom
        .iter()
        .filter(|(k, v)| !agree(k, v))
        .take(2)
        .map(|(k, v)| {
            (
                k,
                v.iter().take(3).collect::<Vec<_>>(),
                held_vm.get(k).map(|w| w.iter().take(3).collect::<Vec<_>>()),
            )
        })
        .collect();
    let only_vm: Vec<_> = held_vm
        .keys()
        .filter(|k| !held_prom.contains_key(*k))
        .take(3)
        .collect();
    assert!(
        differ.is_empty() && only_vm.is_empty(),
        "Prometheus and VictoriaMetrics differ: {differ:?}; series only in VictoriaMetrics {only_vm:?}"
    );

    // Labels, timestamps, and the values /metrics served before the agents stopped.
    let mut exposed = BTreeMap::new();
    for x in serving
        .samples
        .iter()
        .filter(|x| x.label("agent").is_some_and(|a| a.starts_with("rw-")))
    {
        exposed.insert(labels_of(x), x.value);
    }
    let mut compared = 0;
    for (labels, series) in &held_prom {
        let names: Vec<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.contains(&"agent") && names.contains(&"instance"),
            "{labels:?}"
        );
        assert!(
            series.windows(2).all(|w| w[0].0 < w[1].0),
            "timestamps of {labels:?} do not increase"
        );
        assert!(
            series.iter().all(|(t, _)| (t0 - 5_000..=t1).contains(t)),
            "{labels:?}: a timestamp outside the run [{t0}, {t1}]: {series:?}"
        );
        if let Some(v) = exposed.get(labels) {
            assert!(
                series
                    .iter()
                    .any(|x| x.1 == *v || (x.1.is_nan() && v.is_nan())),
                "{labels:?}: {v} on the collector's /metrics is not among the receiver's samples"
            );
            compared += 1;
        }
    }
    assert!(
        compared * 10 >= held_prom.len() * 9,
        "only {compared} of {} series found on the collector's /metrics",
        held_prom.len()
    );
}

#[test]
fn a_receiver_outage_is_survived_bounded_and_every_sample_accounted() {
    let receivers = tempfile::Builder::new()
        .prefix("uctel-rw-outage-")
        .tempdir()
        .unwrap();
    let mut vm = Victoria::start(receivers.path());
    let url = vm.write_url();
    let capacity: u64 = 4_000;
    let mut p = Pipeline::start_with(|y, _| {
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![endpoint(
                &url,
                &[
                    ("queue_capacity_samples", capacity.into()),
                    ("shards", 2.into()),
                    ("max_samples_per_send", 500.into()),
                    ("timeout_seconds", 2.into()),
                ],
            )]),
        );
    });
    p.add_agent("rw-o", 0.0, 0.5);
    p.wait_flowing(1, &["rw-o"], &["metrics"], Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(3));
    vm.stop();
    // 30 s without a receiver: the queue stays within its bound, the collector lives.
    let mut highest_pending = 0;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        let s = p
            .scrape()
            .unwrap_or_else(|e| panic!("collector down during the outage: {e}"));
        let f = Figures::read(&s, &url);
        f.check_sum(&url);
        highest_pending = highest_pending.max(f.pending);
    }
    let during = Figures::read(&p.scrape().unwrap(), &url);
    assert!(
        during.retried > 0,
        "nothing retried during the outage: {during:?}"
    );
    assert!(
        during.dropped.get("queue_full").copied().unwrap_or(0) > 0,
        "the queue never filled in 30 s: {during:?}"
    );
    // Queued (capacity) plus one request in flight per shard.
    assert!(
        highest_pending <= capacity + 2 * 500,
        "pending reached {highest_pending}, bound {capacity} + in-flight"
    );
    // The log says what was given up, with counts: at most one line per reason every 10 s
    // for the endpoint (not one per shard), and one retry line per 10 s.
    let log = p.collector.log();
    let given_up: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("remote-write output:") && l.contains("given up (queue_full)"))
        .filter_map(|l| {
            let after = l.split("remote-write output: ").nth(1)?;
            after.split(' ').next()?.parse().ok()
        })
        .collect();
    assert!(
        !given_up.is_empty() && given_up.len() <= 4,
        "{} queue_full lines in 30 s: {given_up:?}\n{}",
        given_up.len(),
        p.collector.log_tail(40)
    );
    assert!(
        given_up.iter().sum::<u64>() <= during.dropped.get("queue_full").copied().unwrap_or(0),
        "the lines count more than the counter: {given_up:?} vs {during:?}"
    );
    let retry_lines = log
        .lines()
        .filter(|l| l.contains("remote-write request failed; retrying"))
        .count();
    assert!(
        (1..=4).contains(&retry_lines),
        "{retry_lines} retry lines in 30 s with 2 shards"
    );
    vm.restart();
    // It catches up: samples are sent again.
    let r = uctel_tests::wait_for(
        "remote-write catches up after the outage",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let f = Figures::read(&p.scrape()?, &url);
            if f.sent > during.sent && f.pending < 1_000 {
                Ok(())
            } else {
                Err(format!("{f:?}"))
            }
        },
    );
    if let Err(e) = r {
        panic!("{e}\n{}", p.collector.log_tail(30));
    }
    uctel_tests::wait_for(
        "the recovered line",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || {
            p.collector
                .log()
                .contains("remote-write output recovered after")
                .then_some(())
                .ok_or_else(|| p.collector.log_tail(20))
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for a in &mut p.agents {
        a.daemon.stop(Duration::from_secs(30));
    }
    let s = settle(&p, &[&url]);
    let f = Figures::read(&s, &url);
    f.check_sum(&url);
    assert_eq!(f.failed_total(), 0, "{f:?}");
    let held = vm
        .export_settled(
            r#"{agent="rw-o"}"#,
            f.samples_in - f.stale - f.dropped_total(),
            SEARCHABLE,
        )
        .unwrap();
    // Every sample is held by the receiver or counted as dropped (none failed).
    assert_eq!(
        samples(&held) as u64 + f.stale + f.dropped_total(),
        f.samples_in,
        "held {} + stale markers {} + dropped {:?} vs in {}",
        samples(&held),
        f.stale,
        f.dropped,
        f.samples_in
    );
    assert!(p.collector.is_running(), "the collector died");
    p.collector.stop(Duration::from_secs(30));
    let stopped = p
        .collector
        .log()
        .lines()
        .filter(|l| l.contains("remote-write output stopped:"))
        .count();
    assert_eq!(stopped, 1, "{}", p.collector.log_tail(10));
}

/// Kills the child on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Remote-write over TLS to a real Prometheus serving HTTPS (`--web.config.file` with a
/// self-signed certificate made by `openssl`): trusted through `tls.ca_file` it delivers;
/// with the system roots only it is refused (unknown issuer: retried, never delivered);
/// with `insecure_skip_verify` it delivers.
#[test]
fn remote_write_over_tls_checks_the_certificate() {
    let dir = tempfile::Builder::new()
        .prefix("uctel-rw-tls-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let (cert, key) = (d.join("cert.pem"), d.join("key.pem"));
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=uctel-test"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let web = d.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let config = d.join("prometheus.yml");
    std::fs::write(&config, "global: {}\nscrape_configs: []\n").unwrap();
    let addr = uctel_tests::net::free_addr();
    let log = std::fs::File::create(d.join("prometheus.log")).unwrap();
    let _prom = Killed(
        std::process::Command::new(uctel_tests::prometheus::prometheus_binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", d.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!("--web.config.file={}", web.display()))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    uctel_tests::wait_for(
        "prometheus listening",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            std::net::TcpStream::connect(addr)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .unwrap();
    let base = format!("https://{addr}/api/v1/write");
    let (trusted, untrusted, insecure) = (
        base.clone(),
        format!("{base}?via=roots"),
        format!("{base}?via=insecure"),
    );
    let ca = cert.display().to_string();
    let mut p = Pipeline::start_with(|y, _| {
        let mut tls = Mapping::new();
        tls.insert("ca_file".into(), ca.as_str().into());
        let mut skip = Mapping::new();
        skip.insert("insecure_skip_verify".into(), true.into());
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![
                endpoint(&trusted, &[("tls", Value::Mapping(tls))]),
                endpoint(&untrusted, &[]),
                endpoint(&insecure, &[("tls", Value::Mapping(skip))]),
            ]),
        );
    });
    p.add_agent("rw-tls", 0.0, 1.0);
    p.wait_flowing(1, &["rw-tls"], &["metrics"], Duration::from_secs(60));
    let r = uctel_tests::wait_for(
        "samples delivered over TLS",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let s = p.scrape()?;
            let (a, c) = (Figures::read(&s, &trusted), Figures::read(&s, &insecure));
            if a.sent > 0 && c.sent > 0 {
                Ok(())
            } else {
                Err(format!("trusted {a:?}, insecure {c:?}"))
            }
        },
    );
    if let Err(e) = r {
        panic!("{e}\n{}", p.collector.log_tail(30));
    }
    let s = p.scrape().unwrap();
    let refused = Figures::read(&s, &untrusted);
    assert_eq!(
        refused.sent, 0,
        "a certificate of an unknown issuer was accepted: {refused:?}"
    );
    assert!(refused.retried > 0, "{refused:?}");
    for url in [&trusted, &untrusted, &insecure] {
        Figures::read(&s, url).check_sum(url);
    }
    assert!(
        p.collector.log().contains("UnknownIssuer") || p.collector.log().contains("certificate"),
        "the refusal is not explained in the collector's log:\n{}",
        p.collector.log_tail(30)
    );
}

/// The fast_counters stream into a real VictoriaMetrics: three counters of `lo` sampled
/// every 10 ms for 10 s (host metrics off, so only the fast samples carry these series):
/// every sample the collector received is held, each with its own timestamp (strictly
/// increasing, about 10 ms apart), none refused or dropped.
#[test]
fn fast_counter_samples_reach_victoria_metrics_each_with_its_own_timestamp() {
    let receivers = tempfile::Builder::new()
        .prefix("uctel-rw-fast-")
        .tempdir()
        .unwrap();
    let vm = Victoria::start(receivers.path());
    let vm_url = vm.write_url();
    let mut p = Pipeline::start_with(|y, _| {
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![endpoint(&vm_url, &[])]),
        );
    });
    let counters: Vec<Value> = ["rx_packets", "tx_packets", "rx_bytes"]
        .iter()
        .map(|s| {
            let mut m = Mapping::new();
            m.insert(
                "path".into(),
                format!("/sys/class/net/lo/statistics/{s}").into(),
            );
            Value::Mapping(m)
        })
        .collect();
    p.add_agent_with("rw-fast", 0.0, 10.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.fast_counters.interval_milliseconds", 10)
            .set("sources.fast_counters.counters", Value::Sequence(counters));
    });
    p.wait_flowing(1, &["rw-fast"], &["fast_counters"], Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(10));
    p.agents[0].daemon.stop(Duration::from_secs(30));
    let s = settle(&p, &[&vm_url]);
    let f = Figures::read(&s, &vm_url);
    f.check_sum(&vm_url);
    assert_eq!(f.failed_total(), 0, "requests refused: {f:?}");
    assert_eq!(f.dropped_total(), 0, "samples dropped: {f:?}");
    let received = s.count(
        "uctel_collector_records_received_total",
        &[("agent", "rw-fast"), ("stream", "fast_counters")],
    );
    assert!(received > 2000, "only {received} samples received");
    let selector = r#"{agent="rw-fast",device="lo",__name__=~"node_network_(receive|transmit)_(packets|bytes)_total"}"#;
    let held = vm.export_settled(selector, received, SEARCHABLE).unwrap();
    assert_eq!(held.len(), 3, "series held: {:?}", held.keys());
    assert_eq!(
        samples(&held) as u64,
        received,
        "VictoriaMetrics holds {} samples, the collector received {received}",
        samples(&held)
    );
    for (labels, series) in &held {
        let gaps: Vec<i64> = series.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(
            gaps.iter().all(|g| *g > 0),
            "{labels:?}: timestamps not increasing"
        );
        let mut sorted = gaps.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        assert!(
            (8..=12).contains(&median),
            "{labels:?}: median gap {median} ms between samples, want about 10"
        );
        println!(
            "{labels:?}: {} samples, median gap {median} ms",
            series.len()
        );
    }
}

/// POSTs one remote-write body as the collector's output does; the status and answer.
fn post_write(url: &str, body: &[u8]) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .post(url)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .send(body)
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

/// A retried remote-write request (its answer lost, the same body sent again) never
/// stores a sample twice in Prometheus, and what it answers depends on the samples:
/// * a request whose every sample is its series' newest stored one (same timestamp, same
///   value) is answered 2xx and ignored (TSDB head appender: an exact duplicate of the
///   newest sample is not appended);
/// * a request with older samples of a series is refused whole, 400 "out of order
///   sample" (Prometheus 2.42, Debian 12), although each of its samples is stored;
/// * another value at a stored timestamp is refused too (400), so Prometheus did compare.
#[test]
fn prometheus_stores_a_retried_remote_write_request_once() {
    use uctel_collector::outputs::remote_write::prompb::{encode_labels, encode_request, Sample};
    let dir = tempfile::Builder::new()
        .prefix("uctel-rw-dup-")
        .tempdir()
        .unwrap();
    let prom = Prometheus::receiver(dir.path());
    let t0 = now_ms() - 60_000;
    let labels = |name: &str| {
        encode_labels([
            ("__name__", name),
            ("agent", "dup-1"),
            ("instance", "dup-1"),
        ])
    };
    let sample = |i: i32| Sample {
        value: 10.0 + f64::from(i),
        timestamp: t0 + i64::from(i) * 1000,
    };
    let url = prom.write_url();

    // One sample per series per request: each retry answered 2xx.
    let one = labels("uctel_retry_one");
    let mut answers = Vec::new();
    for i in 0..3 {
        let body = encode_request([(&one[..], &[sample(i)][..])], &mut Vec::new()).unwrap();
        for _ in 0..3 {
            answers.push(post_write(&url, &body));
        }
    }
    println!(
        "one sample a request, each sent 3 times: {:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    for (status, text) in &answers {
        assert!((200..300).contains(status), "{status}: {text}");
    }

    // Five samples of a series in one request, sent three times.
    let many = labels("uctel_retry_many");
    let samples: Vec<Sample> = (0..5).map(sample).collect();
    let body = encode_request([(&many[..], &samples[..])], &mut Vec::new()).unwrap();
    let tries: Vec<(u16, String)> = (0..3).map(|_| post_write(&url, &body)).collect();
    println!("five samples a request, sent 3 times: {tries:?}");
    assert!((200..300).contains(&tries[0].0), "{:?}", tries[0]);
    for (status, text) in &tries[1..] {
        assert_eq!(*status, 400, "{text}");
        assert!(text.contains("out of order sample"), "{text}");
    }

    // Another value at a stored timestamp is refused: Prometheus compared the samples.
    let changed = [Sample {
        value: 99.0,
        timestamp: samples[4].timestamp,
    }];
    let other = encode_request([(&many[..], &changed[..])], &mut Vec::new()).unwrap();
    let refused = post_write(&url, &other);
    println!("another value at a stored timestamp: {refused:?}");
    assert_eq!(refused.0, 400, "{refused:?}");

    for (name, n) in [("uctel_retry_one", 3), ("uctel_retry_many", 5)] {
        let stored = wait_for_samples(&prom, name, n);
        let got: Vec<(i64, f64)> = stored.values().next().cloned().unwrap_or_default();
        let want: Vec<(i64, f64)> = (0..n as i32)
            .map(sample)
            .map(|s| (s.timestamp, s.value))
            .collect();
        assert_eq!(stored.len(), 1, "{name}: one series: {stored:?}");
        assert_eq!(
            got, want,
            "{name}: each sample stored once, with its first value"
        );
    }
}

/// The series of `selector` once it holds `n` samples in all (Prometheus makes appended
/// samples queryable at once; a short wait covers the HTTP round trips).
fn wait_for_samples(
    prom: &Prometheus,
    selector: &str,
    n: usize,
) -> uctel_tests::victoria::RawSeries {
    let mut last = uctel_tests::victoria::RawSeries::new();
    for _ in 0..50 {
        if let Ok(s) = prom.raw_samples(selector) {
            let have: usize = s.values().map(Vec::len).sum();
            last = s;
            if have >= n {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    last
}

/// Timestamps of the series `name` of agent `agent` in `held`.
fn stamps(held: &RawSeries, name: &str, agent: &str) -> Vec<i64> {
    held.iter()
        .filter(|(k, _)| {
            k.iter().any(|(n, v)| n == "__name__" && v == name)
                && k.iter().any(|(n, v)| n == "agent" && v == agent)
        })
        .flat_map(|(_, v)| v.iter().map(|s| s.0))
        .collect()
}

/// A `400` for one series costs only that series, through the real binaries and a real
/// Prometheus (2.42): once agent `rw-b`'s `node_load1` flows, a sample of that series is
/// pushed with a timestamp 5 minutes ahead (Prometheus accepts it: its head takes samples
/// down to an hour before its newest one), so every later sample of the series is "out of
/// order" and Prometheus refuses, 400, every request that holds one. The collector splits
/// such a request until the refused sample fails alone: every refused sample is counted
/// `failed{reason="rejected"}` — exactly the `node_load1` samples of `rw-b` sent after the
/// push (`rw-b`'s `node_load5`, collected at the same instants, tells how many) — and
/// every other sample is stored: `rw-a`'s `node_load1` and `rw-b`'s `node_load5` have a
/// sample at every collection instant of their agent, and the receiver holds exactly what
/// the collector counted sent. Sum rule: `samples_in = sent + dropped + failed + pending`.
#[test]
fn a_series_prometheus_refuses_costs_only_its_own_samples() {
    use uctel_collector::outputs::remote_write::prompb::{encode_labels, encode_request, Sample};
    let dir = tempfile::Builder::new()
        .prefix("uctel-rw-refused-")
        .tempdir()
        .unwrap();
    let prom = Prometheus::receiver(dir.path());
    let url = prom.write_url();
    let mut p = Pipeline::start_with(|y, _| {
        y.set(
            "outputs.remote_write",
            Value::Sequence(vec![endpoint(&url, &[])]),
        );
    });
    p.add_agent("rw-a", 0.0, 1.0);
    p.add_agent("rw-b", 0.0, 1.0);
    p.wait_flowing(2, &["rw-a", "rw-b"], &["metrics"], Duration::from_secs(60));
    // The refused series, with the labels the collector gives it (those /metrics shows).
    let mut refused = Vec::new();
    uctel_tests::wait_for(
        "rw-b's node_load1 on /metrics",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let s = p.scrape()?;
            let x = s
                .samples
                .iter()
                .find(|x| x.name == "node_load1" && x.label("agent") == Some("rw-b"))
                .ok_or("not yet")?;
            refused = labels_of(x);
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    let ahead = now_ms() + 300_000;
    let wire = encode_labels(refused.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let first = [Sample {
        value: -1.0,
        timestamp: ahead,
    }];
    let body = encode_request([(&wire[..], &first[..])], &mut Vec::new()).unwrap();
    let answer = post_write(&url, &body);
    assert!((200..300).contains(&answer.0), "{answer:?}");
    // Tens of refused samples, each in a request with other series.
    uctel_tests::wait_for(
        "15 samples refused",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let f = Figures::read(&p.scrape()?, &url);
            let n = f.failed.get("rejected").copied().unwrap_or(0);
            (n >= 15).then_some(()).ok_or(format!("{n} refused"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(30)));
    for a in &mut p.agents {
        a.daemon.stop(Duration::from_secs(30));
    }
    let s = settle(&p, &[&url]);
    let f = Figures::read(&s, &url);
    let held = prom.raw_samples(r#"{agent=~"rw-.*"}"#).unwrap();
    let x: Vec<i64> = held
        .get(&refused)
        .map(|v| v.iter().map(|s| s.0).filter(|&t| t != ahead).collect())
        .unwrap_or_default();
    let (a1, a5) = (
        stamps(&held, "node_load1", "rw-a"),
        stamps(&held, "node_load5", "rw-a"),
    );
    let b5 = stamps(&held, "node_load5", "rw-b");
    let rejected = f.failed.get("rejected").copied().unwrap_or(0);
    println!(
        "refused series {refused:?}: {} samples stored before the push; rw-b node_load5 {}; \
         rw-a node_load1 {}, node_load5 {}; figures {f:?}; held {} samples",
        x.len(),
        b5.len(),
        a1.len(),
        a5.len(),
        samples(&held)
    );
    f.check_sum(&url);
    assert_eq!(f.pending, 0, "{f:?}");
    assert_eq!(f.dropped_total(), 0, "nothing dropped: {f:?}");
    assert_eq!(f.failed_total(), rejected, "only rejected: {f:?}");
    // rw-b's node_load1 after the push, its stale marker at Goodbye included.
    let want = (b5.len() + 1).saturating_sub(x.len());
    assert_eq!(
        rejected,
        want as u64,
        "refused = rw-b's node_load1 samples after the push ({} collections, {} of them stored \
         before it, and its stale marker)",
        b5.len(),
        x.len()
    );
    assert!(want > 10, "too few samples after the push: {want}");
    assert!(
        !a1.is_empty() && a1 == a5,
        "rw-a: node_load1 {a1:?} vs node_load5 {a5:?}"
    );
    assert!(
        x.iter().all(|t| b5.contains(t)),
        "rw-b's node_load1 before the push is a prefix of its collections"
    );
    assert_eq!(
        samples(&held) as u64,
        f.sent - (f.stale - 1),
        "the receiver holds what the collector sent, stale markers aside (stale_markers_total \
         counts those queued, the refused series' marker among them; the pushed sample lies \
         beyond the query's instant)"
    );
}
