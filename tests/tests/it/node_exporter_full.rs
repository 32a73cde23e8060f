//! Issue 18's acceptance against the Grafana dashboard **Node Exporter Full** (grafana.com
//! 1860; its expressions and template variables in `tests/data/node-exporter-full/`, source
//! and license in its README) and node_exporter's default series set.
//!
//! One real Prometheus scrapes, every second, a real node_exporter with its defaults
//! (`job="node"`) and the collector's `/metrics` with `honor_labels: true` (`job="uctel"`),
//! where a real agent with its default host collectors reports this same machine. The
//! collector labels the agent's series `instance=<the hostname the agent reported>`
//! (`collector/src/store.rs`), so the dashboard's `$node` is that hostname for uctel and
//! node_exporter's `host:port` for node_exporter.
//!
//! * [`every_panel_expression_with_node_exporter_data_has_uctel_data`]: the template
//!   variables (`job`, `nodename`, `node`, all `label_values(node_uname_info…)`) are resolved
//!   through Prometheus' label-values API as Grafana does, for each side; then every panel
//!   target is evaluated (instant query) with the variables of each side, and every
//!   expression that returns data for node_exporter must return data for uctel. The count and
//!   every failing expression with the series it needs are printed.
//! * [`only_node_exporters_own_series_are_missing_from_the_agent`]: metric names and the label
//!   names per metric of a direct scrape of node_exporter against the agent's host series at
//!   the collector (its `agent`/`instance` labels removed, its own `uctel_agent_*` and
//!   `process_*` left out); only node_exporter's own series
//!   (`go_*`, `process_*`, `promhttp_*`, `node_exporter_build_info`) may be missing, and every shared metric has the same label names. The diff is printed.
//!
//! Both tests share one fixture (daemons and Prometheus) while they run at the same time, as
//! `cargo test` runs them; the last one to finish stops it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use serde_json::Value;
use uctel_tests::daemon::Daemon;
use uctel_tests::dashboards::substitute;
use uctel_tests::exposition::scrape;
use uctel_tests::node_exporter;
use uctel_tests::pipeline::Pipeline;
use uctel_tests::prometheus::{Job, Prometheus};

/// The agent's id in the pipeline.
const AGENT: &str = "nefull-agent";

/// Prometheus job names of the two sides.
const NODE_JOB: &str = "node";
const UCTEL_JOB: &str = "uctel";

/// node_exporter's own series (its Go runtime, process and HTTP handler, build info), which
/// the agent's host collectors do not reproduce.
fn exporters_own(name: &str) -> bool {
    ["go_", "process_", "promhttp_"]
        .iter()
        .any(|p| name.starts_with(p))
        || name == "node_exporter_build_info"
}

/// The running parts both tests use.
struct Fixture {
    pipeline: Pipeline,
    node_exporter: SocketAddr,
    _node_exporter: Daemon,
    prometheus: Prometheus,
}

impl Fixture {
    fn start() -> Fixture {
        let mut pipeline = Pipeline::start();
        let (ne_addr, ne_daemon) = node_exporter::start(pipeline.path(), "node-exporter", &[]);
        pipeline.add_agent(AGENT, 0.0, 1.0);
        let prometheus = Prometheus::start(
            pipeline.path(),
            &[
                Job {
                    name: NODE_JOB.to_owned(),
                    targets: vec![ne_addr],
                    honor_labels: false,
                },
                Job {
                    name: UCTEL_JOB.to_owned(),
                    targets: vec![pipeline.metrics_addr()],
                    honor_labels: true,
                },
            ],
        );
        // Both sides scraped for long enough that every `rate(…[$__rate_interval])` has
        // several samples in its window: node_uname_info present at least 5 times in the
        // last 10 s for each job.
        let r = uctel_tests::wait_for(
            "both jobs scraped for 5 s",
            Duration::from_secs(60),
            Duration::from_millis(500),
            || {
                for job in [NODE_JOB, UCTEL_JOB] {
                    let got = prometheus.query(&format!(
                        "count_over_time(node_uname_info{{job=\"{job}\"}}[10s]) >= 5"
                    ))?;
                    if got.is_empty() {
                        return Err(format!("job {job} not scraped 5 times yet"));
                    }
                }
                Ok(())
            },
        );
        if let Err(e) = r {
            panic!(
                "{e}\ncollector:\n{}\nprometheus:\n{}",
                pipeline.collector.log_tail(20),
                prometheus.log_tail(20)
            );
        }
        Fixture {
            pipeline,
            node_exporter: ne_addr,
            _node_exporter: ne_daemon,
            prometheus,
        }
    }
}

/// The fixture of the tests running now, started by the first one.
fn fixture() -> Arc<Fixture> {
    static SHARED: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(f) = shared.upgrade() {
        return f;
    }
    let f = Arc::new(Fixture::start());
    *shared = Arc::downgrade(&f);
    f
}

/// `label_values(selector, label)` as Grafana's Prometheus data source evaluates it:
/// `/api/v1/label/<label>/values?match[]=<selector>`.
fn label_values(
    prometheus: SocketAddr,
    selector: &str,
    label: &str,
) -> Result<Vec<String>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(20)))
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{prometheus}/api/v1/label/{label}/values");
    let body = agent
        .get(&url)
        .query("match[]", selector)
        .call()
        .map_err(|e| format!("{url} {selector}: {e}"))?
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{url} {selector}: {e}"))?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{url}: {e}: {body}"))?;
    if v.get("status").and_then(Value::as_str) != Some("success") {
        return Err(format!("{url} {selector}: {body}"));
    }
    Ok(v.get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect())
}

/// The dashboard's data file `name`, its lines split at tabs.
fn data_file(name: &str) -> Vec<Vec<String>> {
    let path = uctel_tests::workspace_root()
        .join("tests/data/node-exporter-full")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Resolves the dashboard's query variables (`variables.tsv`, in order, each query with the
/// variables before it substituted) for the side whose `job` is `job`, choosing `job` itself
/// for `$job` and the first value for the others, as Grafana selects a variable's first
/// value. `(name, value)` per variable.
fn resolve_variables(prometheus: SocketAddr, job: &str) -> Result<Vec<(String, String)>, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for row in data_file("variables.tsv") {
        let [name, query] = row.as_slice() else {
            return Err(format!("variables.tsv: bad row {row:?}"));
        };
        let inner = query
            .trim()
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .ok_or_else(|| format!("{name}: not label_values(…): {query}"))?;
        let (selector, label) = inner
            .rsplit_once(',')
            .ok_or_else(|| format!("{name}: {query}"))?;
        let selector = substitute(selector.trim(), &vars);
        let values = label_values(prometheus, &selector, label.trim())?;
        let value = if name == "job" {
            values
                .iter()
                .find(|v| *v == job)
                .cloned()
                .ok_or_else(|| format!("$job: {job} not among {values:?} of {query}"))?
        } else {
            values
                .first()
                .cloned()
                .ok_or_else(|| format!("${name}: no value for {selector} ({query})"))?
        };
        vars.push((name.clone(), value));
    }
    Ok(vars)
}

/// Metric names in `expr`: identifiers directly followed by a selector's `{` (every metric
/// in this dashboard is selected by `instance` and `job`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut ident = String::new();
    for c in expr.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            ident.push(c);
        } else {
            if c == '{' && !ident.is_empty() && !ident.starts_with(|d: char| d.is_ascii_digit()) {
                out.insert(ident.clone());
            }
            ident.clear();
        }
    }
    out
}

/// Every metric name Prometheus holds for `job` and `instance`.
fn names_of(prometheus: SocketAddr, job: &str, instance: &str) -> BTreeSet<String> {
    label_values(
        prometheus,
        &format!("{{job=\"{job}\",instance=\"{instance}\"}}"),
        "__name__",
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .collect()
}

/// One dashboard target.
struct Target {
    panel: String,
    ref_id: String,
    hidden: bool,
    expr: String,
}

fn targets() -> Vec<Target> {
    data_file("expressions.tsv")
        .into_iter()
        .map(|row| match row.as_slice() {
            [id, title, ref_id, hide, expr] => Target {
                panel: format!("{id} {title}"),
                ref_id: ref_id.clone(),
                hidden: hide == "hidden",
                expr: expr.clone(),
            },
            _ => panic!("expressions.tsv: bad row {row:?}"),
        })
        .collect()
}

#[test]
fn every_panel_expression_with_node_exporter_data_has_uctel_data() {
    let f = fixture();
    let prom = f.prometheus.addr();

    // The template variables resolve for both sides, to the same machine.
    let ne_vars = resolve_variables(prom, NODE_JOB).unwrap_or_else(|e| panic!("node: {e}"));
    let uc_vars = resolve_variables(prom, UCTEL_JOB).unwrap_or_else(|e| panic!("uctel: {e}"));
    println!("template variables: node_exporter {ne_vars:?}, uctel {uc_vars:?}");
    let var = |vars: &[(String, String)], name: &str| {
        vars.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(var(&ne_vars, "node"), f.node_exporter.to_string());
    let hostname = f
        .pipeline
        .scrape()
        .unwrap_or_else(|e| panic!("{e}"))
        .select("node_uname_info", &[("agent", AGENT)])
        .find_map(|s| s.label("instance").map(str::to_owned))
        .unwrap_or_else(|| panic!("no node_uname_info of {AGENT} at the collector"));
    assert_eq!(
        var(&uc_vars, "node"),
        hostname,
        "uctel's $node is the hostname the agent reported"
    );
    assert_eq!(
        var(&uc_vars, "nodename"),
        var(&ne_vars, "nodename"),
        "the same machine's uname nodename"
    );

    let ne_names = names_of(prom, NODE_JOB, &var(&ne_vars, "node"));
    let uc_names = names_of(prom, UCTEL_JOB, &hostname);
    let all = targets();
    let mut with_ne_data = 0;
    let mut with_both = 0;
    let mut errors = Vec::new();
    let mut failing = Vec::new();
    for t in &all {
        let ne_expr = substitute(&t.expr, &ne_vars);
        let uc_expr = substitute(&t.expr, &uc_vars);
        assert!(!ne_expr.contains('$'), "variable left in {ne_expr}");
        let ne = match f.prometheus.query(&ne_expr) {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("{} {}: {e}", t.panel, t.ref_id));
                continue;
            }
        };
        if ne.is_empty() {
            continue;
        }
        with_ne_data += 1;
        match f.prometheus.query(&uc_expr) {
            Ok(r) if !r.is_empty() => {
                with_both += 1;
                continue;
            }
            Ok(_) => {}
            Err(e) => errors.push(format!("{} {} (uctel): {e}", t.panel, t.ref_id)),
        }
        // The series it needs: its metric names that node_exporter has and uctel lacks.
        let needs: Vec<String> = metric_names(&t.expr)
            .into_iter()
            .filter(|n| ne_names.contains(n) && !uc_names.contains(n))
            .collect();
        failing.push(format!(
            "  [{}{} {}] {}\n      needs: {}",
            t.panel,
            if t.hidden { ", hidden" } else { "" },
            t.ref_id,
            t.expr,
            if needs.is_empty() {
                "every metric it names is there: a label or value difference".to_owned()
            } else {
                needs.join(", ")
            }
        ));
    }
    println!(
        "{with_both} of {with_ne_data} expressions that return data for node_exporter return data for uctel \
         ({} panel targets in the dashboard)",
        all.len()
    );
    println!("{} fail:\n{}", failing.len(), failing.join("\n"));
    assert!(errors.is_empty(), "query errors:\n{}", errors.join("\n"));
    assert!(
        with_ne_data > 150,
        "only {with_ne_data} expressions return data for node_exporter"
    );
    assert!(
        failing.is_empty(),
        "{} expressions return data for node_exporter and not for uctel:\n{}",
        failing.len(),
        failing.join("\n")
    );
}

/// Metric name → the label-name sets of its series, without the labels in `strip`.
fn label_names(
    s: &uctel_testkit::Scrape,
    strip: &[&str],
    keep: impl Fn(&uctel_testkit::Sample) -> bool,
) -> BTreeMap<String, BTreeSet<Vec<String>>> {
    let mut out: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for smp in s.samples.iter().filter(|smp| keep(smp)) {
        let names: Vec<String> = smp
            .labels
            .keys()
            .filter(|k| !strip.contains(&k.as_str()))
            .cloned()
            .collect();
        out.entry(smp.name.clone()).or_default().insert(names);
    }
    out
}

#[test]
fn only_node_exporters_own_series_are_missing_from_the_agent() {
    let f = fixture();
    let ne = label_names(
        &scrape(f.node_exporter).unwrap_or_else(|e| panic!("{e}")),
        &[],
        |_| true,
    );
    let agent = label_names(
        &f.pipeline.scrape().unwrap_or_else(|e| panic!("{e}")),
        &["agent", "instance"],
        |smp| {
            smp.label("agent") == Some(AGENT)
                && !smp.name.starts_with("uctel_")
                && !exporters_own(&smp.name)
        },
    );
    let show = |sets: &BTreeSet<Vec<String>>| {
        sets.iter()
            .map(|s| format!("{{{}}}", s.join(",")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut own = Vec::new();
    let mut missing = Vec::new();
    let mut labels_differ = Vec::new();
    for (name, sets) in &ne {
        match agent.get(name) {
            None if exporters_own(name) => own.push(name.clone()),
            None => missing.push(format!("{name} {}", show(sets))),
            Some(a) if a != sets => {
                labels_differ.push(format!(
                    "{name}: node_exporter {} agent {}",
                    show(sets),
                    show(a)
                ));
            }
            Some(_) => {}
        }
    }
    let only_agent: Vec<String> = agent
        .iter()
        .filter(|(n, _)| !ne.contains_key(*n))
        .map(|(n, sets)| format!("{n} {}", show(sets)))
        .collect();
    println!(
        "series-set diff, node_exporter defaults ({} metrics) vs the agent's host collectors ({} metrics):",
        ne.len(),
        agent.len()
    );
    println!(
        "only node_exporter, its own series ({}): {}",
        own.len(),
        own.join(" ")
    );
    println!(
        "only node_exporter, otherwise ({}):\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
    println!(
        "label names differ ({}):\n  {}",
        labels_differ.len(),
        labels_differ.join("\n  ")
    );
    println!(
        "only the agent ({}):\n  {}",
        only_agent.len(),
        only_agent.join("\n  ")
    );
    assert!(ne.len() > 200, "node_exporter: {} metrics", ne.len());
    assert!(
        missing.is_empty() && labels_differ.is_empty(),
        "missing from the agent:\n{}\nlabel names differ:\n{}",
        missing.join("\n"),
        labels_differ.join("\n")
    );
}

#[test]
fn metric_names_are_the_selected_identifiers() {
    let names = metric_names(
        "100 * (1 - avg(rate(node_cpu_seconds_total{mode=\"idle\",instance=\"x\"}[1m]))) \
         + sum by (cpu) (node_load1{job=\"j\"}) + count(count(a:b{x=\"{y\"}) by (cpu))",
    );
    let want: BTreeSet<String> = ["node_cpu_seconds_total", "node_load1", "a:b"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(names, want);
    assert!(exporters_own("go_goroutines") && !exporters_own("node_load1"));
}
