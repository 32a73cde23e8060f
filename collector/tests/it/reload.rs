//! Configuration reload and the runtime log filter through the `uctel-collector` binary:
//! `SIGHUP` and `POST /-/reload` apply a valid file's live keys, refuse a file that changes a
//! key needing a restart (nothing applied), change nothing for an invalid file (every
//! problem answered and logged), and say so in `uctel_collector_config_last_reload_*`;
//! `PUT /api/v1/log_level` changes what the process logs, for a while.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_uctel-collector");

const BASE: &str = "listen:\n  control: 127.0.0.1:0\n  metrics: 127.0.0.1:0\n  \
                    enable_lifecycle: ENABLE\ntransport:\n  soft:\n    bind: 127.0.0.1:0\n\
                    auth:\n  shared:\n    token: t\n";

/// One HTTP/1.1 request; the status code and the body.
pub(crate) fn request(addr: &str, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {out}"));
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// The value of an unlabelled series in a `/metrics` answer.
pub(crate) fn metric(addr: &str, name: &str) -> Option<f64> {
    let (_, body) = request(addr, "GET", "/metrics", "");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The binary, its stderr collected, and its metrics address.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) stderr: Arc<Mutex<String>>,
    pub(crate) metrics: String,
}

impl Daemon {
    pub(crate) fn start(bin: &str, args: &[&str], marker: &str) -> Daemon {
        let mut child = Command::new(bin)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let start = Instant::now();
        let metrics = loop {
            let found = stderr.lock().unwrap().lines().find_map(|l| {
                let rest = l.split(marker).nth(1)?;
                Some(
                    rest.split_whitespace()
                        .next()?
                        .trim_end_matches(',')
                        .to_owned(),
                )
            });
            if let Some(a) = found {
                break a;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no start-up line: {}",
                stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Daemon {
            child,
            stderr,
            metrics,
        }
    }

    pub(crate) fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the log has `n` lines containing `needle`.
    pub(crate) fn wait_log(&self, needle: &str, n: usize) {
        let start = Instant::now();
        while self.log().matches(needle).count() < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{needle:?} not logged {n} times: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGTERM, and the exit status.
    pub(crate) fn stop(mut self) -> Option<i32> {
        self.signal("-TERM");
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(start.elapsed() < Duration::from_secs(20), "did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn reload_applies_live_keys_refuses_restart_keys_and_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let base = BASE.replace("ENABLE", "true");
    std::fs::write(&path, &base).unwrap();
    let d = Daemon::start(BIN, &["--config", path.to_str().unwrap()], "metrics=");
    let m = d.metrics.clone();
    let ok = "uctel_collector_config_last_reload_successful";
    let ts = "uctel_collector_config_last_reload_success_timestamp_seconds";
    assert_eq!(metric(&m, ok), Some(1.0));
    let started = metric(&m, ts).unwrap();
    let (status, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert_eq!(status, 200);
    assert!(body.contains("\"filter\":\"info\""), "{body}");

    // SIGHUP with a new log_level: applied, the process keeps running.
    let debug = format!("{base}log_level: info,uctel_collector=debug\n");
    std::fs::write(&path, &debug).unwrap();
    d.signal("-HUP");
    d.wait_log("configuration reloaded: applied log_level", 1);
    let (_, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert!(
        body.contains("\"filter\":\"info,uctel_collector=debug\""),
        "{body}"
    );
    assert_eq!(metric(&m, ok), Some(1.0));
    assert!(metric(&m, ts).unwrap() >= started);

    // An invalid file: every problem answered and logged, nothing changes.
    std::fs::write(
        &path,
        format!("{base}log_level: inof\nring:\n  slots: lots\n"),
    )
    .unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("log_level")
            && body.contains("ring.slots")
            && body.contains("nothing changed"),
        "{body}"
    );
    // Logged too (the reader thread may lag the answer).
    d.wait_log("ring.slots", 1);
    assert_eq!(metric(&m, ok), Some(0.0));
    let (_, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert!(body.contains("uctel_collector=debug"), "{body}");

    // A key that needs a restart beside a live one: refused whole, the live one not applied.
    std::fs::write(
        &path,
        debug
            .replace("control: 127.0.0.1:0", "control: 127.0.0.1:1")
            .replace("log_level: info,uctel_collector=debug", "log_level: warn"),
    )
    .unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("listen.control needs a restart") && !body.contains("log_level"),
        "{body}"
    );
    let (_, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert!(body.contains("uctel_collector=debug"), "{body}");
    assert_eq!(metric(&m, ok), Some(0.0));

    // Back to the file in force: nothing to change, success again.
    std::fs::write(&path, &debug).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("nothing changed"), "{body}");
    assert_eq!(metric(&m, ok), Some(1.0));

    // The filter really filters: at `error`, a reload's info lines are not written; after
    // the override expires they are again.
    let (status, body) = request(&m, "PUT", "/api/v1/log_level?expire_seconds=4", "error");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"filter\":\"error\"") && !body.contains("null"),
        "{body}"
    );
    let requested = "configuration reload requested on POST /-/reload";
    let before = d.log().matches(requested).count();
    assert_eq!(request(&m, "POST", "/-/reload", "").0, 200);
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(d.log().matches(requested).count(), before, "{}", d.log());
    let (_, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert!(
        body.contains("\"filter\":\"info,uctel_collector=debug\"") && body.contains("null"),
        "{body}"
    );
    assert_eq!(request(&m, "POST", "/-/reload", "").0, 200);
    d.wait_log(requested, before + 1);

    // A bad filter changes nothing.
    let (status, body) = request(&m, "PUT", "/api/v1/log_level", "inof");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown log level"), "{body}");
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn without_lifecycle_the_changing_endpoints_answer_403() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, BASE.replace("ENABLE", "false")).unwrap();
    let d = Daemon::start(
        BIN,
        &[
            "--config",
            path.to_str().unwrap(),
            "--log-level",
            "warn,uctel_collector=info,uctel_common=info",
        ],
        "metrics=",
    );
    let m = d.metrics.clone();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("listen.enable_lifecycle"), "{body}");
    assert_eq!(request(&m, "GET", "/-/reload", "").0, 405);
    assert_eq!(request(&m, "PUT", "/api/v1/log_level", "debug").0, 403);
    assert_eq!(request(&m, "DELETE", "/api/v1/log_level", "").0, 403);
    let (status, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert_eq!(status, 200);
    assert!(
        body.contains("\"filter\":\"warn,uctel_collector=info,uctel_common=info\""),
        "{body}"
    );
    // SIGHUP still reloads; `--log-level` wins over the file's log_level.
    std::fs::write(
        &path,
        format!("{}log_level: debug\n", BASE.replace("ENABLE", "false")),
    )
    .unwrap();
    d.signal("-HUP");
    d.wait_log("configuration reloaded: applied log_level", 1);
    assert!(
        d.log().contains("--log-level given at start wins"),
        "{}",
        d.log()
    );
    let (_, body) = request(&m, "GET", "/api/v1/log_level", "");
    assert!(
        body.contains("\"filter\":\"warn,uctel_collector=info,uctel_common=info\""),
        "{body}"
    );
    assert_eq!(d.stop(), Some(0));
}

/// The outputs and limits a reload applies live (`uctel_collector::reload::LIVE_KEYS`): a
/// remote-write endpoint added, then moved, then removed; `series_cap_per_agent` and
/// `control.max_agents` changed; OTLP and ClickHouse outputs added, the ClickHouse table
/// changed (the old endpoint retired, the new one started), then both removed; a restart
/// key beside an output change refuses the file whole.
#[test]
fn reload_applies_outputs_and_limits_and_refuses_restart_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let base = BASE.replace("ENABLE", "true");
    std::fs::write(&path, &base).unwrap();
    let d = Daemon::start(BIN, &["--config", path.to_str().unwrap()], "metrics=");
    let m = d.metrics.clone();
    let ok = "uctel_collector_config_last_reload_successful";
    let rw = |port: u16| {
        format!("outputs:\n  remote_write:\n    - url: http://127.0.0.1:{port}/api/v1/write\n")
    };

    let first = format!("{base}series_cap_per_agent: 77\n{}", rw(9));
    std::fs::write(&path, &first).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("applied outputs.remote_write, series_cap_per_agent"),
        "{body}"
    );
    d.wait_log("remote-write http://127.0.0.1:9/api/v1/write: added", 1);
    assert_eq!(metric(&m, ok), Some(1.0));
    let (_, text) = request(&m, "GET", "/metrics", "");
    assert!(
        text.contains(
            "uctel_collector_remote_write_shards{url=\"http://127.0.0.1:9/api/v1/write\"}"
        ),
        "the added endpoint's self-metrics are exported"
    );

    let moved = format!(
        "{base}series_cap_per_agent: 77\ncontrol:\n  max_agents: 3\n{}",
        rw(10)
    );
    std::fs::write(&path, &moved).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("control.max_agents") && body.contains("outputs.remote_write"),
        "{body}"
    );
    d.wait_log("remote-write http://127.0.0.1:10/api/v1/write: added", 1);
    d.wait_log("remote-write http://127.0.0.1:9/api/v1/write: removed", 1);
    d.wait_log("remote-write endpoint retired by a reload", 1);

    // The OTLP and ClickHouse outputs added: live as well, their self-metrics exported.
    let outputs = |table: &str| {
        format!(
            "{base}series_cap_per_agent: 77\ncontrol:\n  max_agents: 3\n{}  otlp:\n    \
             endpoint: http://127.0.0.1:11\n  clickhouse:\n    url: http://127.0.0.1:12/\n    \
             table: {table}\n",
            rw(10)
        )
    };
    std::fs::write(&path, outputs("logs")).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("applied outputs.clickhouse, outputs.otlp"),
        "{body}"
    );
    d.wait_log("OTLP http://127.0.0.1:11", 1);
    d.wait_log("ClickHouse http://127.0.0.1:12/ (logs): added", 1);
    d.wait_log("ClickHouse log output started", 1);
    d.wait_log("OTLP output started", 1);
    let (_, text) = request(&m, "GET", "/metrics", "");
    assert!(
        text.contains("uctel_collector_clickhouse_rows_in_total 0")
            && text.contains("uctel_collector_otlp_items_in_total{signal=\"logs\"} 0"),
        "the added outputs' self-metrics are exported"
    );

    // The ClickHouse table changed: the old endpoint retires, the new one starts.
    std::fs::write(&path, outputs("logs_v2")).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("applied outputs.clickhouse"), "{body}");
    d.wait_log("ClickHouse http://127.0.0.1:12/ (logs): changed to", 1);
    d.wait_log("ClickHouse endpoint retired by a reload", 1);
    d.wait_log("ClickHouse log output started", 2);

    // A key that needs a restart beside an output change: refused whole, nothing applied.
    let refused = format!("{}staleness_seconds: 99\n", outputs("logs_v3"))
        .replace("series_cap_per_agent: 77", "series_cap_per_agent: 78");
    std::fs::write(&path, refused).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("staleness_seconds needs a restart")
            && !body.contains("series_cap")
            && !body.contains("outputs.clickhouse"),
        "{body}"
    );
    assert_eq!(metric(&m, ok), Some(0.0));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !d.log().contains("logs_v3"),
        "nothing of the refused file applied"
    );

    std::fs::write(&path, &base).unwrap();
    let (status, body) = request(&m, "POST", "/-/reload", "");
    assert_eq!(status, 200, "{body}");
    d.wait_log("remote-write http://127.0.0.1:10/api/v1/write: removed", 1);
    d.wait_log("ClickHouse http://127.0.0.1:12/ (logs_v2): removed", 1);
    d.wait_log("OTLP endpoint retired by a reload", 1);
    assert_eq!(metric(&m, ok), Some(1.0));
    assert_eq!(d.stop(), Some(0));
}
