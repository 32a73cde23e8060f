//! The textfile source against the real node_exporter (Debian's `prometheus-node-exporter`,
//! `--collector.textfile`): the same directory read by both, and what the collector serves
//! for the agent compared with what node_exporter serves, series by series and value by
//! value (`node_textfile_mtime_seconds` and `node_textfile_scrape_error` included).

use std::collections::BTreeMap;
use std::time::Duration;

use uctel_tests::exposition::{scrape, Scrape};
use uctel_tests::node_exporter;
use uctel_tests::pipeline::Pipeline;

/// A cron job's gauges, an untyped counter, label values with commas, quotes and
/// backslashes, a summary and a histogram with two label sets; a broken file; a file with
/// timestamps; a half-written file under a temporary name.
const GOOD: &str = r#"# HELP backup_last_success_timestamp_seconds Last successful backup.
# TYPE backup_last_success_timestamp_seconds gauge
backup_last_success_timestamp_seconds{job="db",target="s3://b/x, y"} 1.7646e+09
backup_runs_total{job="db",result="ok"} 12
backup_runs_total{job="db",result="failed"} 1
quoted{path="C:\\DIR\\FILE.TXT",msg="say \"hi\""} 1
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.25
rpc_seconds{quantile="0.99"} 1.5
rpc_seconds_sum 40.5
rpc_seconds_count 100
# TYPE job_duration_seconds histogram
job_duration_seconds_bucket{job="db",le="1"} 3
job_duration_seconds_bucket{job="db",le="10"} 7
job_duration_seconds_bucket{job="db",le="+Inf"} 9
job_duration_seconds_sum{job="db"} 55.5
job_duration_seconds_count{job="db"} 9
job_duration_seconds_bucket{job="web",le="1"} 0
job_duration_seconds_bucket{job="web",le="10"} 1
job_duration_seconds_bucket{job="web",le="+Inf"} 1
job_duration_seconds_sum{job="web"} 2
job_duration_seconds_count{job="web"} 1
"#;

/// Series of a scrape that come from the textfile directory, without the labels the
/// collector adds: `name{labels}` → value.
fn textfile_series(
    s: &Scrape,
    strip: &[&str],
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<String, f64> {
    node_exporter::series(s, strip, |smp| keep(&smp.name))
}

#[test]
fn the_textfile_source_serves_what_node_exporter_serves() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let dir = p.path().join("textfile");
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("backup.prom"), GOOD).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("broken.prom"), "broken{ 1\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("stamped.prom"), "stamped 1 1700000000000\n")
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("half.prom.4242"), "half 1\n").unwrap_or_else(|e| panic!("{e}"));
    let textfile_dir = dir.display().to_string();
    p.add_agent_with("textfile-agent", 0.0, 1.0, |y| {
        y.set("sources.textfile.directory", textfile_dir.as_str())
            .set("sources.textfile.interval_seconds", 1.0);
    });

    // node_exporter on the same directory, textfile collector only.
    let (addr, _node_exporter) = uctel_tests::node_exporter::start(
        p.path(),
        "node-exporter",
        &[
            "--collector.disable-defaults".to_owned(),
            "--collector.textfile".to_owned(),
            format!("--collector.textfile.directory={textfile_dir}"),
        ],
    );

    let from_node_exporter = |s: &Scrape| {
        textfile_series(s, &[], |n| {
            !n.starts_with("go_")
                && !n.starts_with("process_")
                && !n.starts_with("promhttp_")
                && !n.starts_with("node_exporter_")
                && !n.starts_with("node_scrape_collector_")
        })
    };
    let want = uctel_tests::wait_for(
        "node_exporter serving the textfiles",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || scrape(addr).map(|s| from_node_exporter(&s)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = want
        .keys()
        .map(|k| k.split('{').next().unwrap_or_default().to_owned())
        .collect();
    let got = uctel_tests::wait_for(
        "the collector serving the agent's textfile series",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || {
            let s = p.scrape()?;
            let got = textfile_series(&s, &["agent", "instance"], |n| names.iter().any(|x| x == n));
            // Only this agent's series (the store serves every agent's).
            if got.len() >= want.len() {
                Ok(got)
            } else {
                Err(format!("{} of {} series", got.len(), want.len()))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));
    println!(
        "node_exporter serves {} textfile series; the collector {}",
        want.len(),
        got.len()
    );
    let mut diff = Vec::new();
    for (k, v) in &want {
        match got.get(k) {
            None => diff.push(format!("missing at the collector: {k} {v}")),
            Some(g) if g.to_bits() != v.to_bits() && !(g.is_nan() && v.is_nan()) => {
                diff.push(format!("{k}: node_exporter {v}, collector {g}"));
            }
            Some(_) => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        diff.push(format!("only at the collector: {k}"));
    }
    assert!(
        diff.is_empty(),
        "{} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
    assert!(want.len() >= 20, "{want:?}");
    assert_eq!(want.get("node_textfile_scrape_error{}"), Some(&1.0));

    // Each skipped file counted with its reason at the agent.
    let a = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    for reason in ["parse_error", "timestamps"] {
        assert!(
            a.count(
                "uctel_agent_source_errors_total",
                &[("source", "textfile"), ("reason", reason)]
            ) >= 1,
            "{reason} not counted"
        );
    }
    let log = p.agents[0].daemon.log();
    assert_eq!(
        log.matches("textfile skipped").count(),
        2,
        "one warning per file and reason:\n{log}"
    );
    p.agents[0].daemon.stop(Duration::from_secs(20));
}
