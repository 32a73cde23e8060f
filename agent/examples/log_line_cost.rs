//! Prints what severity detection and the per-line read time cost per log line: the tailer's
//! whole poll (read, split, UTF-8 check, record building) over 100,000 lines of a mixed
//! corpus with `severity: auto` and `severity: none` (minimum of several runs), and
//! `severity::detect` alone per form of line.
//!
//! `cargo run --release -p uctel-agent --example log_line_cost`

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use uctel_agent::sources::logs::{LogSourceConfig, LogTailer, StartAt};
use uctel_agent::sources::severity;

const LINES: [(&str, &str); 8] = [
    ("plain", "GET /api/v1/items?page=3 200 1532 0.004 \"curl/8.5.0\" 10.0.0.7"),
    ("word", "2024-05-01 12:00:00,123 ERROR [main] com.example.Service - request failed: timeout"),
    ("json", r#"{"ts":"2024-05-01T12:00:00.123Z","level":"info","msg":"request served","path":"/api/v1/items","status":200,"duration_ms":4.2}"#),
    ("json_no_level", r#"{"ts":"2024-05-01T12:00:00.123Z","msg":"request served","path":"/api/v1/items","status":200,"duration_ms":4.2}"#),
    ("logfmt", r#"time="2024-05-01T12:00:00Z" level=warning msg="slow request" path=/api/v1/items duration=1.2s"#),
    ("syslog", "<30>May  1 12:00:00 host systemd[1]: Started Daily apt download activities."),
    ("klog", "I0501 12:00:00.123456       1 controller.go:123] Successfully synced key default/web"),
    ("long_plain", "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation"),
];

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 100_000;
    let mut f = std::fs::File::create(dir.path().join("a.log")).expect("create");
    let mut bytes = 0;
    for i in 0..n {
        let line = LINES[i % LINES.len()].1;
        bytes += line.len() + 1;
        writeln!(f, "{line}").expect("write");
    }
    drop(f);

    let run = |detect: bool| -> Duration {
        let mut best = Duration::MAX;
        for _ in 0..7 {
            let mut c = LogSourceConfig::new([dir.path().join("*.log").display().to_string()]);
            c.start_at = StartAt::Beginning;
            c.max_bytes_per_poll = 64 << 20;
            c.detect_severity = detect;
            let mut t = LogTailer::new(c).expect("tailer");
            let mut out = Vec::with_capacity(n);
            let start = Instant::now();
            t.poll(Instant::now(), SystemTime::now, &mut out, n);
            let took = start.elapsed();
            assert_eq!(out.len(), n);
            black_box(&out);
            best = best.min(took);
        }
        best
    };
    let none = run(false);
    let auto = run(true);
    let per = |d: Duration| d.as_secs_f64() * 1e9 / n as f64;
    println!(
        "tailer poll, {n} lines ({} bytes/line): severity none {:.0} ns/line, auto {:.0} ns/line (+{:.0} ns, {:+.0} %)",
        bytes / n,
        per(none),
        per(auto),
        per(auto) - per(none),
        (per(auto) / per(none) - 1.0) * 100.0
    );

    let iterations = 1_000_000u32;
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(SystemTime::now());
    }
    println!(
        "SystemTime::now (one per line): {:.0} ns",
        start.elapsed().as_secs_f64() * 1e9 / f64::from(iterations)
    );
    for (form, line) in LINES {
        let start = Instant::now();
        let mut s = severity::detect(line.as_bytes());
        for _ in 1..iterations {
            s = severity::detect(black_box(line.as_bytes()));
        }
        println!(
            "detect {form:>14} ({:3} bytes): {:5.0} ns -> {s:?}",
            line.len(),
            start.elapsed().as_secs_f64() * 1e9 / f64::from(iterations)
        );
    }
}
