//! The scrape source against the real node_exporter (Debian's `prometheus-node-exporter`,
//! its default collectors plus a textfile directory): what the collector serves for the
//! agent's `job="node"` series is compared with direct scrapes of the same node_exporter,
//! series by series (every series name and label set), and value by value where a value
//! does not move on a live host: the `*_info` series and the textfile's series (a live
//! host's counters and gauges move between any two scrapes, and a direct scrape counts its
//! own connection). The collector's own `/metrics` as a target: its `process_*` series arrive
//! as they are served, and its `uctel_collector_*` series are refused by the collector
//! (reserved names: an agent cannot pose as the collector) and counted. A target nobody
//! listens on is `up 0` and counted.

use std::time::Duration;

use uctel_tests::exposition::scrape;
use uctel_tests::node_exporter::{self, same, series};
use uctel_tests::pipeline::Pipeline;

#[test]
fn the_scrape_source_serves_what_node_exporter_serves() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let textfile = p.path().join("textfile");
    std::fs::create_dir(&textfile).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        textfile.join("fixed.prom"),
        "# HELP fixed_value A value that does not move.\n# TYPE fixed_value gauge\n\
         fixed_value{k=\"a\"} 1.25\nfixed_value{k=\"b\"} -3\nfixed_runs_total 42\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (ne_addr, _node_exporter) = node_exporter::start(
        p.path(),
        "node-exporter",
        &[format!(
            "--collector.textfile.directory={}",
            textfile.display()
        )],
    );
    let dead = uctel_tests::net::free_addr();
    let targets = serde_yaml::from_str::<serde_yaml::Value>(&format!(
        "- {{url: 'http://{ne_addr}/metrics', job: node, interval_seconds: 1, timeout_seconds: 1}}\n\
         - {{url: 'http://{dead}/metrics', job: dead, interval_seconds: 1, timeout_seconds: 0.5}}\n\
         - {{url: 'http://{collector}/metrics', job: collector, interval_seconds: 1, timeout_seconds: 1, \
             metric_relabel: {{keep: 'process_.*|uctel_collector_agents_connected'}}}}\n",
        collector = p.metrics_addr()
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    p.add_agent_with("scraping-agent", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.enabled", false)
            .set("sources.scrape", targets.clone());
    });

    let agent_job = |job: &'static str| {
        move |smp: &uctel_testkit::Sample| {
            smp.label("agent") == Some("scraping-agent") && smp.label("job") == Some(job)
        }
    };
    // The agent's series arriving, then two direct scrapes around one of the collector,
    // more than two scrape intervals apart: what the collector holds then was scraped
    // between them, so a series whose value is the same in both has that value there too.
    uctel_tests::wait_for(
        "node_exporter's series at the collector",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let c = p.scrape()?;
            let at = series(
                &c,
                &["agent", "instance", "exported_instance", "job"],
                agent_job("node"),
            );
            if at.get("up{}") == Some(&1.0) && at.len() > 200 {
                Ok(())
            } else {
                Err(format!("{} series at the collector", at.len()))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));
    let before = series(
        &scrape(ne_addr).unwrap_or_else(|e| panic!("{e}")),
        &[],
        |_| true,
    );
    std::thread::sleep(Duration::from_millis(2500));
    let c = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let at_collector = series(
        &c,
        &["agent", "instance", "exported_instance", "job"],
        agent_job("node"),
    );
    std::thread::sleep(Duration::from_millis(2500));
    let after = series(
        &scrape(ne_addr).unwrap_or_else(|e| panic!("{e}")),
        &[],
        |_| true,
    );

    let scrape_health = [
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
    ];
    let fixed = |k: &str| {
        let name = k.split('{').next().unwrap_or_default();
        name.ends_with("_info") || name.starts_with("fixed_") || name.starts_with("node_textfile_")
    };
    let mut diff = Vec::new();
    let mut compared = 0;
    for (k, v) in &before {
        if !after.contains_key(k) {
            continue; // came and went between the direct scrapes
        }
        match at_collector.get(k) {
            None => diff.push(format!("missing at the collector: {k}")),
            Some(c) if fixed(k) => {
                compared += 1;
                if !same(*c, *v) || !same(*v, after[k]) {
                    diff.push(format!(
                        "{k}: node_exporter {v} then {}, collector {c}",
                        after[k]
                    ));
                }
            }
            Some(_) => {}
        }
    }
    for k in at_collector.keys() {
        let name = k.split('{').next().unwrap_or_default();
        if !before.contains_key(k) && !after.contains_key(k) && !scrape_health.contains(&name) {
            diff.push(format!("only at the collector: {k}"));
        }
    }
    println!(
        "node_exporter: {} series; the collector holds {} for job=\"node\"; {compared} fixed values compared",
        before.len(),
        at_collector.len()
    );
    assert!(
        diff.is_empty(),
        "{} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
    assert!(
        before.len() > 200 && compared >= 8,
        "{} series, {compared} compared",
        before.len()
    );
    let samples_scraped = at_collector
        .get("scrape_samples_scraped{}")
        .copied()
        .unwrap_or(0.0);
    assert!(
        samples_scraped > 200.0,
        "scrape_samples_scraped {samples_scraped}"
    );

    // The collector's own /metrics: its process_* families at the collector under
    // job="collector" (identities; values move), its own uctel_collector_* refused.
    let c = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    let own = series(
        &c,
        &["agent", "instance", "exported_instance", "job"],
        agent_job("collector"),
    );
    let direct = series(&c, &[], |smp| {
        smp.name.starts_with("process_") && smp.label("agent").is_none()
    });
    for k in direct.keys() {
        assert!(
            own.contains_key(k),
            "{k} of the collector's own /metrics missing: {own:?}"
        );
    }
    assert!(
        !own.keys().any(|k| k.starts_with("uctel_collector_")),
        "{own:?}"
    );
    assert!(
        c.count(
            "uctel_collector_records_dropped_total",
            &[("agent", "scraping-agent"), ("reason", "reserved_name")]
        ) >= 1,
        "reserved names refused and counted"
    );

    // The target nobody listens on: up 0 at the collector, counted at the agent.
    let dead_up = series(
        &c,
        &["agent", "instance", "exported_instance", "job"],
        agent_job("dead"),
    );
    assert_eq!(dead_up.get("up{}"), Some(&0.0), "{dead_up:?}");
    let a = p.agents[0].scrape().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a.count(
            "uctel_agent_source_errors_total",
            &[("source", "scrape"), ("reason", "down")]
        ) >= 1
    );
    p.agents[0].daemon.stop(Duration::from_secs(20));
}
